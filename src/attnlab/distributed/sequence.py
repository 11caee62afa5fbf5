"""Sequence-parallel attention on a Dask cluster: key shards on the workers, partials merged there by lse.

The keys and values are cut along the sequence into shards, the queries into blocks. Each visible
(query block, key shard) pair is one task, the front door's tiled path with that shard's global offset, returning
``(out, lse)``; the pairs of a query block merge pairwise on the workers (``merge_partials``) so only the
finished block reaches the client. Pairs are handed to workers longest first, each to the least loaded
one (so a causal grid's heavy early shards are shared), and each shard starts on the worker that runs
most of its pairs; Dask moves what else is needed and recomputes what a lost worker held.
"""

from __future__ import annotations

import functools
import operator
import time
import uuid

import numpy as np

from ..kernels._checks import as_positive_float, as_positive_int, check_attention_args
from .cluster import get_client, require_distributed, worker_addresses
from .partials import attend_part, merge_partials, merge_tree, pair_cost, split_even

# Query blocks per worker by default: with the pairs handed out longest first, four per worker balance
# a causal grid's triangle to within a few percent, and each task still does ≥ n/8 · shard scores.
QUERY_BLOCKS_PER_WORKER = 4
RETRIES = 2              # numpy inputs: a worker lost with scattered shards → scatter again, twice at most


def sequence_parallel_attention(query, key, value, *, client=None, shards=None, is_causal=False, window=None,
                                scale=None, return_lse=False, query_blocks=None, timeout=None, progress=None):
    """Scaled dot-product attention with the keys and values split across the workers of a Dask cluster.

    Same semantics as :func:`attnlab.attention` (``implementation="tiled"``): bottom-right causal alignment in
    global positions, a sliding ``window``, a query that sees no key gets 0 (lse −inf), grouped-query heads,
    float16/32/64.

    Parameters
    ----------
    query : (..., h, n_q, d_k), key : (..., h_kv, n_k, d_k), value : (..., h_kv, n_k, d_v)
        All numpy arrays, or all dask arrays (chunked along the sequence, axis -2): then the data goes
        from its source to the workers and never through the client, and the result is a dask array.
    client : distributed.Client, scheduler address or None
        None: the default client, else an embedded LocalCluster (see :func:`get_client`).
    shards : int, optional
        Key/value shards along the sequence. Default: one per worker (numpy), the key's own chunks (dask).
    query_blocks : int, optional
        Query blocks (default 4 per worker).
    timeout : float, optional
        Seconds to wait for the result before raising TimeoutError (numpy inputs; default: no limit).
    progress : callable(done, total), optional
        Called on the client as tasks finish (numpy inputs).

    Returns
    -------
    out (..., h, n_q, d_v) in the inputs' dtype, and with ``return_lse`` lse (..., h, n_q) in the compute
    dtype; numpy arrays for numpy inputs, dask arrays for dask inputs.

    Raises
    ------
    ValueError, TypeError
        As :func:`attnlab.attention` (``implementation="tiled"``); also for mixed numpy/dask inputs, a bad
        ``shards`` or ``query_blocks``, an unreachable scheduler (naming its address), or a cluster without workers.
    TimeoutError
        When the cluster does not finish within ``timeout``.
    RuntimeError
        When workers keep dying (Dask's KilledWorker), naming the task.
    """
    kinds = [is_dask_array(x) for x in (query, key, value)]
    if any(kinds) and not all(kinds):
        raise TypeError("query, key and value must be all numpy arrays or all dask arrays, got "
                        + ", ".join(f"{n} {'dask' if d else type(x).__name__}"
                                    for n, d, x in zip(("query", "key", "value"), kinds, (query, key, value))))
    shards = as_positive_int("shards", shards, allow_none=True)
    query_blocks = as_positive_int("query_blocks", query_blocks, allow_none=True)
    timeout = None if timeout is None else as_positive_float("timeout", timeout)
    if all(kinds):
        # (..., h, n_q, d_k), (..., h_kv, n_k, d_k), (..., h_kv, n_k, d_v): zero-stride numpy views, as the
        # checks read only shapes and dtypes (the data stays in the dask arrays)
        stand_ins = [np.broadcast_to(np.zeros((), x.dtype), x.shape) for x in (query, key, value)]
        c = check_attention_args(*stand_ins, is_causal=is_causal, window=window, scale=scale, require_finite=False)
    else:
        c = check_attention_args(query, key, value, is_causal=is_causal, window=window, scale=scale)
    client = get_client(client, timeout=min(timeout or 10.0, 10.0))
    workers = worker_addresses(client)
    n_q, n_k = c.q.shape[-2], c.k.shape[-2]
    q_parts = split_even(n_q, query_blocks or QUERY_BLOCKS_PER_WORKER * len(workers))
    opts = dict(is_causal=c.is_causal, window=c.window, scale=c.scale, offset=n_k - n_q)
    if all(kinds):
        return dask_path(client, workers, c, query, key, value, q_parts, shards, opts, return_lse)
    k_parts = split_even(n_k, shards or len(workers))
    deadline = None if timeout is None else time.monotonic() + timeout
    for attempt in range(RETRIES + 1):
        left = None if deadline is None else deadline - time.monotonic()
        try:
            if left is not None and left <= 0:
                raise DeadlinePassed(f"{attempt} attempt(s) lost workers")
            out, lse = numpy_path(client, workers, c, q_parts, k_parts, opts, left, progress)
            break
        except DeadlinePassed as e:                     # the caller's timeout: not a lost worker
            raise TimeoutError(f"sequence_parallel_attention did not finish within {timeout:g} s ({e})") from None
        except lost_data_errors() as e:
            if attempt == RETRIES:
                raise RuntimeError(f"sequence_parallel_attention lost workers {attempt + 1} times and gave up: "
                                   f"{describe(e)}") from e
            gone = getattr(e, "worker", None)           # a worker that stopped answering may still be listed
            workers = [w for w in worker_addresses(client) if w != gone] or worker_addresses(client)
    out = out.astype(c.out_dtype, copy=False)
    return (out, lse) if return_lse else out


