"""generate's ``stop``: a hand-made model whose greedy continuation is known (token i is followed by i + 1 mod 5),
a random model checked against its own run without stop cut at the first stop id, and bad ``stop`` named."""

import numpy as np
import pytest

from attnlab.layer.config import AttentionConfig
from attnlab.stack.transformer import ModelConfig, Transformer, generate

V = 5


def counting_model() -> Transformer:
    """W_E = I, attention and positions zeroed, W_U a cyclic shift: the logits after token i are one-hot at i + 1."""
    c = ModelConfig(vocab_size=V, n_layers=1, attention=AttentionConfig(d_model=V, n_heads=1, n_ctx=8))
    p = {k: np.zeros_like(v) for k, v in Transformer.init(c, rng=np.random.default_rng(0)).params().items()}
    p["W_E"] = np.eye(V, dtype=np.float32)                                   # (V, d_model)
    p["W_U"] = np.roll(np.eye(V, dtype=np.float32), 1, axis=1)               # (d_model, V): row i hot at i + 1
    return Transformer.from_params(c, p)


def test_the_counting_model_counts_and_stops_at_the_first_stop_id_which_it_keeps():
    model = counting_model()
    assert generate(model, [0], 12).tolist() == [1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2]   # past n_ctx 8 as well
    assert generate(model, [0], 12, stop=3).tolist() == [1, 2, 3]
    assert generate(model, [0], 12, stop=[4, 2]).tolist() == [1, 2]                   # whichever comes first
    assert generate(model, [2], 12, stop={0, 4}).tolist() == [3, 4]
    assert generate(model, [0], 12, stop=np.array([1])).tolist() == [1]               # the very first token
    assert generate(model, [4, 0], 3, stop=np.int64(4)).tolist() == [1, 2, 3]         # never reached: all n_new
    assert generate(model, [0], 4, stop=4).tolist() == [1, 2, 3, 4]                   # the last token stops too
    for none in (None, (), []):
        assert generate(model, [0], 6, stop=none).tolist() == [1, 2, 3, 4, 0, 1]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_random_model_stops_where_its_run_without_stop_first_shows_the_id(temperature):
    c = ModelConfig(vocab_size=11, n_layers=2, d_mlp=32,
                    attention=AttentionConfig(d_model=16, n_heads=4, n_ctx=16))
    model = Transformer.init(c, rng=np.random.default_rng(3), std=0.5)
    rng = lambda: np.random.default_rng(9)                                    # noqa: E731
    full = generate(model, [1, 2, 3], 30, temperature=temperature, rng=rng()).tolist()
    assert len(set(full)) > 3
    for stop in sorted(set(full))[:4]:
        cut = full[:full.index(stop) + 1]
        assert generate(model, [1, 2, 3], 30, temperature=temperature, rng=rng(), stop=stop).tolist() == cut
        others = [i for i in range(11) if i not in full]
        got = generate(model, [1, 2, 3], 30, temperature=temperature, rng=rng(), stop=[stop, *others])
        assert got.tolist() == cut


def test_a_bad_stop_is_named():
    model = counting_model()
    with pytest.raises(ValueError, match=r"stop must be in \[0, 5\) \(the model's vocab_size\), got 5"):
        generate(model, [0], 3, stop=5)
    with pytest.raises(ValueError, match=r"stop must be in \[0, 5\).*got -1 at index 1"):
        generate(model, [0], 3, stop=[1, -1])
    for bad, what in (("a", "str"), (1.0, "float"), (True, "bool"), ({1: 2}, "dict")):
        with pytest.raises(TypeError, match=f"stop must be a token id or a collection of token ids, got {what}"):
            generate(model, [0], 3, stop=bad)
    with pytest.raises(TypeError, match="stop must hold integer token ids, got dtype float64"):
        generate(model, [0], 3, stop=[1.5])
    with pytest.raises(TypeError, match=r"a flat collection of token ids, got shape \(1, 2\)"):
        generate(model, [0], 3, stop=[[1, 2]])


def test_the_configs_eos_ids_are_checked_and_not_compared():
    attention = AttentionConfig(d_model=V, n_heads=1, n_ctx=8)
    assert ModelConfig(vocab_size=V, n_layers=1, attention=attention, eos_ids=(4,)) == \
        ModelConfig(vocab_size=V, n_layers=1, attention=attention)
    with pytest.raises(TypeError, match="eos_ids must be a tuple of token ids, got list"):
        ModelConfig(vocab_size=V, n_layers=1, attention=attention, eos_ids=[4])
    with pytest.raises(ValueError, match=r"eos_ids must be in \[0, 5\)"):
        ModelConfig(vocab_size=V, n_layers=1, attention=attention, eos_ids=(5,))
