"""Activation patching and path patching, through the stack's named activations.

Activation patching (Meng et al., 2022; Wang et al., 2022) runs the corrupted prompts and puts back one piece
of the clean run: one head's output (at every position, or one), its q, k, v or pattern, one layer's
attention or MLP output or residual stream at one position, any hook. What that restores of a metric is

    restored = (patched − corrupt) / (clean − corrupt)        0 = nothing, 1 = all of it,

the metric averaged over a batch of clean/corrupt pairs. The default metric is the logit difference
answer − wrong at each prompt's last token; any ``metric(logits)`` of the last tokens' logits (B, vocab)
-> (B,) will do. Each patched run is a forward pass with one hook, no second model; the runs of a grid are
one sweep (:mod:`attnlab.interpret.sweeps`): batched, each from the block of its patch on.

Path patching (Wang et al., 2022, the IOI circuit) asks what a set of sender heads does *through* given
receivers only: the corrupted run with the senders' clean outputs and every other head frozen at its
corrupted output (MLPs recomputed) gives the receivers' inputs; a second corrupted run with just those
receiver activations put back gives the metric.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from ..stack.batch import is_ragged, pad_prompts
from ..stack.hooks import run_with_cache
from ..stack.transformer import Transformer, check_decoder, check_ids, hook_names, logits_of
from .interventions import Patching, _check_heads, is_index
from .sweeps import Intervention, base_run, resid_names, run_sweep, start_layer

#: what=…: the hook patched in each block, and how it is cut: by head (axis −3), by head and position, or by
#: position (axis −2).
WHAT = {"heads": ("attn.hook_z", "head"), "heads_by_pos": ("attn.hook_z", "head_pos"),
        "q": ("attn.hook_q", "head"), "k": ("attn.hook_k", "head"), "v": ("attn.hook_v", "head"),
        "pattern": ("attn.hook_pattern", "head"), "attn_out": ("hook_attn_out", "pos"),
        "mlp_out": ("hook_mlp_out", "pos"), "resid_pre": ("hook_resid_pre", "pos"),
        "resid_mid": ("hook_resid_mid", "pos"), "resid_post": ("hook_resid_post", "pos")}
_HEAD_HOOKS = ("attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_z", "attn.hook_result",
               "attn.hook_scores", "attn.hook_pattern")


@dataclass(frozen=True, eq=False)
class Pairs:
    """Clean and corrupted prompts as two (B, n) batches with one padding, and the metric's inputs."""
    clean: np.ndarray           # (B, n)
    corrupt: np.ndarray         # (B, n)
    mask: np.ndarray | None     # (B, n) a padded batch's real tokens, or None
    last: np.ndarray            # (B,) each prompt's last column


def pairs(model: Transformer, clean, corrupt) -> Pairs:
    """``clean`` and ``corrupt``: two texts (n,), two batches (B, n), or two lists of prompts whose pairs have
    the same length (lengths may differ between pairs; both lists are padded on the left alike)."""
    if is_ragged(clean) or is_ragged(corrupt):
        if not (is_ragged(clean) and is_ragged(corrupt)) or len(clean) != len(corrupt):
            raise ValueError("clean and corrupt must both be lists of prompts, of the same number")
        V = model.config.vocab_size
        a, b = pad_prompts(clean, vocab_size=V, is_causal=True), pad_prompts(corrupt, vocab_size=V, is_causal=True)
        if not np.array_equal(a.lengths, b.lengths):
            bad = int(np.argmax(a.lengths != b.lengths))
            raise ValueError(f"pair {bad} has {a.lengths[bad]} clean and {b.lengths[bad]} corrupted tokens; each "
                             "pair must have the same number")
        return Pairs(a.ids, b.ids, a.mask, a.last)
    c, k = check_ids(model, clean, name="clean_ids"), check_ids(model, corrupt, name="corrupt_ids")
    if c.ndim > 2 or c.shape != k.shape:
        raise ValueError(f"the clean and corrupted texts must have the same number of tokens (n,) or (B, n), got "
                         f"{c.shape[-1]} and {k.shape[-1]} tokens (shapes {c.shape} and {k.shape})")
    c, k = c.reshape(-1, c.shape[-1]), k.reshape(-1, k.shape[-1])       # (B, n)
    return Pairs(c, k, None, np.full(c.shape[0], c.shape[1] - 1))


