"""Speed and memory of attnlab's attention paths, beside PyTorch's when it is installed.

Every figure comes from one process: each comparison alternates the two contenders and reports medians,
and the numpy GEMM rate it is judged against is measured in the same run. Functions here return data;
``attnlab bench`` prints it. All runs are float32, batch 1, 12 heads, d_head 64 (GPT-2 small's heads).
"""

from __future__ import annotations

import resource
import time
import tracemalloc
from dataclasses import asdict, dataclass, replace

import numpy as np

from ._checks import check_attention_args, check_dout
from ._threads import blas_info
from .attention import attention
from .cache import KVCache
from .naive import naive_attention, naive_attention_grad
from .tiled import tiled_attention, tiled_attention_grad

N_HEADS, D_HEAD = 12, 64
SIZES = (256, 512, 1024, 2048, 4096, 8192)
QUICK_SIZES = (256, 1024, 2048)
DECODE_CONTEXTS = (1024, 4096)
BACKWARD_SIZES = (1024, 2048)
QUICK_BACKWARD_SIZES = (1024,)
SCALE_N = 65_536
NAIVE_MAX_BYTES = 3 * 2**30       # the naive path holds ~3 float32 grids at once; skip it above this


@dataclass(frozen=True)
class ForwardRow:
    n: int
    is_causal: bool
    tiled_ms: float
    tiled_gflops: float
    naive_ms: float | None           # None: skipped, its grids would need more than NAIVE_MAX_BYTES
    torch_ms: float | None           # None: torch is not installed
    tiled_vs_torch: float | None     # tiled time / torch time: below 1 is faster
    tiled_vs_gemm: float             # tiled GFLOP/s / numpy's float32 GEMM rate
    output_mib: float
    tiled_extra_mib: float           # peak memory allocated during the call (output included)
    naive_extra_mib: float | None


@dataclass(frozen=True)
class DecodeRow:
    context: int
    attnlab_ms: float                # one token's attention against the preallocated cache
    torch_ms: float | None
    ratio: float | None


@dataclass(frozen=True)
class BackwardRow:
    n: int
    tiled_ms: float                  # forward (for lse) + FlashAttention-2 backward
    naive_ms: float | None
    torch_ms: float | None           # torch SDPA forward + backward
    ratio: float | None              # tiled / torch


def load_torch():
    """torch, or None when it is not installed."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def median_times(fns: dict, repeat: int) -> dict:
    """Milliseconds per call of each function: one warm-up each, then ``repeat`` rounds that call them in
    turn (so load from elsewhere hits all alike); the median of each."""
    for f in fns.values():
        f()
    times = {name: [] for name in fns}
    for _ in range(repeat):
        for name, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t0)
    return {name: 1e3 * float(np.median(t)) for name, t in times.items()}


def extra_peak_mib(f) -> float:
    """Peak memory allocated while ``f`` runs, over what was allocated before (numpy reports its
    allocations to tracemalloc; the result of ``f`` is included)."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        result = f()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    del result
    return (peak - base) / 2**20