def is_dask_array(x) -> bool:
    try:
        import dask.array as da
    except ImportError:
        return False
    return isinstance(x, da.Array)


def lost_data_errors() -> tuple:
    """What Dask raises when data a task needed was on a worker that died: its futures cancelled, a
    connection to it closed, the scheduler no longer knowing it (:class:`WorkerGone`), or an ``OSError``
    such as "Timed out trying to connect to tcp://…" when a worker killed late is still listed and Dask
    keeps dialling it until its connect timeout. (The caller's own timeout is :class:`DeadlinePassed`.)"""
    from concurrent.futures import CancelledError

    distributed = require_distributed()
    return (CancelledError, distributed.comm.CommClosedError, WorkerGone, OSError)


def describe(e: BaseException) -> str:
    """An error and its cause in one line: ``WorkerGone: worker tcp://… left (OSError: Timed out …)``."""
    cause = e.__cause__ or e.__context__
    return f"{type(e).__name__}: {e}" + (f" ({type(cause).__name__}: {cause})" if cause is not None else "")


class WorkerGone(RuntimeError):
    """A worker left (or stopped answering) between listing the workers and sending it data."""

    def __init__(self, worker: str):
        self.worker = worker
        super().__init__(f"worker {worker} left the cluster or stopped answering while its shard was sent")


class DeadlinePassed(Exception):
    """The caller's ``timeout`` ran out (raised to the caller as TimeoutError; kept apart from the
    OSError/TimeoutError of a lost worker's connection, which triggers a retry)."""


# ----------------------------------------------------------------------------------------------------
# the plan: which pairs, on which worker


def assign_pairs(n_q, n_k, q_parts, k_parts, workers, *, is_causal, window, home=None):
    """The visible pairs as ``{(b, s): worker}``, and their costs: longest first, each to the least loaded
    worker (ties: the worker already holding key shard s, per ``home``)."""
    costs = {(b, s): pair_cost(n_q, n_k, qb, ks, is_causal=is_causal, window=window)
             for b, qb in enumerate(q_parts) for s, ks in enumerate(k_parts)}
    costs = {p: c for p, c in costs.items() if c > 0}               # hidden pairs are never submitted
    load = dict.fromkeys(workers, 0)
    where = {}
    for pair in sorted(costs, key=lambda p: (-costs[p], p)):
        home_w = (home or {}).get(pair[1])
        w = min(workers, key=lambda w: (load[w], w != home_w, workers.index(w)))
        where[pair] = w
        load[w] += costs[pair]
    return where, costs


