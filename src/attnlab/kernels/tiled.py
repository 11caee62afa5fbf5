"""Tiled attention: the guide's equation one tile of the grid at a time, never holding n_q × n_k.

Forward, the online softmax (FlashAttention, Dao et al. 2022; FlashAttention-2, Dao 2023). A block of
queries walks the blocks of keys it may see, keeping per query a running max ``m``, a running sum ``l``
and an accumulator ``acc``::

    s   = q kⱼᵀ · scale                   the tile's scores, masked ones -inf
    m'  = max(m, rowmax s)                the new running max
    p   = exp(s - m')                     the tile's weights, not yet normalised
    l   = l · exp(m - m') + rowsum p      the running sum, rescaled to the new max
    acc = acc · exp(m - m') + p vⱼ        the accumulator, rescaled likewise
    out = acc / l,   lse = m + log l      after the last block

Any reference point works in place of m' (it cancels in acc / l) as long as exp does not overflow, so
each row keeps its reference fixed while m stays within ±SHIFT_SLACK of it: then a tile needs neither
the subtraction pass nor the rescaling; when ‖q_i‖ ‖k_j‖ · scale bounds every score of a block, m is not
even tracked (see :func:`forward_rows`). The numpy kernel uses numpy's exp or exp2, as the rule for this CPU
(or the tune profile) says (:mod:`attnlab.kernels._kernels`); the fused kernel (:mod:`attnlab.kernels._fused`, numba) does the shift, the
exponential and the causal diagonal in one pass per row (the row sums by BLAS). The plan cuts a causal block's
diagonal tile into row strips that skip most of the hidden triangle.

Backward, FlashAttention-2's: the forward keeps only ``out`` and ``lse`` (one number per query); the
backward rebuilds each tile's weights as ``exp(s - lse)`` and never holds the grid either.

Grouped-query attention: the query heads of a group walk the same key/value head, a view of it (K and V
are never repeated); the backward's worker transposes each key head once for all the query heads it
serves, and sums dk, dv over the group in place.

Memory: the forward allocates its output and lse, and per worker one tile of scores, the scaled query
block and one tile's p v (O(block_q · (block_k + d))): the running numerator is the output itself. The
default tile shrinks until all that stays within ``EXTRA_PEAK`` (1.5) times the output
(:func:`forward_blocks`). Work is split over threads by (batch, head)
and query block (:func:`attnlab.kernels._threads.run_items`: numpy releases the GIL inside matmul and ufuncs, so
with BLAS pinned to one thread per worker two cores run two tiles at once).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import numpy as np

from ._checks import (Checked, as_float_array, as_int, as_positive_int, cap_scores, cap_slope, check_attention_args,
                      check_dout, fold, grads_like, unfold)
from . import _kernels
from ._kernels import LOG2E
from ._threads import run_items, usable_cores

# Tiles of 512 × 512: OpenBLAS (SkylakeX kernel, one thread) runs q·kᵀ (512×64 by 64×512) and p·v
# (512×512 by 512×64) at 125-140 GFLOP/s, against 110-120 for 128 × 2048; the tile (1 MiB of float32)
# stays in a core's L2 (1 MiB on Zen 4 and Skylake-SP) for exp2 and p·v. Single-threaded, n = 512 … 4096, time against torch SDPA:
# 128 × 2048 1.27-1.41x, 256 × 512 1.18-1.39x, 512 × 512 1.16-1.38x (causal with the strips below).
# These are the largest tiles: the forward's shrink to its memory budget (forward_blocks, EXTRA_PEAK).
BLOCK_Q = 512
BLOCK_K = 512
# The backward's default tiles (block_q, block_k): its five GEMMs per tile ran 3-15% faster at
# 128 × 2048 than at 512 × 512 (n = 1024, 2048, causal, forward included).
BACKWARD_BLOCKS = (128, 2048)
# A row's exp(s - shift) stays below e^30 ≈ 1e13: l and acc stay far from float32's 3e38 for any
# realistic n · |v|, and terms that underflow weigh below e^-57 of the largest.
SHIFT_SLACK = 30.0
# The forward's extra peak memory, its output included, stays within EXTRA_PEAK times the output (the issue's
# goal): its tile shrinks until every worker's scratch fits beside the output (see forward_blocks), but not
# below MIN_BLOCK a side. A tile's fixed cost (two GEMM calls, the tile step, some 15-20 µs of Python) weighs
# against its work, which shrinks with the square of the side: 128 × 128 tiles (2 MFLOP, ~20 µs of BLAS)
# took 1.15-1.32x the time of 256 × 256 at n = 256 … 2048 on 2 workers (benchmarks/tile_sizes.py), where the
# scratch is small in absolute terms (2 workers' 256 × 256 tiles: 0.75 MiB). A slower machine (AVX2) spends
# longer on the same work, so the fixed cost weighs less there.
EXTRA_PEAK = 1.5
MIN_BLOCK = 256
# A causal block's diagonal tile runs in strips of 128 rows (see Plan.tiles). A strip costs a fixed
# overhead (two GEMM calls, the tile step, Python) and wastes about rows²/2 · d_head of hidden scores, so
# the best height grows as the overhead weighs more: against 64 rows with the fused kernel, 2 workers,
# 12 heads, d_head 64 (benchmarks/tile_sizes.py, median of per-round ratios), 128 rows took float32
# 0.87 / 0.90 / 0.97 / 0.96 / 0.96 / 0.98 of the time at n = 256 / 512 / 1024 / 2048 / 4096 / 8192 and
# float64 0.95 / 0.96 / 0.99 / 1.00 / 0.98 / 1.01; d_head 32: 0.87-0.93, d_head 128: 0.90-0.99 (n = 256 …
# 2048). (Earlier, single-threaded with the numpy kernel, 64 was 1-4% faster than 128 at n = 1024 … 4096.)
DIAGONAL_ROWS = 128
# The numpy forward works in the base of numpy's exp or exp2, whichever the rule picks for this CPU
# (attnlab.kernels._kernels.numpy_exp: exp2 where numpy vectorises it, with AVX-512) or the tune profile; for
# exp2, log₂e is folded into the scale of q, so no pass over the tile pays for it. The fused kernel
# (attnlab.kernels._fused) always works in base 2.


@dataclass(frozen=True)
class Plan:
    """Which tiles of the (n_q, n_k) grid are computed, and which need a mask."""
    n_q: int
    n_k: int
    block_q: int
    block_k: int
    is_causal: bool = False
    window: int | None = None   # with is_causal: only the last `window` keys up to each query
    q_offset: int | None = None  # the key index query 0 sits at; None: n_k - n_q (bottom-right)

    def __post_init__(self):
        as_positive_int("block_q", self.block_q)
        as_positive_int("block_k", self.block_k)
        as_positive_int("window", self.window, allow_none=True)
        if self.q_offset is not None:
            as_int("q_offset", self.q_offset)
        if self.window is not None and not self.is_causal:
            raise ValueError(f"window={self.window} needs is_causal=True: it keeps the last `window` keys "
                             "up to each query")

    @property
    def offset(self) -> int:
        """Query i sits at key index i + offset (``q_offset``; by default bottom-right alignment)."""
        return self.n_k - self.n_q if self.q_offset is None else self.q_offset

    def query_blocks(self) -> list[tuple[int, int]]:
        return [(i0, min(i0 + self.block_q, self.n_q)) for i0 in range(0, self.n_q, self.block_q)]

    def key_span(self, i0: int, i1: int) -> tuple[int, int]:
        """The keys [lo, hi) that some query in [i0, i1) may see: tiles outside are skipped."""
        lo, hi = 0, self.n_k
        if self.is_causal:
            hi = min(hi, i1 + self.offset)                                  # the last query's position + 1
            if self.window is not None:
                lo = max(0, i0 + self.offset - self.window + 1)             # the first query's window
        return lo, max(lo, hi)

    def key_blocks(self, i0: int, i1: int) -> list[tuple[int, int]]:
        lo, hi = self.key_span(i0, i1)
        return [(j0, min(j0 + self.block_k, hi)) for j0 in range(lo, hi, self.block_k)]

    def tiles(self, i0: int, i1: int) -> list[tuple[int, int, int, int]]:
        """The forward's tiles ``(r0, r1, j0, j1)``, rows [r0, r1) of query block [i0, i1) against keys
        [j0, j1): every key block, but a causal block's last one, which holds the diagonal, is split into
        row strips of ``DIAGONAL_ROWS``, each ending at its own last query's keys: so the strips skip most
        of the triangle that causality hides (all but DIAGONAL_ROWS²/2 per strip). A strip that sees no key
        in that block is left out, unless no earlier block started its rows."""
        blocks = self.key_blocks(i0, i1)
        tiles = [(i0, i1, j0, j1) for j0, j1 in blocks]
        if self.is_causal and blocks:
            j0, j1 = blocks.pop()
            strips = [(r0, min(r0 + DIAGONAL_ROWS, i1)) for r0 in range(i0, i1, DIAGONAL_ROWS)]
            ends = [min(j1, r1 + self.offset) for r0, r1 in strips]          # each strip's last key + 1
            if blocks or ends[0] > j0:          # a strip that sees no key here was started by an earlier tile
                tiles[-1:] = [(r0, r1, j0, end) for (r0, r1), end in zip(strips, ends) if end > j0]
        return tiles

    def n_scores(self, i0: int, i1: int) -> int:
        """How many scores the query block computes: its cost, to hand out the big blocks first."""
        lo, hi = self.key_span(i0, i1)
        return (i1 - i0) * (hi - lo)

    def hidden(self, rows: np.ndarray, cols: np.ndarray, out=None) -> np.ndarray:
        """(len(rows), len(cols)) bool, True where causality (or the window) hides key ``cols`` from query
        ``rows``: ahead of the query's absolute position ``row + offset``, or out of its window."""
        pos_q = rows[:, None] + self.offset                                 # (r, 1) absolute positions
        pos_k = cols[None, :]                                               # (1, c)
        out = np.greater(pos_k, pos_q, out=out)                             # (r, c) no peeking ahead
        if self.window is not None:
            out |= pos_k <= pos_q - self.window                             # (r, c) outside the window
        return out

    def tile_drop(self, i0, i1, j0, j1, keep: np.ndarray | None, buf: "Scratch"):
        """Where tile [i0:i1, j0:j1] is masked: ``(c, drop)`` with ``drop`` (bq, bk - c) True where a score
        in columns c: is dropped (columns :c are all visible), or None when the whole tile is visible.
        Only the tile's diagonal part pays for a causal mask."""
        c = j1 - j0
        if self.is_causal and j1 - 1 > i0 + self.offset:
            c = max(0, i0 + self.offset + 1 - j0)                          # keys after the first query
        if keep is not None or (self.is_causal and self.window is not None
                                and j0 <= i1 - 1 + self.offset - self.window):
            c = 0                                                          # a dense mask, or the window's edge
        if c == j1 - j0:
            return None
        if c > 0 and keep is None and self.window is None:
            # key j0 + c + jj sits 1 + jj - ii after query i0 + ii: always the same triangle, jj >= ii
            return c, buf.triangle(i1 - i0, j1 - j0 - c)                   # (bq, bk - c)
        drop = buf.drop(i1 - i0, j1 - j0 - c)                              # (bq, bk - c)
        if self.is_causal:
            self.hidden(np.arange(i0, i1), np.arange(j0 + c, j1), out=drop)   # (bq, bk - c)
            if keep is not None:
                np.less_equal(keep[i0:i1, j0 + c:j1], drop, out=drop)      # (bq, bk - c) drop | ~keep
        else:
            np.logical_not(keep[i0:i1, j0 + c:j1], out=drop)               # (bq, bk - c)
        return c, drop


