"""llama.cpp's arithmetic for the ops between the products, in numpy: what ggml's CPU backend computes on an x86
machine with AVX-512 (a native build, GCC, flash-attention off), rounding for rounding, so the
``q8-activations`` mode can give llama.cpp's bits and not merely its values.

Why bits: the q8 mode rounds x to 8 bits before every product, which makes the network discontinuous. One
last-place difference in a norm, a rotation or a softmax flips a few of those roundings, and the flip grows to
the quantization noise's own scale within a layer or two (measured on SmolLM2 against llama.cpp's own graph
tensors: a 1-ulp difference in the first RMSNorm became 3e-3 relative by the first block's output). Each
function here was held against llama.cpp 0.3.36's tensors (``cb_eval`` dumps, SmolLM2-135M Q4_1, 1 thread)
and gave every bit of them:

==================  =============================================================================================
op                  ggml (ggml-cpu/ops.cpp, vec.h, vec.cpp, llamafile/sgemm.cpp)
==================  =============================================================================================
RMSNorm             Σ x² with each square rounded to float32 and summed in double, in order; mean = float32(sum / n);
                    scale = 1 / sqrtf(mean + eps) in float32; y = x · scale, then y · weight (a separate op)
RoPE                per position p: θ_0 = p, θ_{i+1} = θ_i · theta_scale (float32, theta_scale = powf(base,
                    −2/d)); cos and sin from the C library's ``cosf``/``sinf``; y0 = fma(x0, cos, −(x1·sin)),
                    y1 = fma(x0, sin, x1·cos) (GCC's contraction of ``x0*cos - x1*sin``)
exp                 ``ggml_v_expf``, the AVX-512 polynomial (ARM's optimized routine): 16 lanes at a time
softmax             w = s · scale + mask; m = max w; e = v_expf(w − m); the row's sum in double of each 16-lane
                    block's float32 sum (GCC's ``_mm512_reduce_add_ps`` tree); y = e · float32(1 / sum)
SiLU, SwiGLU        silu(g) = g / (1 + v_expf(−g)); swiglu = silu(g) · u
K·q (f16)           q rounded to float16; a batch (tinyBLAS): one 16-lane accumulator of fused multiply-adds over
                    d in steps of 16, then the reduce tree; one token (``ggml_vec_dot_f16``): four accumulators
                    over steps of 64, then (acc0 + acc2) + (acc1 + acc3), then the reduce tree
weights·V (f16)     the softmax's weights rounded to float16, V float16, the same two dot products over n_kv
==================  =============================================================================================

The C library's ``cosf``/``sinf`` are glibc's (about 0.5 ulp, not always correctly rounded); this module calls
the platform's own through ctypes, as llama.cpp does, and falls back to float64 rounded to float32 where there
is none. Every function takes and returns float32 arrays; none is fast: they are the q8 mode's references.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import numpy as np

from ._kernels import numpy_unless_numba
from ._step import answers
from .q8_activations import fma32

F32 = np.float32
LANES = 16                         # an AVX-512 register of float32
F16_STEP = 64                      # ggml_vec_dot_f16's step: four registers


def fma(a, b, c) -> np.ndarray:
    """a · b + c with one rounding, float32, broadcasting (:func:`attnlab.kernels.q8_activations.fma32`)."""
    a, b, c = np.broadcast_arrays(np.asarray(a, F32), np.asarray(b, F32), np.asarray(c, F32))
    return fma32(a, b, c)


def reduce_add16(v: np.ndarray) -> np.ndarray:
    """(..., 16) -> (...): GCC's ``_mm512_reduce_add_ps``: halves added (lane i + i+8, then i + i+4, i + i+2),
    then the last two lanes."""
    t = v[..., :8] + v[..., 8:]                               # (..., 8)
    t = t[..., :4] + t[..., 4:]                               # (..., 4)
    t = t[..., :2] + t[..., 2:]                               # (..., 2)
    return t[..., 0] + t[..., 1]                              # (...)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """(..., d) -> (..., d): ggml's ``rms_norm`` then ``mul`` by the weight (the table above)."""
    x = np.asarray(x, F32)
    d = x.shape[-1]
    sq = (x * x).astype(np.float64)                           # (..., d) each square rounded to float32
    total = np.cumsum(sq, axis=-1)[..., -1]                   # (...) in order, as ggml's loop (cumsum runs in
    #                                                           order; numpy's sum would add pairwise)
    mean = (total / d).astype(F32)                            # (...)
    scale = F32(1.0) / np.sqrt(mean + F32(eps))               # (...) float32 throughout
    return (x * scale[..., None]) * np.asarray(weight, F32)   # (..., d)