def homes(where: dict, costs: dict, index: int) -> dict:
    """Per query block (index 0) or key shard (index 1): the worker that runs most of its pairs' scores."""
    share: dict = {}
    for pair, w in where.items():
        share.setdefault(pair[index], {}).setdefault(w, 0)
        share[pair[index]][w] += costs[pair]
    return {i: max(ws, key=ws.get) for i, ws in share.items()}


def run_pair(query, key, value, *, is_causal, window, q_offset, scale):
    """A task: one (query block, key shard) pair on a worker, with the worker's own thread count."""
    threads = 1
    try:
        from distributed import get_worker
        threads = get_worker().state.nthreads
    except (ImportError, ValueError, AttributeError):
        pass
    return attend_part(query, key, value, is_causal=is_causal, window=window, q_offset=q_offset, scale=scale,
                       workers=threads)


def submit_pairs(client, where, costs, q_data, k_data, v_data, q_parts, k_parts, opts, tag):
    """Submit every visible pair and its block's merge tree; returns ``{b: future of (out, lse)}`` and the
    list of every future (for progress). Each worker runs its pairs longest first, as they were planned
    (Dask runs higher priorities first), and a merge as soon as its two partials are there."""
    by_block: dict = {}
    every = []
    order = sorted(where, key=lambda p: (-costs[p], p))
    for rank, (b, s) in enumerate(order):
        f = client.submit(run_pair, q_data[b], k_data[s], v_data[s], is_causal=opts["is_causal"],
                          window=opts["window"], q_offset=q_parts[b][0] + opts["offset"] - k_parts[s][0],
                          scale=opts["scale"], workers=[where[(b, s)]], allow_other_workers=True, pure=False,
                          priority=len(order) - rank, key=f"attnlab-pair-{tag}-q{b}-k{s}")
        by_block.setdefault(b, []).append(f)
        every.append(f)

    def submit_merge(b, x, y):                   # merges run before any pair still waiting
        every.append(client.submit(merge_partials, x, y, pure=False, priority=len(order) + 1,
                                   key=f"attnlab-merge-{tag}-q{b}-{len(every)}"))
        return every[-1]

    merged = {b: merge_tree(parts, functools.partial(submit_merge, b)) for b, parts in by_block.items()}
    return merged, every


# ----------------------------------------------------------------------------------------------------
# numpy inputs: scatter the shards, gather the finished blocks


def numpy_path(client, workers, c, q_parts, k_parts, opts, timeout, progress):
    distributed = require_distributed()
    n_q, n_k = c.q.shape[-2], c.k.shape[-2]
    where, costs = assign_pairs(n_q, n_k, q_parts, k_parts, workers, is_causal=opts["is_causal"],
                                window=opts["window"])
    q_home, k_home = homes(where, costs, 0), homes(where, costs, 1)

    def scatter(x, parts, home):
        data = {}
        for i, w in home.items():
            lo, hi = parts[i]
            part = np.ascontiguousarray(x[..., lo:hi, :])        # (..., h, hi - lo, d) a query block or key shard
            try:
                data[i] = client.scatter(part, workers=[w], hash=False,
                                         **({} if timeout is None else {"timeout": timeout}))
            except (KeyError, OSError) as e:   # unknown to the scheduler, or unreachable (a TimeoutError too)
                raise WorkerGone(w) from e
        return data

    q_data, k_data, v_data = scatter(c.q, q_parts, q_home), scatter(c.k, k_parts, k_home), \
        scatter(c.v, k_parts, k_home)
    merged, every = submit_pairs(client, where, costs, q_data, k_data, v_data, q_parts, k_parts, opts,
                                 uuid.uuid4().hex[:8])
    done = 0
    try:
        for _ in distributed.as_completed(every, timeout=timeout):
            done += 1
            if progress is not None:
                progress(done, len(every))
        results = dict(zip(merged, client.gather(list(merged.values()), errors="raise")))
    except TimeoutError:
        client.cancel(every)
        raise DeadlinePassed(f"{done} of {len(every)} tasks done on {len(workers)} workers") from None
    except distributed.KilledWorker as e:
        raise RuntimeError(f"Dask gave up on a task after it killed workers repeatedly: {e}") from None
    d_v = c.v.shape[-1]
    out = np.zeros((*c.batch, n_q, d_v), c.q.dtype)              # (..., h, n_q, d_v) unseen rows stay 0
    lse = np.full((*c.batch, n_q), -np.inf, c.q.dtype)           # (..., h, n_q) and lse -inf
    for b, (out_b, lse_b) in results.items():
        lo, hi = q_parts[b]
        out[..., lo:hi, :] = out_b                               # (..., h, bq, d_v)
        lse[..., lo:hi] = lse_b                                  # (..., h, bq)
    return out, lse


