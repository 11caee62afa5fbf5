"""The numpy decode step takes its scores as K qᵀ from KEYS_FIRST cached keys on (attnlab.kernels.decode): the
same attention as the float64 reference on either side of the rule, grouped heads or not, with batch axes."""

import numpy as np
import pytest

from attnlab.kernels import decode
from attnlab.kernels.attention import attention


def reference(q, k, v):
    g = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3)           # (..., h, n_k, d)
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2).astype(np.float64) / np.sqrt(q.shape[-1])   # (..., h, 1, n_k)
    a = np.exp(s - s.max(-1, keepdims=True))
    return (a / a.sum(-1, keepdims=True)) @ v.astype(np.float64)        # (..., h, 1, d)


@pytest.mark.parametrize("n_k", [decode.KEYS_FIRST - 1, decode.KEYS_FIRST, 1000])
@pytest.mark.parametrize("heads", [(9, 3), (4, 4)])
@pytest.mark.parametrize("batch", [(), (2,)])
def test_the_decode_step_on_both_sides_of_the_rule(monkeypatch, n_k, heads, batch):
    monkeypatch.setenv("ATTNLAB_KERNEL", "numpy")
    rng = np.random.default_rng(n_k)
    h, h_kv = heads
    q = rng.standard_normal((*batch, h, 1, 16), np.float32)             # (..., h, 1, d)
    k = rng.standard_normal((*batch, h_kv, n_k + 3, 16), np.float32)[..., :n_k, :]   # a cache's view
    v = rng.standard_normal((*batch, h_kv, n_k + 3, 16), np.float32)[..., :n_k, :]
    out = attention(q, k, v, implementation="decode")
    assert out.shape == (*batch, h, 1, 16) and out.dtype == np.float32
    np.testing.assert_allclose(out, reference(q, k, v), rtol=0, atol=2e-6)
