"""The mixture-of-experts MLP: a router picks k of E small gated MLPs for each token, and the token's output
is their outputs weighted by the router (Shazeer et al., 2017; Fedus et al., 2022). Not attention, but
gpt-oss, Qwen3-MoE and DeepSeek-V3 cannot run without it.

For one token x (d_model,)::

    ids, w = router(x)                                  (k,) the chosen experts, (k,) their weights
    y = Σ_j w_j · expert_{ids_j}(x)  (+ shared(x))      (d_model,)
    expert_e(x) = glu(x W_gate[e] + b_gate[e], x W_in[e] + b_in[e]) W_out[e] + b_out[e]

Two routers, each a small object holding its own parameters:

- :class:`SoftmaxTopKRouter` (gpt-oss): logits ``x W + b``; the k largest; a softmax over those k only.
- :class:`GroupSigmoidRouter` (DeepSeek-V3): scores ``σ(x W)``; the choice is made on the scores plus a
  correction bias (``e_score_correction_bias``, for load balancing; it never weighs an output), first
  keeping the ``topk_group`` best of ``n_group`` expert groups (a group's score is its two best experts'
  sum), then the k best experts among those; the weights are the chosen *uncorrected* scores, normalised to
  sum 1 when ``norm_topk_prob``, times ``routed_scaling_factor``.

Two gated units (:class:`ExpertsConfig` ``glu``): ``act(gate) · up`` with an activation of
:data:`attnlab.stack.layers.ACTIVATIONS` (DeepSeek-V3: silu), or gpt-oss's clamped SwiGLU,
``(clamp(up, −limit, limit) + 1) · g σ(α g)``, ``g = min(gate, limit)``, α = 1.702, limit = 7.

Hooks: ``hook_router_logits`` (..., n, E) the router's logits before any choice, ``hook_expert_ids``
(..., n, k) the chosen experts (ints) and ``hook_expert_weights`` (..., n, k) their weights; a hook that
replaces the weights or the ids changes what the layer computes (ablate an expert by zeroing its weight).

Forward and backward come as a pair, as every piece of the stack: with a tape the forward keeps the input,
the router's logits, its choice and the weights, and :meth:`Experts.backward_named` recomputes each expert's
hidden layer from them (its rows only). The choice itself is discrete: the gradient reaches the router through
the chosen weights (gpt-oss: their softmax; DeepSeek-V3: the chosen sigmoids, normalised and scaled), never
through which experts were chosen; DeepSeek-V3's correction bias moves only the choice, so its gradient is 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels._checks import as_positive_float, as_positive_int, check_flag
from ..layer.hookpoints import NO_HOOKS
from ..layer.tape import Tape
from .layers import ACTIVATION_GRADS, ACTIVATIONS, GatedMLP, taped

ROUTERS = ("softmax_topk", "group_sigmoid")   # gpt-oss's, DeepSeek-V3's
CLAMPED_SWIGLU = "swiglu_clamped"             # gpt-oss's gated unit; any other glu is an ACTIVATIONS name


@dataclass(frozen=True)
class ExpertsConfig:
    """The sizes and rules of an experts MLP, stated once. Defaults are gpt-oss's rules (softmax over the
    top k, the clamped SwiGLU, biases everywhere)."""
    n_experts: int                    # E, the routed experts
    top_k: int                        # k experts per token
    d_expert: int                     # each expert's hidden width (moe_intermediate_size)
    router: str = "softmax_topk"      # one of ROUTERS
    glu: str = CLAMPED_SWIGLU         # CLAMPED_SWIGLU, or the gate's activation ("silu")
    swiglu_alpha: float = 1.702       # gpt-oss: the sigmoid's slope, as in GELU's σ(1.702 x) approximation
    swiglu_limit: float = 7.0         # gpt-oss: gate clamped above, up clamped both sides
    bias: bool = True                 # gpt-oss's experts carry biases; DeepSeek-V3's do not
    n_group: int = 1                  # DeepSeek-V3: experts in n_group groups for the group-limited choice
    topk_group: int = 1               # DeepSeek-V3: groups kept per token
    norm_topk_prob: bool = True       # DeepSeek-V3: the k weights normalised to sum 1
    routed_scaling_factor: float = 1.0   # DeepSeek-V3: the weights then multiplied by this
    n_shared: int = 0                 # DeepSeek-V3: shared experts, one GatedMLP of width n_shared·d_expert
    first_dense: int = 0              # DeepSeek-V3's first_k_dense_replace: the first layers keep the dense MLP

    def __post_init__(self):
        for name in ("n_experts", "top_k", "d_expert", "n_group", "topk_group"):
            as_positive_int(name, getattr(self, name))
        for name in ("n_shared", "first_dense"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an int >= 0, got {v!r}")
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k ({self.top_k}) must be at most n_experts ({self.n_experts})")
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {list(ROUTERS)}, got {self.router!r}")
        if self.glu != CLAMPED_SWIGLU and self.glu not in ACTIVATIONS:
            raise ValueError(f"glu must be {CLAMPED_SWIGLU!r} or one of {sorted(ACTIVATIONS)}, got {self.glu!r}")
        for name in ("swiglu_alpha", "swiglu_limit", "routed_scaling_factor"):
            object.__setattr__(self, name, as_positive_float(name, getattr(self, name)))
        for name in ("bias", "norm_topk_prob"):
            check_flag(name, getattr(self, name))
        if self.n_experts % self.n_group:
            raise ValueError(f"n_experts ({self.n_experts}) must be a multiple of n_group ({self.n_group})")
        if self.topk_group > self.n_group:
            raise ValueError(f"topk_group ({self.topk_group}) must be at most n_group ({self.n_group})")
        if self.router == "group_sigmoid" and self.n_group > 1 and self.n_experts // self.n_group < 2:
            raise ValueError(f"a group's score is its two best experts: n_experts / n_group must be >= 2, got "
                             f"{self.n_experts} / {self.n_group}")
        if self.top_k > self.topk_group * (self.n_experts // self.n_group):
            raise ValueError(f"top_k ({self.top_k}) must be at most the experts of the kept groups "
                             f"({self.topk_group} × {self.n_experts // self.n_group})")

    @property
    def shared_activation(self) -> str:
        """The shared experts' gate activation: the routed experts' (silu with the clamped SwiGLU)."""
        return "silu" if self.glu == CLAMPED_SWIGLU else self.glu

    @property
    def router_class(self) -> type:
        return SoftmaxTopKRouter if self.router == "softmax_topk" else GroupSigmoidRouter

    def shapes(self, d_model: int) -> dict[str, tuple]:
        """Every array of the layer by name, in order: the router's ("router.W", …), the experts', the shared's."""
        E, d, m = self.n_experts, d_model, self.d_expert
        out = {f"router.{k}": s for k, s in self.router_class.shapes(d, E).items()}
        out.update({"W_gate": (E, d, m), "W_in": (E, d, m), "W_out": (E, m, d)})
        if self.bias:
            out.update({"b_gate": (E, m), "b_in": (E, m), "b_out": (E, d)})
        if self.n_shared:
            out.update({f"shared.{k}": s for k, s in GatedMLP.shapes(d, self.n_shared * m).items()})
        return out

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, data: dict) -> "ExpertsConfig":
        return cls(**data)


