"""The pieces of a transformer block besides attention: layer norm and RMSNorm, GELU and SiLU, the MLP
and its gated (SwiGLU) form, each with its backward beside its forward.

Each is a pure function; the small dataclasses only hold parameters, as MultiHeadAttention does. As in
llm.c, every piece comes as a pair, and has one forward: ``piece(x, hook, tape)`` runs for inference, hooks
and training alike; given a tape (:class:`attnlab.layer.tape.Tape`) it keeps exactly what
``piece.backward(saved, dy) -> (dx, grads)`` needs, and without one it keeps nothing. Each backward line
names the forward line it undoes; ``grads`` is a dict by the names of ``piece.params()``.
``piece.forward(x) -> (y, saved)`` is the call with a tape of its own.
:data:`NORMS` maps a norm's name to its class and :data:`MLPS` an MLP's name to its class (what
:class:`attnlab.stack.transformer.ModelConfig` names). Each class lists its parameter names in ``PARAMS``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..kernels._kernels import step_kernels
from ..kernels.matmul import fuse_columns, linear, streamed
from ..layer.hookpoints import NO_HOOKS
from ..layer.tape import Tape

# erfc(z) for z >= 0 as t·exp(-z² + P(t)), t = 1/(1 + z/2): Numerical Recipes' Chebyshev fit (Press et al.,
# 2007, §6.2), relative error below 1.2e-7 everywhere: about two float32 ulps. numpy has no erf.
_ERFC_COEFFS = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806,
                0.27886807, -1.13520398, 1.48851587, -0.82215223, 0.17087277)


def erfc(x: np.ndarray) -> np.ndarray:
    """The complementary error function ``1 − erf(x)``, computed in float64 to relative error < 1.2e-7.

    >>> erfc(np.array([0.0, 1.0, -1.0])).round(6)
    array([1.      , 0.157299, 1.842701])
    """
    z = np.abs(np.asarray(x, np.float64))                # (...)
    t = 1.0 / (1.0 + 0.5 * z)                            # (...)
    poly = np.zeros_like(t)                              # (...) Horner, from the highest coefficient
    for c in reversed(_ERFC_COEFFS[1:]):
        poly = (poly + c) * t
    y = t * np.exp(-z * z + _ERFC_COEFFS[0] + poly)      # (...) erfc(|x|)
    return np.where(np.asarray(x) >= 0, y, 2.0 - y)      # (...) erfc(-z) = 2 - erfc(z)


def gelu(x: np.ndarray) -> np.ndarray:
    """BERT's GELU, exact form: ``x · Φ(x) = x · erfc(−x/√2) / 2`` (Hendrycks & Gimpel, 2016).

    >>> gelu(np.array([-1.0, 0.0, 1.0], np.float32)).round(4)
    array([-0.1587,  0.    ,  0.8413], dtype=float32)
    """
    return (x * 0.5 * erfc(-x / np.sqrt(2.0))).astype(x.dtype, copy=False)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GPT-2's GELU, the tanh approximation: ``x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))``.

    >>> gelu_tanh(np.array([-1.0, 0.0, 1.0], np.float32)).round(4)
    array([-0.1588,  0.    ,  0.8412], dtype=float32)
    """
    c = np.sqrt(2.0 / np.pi).astype(x.dtype)
    return 0.5 * x * (1.0 + np.tanh(c * x * (1 + 0.044715 * (x * x))))   # x·x, not x ** 3: numpy's pow is ~30× slower


def silu(x: np.ndarray) -> np.ndarray:
    """SiLU (swish), ``x · σ(x) = x / (1 + e^(−x))`` (Elfwing et al., 2018): the gate of Llama's SwiGLU MLP.

    >>> silu(np.array([-1.0, 0.0, 1.0], np.float32)).round(4)
    array([-0.2689,  0.    ,  0.7311], dtype=float32)
    """
    x = np.asarray(x)
    e = np.negative(x, out=np.empty(x.shape, x.dtype))   # (...) one buffer, every step in place (a prefill's
    with np.errstate(over="ignore"):                     #        (512, 1536) temporaries cost page faults each)
        np.exp(e, out=e)                                 # e^(−x) overflows to inf for x < −88: x/inf = −0
    e += 1
    return np.divide(x, e, out=e)                        # (...) x / (1 + e^(−x))


