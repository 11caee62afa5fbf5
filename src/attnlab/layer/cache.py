"""The KV cache: keys and values of earlier tokens, kept so each new token is one decode step.

During generation the keys and values of earlier tokens don't change, so they are stored once in a
preallocated buffer and reused; each step appends the new token's k and v and attends its query against
everything so far (bottom-right causal alignment). With grouped-query attention the cache holds only the
n_kv_heads key/value heads: n_heads / n_kv_heads times less memory than one per query head.

A float32 model's cache may hold float16, as llama.cpp keeps its own (``type_k`` and ``type_v`` F16 by default):
half the bytes a decode step reads at a long context. Each float32 key and value is rounded to the nearest
float16 (ties to even, as numpy's and F16C's ``vcvtps2ph`` round) when it is appended, and the decode step
computes against it as llama.cpp does against its own (:mod:`attnlab.kernels.decode`: q and the weights
rounded to float16 too, each key and value widened to float32 as it is loaded). Which a layer gets is a rule,
:func:`kv_dtype_rule`: float16 where the layer computes as llama.cpp does (the ``q8-activations`` mode), its
own float dtype elsewhere, so the exact modes keep their bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels._checks import as_float_array, as_positive_int
from ..kernels.q8_activations import Q8ActivationMatrix

HALF_MAX = 65504.0       # float16's largest finite value
HALF_INF = 65520.0       # float32 magnitudes from here on round to float16's inf


def kv_dtype_rule(W_K) -> tuple[np.dtype, str]:
    """The dtype of a layer's cache by default, and why: float16 when its key projection ``W_K`` computes as
    llama.cpp does (a :class:`~attnlab.kernels.q8_activations.Q8ActivationMatrix`: the mode that imitates
    llama.cpp, whose cache is float16), else the layer's compute dtype (at least float32: the exact modes keep
    float32 and their bits). A rule on the weights' kind, never a measurement."""
    if isinstance(W_K, Q8ActivationMatrix):
        return np.dtype(np.float16), "rule: 8-bit activations imitate llama.cpp, whose KV cache is float16"
    return np.result_type(W_K, np.float32), "rule: the layer's compute dtype (exact)"


def check_kv_dtype(kv_dtype, compute: np.dtype) -> np.dtype:
    """``kv_dtype`` as a cache dtype for a layer that computes in ``compute``: the compute dtype itself, or
    float16 under float32 (the cache rounds on append); TypeError for anything else, naming both."""
    try:
        dt = np.dtype(kv_dtype)
    except TypeError:
        raise TypeError(f"kv_dtype must be a float dtype (float16 or {compute}), got {kv_dtype!r}") from None
    allowed = (compute, np.dtype(np.float16)) if compute == np.float32 else (compute,)
    if dt not in allowed:
        raise TypeError(f"kv_dtype must be {' or '.join(map(str, allowed))} for a layer that computes in {compute}, "
                        f"got {dt}")
    return dt