def logit_diff_metric(model: Transformer, answer, wrong):
    """metric(logits (B, vocab)) -> (B,): logits[b, answer_b] − logits[b, wrong_b] in float64; ``answer`` and
    ``wrong`` are token ids, one for every pair or one each (B,)."""
    V = model.config.vocab_size
    for name, t in (("answer", answer), ("wrong", wrong)):
        arr = np.asarray(t)
        if arr.dtype == np.bool_ or arr.dtype.kind not in "iu" or arr.ndim > 1 or arr.size == 0 or \
                arr.min() < 0 or arr.max() >= V:
            raise ValueError(f"{name} must be a token id in [0, {V}) (or one per pair), got {t!r}")
    a, w = np.asarray(answer), np.asarray(wrong)

    def metric(logits):
        rows = np.arange(logits.shape[0])
        z = logits.astype(np.float64)
        return z[rows, np.broadcast_to(a, rows.shape)] - z[rows, np.broadcast_to(w, rows.shape)]
    return metric


def _metric(model, answer, wrong, metric):
    if metric is not None:
        if answer is not None or wrong is not None:
            raise ValueError("give either metric or answer and wrong, not both")
        if not callable(metric):
            raise TypeError(f"metric must be a function of the last tokens' logits (B, vocab), got "
                            f"{type(metric).__name__}")
        return metric
    if answer is None or wrong is None:
        raise ValueError("give answer and wrong (token ids), or a metric function")
    return logit_diff_metric(model, answer, wrong)


def _score(metric, logits: np.ndarray, p: Pairs) -> float:
    """The metric of the last tokens' logits, averaged over the pairs."""
    values = np.asarray(metric(logits[np.arange(len(p.last)), p.last]), np.float64)   # (B,) or ()
    return float(values.mean())


def _gap(clean: float, corrupt: float, warn_below: float) -> None:
    if clean == corrupt:
        raise ValueError("the clean and corrupted texts give the same metric: nothing to restore")
    scale = max(abs(clean), abs(corrupt))
    if abs(clean - corrupt) < warn_below * scale:
        warnings.warn(f"|clean − corrupt| = {abs(clean - corrupt):.3g} is below {warn_below:g} of the metric's "
                      f"scale max(|clean|, |corrupt|) = {scale:.3g}: the restored fractions divide by a small "
                      "difference and mean little", RuntimeWarning, stacklevel=3)


@dataclass(frozen=True, eq=False)
class PatchGrid:
    """What patching each piece restores: ``values`` the patched metric, ``restored`` its share."""
    what: str
    axes: tuple[str, ...]       # ("layer", "head"), ("layer", "head", "position"), ("layer", "position"), …
    clean: float                # the metric on the clean prompts (averaged over the pairs)
    corrupt: float              # on the corrupted prompts
    values: np.ndarray          # grid of patched metrics, one cell per piece
    restored: np.ndarray        # (values − corrupt) / (clean − corrupt)


def put_back(clean: np.ndarray, index: tuple):
    """A hook that puts back ``clean[index]`` (``index`` over the trailing axes, the batch axis left whole)."""
    def hook(x, name):
        x = x.copy()
        x[(Ellipsis, *index)] = clean[(Ellipsis, *index)]
        return x
    return hook


def _cells(model: Transformer, what: str, n: int):
    """(axes, [(grid index, hook name, index into the activation)]) for ``what``."""
    c = model.config
    L, H = c.n_layers, c.attention.n_heads
    known = set(hook_names(model))
    if what in WHAT:
        point, cut = WHAT[what]
        layers = [i for i in range(L) if f"blocks.{i}.{point}" in known]
        if not layers:
            raise ValueError(f"what={what!r}: this model has no {point} (e.g. no MLP, or a parallel block)")
        heads = c.attention.n_kv_heads if point in ("attn.hook_k", "attn.hook_v") else H
        if cut == "head":
            return ("layer", "head"), [((i, h), f"blocks.{i}.{point}", (h, slice(None), slice(None)))
                                       for i in layers for h in range(heads)], (L, heads)
        if cut == "head_pos":
            cells = [((i, h, t), f"blocks.{i}.{point}", (h, t, slice(None)))
                     for i in layers for h in range(heads) for t in range(n)]
            return ("layer", "head", "position"), cells, (L, heads, n)
        return ("layer", "position"), [((i, t), f"blocks.{i}.{point}", (t, slice(None)))
                                       for i in layers for t in range(n)], (L, n)
    if what not in known:
        raise ValueError(f"what must be one of {sorted(WHAT)} or a hook name of the model, got {what!r}")
    if what.endswith(_HEAD_HOOKS):
        heads = c.attention.n_kv_heads if what.endswith(("hook_k", "hook_v")) else H
        return ("head",), [((h,), what, (h, slice(None), slice(None))) for h in range(heads)], (heads,)
    return ("position",), [((t,), what, (t, slice(None))) for t in range(n)], (n,)