def relu(x: np.ndarray) -> np.ndarray:
    """``max(x, 0)``, the MLP's nonlinearity in Vaswani et al. (2017).

    >>> relu(np.array([-1.0, 0.0, 2.0]))
    array([0., 0., 2.])
    """
    return np.maximum(x, 0)


def gelu_grad(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dL/dx of ``y = x · Φ(x)``: ``dy · (Φ(x) + x · φ(x))``, φ the standard normal density."""
    cdf = 0.5 * erfc(-x / np.sqrt(2.0))                          # (...) Φ(x), float64
    pdf = np.exp(-0.5 * np.asarray(x, np.float64) ** 2) / np.sqrt(2 * np.pi)   # (...) φ(x)
    return (dy * (cdf + x * pdf)).astype(x.dtype, copy=False)


def gelu_tanh_grad(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dL/dx of ``y = x/2 · (1 + tanh(u))``, ``u = c · (x + 0.044715 x³)``, c = √(2/π):
    ``dy · (½(1 + t) + ½ x (1 − t²) · c (1 + 3·0.044715 x²))``, t = tanh(u)."""
    c = np.sqrt(2.0 / np.pi).astype(x.dtype)
    x2 = x * x                                                   # (...) three buffers, every step in place
    t = x2 * 0.044715
    t += 1
    t *= x
    t *= c
    np.tanh(t, out=t)                                            # (...) t, recomputed: cheaper than keeping it
    slope = t * t
    np.subtract(1, slope, out=slope)
    slope *= x
    slope *= 0.5 * c
    x2 *= 3 * 0.044715
    x2 += 1
    slope *= x2                                                  # (...) ½x (1 − t²) · c (1 + 3·0.044715 x²)
    t += 1
    t *= 0.5
    t += slope                                                   # (...) dy/dx
    t *= dy
    return t


def silu_grad(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dL/dx of ``y = x · σ(x)``: ``dy · σ(x) (1 + x (1 − σ(x)))``."""
    with np.errstate(over="ignore"):
        sig = 1 / (1 + np.exp(-x))                               # (...) σ(x)
    return dy * sig * (1 + x * (1 - sig))


def relu_grad(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dL/dx of ``y = max(x, 0)``: dy where x > 0, else 0 (torch's choice at 0)."""
    return np.where(x > 0, dy, 0).astype(dy.dtype, copy=False)


def taped(piece, x: np.ndarray):
    """``(y, saved)``: ``piece(x)`` run with a tape of its own, and what it kept for ``piece.backward``."""
    tape = Tape()
    y = piece(x, tape=tape)
    return y, tape.value


def silu_llama_cpp(x: np.ndarray) -> np.ndarray:
    """silu as llama.cpp computes it on the CPU (``ggml_v_silu``: x / (1 + e^−x) with its AVX-512 exp,
    :func:`attnlab.kernels.ggml_arith.silu`); the ``q8-activations`` mode's. Other dtypes: :func:`silu`."""
    if x.dtype != np.float32:
        return silu(x)
    from ..kernels import ggml_arith
    fused = ggml_arith.kernels()
    if fused is None:
        return ggml_arith.silu(x)
    y = np.empty(x.shape, np.float32)                                               # (...)
    fused.silu_rows(np.ascontiguousarray(x).reshape(-1), y.reshape(-1))
    return y


ACTIVATIONS = {"gelu": gelu, "gelu_new": gelu_tanh, "gelu_pytorch_tanh": gelu_tanh, "silu": silu, "relu": relu,
               "silu_llama_cpp": silu_llama_cpp}
ACTIVATION_GRADS = {"gelu": gelu_grad, "gelu_new": gelu_tanh_grad, "gelu_pytorch_tanh": gelu_tanh_grad,
                    "silu": silu_grad, "relu": relu_grad, "silu_llama_cpp": silu_grad}   # name -> (x, dy) -> dx: each activation's backward


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float, hook=NO_HOOKS,
               tape: Tape | None = None) -> np.ndarray:
    """(..., d_model) -> (..., d_model): each row to mean 0 and variance 1, then scaled and shifted.

    ``hook`` sees ``hook_scale`` (..., 1), the divisor √(var + eps), ``hook_normalized``, the output with the
    weight and bias (TransformerLens's LayerNorm has it so), and ``hook_out``, the output.
    With a ``tape``, keeps what :func:`layer_norm_backward` needs: the normalised rows and the divisor."""
    mu = x.mean(axis=-1, keepdims=True)                  # (..., 1)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)   # (..., 1) biased, as torch's LayerNorm
    scale = hook("hook_scale", np.sqrt(var + eps))       # (..., 1)
    xhat = (x - mu) / scale                              # (..., d_model)
    if tape is not None:
        tape.keep((xhat, scale))
    return hook("hook_out", hook("hook_normalized", xhat * weight + bias))   # (..., d_model)


def layer_norm_backward(saved, dy: np.ndarray, weight: np.ndarray):
    """Backward of :func:`layer_norm`: ``(dx, dweight, dbias)``, the last two summed over every row."""
    xhat, scale = saved                                  # (..., d_model), (..., 1)
    d = xhat.shape[-1]
    # forward: y = xhat * weight + bias
    dweight = (dy * xhat).reshape(-1, d).sum(0)          # (d_model,)
    dbias = dy.reshape(-1, d).sum(0)                     # (d_model,)
    dxhat = dy * weight                                  # (..., d_model)
    # forward: xhat = (x − mean(x)) / scale, scale = √(var(x) + eps): the mean's and the variance's paths
    # take out dxhat's mean and its component along xhat
    dx = (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True)) / scale
    return dx, dweight, dbias                            # (..., d_model), (d_model,), (d_model,)


