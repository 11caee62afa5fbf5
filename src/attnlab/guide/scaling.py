"""Why attention divides by √d_k: the guide's three experiments, with its seeds.

1. Dot products of random unit-variance vectors spread as √d_k (1.98 at width 4, 8.01 at width 64).
2. With 16 keys at width 64 the largest softmax weight averages 0.843; dividing by √64 brings it to 0.247.
3. A saturated softmax barely moves: [10, 0, 0] -> 0.99991, nudged to 10.1 -> 0.99992; from [1, 0, 0]
   the same nudge moves 0.576 to 0.600.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels._checks import as_finite_float, as_float_array, as_positive_int, check_rng
from ..kernels.softmax import softmax

SEED = 0                       # both experiments start from default_rng(0), as in the guide
TRIAL_NUMBERS = 1 << 20        # normals drawn at once (8 MiB): fast, and bounded for any --d-k, --pairs, --trials


@dataclass(frozen=True, eq=False)
class Spread:
    """Dot products of random pairs at one width."""
    d_k: int
    dots: np.ndarray           # (n_pairs,) u · v
    std: float                 # close to √d_k


@dataclass(frozen=True, eq=False)
class TopWeight:
    """The largest of ``n_keys`` softmax weights over many random trials, unscaled and scaled."""
    d_k: int
    n_keys: int
    top: np.ndarray            # (n_trials,) max softmax(K q)
    top_scaled: np.ndarray     # (n_trials,) max softmax(K q / √d_k)

    @property
    def mean(self) -> float:
        return float(np.mean(self.top))

    @property
    def mean_scaled(self) -> float:
        return float(np.mean(self.top_scaled))


def dot_product_spread(widths=(4, 64), n_pairs: int = 10_000, *, rng: np.random.Generator) -> list[Spread]:
    """For each width, draw ``n_pairs`` pairs of N(0, 1) vectors (in order, from one ``rng``) and dot them.

    >>> [round(s.std, 2) for s in dot_product_spread(rng=np.random.default_rng(SEED))]
    [1.98, 8.01]
    """
    check_rng(rng)
    n_pairs = as_positive_int("n_pairs", n_pairs)
    out = []
    for d_k in widths:
        d_k = as_positive_int("width", d_k)
        dots = np.empty(n_pairs)                                # (n_pairs,) u · v
        block = max(1, TRIAL_NUMBERS // (2 * d_k))              # pairs per draw, to bound the memory
        for start in range(0, n_pairs, block):                  # the same normals as one draw, in order
            stop = min(start + block, n_pairs)
            uv = rng.normal(size=(stop - start, 2, d_k))        # (b, 2, d_k) pairs of vectors
            dots[start:stop] = (uv[:, 0] * uv[:, 1]).sum(axis=1)
        out.append(Spread(d_k=d_k, dots=dots, std=float(dots.std())))
    return out


def top_weight(d_k: int = 64, n_keys: int = 16, n_trials: int = 2000, *, rng: np.random.Generator) -> TopWeight:
    """The guide's second experiment: per trial one query then ``n_keys`` keys, drawn in that order.

    The trials are drawn a block at a time: a Generator's normals come off its stream one after another, so
    one draw of (trials, 1 + n_keys, d_k) holds exactly the guide's query-then-keys draws, trial by trial.

    >>> t = top_weight(rng=np.random.default_rng(SEED))
    >>> round(t.mean, 3), round(t.mean_scaled, 3)
    (0.843, 0.247)
    """
    check_rng(rng)
    d_k, n_keys, n_trials = (as_positive_int(n, v) for n, v in
                             (("d_k", d_k), ("n_keys", n_keys), ("n_trials", n_trials)))
    top, top_scaled = np.empty(n_trials), np.empty(n_trials)   # (n_trials,) each
    block = max(1, TRIAL_NUMBERS // ((1 + n_keys) * d_k))      # trials per draw, to bound the memory
    for start in range(0, n_trials, block):
        stop = min(start + block, n_trials)
        qk = rng.normal(size=(stop - start, 1 + n_keys, d_k))  # (t, 1 + n_keys, d_k) a query, then its keys
        s = (qk[:, 1:] @ qk[:, 0, :, None])[..., 0]             # (t, n_keys) raw scores
        top[start:stop] = softmax(s, axis=-1).max(axis=-1)
        top_scaled[start:stop] = softmax(s / np.sqrt(d_k), axis=-1).max(axis=-1)
    return TopWeight(d_k=d_k, n_keys=n_keys, top=top, top_scaled=top_scaled)


def saturation(scores=(10.0, 0.0, 0.0), *, index: int = 0, nudge: float = 0.1) -> tuple[float, float]:
    """Weight on ``scores[index]`` before and after adding ``nudge`` to that score.

    >>> [round(w, 5) for w in saturation()], [round(w, 3) for w in saturation((1.0, 0.0, 0.0))]
    ([0.99991, 0.99992], [0.576, 0.6])
    """
    s = np.array(as_float_array("scores", np.asarray(scores, dtype=float), finite=True))   # (n,)
    if s.ndim != 1 or not -len(s) <= index < len(s):
        raise ValueError(f"index must pick one of the {s.size} scores, got {index}")
    before = softmax(s)[index]
    s[index] += as_finite_float("nudge", nudge)
    return float(before), float(softmax(s)[index])
