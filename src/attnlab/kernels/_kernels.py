"""Which kernels run on this machine: numpy's exponential for the tiles, and the numba fused kernel.

numpy's float32 ``exp2`` is vectorised only with AVX-512 builds of its SIMD loops; without them it runs at
half the speed of ``exp`` (measured on an AVX2-only EPYC: 2.53 against 1.26 ns per element), with them it
can be the faster one. No constant measured on one machine decides it: :func:`numpy_exp` times both on a
tile-sized array once per process, on the machine it runs on, and the tiled kernel uses the winner.

The fused kernel (:mod:`attnlab.kernels._fused`, the optional extra ``attnlab[fast]``) needs numba; setting the
environment variable ``ATTNLAB_NO_NUMBA=1`` makes every call take the numpy path as if numba were missing.
"""

from __future__ import annotations

import functools
import math
import os
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


@functools.cache
def fused_module():
    """:mod:`attnlab.kernels._fused` (imports numba, ~0.3 s the first time), or None when numba cannot be imported."""
    try:
        from . import _fused
    except ImportError:
        return None
    return _fused


def numba_version() -> str | None:
    """numba's version when it can be imported, else None."""
    module = fused_module()
    return None if module is None else module.numba.__version__


def tile_kernel() -> str:
    """Which per-tile kernel the tiled path runs: ``"fused"`` (numba: shift, exponential and row sum in one
    pass) when numba is installed and not disabled, else ``"numpy"``."""
    if numba_disabled() or fused_module() is None:
        return "numpy"
    return "fused"


def kernel_name(kernel: str) -> str:
    """A readable name of a tile kernel and the exponential it uses, as the bench and the debug log say it."""
    if kernel == "fused":
        return "fused (numba, polynomial exp2 in one pass with the shift and row sum)"
    return f"numpy ({numpy_exp().name}, measured faster here)"