@dataclass(frozen=True, eq=False)
class LayerNorm:
    weight: np.ndarray   # (d_model,)
    bias: np.ndarray     # (d_model,)
    eps: float
    name = "layer"       # its key in NORMS
    PARAMS = ("weight", "bias")
    HOOKS = ("hook_scale", "hook_normalized", "hook_out")

    def __call__(self, x: np.ndarray, hook=NO_HOOKS, tape: Tape | None = None) -> np.ndarray:
        return layer_norm(x, self.weight, self.bias, self.eps, hook, tape)

    def forward(self, x: np.ndarray):
        """``(y, saved)``: the call with a tape, and what it kept (the normalised rows and the divisor)."""
        return taped(self, x)

    def backward(self, saved, dy: np.ndarray):
        """``(dx, {"weight": …, "bias": …})`` from what the forward kept."""
        dx, dw, db = layer_norm_backward(saved, dy, self.weight)
        return dx, {"weight": dw, "bias": db}

    def backward_named(self, saved, dy: np.ndarray):
        """:meth:`backward`, and the gradients at its points: ``hook_out`` and ``hook_normalized`` (the same)."""
        return (*self.backward(saved, dy), {"hook_normalized": dy, "hook_out": dy})

    @classmethod
    def init(cls, d_model: int, eps: float, dtype=np.float32) -> "LayerNorm":
        """Weight 1, bias 0: the identity after normalising, as torch starts it."""
        return cls(np.ones(d_model, dtype), np.zeros(d_model, dtype), eps)

    def params(self) -> dict[str, np.ndarray]:
        return {"weight": self.weight, "bias": self.bias}

    @classmethod
    def load(cls, tensors, prefix: str, *, d_model: int, eps: float, why: str | None = None) -> "LayerNorm":
        """The norm stored as ``{prefix}.weight`` and ``{prefix}.bias`` (d_model,) in a checkpoint's
        :class:`~attnlab.models.checkpoint.Tensors`; ``why`` says where the expected shape comes from."""
        return cls(tensors.take(f"{prefix}.weight", (d_model,), why), tensors.take(f"{prefix}.bias", (d_model,), why),
                   eps)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float, hook=NO_HOOKS, tape: Tape | None = None) -> np.ndarray:
    """(..., d_model) -> (..., d_model): each row divided by its root mean square, then scaled; no centring,
    no bias (Zhang & Sennrich, 2019). The mean of squares is taken in at least float32, as Llama's code does.
    ``hook`` sees ``hook_scale`` (..., 1), the divisor √(mean(x²) + eps), ``hook_normalized``, the rows
    divided by it before the weight (TransformerLens's RMSNorm has it so), and ``hook_out``, the output.
    With a ``tape``, keeps what :func:`rms_norm_backward` needs: the normalised rows (in x's dtype, as they are
    multiplied) and the divisor. float32 rows take the mean of squares from the fused one-token kernels when they
    are chosen (:func:`row_kernels`; their sum in a written order, not BLAS's), hooked or not, and without hooks
    the whole norm from them: a row's bits are the same alone (a decode step's) or among others (a prompt's).

    >>> rms_norm(np.array([[3.0, 4.0]]), np.ones(2), 0.0).round(4)     # rms of (3, 4) is √12.5
    array([[0.8485, 1.1314]])
    """
    fused = row_kernels(x, weight)
    if fused is not None:                                       # float32 rows: the fused pieces' sum, hooked or not
        d = x.shape[-1]
        rows = x.reshape(-1, d)                                 # (N, d_model) a view where x allows
        if tape is None and hook is NO_HOOKS:
            y = np.empty(x.shape, x.dtype)                      # (..., d_model)
            fused.rms_norm_rows(rows, weight, x.dtype.type(1 / d), x.dtype.type(eps), y.reshape(-1, d))
            return y
        ms = np.empty(x.shape[:-1] + (1,), x.dtype)             # (..., 1) the divisor √(mean(x²) + eps)
        fused.rms_scale_rows(rows, x.dtype.type(1 / d), x.dtype.type(eps), ms.reshape(-1, 1))
        return _rms_hooked(x, weight, ms, hook, tape)
    x32 = x if x.dtype.itemsize >= 4 else x.astype(np.float32)   # float16 squares in float32
    ms = np.vecdot(x32, x32)[..., None]                         # (..., 1) d · mean of squares, no (..., d) temporary
    ms *= 1 / x.shape[-1]                                       # (..., 1) (ndarray.mean's Python wrapper cost more)
    ms += eps
    if tape is None and hook is NO_HOOKS:                       # nothing listens, nothing kept: no calls at points
        y = x32 / np.sqrt(ms, out=ms)                           # (..., d_model)
        if y.dtype != x.dtype:
            y = y.astype(x.dtype)
        y *= weight                                             # (..., d_model) in place
        return y
    return _rms_hooked(x, weight, np.sqrt(ms, out=ms), hook, tape)


