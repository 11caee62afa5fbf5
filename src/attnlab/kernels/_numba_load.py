"""numba's cached kernels, loaded without setting up its compiler (the quantized products' first call).

The kernels are compiled with ``cache=True``: the first process compiles them into ``__pycache__``, every later
one loads the machine code from there. But a dispatcher's first call in a process sets up numba's whole compiler
before it looks in the cache (``target_context.refresh()``: the typing and lowering registries of every numba
module, about 90 modules imported), and loading compiled code uses none of it. On SmolLM2's ``generate
--quantized --tokens 1`` that set-up was 0.28–0.32 s of 1.47 s of process time (Xeon, AVX-512, loaded; the
loading itself, with numba's runtime started, 0.1 s).

:func:`call` runs a kernel; the first time a kernel is called in a process it first loads the kernel compiled
for these arguments' types straight from numba's cache, numba's runtime (NRT: the kernels allocate) started,
under numba's compiler lock, as numba's dispatcher does minus the set-up. Anything else takes numba's own way,
which sets up, loads or compiles as before: no cached kernel for these types (the first run, an edited
source), a kernel that is not a cached dispatcher, or a numba whose internals differ (any error here). The
machine code is the cache's either way: the same results, bit for bit (tests/test_numba_load.py).
"""

from __future__ import annotations

_tried: set = set()           # the dispatchers whose first call has been made in this process


def call(kernel, *args):
    """``kernel(*args)``; the first call of ``kernel`` loads it from numba's cache first (:func:`from_cache`)."""
    if kernel not in _tried:
        _tried.add(kernel)
        from_cache(kernel, args)
    return kernel(*args)


def from_cache(kernel, args) -> bool:
    """Load the numba dispatcher ``kernel`` compiled for the types of ``args`` from its cache, without numba's
    compiler set-up; whether it is there now (False: numba's own way will load or compile it at the call)."""
    try:
        from numba.core.compiler_lock import global_compiler_lock
        from numba.core.runtime import rtsys

        sig = tuple(kernel.typeof_pyval(a) for a in args)
        if sig in kernel.overloads:
            return True
        ctx = kernel.targetctx
        with global_compiler_lock:
            rtsys.initialize(ctx)                               # numba's runtime, as the set-up would start it
            cres = kernel._cache._load_overload(sig, ctx)       # the cache's compiled kernel, or None
            if cres is None or cres.objectmode:
                return False
            ctx.insert_user_function(cres.entry_point, cres.fndesc, [cres.library])
            kernel.add_overload(cres)
        return True
    except Exception:         # a numba whose internals differ, a cache that cannot be read: numba's own way
        return False


class FromCache:
    """A module's numba kernels as attributes, each loaded from numba's cache at its first call (:func:`call`) and
    the kernel itself from then on: ``FromCache(_step_fused).rms_norm_rows(...)``."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        kernel = getattr(self._module, name)
        if not hasattr(kernel, "overloads"):                    # not a numba dispatcher: as it is
            return kernel

        def first(*args):
            setattr(self, name, kernel)                         # later lookups find the kernel itself
            return call(kernel, *args)
        setattr(self, name, first)
        return first
