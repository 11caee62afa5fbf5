"""Which kernels run on this machine: numpy's exponential for the tiles, and the numba fused kernel.

numpy's float32 ``exp2`` is vectorised only with AVX-512 builds of its SIMD loops; without them it runs at
half the speed of ``exp`` (measured on an AVX2-only EPYC: 2.53 against 1.26 ns per element), with them it
can be the faster one. No constant measured on one machine decides it: :func:`numpy_exp` times both on a
tile-sized array once per process, on the machine it runs on, and the tiled kernel uses the winner.

The fused kernel (:mod:`attnlab.kernels._fused`, the optional extra ``attnlab[fast]``) needs numba; setting the
environment variable ``ATTNLAB_NO_NUMBA=1`` makes every call take the numpy path as if numba were missing.

Loading numba is not free: in a fresh process, importing it and loading its first kernel's machine code from
the on-disk cache cost some 0.5-2 s and 110-140 MiB of resident memory (``benchmarks/first_call.py``), more than
a short call's whole run. So the fused kernels load the way one decides between renting and buying (the
ski-rental rule): calls run on the numpy path, which needs nothing loaded, until the time they have spent there
(with the present call's estimated time) reaches what loading numba costs (``NUMBA_LOAD_SECONDS``); then numba
loads and every later call is fused. Whatever the machine, the numpy path's extra time is then at most about
what loading would have cost, and a process that makes only short calls never pays for numba at all.
:func:`load_fused` loads it at once (``attnlab bench`` does, so that every row it times runs one kernel).
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

NO_NUMBA_ENV = "ATTNLAB_NO_NUMBA"
LOG2E = 1 / math.log(2)          # a Python float: float32 arrays times it stay float32 (NEP 50), where
                                 # an np.float64 made numpy cast through 128 KiB buffers and compute in float64


@dataclass(frozen=True)
class ExpChoice:
    """numpy's exponential for the tiles: ``exp`` (natural base) or ``exp2`` (base 2, log₂e folded into the
    scale of q so no pass over the tile pays for it)."""
    name: str                     # "exp" or "exp2"
    unit: float                   # scores are multiplied by this: 1 for exp, log₂e for exp2
    ns_per_element: dict          # the measurement that chose it: {"exp": ns, "exp2": ns}

    @property
    def fn(self):
        return np.exp2 if self.name == "exp2" else np.exp

    @property
    def log(self):
        return np.log2 if self.name == "exp2" else np.log


def time_exps(rows: int = 256, cols: int = 512, rounds: int = 7) -> dict:
    """ns per element of numpy's float32 exp and exp2, in place on a (rows, cols) tile of scores in
    [-30, 0] (what the online softmax feeds them): the fastest of ``rounds`` alternated calls each."""
    rng = np.random.default_rng(0)
    src = rng.uniform(-30, 0, size=(rows, cols)).astype(np.float32)     # (rows, cols)
    buf = np.empty_like(src)                                           # (rows, cols)
    best = {"exp": np.inf, "exp2": np.inf}
    for _ in range(rounds):
        for name, fn in (("exp", np.exp), ("exp2", np.exp2)):
            np.copyto(buf, src)
            t0 = time.perf_counter()
            fn(buf, out=buf)
            best[name] = min(best[name], time.perf_counter() - t0)
    return {name: 1e9 * t / src.size for name, t in best.items()}


@functools.cache
def numpy_exp() -> ExpChoice:
    """The faster of numpy's float32 exp and exp2 on this machine, measured once per process (~5 ms)."""
    ns = time_exps()
    name = "exp2" if ns["exp2"] < ns["exp"] else "exp"
    return ExpChoice(name=name, unit=LOG2E if name == "exp2" else 1.0, ns_per_element=ns)


def numba_disabled() -> bool:
    """True when ``ATTNLAB_NO_NUMBA`` is set to anything but "", "0" or "false" (read at every call)."""
    return os.environ.get(NO_NUMBA_ENV, "").strip().lower() not in ("", "0", "false", "no")


# What loading numba costs a fresh process, as the rent-or-buy rule counts it: importing numba, then loading
# the first kernel's machine code from numba's cache (its CPU target and LLVM's JIT are built then), measured
# 0.25-0.95 s and 0.3-0.95 s on the 2-core EPYC under varying load (benchmarks/first_call.py). An estimate,
# not a choice tuned to one machine: an error in it moves the switch earlier or later, never past twice the
# cost of the better choice.
NUMBA_LOAD_SECONDS = 0.5
FUSED_MODULE = __package__ + "._fused"


@dataclass
class Rent:
    """The numpy path's time on work the fused kernels would do, in this process, until numba loads."""
    seconds: float = 0.0
    scores: int = 0                 # how many attention scores that time covered (for the rate per score)

    def seconds_per_score(self) -> float:
        """The numpy path's measured time per score here; before any call, numpy's exponential (each score
        passes through one), a lower bound."""
        if self.scores:
            return self.seconds / self.scores
        return 1e-9 * min(numpy_exp().ns_per_element.values())


RENT = Rent()


@functools.cache
def fused_module():
    """:mod:`attnlab.kernels._fused` (imports numba, ~0.3 s the first time), or None when numba cannot be imported."""
    try:
        from . import _fused
    except ImportError:
        return None
    return _fused


@functools.cache
def numba_installed() -> bool:
    """Whether numba can be imported, without importing it (looked up once per process)."""
    return importlib.util.find_spec("numba") is not None


def fused_loaded() -> bool:
    """Whether the fused kernels are loaded in this process (by the rent-or-buy rule, :func:`load_fused`, or
    any code that imported :mod:`attnlab.kernels._fused`)."""
    return sys.modules.get(FUSED_MODULE) is not None


def load_fused():
    """Load the fused kernels now (numba's import; each kernel's machine code loads on its first call):
    the module, or None when numba cannot be imported."""
    return fused_module()


def pay_rent(kernel: str, seconds: float, scores: int) -> None:
    """Count a call's time on the numpy path toward loading numba (nothing once it is loaded, or without it)."""
    if kernel == "numpy" and not fused_loaded():
        RENT.seconds += seconds
        RENT.scores += scores


def numba_version() -> str | None:
    """numba's version when it can be imported, else None."""
    module = fused_module()
    return None if module is None else module.numba.__version__


def tile_kernel(scores: int = 0) -> str:
    """Which kernel a call of ``scores`` attention scores runs: ``"fused"`` (numba: shift, exponential and row
    sum in one pass) when numba is installed, not disabled, and loaded, or worth loading now by the
    rent-or-buy rule (the numpy path's time so far, plus this call's estimate, reaches NUMBA_LOAD_SECONDS);
    else ``"numpy"``."""
    if numba_disabled():
        return "numpy"
    if not fused_loaded():
        if not numba_installed():
            return "numpy"
        if RENT.seconds + scores * RENT.seconds_per_score() < NUMBA_LOAD_SECONDS:
            return "numpy"
        if load_fused() is None:
            return "numpy"
    return "fused"


def kernel_in_use() -> str:
    """The kernel calls run on now, loading nothing: "fused" when loaded (and not disabled), else "numpy"."""
    return "fused" if fused_loaded() and not numba_disabled() else "numpy"


def kernel_name(kernel: str) -> str:
    """A readable name of a tile kernel and the exponential it uses, as the bench and the debug log say it."""
    if kernel == "fused":
        return "fused (numba, polynomial exp2 in one pass with the shift and row sum)"
    return f"numpy ({numpy_exp().name}, measured faster here)"