def _rms_hooked(x: np.ndarray, weight: np.ndarray, scale: np.ndarray, hook, tape: Tape | None) -> np.ndarray:
    """:func:`rms_norm` from its divisor ``scale`` (..., 1) on, calling the hooks at its points and keeping what
    the backward needs on ``tape``."""
    scale = hook("hook_scale", scale)                           # (..., 1)
    x32 = x if x.dtype.itemsize >= 4 else x.astype(np.float32)
    y = x32 / scale                                             # (..., d_model)
    if y.dtype != x.dtype:
        y = y.astype(x.dtype)
    y = hook("hook_normalized", y)                              # (..., d_model)
    if tape is not None:
        tape.keep((y, scale))
    return hook("hook_out", y * weight)                         # (..., d_model)


def row_kernels(x: np.ndarray, weight: np.ndarray | None = None):
    """The fused one-token kernels (:mod:`attnlab.kernels._step_fused`) when ``x`` holds float32 rows (..., d)
    (and ``weight``, if given, a float32 (d,)) and they are chosen (:func:`attnlab.kernels._kernels.step_kernels`),
    else None. Norms and the gated MLP run them on every float32 row, whether hooks listen or not and however
    many rows come together, so a token's bits depend neither on the hooks nor on the batch it sits in."""
    if x.dtype != np.float32 or x.ndim == 0 or x.size == 0 or (
            weight is not None and (weight.dtype != np.float32 or weight.shape != x.shape[-1:])):
        return None
    return step_kernels()