class Scratch:
    """One worker's buffers, allocated once and reused for every tile (allocating per tile costs
    page faults). ``tile(buf, rows, cols)`` hands out a contiguous (rows, cols) view of a flat buffer.

    The forward's buffers are those :meth:`forward_bytes` counts: one tile of scores, the scaled query block
    and one tile's p v. Its running numerator is the output itself, its keys are read as ``k.T`` (a BLAS
    transpose flag, measured 1-2% slower than a transposed copy: not worth d_k · n_k per worker), and the
    masks' buffers are made on the first tile that needs one (the fused kernel's causal diagonal needs
    none). The backward adds its own (``backward=True``)."""

    def __init__(self, plan: Plan, d_k: int, d_v: int, dtype, *, backward: bool = False):
        bq, bk = min(plan.block_q, plan.n_q), min(plan.block_k, plan.n_k)
        self.s = np.empty(bq * bk, dtype)               # scores, then weights, of one tile
        self.qs = np.empty((bq, d_k), dtype)            # the query block, scaled
        self.pv = np.empty((bq, d_v), dtype)            # one tile's p v, added to the running numerator
        self.l = np.empty(bq, dtype)                    # running sum
        self.ones = np.ones(bk, dtype)                  # row sums as a matrix-vector product: 4x numpy's sum
        self._drop = np.empty(0, bool)                  # a tile's mask, grown on first use
        self._triangle = np.empty((0, 0), bool)         # the causal diagonal's mask, True = dropped, grown
        self.head = None                                # which (batch, head) key_norm (and kT) belong to
        self.key_norm = np.inf                          # the current head's largest ‖k_j‖
        if backward:
            self.dp = np.empty(bq * bk, dtype)          # dL/da, then dL/ds, of one tile
            self.dq = np.empty((bq, d_k), dtype)        # one tile's ds k
            self.tmp_k = np.empty((bk, max(d_k, d_v)), dtype)   # one tile's aᵀ dout or dsᵀ q
            self.kT = np.empty((d_k, plan.n_k), dtype)  # the current head's keys and values, transposed
            self.vT = np.empty((d_v, plan.n_k), dtype)

    @staticmethod
    def forward_bytes(block_q: int, block_k: int, d_k: int, d_v: int, itemsize: int) -> int:
        """What one worker's forward scratch holds, in bytes, for tiles of block_q × block_k (the masks'
        buffers aside: a dense mask's is block_q · block_k bools, the numpy kernel's causal triangle at most
        DIAGONAL_ROWS² bools when block_q <= block_k)."""
        return itemsize * (block_q * block_k + block_q * (d_k + d_v + 1) + block_k)

    def tile(self, buf: np.ndarray, rows: int, cols: int) -> np.ndarray:
        return buf[:rows * cols].reshape(rows, cols)

    def drop(self, rows: int, cols: int) -> np.ndarray:
        """A (rows, cols) bool buffer for a tile's mask."""
        if self._drop.size < rows * cols:
            self._drop = np.empty(rows * cols, bool)
        return self.tile(self._drop, rows, cols)

    def triangle(self, rows: int, cols: int) -> np.ndarray:
        """(rows, cols) bool, True where column jj >= row ii: the causal diagonal's dropped scores."""
        if self._triangle.shape[0] < rows or self._triangle.shape[1] < cols:
            size = max(rows, cols, *self._triangle.shape)
            self._triangle = np.empty((size, size), bool)       # (size, size) row by row: np.triu and a
            for i in range(size):                                # broadcast >= allocate 3-9x the triangle
                self._triangle[i, :i], self._triangle[i, i:] = False, True     # in temporaries
        return self._triangle[:rows, :cols]

    def key_norm_of(self, head, k: np.ndarray) -> float:
        """max_j ‖k_j‖ of ``head`` (n_k, d_k), computed once per head that this worker visits."""
        if self.head != head:
            self.key_norm = max_row_norm(k)
            self.head = head
        return self.key_norm

    def keys_transposed(self, head, k: np.ndarray) -> np.ndarray:
        """kᵀ (d_k, n_k) of ``head``, copied once per head that this worker visits (the backward's); sets
        ``key_norm``."""
        if self.head != head:
            np.copyto(self.kT, k.T)
        self.key_norm_of(head, k)
        return self.kT


