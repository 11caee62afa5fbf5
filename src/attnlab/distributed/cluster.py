"""Which Dask cluster to run on, and what it measured: the only place that starts or finds one.

``get_client(client)`` takes a ``distributed.Client``, a scheduler address (``"tcp://host:8786"``) or
None: the current default client if there is one, else an embedded ``LocalCluster`` of single-threaded
worker processes on this machine (started once, reused). Nothing else changes between the two.
"""

from __future__ import annotations

import atexit

_EMBEDDED: dict = {}   # the embedded LocalCluster and its client, started on first use


def require_distributed():
    """The ``distributed`` module, or an ImportError saying how to install it."""
    try:
        import distributed
    except ImportError as e:           # pragma: no cover - depends on the environment
        raise ImportError("attnlab.distributed needs Dask: pip install 'attnlab[distributed]' "
                          f"(dask[distributed]); {e}") from None
    return distributed


def connect(address: str, *, timeout: float = 10.0):
    """A ``distributed.Client`` on the scheduler at ``address``; fails within ``timeout`` seconds with a
    ValueError naming the address when nothing answers there, when a peer accepts the connection but never
    answers, or when it answers in another protocol ("not a Dask scheduler") — never waits forever.

    Dask bounds the TCP connect by its ``timeout`` but not the handshake that follows it, so a port that
    accepts and stays silent would hang ``Client(...)``; and it reads a frame's length from the first bytes it
    gets, so an HTTP server's reply asks for exabytes. The handshake is therefore tried first, on its own,
    under the same deadline (:func:`probe_scheduler`)."""
    distributed = require_distributed()
    if not isinstance(address, str) or not address:
        raise TypeError(f"scheduler address must be a string like 'tcp://host:8786', got {address!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    probe_scheduler(address, timeout)
    try:
        return distributed.Client(address, timeout=timeout)
    except (OSError, TimeoutError) as e:
        raise ValueError(f"cannot reach a Dask scheduler at {address} within {timeout:g} s "
                         f"(start one with `dask scheduler`): {type(e).__name__}: {e}") from None


def probe_scheduler(address: str, timeout: float) -> None:
    """Open a Dask comm to ``address`` and complete its handshake within ``timeout`` seconds, in a thread of
    its own (its own event loop: the caller may be running one); a ValueError naming the address if not."""
    import asyncio
    import concurrent.futures

    from distributed.comm import connect as comm_connect

    async def handshake():
        comm = await asyncio.wait_for(comm_connect(address, timeout=timeout), timeout)
        try:
            return comm.remote_info
        finally:
            comm.abort()

    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        info = pool.submit(asyncio.run, handshake()).result(timeout)   # the loop's cleanup may go on after
    except (OSError, TimeoutError, asyncio.TimeoutError) as e:
        silent = "accepts connections but did not answer" if isinstance(e, (TimeoutError, asyncio.TimeoutError)) \
            and "Timed out trying to connect" not in str(e) else "does not answer"
        raise ValueError(f"cannot reach a Dask scheduler at {address} within {timeout:g} s: the address {silent} "
                         f"(start one with `dask scheduler`): {type(e).__name__}: {e}") from None
    except Exception as e:              # MemoryError (a frame length read from "HTTP/1.1 200"), a bad frame, …
        raise ValueError(f"{address} is not a Dask scheduler: it answered in another protocol "
                         f"({type(e).__name__}: {str(e)[:80]})") from None
    finally:
        pool.shutdown(wait=False)
    if not isinstance(info, dict) or "compression" not in info:
        raise ValueError(f"{address} is not a Dask scheduler: its handshake is not Dask's")


def local_cluster(n_workers: int, *, threads_per_worker: int = 1, memory_limit="auto"):
    """A ``(LocalCluster, Client)`` of ``n_workers`` worker processes, no dashboard. The caller closes both.

    The scheduler's small HTTP server (health, metrics) still starts; it takes a free port rather than
    8787, which another cluster on the machine may hold."""
    distributed = require_distributed()
    cluster = distributed.LocalCluster(n_workers=n_workers, threads_per_worker=threads_per_worker,
                                       processes=True, dashboard_address=None, memory_limit=memory_limit,
                                       scheduler_kwargs={"dashboard_address": ":0"})
    return cluster, distributed.Client(cluster)


def get_client(client=None, *, timeout: float = 10.0):
    """The client to run on: ``client`` itself, a connection to it if it is an address (trying for at most
    ``timeout`` seconds), the current default client, or the embedded LocalCluster (one worker process
    per core)."""
    distributed = require_distributed()
    if isinstance(client, distributed.Client):
        return client
    if isinstance(client, str):
        return connect(client, timeout=timeout)
    if client is not None:
        raise TypeError(f"client must be a distributed.Client, a scheduler address or None, "
                        f"got {type(client).__name__}")
    try:
        return distributed.default_client()
    except ValueError:
        pass
    if "client" not in _EMBEDDED:
        import os
        cluster, c = local_cluster(max(1, len(os.sched_getaffinity(0))))
        _EMBEDDED.update(cluster=cluster, client=c)
        atexit.register(close_embedded)
    return _EMBEDDED["client"]


def close_embedded() -> None:
    """Shut the embedded LocalCluster down (also done at exit)."""
    c, cluster = _EMBEDDED.pop("client", None), _EMBEDDED.pop("cluster", None)
    if c is not None:
        c.close()
    if cluster is not None:
        cluster.close()


def worker_addresses(client) -> list[str]:
    """The addresses of the workers now connected, sorted; a ValueError when there are none."""
    workers = sorted(client.scheduler_info(n_workers=-1)["workers"]) if _takes_n_workers(client) else \
        sorted(client.scheduler_info()["workers"])
    if not workers:
        raise ValueError(f"the Dask cluster at {client.scheduler.address} has no workers; "
                         "start some with `dask worker ADDRESS`")
    return workers


def _takes_n_workers(client) -> bool:
    import inspect
    return "n_workers" in inspect.signature(client.scheduler_info).parameters


def _worker_stats(dask_worker=None) -> dict:
    """Run on each worker: its process's peak and current resident memory, and the bytes it has sent."""
    import resource

    import psutil
    return {"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,   # Linux: KiB
            "rss": psutil.Process().memory_info().rss,
            "bytes_sent": int(getattr(dask_worker, "transfer_outgoing_bytes_total", 0))}


def worker_stats(client) -> dict[str, dict]:
    """Per worker address: ``peak_rss`` (bytes, the process's peak since it started), ``rss`` now, and
    ``bytes_sent``, the bytes it has sent to other workers (Dask's own transfer counter)."""
    return client.run(_worker_stats, wait=True, on_error="raise")