def rms_norm_backward(saved, dy: np.ndarray, weight: np.ndarray):
    """Backward of :func:`rms_norm`: ``(dx, dweight)``."""
    xhat, scale = saved                                  # (..., d_model), (..., 1)
    # forward: y = xhat * weight
    dweight = (dy * xhat).reshape(-1, xhat.shape[-1]).sum(0)   # (d_model,)
    dxhat = dy * weight                                  # (..., d_model)
    # forward: xhat = x / scale, scale = √(mean(x²) + eps): the rms's path takes out dxhat's part along xhat
    dx = (dxhat - xhat * (dxhat * xhat).mean(-1, keepdims=True)) / scale   # (..., d_model)
    return dx.astype(dy.dtype, copy=False), dweight


@dataclass(frozen=True, eq=False)
class RMSNorm:
    """RMSNorm, the norm of Llama, Mistral and Qwen2: a weight, no bias."""
    weight: np.ndarray   # (d_model,)
    eps: float
    name = "rms"         # its key in NORMS
    PARAMS = ("weight",)
    HOOKS = ("hook_scale", "hook_normalized", "hook_out")

    def __call__(self, x: np.ndarray, hook=NO_HOOKS, tape: Tape | None = None) -> np.ndarray:
        return rms_norm(x, self.weight, self.eps, hook, tape)

    def forward(self, x: np.ndarray):
        """``(y, saved)``: the call with a tape, and what it kept (the normalised rows and the divisor)."""
        return taped(self, x)

    def backward(self, saved, dy: np.ndarray):
        """``(dx, {"weight": …})`` from what the forward kept."""
        dx, dw = rms_norm_backward(saved, dy, self.weight)
        return dx, {"weight": dw}

    def backward_named(self, saved, dy: np.ndarray):
        """:meth:`backward`, and the gradients at its points ``hook_out`` and ``hook_normalized`` (before the
        weight: dy · weight)."""
        return (*self.backward(saved, dy), {"hook_normalized": dy * self.weight, "hook_out": dy})

    @classmethod
    def init(cls, d_model: int, eps: float, dtype=np.float32) -> "RMSNorm":
        """Weight 1: the identity after normalising, as torch starts it."""
        return cls(np.ones(d_model, dtype), eps)

    def params(self) -> dict[str, np.ndarray]:
        return {"weight": self.weight}

    @classmethod
    def load(cls, tensors, prefix: str, *, d_model: int, eps: float, why: str | None = None) -> "RMSNorm":
        """The norm stored as ``{prefix}.weight`` (d_model,) in a checkpoint's Tensors."""
        return cls(tensors.take(f"{prefix}.weight", (d_model,), why), eps)