@dataclass(eq=False)
class KVCache:
    """One layer's cache: ``k`` and ``v`` buffers of shape (..., n_kv_heads, capacity, d_head).

    Only the first ``length`` positions hold data. ``append`` either writes all the new tokens or,
    on any error, leaves the cache exactly as it was. A float16 cache takes float32 keys and values too,
    rounded to float16 as they are written.
    """
    k: np.ndarray      # (..., h_kv, capacity, d_head)
    v: np.ndarray      # (..., h_kv, capacity, d_head)
    length: int = 0
    k_max: float = 0.0  # the largest |key| and |value| appended since the last reset: a decode step bounds its
    v_max: float = 0.0  # scores with them (attnlab.kernels._checks.surely_fits) instead of scanning the cache

    @classmethod
    def empty(cls, n_kv_heads: int, capacity: int, d_head: int, *, batch_shape: tuple = (),
              dtype=np.float32) -> "KVCache":
        """A cache with room for ``capacity`` tokens, allocated once.

        Parameters
        ----------
        n_kv_heads, capacity, d_head : int
            The buffers are (*batch_shape, n_kv_heads, capacity, d_head): the key/value heads only (with
            grouped-query attention, fewer than the query heads; attention reads each once per group).
        batch_shape : tuple of int
            Leading axes, as those of the keys and values that will be appended.
        dtype : float16, float32 or float64
            What the buffers hold; ``append`` refuses any other dtype (a float16 cache takes float32 as well,
            rounding it).

        Raises
        ------
        ValueError, TypeError
            For a size that is not a positive int, or another dtype.
        """
        n_kv_heads, capacity, d_head = (as_positive_int(name, v) for name, v in
                                        (("n_kv_heads", n_kv_heads), ("capacity", capacity), ("d_head", d_head)))
        if np.dtype(dtype) not in (np.float16, np.float32, np.float64):
            raise TypeError(f"dtype must be float16, float32 or float64, got {np.dtype(dtype)}")
        shape = (*batch_shape, n_kv_heads, capacity, d_head)
        return cls(k=np.zeros(shape, dtype), v=np.zeros(shape, dtype))

    @property
    def capacity(self) -> int:
        return self.k.shape[-2]

    @property
    def keys(self) -> np.ndarray:
        return self.k[..., :self.length, :]      # (..., h_kv, length, d_head) a view, no copy

    @property
    def values(self) -> np.ndarray:
        return self.v[..., :self.length, :]      # (..., h_kv, length, d_head)

    def append(self, key, value) -> tuple[np.ndarray, np.ndarray]:
        """Write ``key`` and ``value`` (..., n_kv_heads, t, d_head) after the cached tokens.

        Returns the keys and values of all tokens so far, as views (..., n_kv_heads, length, d_head).
        Raises, with the cache unchanged, when the shapes or dtype do not match, a value is not finite (in a
        float16 cache: beyond float16's range, ±65504, where rounding would make it infinite), or there is no
        room. So the cache only ever holds finite values, and a decode step need not scan it again
        (``attention(..., check_finite=False)``): that scan would cost as much as the step.
        """
        key = as_float_array("key", key, min_ndim=2)
        value = as_float_array("value", value, min_ndim=2)
        expected = (*self.k.shape[:-2], "t", self.k.shape[-1])
        largest = {}
        half = self.k.dtype == np.float16
        for name, new in (("key", key), ("value", value)):
            if new.dtype != self.k.dtype and not (half and new.dtype == np.float32):
                takes = "float16 or float32 (rounded to float16)" if half else str(self.k.dtype)
                raise TypeError(f"{name} has dtype {new.dtype}, the cache holds {self.k.dtype} and takes {takes}")
            if new.shape[:-2] != self.k.shape[:-2] or new.shape[-1] != self.k.shape[-1]:
                raise ValueError(f"{name} has shape {new.shape}, the cache expects {expected} "
                                 f"(width {self.k.shape[-1]})")
            top = float(np.maximum.reduce(np.abs(new), axis=None)) if new.size else 0.0   # NaN propagates
            if not top < np.inf:
                raise ValueError(f"{name} must be finite to enter the cache, got NaN or inf")
            if half and top >= HALF_INF:                           # rounds to inf: beyond float16's range
                raise ValueError(f"{name} holds {top:.6g}, beyond the float16 cache's range (±{HALF_MAX:.0f}); "
                                 "scale it down or keep a float32 cache (kv_dtype=np.float32)")
            largest[name] = float(np.float16(top)) if half else top   # rounding is monotone: the largest rounded
        if key.shape[-2] != value.shape[-2]:
            raise ValueError(f"key has {key.shape[-2]} tokens, value has {value.shape[-2]}; they must match")
        t = key.shape[-2]
        if self.length + t > self.capacity:
            raise ValueError(f"cannot append {t} tokens: the cache holds {self.length} of its capacity "
                             f"{self.capacity}")
        self.k[..., self.length:self.length + t, :] = key      # (..., h_kv, t, d_head) rounded to float16 there
        self.v[..., self.length:self.length + t, :] = value    # (..., h_kv, t, d_head)
        self.length += t
        self.k_max = largest["key"] if largest["key"] > self.k_max else self.k_max
        self.v_max = largest["value"] if largest["value"] > self.v_max else self.v_max
        return self.keys, self.values

    def count_written(self, t: int, key_max: float, value_max: float) -> None:
        """Count ``t`` tokens written straight into the buffers at positions [length, length + t) by a fused
        decode step (:func:`attnlab.kernels._step_fused.qkv_rope_append`), with their largest |key| and |value|:
        what :meth:`append` does after its checks. The writer makes those checks itself first (the buffers'
        dtype, room, finite values) and writes nothing when one fails, so a failed step leaves the cache as it
        was."""
        self.length += t
        self.k_max = key_max if key_max > self.k_max else self.k_max
        self.v_max = value_max if value_max > self.v_max else self.v_max

    def make_room(self, t: int) -> bool:
        """Whether ``t`` more tokens fit. A plain cache keeps every token, so it only answers; a cache with a
        policy for what to drop (:class:`attnlab.layer.streaming.StreamingCache`) drops it and says True."""
        return self.length + as_positive_int("t", t) <= self.capacity

    def reset(self) -> None:
        """Forget every cached token (the buffers are kept)."""
        self.length, self.k_max, self.v_max = 0, 0.0, 0.0
