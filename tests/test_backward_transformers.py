"""lm.loss_and_grad against PyTorch autograd on transformers' own models: random GPT-2 (gelu_new, tied), BERT
(post-norm, masked-LM loss) and Llama (RMSNorm, gated SiLU, GQA 4 on 2, RoPE θ 500 with llama3 scaling)
checkpoints written by ``save_pretrained``, every parameter's gradient within 1e-5 relative in float64 and
1e-4 in float32, and the tiled attention path at 300 tokens.

torch's gradients are written as a checkpoint of their own (each parameter's name holding its gradient) and
read back by attnlab's loader: the loader's transposes, splits and RoPE permutations are linear maps of the
tensors, so they map a gradient exactly as they map its weight, and every gradient lands under attnlab's
name. Nothing is downloaded (HF_HUB_OFFLINE=1).
"""

import json
import os
import shutil

import numpy as np
import pytest

from attnlab.lm.model import IGNORE, loss_and_grad
from attnlab.models import load_network
from attnlab.stack.transformer import Transformer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

V = 96
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}

MODELS = {
    "gpt2": lambda n_ctx: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_head=4, n_embd=32, n_positions=n_ctx, vocab_size=V, initializer_range=0.2,
        activation_function="gelu_new", bos_token_id=0, eos_token_id=0)),
    "bert": lambda n_ctx: transformers.BertModel(transformers.BertConfig(
        vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=n_ctx, initializer_range=0.2), add_pooling_layer=False),
    "llama": lambda n_ctx: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=n_ctx, initializer_range=0.2, rope_theta=500.0,
        rope_scaling=LLAMA3, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)),
}


def write(kind, folder, n_ctx=64):
    torch.manual_seed(0)
    hf = MODELS[kind](n_ctx).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("bias") or "norm" in name.lower():
                p.add_(0.1 * torch.randn_like(p))          # biases and norm weights away from 0 and 1
    hf.save_pretrained(folder)
    return folder


def torch_loss(kind, hf, ids, targets, types):
    if kind == "bert":
        h = hf(torch.from_numpy(ids), token_type_ids=torch.from_numpy(types)).last_hidden_state
        logits = h @ hf.embeddings.word_embeddings.weight.T        # the masked-LM decoder tied to the embeddings
    else:
        logits = hf(torch.from_numpy(ids)).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), torch.from_numpy(targets).reshape(-1),
                                             ignore_index=IGNORE)


def torch_grads_as_model(hf, folder, tmp) -> Transformer:
    """torch's gradients, written under the parameters' names and read back by attnlab's loader."""
    from safetensors.numpy import save_file

    grads = {name: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().numpy()
             for name, p in hf.named_parameters()}
    tmp.mkdir()
    shutil.copy(folder / "config.json", tmp / "config.json")
    save_file(grads, str(tmp / "model.safetensors"))
    return load_network(tmp)


def data(kind, rng, n, batch=2):
    ids = rng.integers(0, V, (batch, n))
    if kind == "bert":
        targets = np.where(rng.random((batch, n)) < 0.3, rng.integers(0, V, (batch, n)), IGNORE)
        targets[0, 0] = 5
        return ids, targets, rng.integers(0, 2, (batch, n))
    return ids[:, :-1], ids[:, 1:], None


def relative(ours, theirs):
    """The largest difference over the largest entry of the gradient: entries near zero are not divided by."""
    return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


def compare(kind, folder, tmp, dtype, rng, n=12):
    hf = transformers.AutoModel.from_pretrained(folder) if kind == "bert" else \
        transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")
    hf = hf.to(torch.float64 if dtype == np.float64 else torch.float32).train(False)
    ours = load_network(folder)
    ours = Transformer.from_params(ours.config, {k: v.astype(dtype) for k, v in ours.params().items()})
    ids, targets, types = data(kind, rng, n)
    value, grads = loss_and_grad(ours, ids, targets, token_types=types)
    ref = torch_loss(kind, hf, ids, targets, types)
    ref.backward()
    theirs = torch_grads_as_model(hf, folder, tmp).params()
    absent = (".attn.b_", "b_U") if kind == "llama" else ()        # Llama has no attention or head biases
    # b_K's gradient is zero in exact arithmetic (it shifts all of a query's scores alike, which the softmax
    # ignores): both sides hold rounding noise, held to a millionth of the largest gradient entry instead
    scale = max(np.abs(g).max() for g in theirs.values())
    for name in [n for n in grads if n.endswith("attn.b_K") and not absent]:
        assert np.abs(grads.pop(name)).max() < 1e-6 * scale and np.abs(theirs[name]).max() < 1e-6 * scale
    errors = {name: relative(g, theirs[name]) for name, g in grads.items() if not any(a in name for a in absent)}
    return value, ref.item(), errors


@pytest.mark.parametrize("kind", sorted(MODELS))
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-5), (np.float32, 1e-4)])
def test_every_parameter_gradient_matches_torch_autograd(kind, dtype, tol, tmp_path, rng):
    folder = write(kind, tmp_path / "model")
    value, ref, errors = compare(kind, folder, tmp_path / "grads", dtype, rng)
    assert value == pytest.approx(ref, rel=1e-8 if dtype == np.float64 else 1e-6)   # BERT: erfc to 1.2e-7
    assert len(errors) > 10
    worst = max(errors, key=errors.get)
    assert errors[worst] < tol, (worst, errors[worst])


@pytest.mark.slow
def test_the_tiled_path_at_300_tokens_matches_torch_autograd(tmp_path, rng):
    from attnlab.kernels.attention import TILED_MIN_QUERIES, TILED_MIN_SCORES

    assert 299 >= TILED_MIN_QUERIES and 299 * 299 >= TILED_MIN_SCORES   # 299 queries take the tiled path
    folder = write("gpt2", tmp_path / "model", n_ctx=320)
    value, ref, errors = compare("gpt2", folder, tmp_path / "grads", np.float64, rng, n=300)
    assert value == pytest.approx(ref, rel=1e-12)
    worst = max(errors, key=errors.get)
    assert errors[worst] < 1e-5, (worst, errors[worst])