def patch(model: Transformer, clean_ids, corrupt_ids, *, answer=None, wrong=None, metric=None, what=None,
          warn_below: float = 0.05, progress=None):
    """Activation patching of every piece ``what`` names, one at a time: the clean run's activation put
    into the corrupted run.

    Parameters
    ----------
    clean_ids, corrupt_ids
        Two texts (n,), two batches (B, n), or two lists of prompts paired one to one (each pair of one
        length; pairs may differ, padded on the left).
    answer, wrong : int or ints (B,)
        Token ids: the metric is the logit difference answer − wrong at each prompt's last token.
    metric : function, optional
        Instead of answer and wrong: ``metric(logits)`` of the last tokens' logits (B, vocab) -> (B,).
    what : str, optional
        ``"heads"`` (one head's z at every position, (layer, head)), ``"heads_by_pos"`` (layer, head,
        position), ``"q"``, ``"k"``, ``"v"``, ``"pattern"`` (by head; k and v by KV head), ``"attn_out"``,
        ``"mlp_out"``, ``"resid_pre"``, ``"resid_mid"``, ``"resid_post"`` (layer, position), or any hook name
        (by head for an attention hook, else by position). None: ``"heads"`` and ``"resid_pre"`` together,
        as a :class:`Patching`.
    warn_below : float
        A RuntimeWarning when |clean − corrupt| is below this fraction of max(|clean|, |corrupt|).
    progress : function, optional
        ``progress(done, total)`` after each batched pass: the patched runs done so far, of all.

    The patched runs are a sweep (:mod:`attnlab.interpret.sweeps`): batches of them share one forward pass,
    each starting at the block of its patch from the corrupted run's residual stream there.

    Returns
    -------
    PatchGrid (or Patching for ``what=None``). Positions are the padded batch's columns: with left padding
    they line up the prompts' ends (position −1 is every prompt's last token).

    Raises
    ------
    ValueError, TypeError
        A bidirectional model, texts of different lengths, token ids outside the vocabulary, an unknown
        ``what``, clean and corrupted runs with the same metric (nothing to restore).
    """
    check_decoder(model, "patching")
    p = pairs(model, clean_ids, corrupt_ids)
    metric = _metric(model, answer, wrong, metric)
    if what is None:
        n_heads, n_resid = (len(_cells(model, w, p.clean.shape[-1])[1]) for w in ("heads", "resid_pre"))
        total = n_heads + n_resid
        steps = [None if progress is None else (lambda d, t, o=o: progress(o + d, total)) for o in (0, n_heads)]
        heads, resid = (_patch(model, p, metric, w, warn_below, s) for w, s in zip(("heads", "resid_pre"), steps))
        return Patching(clean=heads.clean, corrupt=heads.corrupt, heads=heads.restored, resid=resid.restored,
                        head_diff=heads.values, resid_diff=resid.values)
    if not isinstance(what, str):
        raise TypeError(f"what must be a string, got {type(what).__name__}")
    return _patch(model, p, metric, what, warn_below, progress)


def _patch(model: Transformer, p: Pairs, metric, what: str, warn_below: float, progress=None) -> PatchGrid:
    axes, cells, shape = _cells(model, what, p.clean.shape[-1])
    names = sorted({name for _, name, _ in cells})
    clean_out, cache = run_with_cache(model, p.clean, names, attention_mask=p.mask)
    clean = _base_score(model, metric, clean_out, p)
    sweep = [Intervention({name: put_back(cache[name], index)}) for _, name, index in cells]
    corrupt_out, base = base_run(model, p.corrupt, sweep, attention_mask=p.mask)
    corrupt = _base_score(model, metric, corrupt_out, p)
    _gap(clean, corrupt, warn_below)
    values = np.full(shape, np.nan)
    scores = run_sweep(model, p.corrupt, sweep, _last_score(metric, p), cache=base, attention_mask=p.mask,
                       logits_to_keep=_kept(p), progress=progress)
    for (at, _, _), v in zip(cells, scores):
        values[at] = v
    return PatchGrid(what=what, axes=axes, clean=clean, corrupt=corrupt, values=values,
                     restored=(values - corrupt) / (clean - corrupt))