def _top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """The indices of the k largest of each row (..., E) -> (..., k), largest first (torch.topk's order; ties
    to the lower index)."""
    order = np.argsort(-scores, axis=-1, kind="stable")          # (..., E)
    return order[..., :k]                                        # (..., k)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))                # (..., k)
    return e / e.sum(axis=-1, keepdims=True)


@dataclass(frozen=True, eq=False)
class SoftmaxTopKRouter:
    """gpt-oss's router: ``logits = x W + b``, the k largest chosen, their weights a softmax over those k."""
    W: np.ndarray        # (d_model, E)
    b: np.ndarray        # (E,)
    top_k: int
    PARAMS = ("W", "b")

    @staticmethod
    def shapes(d_model: int, n_experts: int) -> dict[str, tuple]:
        return {"W": (d_model, n_experts), "b": (n_experts,)}

    @classmethod
    def of(cls, p: dict, c: ExpertsConfig) -> "SoftmaxTopKRouter":
        return cls(p["W"], p["b"], c.top_k)

    def params(self) -> dict[str, np.ndarray]:
        return {"W": self.W, "b": self.b}

    def logits(self, x: np.ndarray) -> np.ndarray:
        return x @ self.W + self.b                               # (..., n, E)

    def choose(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, weights)`` (..., n, k) each from the logits (..., n, E)."""
        ids = _top_k(logits, self.top_k)                         # (..., n, k)
        return ids, _softmax(np.take_along_axis(logits, ids, axis=-1))   # (..., n, k) softmax over the k chosen

    def weights_backward(self, logits: np.ndarray, ids: np.ndarray, w: np.ndarray, dw: np.ndarray) -> np.ndarray:
        """dL/dlogits (N, E) from dL/dw (N, k): the softmax's backward on the chosen k, 0 elsewhere."""
        # forward: w = softmax(logits[ids])
        d_chosen = w * (dw - (w * dw).sum(-1, keepdims=True))   # (N, k)
        dlogits = np.zeros_like(logits)                          # (N, E)
        np.put_along_axis(dlogits, ids, d_chosen, axis=-1)
        return dlogits

    def backward(self, x: np.ndarray, dlogits: np.ndarray) -> tuple[np.ndarray, dict]:
        """``(dx, grads)`` of ``logits = x W + b`` from dL/dlogits; x (N, d_model)."""
        return dlogits @ self.W.T, {"W": x.T @ dlogits, "b": dlogits.sum(0)}


