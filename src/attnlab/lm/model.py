"""attnlab's own language model: the guide's pieces stacked on :mod:`attnlab.stack.transformer`, and trained.

    x = W_E[ids] + positions                      (B, n, d_model)   the guide's X, with W_P or sinusoids
    x = x + MultiHeadAttention(x, causal)          × n_layers        attention with W_O, and a residual
    logits = x @ W_U + b_U                         (B, n, vocab)     one prediction per position
    loss = cross-entropy of the next token

RoPE and ALiBi add nothing to x: they act inside attention (rotated q and k; a bias on the scores).
By default there is no MLP and no layer norm: the guide's attention and nothing else, so what the model
learns beyond the bigram floor it learns by looking back; ``lm_config(block="gpt")`` gives nanoGPT's
blocks instead. The model is a :class:`attnlab.stack.transformer.Transformer` (:func:`lm_config` states its
shape); it runs through the stack's ``forward`` and ``generate`` like GPT-2 does.

:func:`loss_and_grad` is the one loss and gradient of every model the stack runs (this LM, GPT-2, BERT,
the Llama family, GPT-NeoX, Gemma-2): its forward is the stack's one ``forward``, given a tape; the backward
is written by hand beside each forward (:mod:`attnlab.stack.backward`), each line naming the forward line it
undoes.
"""

from __future__ import annotations

import numpy as np

from ..kernels._checks import as_token_ids
from ..layer.config import AttentionConfig
from ..layer.positions import Learned, PositionScheme
from ..stack.layers import LayerNorm
from ..layer.tape import Tape
from ..stack.backward import backward, check_grad_names
from ..stack.transformer import ModelConfig, Transformer, check_ids, forward, logits_of

FAMILY = "attnlab"


BLOCK_PRESETS = ("attention", "gpt")   # attention-only blocks (the guide's), or nanoGPT's


def lm_config(vocab_size: int, *, d_model: int = 64, n_heads: int = 4, n_layers: int = 2, n_ctx: int = 64,
              positions: PositionScheme | None = None, d_head: int | None = None,
              n_kv_heads: int | None = None, block: str = "attention") -> ModelConfig:
    """The shape of attnlab's own LM: causal blocks and an untied unembedding with a bias. Defaults are small
    enough to train in numpy in a minute; d_head defaults to d_model / n_heads, positions to
    :class:`~attnlab.layer.positions.Learned`.

    ``block`` "attention" (the default): attention-only blocks, no norms, the guide's attention and nothing
    else. "gpt": GPT-2's blocks as nanoGPT trains them: pre-norm LayerNorm, an MLP 4 × d_model wide with
    GPT-2's GELU (tanh form), a final norm before the unembedding.
    """
    if block not in BLOCK_PRESETS:
        raise ValueError(f"block must be one of {BLOCK_PRESETS}, got {block!r}")
    attention = AttentionConfig(d_model=d_model, n_heads=n_heads, d_head=d_head, n_kv_heads=n_kv_heads,
                                n_ctx=n_ctx, positions=Learned() if positions is None else positions)
    gpt = dict(d_mlp=4 * d_model, activation="gelu_new", norm=LayerNorm) if block == "gpt" else {}
    return ModelConfig(vocab_size=vocab_size, n_layers=n_layers, attention=attention, family=FAMILY, **gpt)


IGNORE = -100   # a target that is not scored (transformers' ignore_index): a masked-LM's unmasked positions


def check_model(model: Transformer) -> None:
    """A Transformer of any family: the backward covers every piece the stack runs."""
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a Transformer, got {type(model).__name__}")


