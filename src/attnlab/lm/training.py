"""Training the model: random windows of the text, the hand-written backward, and Adam.

Everything random comes from the ``rng`` passed in, so a seed gives the same run twice.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..kernels._checks import as_finite_float, as_positive_float, as_positive_int, as_token_ids, check_rng
from ..stack.transformer import Transformer
from .model import check_model, loss, loss_and_grad


@dataclass(frozen=True)
class AdamConfig:
    """Adam's settings (Kingma & Ba, 2015). The betas and eps are the paper's; lr suits these small models."""
    lr: float = 3e-3        # small models in float32 train fast and stay stable at this rate
    beta1: float = 0.9      # decay of the running mean of gradients
    beta2: float = 0.999    # decay of the running mean of squared gradients
    eps: float = 1e-8       # keeps the step finite where a gradient has been ~0
    weight_decay: float = 0.0   # decoupled decay, AdamW (Loshchilov & Hutter, 2019): p -= lr · wd · p
    clip: float | None = None   # the gradients' global norm is scaled down to this when above it (nanoGPT: 1.0)

    def __post_init__(self):
        as_positive_float("lr", self.lr)
        as_positive_float("eps", self.eps)
        if not (isinstance(self.weight_decay, (int, float)) and 0 <= self.weight_decay < 1 / self.lr):
            raise ValueError(f"weight_decay must be a number in [0, 1/lr), got {self.weight_decay!r}")
        if self.clip is not None:
            as_positive_float("clip", self.clip)
        for name in ("beta1", "beta2"):
            if not 0 <= as_finite_float(name, getattr(self, name)) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")


@dataclass(eq=False)
class AdamState:
    """Adam's running means, one pair of arrays per parameter, and the step count."""
    m: dict[str, np.ndarray]
    v: dict[str, np.ndarray]
    t: int = 0

    @classmethod
    def zeros(cls, params: dict[str, np.ndarray]) -> "AdamState":
        return cls(m={k: np.zeros_like(a) for k, a in params.items()},
                   v={k: np.zeros_like(a) for k, a in params.items()})


def adam_step(params: dict[str, np.ndarray], grads: dict[str, np.ndarray], state: AdamState,
              config: AdamConfig = AdamConfig(), *, lr_scale: float = 1.0) -> None:
    """One Adam update of every array in ``params``, in place (Kingma & Ba, 2015, Algorithm 1).

    ``lr_scale`` multiplies the learning rate for this step (a schedule, see :func:`cosine_decay`).
    """
    state.t += 1
    c = replace(config, lr=config.lr * lr_scale) if lr_scale != 1.0 else config
    # both bias corrections folded into the step size, as the paper's Section 2 suggests (eps then acts on √v
    # before correction, a negligible difference)
    correction = np.sqrt(1 - c.beta2 ** state.t) / (1 - c.beta1 ** state.t)
    shrink = 1.0 if c.clip is None else min(1.0, c.clip / max(grad_norm(grads, params), 1e-30))
    for name, p in params.items():
        g, m, v = grads[name] * shrink if shrink < 1 else grads[name], state.m[name], state.v[name]
        m *= c.beta1
        m += (1 - c.beta1) * g                            # running mean of g
        v *= c.beta2
        v += (1 - c.beta2) * g * g                        # running mean of g²
        if c.weight_decay and p.ndim == 2:                # matrices (embeddings too); biases are not decayed
            p *= 1 - c.lr * c.weight_decay
        p -= (c.lr * correction) * m / (np.sqrt(v) + c.eps)


def grad_norm(grads: dict[str, np.ndarray], params: dict[str, np.ndarray]) -> float:
    """The global L2 norm of the gradients of ``params``, in float64 (what clipping compares with its bound)."""
    return float(np.sqrt(sum(np.square(grads[n], dtype=np.float64).sum() for n in params)))


