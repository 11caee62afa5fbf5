"""The tune profile: what ``attnlab tune`` measured on this machine, and where it lies.

Without a profile every kernel choice follows a documented rule (:mod:`attnlab.kernels._kernels`,
:mod:`attnlab.kernels.decode`, :mod:`attnlab.kernels.matmul`, :mod:`attnlab.kernels.quantized`): a pure function
of the call's shapes, dtypes and options, the CPU's features, the installed extras and the environment. The
library never measures a time to choose. ``attnlab tune`` measures the same choices in an explicit step and
writes them here; with a profile present, the choices follow it, deterministically (FFTW's "wisdom").

Where: ``$ATTNLAB_TUNE_FILE`` when set; else ``$XDG_CACHE_HOME/attnlab/tune.json``; else
``~/.cache/attnlab/tune.json``. A profile written on another machine (CPU model, SIMD level), with another
numpy, numba or attnlab is ignored: :func:`status` says why.

A profile is read once per process and path (the file's choices then hold for the process's life; writing a
new one with ``attnlab tune`` takes effect in the next process, or after :func:`forget`).
"""

from __future__ import annotations

import functools
import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TUNE_FILE_ENV = "ATTNLAB_TUNE_FILE"
FORMAT = 1                       # the profile's layout; a file of another format is ignored


def profile_path() -> Path:
    """Where the profile lies: ``$ATTNLAB_TUNE_FILE``, else ``$XDG_CACHE_HOME/attnlab/tune.json``, else
    ``~/.cache/attnlab/tune.json`` (read at every call, so a test's environment takes effect at once)."""
    given = os.environ.get(TUNE_FILE_ENV)
    if given:
        return Path(given)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "attnlab" / "tune.json"


@functools.cache
def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, else what platform says)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


@functools.cache
def cpu_features() -> frozenset:
    """The SIMD features numpy found on this CPU and may dispatch to (its ``__cpu_features__`` that are on,
    and in its baseline or dispatch lists, or reported by it): e.g. {"AVX2", "AVX512_SKX", ...}."""
    try:
        from numpy._core import _multiarray_umath as umath          # numpy >= 2
    except ImportError:                                              # pragma: no cover - numpy 1.x
        from numpy.core import _multiarray_umath as umath
    return frozenset(name for name, on in getattr(umath, "__cpu_features__", {}).items() if on)


# numpy's names of SIMD levels, best first, and what the profile calls them
SIMD_LEVELS = (("AVX512_SKX", "AVX-512"), ("AVX2", "AVX2"), ("AVX", "AVX"), ("SSE42", "SSE4.2"),
               ("SVE", "SVE"), ("ASIMD", "NEON"), ("VSX", "VSX"))


def simd_level(features=None) -> str:
    """The best SIMD level among numpy's CPU features ("AVX-512", "AVX2", ..., "none")."""
    features = cpu_features() if features is None else features
    return next((name for flag, name in SIMD_LEVELS if flag in features), "none")


@functools.cache
def attnlab_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("attnlab")
    except PackageNotFoundError:                                     # pragma: no cover - run from a checkout
        return "unknown"


@functools.cache
def numba_version() -> str | None:
    """numba's installed version (from its metadata: numba is not imported), or None."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("numba")
    except PackageNotFoundError:
        return None


def identity() -> dict:
    """What a profile must match to apply: the machine and the installed versions."""
    return {"cpu": cpu_model(), "simd": simd_level(), "numpy": np.__version__, "numba": numba_version(),
            "attnlab": attnlab_version()}


@dataclass(frozen=True)
class Status:
    """What the library does with the profile at ``path``: ``profile`` (its choices) when it applies, else
    None and ``reason`` (no file, unreadable, another machine or version)."""
    path: Path
    profile: dict | None
    reason: str


@functools.cache
def _read(path: str) -> Status:
    p = Path(path)
    if not p.is_file():
        return Status(p, None, f"no profile at {p} (run `attnlab tune`)")
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        return Status(p, None, f"profile {p} is unreadable ({type(e).__name__}: {e}); ignored")
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("choices"), dict):
        return Status(p, None, f"profile {p} is not a format-{FORMAT} tune profile; ignored")
    here, there = identity(), data.get("identity", {})
    differ = [f"{k} {there.get(k)!r} (here {v!r})" for k, v in here.items() if there.get(k) != v]
    if differ:
        return Status(p, None, f"profile {p} was measured with another " + ", ".join(differ) + "; ignored")
    return Status(p, data, f"profile {p} (attnlab tune, {data.get('written', 'at an unknown time')})")


def status() -> Status:
    """The profile at :func:`profile_path` and whether it applies (read once per process and path)."""
    return _status(os.environ.get(TUNE_FILE_ENV), os.environ.get("XDG_CACHE_HOME"))


@functools.cache
def _status(tune_file, xdg) -> Status:
    """:func:`status` for these values of the environment (a choice on a decode step's path pays two lookups)."""
    return _read(str(profile_path()))


def choices() -> dict | None:
    """The profile's choices when one applies here, else None."""
    data = status().profile
    return None if data is None else data["choices"]


def choice(name: str):
    """One of the profile's choices (``None`` when no profile applies or it has no such entry)."""
    data = _status(os.environ.get(TUNE_FILE_ENV), os.environ.get("XDG_CACHE_HOME")).profile   # status(), inlined:
    return None if data is None else data["choices"].get(name)                                # a decode step's path


def forget() -> None:
    """Read the profile again at the next choice (after ``attnlab tune`` wrote or removed it)."""
    _read.cache_clear()
    _status.cache_clear()


def write(profile_choices: dict, measured: dict, path: Path | None = None) -> Path:
    """Write a profile of ``profile_choices`` (what the choices follow) and ``measured`` (the figures behind
    them) for this machine, atomically (a temporary file beside it, then renamed); returns its path."""
    import datetime

    from .._io import atomic_path

    path = profile_path() if path is None else Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"format": FORMAT, "identity": identity(),
            "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "choices": profile_choices, "measured": measured}
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    forget()
    return path


def remove(path: Path | None = None) -> bool:
    """Remove the profile; True when there was one."""
    path = profile_path() if path is None else Path(path)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    finally:
        forget()
    return True
