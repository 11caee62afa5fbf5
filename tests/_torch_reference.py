"""attnlab's own language model written in PyTorch, as a peer: its autograd checks the hand-written backward
(tests/test_model.py) and its speed is the reference for the training throughput (benchmarks/train_guide.py).
A test helper: it lives beside the tests, not in the package.

Written independently of attnlab's numpy code where it matters: RoPE through complex multiplication, as
Meta's LLaMA reference code does it (pairs (2i, 2i+1) as one complex number), ALiBi's distances and the
causal mask built in torch, attention by ``torch.nn.functional.scaled_dot_product_attention``. Only ALiBi's
slopes come from :func:`attnlab.layer.positions.alibi_slopes` (tested on their own against the paper).
torch is imported inside the functions: attnlab never needs it.
"""

from __future__ import annotations

import numpy as np

from attnlab.layer.positions import alibi_slopes
from attnlab.stack.transformer import Transformer


def torch_params(model: Transformer, *, requires_grad: bool = True) -> dict:
    """Every parameter of ``model`` as a torch leaf tensor (a copy), by the names of :meth:`Transformer.params`."""
    import torch

    return {k: torch.tensor(np.array(a), requires_grad=requires_grad) for k, a in model.params().items()}


def torch_loss(model: Transformer, params: dict, ids, targets):
    """Mean next-token cross-entropy of the model given by ``params`` (from :func:`torch_params`)."""
    import torch
    import torch.nn.functional as F

    c, a = model.config, model.config.attention
    ids, targets = torch.as_tensor(np.asarray(ids)), torch.as_tensor(np.asarray(targets))
    *batch, n = ids.shape
    h, h_kv, d_head = a.n_heads, a.n_kv_heads, a.d_head
    scheme = a.positions.name
    x = params["W_E"][ids]                                                # (..., n, d_model)
    pos = torch.arange(n, dtype=torch.float64)
    if scheme == "learned":
        x = x + params["W_P"][:n]
    elif scheme == "sinusoidal":
        rate = torch.exp(-np.log(10000.0) * torch.arange(0, c.d_model, 2, dtype=torch.float64) / c.d_model)
        pe = torch.stack([torch.sin(pos[:, None] * rate), torch.cos(pos[:, None] * rate)], -1).reshape(n, -1)
        x = x + pe.to(x.dtype)                                            # (n, d_model) sin, cos interleaved
    causal = torch.ones(n, n, dtype=torch.bool).tril()                    # (n, n)
    mask = causal
    if scheme == "alibi":
        slopes = torch.tensor(alibi_slopes(h), dtype=x.dtype)             # (h,)
        mask = -slopes[:, None, None] * (pos[:, None] - pos[None, :]).abs().to(x.dtype)   # (h, n, n)
        mask = mask.masked_fill(~causal, float("-inf"))
    if scheme == "rope":
        freqs = a.positions.theta ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)
        turn = torch.polar(torch.ones(n, d_head // 2, dtype=torch.float64), pos[:, None] * freqs)   # (n, d/2)

    def heads(t, count):
        return t.reshape(*batch, n, count, d_head).transpose(-2, -3)       # (..., count, n, d_head)

    def rotate(t):
        z = torch.view_as_complex(t.reshape(*t.shape[:-1], d_head // 2, 2).contiguous())   # (..., n, d/2)
        return torch.view_as_real(z * turn.to(z.dtype)).reshape(t.shape)

    for i in range(c.n_layers):
        p = {name: params[f"blocks.{i}.attn.{name}"] for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V",
                                                                   "b_O")}
        q, k, v = (heads(x @ p[f"W_{m}"] + p[f"b_{m}"], h if m == "Q" else h_kv) for m in "QKV")
        if scheme == "rope":
            q, k = rotate(q), rotate(k)
        z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=h != h_kv)   # (..., h, n, d_head)
        x = x + z.transpose(-2, -3).reshape(*batch, n, h * d_head) @ p["W_O"] + p["b_O"]
    logits = x @ params["W_U"] + params["b_U"]                            # (..., n, vocab)
    return F.cross_entropy(logits.reshape(-1, c.vocab_size), targets.reshape(-1))