# ----------------------------------------------------------------------------------------------------
# dask inputs: the workers build the shards, the result stays a dask array


def dask_path(client, workers, c, query, key, value, q_parts, shards, opts, return_lse):
    import dask.array as da

    def along_sequence(x, sizes):
        return x.rechunk({**{i: -1 for i in range(x.ndim) if i != x.ndim - 2}, x.ndim - 2: tuple(sizes)})

    n_q, n_k = c.q.shape[-2], c.k.shape[-2]
    k_sizes = [b - a for a, b in split_even(n_k, shards)] if shards else [n for n in key.chunks[-2] if n]
    q = along_sequence(query, [b - a for a, b in q_parts])                # (..., h, n_q, d_k) a chunk per block
    k, v = along_sequence(key, k_sizes), along_sequence(value, k_sizes)  # (..., h_kv, n_k, d_k|d_v) per shard
    edges = np.cumsum([0, *k_sizes])
    k_parts = [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]
    q, k, v = client.persist([q, k, v])                                   # the same, held on the workers
    q_data, k_data, v_data = (chunk_futures(x) for x in (q, k, v))
    who = client.who_has(list(k_data.values()))
    home = {s: (who.get(f.key) or [None])[0] for s, f in k_data.items()}
    where, costs = assign_pairs(n_q, n_k, q_parts, k_parts, workers, is_causal=opts["is_causal"],
                                window=opts["window"], home=home)
    merged, _ = submit_pairs(client, where, costs, q_data, k_data, v_data, q_parts, k_parts, opts,
                             uuid.uuid4().hex[:8])
    d_v, dt = c.v.shape[-1], c.q.dtype
    outs, lses = [], []
    for b, (lo, hi) in enumerate(q_parts):
        shape = (*c.batch, hi - lo)
        if b in merged:
            out_f = client.submit(finish_out, merged[b], c.out_dtype, pure=False)
            lse_f = client.submit(operator.itemgetter(1), merged[b], pure=False)
            outs.append(da.from_delayed(out_f, (*shape, d_v), dtype=c.out_dtype))
            lses.append(da.from_delayed(lse_f, shape, dtype=dt))
        else:                                                     # a block that sees no key at all
            outs.append(da.zeros((*shape, d_v), dtype=c.out_dtype))
            lses.append(da.full(shape, -np.inf, dtype=dt))
    out = da.concatenate(outs, axis=-2)                           # (..., h, n_q, d_v)
    lse = da.concatenate(lses, axis=-1)                           # (..., h, n_q)
    return (out, lse) if return_lse else out


def finish_out(merged, dtype):
    """A task: a merged block's output in the caller's dtype."""
    return merged[0].astype(dtype, copy=False)


def chunk_futures(x) -> dict:
    """A persisted dask array chunked only along axis -2: ``{block index: future}``."""
    from distributed import futures_of

    by_key = {f.key: f for f in futures_of(x)}
    return {idx[-2]: by_key[(x.name, *idx)] for idx in np.ndindex(x.numblocks)}
