"""The whole stack's backward, from what its one forward kept on a tape.

There is one forward (:func:`attnlab.stack.transformer.forward`): inference, hooks, training and attribution
all run it. Given a :class:`~attnlab.layer.tape.Tape` it also keeps, piece by piece, exactly what each piece's
backward needs; each piece's pair lives beside it (the block kinds' residual lines in
:mod:`attnlab.stack.blocks`, the norms' and MLPs' in :mod:`attnlab.stack.layers`, attention's in
:mod:`attnlab.layer.multihead`, :func:`attnlab.stack.transformer.embed` / ``embed_backward`` and
:func:`~attnlab.stack.transformer.logits_of` / ``logits_backward``). :func:`backward` walks the tape in reverse
from dL/d(the logits) (or dL/d(the last hidden state)) and returns dL/d(every parameter) by the names of
:meth:`Transformer.params`, and dL/d(any named activation asked for) by the hook names of
:mod:`attnlab.stack.hooks` (``blocks.3.attn.hook_z``, ``blocks.0.hook_resid_pre``, …)::

    tape = Tape()
    logits = forward(model, ids, tape=tape).logits          # the pass inference runs, bit for bit
    grads, named = backward(model, tape, dlogits, grad_names=["blocks.0.attn.hook_z"])

Hooks that replace an activation during a taped pass are taken as constants of the backward's pieces: the
gradient flows through the hook point as if the hook had returned its input, at the values the pass went on
with (TransformerLens's hooks behave so under torch when a hook returns a detached tensor).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels._threads import blas_threads_for
from ..layer.tape import Tape
from .transformer import Transformer, embed_backward, forward, hook_names, logits_backward

# hook points the backward gives no gradient at: the (n, n_k) grids (the tiled path never builds them), the
# norms' divisors, and the experts' choice (ids, not numbers)
NOT_DIFFERENTIATED = ("hook_scores", "hook_pattern", "hook_sink", "hook_scale", "hook_expert_ids")


def grad_hook_names(model: Transformer) -> list[str]:
    """The activation names :func:`backward` gives gradients for: every hook name but those of
    :data:`NOT_DIFFERENTIATED` (``hook_unembed`` only with ``dlogits``)."""
    return [n for n in hook_names(model) if not n.endswith(NOT_DIFFERENTIATED)]


def check_grad_names(model: Transformer, grad_names) -> tuple[str, ...]:
    """``grad_names`` as a tuple of activation names the backward gives (see :func:`grad_hook_names`)."""
    if isinstance(grad_names, str) or not all(isinstance(n, str) for n in grad_names):
        raise TypeError("grad_names must be a list of activation names (see attnlab.stack.hooks.hook_names)")
    known = grad_hook_names(model)
    bad = [n for n in grad_names if n not in known]
    if bad:
        raise ValueError(f"grad_names has {bad}, which the backward does not give; it gives {known[:4]} … "
                         f"(see attnlab.stack.backward.grad_hook_names)")
    return tuple(grad_names)


def backward(model: Transformer, tape: Tape, dlogits=None, *, d_hidden=None, grad_names=()):
    """dL/d(every parameter) and dL/d(the named activations ``grad_names``), from what
    ``forward(model, ids, tape=tape)`` kept.

    Parameters
    ----------
    model : Transformer
        The model the taped pass ran.
    tape : Tape
        What the pass kept.
    dlogits : float array (..., k, vocab), optional
        dL/d(the pass's logits), in their shape (``logits_to_keep`` rows when the pass kept only those).
    d_hidden : float array (..., n, d_model), optional
        Or dL/d(the last hidden state, after the final norm), for a loss that does not go through the logits.
        Exactly one of the two.
    grad_names : list of str
        Activations to differentiate too (see :func:`grad_hook_names`).

    Returns
    -------
    grads, named : dict, dict
        dL/d(every parameter) by the names of :meth:`Transformer.params` (the unembedding's with ``dlogits``;
        a tied W_E gets both its uses), and dL/d(each activation of ``grad_names``) by its hook name.

    Raises
    ------
    ValueError, TypeError
        A tape that did not record a pass of this model, a gradient of the wrong shape, unknown names.
    """
    names = check_grad_names(model, grad_names)
    if not isinstance(tape, Tape) or "embed" not in tape:
        raise TypeError("tape must be a Tape that forward(model, ids, tape=tape) filled")
    shape = (*tape["embed"].ids.shape, model.config.d_model)           # the hidden states' (..., n, d_model)
    if (dlogits is None) == (d_hidden is None):
        raise TypeError("give exactly one of dlogits and d_hidden")
    grads, named = {}, {}
    if dlogits is not None:
        if "unembed" not in tape:
            raise ValueError("dlogits given, but the taped pass computed no logits (an encoder without a head: "
                             "call logits_of(model, hidden, tape) after it)")
        x = tape["unembed"].x                                           # (..., k, d_model)
        dlogits = np.asarray(dlogits)
        if dlogits.shape != (*x.shape[:-1], model.config.vocab_size):
            raise ValueError(f"dlogits must have the logits' shape {(*x.shape[:-1], model.config.vocab_size)}, "
                             f"got {dlogits.shape}")
        named["hook_unembed"] = dlogits
        dk, grads = logits_backward(model, tape, dlogits)               # (..., k, d_model)
        dx = dk if dk.shape == shape else _rows_into(dk, shape)         # (..., n, d_model)
    else:
        if "hook_unembed" in names:
            raise ValueError("grad_names has hook_unembed, the logits: give dlogits, not d_hidden")
        dx = np.asarray(d_hidden)                                       # (..., n, d_model)
        if dx.shape != shape:
            raise ValueError(f"d_hidden must have the hidden states' shape {shape}, got {dx.shape}")
    if model.ln_final is not None:
        # forward: hidden = ln_final(x)
        dx, g, points = model.ln_final.backward_named(tape["ln_final"], dx)   # (..., n, d_model)
        grads.update({f"ln_final.{k}": v for k, v in g.items()})
        named.update({f"ln_final.{k}": v for k, v in points.items()})
    for i in reversed(range(model.config.n_layers)):
        # forward: x = block_i.forward(x)
        dx, g, points = model.blocks[i].backward(tape.scoped(f"blocks.{i}."), dx)   # (..., n, d_model)
        grads.update({f"blocks.{i}.{k}": v for k, v in g.items()})
        named.update({f"blocks.{i}.{k}": v for k, v in points.items() if f"blocks.{i}.{k}" in names})
    embedding, points = embed_backward(model, tape, dx)
    named.update(points)
    for k, v in embedding.items():
        grads[k] = grads[k] + v if k in grads else v                    # a tied W_E: the unembedding's use too
    return {k: grads[k] for k in model.params() if k in grads}, {n: named[n] for n in names}


def _rows_into(dk: np.ndarray, shape: tuple) -> np.ndarray:
    """dL/d(the last k rows) placed in zeros of the whole (..., n, d_model): the other rows had no logits."""
    dx = np.zeros(shape, dk.dtype)                                      # (..., n, d_model)
    dx[..., shape[-2] - dk.shape[-2]:, :] = dk
    return dx


@dataclass(frozen=True, eq=False)
class Gradients:
    """What :func:`grad` gives: a metric's value and its gradient at hook points and at every parameter."""
    value: float                 # the metric on the pass's logits
    at: dict                     # hook name -> dmetric/d(that activation), in the activation's shape
    params: dict                 # parameter name (Transformer.params) -> dmetric/d(it)
    logits: np.ndarray           # (..., n, vocab) the pass's logits


def grad(model: Transformer, ids, metric, *, at=(), token_types=None, attention_mask=None, hooks=None) -> Gradients:
    """The gradient of a scalar ``metric`` of the logits at any hook points (``at``) and every parameter: one
    forward (``forward`` itself, taped) and one backward; TransformerLens's ``metric(logits).backward()`` with
    hooks that keep each point's ``.grad``.

    Parameters
    ----------
    model : Transformer
        A model with logits.
    ids : int array (..., n)
    metric : callable
        ``metric(logits) -> (value, dvalue/dlogits)``: a float, and an array of the logits' shape. numpy does not
        differentiate, so the metric says its own gradient; :func:`logit_difference` and :func:`logit_of` build
        the common ones.
    at : list of str
        Hook names (see :func:`grad_hook_names`: every point but the (n, n_k) grids and the norms' divisors).
    token_types, attention_mask, hooks
        As :func:`attnlab.stack.transformer.forward` takes them; a hook that replaces an activation is taken as
        a constant of the backward (the gradient passes its point as if it had returned its input).

    Raises
    ------
    ValueError, TypeError
        A model without logits, a metric that does not return (value, gradient of the logits' shape), names
        the backward does not give.

    Examples
    --------
    >>> from attnlab.layer.config import AttentionConfig
    >>> from attnlab.stack.transformer import ModelConfig, Transformer
    >>> model = Transformer.init(ModelConfig(vocab_size=7, n_layers=2, attention=AttentionConfig(d_model=8,
    ...                          n_heads=2, n_ctx=8)), rng=np.random.default_rng(0), std=0.5)
    >>> g = grad(model, [1, 2, 3, 4], logit_difference(3, 5), at=["blocks.1.attn.hook_z"])
    >>> g.at["blocks.1.attn.hook_z"].shape                      # (n_heads, n, d_head)
    (2, 4, 4)
    """
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a Transformer, got {type(model).__name__}")
    if not model.config.has_logits:
        raise ValueError(f"grad needs logits; {model.name or 'this model'} is an encoder without a head")
    names = check_grad_names(model, at)
    if not callable(metric):
        raise TypeError(f"metric must be a function logits -> (value, dvalue/dlogits), got {type(metric).__name__}")
    tape = Tape()
    logits = forward(model, ids, token_types=token_types, attention_mask=attention_mask, hooks=hooks,
                     tape=tape).logits                                  # (..., n, vocab)
    got = metric(logits)
    if not (isinstance(got, tuple) and len(got) == 2 and np.shape(got[1]) == logits.shape):
        raise ValueError(f"metric must return (value, dvalue/dlogits) with the gradient shaped like the logits "
                         f"{logits.shape}; numpy does not differentiate, so the metric gives its own gradient "
                         "(see attnlab.stack.backward.logit_difference)")
    with blas_threads_for(logits.size // logits.shape[-1]):              # as the forward ran: by its rows
        params, named = backward(model, tape, np.asarray(got[1], logits.dtype), grad_names=names)
    return Gradients(value=float(got[0]), at=named, params=params, logits=logits)


def logit_of(token: int, *, position: int = -1):
    """A metric for :func:`grad`: the logit of ``token`` at ``position``, summed over a batch."""
    return logit_difference(token, None, position=position)


def logit_difference(answer: int, wrong: int | None, *, position: int = -1):
    """A metric for :func:`grad`: ``logits[..., position, answer] − logits[..., position, wrong]`` summed over a
    batch (``wrong`` None: the answer's logit alone), and its gradient."""
    for name, t in (("answer", answer), ("wrong", wrong)):
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0):
            raise ValueError(f"{name} must be a token id (an int >= 0), got {t!r}")

    def metric(logits: np.ndarray):
        V = logits.shape[-1]
        if answer >= V or (wrong is not None and wrong >= V):
            raise ValueError(f"answer and wrong must be token ids below the vocabulary's {V}, got {answer}, {wrong}")
        d = np.zeros_like(logits)                                       # (..., n, vocab)
        d[..., position, answer] += 1
        value = logits[..., position, answer].sum()
        if wrong is not None:
            d[..., position, wrong] -= 1
            value = value - logits[..., position, wrong].sum()
        return float(value), d
    return metric
