"""A KV cache sharded over Dask workers: a long context's keys and values never leave the workers.

Each shard is a Dask actor (a stateful object living on one worker) holding preallocated key/value
buffers of ``shard_capacity`` tokens. ``append`` writes into the last shard and opens new shards on the
least-loaded workers; ``attend`` sends q to every shard, each returns ``(out, lse)`` over its own keys,
and the client merges them by log-sum-exp (Flash-Decoding, split-K over the cache, across machines):
only q and the partial outputs cross the network.

The client's record of each shard's token range is the truth: a shard only counts tokens once every
replica has them, so a failed append (a bad argument, a lost worker, a timeout) leaves the cache as it
was. With ``replicas=2`` each shard lives on two workers and a step falls back to the second; with one,
a lost shard makes ``attend`` raise :class:`ShardLostError` naming the shard and its tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..kernels._checks import as_float_array, as_positive_float, as_positive_int, check_finite, check_flag
from .cluster import get_client, worker_addresses
from .partials import attend_part, decode_part, merge_tree


POLL_S = 0.25   # how often a wait on a worker looks whether the scheduler has declared it lost


def call(actor, method: str, *args):
    """Start an actor method call; an actor whose worker is gone raises at once, so return the error."""
    try:
        return getattr(actor, method)(*args)
    except Exception as e:
        return e


def answer(pending, holder, timeout: float):
    """The result of an actor call ``pending`` (or the error ``call`` returned), waiting at most ``timeout``
    seconds, and failing as soon as the actor's own future ``holder`` is no longer finished: the scheduler
    has declared its worker lost, while Dask would otherwise keep dialling the dead address until its
    connect timeout. Raises what the call raised, RuntimeError for a lost worker, or TimeoutError."""
    import time

    if isinstance(pending, Exception):
        raise pending
    deadline = time.monotonic() + timeout
    while True:
        try:
            return pending.result(timeout=max(0.0, min(POLL_S, deadline - time.monotonic())))
        except TimeoutError:
            if holder.status != "finished":
                raise RuntimeError(f"the scheduler declared its worker lost (actor {holder.status})") from None
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no answer within {timeout:g} s") from None


class ShardLostError(RuntimeError):
    """Every replica of a shard is gone (its workers died): the tokens it held cannot be attended to."""

    def __init__(self, shard: int, start: int, stop: int, workers: list[str], cause: str = ""):
        self.shard, self.start, self.stop, self.workers = shard, start, stop, list(workers)
        super().__init__(f"shard {shard} of the KV cache (tokens {start}–{stop - 1}) is lost: no replica "
                         f"answered on {', '.join(workers)}{' (' + cause + ')' if cause else ''}; "
                         "its keys and values are gone (use replicas=2 to survive a lost worker)")


class KVShard:
    """Lives on a worker (a Dask actor): key and value buffers (h_kv, capacity, d_head) for one shard."""

    def __init__(self, n_heads: int, capacity: int, d_head: int, dtype: str):
        self.k = np.zeros((n_heads, capacity, d_head), dtype)   # (h_kv, capacity, d_head) pages untouched
        self.v = np.zeros((n_heads, capacity, d_head), dtype)   # until written

    def write(self, start: int, key: np.ndarray, value: np.ndarray) -> int:
        """Keys and values (h_kv, t, d_head) at token ``start`` of the shard; returns t. Only the client's
        record decides which tokens count, so a write that is never recorded is simply overwritten."""
        t = key.shape[-2]
        self.k[:, start:start + t] = key                        # (h_kv, t, d_head)
        self.v[:, start:start + t] = value                      # (h_kv, t, d_head)
        return t

    def attend(self, query: np.ndarray, length: int, q_offset: int, is_causal: bool, scale: float,
               groups: int):
        """``(out, lse)`` of query (h, t, d_head) over the shard's first ``length`` tokens; query 0 sits at
        shard key ``q_offset``."""
        k, v = self.k[:, :length], self.v[:, :length]           # (h_kv, length, d_head) views
        if not is_causal or q_offset >= length - 1:             # every key visible: the decode step
            return decode_part(query.astype(np.result_type(np.float32, query, k)), k, v, scale=scale,
                               groups=groups)
        return attend_part(query, k, v, is_causal=True, window=None, q_offset=q_offset, scale=scale)


@dataclass(frozen=True)
class Shard:
    """The client's record of one shard: its first token, how many it holds, its live replicas as
    ``(worker address, actor future, actor)``, and the workers of replicas that stopped answering."""
    start: int
    length: int
    replicas: tuple = field(default=())
    lost: tuple = field(default=())

    @property
    def workers(self) -> list[str]:
        return [w for w, _, _ in self.replicas]


class ShardedKVCache:
    """One layer's keys and values held as shards on the workers of a Dask cluster.

    Parameters
    ----------
    client : distributed.Client, scheduler address or None
        As :func:`attnlab.distributed.get_client`.
    n_heads : int
        Key/value heads held (with grouped-query attention, the n_kv_heads; ``attend`` takes any multiple).
    d_head, shard_capacity : int
        Width of a head, and tokens per shard.
    dtype : float16, float32 or float64
        What the shards hold; ``append`` refuses another dtype.
    replicas : int
        Workers holding each shard (at most the number of workers). Right after a worker is lost, appends go
        on at once on the survivors: a replica the scheduler no longer lists is skipped, a replica whose
        write fails is dropped when another one wrote, and a new shard opens on the workers left.
    max_tokens : int, optional
        Refuse appends past this many tokens (default: no limit but the workers' memory).
    timeout : float
        Seconds any call to a worker may take before it counts as failed (default 30).
    """

    def __init__(self, client=None, *, n_heads, d_head, shard_capacity, dtype=np.float32, replicas=1,
                 max_tokens=None, timeout=30.0):
        self.n_heads = as_positive_int("n_heads", n_heads)
        self.d_head = as_positive_int("d_head", d_head)
        self.shard_capacity = as_positive_int("shard_capacity", shard_capacity)
        self.replicas = as_positive_int("replicas", replicas)
        self.max_tokens = as_positive_int("max_tokens", max_tokens, allow_none=True)
        self.timeout = as_positive_float("timeout", timeout)
        if np.dtype(dtype) not in (np.float16, np.float32, np.float64):
            raise TypeError(f"dtype must be float16, float32 or float64, got {np.dtype(dtype)}")
        self.dtype = np.dtype(dtype)
        self.client = get_client(client)
        n_workers = len(worker_addresses(self.client))
        if self.replicas > n_workers:
            raise ValueError(f"replicas={self.replicas} needs at least as many workers, the cluster has "
                             f"{n_workers}")
        self._shards: tuple[Shard, ...] = ()

    def __len__(self) -> int:
        return sum(s.length for s in self._shards)

    @property
    def shards(self) -> list[dict]:
        """Each shard's token range and the workers holding it."""
        return [{"shard": i, "start": s.start, "stop": s.start + s.length, "workers": s.workers}
                for i, s in enumerate(self._shards)]

    def load(self) -> dict[str, int]:
        """Tokens held per live worker (replicas counted on each of their workers)."""
        load = dict.fromkeys(worker_addresses(self.client), 0)
        for s in self._shards:
            for w in s.workers:
                if w in load:
                    load[w] += s.length
        return load

    # ------------------------------------------------------------------------------------------------

    def check_kv(self, key, value) -> tuple[np.ndarray, np.ndarray]:
        """key and value (n_heads, t, d_head) of the cache's dtype, finite, t equal; else raise."""
        expected = (self.n_heads, "t", self.d_head)
        arrays = []
        for name, x in (("key", key), ("value", value)):
            x = as_float_array(name, x, min_ndim=3)
            if x.dtype != self.dtype:
                raise TypeError(f"{name} has dtype {x.dtype}, the cache holds {self.dtype}")
            if x.ndim != 3 or x.shape[0] != self.n_heads or x.shape[2] != self.d_head:
                raise ValueError(f"{name} has shape {x.shape}, the cache expects {expected}")
            if not np.isfinite(x).all():
                raise ValueError(f"{name} must be finite to enter the cache, got NaN or inf")
            arrays.append(x)
        if arrays[0].shape[1] != arrays[1].shape[1]:
            raise ValueError(f"key has {arrays[0].shape[1]} tokens, value has {arrays[1].shape[1]}; they must match")
        return arrays[0], arrays[1]

    def append(self, key, value) -> int:
        """Add keys and values (n_heads, t, d_head) after the cached tokens; returns the new length.

        Fills the last shard, then opens shards on the least-loaded workers. All or nothing: on any
        error (bad input, a limit, a lost worker, a timeout) every shard stays as it was.
        """
        key, value = self.check_kv(key, value)
        n, t = len(self), key.shape[1]
        if self.max_tokens is not None and n + t > self.max_tokens:
            raise ValueError(f"cannot append {t} tokens: the cache holds {n} of its max_tokens {self.max_tokens}")
        load = self.load()                           # the live workers: a dead replica is skipped, not dialled
        shards = [self.without_dead(sh, load) for sh in self._shards]
        writes, opened = [], []                      # (actor future, holder, shard index, shard, worker)
        try:
            done = 0
            while done < t:
                if not shards or shards[-1].length == self.shard_capacity:
                    shards.append(self.open_shard(n + done, load))
                    opened.append(shards[-1])
                last = shards[-1]
                if not last.replicas:
                    raise ShardLostError(len(shards) - 1, last.start, last.start + last.length, list(last.lost))
                take = min(t - done, self.shard_capacity - last.length)
                for w, holder, actor in last.replicas:
                    writes.append((call(actor, "write", last.length, key[:, done:done + take],
                                        value[:, done:done + take]), holder, len(shards) - 1, last, w))
                    load[w] = load.get(w, 0) + take
                shards[-1] = replace(last, length=last.length + take)
                done += take
            failed = {}                              # shard index -> workers whose write failed, and why
            for fut, holder, i, shard, w in writes:
                try:
                    answer(fut, holder, self.timeout)
                except Exception as e:
                    failed.setdefault(i, []).append((w, e))
            for i, lost in failed.items():           # a replica that failed is dropped if another one wrote
                if len(lost) == len(shards[i].replicas):
                    w, e = lost[0]
                    raise RuntimeError(f"append of {t} tokens failed writing shard {i} (tokens {shards[i].start}–"
                                       f"{shards[i].start + self.shard_capacity - 1}) on worker {w}: "
                                       f"{type(e).__name__}: {e}; the cache is unchanged ({n} tokens)") from e
                gone = {w for w, _ in lost}
                shards[i] = replace(shards[i], replicas=tuple(r for r in shards[i].replicas if r[0] not in gone),
                                    lost=shards[i].lost + tuple(sorted(gone)))
        except BaseException:
            shards.clear()                           # the new shards' actors go with their futures (the
            opened.clear()                           # traceback would otherwise keep them alive)
            writes.clear()
            raise
        self._shards = tuple(shards)                 # the one place the cache changes
        return len(self)

    @staticmethod
    def without_dead(shard: Shard, live: dict) -> Shard:
        """``shard`` with the replicas on workers the scheduler no longer lists moved to its ``lost``."""
        dead = tuple(w for w, _, _ in shard.replicas if w not in live)
        if not dead:
            return shard
        return replace(shard, replicas=tuple(r for r in shard.replicas if r[0] in live), lost=shard.lost + dead)

    def open_shard(self, start: int, load: dict) -> Shard:
        """A new empty shard on the ``replicas`` least-loaded workers (by tokens held); right after a loss,
        when fewer workers are left, on the survivors (a shard with fewer replicas than asked, not a failure)."""
        from distributed import wait

        workers = sorted(load, key=lambda w: (load[w], w))[:self.replicas]
        if not workers:
            raise RuntimeError(f"cannot open a shard for tokens {start}–{start + self.shard_capacity - 1}: the "
                               "cluster has no worker left")
        futures = [self.client.submit(KVShard, self.n_heads, self.shard_capacity, self.d_head, self.dtype.str,
                                      actor=True, workers=[w], allow_other_workers=False, pure=False)
                   for w in workers]
        try:
            wait(futures, timeout=self.timeout)
            actors = [f.result(timeout=self.timeout) for f in futures]
        except Exception as e:
            raise RuntimeError(f"cannot open a shard for tokens {start}–{start + self.shard_capacity - 1} on "
                               f"{', '.join(workers)}: {type(e).__name__}: {e}; the cache is unchanged") from e
        return Shard(start=start, length=0, replicas=tuple(zip(workers, futures, actors)))

    # ------------------------------------------------------------------------------------------------

    def attend(self, query, *, is_causal=True, scale=None) -> np.ndarray:
        """Attention of query (h, t, d_head) — the last t tokens of the context, a decode step for t = 1 —
        over every cached token; h a multiple of the cache's n_heads (grouped-query attention).

        Returns (h, t, d_head) in the query's and cache's common dtype. Raises :class:`ShardLostError`
        when every replica of some shard is gone, naming the shard and its tokens; never a partial answer.
        """
        is_causal = check_flag("is_causal", is_causal)
        q = as_float_array("query", query, min_ndim=3)
        check_finite("query", q)                                 # as every single-process path does
        if q.ndim != 3 or q.shape[2] != self.d_head:
            raise ValueError(f"query has shape {q.shape}, the cache expects (h, t, {self.d_head})")
        if q.shape[0] == 0 or q.shape[0] % self.n_heads:
            raise ValueError(f"query has {q.shape[0]} heads (shape {q.shape}), the cache holds {self.n_heads}: "
                             f"expected {self.n_heads} or a multiple of it (grouped-query attention)")
        groups = q.shape[0] // self.n_heads                      # query heads per cached key/value head
        n, t = len(self), q.shape[1]
        if n == 0:
            raise ValueError("the cache is empty: append keys and values before attend")
        if t == 0:
            raise ValueError(f"query has no tokens, shape {q.shape}")
        q = np.ascontiguousarray(q)
        # a Python float: a numpy float64 scale would lift float32 queries to float64 on the workers, and
        # the float64 @ float32 product against the shard costs 10-50x a float32 one
        scale = float(1.0 / np.sqrt(self.d_head)) if scale is None else as_positive_float("scale", scale)
        args = [(q, s.length, n - t - s.start, is_causal, scale, groups) for s in self._shards]
        first = [call(s.replicas[0][2], "attend", *a) if s.replicas else None for s, a in zip(self._shards, args)]
        partials = []
        for i, (s, a, fut) in enumerate(zip(self._shards, args, first)):
            partials.append(self.shard_result(i, s, a, fut))
        out, _ = merge_tree(partials)                            # (h, t, d_head)
        return out.astype(np.result_type(q, self.dtype), copy=False)

    def shard_result(self, i: int, shard: Shard, args: tuple, fut):
        """Shard i's partial: from its first replica, else the next; replicas that fail are dropped."""
        causes, failed = [], []
        result = None
        for r, (w, holder, actor) in enumerate(shard.replicas):
            try:
                result = answer(fut if r == 0 else call(actor, "attend", *args), holder, self.timeout)
                break
            except Exception as e:                               # a dead worker: refused, closed, timed out
                causes.append(f"{w}: {type(e).__name__} {e}".strip())
                failed.append(r)
        if failed:                                               # later steps skip the dead replicas
            kept = tuple(rep for r, rep in enumerate(shard.replicas) if r not in failed)
            lost = shard.lost + tuple(shard.replicas[r][0] for r in failed)
            self._shards = tuple(replace(s, replicas=kept, lost=lost) if j == i else s
                                 for j, s in enumerate(self._shards))
            shard = self._shards[i]
        if result is None:
            raise ShardLostError(i, shard.start, shard.start + shard.length, list(shard.lost), "; ".join(causes))
        return result