def gemm_gflops(n: int = 2048, repeat: int = 5) -> float:
    """numpy's float32 matrix-multiply rate (GFLOP/s) on n × n, with BLAS's own threads."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    ms = median_times({"gemm": lambda: a @ b}, repeat)["gemm"]
    return 2 * n**3 / (ms * 1e-3) / 1e9


def attention_flops(n: int, is_causal: bool) -> float:
    """Multiply-adds of q kᵀ and a v over the scores that count (about half of them when causal), ×2."""
    scores = n * (n + 1) / 2 if is_causal else n * n
    return 2 * scores * 2 * D_HEAD * N_HEADS


def qkv(n_q: int, n_k: int, rng: np.random.Generator):
    q = rng.standard_normal((1, N_HEADS, n_q, D_HEAD), dtype=np.float32)   # (B, h, n_q, d_head)
    k = rng.standard_normal((1, N_HEADS, n_k, D_HEAD), dtype=np.float32)   # (B, h, n_k, d_head)
    v = rng.standard_normal((1, N_HEADS, n_k, D_HEAD), dtype=np.float32)   # (B, h, n_k, d_head)
    return q, k, v


def forward_row(n: int, is_causal: bool, gemm: float, *, repeat: int, torch=None) -> ForwardRow:
    """Tiled vs naive vs torch SDPA at one size."""
    q, k, v = qkv(n, n, np.random.default_rng(n))
    fns = {"tiled": lambda: tiled_attention(q, k, v, is_causal=is_causal)}
    naive_fits = 3 * N_HEADS * n * n * 4 <= NAIVE_MAX_BYTES
    if naive_fits:
        fns["naive"] = lambda: naive_attention(check_attention_args(q, k, v, is_causal=is_causal))
    if torch is not None:
        tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        fns["torch"] = lambda: sdpa(tq, tk, tv, is_causal=is_causal)
    ms = median_times(fns, repeat if n <= 2048 else max(2, repeat // 2))
    gflops = attention_flops(n, is_causal) / (ms["tiled"] * 1e-3) / 1e9
    return ForwardRow(
        n=n, is_causal=is_causal, tiled_ms=ms["tiled"], tiled_gflops=gflops, naive_ms=ms.get("naive"),
        torch_ms=ms.get("torch"), tiled_vs_torch=ms["tiled"] / ms["torch"] if "torch" in ms else None,
        tiled_vs_gemm=gflops / gemm, output_mib=q.nbytes / 2**20,
        tiled_extra_mib=extra_peak_mib(fns["tiled"]),
        naive_extra_mib=extra_peak_mib(fns["naive"]) if naive_fits and n <= 2048 else None)


def decode_row(context: int, *, repeat: int, torch=None) -> DecodeRow:
    """One decode step at ``context`` cached tokens: the new token's query against the cache, as the
    multi-head layer runs it (the cache holds only finite values, checked on append)."""
    rng = np.random.default_rng(context)
    q, k, v = qkv(1, context, rng)
    cache = KVCache.empty(N_HEADS, 2 * context, D_HEAD, batch_shape=(1,))
    keys, values = cache.append(k, v)                             # (1, h, context, d_head) views
    fns = {"attnlab": lambda: attention(q, keys, values, is_causal=True, check_finite=False)}
    if torch is not None:
        tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        fns["torch"] = lambda: sdpa(tq, tk, tv)       # torch's is_causal is top-left: one query sees all keys
    ms = median_times(fns, 20 * repeat)
    return DecodeRow(context=context, attnlab_ms=ms["attnlab"], torch_ms=ms.get("torch"),
                     ratio=ms["attnlab"] / ms["torch"] if "torch" in ms else None)


def backward_row(n: int, *, repeat: int, torch=None) -> BackwardRow:
    """Causal backward at size n: tiled (its forward included) vs naive vs torch forward + backward."""
    rng = np.random.default_rng(n)
    q, k, v = qkv(n, n, rng)
    do = rng.standard_normal(q.shape, dtype=np.float32)           # (B, h, n, d_head)
    fns = {"tiled": lambda: tiled_attention_grad(q, k, v, do, is_causal=True),
           "naive": lambda: naive_backward(q, k, v, do)}
    if torch is not None:
        tq, tk, tv = (torch.from_numpy(x).requires_grad_() for x in (q, k, v))
        tdo = torch.from_numpy(do)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        fns["torch"] = lambda: sdpa(tq, tk, tv, is_causal=True).backward(tdo)
    ms = median_times(fns, repeat)
    return BackwardRow(n=n, tiled_ms=ms["tiled"], naive_ms=ms["naive"], torch_ms=ms.get("torch"),
                       ratio=ms["tiled"] / ms["torch"] if "torch" in ms else None)


def naive_backward(q, k, v, do):
    c = check_attention_args(q, k, v, is_causal=True)
    return naive_attention_grad(c, check_dout(c, do))


def n_steps(*, quick: bool = False) -> int:
    """How many steps :func:`run_bench` announces to ``progress``: the GEMM rate twice, then each row."""
    n_forward = 2 * len(QUICK_SIZES if quick else SIZES)                  # causal and full at each size
    n_backward = len(QUICK_BACKWARD_SIZES if quick else BACKWARD_SIZES)
    return 2 + n_forward + len(DECODE_CONTEXTS) + n_backward


def run_bench(*, quick: bool = False, progress=None) -> dict:
    """The whole benchmark as plain data. ``progress(str)`` is called before each step (the CLI's bar)."""
    say = progress or (lambda step: None)
    torch = load_torch()
    repeat = 3 if quick else 5
    say("numpy float32 GEMM rate")
    gemms = [gemm_gflops()]
    forward = []
    for n in QUICK_SIZES if quick else SIZES:
        for is_causal in (True, False):
            say(f"forward n={n} {'causal' if is_causal else 'full'}")
            forward.append(forward_row(n, is_causal, gemms[0], repeat=repeat, torch=torch))
    # On a shared machine one measurement of the GEMM rate can land while another process holds a core:
    # the rate is measured again after the forward rows and the faster one (the machine's) is the yardstick.
    say("numpy float32 GEMM rate, again")
    gemms.append(gemm_gflops())
    gemm = max(gemms)
    forward = [replace(f, tiled_vs_gemm=f.tiled_gflops / gemm) for f in forward]
    decode = []
    for context in DECODE_CONTEXTS:
        say(f"decode at context {context}")
        decode.append(decode_row(context, repeat=repeat, torch=torch))
    backward = []
    for n in QUICK_BACKWARD_SIZES if quick else BACKWARD_SIZES:
        say(f"backward n={n}")
        backward.append(backward_row(n, repeat=repeat, torch=torch))
    return {"shape": {"batch": 1, "n_heads": N_HEADS, "d_head": D_HEAD, "dtype": "float32"},
            "gemm_gflops": gemm, "gemm_gflops_measured": gemms, "blas": blas_info(),
            "torch": None if torch is None else {"version": torch.__version__, "threads": torch.get_num_threads()},
            "forward": [asdict(r) for r in forward], "decode": [asdict(r) for r in decode],
            "backward": [asdict(r) for r in backward]}


def run_scale(n: int = SCALE_N) -> dict:
    """Causal tiled attention at ``n`` tokens (12 heads, d_head 64, float32): its time and the memory it
    added to the process (peak resident set, from getrusage). The naive grids would need 12·n²·4 bytes."""
    q, k, v = qkv(n, n, np.random.default_rng(0))
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    out = tiled_attention(q, k, v, is_causal=True)
    seconds = time.perf_counter() - t0
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"n": n, "n_heads": N_HEADS, "d_head": D_HEAD, "seconds": seconds,
            "gflops": attention_flops(n, True) / seconds / 1e9,
            "inputs_mib": 3 * q.nbytes / 2**20, "output_mib": out.nbytes / 2**20,
            "peak_rss_mib": rss_after / 1024, "extra_peak_rss_mib": max(0, rss_after - rss_before) / 1024,
            "naive_grid_gib": N_HEADS * n * n * 4 / 2**30, "finite": bool(np.isfinite(out).all())}
