"""Speed and memory of attnlab's attention paths, beside PyTorch's when it is installed: an honest bench.

Every figure comes from one process, and every comparison times its pair alone: attnlab against torch,
alternating (A B, then B A, ...), with nothing else in between; the naive reference gets its own loop
afterwards, so the hundreds of MB it allocates never land between the two (that once slowed torch by 28%
and printed a ratio of 0.99 where the honest one was 1.55). Each round gives one ratio attnlab / torch;
the bench reports their median and their min-max. The numpy GEMM rate it is judged against is measured in
the same run. Beside the figures: the CPU model, its SIMD level, the BLAS kernel, the exponential the numpy
path chose here, and which path (and tile kernel) each call took. ``cores`` pins both sides to the same
cores (the process's CPU affinity, which attnlab's workers follow, BLAS's and torch's thread counts).
Functions here return data; ``attnlab bench`` prints it. Runs are float32, 12 heads, d_head 64 (GPT-2
small's heads).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import resource
import subprocess
import sys
import time
import tracemalloc
from dataclasses import asdict, dataclass, replace

import numpy as np

from ..kernels import _kernels
from ..kernels._checks import as_positive_int, check_attention_args, check_dout
from ..kernels._threads import blas_info, blas_limiter, usable_cores
from ..kernels.attention import attention, attention_grad, attention_path
from ..layer.cache import KVCache
from ..kernels.naive import naive_attention, naive_attention_grad

N_HEADS, D_HEAD = 12, 64
SIZES = (256, 512, 1024, 2048, 4096, 8192)
QUICK_SIZES = (256, 1024, 2048)
BATCH = (32, 128)                 # BERT-style: 32 sequences of 128 tokens, 12 heads, not causal
DECODE_CONTEXTS = (1024, 4096)
BACKWARD_SIZES = (1024, 2048)
QUICK_BACKWARD_SIZES = (1024,)
SCALE_N = 65_536
NAIVE_MAX_BYTES = 3 * 2**30       # the naive path holds ~3 float32 grids at once; skip it above this
# SIMD levels, best first: the /proc/cpuinfo flag that shows each (x86), or the feature (ARM).
SIMD_FLAGS = (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"), ("sse4_2", "SSE4.2"),
              ("sve", "SVE"), ("asimd", "NEON"))


@dataclass(frozen=True)
class Pair:
    """Two contenders timed alone, alternating: medians of each and of the per-round ratios a / b."""
    a_ms: float
    b_ms: float
    ratio: float                     # median over rounds of (a's time / b's time): below 1, a is faster
    ratio_min: float
    ratio_max: float
    rounds: int


@dataclass(frozen=True)
class ForwardRow:
    n: int
    is_causal: bool
    path: str                        # which path attention() took, and its tile kernel
    attnlab_ms: float
    gflops: float
    torch_ms: float | None           # None: torch is not installed
    ratio: float | None              # attnlab / torch, median of the rounds: below 1 is faster
    ratio_min: float | None
    ratio_max: float | None
    of_gemm: float                   # attnlab GFLOP/s / numpy's float32 GEMM rate
    naive_ms: float | None           # in its own loop; None: skipped, its grids would exceed NAIVE_MAX_BYTES
    output_mib: float
    extra_mib: float                 # peak memory allocated during the call (output included)
    naive_extra_mib: float | None


@dataclass(frozen=True)
class BatchRow:
    batch: int
    n: int
    path: str
    attnlab_ms: float
    torch_ms: float | None
    ratio: float | None
    ratio_min: float | None
    ratio_max: float | None


@dataclass(frozen=True)
class DecodeRow:
    context: int
    path: str
    attnlab_ms: float                # one token's attention against the preallocated cache
    torch_ms: float | None
    ratio: float | None
    ratio_min: float | None
    ratio_max: float | None


@dataclass(frozen=True)
class BackwardRow:
    n: int
    path: str
    attnlab_ms: float                # forward (for lse) + backward, attention_grad
    torch_ms: float | None           # torch SDPA forward + backward
    ratio: float | None
    ratio_min: float | None
    ratio_max: float | None
    naive_ms: float | None           # in its own loop


def load_torch():
    """torch, or None when it is not installed."""
    try:
        import torch
    except ImportError:
        return None
    return torch


# ----------------------------------------------------------------------------------------------------
# the machine


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, else what platform says)."""
    text = read_cpuinfo() if cpuinfo is None else cpuinfo
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "Hardware", "cpu model") and value.strip():
            return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags (x86 "flags", ARM "Features") from /proc/cpuinfo; empty elsewhere."""
    text = read_cpuinfo() if cpuinfo is None else cpuinfo
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def simd_level(flags: set[str]) -> dict:
    """The best SIMD level among ``flags`` ("AVX-512", "AVX2", ...; "unknown" without flags), and which
    of the flags that matter here the CPU has (fma, the AVX-512 subsets)."""
    level = next((name for flag, name in SIMD_FLAGS if flag in flags), "unknown")
    extras = sorted(f for f in flags if f == "fma" or f.startswith("avx512"))
    return {"level": level, "flags": extras}


def read_cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


def machine_info(torch=None) -> dict:
    """Where the figures come from: CPU, SIMD, cores (those the run may use, and the machine's), BLAS, torch,
    numba, the kernels the rules choose here (``tile_kernel``: a causal call of FUSED_MIN_SCORES scores) and
    the tune profile's status."""
    from ..kernels import profile

    exp = _kernels.numpy_exp()
    big_kernel = _kernels.kernel_choice(_kernels.FUSED_MIN_SCORES, masked=True)   # a big causal call's
    simd = simd_level(cpu_flags())
    return {"cpu": cpu_model(), "simd": simd["level"], "simd_flags": simd["flags"], "cores": usable_cores(),
            "machine_cores": os.cpu_count(),
            "machine": platform.machine(), "python": platform.python_version(), "numpy": np.__version__,
            "blas": blas_info(),
            "torch": None if torch is None else {"version": torch.__version__, "threads": torch.get_num_threads(),
                                                 "cpu_capability": cpu_capability(torch)},
            "numba": _kernels.numba_version(), "tile_kernel": big_kernel[0], "tile_kernel_reason": big_kernel[1],
            "fused_min_scores": _kernels.FUSED_MIN_SCORES, "numba_disabled": _kernels.numba_disabled(),
            "tune": profile.status().reason, "numpy_exp": {"chosen": exp.name, "reason": exp.reason}}


def cpu_capability(torch) -> str | None:
    try:
        return torch.backends.cpu.get_cpu_capability()
    except AttributeError:
        return None


def blas_kernel(blas: list[dict]) -> str:
    """"openblas 0.3.31 (Haswell, 2 threads)" for each BLAS loaded, or "unknown"."""
    return ", ".join(f"{b['internal_api']} {b['version']} ({b['architecture'] or b['prefix']}, "
                     f"{b['num_threads']} threads)" for b in blas if b["user_api"] == "blas") or "unknown"


@contextlib.contextmanager
def on_cores(cores: int | None, torch=None):
    """A context in which both sides run on the same ``cores`` cores: the process is pinned to the first
    ``cores`` of the cores it may use (attnlab's workers follow its CPU affinity), BLAS and torch run that many
    threads. Everything is restored on leaving. ``None``: a no-op, every usable core.

    Raises ValueError when ``cores`` exceeds the usable cores or the OS cannot pin a process (not Linux)."""
    cores = check_cores(cores)
    if cores is None:
        yield
        return
    before = os.sched_getaffinity(0)
    torch_threads = None if torch is None else torch.get_num_threads()
    limiter = blas_limiter()
    with contextlib.ExitStack() as stack:
        os.sched_setaffinity(0, sorted(before)[:cores])
        stack.callback(os.sched_setaffinity, 0, before)
        if torch is not None:
            torch.set_num_threads(cores)
            stack.callback(torch.set_num_threads, torch_threads)
        if limiter is not None:
            stack.enter_context(limiter.limit(limits=cores, user_api="blas"))
        yield


def check_cores(cores: int | None) -> int | None:
    """``cores`` as :func:`on_cores` takes it: None, or a positive int no larger than the usable cores, on an
    OS that can pin a process."""
    cores = as_positive_int("cores", cores, allow_none=True)
    if cores is None:
        return None
    have = usable_cores()
    if cores > have:
        raise ValueError(f"cores must be at most the {have} cores this process may use, got {cores}")
    if not hasattr(os, "sched_setaffinity"):
        raise ValueError(f"cores={cores} needs os.sched_setaffinity (Linux) to pin the process; "
                         "leave it out to use every core")
    return cores


# ----------------------------------------------------------------------------------------------------
# timing


def part_clock(out: dict):
    """A profile by parts: ``clock(name, f)`` calls ``f``, adds its milliseconds to ``out[name]`` (summed
    over the calls of that name, as a model's layers are) and returns what ``f`` returned."""
    def clock(name, f):
        t = time.perf_counter()
        r = f()
        out[name] = out.get(name, 0.0) + 1e3 * (time.perf_counter() - t)
        return r
    return clock


def time_call(f) -> float:
    """Wall seconds of one call of ``f``."""
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def cpu_call(f) -> float:
    """Process seconds (every thread's CPU time) of one call of ``f``: steadier than the wall on a loaded machine."""
    t0 = time.process_time()
    f()
    return time.process_time() - t0


def reported(f) -> float:
    """The seconds ``f`` reports of its own call: a side that times itself (llama.cpp in its own process, whose
    CPU time this process's clock never sees), paired with one timed by :func:`cpu_seconds`."""
    return f()


def cpu_seconds(f):
    """``f`` as a side that times itself (process seconds of one call), to pair with a :func:`reported` one."""
    return lambda: cpu_call(f)


def paired(a, b, rounds: int, *, clock=time_call) -> Pair:
    """``a`` against ``b`` alone: one warm-up each, then ``rounds`` rounds, each calling both (A B, then
    B A the next round, so neither always runs second); the medians and the per-round ratios a / b.
    ``clock``: :func:`time_call` (wall) or :func:`cpu_call` (process time)."""
    a(), b()
    ta, tb = [], []
    for r in range(rounds):
        if r % 2:
            tb.append(clock(b))
            ta.append(clock(a))
        else:
            ta.append(clock(a))
            tb.append(clock(b))
    ratios = np.array(ta) / np.array(tb)
    return Pair(a_ms=1e3 * float(np.median(ta)), b_ms=1e3 * float(np.median(tb)), ratio=float(np.median(ratios)),
                ratio_min=float(ratios.min()), ratio_max=float(ratios.max()), rounds=rounds)


class Decoder:
    """A model, its caches filled with a ``context``-token prompt, and :meth:`step`: one decode step,
    rewound afterwards so every step sees the same context."""

    def __init__(self, model, context: int = 64):
        from ..stack.transformer import forward, new_caches

        self.model, self.forward, self.context = model, forward, context
        self.caches = new_caches(model, context + 1)
        self.fill()

    def fill(self) -> None:
        """The context: a prefill of ``context`` tokens."""
        self.forward(self.model, np.arange(self.context) % self.model.config.vocab_size, caches=self.caches)

    def step(self) -> np.ndarray:
        logits = self.forward(self.model, np.array([self.context % self.model.config.vocab_size]),
                              caches=self.caches).logits             # (1, vocab)
        for cache in self.caches:
            cache.length = self.context
        return logits


def alone(f, rounds: int) -> float:
    """Milliseconds per call of ``f`` in its own loop: one warm-up, then the median of ``rounds``."""
    f()
    return 1e3 * float(np.median([time_call(f) for _ in range(rounds)]))


def against_torch(f, torch_f, rounds: int) -> dict:
    """``f`` alone, or paired with ``torch_f`` when there is one: attnlab_ms, torch_ms, ratio, min, max."""
    if torch_f is None:
        return {"attnlab_ms": alone(f, rounds), "torch_ms": None, "ratio": None, "ratio_min": None,
                "ratio_max": None}
    p = paired(f, torch_f, rounds)
    return {"attnlab_ms": p.a_ms, "torch_ms": p.b_ms, "ratio": p.ratio, "ratio_min": p.ratio_min,
            "ratio_max": p.ratio_max}


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
    ms = alone(lambda: a @ b, repeat)
    return 2 * n**3 / (ms * 1e-3) / 1e9


def attention_flops(n: int, is_causal: bool) -> float:
    """Multiply-adds of q kᵀ and a v over the scores that count (about half of them when causal), ×2."""
    scores = n * (n + 1) / 2 if is_causal else n * n
    return 2 * scores * 2 * D_HEAD * N_HEADS


def qkv(n_q: int, n_k: int, rng: np.random.Generator, batch: int = 1):
    q = rng.standard_normal((batch, N_HEADS, n_q, D_HEAD), dtype=np.float32)   # (B, h, n_q, d_head)
    k = rng.standard_normal((batch, N_HEADS, n_k, D_HEAD), dtype=np.float32)   # (B, h, n_k, d_head)
    v = rng.standard_normal((batch, N_HEADS, n_k, D_HEAD), dtype=np.float32)   # (B, h, n_k, d_head)
    return q, k, v


def sdpa(torch, q, k, v, **kw):
    """A torch SDPA call on numpy inputs (shared memory, converted once), or None without torch."""
    if torch is None:
        return None
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    f = torch.nn.functional.scaled_dot_product_attention
    return lambda: f(tq, tk, tv, **kw)


# ----------------------------------------------------------------------------------------------------
# the rows


def forward_row(n: int, is_causal: bool, gemm: float, *, repeat: int, torch=None) -> ForwardRow:
    """attnlab.kernels.attention (the front door) against torch SDPA at one size, alone; then naive in its own loop."""
    q, k, v = qkv(n, n, np.random.default_rng(n))
    ours = lambda: attention(q, k, v, is_causal=is_causal)                        # noqa: E731
    rounds = repeat if n <= 2048 else max(3, repeat // 2)
    t = against_torch(ours, sdpa(torch, q, k, v, is_causal=is_causal), rounds)
    naive_fits = 3 * N_HEADS * n * n * 4 <= NAIVE_MAX_BYTES
    naive = (lambda: naive_attention(check_attention_args(q, k, v, is_causal=is_causal))) if naive_fits else None
    gflops = attention_flops(n, is_causal) / (t["attnlab_ms"] * 1e-3) / 1e9
    return ForwardRow(
        n=n, is_causal=is_causal, path=str(attention_path(q, k, v, is_causal=is_causal)), gflops=gflops,
        of_gemm=gflops / gemm, naive_ms=alone(naive, max(2, rounds // 2)) if naive_fits else None,
        output_mib=q.nbytes / 2**20, extra_mib=extra_peak_mib(ours),
        naive_extra_mib=extra_peak_mib(naive) if naive_fits and n <= 2048 else None, **t)


def batch_row(batch: int, n: int, *, repeat: int, torch=None) -> BatchRow:
    """A BERT-style batch: ``batch`` sequences of ``n`` tokens, 12 heads, not causal, one call each side."""
    q, k, v = qkv(n, n, np.random.default_rng(batch * n), batch=batch)
    t = against_torch(lambda: attention(q, k, v), sdpa(torch, q, k, v), repeat)
    return BatchRow(batch=batch, n=n, path=str(attention_path(q, k, v)), **t)


def decode_row(context: int, *, repeat: int, torch=None) -> DecodeRow:
    """One decode step at ``context`` cached tokens: the new token's query against the cache, as the
    multi-head layer runs it (the cache holds only finite values, checked on append)."""
    rng = np.random.default_rng(context)
    q, k, v = qkv(1, context, rng)
    cache = KVCache.empty(N_HEADS, 2 * context, D_HEAD, batch_shape=(1,))
    keys, values = cache.append(k, v)                             # (1, h, context, d_head) views
    ours = lambda: attention(q, keys, values, is_causal=True, check_finite=False)   # noqa: E731
    # torch's is_causal is top-left: one query sees all keys, so torch runs without it
    t = against_torch(ours, sdpa(torch, q, k, v), 20 * repeat)
    return DecodeRow(context=context, path=str(attention_path(q, keys, values, is_causal=True)), **t)


def backward_row(n: int, *, repeat: int, torch=None) -> BackwardRow:
    """Causal forward + backward at size n: attention_grad against torch SDPA forward + backward, alone;
    then the naive reference in its own loop."""
    rng = np.random.default_rng(n)
    q, k, v = qkv(n, n, rng)
    do = rng.standard_normal(q.shape, dtype=np.float32)           # (B, h, n, d_head)
    torch_f = None
    if torch is not None:
        tq, tk, tv = (torch.from_numpy(x).requires_grad_() for x in (q, k, v))
        tdo = torch.from_numpy(do)
        f = torch.nn.functional.scaled_dot_product_attention
        torch_f = lambda: f(tq, tk, tv, is_causal=True).backward(tdo)            # noqa: E731
    t = against_torch(lambda: attention_grad(q, k, v, do, is_causal=True), torch_f, repeat)
    return BackwardRow(n=n, path=str(attention_path(q, k, v, is_causal=True, training=True)),
                       naive_ms=alone(lambda: naive_backward(q, k, v, do), max(2, repeat // 2)), **t)


def naive_backward(q, k, v, do):
    c = check_attention_args(q, k, v, is_causal=True)
    return naive_attention_grad(c, check_dout(c, do))


# A fresh interpreter's first and second attention calls, and what loading the fused kernels adds: resident
# memory (/proc/self/statm) and time of each step, as JSON on stdout.
FIRST_CALL_PROBE = r"""
import json, sys, time
import numpy as np
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20
from attnlab import attention
from attnlab.kernels import _kernels
n, heads, fused_first = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
q, k, v = (np.random.default_rng(0).standard_normal((1, heads, n, 64), dtype=np.float32) for _ in range(3))
steps = {}
def step(name, f):
    r0, t0 = rss(), time.perf_counter()
    f()
    steps[name] = {"rss_mib": rss() - r0, "ms": 1e3 * (time.perf_counter() - t0)}
if fused_first:
    step("load numba", _kernels.load_fused)
step("first", lambda: attention(q, k, v, is_causal=True))
step("second", lambda: attention(q, k, v, is_causal=True))
steps["kernel"] = _kernels.kernel_in_use()
print(json.dumps(steps))
"""


def first_call_row(n: int = 1024) -> dict | None:
    """A fresh process's first causal attention call at n tokens (12 heads, d_head 64) against its second, by
    default and with numba loaded first (what numba's import and cache load cost apart): resident MiB and ms
    of each, and the kernel they ran on. None where the OS shows no /proc/self/statm (not Linux)."""
    if not os.path.exists("/proc/self/statm"):
        return None
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(package_root()), os.environ.get("PYTHONPATH", "")])}
    runs = {}
    for name, fused_first in (("default", "0"), ("numba loaded first", "1")):
        if fused_first == "1" and (_kernels.numba_disabled() or not _kernels.numba_installed()):
            continue                                       # (the child inherits ATTNLAB_NO_NUMBA)
        out = subprocess.run([sys.executable, "-c", FIRST_CALL_PROBE, str(n), str(N_HEADS), fused_first],
                             env=env, capture_output=True, text=True, check=True).stdout
        runs[name] = json.loads(out)
    default = runs["default"]
    return {"n": n, "runs": runs,
            "first_over_second_mib": default["first"]["rss_mib"] - default["second"]["rss_mib"]}


def package_root():
    """The folder that holds the attnlab package this process imported (for a child interpreter's path)."""
    from pathlib import Path
    return Path(__file__).resolve().parents[2]


def n_steps(*, quick: bool = False, sizes=None) -> int:
    """How many steps :func:`run_bench` announces to ``progress``: the first call, the GEMM rate twice, then
    each row."""
    n_forward = 2 * len(forward_sizes(quick, sizes))                       # causal and full at each size
    n_backward = len(QUICK_BACKWARD_SIZES if quick else BACKWARD_SIZES)
    return 3 + n_forward + 1 + len(DECODE_CONTEXTS) + n_backward


def forward_sizes(quick: bool, sizes=None) -> tuple[int, ...]:
    """The forward rows' sizes: ``sizes`` when given (each a positive int), else the quick or full set."""
    if sizes is None:
        return QUICK_SIZES if quick else SIZES
    sizes = tuple(as_positive_int("sizes", n) for n in sizes)
    if not sizes:
        raise ValueError("sizes must hold at least one size, got none")
    return sizes


def run_bench(*, quick: bool = False, progress=None, repeat: int | None = None, cores: int | None = None,
              sizes=None) -> dict:
    """The whole benchmark as plain data. ``progress(str)`` is called before each step (the CLI's bar).
    ``cores``: run both sides on that many cores (:func:`on_cores`; default every usable core); ``sizes``: the
    forward rows' n (default ``QUICK_SIZES`` with ``quick``, else ``SIZES``)."""
    say = progress or (lambda step: None)
    torch = load_torch()
    repeat = (5 if quick else 9) if repeat is None else as_positive_int("repeat", repeat)
    sizes = forward_sizes(quick, sizes)
    say("the first call in a fresh process")
    first_call = first_call_row()
    with on_cores(cores, torch):
        result = bench_rows(say, torch, repeat=repeat, sizes=sizes, quick=quick)
    result["first_call"] = first_call
    result["cores_asked"] = cores
    result["goals"] = goal_table(result)
    return result


def bench_rows(say, torch, *, repeat: int, sizes: tuple[int, ...], quick: bool) -> dict:
    """:func:`run_bench`'s measurements, on the cores it has set up."""
    machine = machine_info(torch)
    say("numpy float32 GEMM rate")
    gemms = [gemm_gflops()]
    forward = []
    for n in sizes:
        for is_causal in (True, False):
            say(f"forward n={n} {'causal' if is_causal else 'full'}")
            forward.append(forward_row(n, is_causal, gemms[0], repeat=repeat, torch=torch))
    # On a shared machine one measurement of the GEMM rate can land while another process holds a core:
    # the rate is measured again after the forward rows and the faster one (the machine's) is the yardstick.
    say("numpy float32 GEMM rate, again")
    gemms.append(gemm_gflops())
    gemm = max(gemms)
    forward = [replace(f, of_gemm=f.gflops / gemm) for f in forward]
    say(f"batch {BATCH[0]} × {BATCH[1]} tokens")
    batch = [batch_row(*BATCH, repeat=repeat, torch=torch)]
    decode = []
    for context in DECODE_CONTEXTS:
        say(f"decode at context {context}")
        decode.append(decode_row(context, repeat=repeat, torch=torch))
    backward = []
    for n in QUICK_BACKWARD_SIZES if quick else BACKWARD_SIZES:
        say(f"backward n={n}")
        backward.append(backward_row(n, repeat=repeat, torch=torch))
    return {"machine": machine,
            "shape": {"n_heads": N_HEADS, "d_head": D_HEAD, "dtype": "float32", "rounds": repeat},
            "method": "each pair alone, alternating; ratio = median of per-round attnlab/torch (min-max); "
                      "naive in its own loop",
            "gemm_gflops": gemm, "gemm_gflops_measured": gemms,
            "forward": [asdict(r) for r in forward], "batch": [asdict(r) for r in batch],
            "decode": [asdict(r) for r in decode], "backward": [asdict(r) for r in backward],
            "blas_contention": blas_contention(), "load_average": load_average()}


def blas_contention(rounds: int = 7) -> dict | None:
    """The same batched matrix product (MiniLM's scores: 12 heads of 494 × 64 by 64 × 494, float32) with BLAS
    on all its threads and on one, alternating: the medians in ms. On a quiet machine the two are close, or
    more threads win; when other processes hold the cores, BLAS threads that wait on each other make the
    first many times slower (measured 650 against 27 ms at a load of 15 on 2 cores). Every path that runs
    numpy's matmul on BLAS's own threads (the naive grid, the decode step) and torch's threads suffer it;
    the tiled path, one BLAS thread per worker, does not. None without threadpoolctl."""
    limiter = blas_limiter()
    if limiter is None:
        return None
    q = np.random.default_rng(0).standard_normal((N_HEADS, 494, D_HEAD), dtype=np.float32)    # (h, n, d_head)
    kT = np.ascontiguousarray(np.swapaxes(q, -1, -2))                                         # (h, d_head, n)

    def one_thread():
        with limiter.limit(limits=1, user_api="blas"):
            q @ kT                                                                            # (h, n, n)

    p = paired(lambda: q @ kT, one_thread, rounds)
    threads = max((b["num_threads"] for b in blas_info() if b["user_api"] == "blas"), default=None)
    return {"blas_threads": threads, "all_threads_ms": p.a_ms, "one_thread_ms": p.b_ms, "ratio": p.ratio}


def load_average() -> list[float] | None:
    """The 1, 5 and 15-minute load averages after the run: above the core count, other processes were
    competing for the cores (torch's threads wait on each other at every barrier, numpy's less)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


# The goals, as (case, goal text, which rows, the figure (a row's key, or a function of the row), the
# bound, "<=" or ">=").
GOALS = (
    ("tiled forward, n = 1024 … 8192, causal and not", "<= 1.0x torch",
     lambda r: [f for f in r["forward"] if f["n"] >= 1024], "ratio", 1.0, "<="),
    ("n = 256 and 512", "<= 1.5x torch", lambda r: [f for f in r["forward"] if f["n"] <= 512], "ratio", 1.5, "<="),
    ("batch of 32 × 128 tokens, 12 heads", "<= 1.2x torch", lambda r: r["batch"], "ratio", 1.2, "<="),
    ("decode step at contexts 1024 and 4096", "<= 1.0x torch", lambda r: r["decode"], "ratio", 1.0, "<="),
    ("share of numpy's GEMM rate at n >= 4096, not causal", ">= 60%",
     lambda r: [f for f in r["forward"] if f["n"] >= 4096 and not f["is_causal"]], "of_gemm", 0.6, ">="),
    ("backward (forward + backward)", "<= 1.0x torch forward + backward", lambda r: r["backward"], "ratio", 1.0, "<="),
    ("memory of the tiled forward from n = 1024: extra peak (output included) / output", "<= 1.5x the output",
     lambda r: [f for f in r["forward"] if f.get("path", "").startswith("tiled") and f["n"] >= 1024],
     lambda row: row["extra_mib"] / row["output_mib"], 1.5, "<="),
    ("first call in a fresh process, resident memory over the second's", "<= 50 MiB",
     lambda r: [r["first_call"]] if r.get("first_call") else [], "first_over_second_mib", 50, "<="),
)


def goal_table(r: dict) -> list[dict]:
    """The issue's goals against a :func:`run_bench` result: per goal the figures it covers ("n=1024 causal":
    value), the worst of them and whether every one meets it (None when torch was missing)."""
    table = []
    for case, goal, rows_of, key, bound, sense in GOALS:
        rows = rows_of(r)
        figures = {row_label(row): key(row) if callable(key) else row[key] for row in rows}
        values = [v for v in figures.values() if v is not None]
        worst = (max(values) if sense == "<=" else min(values)) if values else None
        met = None if worst is None else (worst <= bound if sense == "<=" else worst >= bound)
        table.append({"case": case, "goal": goal, "figures": figures, "worst": worst, "met": met})
    return table


def row_label(row: dict) -> str:
    if "runs" in row:
        return f"n={row['n']} causal"
    if "context" in row:
        return f"context {row['context']}"
    if "batch" in row:
        return f"{row['batch']} x {row['n']}"
    if "is_causal" in row:
        return f"n={row['n']} {'causal' if row['is_causal'] else 'full'}"
    return f"n={row['n']}"


def run_scale(n: int = SCALE_N) -> dict:
    """Causal tiled attention at ``n`` tokens (12 heads, d_head 64, float32): its time and the memory it
    added to the process (peak resident set, from getrusage). The naive grids would need 12·n²·4 bytes."""
    q, k, v = qkv(n, n, np.random.default_rng(0))
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    out = attention(q, k, v, is_causal=True, implementation="tiled")
    seconds = time.perf_counter() - t0
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"n": n, "n_heads": N_HEADS, "d_head": D_HEAD, "seconds": seconds,
            "gflops": attention_flops(n, True) / seconds / 1e9,
            "inputs_mib": 3 * q.nbytes / 2**20, "output_mib": out.nbytes / 2**20,
            "peak_rss_mib": rss_after / 1024, "extra_peak_rss_mib": max(0, rss_after - rss_before) / 1024,
            "naive_grid_gib": N_HEADS * n * n * 4 / 2**30, "finite": bool(np.isfinite(out).all())}
