"""What the tests against transformers' eager models share: random models written offline by
``save_pretrained`` into tmp folders (float32), read back by transformers, and the relative difference.

The test files import torch and transformers themselves (``pytest.importorskip``) before using these.
"""

import numpy as np


def perturb_norms_and_biases(model, torch, scale: float = 0.2) -> None:
    """transformers starts norms at 1 (Gemma's at 0) and biases at 0: move them, so a test sees them."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(scale * torch.randn_like(p))


def saved_folders(tmp_path_factory, make, torch):
    """``get(kind)``: the folder of ``make(kind)`` (an eval-mode transformers model, seeded with 0), saved once
    per kind."""
    made = {}

    def get(kind: str):
        if kind not in made:
            torch.manual_seed(0)
            model = make(kind).eval()
            folder = tmp_path_factory.mktemp(kind)
            model.save_pretrained(folder)
            made[kind] = folder
        return made[kind]
    return get


def hf_model(folder, torch, transformers):
    """transformers' own reading of ``folder``, in float32 with its eager attention."""
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                             attn_implementation="eager").eval()


def relative(got, want) -> float:
    """The largest difference, relative to the largest value of ``want``."""
    return float(np.abs(got - want).max() / np.abs(want).max())


def assert_forward_matches(model, folder, ids, torch, transformers, *, tol: float = 1e-5):
    """attnlab's forward of ``ids`` against transformers' eager reading of ``folder``: every layer's attention
    weights within ``tol`` (absolute), hidden states and logits within ``tol`` relative. Returns attnlab's output
    and transformers' attentions (layers, heads, n, n), for what a test checks next."""
    from attnlab.stack.transformer import forward

    out = forward(model, ids, return_weights=True)
    with torch.no_grad():
        o = hf_model(folder, torch, transformers)(torch.from_numpy(ids)[None], output_attentions=True,
                                                  output_hidden_states=True)
    theirs = np.stack([a[0].numpy() for a in o.attentions])              # (layers, h, n, n)
    np.testing.assert_allclose(np.stack(out.attentions), theirs, rtol=0, atol=tol)
    for got, want in zip(out.hidden_states, o.hidden_states):
        assert relative(got, want[0].numpy()) < tol
    assert relative(out.logits, o.logits[0].numpy()) < tol
    return out, theirs


def hf_greedy(folder, ids, n: int, torch, transformers) -> np.ndarray:
    """transformers' ``n`` greedy tokens after the prompt ``ids`` (n,)."""
    with torch.no_grad():
        prompt = torch.from_numpy(ids)[None]
        return hf_model(folder, torch, transformers).generate(prompt, attention_mask=torch.ones_like(prompt),
                                                              max_new_tokens=n, do_sample=False,
                                                              pad_token_id=0)[0, ids.size:].numpy()