def _kept(p: Pairs) -> int:
    """Logits to keep per run: the last position's when every prompt ends there (left padding), else all."""
    return 1 if (p.last == p.clean.shape[-1] - 1).all() else 0


def _base_score(model: Transformer, metric, out, p: Pairs) -> float:
    """The metric of a whole pass's output, its last rows unembedded as the sweep's runs unembed theirs (a
    patch that changes nothing then restores exactly 0: one row's product may round apart from all n rows')."""
    if not _kept(p):
        return _score(metric, out.logits, p)
    return _last_score(metric, p)(logits_of(model, out.hidden_states[-1][..., -1:, :]))   # (B, 1, vocab)


def _last_score(metric, p: Pairs):
    """score(logits) of one run's (B, kept, vocab) logits: the metric at each prompt's last token, averaged."""
    if _kept(p):
        return lambda logits: float(np.asarray(metric(logits[:, -1]), np.float64).mean())
    return lambda logits: _score(metric, logits, p)


@dataclass(frozen=True, eq=False)
class PathPatching:
    """What the senders' clean outputs restore through the receivers alone."""
    clean: float
    corrupt: float
    patched: float              # the metric with the receivers' path-patched activations
    restored: float             # (patched − corrupt) / (clean − corrupt)


def _receivers(model: Transformer, receiver_hooks) -> list[tuple[str, list | None]]:
    if isinstance(receiver_hooks, str):
        receiver_hooks = [receiver_hooks]
    known, out = set(hook_names(model)), []
    for r in receiver_hooks:
        name, heads = (r, None) if isinstance(r, str) else r
        if name not in known:
            raise ValueError(f"receiver_hooks has {name!r}, not a hook of the model (see hook_names(model))")
        if name.endswith("attn.hook_z"):
            raise ValueError(f"a receiver cannot be {name!r}: every head's z is frozen; take its q, k or v")
        if heads is not None and not name.endswith(_HEAD_HOOKS):
            raise ValueError(f"receiver {name!r} has no heads to choose; give the name alone")
        out.append((name, None if heads is None else _receiver_heads(model, name, heads)))
    if not out:
        raise ValueError("receiver_hooks must name at least one hook")
    return out


def _receiver_heads(model: Transformer, name: str, heads) -> list[int]:
    """A receiver's heads: integers from 0 to n_heads − 1 (no negative index, no bool), at least one."""
    n = model.config.attention.n_heads
    if isinstance(heads, (str, bytes)) or not hasattr(heads, "__iter__"):
        raise TypeError(f"receiver {name!r}: heads must be a list of head indices, got {heads!r}")
    heads = list(heads)
    bad = [h for h in heads if not is_index(h) or not 0 <= h < n]
    if bad or not heads:
        raise ValueError(f"receiver {name!r}: heads must be integers from 0 to {n - 1} (the model's heads), "
                         f"got {heads!r}")
    return [int(h) for h in heads]


def path_patch(model: Transformer, clean_ids, corrupt_ids, sender_heads, receiver_hooks, *, answer=None,
               wrong=None, metric=None, warn_below: float = 0.05) -> PathPatching:
    """Path patching (Wang et al., 2022): the share of the metric that the clean outputs of
    ``sender_heads`` [(layer, head), …] restore through ``receiver_hooks`` alone.

    1. The corrupted run, with the senders' z taken from the clean run and every other head's z frozen at
       the corrupted run's (MLPs and norms recomputed): the receivers' activations are recorded.
    2. The corrupted run with only those receiver activations put back; its metric is ``patched``.

    ``receiver_hooks`` names hooks, each alone or as (name, heads) for some heads of an attention hook:
    ``[("blocks.9.attn.hook_q", [6, 9])]`` (the senders' effect on those heads' queries), or
    ``"blocks.{L-1}.hook_resid_post"`` (their direct effect on the logits, MLPs included). Inputs and metric
    as :func:`patch`.
    """
    check_decoder(model, "path patching")
    p = pairs(model, clean_ids, corrupt_ids)
    metric = _metric(model, answer, wrong, metric)
    senders = _check_heads(model, sender_heads)
    receivers = _receivers(model, receiver_hooks)
    return _path_patch_sets(model, p, metric, [senders], receivers, warn_below)[0]