def cosine_decay(steps: int, floor: float = 0.1):
    """A schedule for :func:`training_steps`: the learning rate falls from 1× to ``floor``× along half a cosine
    (Loshchilov & Hutter, 2017, without restarts).

    >>> [round(cosine_decay(5)(s), 3) for s in range(1, 6)]
    [1.0, 0.868, 0.55, 0.232, 0.1]
    """
    steps = as_positive_int("steps", steps)
    if not 0 <= floor <= 1:
        raise ValueError(f"floor must be in [0, 1], got {floor}")
    return lambda step: float(floor + (1 - floor) * 0.5 * (1 + np.cos(np.pi * (step - 1) / max(steps - 1, 1))))


def split_heldout(ids: np.ndarray, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """The text split into a training head and a held-out tail of ``fraction`` of its tokens (0 = no tail)."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
        raise ValueError(f"heldout fraction must be a number in [0, 1), got {fraction!r}")
    cut = len(ids) - int(round(len(ids) * fraction))
    return ids[:cut], ids[cut:]                                          # (n_train,), (n_heldout,)


def check_text_length(ids: np.ndarray, n_ctx: int, what: str = "the training text") -> None:
    """A window of n_ctx inputs needs n_ctx + 1 tokens (inputs and their next tokens)."""
    if len(ids) < n_ctx + 1:
        raise ValueError(f"{what} has {len(ids)} tokens, fewer than the context {n_ctx} plus one; "
                         "use a shorter context or a longer text")


def sample_batch(ids: np.ndarray, n_ctx: int, batch_size: int, rng: np.random.Generator):
    """``batch_size`` random windows: inputs (B, n_ctx) and the next tokens (B, n_ctx)."""
    check_text_length(ids, n_ctx)
    starts = rng.integers(0, len(ids) - n_ctx, size=batch_size)          # (B,)
    rows = starts[:, None] + np.arange(n_ctx + 1)                        # (B, n_ctx + 1)
    window = ids[rows]                                                   # (B, n_ctx + 1)
    return window[:, :-1], window[:, 1:]                                 # (B, n_ctx) each


def evaluate(model: Transformer, ids, *, n_ctx: int | None = None) -> float:
    """Mean cross-entropy (nats per token) of predicting every token of ``ids`` after the first.

    The text is cut into windows of n_ctx + 1 tokens that overlap by one (n_ctx: the model's, or the
    window a fine-tuning run trains on), so every token is predicted exactly once, from the earlier tokens
    of its window.
    """
    ids = as_token_ids("ids", ids, model.config.vocab_size)
    if ids.ndim != 1 or ids.size < 2:
        raise ValueError(f"ids must be 1-D with at least 2 tokens to predict one, got shape {ids.shape}")
    n_ctx = model.config.n_ctx if n_ctx is None else min(as_positive_int("n_ctx", n_ctx), model.config.n_ctx)
    n_full = (ids.size - 1) // n_ctx                                      # whole windows
    total, count = 0.0, 0
    if n_full:
        rows = np.arange(n_full)[:, None] * n_ctx + np.arange(n_ctx + 1)  # (W, n_ctx + 1)
        w = ids[rows]                                                     # (W, n_ctx + 1)
        for chunk in np.array_split(w, max(1, n_full // 64)):             # (≤ 64-ish, n_ctx + 1) at a time
            total += loss(model, chunk[:, :-1], chunk[:, 1:]) * chunk[:, 1:].size
            count += chunk[:, 1:].size
    rest = ids[n_full * n_ctx:]                                           # (r + 1,) the last partial window
    if rest.size > 1:
        total += loss(model, rest[:-1], rest[1:]) * (rest.size - 1)
        count += rest.size - 1
    return total / count


@dataclass(frozen=True)
class Step:
    """What one training step reports."""
    step: int          # 1-based
    loss: float        # the batch's loss before the update
    tokens: int        # tokens predicted in this step


def training_steps(model: Transformer, ids, *, steps: int, batch_size: int, rng: np.random.Generator,
                   adam: AdamConfig = AdamConfig(), schedule=None, state: AdamState | None = None,
                   start: int = 0):
    """Train ``model`` in place on ``ids`` (n,), yielding a :class:`Step` after each update.

    ``schedule(step)`` (steps count from 1), if given, scales the learning rate, e.g. :func:`cosine_decay`.
    ``state`` and ``start`` resume a run: Adam's moments and the steps already taken (the run then goes on
    with step ``start + 1`` up to ``steps``; with the generator state of ``rng`` restored too, it ends bit
    for bit where the uninterrupted run ends).

    Returns a generator, so the caller decides what to show and when to save; stopping the loop early
    leaves a model that is whole after its last completed step. The arguments are checked here, before
    the first step.
    """
    check_model(model)
    ids = as_token_ids("ids", ids, model.config.vocab_size)
    batch_size = as_positive_int("batch_size", batch_size)
    check_text_length(ids, model.config.n_ctx)
    return steps_on(model, lambda r: sample_batch(ids, model.config.n_ctx, batch_size, r), steps=steps, rng=rng,
                    adam=adam, schedule=schedule, state=state, start=start)


TRAIN_ONLY = ("all", "attention", "last-k-layers")   # which parameters a run updates


def trainable_names(model: Transformer, train_only: str = "all", *, last_k: int = 2) -> list[str]:
    """The parameters a run updates: every one; only the attention layers' (W_Q … b_O of every block); or
    every parameter of the last ``last_k`` blocks and after them (the final norm, the unembedding)."""
    check_model(model)
    if train_only not in TRAIN_ONLY:
        raise ValueError(f"train_only must be one of {TRAIN_ONLY}, got {train_only!r}")
    names = list(model.params())
    if train_only == "attention":
        return [n for n in names if ".attn." in n]
    if train_only == "last-k-layers":
        last_k = as_positive_int("last_k", last_k)
        first = max(model.config.n_layers - last_k, 0)
        late = lambda n: n.startswith("blocks.") and int(n.split(".")[1]) >= first   # noqa: E731
        return [n for n in names if late(n) or n.startswith("ln_final.") or n in ("W_U", "b_U")]
    return names


def steps_on(model: Transformer, sample, *, steps: int, rng: np.random.Generator, adam: AdamConfig = AdamConfig(),
             schedule=None, state: AdamState | None = None, start: int = 0, names=None):
    """The training loop for any data: ``sample(rng)`` gives a batch ``(ids, targets)``, each (B, n_ctx).

    Yields a :class:`Step` after each update of steps ``start + 1 … steps``; ``state`` (Adam's moments and
    step count) carries over from an earlier run, else starts at zero. ``names`` (see
    :func:`trainable_names`) limits the update to those parameters; the rest stay as they are.
    """
    check_model(model)
    steps = as_positive_int("steps", steps)
    check_rng(rng)
    if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= steps:
        raise ValueError(f"start must be an int in [0, steps={steps}], got {start!r}")
    if state is not None and state.t != start:
        raise ValueError(f"the Adam state has taken {state.t} steps, but the run resumes after step {start}")
    params = model.params()
    if names is not None:
        unknown = [n for n in names if n not in params]
        if unknown or not names:
            raise ValueError(f"names must be some of the model's parameters, got {unknown or 'none'}")
        params = {n: params[n] for n in names}
    return _steps(model, sample, steps, rng, adam, schedule, state, start, params)


def _steps(model, sample, steps, rng, adam, schedule, state, start, params):
    state = AdamState.zeros(params) if state is None else state
    for step in range(start + 1, steps + 1):
        x, y = sample(rng)                                               # (B, n_ctx) each
        value, grads = loss_and_grad(model, x, y)
        adam_step(params, grads, state, adam, lr_scale=1.0 if schedule is None else schedule(step))
        yield Step(step=step, loss=value, tokens=y.size)


def train(model: Transformer, ids, *, steps: int, batch_size: int, rng: np.random.Generator,
          adam: AdamConfig = AdamConfig(), schedule=None) -> list[float]:
    """Run :func:`training_steps` to the end; the batch losses, step by step."""
    return [s.loss for s in training_steps(model, ids, steps=steps, batch_size=batch_size, rng=rng, adam=adam,
                                           schedule=schedule)]
