"""Which kernels run here: numpy's exponential for the tiles, and numpy or the numba fused kernel.

Same input, same answer: each choice is a rule, a pure function of what the call can see (its shapes, dtypes
and options, numpy's CPU features, the installed extras and the environment), never a time measured while
the program runs. ``attnlab tune`` measures the same choices on this machine in an explicit step and writes a
profile (:mod:`attnlab.kernels.profile`); with one present, the choices follow it.

- numpy's exponential (:func:`numpy_exp`, rule :func:`exp_rule`): ``exp2`` where numpy runs its AVX-512 loops,
  else ``exp``.
- The 8-bit kernels' instructions (:func:`vnni_rules`): ``vpdpbusd`` where the CPU numba compiles for
  (:func:`numba_target_features`) has VNNI, else AVX2's ``vpmaddwd``.
- The tile kernel (:func:`kernel_choice`, rule :func:`tile_kernel_rule`): the fused kernel
  (:mod:`attnlab.kernels._fused`, the optional extra ``attnlab[fast]``) from ``FUSED_MIN_SCORES`` scores per call,
  or per model pass (every layer's calls together, :func:`attnlab.kernels._step.one_step`) (masked calls;
  unmasked ones only without AVX-512 exp2), else numpy. A size rule, not a time: loading numba costs a fresh
  process 0.5-2 s and 110-150 MiB of resident memory (``benchmarks/first_call.py``), more than a short call's
  whole run, so calls below the threshold never load it.

Environment: ``ATTNLAB_NO_NUMBA=1`` makes every call take the numpy path as if numba were missing;
``ATTNLAB_KERNEL=fused`` (or ``numpy``) runs that kernel wherever it can take the call, whatever its size (the
tests cover both kernels so). :func:`load_fused` loads numba at once (``attnlab bench`` does); loading it
changes no choice.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import sys
from dataclasses import dataclass

import numpy as np

from . import _step, profile
from ._step import answers

NO_NUMBA_ENV = "ATTNLAB_NO_NUMBA"
KERNEL_ENV = "ATTNLAB_KERNEL"
LOG2E = 1 / math.log(2)          # a Python float: float32 arrays times it stay float32 (NEP 50), where
                                 # an np.float64 made numpy cast through 128 KiB buffers and compute in float64


@dataclass(frozen=True)
class ExpChoice:
    """numpy's exponential for the tiles: ``exp`` (natural base) or ``exp2`` (base 2, log₂e folded into the
    scale of q so no pass over the tile pays for it), and why."""
    name: str                     # "exp" or "exp2"
    unit: float                   # scores are multiplied by this: 1 for exp, log₂e for exp2
    reason: str                   # the rule, or the tune profile, that chose it

    @property
    def fn(self):
        return np.exp2 if self.name == "exp2" else np.exp

    @property
    def log(self):
        return np.log2 if self.name == "exp2" else np.log


def exp_rule(features) -> tuple[str, str]:
    """The rule for numpy's exponential, from numpy's CPU features: ``exp2`` when numpy runs its AVX-512
    (Skylake-X) loops here, where its float32 exp2 is vectorised and the faster (Xeon with AVX-512, in place on a
    256 × 512 tile: 0.38-0.45 against 0.64-1.05 ns per element); else ``exp`` (without them exp2 runs at half
    exp's speed: 2.53 against 1.26 ns on an AVX2-only EPYC)."""
    if "AVX512_SKX" in features:
        return "exp2", "rule: numpy's AVX-512 loops vectorise float32 exp2 here"
    return "exp", "rule: numpy has no AVX-512 exp2 loop here, exp is the vectorised one"


def numba_target_features(configured: str | None, host) -> dict[str, bool]:
    """The CPU features numba compiles for, as it hands them to LLVM: ``configured`` (numba's
    ``config.CPU_FEATURES``, from ``NUMBA_CPU_FEATURES``) when set, else ``host()`` (this CPU's, as LLVM reports
    them: numba's ``codegen.get_host_cpu_features``), each a string "+avx2,-avx512f,...": {"avx2": True, ...}.

    What the kernels' CPU-feature rules read (:func:`vnni_rules`), never /proc/cpuinfo nor LLVM's host features
    directly: a cache compiled for a target (``NUMBA_CPU_NAME=haswell`` with Haswell's features, as the AVX2
    emulation does, ``benchmarks/avx2_emulated.py``) then holds the code of that target's branch. Features a
    named ``NUMBA_CPU_NAME`` implies without listing them count as absent: the rules then take their plain
    branch, which every CPU runs."""
    text = configured if configured is not None else host()
    return {name[1:].strip(): name.startswith("+") for name in text.split(",") if name[:1] in "+-" and len(name) > 1}


@functools.cache
def numba_features() -> dict[str, bool]:
    """:func:`numba_target_features` of this process's numba (imports numba): what every rule on the CPU's
    features that shapes numba code reads (``features.get("avx2")``, :func:`vnni_rules`), so the code a cache
    holds is the code of the target it was compiled for."""
    import numba
    from numba.core.codegen import get_host_cpu_features

    return numba_target_features(numba.config.CPU_FEATURES, get_host_cpu_features)


def vnni_rules(features: dict[str, bool]) -> tuple[bool, bool]:
    """Whether the 8-bit kernels (:mod:`attnlab.kernels._q8_fused`) call ``vpdpbusd``, and whether on 512-bit
    registers, from the features numba compiles for (:func:`numba_target_features`): 256-bit ``vpdpbusd``
    with AVX-VNNI or with AVX-512 VNNI and VL, 512-bit with AVX-512 VNNI; else plain vector IR, which LLVM
    lowers to ``vpmaddwd`` and ``vphaddd`` (AVX2). A rule on the target's features, never a timing."""
    vnni = bool(features.get("avxvnni") or (features.get("avx512vnni") and features.get("avx512vl")))
    return vnni, vnni and bool(features.get("avx512vnni"))


def numpy_exp() -> ExpChoice:
    """numpy's exponential for the tiles: the tune profile's ``exp`` when one applies, else :func:`exp_rule`."""
    return _exp_choice(profile.choice("exp"))


@functools.cache
def _exp_choice(tuned: str | None) -> ExpChoice:
    name, reason = (tuned, "tune profile") if tuned in ("exp", "exp2") else exp_rule(profile.cpu_features())
    return ExpChoice(name=name, unit=LOG2E if name == "exp2" else 1.0, reason=reason)


def numba_disabled() -> bool:
    """True when ``ATTNLAB_NO_NUMBA`` is set to anything but "", "0" or "false" (read at every call)."""
    return os.environ.get(NO_NUMBA_ENV, "").strip().lower() not in ("", "0", "false", "no")


def forced_kernel() -> str | None:
    """``ATTNLAB_KERNEL`` ("fused" or "numpy"; read at every call): every call that the kernel can take runs
    it, whatever its size (the tests' way to cover both kernels); None when unset or empty."""
    value = os.environ.get(KERNEL_ENV, "").strip().lower()
    if value in ("", "auto"):
        return None
    if value not in ("fused", "numpy"):
        raise ValueError(f"{KERNEL_ENV} must be 'fused', 'numpy' or unset, got {value!r}")
    return value


# The size rule of the fused kernels: a call runs them when it computes at least this many scores (batch ·
# heads · n_q · n_k). Loading numba costs a fresh process 0.5-2 s and 110-150 MiB of resident memory
# (benchmarks/first_call.py), and the fused kernels save at most ~35% of a call's time (causal, n = 256; 12% at
# n = 1024, 7% at 2048, one worker, Xeon with AVX-512). 2^24 keeps a fresh process's 12-head, 1024-token call
# (12.6 M scores: the first-call memory goal) on numpy, and takes 12 heads from about 1,200 tokens to the
# fused kernels. Below it calls never pay for numba; ``attnlab tune`` measures where the fused kernels win
# once loaded and may lower it for this machine.
FUSED_MIN_SCORES = 2**24
FUSED_MODULE = __package__ + "._fused"


@functools.cache
def fused_module():
    """:mod:`attnlab.kernels._fused`'s kernels (imports numba, ~0.3 s the first time; each kernel loaded from numba's
    cache at its first call, :class:`attnlab.kernels._numba_load.FromCache`), or None when numba cannot be
    imported."""
    try:
        from . import _fused
        from ._numba_load import FromCache
    except ImportError:
        return None
    return FromCache(_fused)


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


def numba_version() -> str | None:
    """numba's version when it can be imported, else None."""
    module = fused_module()
    return None if module is None else module.numba.__version__


def tile_kernel_rule(scores: int, *, masked: bool, exp_name: str, tuned_min: dict | None = None,
                     pass_scores: int = 0) -> tuple[str, str]:
    """The rule for the tile kernel of a call of ``scores`` scores, inside a model's pass of ``pass_scores``
    scores (every layer's calls; 0 outside one), given numba is installed and enabled: ``("fused" | "numpy",
    why)``, a pure function of its arguments.

    - With a tune profile's thresholds (``tuned_min``: the smallest scores from which the fused kernel won, for
      ``"masked"`` and ``"full"`` calls, None where it never did): those.
    - Else fused from ``FUSED_MIN_SCORES``, for masked calls (causal, windowed, a mask: the numpy path pays
      separate passes for the mask, the fused kernel none: 0.66-0.93x numpy's time at n = 256-2048), and for
      unmasked calls only where numpy's exponential is ``exp`` (no AVX-512 exp2: the numpy path's exponential
      is its slow pass). With exp2 on AVX-512 the numpy path ran unmasked tiles 3-6% faster than the fused
      kernel (n = 64-2048, 12 heads, one worker, Xeon), so they stay on numpy.
    - A call inside a model's pass counts the pass's scores for the threshold: numba loads once for all its
      layers (SmolLM2's 512-token prefill: 30 calls of 2.4 M scores, 71 M together; the fused kernel took
      0.85x (one thread) and 0.78x (two) numpy's process time on such a call, medians of 9 alternating rounds, Xeon
      with AVX-512, loaded machine).
    """
    kind = "masked" if masked else "full"
    if tuned_min is not None:
        threshold = tuned_min.get(kind)
        if threshold is None:
            return "numpy", f"tune profile: numpy ran {kind} calls faster at every size measured"
        if scores >= threshold:
            return "fused", f"tune profile: fused from {threshold:,} scores for {kind} calls"
        return "numpy", f"tune profile: numpy below {threshold:,} scores for {kind} calls"
    if not masked and exp_name == "exp2":
        return "numpy", "rule: an unmasked call runs numpy's AVX-512 exp2 faster than the fused kernel"
    if scores >= FUSED_MIN_SCORES:
        return "fused", f"rule: {scores:,} scores >= FUSED_MIN_SCORES ({FUSED_MIN_SCORES:,})"
    if pass_scores >= FUSED_MIN_SCORES:
        return "fused", (f"rule: the model's pass computes {pass_scores:,} scores >= FUSED_MIN_SCORES "
                         f"({FUSED_MIN_SCORES:,}): numba loads once for all its layers")
    return "numpy", f"rule: {scores:,} scores < FUSED_MIN_SCORES ({FUSED_MIN_SCORES:,}): numba is not worth loading"


def numpy_unless_numba() -> tuple[str, str] | None:
    """``("numpy", why)`` when no numba kernel may run here: ``ATTNLAB_NO_NUMBA`` set, ``ATTNLAB_KERNEL=numpy``, or
    numba not installed (an error if ``ATTNLAB_KERNEL=fused`` asks for it then); else None, and a rule decides."""
    if numba_disabled():
        return "numpy", f"{NO_NUMBA_ENV} is set"
    forced = forced_kernel()
    if forced == "numpy":
        return "numpy", f"{KERNEL_ENV}=numpy"
    if not numba_installed():
        if forced == "fused":
            raise ValueError(f"{KERNEL_ENV}=fused needs numba (pip install 'attnlab[fast]'), which is not installed")
        return "numpy", "numba is not installed"
    return None


def kernel_choice(scores: int = 0, *, masked: bool = True) -> tuple[str, str]:
    """Which tile kernel a call of ``scores`` attention scores runs, and why: ``ATTNLAB_NO_NUMBA`` or a missing
    numba keep numpy; ``ATTNLAB_KERNEL`` forces one; else :func:`tile_kernel_rule` with the tune profile's
    thresholds when one applies. Loads numba when the answer is "fused"."""
    kept = numpy_unless_numba()
    if kept is not None:
        return kept
    forced = forced_kernel()
    if forced == "fused":
        kernel, reason = "fused", f"{KERNEL_ENV}=fused"
    else:
        kernel, reason = tile_kernel_rule(scores, masked=masked, exp_name=numpy_exp().name,
                                          tuned_min=profile.choice("fused_min_scores"),
                                          pass_scores=_step.pass_scores())
    if kernel == "fused" and load_fused() is None:
        return "numpy", "numba failed to import"
    return kernel, reason


STEP_MODULE = __package__ + "._step_fused"


def step_kernel_choice() -> tuple[str, str]:
    """Which kernels a one-token pass runs between its products (RMSNorm, RoPE with the cache append, the
    residual adds, silu(gate) · up), and so RMSNorm and silu(gate) · up on any float32 rows (a token's bits the
    same alone or among others): ``"fused"`` (:mod:`attnlab.kernels._step_fused`, numba) or ``"numpy"``,
    and why. ``ATTNLAB_NO_NUMBA`` or a missing numba keep numpy; ``ATTNLAB_KERNEL`` forces one; else the rule:
    fused. A one-token pass is a decode step, and generation runs one per token: numba's load (0.5-2 s and
    ~110 MiB, once per process) is repaid by the ~29 numpy calls a layer it saves on every token (60-70 µs a
    layer; SmolLM2's 30 layers: about 2 ms a token), where the size rule of the attention kernels
    (``FUSED_MIN_SCORES``) is for calls made once. float32 rows only (the callers check)."""
    kept = numpy_unless_numba()
    if kept is not None:
        return kept
    forced = forced_kernel()
    if step_module() is None:
        return "numpy", "numba failed to import"
    return "fused", f"{KERNEL_ENV}=fused" if forced == "fused" else "rule: a one-token pass is a decode step"


@functools.cache
def step_module():
    """:mod:`attnlab.kernels._step_fused`'s kernels (imports numba; each loaded from numba's cache at its first
    call, :class:`attnlab.kernels._numba_load.FromCache`), or None when numba cannot be imported."""
    try:
        from . import _step_fused
        from ._numba_load import FromCache
    except ImportError:
        return None
    return FromCache(_step_fused)                               # its kernels loaded from numba's cache, no set-up


def step_kernels():
    """The fused one-token kernels (:mod:`attnlab.kernels._step_fused`) when :func:`step_kernel_choice` says
    "fused", else None; inside a model's pass (:func:`attnlab.kernels._step.one_step`) asked once per step."""
    step = answers()
    if step is not None and "step kernels" in step:
        return step["step kernels"]
    got = step_module() if step_kernel_choice()[0] == "fused" else None
    if step is not None:
        step["step kernels"] = got
    return got


def tile_kernel(scores: int = 0, *, masked: bool = True) -> str:
    """:func:`kernel_choice`'s kernel: ``"fused"`` (numba: shift, exponential and row sum in one pass) or
    ``"numpy"``."""
    return kernel_choice(scores, masked=masked)[0]


def kernel_in_use() -> str:
    """Whether the fused kernels are loaded in this process (and not disabled): "fused", else "numpy"."""
    return "fused" if fused_loaded() and not numba_disabled() else "numpy"


def kernel_name(kernel: str) -> str:
    """A readable name of a tile kernel and the exponential it uses, as the bench and the debug log say it."""
    if kernel == "fused":
        return "fused (numba, polynomial exp2 in one pass with the shift and row sum)"
    return f"numpy ({numpy_exp().name})"