@dataclass(frozen=True, eq=False)
class LlamaCppRMSNorm(RMSNorm):
    """RMSNorm as llama.cpp computes it on the CPU (:func:`attnlab.kernels.ggml_arith.rms_norm`): the squares
    rounded to float32 and summed in double in order, 1/√(mean + eps) in float32, x times it, then times the
    weight. The ``q8-activations`` mode's norm (the same values as RMSNorm's within an ulp; llama.cpp's bits).
    With a tape (a backward) it is RMSNorm."""
    name = "rms_llama_cpp"

    def __call__(self, x: np.ndarray, hook=NO_HOOKS, tape: Tape | None = None) -> np.ndarray:
        if tape is not None or x.dtype != np.float32:
            return super().__call__(x, hook, tape)
        from ..kernels import ggml_arith
        fused = ggml_arith.kernels()
        if fused is None or self.weight.dtype != np.float32:
            y = ggml_arith.rms_norm(x, self.weight, self.eps)                      # (..., d_model) numpy
        else:
            y = np.empty(x.shape, np.float32)                                      # (..., d_model)
            d = x.shape[-1]
            fused.rms_norm_rows(np.ascontiguousarray(x).reshape(-1, d), self.weight, np.float32(self.eps),
                                y.reshape(-1, d))
        if hook is NO_HOOKS:
            return y
        # hook_scale and hook_normalized are seen (a replacement there changes nothing); hook_out is the output
        hook("hook_scale", np.sqrt(np.mean(np.square(x, dtype=np.float64), -1, keepdims=True)
                                   + self.eps).astype(np.float32))                 # (..., 1)
        hook("hook_normalized", ggml_arith.rms_norm(x, np.ones_like(self.weight), self.eps))   # (..., d_model)
        return hook("hook_out", y)                                                 # (..., d_model)


@dataclass(frozen=True, eq=False)
class MLP:
    """The per-token network of a block: ``act(x W_in + b_in) W_out + b_out``."""
    W_in: np.ndarray     # (d_model, d_mlp)
    b_in: np.ndarray     # (d_mlp,)
    W_out: np.ndarray    # (d_mlp, d_model)
    b_out: np.ndarray    # (d_model,)
    activation: str      # a key of ACTIVATIONS
    name = "mlp"         # its key in MLPS
    PARAMS = ("W_in", "b_in", "W_out", "b_out")
    HOOKS = ("hook_pre", "hook_post")   # the hidden layer before and after the nonlinearity, (..., n, d_mlp)

    def __post_init__(self):
        for name in ("W_in", "W_out"):                   # in the layout x @ W streams fastest (kernels.matmul)
            object.__setattr__(self, name, streamed(getattr(self, name)))

    def __call__(self, x: np.ndarray, hook=NO_HOOKS, tape: Tape | None = None) -> np.ndarray:
        """y (..., n, d_model); with a ``tape``, keeps the input, the pre-activation and the hidden layer."""
        pre = hook("hook_pre", linear(x, self.W_in) + self.b_in)            # (..., n, d_mlp)
        hidden = hook("hook_post", ACTIVATIONS[self.activation](pre))       # (..., n, d_mlp)
        if tape is not None:
            tape.keep((x, pre, hidden))
        return linear(hidden, self.W_out) + self.b_out                      # (..., n, d_model)

    @staticmethod
    def shapes(d_model: int, d_mlp: int) -> dict[str, tuple]:
        return {"W_in": (d_model, d_mlp), "b_in": (d_mlp,), "W_out": (d_mlp, d_model), "b_out": (d_model,)}

    def forward(self, x: np.ndarray):
        """``(y, saved)``: the call with a tape, and what it kept."""
        return taped(self, x)

    def backward(self, saved, dy: np.ndarray):
        """``(dx, grads)``, grads by the names of :meth:`params`."""
        return self.backward_named(saved, dy)[:2]

    def backward_named(self, saved, dy: np.ndarray):
        """``(dx, grads, named)``, named the gradients at ``hook_pre`` and ``hook_post``."""
        x, pre, hidden = saved                           # (..., n, d_model), (..., n, d_mlp) × 2
        d, d_mlp = self.W_in.shape
        # forward: y = hidden @ W_out + b_out
        dy2 = dy.reshape(-1, d)                          # (N, d_model)
        dW_out = hidden.reshape(-1, d_mlp).T @ dy2       # (d_mlp, d_model)
        db_out = dy2.sum(0)                              # (d_model,)
        dhidden = dy @ self.W_out.T                      # (..., n, d_mlp)
        # forward: hidden = act(pre)
        dpre = ACTIVATION_GRADS[self.activation](pre, dhidden)   # (..., n, d_mlp)
        # forward: pre = x @ W_in + b_in
        dpre2 = dpre.reshape(-1, d_mlp)                  # (N, d_mlp)
        dW_in = x.reshape(-1, d).T @ dpre2               # (d_model, d_mlp)
        db_in = dpre2.sum(0)                             # (d_mlp,)
        dx = dpre @ self.W_in.T                          # (..., n, d_model)
        return (dx, {"W_in": dW_in, "b_in": db_in, "W_out": dW_out, "b_out": db_out},
                {"hook_pre": dpre, "hook_post": dhidden})

    @classmethod
    def init(cls, d_model: int, d_mlp: int, activation: str, *, rng: np.random.Generator, std: float = 0.02,
             dtype=np.float32) -> "MLP":
        """Weights from N(0, std²), zero biases."""
        draw = lambda *shape: rng.normal(0.0, std, shape).astype(dtype)   # noqa: E731
        return cls(draw(d_model, d_mlp), np.zeros(d_mlp, dtype), draw(d_mlp, d_model), np.zeros(d_model, dtype),
                   activation)

    def params(self) -> dict[str, np.ndarray]:
        return {"W_in": self.W_in, "b_in": self.b_in, "W_out": self.W_out, "b_out": self.b_out}


