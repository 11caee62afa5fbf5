"""Dask fails fast and names the address (issue 26): a port that accepts and stays silent, a peer speaking
HTTP, a replicated cache right after a loss, a NaN query. Peers are tiny servers on 127.0.0.1 only."""

import os
import signal
import socket
import threading
import time

import numpy as np
import pytest

pytest.importorskip("distributed")

from attnlab.kernels.tiled import tiled_attention  # noqa: E402
from attnlab.cli import main  # noqa: E402
from attnlab.distributed import ShardedKVCache, connect, local_cluster  # noqa: E402


@pytest.fixture
def peer():
    """``peer(reply)``: a loopback server that accepts every connection and answers ``reply`` to what it
    reads (None: never answers). Yields the address; the sockets close afterwards."""
    sockets = []

    def start(reply):
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        sockets.append(server)

        def serve():
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:
                    return                                   # closed at teardown
                sockets.append(conn)
                if reply is not None:
                    conn.settimeout(5)
                    try:
                        conn.recv(65536)
                        conn.sendall(reply)
                    except OSError:
                        pass
        threading.Thread(target=serve, daemon=True).start()
        return f"tcp://127.0.0.1:{server.getsockname()[1]}"
    yield start
    for s in sockets:
        s.close()


def bounded(call, limit: float):
    """``call()``'s exception and the seconds it took, run in a thread: a hang fails the test at ``limit``
    instead of blocking the suite."""
    box = {}

    def run():
        t0 = time.monotonic()
        try:
            call()
        except BaseException as e:                                # noqa: BLE001 - handed to the test
            box["error"] = e
        box["seconds"] = time.monotonic() - t0
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), f"still waiting after {limit} s"
    return box.get("error"), box["seconds"]


HTTP = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"


def test_a_port_that_accepts_and_never_answers_fails_within_the_timeout(peer):
    address = peer(None)
    error, seconds = bounded(lambda: connect(address, timeout=1.0), limit=20)
    assert isinstance(error, ValueError) and address in str(error) and "within 1 s" in str(error)
    assert "accepts connections but did not answer" in str(error)
    assert seconds < 5


def test_a_peer_speaking_http_is_not_a_dask_scheduler(peer):
    address = peer(HTTP)
    error, seconds = bounded(lambda: connect(address, timeout=5.0), limit=20)
    assert isinstance(error, ValueError), error
    assert str(error).startswith(f"{address} is not a Dask scheduler: it answered in another protocol")
    assert seconds < 5


@pytest.mark.parametrize("reply", [None, HTTP], ids=["silent", "http"])
def test_the_scan_cli_names_the_address_within_its_timeout(peer, tmp_path, capsys, reply):
    address = peer(reply)
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat\n")
    code = {}
    error, seconds = bounded(lambda: code.update(rc=main(["scan", str(corpus), "--scheduler", address,
                                                          "--timeout", "1"])), limit=20)
    assert error is None and code["rc"] == 2 and seconds < 6
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and address in err and "not enough memory" not in err
    assert ("did not answer" if reply is None else "is not a Dask scheduler") in err


def test_the_longctx_cli_names_a_silent_address(peer, capsys):
    address = peer(None)
    code = {}
    error, seconds = bounded(lambda: code.update(rc=main(["longctx", "--n", "64", "--scheduler", address,
                                                          "--timeout", "1"])), limit=20)
    assert error is None and code["rc"] == 2 and seconds < 6
    assert address in capsys.readouterr().err


@pytest.fixture(scope="module")
def cluster():
    cl, client = local_cluster(2)
    client.wait_for_workers(2, timeout=120)
    yield client
    client.close()
    cl.close()


def test_the_sharded_cache_refuses_a_nan_query_as_the_single_process_paths_do(cluster, rng):
    k, v = (rng.normal(size=(2, 10, 8)).astype(np.float32) for _ in range(2))
    cache = ShardedKVCache(cluster, n_heads=2, d_head=8, shard_capacity=8)
    cache.append(k, v)
    q = rng.normal(size=(2, 1, 8)).astype(np.float32)
    q[1, 0, 3] = np.nan
    with pytest.raises(ValueError) as want:
        tiled_attention(q, k, v)
    with pytest.raises(ValueError) as got:
        cache.attend(q)
    assert str(got.value) == str(want.value) and "query must be finite" in str(got.value)


def test_a_replicated_cache_appends_on_the_survivor_right_after_a_loss(cluster, rng):
    cache = ShardedKVCache(cluster, n_heads=2, d_head=8, shard_capacity=8, replicas=2, timeout=30)
    k, v = (rng.normal(size=(2, 12, 8)).astype(np.float32) for _ in range(2))
    cache.append(k[:, :6], v[:, :6])                          # shard 0, half full, on both workers
    pids = cluster.run(os.getpid)
    victim = cache.shards[0]["workers"][0]
    os.kill(pids[victim], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while victim in cluster.scheduler_info(n_workers=-1)["workers"]:   # the scheduler learns of it itself
        assert time.monotonic() < deadline
        time.sleep(0.05)
    start = time.monotonic()
    assert cache.append(k[:, 6:], v[:, 6:]) == 12               # fills shard 0 on the survivor, opens shard 1
    assert time.monotonic() - start < 5                         # no dial of the dead worker, no timeout
    assert victim not in cache.shards[0]["workers"] and cache.shards[0]["workers"]
    q = rng.normal(size=(2, 1, 8)).astype(np.float32)
    np.testing.assert_allclose(cache.attend(q), tiled_attention(q, k, v), atol=1e-6)