def max_row_norm(x: np.ndarray) -> float:
    """max_i ‖x_i‖ over the rows of x (n, d); 0 for no rows."""
    return float(np.sqrt(np.einsum("ij,ij->i", x, x).max(initial=0)))     # (n,) squared norms, then one


# ----------------------------------------------------------------------------------------------------
# forward


def tiled_attention(query, key, value, *, mask=None, is_causal=False, window=None, q_offset=None, scale=None,
                    softcap=None, block_q=None, block_k=None, return_lse=False, check_finite=True, workers=None):
    """Scaled dot-product attention computed tile by tile with the online softmax; same result as
    :func:`attnlab.kernels.attention` without ever allocating the (n_q, n_k) grid.

    The tiled kernel's own entry, with its tile sizes, for the tests and benchmarks that study them. It is not
    a public door: callers use ``attention(..., implementation="tiled")`` (with ``return_lse=True`` for the lse).

    Parameters
    ----------
    query, key, value, mask, is_causal, scale, softcap, check_finite
        As in :func:`attnlab.kernels.attention`: leading axes broadcast, ``mask`` is bool with True = may attend
        (a key-padding mask (..., 1, n_k) stays a broadcast view; a dense one is sliced per tile),
        causal alignment is bottom-right.
    window : int, optional
        With ``is_causal``: each query sees only the last ``window`` keys up to itself (sliding window,
        as ``causal_mask(..., window=)``). Tiles outside the window are skipped.
    q_offset : int, optional
        The key index that query 0 sits at (default ``n_k - n_q``, bottom-right): query ``i`` may see key
        ``j`` when ``j <= i + q_offset`` (causal) and ``j > i + q_offset - window``. A query that sees no key
        gets output 0 and lse ``-inf``.
    block_q, block_k : int, optional
        Tile size: queries per block and keys per block (default ``BLOCK_Q`` = ``BLOCK_K`` = 512).
    return_lse : bool
        Also return ``lse = log Σ_j exp(s_j)`` per query (..., n_q), ``-inf`` for a query that sees no key.
    workers : int, optional
        Threads (default: the usable cores). More than one needs threadpoolctl, to pin BLAS to one
        thread per worker; without it the work runs on one thread.

    Returns
    -------
    out : (..., n_q, d_v) in the inputs' dtype (float16 is computed in float32)
    lse : (..., n_q) in the compute dtype, only with ``return_lse=True``

    Raises
    ------
    ValueError, TypeError
        As :func:`attnlab.kernels.attention` does; also for a block size or ``workers`` that is not a positive
        int, and a ``window`` without ``is_causal``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 7, 4)), rng.normal(size=(2, 7, 3))
    >>> from attnlab import attention
    >>> np.allclose(tiled_attention(q, k, v, is_causal=True, block_q=2, block_k=3),
    ...             attention(q, k, v, is_causal=True))
    True
    """
    c = check_attention_args(query, key, value, mask=mask, is_causal=is_causal, window=window, q_offset=q_offset,
                             scale=scale, softcap=softcap, require_finite=check_finite)
    out, lse = tiled_forward(c, make_plan(c, block_q=block_q, block_k=block_k, workers=workers), workers=workers)
    out = out.astype(c.out_dtype, copy=False)
    return (out, lse) if return_lse else out