def cross_entropy(logits: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean of −log p(target) over every scored position (targets other than :data:`IGNORE`), and its
    gradient with respect to the logits."""
    keep = targets != IGNORE                                             # (...) scored positions
    safe = np.where(keep, targets, 0)                                    # (...)
    z = logits - logits.max(-1, keepdims=True)                           # (..., vocab) softmax sees differences
    log_p = z - np.log(np.exp(z).sum(-1, keepdims=True))                 # (..., vocab) log-softmax
    picked = np.take_along_axis(log_p, safe[..., None], -1)[..., 0]      # (...) log p of each target
    dlogits = np.exp(log_p)                                              # (..., vocab) predicted probabilities
    np.put_along_axis(dlogits, safe[..., None], np.take_along_axis(dlogits, safe[..., None], -1) - 1, -1)
    count = int(keep.sum())
    if count < keep.size:
        dlogits *= keep[..., None]                                       # unscored positions add nothing
    return float(-(picked * keep).sum() / count), dlogits / count        # predicted minus correct, over N


def scored_logits(model: Transformer, ids, *, token_types=None, tape: Tape | None = None) -> np.ndarray:
    """The logits (..., n, vocab) the loss scores: the forward's (one pass, kept on ``tape`` when given); an
    encoder without a head (BERT) is scored against its word embeddings, as BertForMaskedLM's decoder is tied
    to them (its transform layer and bias are not part of attnlab's BERT)."""
    out = forward(model, ids, token_types=token_types, tape=tape)
    return out.logits if out.logits is not None else logits_of(model, out.hidden_states[-1], tape)


def loss(model: Transformer, ids, targets, *, token_types=None) -> float:
    """Cross-entropy of ``targets`` (..., n) given ``ids`` (..., n), in nats per token."""
    check_model(model)
    logits = scored_logits(model, ids, token_types=token_types)          # (..., n, vocab)
    return cross_entropy(logits, check_targets(targets, logits.shape[:-1], model.config.vocab_size))[0]


def check_targets(targets, shape: tuple, vocab_size: int) -> np.ndarray:
    """``targets`` as token ids of the vocabulary (or :data:`IGNORE`), with the shape of the ids they follow,
    at least one of them scored."""
    arr = np.asarray(targets)
    skip = arr == IGNORE if arr.dtype.kind in "iu" else np.zeros(arr.shape, bool)
    checked = as_token_ids("targets", np.where(skip, 0, arr) if skip.any() else arr, vocab_size)
    if checked.shape != shape:
        raise ValueError(f"targets must have the shape of ids {shape}, got {checked.shape}")
    if skip.all():
        raise ValueError(f"targets are all {IGNORE} (not scored): at least one position must have a target")
    return np.where(skip, IGNORE, checked)


def loss_and_grad(model: Transformer, ids, targets, *, grad_names=(), token_types=None
                  ) -> tuple[float, dict[str, np.ndarray]]:
    """The cross-entropy loss of ``targets`` given ``ids``, and its gradient with respect to every parameter
    and to the named activations ``grad_names``: one forward pass, one backward pass.

    Every family the stack runs: attnlab's own LM, GPT-2 (tied), BERT (post-norm; its masked-LM loss, the
    unmasked positions' targets :data:`IGNORE`, scored as :func:`scored_logits` says), the Llama family
    (RMSNorm, gated MLP, grouped KV heads, RoPE), GPT-NeoX (parallel blocks), Gemma-2 (sandwich norms, the
    embedding scale, both soft-caps, alternating windows). The forward is the one inference runs
    (:func:`attnlab.stack.transformer.forward`), given a tape on which each piece keeps what its backward
    needs; the backward walks it in reverse (:func:`attnlab.stack.backward.backward`).

    Parameters
    ----------
    model : Transformer
    ids, targets : int arrays (..., n)
        Token ids and the token expected at each position (next-token: ids shifted by one; masked-LM: the
        hidden token where masked, :data:`IGNORE` elsewhere).
    grad_names : list of str
        Activations to differentiate too, by their hook names (``blocks.3.attn.hook_z``,
        ``blocks.0.hook_resid_pre``, …; see :func:`attnlab.stack.hooks.hook_names`; not the (n, n_k) grids).
    token_types : int array (..., n), optional
        Segment ids for models with a token-type table (BERT).

    Returns
    -------
    loss : float
        Mean −log p(target) over the scored positions, in nats per token (as :func:`loss`).
    grads : dict
        dL/d(every parameter), by the names of :meth:`Transformer.params` and in their shapes, then
        dL/d(each activation of ``grad_names``) in the activation's shape.

    Raises
    ------
    ValueError, TypeError
        When ids or targets are not token ids of the vocabulary, or their shapes differ, or a name of
        ``grad_names`` is not an activation the backward gives.
    """
    check_model(model)
    ids = check_ids(model, ids)                                          # (..., n)
    targets = check_targets(targets, ids.shape, model.config.vocab_size)
    names = check_grad_names(model, grad_names)
    tape = Tape()
    logits = scored_logits(model, ids, token_types=token_types, tape=tape)   # (..., n, vocab)
    value, dlogits = cross_entropy(logits, targets)                      # (..., n, vocab)
    grads, named = backward(model, tape, dlogits, grad_names=names)
    return value, {**grads, **named}
