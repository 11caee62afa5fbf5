"""The objects a forward pass calls at each named activation (see :mod:`attnlab.stack.hooks` for the names).

Every piece of a forward pass (a norm, an MLP, an attention layer, a block) takes a ``hook`` and calls
``hook(name, array)`` at each of its points, going on with what comes back; ``hook.wants(name)`` says
whether anyone listens there (so a costly extra, the (n, n_k) grid or each head's result, is built only
when asked), and ``hook.scoped(prefix)`` is the view a sub-piece gets ("blocks.0." + "attn." + "hook_q").
:data:`NO_HOOKS` listens nowhere: a pass without hooks pays one function call per point.
"""

from __future__ import annotations

import difflib

import numpy as np


class NoHooks:
    """Listens nowhere: every array goes on unchanged."""

    def wants(self, name: str) -> bool:
        return False

    def __call__(self, name: str, x: np.ndarray) -> np.ndarray:
        return x

    def scoped(self, prefix: str) -> "NoHooks":
        return self


NO_HOOKS = NoHooks()


class Hooks:
    """Functions by name, for one forward pass: ``hooks(name, array)`` returns the array to go on with.

    Each function is called as ``fn(array, name)`` and returns a replacement of the same shape, or None to
    leave the array as it is. ``known`` lists the names the model has; any other name is refused, with the
    nearest known ones.
    """

    def __init__(self, known: list[str], fns: dict):
        if not isinstance(fns, dict):
            raise TypeError(f"hooks must be a dict of name -> function, got {type(fns).__name__}")
        for name, fn in fns.items():
            if name not in known:
                near = difflib.get_close_matches(str(name), known, n=3)
                hint = f"; did you mean {near}?" if near else f"; see hook_names(model), e.g. {known[:3]}"
                raise ValueError(f"hooks has no activation named {name!r}{hint}")
            if not callable(fn):
                raise TypeError(f"hooks[{name!r}] must be a function fn(array, name), got {type(fn).__name__}")
        self.fns = fns

    def wants(self, name: str) -> bool:
        return name in self.fns

    def __call__(self, name: str, x: np.ndarray) -> np.ndarray:
        fn = self.fns.get(name)
        if fn is None:
            return x
        out = fn(x, name)
        if out is None:
            return x
        out = np.asarray(out)
        if out.shape != x.shape:
            raise ValueError(f"the hook on {name!r} returned shape {out.shape}; it must keep the shape {x.shape}")
        return out

    def scoped(self, prefix: str) -> "Scoped":
        return Scoped(self, prefix)


class Scoped:
    """The hooks of one piece (a block, its attention, a norm): short names, the prefix added."""

    def __init__(self, hooks: Hooks, prefix: str):
        self.hooks, self.prefix = hooks, prefix

    def wants(self, name: str) -> bool:
        return self.hooks.wants(self.prefix + name)

    def __call__(self, name: str, x: np.ndarray) -> np.ndarray:
        return self.hooks(self.prefix + name, x)

    def scoped(self, prefix: str) -> "Scoped":
        return Scoped(self.hooks, self.prefix + prefix)


class KeepPattern:
    """Passes everything through ``inner`` and keeps the attention pattern the pass goes on with: how the
    weights are returned (one mechanism, the ``hook_pattern`` point)."""

    def __init__(self, inner=NO_HOOKS):
        self.inner, self.pattern = inner, None

    def wants(self, name: str) -> bool:
        return name == "hook_pattern" or self.inner.wants(name)

    def __call__(self, name: str, x: np.ndarray) -> np.ndarray:
        x = self.inner(name, x)
        if name == "hook_pattern":
            self.pattern = x
        return x

    def scoped(self, prefix: str):
        return self.inner.scoped(prefix)