def make_plan(c: Checked, *, block_q=None, block_k=None, default=None, workers=None) -> Plan:
    """The tiles for c's shapes and causal mask; a block size left None takes its ``default`` (the module's
    BLOCK_Q, BLOCK_K, read at call time), and the forward's default (``default`` None) shrinks to the memory
    budget (:func:`forward_blocks`; ``workers`` as the forward will run)."""
    n_q, n_k = c.q.shape[-2], c.k.shape[-2]
    if default is None:
        default = forward_blocks(c, usable_cores() if workers is None else as_positive_int("workers", workers))
    return Plan(n_q=n_q, n_k=n_k, block_q=default[0] if block_q is None else block_q,
                block_k=default[1] if block_k is None else block_k, is_causal=c.is_causal, window=c.window,
                q_offset=c.q_offset)


def forward_blocks(c: Checked, workers: int) -> tuple[int, int]:
    """The forward's tile (block_q, block_k): BLOCK_Q × BLOCK_K (at most n_q × n_k), halved along its longer
    side, queries first, while the workers' scratch together exceeds what ``EXTRA_PEAK`` leaves beside the
    output and lse, down to ``MIN_BLOCK`` a side."""
    n_q, n_k, d_k, d_v = c.q.shape[-2], c.k.shape[-2], c.q.shape[-1], c.v.shape[-1]
    heads, item = int(np.prod(c.batch, dtype=np.int64)), c.q.dtype.itemsize
    out_bytes = heads * n_q * d_v * item                               # the output
    budget = (EXTRA_PEAK - 1) * out_bytes - heads * n_q * item         # what the output and lse leave
    bq, bk = min(BLOCK_Q, max(n_q, 1)), min(BLOCK_K, max(n_k, 1))
    while max(bq, bk) > MIN_BLOCK:
        busy = min(workers, heads * -(-n_q // bq))                      # workers that get a work item
        if busy * (Scratch.forward_bytes(bq, bk, d_k, d_v, item) + DIAGONAL_ROWS**2) <= budget:
            break
        if bq >= bk:
            bq = max(MIN_BLOCK, bq // 2)
        else:
            bk = max(MIN_BLOCK, bk // 2)
    return bq, bk


def tiled_forward(c: Checked, plan: Plan, *, workers=None, kernel=None) -> tuple[np.ndarray, np.ndarray]:
    """The online softmax over every (batch, head) and query block; returns (out, lse) in the compute dtype,
    (..., h, n_q, d_v) and (..., h, n_q). ``kernel``: "fused" (numba) or "numpy"; None: the size rule
    (:func:`attnlab.kernels._kernels.kernel_choice`) decides, as the front door's does."""
    if kernel is None:
        kernel = _kernels.tile_kernel(int(np.prod(c.batch, dtype=np.int64)) * plan.n_q * plan.n_k,
                                      masked=c.is_causal or c.keep is not None)
    g = group_view(c)
    d_k, d_v = g.q.shape[-1], g.v.shape[-1]
    tile = tile_step(kernel)
    out = np.empty((*g.batch, plan.n_q, d_v), g.q.dtype)    # (..., h_kv, g, n_q, d_v)
    lse = np.empty((*g.batch, plan.n_q), g.q.dtype)         # (..., h_kv, g, n_q)
    # head by head, so a worker finds each key head's largest norm once; biggest blocks first within a head
    blocks = sorted(plan.query_blocks(), key=lambda b: -plan.n_scores(*b))
    tiles = {b: plan.tiles(*b) for b in blocks}             # each query block's tiles, the same for every head
    items = [(idx, i0, i1) for idx in np.ndindex(g.batch) for i0, i1 in blocks]
    if not items:                                           # no query (n_q = 0) or an empty batch: nothing to run
        return out.reshape(*c.batch, plan.n_q, d_v), lse.reshape(*c.batch, plan.n_q)

    def work(item, buf):
        idx, i0, i1 = item
        buf.key_norm_of(g.key_head(idx), g.k[idx])
        forward_rows(g.q[idx], g.k[idx], g.v[idx], None if g.keep is None else g.keep[idx], plan, c.scale, i0, i1,
                     out[idx], lse[idx], buf, tile, softcap=c.softcap, tiles=tiles[i0, i1])

    run_items(items, work, lambda: Scratch(plan, d_k, d_v, g.q.dtype), workers)
    return out.reshape(*c.batch, plan.n_q, d_v), lse.reshape(*c.batch, plan.n_q)   # (..., h, n_q, d_v), (..., h, n_q)


class NumpyTile:
    """The numpy tile step: mask, shift, exponential (numpy's exp or exp2, whichever this machine runs
    faster) and row sum, each a pass over the tile."""
    fused = False

    def __init__(self, exp: _kernels.ExpChoice):
        self.unit, self.exp, self.log = exp.unit, exp.fn, exp.log

    def __call__(self, s, plan, r0, r1, j0, j1, keep, m, shift, l, acc, first, bounded, buf):
        masked = plan.tile_drop(r0, r1, j0, j1, keep, buf)
        if masked is not None:
            col, drop = masked
            np.copyto(s[:, col:], -np.inf, where=drop)          # (br, bk) masked scores drop out
        if not bounded:
            m[:], shift[:] = move_shift(s, m, shift, l, acc, rescale=not first, exp=self.exp, unit=self.unit)
        p = self.exp(s, out=s)                                  # (br, bk) p = exp(s - shift) in the unit's base
        if first:
            np.matmul(p, buf.ones[:j1 - j0], out=l)             # (br,) l = rowsum p
        else:
            l += p @ buf.ones[:j1 - j0]                         # (br,) l += rowsum p
        return p

    def exp_rows(self, s, shift):
        """The backward's weights in place: s (br, bk) natural scores, shift (br,): exp(s - shift)."""
        s -= shift[:, None]                                     # (br, bk)
        if self.unit != 1.0:
            s *= self.unit                                      # (br, bk) to the faster exponential's base
        return self.exp(s, out=s)                               # (br, bk)


class FusedTile:
    """The numba tile step (:func:`attnlab.kernels._fused.tile_softmax`): shift, exponential, the causal diagonal
    and window in one pass per row; base 2; the row sums by BLAS, as the numpy step's. A dense mask is still
    applied by numpy first."""
    fused = True
    unit, exp, log = LOG2E, np.exp2, np.log2

    def __init__(self, module):
        self.module = module    # looked up at each call: after its first, FromCache hands out the kernel itself

    def __call__(self, s, plan, r0, r1, j0, j1, keep, m, shift, l, acc, first, bounded, buf):
        if keep is not None:
            drop = np.logical_not(keep[r0:r1, j0:j1], out=buf.drop(r1 - r0, j1 - j0))   # (br, bk)
            np.copyto(s, -np.inf, where=drop)                   # (br, bk) the dense mask's dropped scores
        far = plan.n_q + plan.n_k + 1                           # no bound
        hi0 = r0 + plan.offset + 1 - j0 if plan.is_causal else far          # row r sees columns < hi0 + r
        lo0 = r0 + plan.offset - plan.window + 1 - j0 if plan.window is not None else -far   # and >= lo0 + r
        self.module.tile_softmax(s, m, shift, l, acc, hi0, lo0, first, not bounded)
        if first:
            np.matmul(s, buf.ones[:j1 - j0], out=l)             # (br,) l = rowsum p (a written order: BLAS's)
        else:
            l += s @ buf.ones[:j1 - j0]                         # (br,) l += rowsum p
        return s

    def exp_rows(self, s, shift):
        """The backward's weights in place, exp(s - shift), in one pass (:func:`attnlab.kernels._fused.exp_minus_rows`)."""
        self.module.exp_minus_rows(s, shift, s.dtype.type(LOG2E))
        return s


def tile_step(kernel: str):
    """The tile step of ``kernel`` ("fused" or "numpy"; the numpy one with :func:`attnlab.kernels._kernels.numpy_exp`'s
    exponential); "fused" without numba raises ValueError."""
    return _tile_step(kernel, _kernels.numpy_exp() if kernel == "numpy" else None)


@functools.cache
def _tile_step(kernel: str, exp):
    if kernel == "numpy":
        return NumpyTile(exp)
    if kernel == "fused":
        module = _kernels.fused_module()
        if module is None:
            raise ValueError("kernel='fused' needs numba (pip install 'attnlab[fast]'), which is not installed")
        return FusedTile(module)
    raise ValueError(f"kernel must be 'fused' or 'numpy', got {kernel!r}")


def forward_rows(q, k, v, keep, plan: Plan, scale: float, i0: int, i1: int, out, lse, buf: Scratch,
                 tile=None, softcap: float | None = None, tiles=None) -> None:
    """Rows i0:i1 of one (batch, head): the online softmax over the key blocks they may see.

    q (n_q, d_k), k (n_k, d_k), v (n_k, d_v), keep (n_q, n_k) or None; writes out[i0:i1] (the running
    numerator ``acc`` until the last tile) and lse[i0:i1]; ``buf.key_norm`` is this head's largest ‖k_j‖.
    ``tile`` is the tile step (:class:`NumpyTile` or :class:`FusedTile`; default the numpy one). ``softcap``
    caps each tile's scores (``cap · tanh(s / cap)``, in the tile's unit) before the mask. ``tiles``: the
    block's ``plan.tiles(i0, i1)`` when the caller has them (every head's block has the same).

    Each row subtracts a reference ``shift`` before exp. Any shift gives the same out = acc / l and
    lse = shift + log l; it only has to keep exp(s - shift) from overflowing. So a row keeps shift = 0
    while its running max m stays within ``SHIFT_SLACK`` of it, and then the tile needs neither the
    subtraction pass nor a rescale; the shift moves to m (and what came before is rescaled) only when
    m leaves that band (FlashAttention-4 rescales only past a threshold in the same way). When
    ‖q_i‖ · max_j ‖k_j‖ · scale bounds every score of the block within the band, m is not tracked at all.
    """
    tile = tile_step("numpy") if tile is None else tile
    bq, unit = i1 - i0, tile.unit
    qs = np.multiply(q[i0:i1], scale * unit, out=buf.qs[:bq])   # (bq, d_k) queries, scaled once: s = qs kᵀ
    # |s_ij| <= ‖qs_i‖ ‖k_j‖ (Cauchy-Schwarz): within the band for every row, shift stays 0 and the
    # running max is never needed (inputs of unit scale, the common case, skip that pass on every tile)
    bounded = max_row_norm(qs) * buf.key_norm <= SHIFT_SLACK * unit
    bounded |= softcap is not None and softcap <= SHIFT_SLACK   # |cap · tanh| < cap bounds them too
    cap_u = None if softcap is None else softcap * unit        # the cap in the tile's unit
    m = np.full(bq, -np.inf, q.dtype)                           # (bq,) running max of s
    shift = np.zeros(bq, q.dtype)                               # (bq,) what the exponential's argument lost
    l = buf.l[:bq]                                              # (bq,) running sum Σ exp(s - shift)
    acc = out[i0:i1]                                            # (bq, d_v) running numerator, in place
    tiles = plan.tiles(i0, i1) if tiles is None else tiles
    if not tiles:
        l.fill(0)                                               # no key at all: out = 0, lse = -inf
        acc.fill(0)
    for r0, r1, j0, j1 in tiles:
        rows, first = slice(r0 - i0, r1 - i0), j0 == tiles[0][2]    # the tile's rows; is it their first?
        s = np.matmul(qs[rows], k[j0:j1].T, out=buf.tile(buf.s, r1 - r0, j1 - j0))     # (br, bk) s · unit
        cap_scores(s, cap_u)                                    # (br, bk) cap · tanh(s / cap), or s
        p = tile(s, plan, r0, r1, j0, j1, keep, m[rows], shift[rows], l[rows], acc[rows], first, bounded, buf)
        if first:
            np.matmul(p, v[j0:j1], out=acc[rows])               # (br, d_v) acc = p vⱼ
        else:
            acc[rows] += np.matmul(p, v[j0:j1], out=buf.pv[:r1 - r0])   # (br, d_v) acc += p vⱼ
    seen = l > 0                                                # (bq,) False: the query saw no key
    safe = np.where(seen, l, 1)                                 # (bq,) l, or 1 where it is 0
    np.divide(acc, safe[:, None], out=acc)                      # (bq, d_v) out = acc / l, or 0
    lse_u = shift + tile.log(safe)                              # (bq,) log Σ_j exp(s) in the unit's base
    lse[i0:i1] = np.where(seen, lse_u / unit, -np.inf)          # (bq,) lse = log Σ_j exp(s)


def move_shift(s, m, shift, l, acc, *, rescale: bool, exp=np.exp2, unit=LOG2E):
    """For rows whose scores are not bounded: fold the tile's scores s (bq, bk) (natural scores times
    ``unit``, for ``exp`` of that base) into the running max m (bq,), move the reference ``shift`` (bq,) of
    rows whose max left the ±SHIFT_SLACK band, rescaling the running sum l (bq,) and accumulator acc
    (bq, d_v) that came before (``rescale``), and subtract the shift from s in place. Returns (m, shift)."""
    m = np.maximum(m, s.max(axis=1))                            # (bq,) m' = max(m, rowmax s)
    move = np.abs(m - shift) > SHIFT_SLACK * unit               # (bq,) rows whose max left the band
    move &= m > -np.inf                                         # (a row with no key yet keeps shift 0)
    if move.any():
        new_shift = np.where(move, m, shift)                    # (bq,)
        if rescale:
            alpha = exp(np.minimum(shift - new_shift, 0))       # (bq,) base^(shift - shift'): rescale what
            l *= alpha                                          # came before (1 where unmoved; a
            acc *= alpha[:, None]                               # moving-down row had nothing yet)
        shift = new_shift
    if shift.any():
        s -= shift[:, None]                                     # (bq, bk)
    return m, shift


def attention_weights_rows(query, key, lse, rows, *, mask=None, is_causal=False, window=None, q_offset=None,
                           scale=None, softcap=None):
    """The exact attention weights of chosen query rows, rebuilt from ``lse`` without the rest of the grid.

    ``a[i, j] = exp(s[i, j] - lse[i])`` with ``s = q kᵀ · scale`` (masked scores -inf): the softmax's
    normaliser is already in lse, so one row costs one row of scores. To look at one row of a
    32k-token grid: ``out, lse = attention(q, k, v, is_causal=True, return_lse=True)``, then
    ``attention_weights_rows(q, k, lse, [31_000], is_causal=True)``. For chosen heads, index the head axis
    of ``query``, ``key`` and ``lse`` alike (``q[..., [3, 7], :, :]``, ``lse[..., [3, 7], :]``).

    Parameters
    ----------
    query, key, mask, is_causal, window, q_offset, scale, softcap
        As given to :func:`attnlab.kernels.attention.attention`.
    lse : float array (..., n_q)
        As returned by ``attention(..., return_lse=True)``.
    rows : int or sequence of int
        Query indices in 0 … n_q − 1 (negative counts from the end).

    Returns
    -------
    (..., len(rows), n_k) weights in the inputs' dtype; each row sums to 1, or is 0 for a query that saw
    no key.

    Raises
    ------
    TypeError
        When ``rows`` is not an int or a non-empty sequence of ints, and as :func:`tiled_attention` does.
    ValueError
        When a row is out of range or ``lse`` is not one number per query, and as :func:`tiled_attention`.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.normal(size=(6, 4)), rng.normal(size=(6, 4)), rng.normal(size=(6, 2))
    >>> from attnlab import attention
    >>> out, lse = attention(q, k, v, is_causal=True, return_lse=True)
    >>> attention_weights_rows(q, k, lse, [1], is_causal=True).round(3)
    array([[0.366, 0.634, 0.   , 0.   , 0.   , 0.   ]])
    >>> from attnlab import attention_weights
    >>> a = attention_weights(q, k, is_causal=True)
    >>> np.allclose(attention_weights_rows(q, k, lse, [1, 4], is_causal=True), a[[1, 4]])
    True
    """
    c = check_attention_args(query, key, key, mask=mask, is_causal=is_causal, window=window, q_offset=q_offset,
                             scale=scale, softcap=softcap)
    plan = make_plan(c)
    rows = as_rows("rows", rows, plan.n_q)                            # (r,)
    lse = as_float_array("lse", lse)
    if lse.shape != (*c.batch, plan.n_q):
        raise ValueError(f"lse must have shape {(*c.batch, plan.n_q)} (one per query), got {lse.shape}")
    q_r = fold(c.q[..., rows, :], c.groups)                           # (..., h_kv, g·r, d_k)
    s = unfold(q_r @ np.swapaxes(c.k, -1, -2), c.groups)              # (..., h, r, n_k)
    s *= c.scale                                                      # (..., h, r, n_k) s = q kᵀ · scale
    cap_scores(s, c.softcap)                                          # (..., h, r, n_k) capped, or s
    if plan.is_causal:
        s[..., plan.hidden(rows, np.arange(plan.n_k))] = -np.inf      # (..., r, n_k)
    if c.keep is not None:
        s = np.where(c.keep[..., rows, :], s, -np.inf)                # (..., r, n_k)
    lse_r = lse[..., rows, None].astype(s.dtype)                      # (..., r, 1)
    s -= np.where(lse_r == -np.inf, np.inf, lse_r)                    # a query that saw no key: exp gives 0
    return np.exp(s, out=s).astype(c.out_dtype, copy=False)          # (..., r, n_k) a = exp(s - lse)


def as_rows(name: str, rows, n: int) -> np.ndarray:
    """Row indices as an int array (r,), each in -n … n-1; raise naming the argument otherwise."""
    arr = np.atleast_1d(np.asarray(rows))
    if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must be an int or a non-empty sequence of ints, got {rows!r}")
    if arr.min() < -n or arr.max() >= n:
        raise ValueError(f"{name} must lie in -{n} … {n - 1} (there are {n} queries), got {arr.tolist()}")
    return arr % n


# ----------------------------------------------------------------------------------------------------
# backward


def tiled_attention_grad(query, key, value, dout, *, mask=None, is_causal=False, window=None, q_offset=None,
                         scale=None, softcap=None, block_q=None, block_k=None, workers=None):
    """Backward of :func:`tiled_attention` (FlashAttention-2): ``(dq, dk, dv)`` of a loss whose gradient
    with respect to the output is ``dout`` (..., n_q, d_v), without the (n_q, n_k) grid.

    The forward is run once for ``out`` and ``lse``; each tile's weights are then rebuilt as
    ``exp(s - lse)``. Each gradient has the shape and dtype of its input; broadcast axes are summed back.
    Arguments as in :func:`tiled_attention`, except that ``block_q``, ``block_k`` left None take
    ``BLOCK_Q``, ``BLOCK_K`` in the forward and ``BACKWARD_BLOCKS`` (128, 2048) in the backward; given,
    both passes use them.
    """
    c = check_attention_args(query, key, value, mask=mask, is_causal=is_causal, window=window, q_offset=q_offset,
                             scale=scale, softcap=softcap)
    do = check_dout(c, dout)                                    # (..., h, n_q, d_v)
    _, saved = tiled_forward_saved(c, (query, key, value), block_q=block_q, block_k=block_k, workers=workers)
    grads = tiled_backward(c, saved.plan, saved.out, saved.lse, do, workers=workers)
    return grads_like(grads, (query, key, value))


@dataclass(frozen=True, eq=False)
class TiledSaved:
    """What the tiled forward keeps for its backward: one log-sum-exp per query, never the grid."""
    c: Checked
    inputs: tuple            # the caller's query, key, value: the gradients take their shapes and dtypes
    out: np.ndarray          # (..., h, n_q, d_v) in the compute dtype
    lse: np.ndarray          # (..., h, n_q) log Σ_j exp(s_j), -inf for a query that sees no key
    plan: Plan               # the backward's tiles: the forward's grid and mask in BACKWARD_BLOCKS
    kernel: str | None = None  # the tile kernel the forward ran ("fused" or "numpy"), for the backward too


def tiled_forward_saved(c: Checked, inputs: tuple, *, block_q=None, block_k=None, workers=None,
                        kernel=None) -> tuple[np.ndarray, TiledSaved]:
    """The forward of a training step: ``out`` (..., h, n_q, d_v) in the compute dtype, and what
    :func:`tiled_backward` needs. The backward's plan has the same grid and mask, in its own default tiles
    (``BACKWARD_BLOCKS``) where none was given."""
    plan = make_plan(c, block_q=block_q, block_k=block_k, workers=workers)
    back = make_plan(c, block_q=block_q, block_k=block_k, default=BACKWARD_BLOCKS)
    out, lse = tiled_forward(c, plan, workers=workers, kernel=kernel)   # (..., h, n_q, d_v), (..., h, n_q)
    return out, TiledSaved(c=c, inputs=inputs, out=out, lse=lse, plan=back, kernel=kernel)


def tiled_backward(c: Checked, plan: Plan, out, lse, do, *, workers=None, kernel=None):
    """FlashAttention-2's backward over every (batch, key/value head) and the query heads that use it;
    (dq, dk, dv) over the broadcast batch: dq (..., h, n_q, d_k), dk and dv (..., h_kv, n_k, ·)."""
    g = group_view(c)
    n_q, n_k, d_k, d_v = g.q.shape[-2], g.k.shape[-2], g.q.shape[-1], g.v.shape[-1]
    if kernel is None:
        kernel = _kernels.tile_kernel(int(np.prod(c.batch, dtype=np.int64)) * plan.n_q * plan.n_k,
                                      masked=c.is_causal or c.keep is not None)
    tile = tile_step(kernel)
    do = g.split(do, 2)                                 # (..., h_kv, g, n_q, d_v)
    dq = np.zeros((*g.batch, n_q, d_k), g.q.dtype)      # (..., h_kv, g, n_q, d_k)
    dk = np.empty((*g.batch[:-1], n_k, d_k), g.q.dtype)  # (..., h_kv, n_k, d_k) summed over the group
    dv = np.empty((*g.batch[:-1], n_k, d_v), g.q.dtype)  # (..., h_kv, n_k, d_v)
    # forward: out = Σ_j a_j v_j, so Σ_j a_j · dL/da_j = Σ_d out · dout: one number per query
    delta = np.einsum("...d,...d->...", g.split(out, 2), do)     # (..., h_kv, g, n_q)
    # a query that saw no key has lse = -inf and zero weights: +inf makes exp(s - lse) = 0 there
    lse = g.split(np.where(lse == -np.inf, np.inf, lse), 1)     # (..., h_kv, g, n_q)

    def work(idx, buf):
        k = g.k[idx][0]                                 # (n_k, d_k) the group's key head (a view)
        np.copyto(buf.vT, g.v[idx][0].T)                # (d_v, n_k)
        backward_head(g.q[idx], k, buf.keys_transposed(g.key_head((*idx, 0)), k), buf.vT,
                      None if g.keep is None else g.keep[idx], plan, c.scale, lse[idx], delta[idx], do[idx],
                      dq[idx], dk[idx], dv[idx], buf, tile, softcap=c.softcap)

    heads = list(np.ndindex(g.batch[:-1]))
    if heads:                                           # an empty batch: nothing to run
        run_items(heads, work, lambda: Scratch(plan, d_k, d_v, g.q.dtype, backward=True), workers)
    return dq.reshape(*c.batch, n_q, d_k), dk, dv


def backward_head(q, k, kT, vT, keep, plan: Plan, scale, lse, delta, do, dq, dk, dv, buf: Scratch,
                  tile=None, softcap=None) -> None:
    """One (batch, key/value head) and its group of g query heads: for each key block, walk the query blocks
    of every head of the group that see it (FlashAttention-2, alg. 2).

    q (g, n_q, d_k), k (n_k, d_k) and kT (d_k, n_k), vT (d_v, n_k), keep (g, n_q, n_k) or None, lse and delta
    (g, n_q), do (g, n_q, d_v); dq (g, n_q, d_k) accumulates, dk and dv (n_k, ·) are written, summed over
    the group.
    """
    qs = q * scale                                              # (g, n_q, d_k) scaled once per head
    q_blocks = plan.query_blocks()
    for j0 in range(0, plan.n_k, plan.block_k):
        j1 = min(j0 + plan.block_k, plan.n_k)
        dk_j, dv_j = dk[j0:j1], dv[j0:j1]                       # (bk, d_k), (bk, d_v) accumulated in place
        dk_j.fill(0)
        dv_j.fill(0)
        for h in range(len(qs)):                                # the query heads that share this key head
            keep_h = None if keep is None else keep[h]          # (n_q, n_k) or None
            for i0, i1 in q_blocks:
                lo, hi = plan.key_span(i0, i1)
                if j1 <= lo or j0 >= hi:
                    continue                                    # the forward skipped this tile too
                j0c, j1c = max(j0, lo), min(j1, hi)             # the part of the key block it saw
                backward_tile(qs[h], k, kT, vT, keep_h, plan, scale, lse[h], delta[h], do[h], dq[h], i0, i1,
                              j0c, j1c, dk_j[j0c - j0:j1c - j0], dv_j[j0c - j0:j1c - j0], buf, tile, softcap)


def backward_tile(qs, k, kT, vT, keep, plan, scale, lse, delta, do, dq, i0, i1, j0, j1, dk_j, dv_j,
                  buf, tile=None, softcap=None) -> None:
    """One tile's share of dq, dk, dv; each line undoes one line of :func:`forward_rows`. ``tile``: the tile
    step whose ``exp_rows`` rebuilds the weights (default the numpy one)."""
    tile = tile_step("numpy") if tile is None else tile
    bq, bk = i1 - i0, j1 - j0
    qs_i, do_i = qs[i0:i1], do[i0:i1]                           # (bq, d_k) q · scale, (bq, d_v)
    # forward: s = q kⱼᵀ · scale, masked scores -inf
    s = np.matmul(qs_i, kT[:, j0:j1], out=buf.tile(buf.s, bq, bk))          # (bq, bk)
    # forward: s = cap · tanh(s / cap) (with a soft-cap), before the mask
    slope = cap_slope(cap_scores(s, softcap), softcap)                      # (bq, bk) 1 − tanh², or None
    masked = plan.tile_drop(i0, i1, j0, j1, keep, buf)
    if masked is not None:
        col, drop = masked
        np.copyto(s[:, col:], -np.inf, where=drop)
    # forward: p = exp(s - m') normalised by l at the end, so the weights are a = exp(s - lse)
    a = tile.exp_rows(s, lse[i0:i1])                            # (bq, bk) the tile's weights exp(s - lse)
    # forward: out = a v, so dv = aᵀ dout and da = dout vᵀ
    dv_j += np.matmul(a.T, do_i, out=buf.tmp_k[:bk, :do_i.shape[1]])        # (bk, d_v)
    da = np.matmul(do_i, vT[:, j0:j1], out=buf.tile(buf.dp, bq, bk))        # (bq, bk)
    # forward: a = softmax(s), so ds = a · (da - Σ_j a·da), and Σ_j a·da = delta
    da -= delta[i0:i1, None]
    ds = np.multiply(da, a, out=da)                             # (bq, bk) zero wherever the score was masked
    if slope is not None:
        ds *= slope                                             # (bq, bk) back through the cap
    # forward: s = q kᵀ · scale, so dq = ds k · scale and dk = dsᵀ q · scale
    dq_i = np.matmul(ds, k[j0:j1], out=buf.dq[:bq])             # (bq, d_k)
    dq_i *= scale
    dq[i0:i1] += dq_i
    dk_j += np.matmul(ds.T, qs_i, out=buf.tmp_k[:bk, :qs_i.shape[1]])       # (bk, d_k)


# ----------------------------------------------------------------------------------------------------
# the batch: every query head beside the key/value head it uses


@dataclass(frozen=True, eq=False)
class GroupView:
    """q, k, v and the mask as views over the leading axes (..., h_kv, g): query head i = (i // g, i % g)
    beside key/value head i // g, which is a broadcast view (g times the same memory, never copied)."""
    batch: tuple                 # (..., h_kv, g)
    q: np.ndarray                # (..., h_kv, g, n_q, d_k)
    k: np.ndarray                # (..., h_kv, g, n_k, d_k) broadcast along g
    v: np.ndarray                # (..., h_kv, g, n_k, d_v) broadcast along g
    keep: np.ndarray | None      # (..., h_kv, g, n_q, n_k) or None
    groups: int
    k_lead: tuple                # k's own leading axes, padded to len(batch): 1 where k is broadcast

    def split(self, x: np.ndarray, tail: int) -> np.ndarray:
        """An array with the output's leading axes (..., h) and ``tail`` more, as a view over (..., h_kv, g)."""
        x = split_groups(x, self.groups, tail)                   # (..., h_kv, g, ...)
        return np.broadcast_to(x, (*self.batch, *x.shape[x.ndim - tail:]))

    def key_head(self, idx: tuple) -> tuple:
        """Which key head item ``idx`` of ``batch`` reads: the same tuple for every item that shares it."""
        return tuple(i if n > 1 else 0 for i, n in zip(idx, self.k_lead))


def split_groups(x: np.ndarray, groups: int, tail: int) -> np.ndarray:
    """(..., h, *tail) -> (..., h / groups, groups, *tail): the head axis split into its groups, a view
    (with groups = 1, a new axis of 1)."""
    h_axis = x.ndim - tail - 1
    if groups == 1:
        return np.expand_dims(x, h_axis + 1)                      # (..., h, 1, *tail)
    return x.reshape(*x.shape[:h_axis], x.shape[h_axis] // groups, groups, *x.shape[h_axis + 1:])


def group_view(c: Checked) -> GroupView:
    """The inputs as views over (..., h_kv, g) (no copies): g query heads per key/value head."""
    q5 = split_groups(c.q, c.groups, 2)                                   # (..., h_kv, g, n_q, d_k)
    k5, v5 = split_groups(c.k, 1, 2), split_groups(c.v, 1, 2)             # (..., h_kv, 1, n_k, ·)
    batch = np.broadcast_shapes(q5.shape[:-2], k5.shape[:-2], v5.shape[:-2])    # (..., h_kv, g)
    view = GroupView(batch=batch, q=np.broadcast_to(q5, (*batch, *q5.shape[-2:])),
                     k=np.broadcast_to(k5, (*batch, *k5.shape[-2:])), v=np.broadcast_to(v5, (*batch, *v5.shape[-2:])),
                     keep=None, groups=c.groups, k_lead=(1,) * (len(batch) + 2 - k5.ndim) + k5.shape[:-2])
    return view if c.keep is None else replace(view, keep=view.split(c.keep, 2))   # (..., h_kv, g, n_q, n_k)