@functools.cache
def _libm():
    name = ctypes.util.find_library("m")
    if name is None:
        return None
    lib = ctypes.CDLL(name)
    for f in ("cosf", "sinf", "powf"):
        getattr(lib, f).restype = ctypes.c_float
    lib.cosf.argtypes = lib.sinf.argtypes = [ctypes.c_float]
    lib.powf.argtypes = [ctypes.c_float, ctypes.c_float]
    return lib


def theta_scale(base: float, d: int) -> np.float32:
    """``powf(base, -2.0f/d)``: the ratio of each pair's angle to the one before."""
    lib, e = _libm(), F32(-2.0) / F32(d)
    if lib is None:
        return F32(np.float64(F32(base)) ** np.float64(e))
    return F32(lib.powf(float(F32(base)), float(e)))


@functools.lru_cache(maxsize=4096)
def rope_table(p: int, d: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin (d/2,) float32 of position p's angles, ggml's ``ggml_rope_cache_init`` (no scaling)."""
    ts = theta_scale(base, d)
    angles = np.empty(d // 2, F32)                            # (d/2,)
    t = F32(p)
    for i in range(d // 2):
        angles[i] = t
        t = F32(t * ts)                                       # θ_{i+1} = θ_i · theta_scale, rounded each step
    lib = _libm()
    if lib is None:
        cos, sin = np.cos(angles.astype(np.float64)).astype(F32), np.sin(angles.astype(np.float64)).astype(F32)
    else:
        cos = np.array([lib.cosf(float(a)) for a in angles], F32)
        sin = np.array([lib.sinf(float(a)) for a in angles], F32)
    cos.flags.writeable = sin.flags.writeable = False
    return cos, sin


def rope(x: np.ndarray, positions, base: float) -> np.ndarray:
    """x (..., n, d) rotated in pairs (x_2i, x_2i+1) at ``positions`` (n,) as ggml's ``rope`` (mode 0)."""
    x = np.asarray(x, F32)
    d = x.shape[-1]
    tables = [rope_table(int(p), d, float(base)) for p in positions]
    cos = np.stack([c for c, _ in tables])                    # (n, d/2)
    sin = np.stack([s for _, s in tables])                    # (n, d/2)
    x0, x1 = x[..., 0::2], x[..., 1::2]                       # (..., n, d/2)
    y = np.empty_like(x)                                      # (..., n, d)
    y[..., 0::2] = fma(x0, cos, -(x1 * sin))
    y[..., 1::2] = fma(x0, sin, x1 * cos)
    return y


def v_expf(x: np.ndarray) -> np.ndarray:
    """e^x, float32, as ggml's AVX-512 ``ggml_v_expf`` computes it (−inf gives 0; beyond ±192·ln2 it flushes to 0
    or inf as it does)."""
    x = np.asarray(x, F32)
    finite = np.isfinite(x)
    xs = np.where(finite, x, F32(0))
    shift = F32(float.fromhex("0x1.8p23"))
    z = fma(xs, F32(float.fromhex("0x1.715476p+0")), shift)
    n = z - shift                                             # round(x / ln 2)
    b = fma(-n, F32(float.fromhex("0x1.7f7d1cp-20")), fma(-n, F32(float.fromhex("0x1.62e4p-1")), xs))
    u = b * b
    c = [F32(float.fromhex(h)) for h in ("0x1.0e4020p-7", "0x1.573e2ep-5", "0x1.555e66p-3", "0x1.fffdb6p-2",
                                         "0x1.ffffecp-1")]
    j = fma(fma(fma(c[0], b, c[1]), u, fma(c[2], b, c[3])), u, fma(c[4], b, F32(1.0)))
    with np.errstate(over="ignore"):
        res = np.ldexp(j, n.astype(np.int32)).astype(F32)     # _mm512_scalef_ps(j, n)
    far = (np.abs(n) > 192) | ~finite
    flushed = np.where(np.where(finite, n, x) <= 0, F32(0), F32(np.inf))
    return np.where(far, flushed, res).astype(F32)


def softmax(s: np.ndarray, scale: float, mask: np.ndarray | None = None) -> np.ndarray:
    """(..., n_kv) -> (..., n_kv): ggml's ``soft_max_ext`` (no ALiBi, no sinks), n_kv a multiple of 16 (llama.cpp
    pads its cache view to 256); ``mask`` additive (0 or −inf), broadcast against s."""
    s = np.asarray(s, F32)
    n_kv = s.shape[-1]
    if n_kv % LANES:
        raise ValueError(f"s must have a multiple of {LANES} columns (ggml's tail is the C library's expf), "
                         f"got {n_kv}")
    w = s * F32(scale)                                        # (..., n_kv)
    if mask is not None:
        w = w + np.asarray(mask, F32)
    e = v_expf(w - w.max(-1, keepdims=True))                  # (..., n_kv)
    total = np.zeros(s.shape[:-1], np.float64)                # (...) ggml_float
    for i in range(0, n_kv, LANES):
        total += reduce_add16(e[..., i:i + LANES]).astype(np.float64)
    return e * (1.0 / total).astype(F32)[..., None]           # (..., n_kv)


def silu(g: np.ndarray) -> np.ndarray:
    """g / (1 + e^−g) with ggml's ``ggml_v_silu`` (its exp :func:`v_expf`)."""
    g = np.asarray(g, F32)
    return g / (F32(1) + v_expf(-g))


def swiglu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """ggml's ``swiglu``: silu(g) · u, float32."""
    return silu(g) * np.asarray(u, F32)


def dot_f16_batch(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(..., k) · (..., k) -> (...), a and b holding float16 values: tinyBLAS's order for a batch, one 16-lane
    accumulator of fused multiply-adds over k in steps of 16, then the reduce tree. (A product of two float16
    values is exact in float32, so each fused multiply-add is the product added with one rounding.) tinyBLAS
    declines a k that is not a multiple of 16; ggml then takes :func:`dot_f16_vec`, and so does this."""
    a, b = np.broadcast_arrays(np.asarray(a, F32), np.asarray(b, F32))
    if a.shape[-1] % LANES:
        return dot_f16_vec(a, b)
    acc = np.zeros(a.shape[:-1] + (LANES,), F32)              # (..., 16)
    for i in range(0, a.shape[-1], LANES):
        acc += a[..., i:i + LANES] * b[..., i:i + LANES]
    return reduce_add16(acc)


def dot_f16_vec(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(..., k) · (..., k) -> (...), float16 values: ``ggml_vec_dot_f16`` on AVX-512, one token's order: over the
    first k − k mod 64, four accumulators (register j takes the j-th 16 of each 64), then (0 + 2) + (1 + 3), then
    the reduce tree; that float32 sum and each product of the rest added in double, in order; rounded to
    float32."""
    a, b = np.broadcast_arrays(np.asarray(a, F32), np.asarray(b, F32))
    k = a.shape[-1]
    whole = k - k % F16_STEP
    accs = [np.zeros(a.shape[:-1] + (LANES,), F32) for _ in range(4)]   # 4 x (..., 16)
    for i in range(0, whole, F16_STEP):
        for j in range(4):
            lo = i + j * LANES
            accs[j] += a[..., lo:lo + LANES] * b[..., lo:lo + LANES]
    total = reduce_add16((accs[0] + accs[2]) + (accs[1] + accs[3]))   # (...)
    if whole == k:
        return total
    total = total.astype(np.float64)
    for i in range(whole, k):                                  # ggml's scalar tail, in ggml_float
        total += (a[..., i] * b[..., i]).astype(np.float64)
    return total.astype(F32)


def half(x: np.ndarray) -> np.ndarray:
    """x rounded to float16 and back to float32 (ggml's F32 -> F16 conversion, ties to even)."""
    return np.asarray(x, F32).astype(np.float16).astype(F32)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int, scale: float) -> np.ndarray:
    """ggml's attention with flash-attention off, against its float16 cache: q (h, n, d) float32, the queries at
    positions start … start + n − 1; k and v (h_kv, n_k, d), n_k ≥ start + n, rounded to float16 here (as the
    cache rounds them on write); each query sees the keys up to its own position. q and the softmax's weights
    are rounded to float16; one token (n = 1) takes ``ggml_vec_dot_f16``'s order, a batch tinyBLAS's. The keys
    are padded with masked zeros to a multiple of 64, as llama.cpp pads its cache view (to 256): a masked key's
    weight is an exact 0, which changes no sum. Returns (h, n, d) float32."""
    h, n, d = q.shape
    h_kv, n_k = k.shape[0], start + n
    pad = -(-n_k // F16_STEP) * F16_STEP
    kp = np.zeros((h_kv, pad, d), F32)                        # (h_kv, n_kv, d)
    vp = np.zeros((h_kv, d, pad), F32)                        # (h_kv, d, n_kv) V's rows as ggml reads them
    kp[:, :n_k] = k[:, :n_k] if k.dtype == np.float16 else half(k[:, :n_k])   # one widening pass of a float16 cache
    vp[:, :, :n_k] = (v[:, :n_k] if v.dtype == np.float16 else half(v[:, :n_k])).transpose(0, 2, 1)
    dot = dot_f16_vec if n == 1 else dot_f16_batch
    qg = half(q).reshape(h_kv, h // h_kv, n, d)               # (h_kv, g, n, d) each group beside its key head
    out = np.empty((h_kv, h // h_kv, n, d), F32)              # (h_kv, g, n, d)
    rows = max(1, (1 << 20) // (h * pad))                     # queries per chunk: temporaries of ~64 MB at most
    for lo in range(0, n, rows):
        qs = qg[:, :, lo:lo + rows]                           # (h_kv, g, r, d)
        s = dot(qs[:, :, :, None, :], kp[:, None, None, :, :])   # (h_kv, g, r, n_kv)
        seen = np.arange(pad)[None, :] <= start + np.arange(lo, lo + qs.shape[2])[:, None]   # (r, n_kv)
        a = half(softmax(s, scale, np.where(seen, F32(0), F32(-np.inf))))   # (h_kv, g, r, n_kv)
        out[:, :, lo:lo + rows] = dot(a[:, :, :, None, :], vp[:, None, None, :, :])   # (h_kv, g, r, d)
    return out.reshape(h, n, d)


@functools.cache
def _fused_module():
    try:
        from . import _ggml_fused
        from ._numba_load import FromCache
    except ImportError:
        return None
    return FromCache(_ggml_fused)


def kernels():
    """The numba kernels of this arithmetic (:mod:`attnlab.kernels._ggml_fused`: the same bits, each loaded from
    numba's cache at its first call), or None without numba or with ``ATTNLAB_NO_NUMBA`` (or
    ``ATTNLAB_KERNEL=numpy``) set: then the numpy functions above serve. Inside a model's pass
    (:func:`attnlab.kernels._step.one_step`) asked once per step."""
    step = answers()
    if step is not None and "ggml kernels" in step:
        return step["ggml kernels"]
    got = None if numpy_unless_numba() is not None else _fused_module()
    if step is not None:
        step["ggml kernels"] = got
    return got


def rope_tables(positions, d: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin (n, d/2) float32 at ``positions`` (:func:`rope_table`'s rows)."""
    tables = [rope_table(int(p), d, float(base)) for p in positions]
    return np.stack([c for c, _ in tables]), np.stack([s for _, s in tables])   # (n, d/2) each
