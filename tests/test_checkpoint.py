"""Checkpoints: safetensors weights with the config beside them, whole after an interrupted save,
and refused when made with a different configuration."""

import json

import numpy as np
import pytest

pytest.importorskip("safetensors")

from attnlab.lm.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from attnlab.lm.model import lm_config  # noqa: E402
from attnlab.layer.positions import ALiBi, Learned, RoPE  # noqa: E402
from attnlab.stack.transformer import Transformer, forward  # noqa: E402
from attnlab.text.tokens import Vocab  # noqa: E402

VOCAB = Vocab(tuple("abcde"))


def model(rng, scheme=None, n_layers=2, **sizes):
    config = lm_config(5, d_model=8, n_heads=2, n_layers=n_layers, n_ctx=6, positions=scheme, **sizes)
    return Transformer.init(config, rng=rng, std=0.3)


@pytest.mark.parametrize("scheme, sizes", [(Learned(), {}), (ALiBi(), {}), (RoPE(theta=99.0), {"n_kv_heads": 1})])
def test_roundtrip(tmp_path, rng, scheme, sizes):
    m = model(rng, scheme, **sizes)
    save_checkpoint(m, VOCAB, tmp_path / "ck")
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["config.json", "model.safetensors"]
    saved = json.loads((tmp_path / "ck" / "config.json").read_text())
    assert saved["model_type"] == "attnlab" and saved["model"]["attention"]["positions"] == scheme.to_json()
    back, vocab = load_checkpoint(tmp_path / "ck", config=m.config, vocab=VOCAB)
    assert vocab == VOCAB and back.config == m.config
    for name, a in m.params().items():
        np.testing.assert_array_equal(back.params()[name], a)
    ids = np.array([0, 3, 1, 4])
    np.testing.assert_array_equal(forward(back, ids).logits, forward(m, ids).logits)


def test_checkpoint_from_before_the_stack_still_loads(tmp_path, rng):
    """A flat "model" config with a positions string and "layers.{i}.W_Q" tensors, as written before."""
    from safetensors.numpy import save_file

    m = model(rng, RoPE())
    old_config = {"model": {"vocab_size": 5, "d_model": 8, "n_heads": 2, "n_layers": 2, "n_ctx": 6,
                            "positions": "rope"}, "vocab": {"level": "char", "symbols": list("abcde")}}
    text = json.dumps(old_config)
    (tmp_path / "config.json").write_text(text)
    save_file({k.replace(".attn.", ".").replace("blocks.", "layers."): np.ascontiguousarray(v) for k, v in m.params().items()},
              str(tmp_path / "model.safetensors"), metadata={"attnlab": text})
    back, vocab = load_checkpoint(tmp_path)
    assert back.config == m.config and vocab == VOCAB
    np.testing.assert_array_equal(forward(back, [0, 1, 2]).logits, forward(m, [0, 1, 2]).logits)


def test_different_configuration_is_refused(tmp_path, rng):
    save_checkpoint(model(rng), VOCAB, tmp_path)
    other = lm_config(5, d_model=8, n_heads=2, n_layers=3, n_ctx=6)
    with pytest.raises(ValueError, match="made with a different configuration: n_layers 2 in the checkpoint, "
                                         "3 asked"):
        load_checkpoint(tmp_path, config=other)
    with pytest.raises(ValueError, match="made with a different vocabulary"):
        load_checkpoint(tmp_path, vocab=Vocab(tuple("abcdf")))


def test_weights_and_config_from_different_models_are_refused(tmp_path, rng):
    save_checkpoint(model(rng), VOCAB, tmp_path / "a")
    save_checkpoint(model(rng, n_layers=1), VOCAB, tmp_path / "b")
    (tmp_path / "a" / "config.json").write_text((tmp_path / "b" / "config.json").read_text())
    with pytest.raises(ValueError, match="come from different models"):
        load_checkpoint(tmp_path / "a")
    with pytest.raises(FileNotFoundError, match="no checkpoint here"):
        load_checkpoint(tmp_path / "missing")
    (tmp_path / "b" / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match="is not a readable safetensors file"):
        load_checkpoint(tmp_path / "b")


def test_interrupted_save_keeps_the_last_checkpoint_whole(tmp_path, rng, monkeypatch):
    import safetensors.numpy

    first = model(rng)
    save_checkpoint(first, VOCAB, tmp_path)
    real_save = safetensors.numpy.save_file

    def save_then_ctrl_c(tensors, filename, metadata=None):
        real_save(tensors, filename, metadata=metadata)       # the new weights are written to the temporary ...
        with open(filename, "r+b") as f:
            f.truncate(100)                                   # ... half of them ...
        raise KeyboardInterrupt                               # ... when Ctrl-C arrives

    monkeypatch.setattr(safetensors.numpy, "save_file", save_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(model(rng), VOCAB, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]   # no .part left
    back, _ = load_checkpoint(tmp_path, config=first.config)
    for name, a in first.params().items():
        np.testing.assert_array_equal(back.params()[name], a)


def test_a_checkpoint_of_transposed_views_comes_back_equal(tmp_path):
    """A loaded checkpoint's weights are often transposed views (W_Q = q_proj.T): saved as they lie, they came
    back scrambled; they must come back equal."""
    import numpy as np

    from attnlab.lm.checkpoint import load_checkpoint, save_checkpoint
    from attnlab.lm.model import lm_config
    from attnlab.stack.transformer import Transformer
    from attnlab.text.tokens import Vocab

    vocab = Vocab.from_text("abcde")
    model = Transformer.init(lm_config(vocab.size, d_model=8, n_heads=2, n_ctx=4), rng=np.random.default_rng(0))
    params = {k: (np.ascontiguousarray(v.T).T if v.ndim == 2 else v) for k, v in model.params().items()}
    assert not params["blocks.0.attn.W_Q"].flags["C_CONTIGUOUS"]
    save_checkpoint(Transformer.from_params(model.config, params), vocab, tmp_path / "ckpt")
    back, _ = load_checkpoint(tmp_path / "ckpt")
    for k, v in params.items():
        np.testing.assert_array_equal(back.params()[k], v, err_msg=k)