@dataclass(frozen=True, eq=False)
class GroupSigmoidRouter:
    """DeepSeek-V3's router: sigmoid scores, a group-limited choice on the scores plus a correction bias, the
    chosen uncorrected scores as weights (normalised when ``norm_topk_prob``, then scaled)."""
    W: np.ndarray              # (d_model, E)
    correction: np.ndarray     # (E,) e_score_correction_bias: moves the choice, never the weights
    top_k: int
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    PARAMS = ("W", "correction")

    @staticmethod
    def shapes(d_model: int, n_experts: int) -> dict[str, tuple]:
        return {"W": (d_model, n_experts), "correction": (n_experts,)}

    @classmethod
    def of(cls, p: dict, c: ExpertsConfig) -> "GroupSigmoidRouter":
        return cls(p["W"], p["correction"], c.top_k, c.n_group, c.topk_group, c.norm_topk_prob,
                   c.routed_scaling_factor)

    def params(self) -> dict[str, np.ndarray]:
        return {"W": self.W, "correction": self.correction}

    def logits(self, x: np.ndarray) -> np.ndarray:
        return x @ self.W                                        # (..., n, E)

    def choose(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, weights)`` (..., n, k) each from the logits (..., n, E)."""
        with np.errstate(over="ignore"):
            scores = 1 / (1 + np.exp(-logits))                   # (..., n, E) σ(logits)
        pick = scores + self.correction                          # (..., n, E) what the choice reads
        if self.n_group > 1:
            *lead, E = pick.shape
            groups = pick.reshape(*lead, self.n_group, E // self.n_group)          # (..., n, G, E/G)
            best2 = -np.sort(-groups, axis=-1)[..., :2].sum(-1)                   # (..., n, G) two best, summed
            kept = _top_k(best2, self.topk_group)                                 # (..., n, topk_group)
            keep = np.zeros(best2.shape, bool)
            np.put_along_axis(keep, kept, True, axis=-1)                          # (..., n, G)
            keep = np.repeat(keep, E // self.n_group, axis=-1)                    # (..., n, E)
            pick = np.where(keep, pick, -np.inf)                                  # (..., n, E)
        ids = _top_k(pick, self.top_k)                           # (..., n, k)
        w = np.take_along_axis(scores, ids, axis=-1)             # (..., n, k) the uncorrected scores
        if self.norm_topk_prob:
            w = w / (w.sum(-1, keepdims=True) + 1e-20)
        return ids, w * self.routed_scaling_factor               # (..., n, k)

    def weights_backward(self, logits: np.ndarray, ids: np.ndarray, w: np.ndarray, dw: np.ndarray) -> np.ndarray:
        """dL/dlogits (N, E) from dL/dw (N, k), through the chosen sigmoids (the correction chose, nothing more)."""
        with np.errstate(over="ignore"):
            s = 1 / (1 + np.exp(-np.take_along_axis(logits, ids, axis=-1)))   # (N, k) σ of the chosen
        c = self.routed_scaling_factor
        if self.norm_topk_prob:
            # forward: w_j = c · s_j / S, S = Σ s + 1e-20
            S = s.sum(-1, keepdims=True) + 1e-20                 # (N, 1)
            ds = c * (dw / S - (dw * s).sum(-1, keepdims=True) / (S * S))   # (N, k)
        else:
            ds = c * dw                                          # (N, k) forward: w = c · s
        dlogits = np.zeros_like(logits)                          # (N, E)
        np.put_along_axis(dlogits, ids, ds * s * (1 - s), axis=-1)   # forward: s = σ(logits)
        return dlogits

    def backward(self, x: np.ndarray, dlogits: np.ndarray) -> tuple[np.ndarray, dict]:
        """``(dx, grads)`` of ``logits = x W`` from dL/dlogits; x (N, d_model). The correction bias gets 0."""
        return dlogits @ self.W.T, {"W": x.T @ dlogits, "correction": np.zeros_like(self.correction)}


def clamped_swiglu_grad(gate: np.ndarray, up: np.ndarray, alpha: float, limit: float,
                        dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(dgate, dup)`` of :func:`clamped_swiglu` from dy; torch's clamps pass the gradient where the input is
    within its bounds, ends included."""
    g = np.minimum(gate, limit)                                  # (..., m)
    u = np.clip(up, -limit, limit)                               # (..., m)
    with np.errstate(over="ignore"):
        sig = 1 / (1 + np.exp(-alpha * g))                       # (..., m) σ(α g)
    # forward: y = (u + 1) · g σ(α g)
    dup = dy * g * sig * (np.abs(up) <= limit)                   # (..., m) the clip passes inside [−limit, limit]
    dg = dy * (u + 1) * (sig + alpha * g * sig * (1 - sig))      # (..., m) d(g σ(αg))/dg
    return dg * (gate <= limit), dup                             # the min passes below the limit


