import numpy as np
import pytest

from attnlab.kernels._kernels import KERNEL_ENV, NO_NUMBA_ENV
from attnlab.kernels.profile import TUNE_FILE_ENV


@pytest.fixture(autouse=True)
def no_tune_profile(monkeypatch, tmp_path_factory):
    """No test reads the user's tune profile: each points ATTNLAB_TUNE_FILE at a file that is not there."""
    monkeypatch.setenv(TUNE_FILE_ENV, str(tmp_path_factory.getbasetemp() / "no-tune-profile.json"))


@pytest.fixture(autouse=True)
def no_weight_cache(monkeypatch):
    """No command a test runs writes a model's float32 copy to the user's cache folder (ATTNLAB_CACHE=off);
    tests/test_weight_cache.py gives its own folders."""
    monkeypatch.setenv("ATTNLAB_CACHE", "off")


@pytest.fixture(params=["numpy", "fused"])
def tile_kernel(request, monkeypatch):
    """Run a test once on each tile kernel: the numpy one (ATTNLAB_NO_NUMBA=1) and, where numba is
    installed, the fused one (ATTNLAB_KERNEL=fused: every call the fused kernels take, whatever its size);
    so one CI run covers both paths."""
    if request.param == "fused":
        pytest.importorskip("numba")
        monkeypatch.delenv(NO_NUMBA_ENV, raising=False)
        monkeypatch.setenv(KERNEL_ENV, "fused")
    else:
        monkeypatch.setenv(NO_NUMBA_ENV, "1")
    return request.param


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def central_differences(f, x, eps=1e-6):
    """Central differences of the scalar f() with respect to every entry of x (changed in place)."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + eps
        up = f()
        x[i] = old - eps
        down = f()
        x[i] = old
        g[i] = (up - down) / (2 * eps)
    return g


def check_param_grads(grads: dict, params: dict, f, entries, *, eps=1e-6, tag=()) -> None:
    """Each parameter's gradient, at the positions ``entries(p)`` of p, against central differences of the
    scalar f() (the parameters changed in place, then put back); grads named and shaped as params."""
    assert list(grads) == list(params)
    for name, p in params.items():
        assert grads[name].shape == p.shape and grads[name].dtype == p.dtype
        for i in entries(p):
            old = p[i]
            p[i] = old + eps
            up = f()
            p[i] = old - eps
            down = f()
            p[i] = old
            assert grads[name][i] == pytest.approx((up - down) / (2 * eps), rel=1e-5, abs=1e-8), (*tag, name, i)


@pytest.fixture
def param_grads():
    return check_param_grads


@pytest.fixture
def numeric_grad():
    return central_differences


@pytest.fixture
def torch_reference():
    """tests/_torch_reference.py (attnlab's LM in PyTorch), loaded by path: the tests are not a package."""
    import importlib.util
    from pathlib import Path

    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("_torch_reference", Path(__file__).with_name("_torch_reference.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Cli:
    """Runs ``attnlab`` in-process and reads what it printed (the CLI tests' one helper)."""

    def __init__(self, capsys, prefix=()):
        self.capsys, self.prefix = capsys, tuple(prefix)

    def _argv(self, argv):
        return [*self.prefix, *map(str, argv)]

    def json(self, *argv):
        """The --json output of a run that must succeed."""
        import json
        from attnlab.cli import main

        assert main([*self._argv(argv), "--json"]) == 0, self.capsys.readouterr().err
        return json.loads(self.capsys.readouterr().out)

    def text(self, *argv):
        """The printed text of a run that must succeed."""
        from attnlab.cli import main

        assert main(self._argv(argv)) == 0, self.capsys.readouterr().err
        return self.capsys.readouterr().out

    def error(self, argv, match):
        """A run that must fail as bad input does: exit 2, one line on stderr naming ``match``, no traceback."""
        from attnlab.cli import main

        assert main(self._argv(argv)) == 2, argv
        err = self.capsys.readouterr().err
        assert err.startswith("attnlab: error:") and err.count("\n") == 1 and "Traceback" not in err, err
        assert match in err, err
        return err


@pytest.fixture
def cli(capsys):
    return Cli(capsys)


# A test-only writer of GPT-2 checkpoints in the Hugging Face layout, with safetensors' numpy API (no torch).

GPT2_MERGES = ["Ġ c", "a t", "Ġc at", "Ġ s", "Ġs at", "Ġ t", "h e", "Ġt he"]   # so " cat" is one token


def gpt2_tensors(rng, *, n_layer, n_head, n_embd, n_positions, vocab_size, std=0.3, dtype=np.float32):
    """Random GPT-2 weights under their HF names (no ``transformer.`` prefix), Conv1D as [in, out]."""
    d, w = n_embd, {}
    draw = lambda *shape: rng.normal(0.0, std, shape).astype(dtype)   # noqa: E731
    w["wte.weight"], w["wpe.weight"] = draw(vocab_size, d), draw(n_positions, d)
    for i in range(n_layer):
        p = f"h.{i}."
        for ln in ("ln_1", "ln_2"):
            w[p + ln + ".weight"], w[p + ln + ".bias"] = 1 + draw(d), draw(d)
        for name, shape in (("attn.c_attn", (d, 3 * d)), ("attn.c_proj", (d, d)),
                            ("mlp.c_fc", (d, 4 * d)), ("mlp.c_proj", (4 * d, d))):
            w[p + name + ".weight"], w[p + name + ".bias"] = draw(*shape), draw(shape[1])
    w["ln_f.weight"], w["ln_f.bias"] = 1 + draw(d), draw(d)
    return w


def write_gpt2_folder(folder, *, rng=None, n_layer=2, n_head=4, n_embd=16, n_positions=16, prefix="transformer.",
                      dtype=np.float32, edit=None, config=None):
    """A folder with config.json, model.safetensors, vocab.json and merges.txt (264 tokens: bytes + merges)."""
    import json

    from safetensors.numpy import save_file
    from tokenizers import pre_tokenizers

    folder.mkdir()
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate(alphabet + ["".join(m.split()) for m in GPT2_MERGES])}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(GPT2_MERGES) + "\n")
    cfg = {"model_type": "gpt2", "n_layer": n_layer, "n_head": n_head, "n_embd": n_embd,
           "n_positions": n_positions, "vocab_size": len(vocab), "n_inner": None,
           "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, **(config or {})}
    (folder / "config.json").write_text(json.dumps(cfg))
    tensors = gpt2_tensors(rng if rng is not None else np.random.default_rng(0), n_layer=n_layer,
                           n_head=n_head, n_embd=n_embd, n_positions=n_positions, vocab_size=len(vocab), dtype=dtype)
    if edit is not None:
        edit(tensors)                  # a test breaks the checkpoint on purpose
    save_file({prefix + k: v for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


def llama_tensors(config: dict, rng, *, std: float) -> dict[str, np.ndarray]:
    """Random float32 weights N(0, std²) under a Llama checkpoint's names (norm weights 1 + N(0, std²))."""
    d, h, h_kv = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    d_head, d_mlp, v = d // h, config["intermediate_size"], config["vocab_size"]
    w = lambda *shape: rng.normal(0, std, shape).astype(np.float32)   # noqa: E731
    t = {"model.embed_tokens.weight": w(v, d), "model.norm.weight": 1 + w(d)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t.update({p + "self_attn.q_proj.weight": w(h * d_head, d), p + "self_attn.k_proj.weight": w(h_kv * d_head, d),
                  p + "self_attn.v_proj.weight": w(h_kv * d_head, d), p + "self_attn.o_proj.weight": w(d, h * d_head),
                  p + "mlp.gate_proj.weight": w(d_mlp, d), p + "mlp.up_proj.weight": w(d_mlp, d),
                  p + "mlp.down_proj.weight": w(d, d_mlp), p + "input_layernorm.weight": 1 + w(d),
                  p + "post_attention_layernorm.weight": 1 + w(d)})
    if not config.get("tie_word_embeddings"):
        t["lm_head.weight"] = w(v, d)
    return t


@pytest.fixture(scope="session")
def random_llama_tensors():
    """:func:`llama_tensors`, for tests that write Llama folders."""
    return llama_tensors


@pytest.fixture
def write_gpt2(tmp_path):
    """``write_gpt2(name="gpt2", **options)`` -> a fresh GPT-2 folder (see write_gpt2_folder)."""
    return lambda name="gpt2", **options: write_gpt2_folder(tmp_path / name, **options)


@pytest.fixture(scope="module")
def tiny_gpt2_folder(tmp_path_factory):
    """One GPT-2 folder (2 layers, 4 heads, width 16, 16 positions) shared by a module's tests."""
    return write_gpt2_folder(tmp_path_factory.mktemp("tiny") / "gpt2")


@pytest.fixture(scope="session")
def gguf_files():
    """tests/test_gguf.py, whose ``write_gguf`` writes tiny llama GGUF files with the gguf package's own
    GGUFWriter, loaded by path (the tests are not a package)."""
    import importlib.util
    from pathlib import Path

    pytest.importorskip("gguf")
    pytest.importorskip("tokenizers")
    spec = importlib.util.spec_from_file_location("_gguf_files", Path(__file__).with_name("test_gguf.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