def path_patch_heads(model: Transformer, clean_ids, corrupt_ids, heads, receiver_hooks, *, answer=None,
                     wrong=None, metric=None, warn_below: float = 0.05, progress=None) -> dict:
    """:func:`path_patch` of each (layer, head) of ``heads`` alone as the sender: {(layer, head): PathPatching},
    the heads' runs batched as one sweep (:mod:`attnlab.interpret.sweeps`). ``progress(done, total)``, if
    given, is called after each batched pass."""
    check_decoder(model, "path patching")
    p = pairs(model, clean_ids, corrupt_ids)
    metric = _metric(model, answer, wrong, metric)
    heads = _check_heads(model, heads)
    receivers = _receivers(model, receiver_hooks)
    out = _path_patch_sets(model, p, metric, [[h] for h in heads], receivers, warn_below, progress)
    return dict(zip(heads, out))


def _path_patch_sets(model: Transformer, p: Pairs, metric, sender_sets: list, receivers: list, warn_below: float,
                     progress=None) -> list[PathPatching]:
    """Path patching of each set of senders (the two runs of :func:`path_patch` for each), as two sweeps.

    In the first run every head's z is frozen at the corrupted run's but the senders'; below the first
    sender (or receiver) that changes nothing, so the sweep starts there. The second run starts at the first
    receiver."""
    L = model.config.n_layers
    z_names = [f"blocks.{i}.attn.hook_z" for i in range(L)]
    receiving = start_layer(model, [name for name, _ in receivers])
    starts = {min(receiving, *(layer for layer, _ in senders)) for senders in sender_sets} | {receiving}
    clean_out, clean_z = run_with_cache(model, p.clean, z_names, attention_mask=p.mask)
    corrupt_out, corrupt = run_with_cache(model, p.corrupt, z_names + resid_names(model, starts),
                                          attention_mask=p.mask)
    clean_m, corrupt_m = _base_score(model, metric, clean_out, p), _base_score(model, metric, corrupt_out, p)
    _gap(clean_m, corrupt_m, warn_below)
    recorded = [{} for _ in sender_sets]
    first = [Intervention(_freezing(senders, clean_z, corrupt, receivers, rec, L))
             for senders, rec in zip(sender_sets, recorded)]
    total = 2 * len(sender_sets)
    steps = [None if progress is None else (lambda d, t, o=o: progress(o + d, total)) for o in (0, len(first))]
    run_sweep(model, p.corrupt, first, lambda logits: 0.0, cache=corrupt, attention_mask=p.mask, logits_to_keep=1,
              progress=steps[0])
    second = [Intervention({name: put_back(rec[name], (slice(None),) if heads is None else
                                           (heads, slice(None), slice(None))) for name, heads in receivers})
              for rec in recorded]
    patched = run_sweep(model, p.corrupt, second, _last_score(metric, p), cache=corrupt, attention_mask=p.mask,
                        logits_to_keep=_kept(p), progress=steps[1])
    return [PathPatching(clean=clean_m, corrupt=corrupt_m, patched=float(v),
                         restored=(v - corrupt_m) / (clean_m - corrupt_m)) for v in patched]


def _freezing(senders: list, clean, corrupt, receivers: list, recorded: dict, n_layers: int) -> dict:
    """The first run's edits for one set of senders: each layer's z frozen at the corrupted run's, the senders'
    heads at the clean run's, from the first sender's layer on (below it, freezing the corrupted run's own z
    changes nothing); the receivers' activations recorded into ``recorded``."""
    def frozen(heads):
        def hook(x, name):
            z = corrupt[name].copy()                                    # (B, h, n, d_head)
            z[..., heads, :, :] = clean[name][..., heads, :, :]
            return z
        return hook

    def record(x, name):
        recorded[name] = np.array(x)
    start = min(layer for layer, _ in senders)
    edits = {f"blocks.{i}.attn.hook_z": frozen([h for layer, h in senders if layer == i])
             for i in range(start, n_layers)}
    return {**edits, **{name: record for name, _ in receivers}}