def clamped_swiglu(gate: np.ndarray, up: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    """gpt-oss's gated unit: ``(clamp(up, −limit, limit) + 1) · g σ(α g)``, ``g = min(gate, limit)``.

    >>> clamped_swiglu(np.array([0.0, 10.0]), np.array([1.0, -10.0]), 1.702, 7.0).round(4)
    array([  0.    , -41.9997])
    """
    g = np.minimum(gate, limit)                                  # (..., m)
    u = np.clip(up, -limit, limit)                               # (..., m)
    with np.errstate(over="ignore"):
        glu = g / (1 + np.exp(-alpha * g))                       # (..., m) g σ(α g)
    return (u + 1) * glu


@dataclass(frozen=True, eq=False)
class Experts:
    """The experts MLP: a router and E gated MLPs stored as stacked arrays, optionally shared experts that
    every token passes through. Called as any MLP: ``mlp(x, hook, tape)`` (..., n, d_model) -> same."""
    router: SoftmaxTopKRouter | GroupSigmoidRouter
    W_gate: np.ndarray               # (E, d_model, d_expert)
    W_in: np.ndarray                 # (E, d_model, d_expert) the linear ("up") path
    W_out: np.ndarray                # (E, d_expert, d_model)
    config: ExpertsConfig
    b_gate: np.ndarray | None = None   # (E, d_expert) with config.bias
    b_in: np.ndarray | None = None     # (E, d_expert)
    b_out: np.ndarray | None = None    # (E, d_model)
    shared: GatedMLP | None = None     # with config.n_shared
    name = "experts"
    HOOKS = ("hook_router_logits", "hook_expert_ids", "hook_expert_weights")
    _NAMES = ("W_gate", "W_in", "W_out", "b_gate", "b_in", "b_out")

    def __post_init__(self):
        if not isinstance(self.config, ExpertsConfig):
            raise TypeError(f"config must be an ExpertsConfig, got {type(self.config).__name__}")
        want = self.config.shapes(self.W_gate.shape[1] if np.ndim(self.W_gate) == 3 else -1)
        got = self.params()
        if {k: np.shape(v) for k, v in got.items()} != want:
            raise ValueError(f"the experts' arrays have shapes {({k: np.shape(v) for k, v in got.items()})}, "
                             f"the config {self.config} asks for {want}")

    def params(self) -> dict[str, np.ndarray]:
        out = {f"router.{k}": v for k, v in self.router.params().items()}
        out.update({k: getattr(self, k) for k in self._NAMES if getattr(self, k) is not None})
        if self.shared is not None:
            out.update({f"shared.{k}": v for k, v in self.shared.params().items()})
        return out

    @classmethod
    def from_params(cls, p: dict, c: ExpertsConfig) -> "Experts":
        """The layer from arrays named as :meth:`params` names them."""
        sub = lambda pre: {k[len(pre):]: v for k, v in p.items() if k.startswith(pre)}   # noqa: E731
        shared = sub("shared.")
        return cls(router=c.router_class.of(sub("router."), c), config=c,
                   shared=GatedMLP(shared["W_gate"], shared["W_in"], shared["W_out"], c.shared_activation) if shared else None,
                   **{k: p[k] for k in cls._NAMES if k in p})

    @classmethod
    def init(cls, d_model: int, c: ExpertsConfig, *, rng: np.random.Generator, std: float = 0.02,
             dtype=np.float32) -> "Experts":
        """Every array from N(0, std²) (biases too: a random test should exercise them)."""
        return cls.from_params({k: rng.normal(0.0, std, s).astype(dtype) for k, s in c.shapes(d_model).items()}, c)

    def _glu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        c = self.config
        if c.glu == CLAMPED_SWIGLU:
            return clamped_swiglu(gate, up, c.swiglu_alpha, c.swiglu_limit)
        return ACTIVATIONS[c.glu](gate) * up

    def expert(self, e: int, x: np.ndarray) -> np.ndarray:
        """Expert e alone on rows x (m, d_model) -> (m, d_model)."""
        gate, up = x @ self.W_gate[e], x @ self.W_in[e]          # (m, d_expert) each
        if self.b_gate is not None:
            gate, up = gate + self.b_gate[e], up + self.b_in[e]
        y = self._glu(gate, up) @ self.W_out[e]                  # (m, d_model)
        return y if self.b_out is None else y + self.b_out[e]

    def __call__(self, x: np.ndarray, hook=NO_HOOKS, tape: Tape | None = None) -> np.ndarray:
        """y (..., n, d_model): each token through its k experts, weighted; plus the shared experts. With a
        ``tape``, keeps the input, the logits, the choice and the weights (:meth:`backward_named` recomputes the
        experts' hidden layers), and the shared experts' own."""
        logits = hook("hook_router_logits", self.router.logits(x))   # (..., n, E)
        ids, w = self.router.choose(logits)                      # (..., n, k) each
        ids = hook("hook_expert_ids", ids)                       # (..., n, k) ints
        w = hook("hook_expert_weights", w.astype(x.dtype, copy=False))   # (..., n, k)
        d = x.shape[-1]
        rows = x.reshape(-1, d)                                  # (N, d_model), N every token
        flat_ids, flat_w = ids.reshape(len(rows), -1), w.reshape(len(rows), -1)   # (N, k) each
        out = np.zeros_like(rows)                                # (N, d_model)
        for e in np.unique(flat_ids):                            # in expert order, as transformers adds them
            tok, slot = np.nonzero(flat_ids == e)                # (m,) each: the tokens that chose e
            out[tok] += self.expert(int(e), rows[tok]) * flat_w[tok, slot, None]   # (m, d_model)
        out = out.reshape(x.shape)                               # (..., n, d_model)
        shared_saved = None
        if self.shared is not None and tape is not None:
            y_shared, shared_saved = self.shared.forward(x)      # (..., n, d_model), the shared MLP's own
            out += y_shared
        elif self.shared is not None:
            out += self.shared(x)
        if tape is not None:
            tape.keep((x, logits.reshape(len(rows), -1), flat_ids, flat_w, shared_saved))
        return out

    def forward(self, x: np.ndarray):
        """``(y, saved)``: the call with a tape of its own, and what it kept."""
        return taped(self, x)

    def backward(self, saved, dy: np.ndarray):
        """``(dx, grads)``, grads by the names of :meth:`params`."""
        return self.backward_named(saved, dy)[:2]

    def _expert_backward(self, e: int, x: np.ndarray, dy: np.ndarray, grads: dict):
        """Expert e on rows x (m, d_model), dL/dy (m, d_model) already weighted: ``(dx, y)``, y its output
        (recomputed, for the weights' gradient); its parameters' gradients added into ``grads``."""
        c = self.config
        gate, up = x @ self.W_gate[e], x @ self.W_in[e]          # (m, d_expert) each
        if self.b_gate is not None:
            gate, up = gate + self.b_gate[e], up + self.b_in[e]
        hidden = self._glu(gate, up)                             # (m, d_expert)
        # forward: y = hidden @ W_out[e] + b_out[e]
        grads["W_out"][e] += hidden.T @ dy
        dhidden = dy @ self.W_out[e].T                           # (m, d_expert)
        # forward: hidden = glu(gate, up)
        if c.glu == CLAMPED_SWIGLU:
            dgate, dup = clamped_swiglu_grad(gate, up, c.swiglu_alpha, c.swiglu_limit, dhidden)
        else:
            dup = dhidden * ACTIVATIONS[c.glu](gate)
            dgate = ACTIVATION_GRADS[c.glu](gate, dhidden * up)
        if self.b_out is not None:
            grads["b_out"][e] += dy.sum(0)
            grads["b_gate"][e] += dgate.sum(0)
            grads["b_in"][e] += dup.sum(0)
        # forward: gate = x @ W_gate[e] (+ b), up = x @ W_in[e] (+ b)
        grads["W_gate"][e] += x.T @ dgate
        grads["W_in"][e] += x.T @ dup
        y = hidden @ self.W_out[e] + (0 if self.b_out is None else self.b_out[e])   # (m, d_model)
        return dgate @ self.W_gate[e].T + dup @ self.W_in[e].T, y

    def backward_named(self, saved, dy: np.ndarray):
        """``(dx, grads, named)``: named the gradients at ``hook_router_logits`` (..., n, E) and
        ``hook_expert_weights`` (..., n, k)."""
        x, logits, ids, w, shared_saved = saved          # (..., n, d_model), (N, E), (N, k) × 2, the shared's
        d = x.shape[-1]
        rows, dy2 = x.reshape(-1, d), dy.reshape(-1, d)          # (N, d_model) each
        grads = {k: np.zeros_like(v) for k, v in self.params().items() if not k.startswith(("router.", "shared."))}
        dx, dw = np.zeros_like(rows), np.zeros_like(w)          # (N, d_model), (N, k)
        for e in np.unique(ids):
            tok, slot = np.nonzero(ids == e)                     # (m,) each
            # forward: out[tok] += w[tok, slot] · expert_e(x[tok])
            d_in, y = self._expert_backward(int(e), rows[tok], dy2[tok] * w[tok, slot, None], grads)
            dx[tok] += d_in
            dw[tok, slot] = np.einsum("md,md->m", dy2[tok], y)  # (m,) dL/dw = dy · expert_e(x)
        dlogits = self.router.weights_backward(logits, ids, w, dw)   # (N, E)
        d_router, g_router = self.router.backward(rows, dlogits)
        dx += d_router
        grads.update({f"router.{k}": v for k, v in g_router.items()})
        dx = dx.reshape(x.shape)                                 # (..., n, d_model)
        if self.shared is not None:
            # forward: out += shared(x)
            d_shared, g_shared = self.shared.backward(shared_saved, dy)
            dx = dx + d_shared
            grads.update({f"shared.{k}": v for k, v in g_shared.items()})
        named = {"hook_router_logits": dlogits.reshape(*x.shape[:-1], -1),
                 "hook_expert_weights": dw.reshape(*x.shape[:-1], -1)}
        return dx, {k: grads[k] for k in self.params()}, named