@dataclass(frozen=True, eq=False)
class GatedMLP:
    """The gated MLP of Llama, Mistral and Qwen2 (SwiGLU with ``activation="silu"``; Shazeer, 2020):
    ``(act(x W_gate) ⊙ x W_in) W_out``, no biases. The gate decides, per hidden unit, how much of the
    linear path ``x W_in`` goes through."""
    W_gate: np.ndarray   # (d_model, d_mlp)
    W_in: np.ndarray     # (d_model, d_mlp)
    W_out: np.ndarray    # (d_mlp, d_model)
    activation: str      # a key of ACTIVATIONS
    # W_gate | W_in side by side (d_model, 2·d_mlp): one product for both (attnlab.kernels.matmul); float weights
    # are views of its columns; None when the two differ in type
    W_gate_in: object | None = field(init=False, repr=False, default=None)
    name = "gated"       # its key in MLPS
    PARAMS = ("W_gate", "W_in", "W_out")
    # the gate before its nonlinearity; the linear path x W_in; the hidden layer, gated; each (..., n, d_mlp)
    HOOKS = ("hook_pre", "hook_pre_linear", "hook_post")

    def __post_init__(self):
        fused, (W_gate, W_in) = fuse_columns(self.W_gate, self.W_in)
        for name, value in (("W_gate_in", fused), ("W_gate", W_gate), ("W_in", W_in), ("W_out", streamed(self.W_out))):
            object.__setattr__(self, name, value)

    def __call__(self, x: np.ndarray, hook=NO_HOOKS, tape: Tape | None = None) -> np.ndarray:
        """y (..., n, d_model); with a ``tape``, keeps the input, the gate's pre-activation, the linear path and
        the hidden layer."""
        if self.W_gate_in is None:
            gate, up = linear(x, self.W_gate), linear(x, self.W_in)                 # (..., n, d_mlp) each
        else:
            d_mlp = self.W_out.shape[0]
            both = linear(x, self.W_gate_in)                                        # (..., n, 2·d_mlp) one product
            gate, up = both[..., :d_mlp], both[..., d_mlp:]                         # (..., n, d_mlp) each
        if hook is NO_HOOKS and tape is None:                                       # nothing listens
            return linear(self.gated(gate, up), self.W_out)                        # (..., n, d_model)
        pre = hook("hook_pre", gate)                                                # (..., n, d_mlp)
        up = hook("hook_pre_linear", up)                                            # (..., n, d_mlp)
        hidden = hook("hook_post", self.gated(pre, up))                             # (..., n, d_mlp)
        if tape is not None:
            tape.keep((x, pre, up, hidden))
        return linear(hidden, self.W_out)                                           # (..., n, d_model)

    def gated(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        """The hidden layer act(gate) ⊙ up (..., n, d_mlp), a new array: for float32 rows with silu, the fused
        one-token kernel (:func:`row_kernels`), hooked or not, however many rows; else numpy."""
        fused = row_kernels(gate) if self.activation == "silu" else None
        if fused is not None and up.dtype == gate.dtype and up.shape == gate.shape:
            m = gate.shape[-1]
            hidden = np.empty(gate.shape, gate.dtype)                               # (..., n, d_mlp)
            fused.silu_mul_rows(gate.reshape(-1, m), up.reshape(-1, m), hidden.reshape(-1, m))
            return hidden
        hidden = ACTIVATIONS[self.activation](gate)                                 # (..., n, d_mlp) a new array
        hidden *= up
        return hidden

    @staticmethod
    def shapes(d_model: int, d_mlp: int) -> dict[str, tuple]:
        return {"W_gate": (d_model, d_mlp), "W_in": (d_model, d_mlp), "W_out": (d_mlp, d_model)}

    def forward(self, x: np.ndarray):
        """``(y, saved)``: the call with a tape, and what it kept."""
        return taped(self, x)

    def backward(self, saved, dy: np.ndarray):
        """``(dx, grads)``, grads by the names of :meth:`params`."""
        return self.backward_named(saved, dy)[:2]

    def backward_named(self, saved, dy: np.ndarray):
        """``(dx, grads, named)``, named the gradients at ``hook_pre`` (the gate), ``hook_pre_linear`` (the
        linear path) and ``hook_post``."""
        x, gate, up, hidden = saved                      # (..., n, d_model), (..., n, d_mlp) × 3
        d, d_mlp = self.W_in.shape
        # forward: y = hidden @ W_out
        dW_out = hidden.reshape(-1, d_mlp).T @ dy.reshape(-1, d)   # (d_mlp, d_model)
        dhidden = dy @ self.W_out.T                      # (..., n, d_mlp)
        # forward: hidden = act(gate) * up
        dup = dhidden * ACTIVATIONS[self.activation](gate)   # (..., n, d_mlp) act(gate) recomputed
        dgate = ACTIVATION_GRADS[self.activation](gate, dhidden * up)   # (..., n, d_mlp)
        # forward: gate = x @ W_gate, up = x @ W_in
        x2 = x.reshape(-1, d)                            # (N, d_model)
        dW_gate = x2.T @ dgate.reshape(-1, d_mlp)        # (d_model, d_mlp)
        dW_in = x2.T @ dup.reshape(-1, d_mlp)            # (d_model, d_mlp)
        dx = dgate @ self.W_gate.T + dup @ self.W_in.T   # (..., n, d_model)
        return (dx, {"W_gate": dW_gate, "W_in": dW_in, "W_out": dW_out},
                {"hook_pre": dgate, "hook_pre_linear": dup, "hook_post": dhidden})

    @classmethod
    def init(cls, d_model: int, d_mlp: int, activation: str, *, rng: np.random.Generator, std: float = 0.02,
             dtype=np.float32) -> "GatedMLP":
        """Weights from N(0, std²)."""
        draw = lambda *shape: rng.normal(0.0, std, shape).astype(dtype)   # noqa: E731
        return cls(draw(d_model, d_mlp), draw(d_model, d_mlp), draw(d_mlp, d_model), activation)

    def params(self) -> dict[str, np.ndarray]:
        return {"W_gate": self.W_gate, "W_in": self.W_in, "W_out": self.W_out}


NORMS = {c.name: c for c in (LayerNorm, RMSNorm, LlamaCppRMSNorm)}   # name -> class: what ModelConfig.norm names
MLPS = {c.name: c for c in (MLP, GatedMLP)}         # name -> class: what ModelConfig.mlp names


def activation_name(config: dict, key: str, source: str) -> str:
    """The config's activation, if attnlab implements it."""
    name = config.get(key)
    if name not in ACTIVATIONS:
        raise ValueError(f"{source}: config.json field {key!r} is {name!r}; attnlab implements "
                         f"{sorted(ACTIVATIONS)}")
    return name
