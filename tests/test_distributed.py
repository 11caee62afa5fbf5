"""attnlab.distributed on a real distributed.LocalCluster: 2 worker processes, one per module.

Equality with the single-process tiled kernel, the sharded KV cache, bad input, and faults (a worker
process killed mid-computation). The fault tests come last: each waits for the nanny to restart the worker.
"""

import os
import signal
import threading
import time

import numpy as np
import pytest

pytest.importorskip("distributed")
da = pytest.importorskip("dask.array")

from attnlab.kernels.tiled import tiled_attention  # noqa: E402
from attnlab.cli import main  # noqa: E402
from attnlab.distributed import (ShardedKVCache, ShardLostError, decode_part, local_cluster,  # noqa: E402
                                 merge_partials, merge_tree, sequence_parallel_attention)
from attnlab.distributed.partials import pair_cost, split_even  # noqa: E402
from attnlab.distributed.sequence import assign_pairs  # noqa: E402

TOL = {np.float32: 1e-6, np.float64: 1e-12}


@pytest.fixture(scope="module")
def cluster():
    cl, client = local_cluster(2)
    yield cl, client
    client.close()
    cl.close()


@pytest.fixture
def client(cluster):
    c = cluster[1]
    c.wait_for_workers(2, timeout=60)        # after a fault test, the nanny's restarted worker
    return c


def qkv(rng, n_q, n_k, *, heads=2, kv_heads=None, d=16, d_v=8, dtype=np.float64):
    kv_heads = kv_heads or heads
    return (rng.normal(size=(heads, n_q, d)).astype(dtype), rng.normal(size=(kv_heads, n_k, d)).astype(dtype),
            rng.normal(size=(kv_heads, n_k, d_v)).astype(dtype))


def assert_close(got, want, dtype):
    """Within TOL[dtype] relative to the largest entry; -inf (a row that saw nothing) must match exactly."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    finite = np.isfinite(want)
    assert np.array_equal(finite, np.isfinite(got)) and np.array_equal(got[~finite], want[~finite])
    scale = np.abs(want[finite]).max(initial=1.0)
    assert np.abs(got[finite] - want[finite]).max(initial=0) <= TOL[dtype] * scale


# ----------------------------------------------------------------------------------------------------
# the arithmetic, without a cluster


def test_merge_partials_by_hand():
    # keys {0} and {1, 2} of one query with scores 0, log 2, log 5: weights 1/8, 2/8, 5/8
    v = np.array([[8.0], [0.0], [16.0]])
    a = (np.array([[8.0]]), np.array([0.0]))                       # out over key 0, lse log 1
    b = (np.array([[(2 * 0 + 5 * 16) / 7]]), np.array([np.log(7)]))  # over keys 1, 2
    out, lse = merge_partials(a, b)
    assert np.allclose(out, [[1 / 8 * 8 + 5 / 8 * 16]]) and np.allclose(lse, np.log(8))
    assert np.allclose(out, np.exp([0, np.log(2), np.log(5)]) @ v / 8)


def test_merge_of_a_row_that_saw_nothing_stays_zero():
    empty = (np.zeros((2, 3)), np.array([-np.inf, -np.inf]))
    some = (np.array([[1.0, 2, 3], [0, 0, 0]]), np.array([0.5, -np.inf]))
    out, lse = merge_tree([empty, some, empty])
    assert np.array_equal(out, [[1, 2, 3], [0, 0, 0]]) and lse[0] == 0.5 and lse[1] == -np.inf
    assert np.isfinite(out).all()


def test_hidden_pairs_are_never_assigned():
    n, parts = 1000, split_even(1000, 4)
    where, costs = assign_pairs(n, n, parts, parts, ["a", "b"], is_causal=True, window=None)
    assert set(where) == {(b, s) for b in range(4) for s in range(4) if s <= b}
    assert sum(costs.values()) == n * (n + 1) // 2               # every visible score, once
    where, costs = assign_pairs(n, n, parts, parts, ["a", "b"], is_causal=True, window=100)
    assert set(where) == {(b, s) for b in range(4) for s in range(4) if s in (b - 1, b)}
    assert sum(costs.values()) == sum(min(i + 1, 100) for i in range(n))
    load = {w: sum(costs[p] for p in where if where[p] == w) for w in "ab"}
    assert abs(load["a"] - load["b"]) <= max(costs.values())     # longest first, least loaded


def test_decode_part_computes_in_the_querys_dtype(rng):
    # a numpy float64 scale (1 / np.sqrt(d)) must not lift a float32 step to float64 (10-50x slower)
    q, k, v = qkv(rng, 1, 300, heads=4, kv_heads=2, dtype=np.float32)
    out, lse = decode_part(q, k, v, scale=1 / np.sqrt(np.float64(16)), groups=2)
    assert out.dtype == np.float32 and lse.dtype == np.float32
    want, want_lse = tiled_attention(q, k, v, return_lse=True)
    assert_close(out, want, np.float32)
    assert_close(lse, want_lse, np.float32)


def test_pair_cost_counts_the_mask():
    from attnlab import causal_mask
    keep = causal_mask(7, 10, window=3)                          # (7, 10) True = may attend, bottom-right
    assert pair_cost(7, 10, (2, 6), (4, 9), is_causal=True, window=3) == keep[2:6, 4:9].sum()
    assert pair_cost(7, 10, (0, 2), (8, 10), is_causal=True, window=None) == 0


# ----------------------------------------------------------------------------------------------------
# equality with tiled_attention

CASES = {
    "full": dict(n_q=257, n_k=257),
    "causal": dict(n_q=257, n_k=257, is_causal=True),
    "causal window": dict(n_q=300, n_k=300, is_causal=True, window=37),
    "n_q < n_k causal": dict(n_q=100, n_k=333, is_causal=True),
    "n_q > n_k causal (masked rows)": dict(n_q=90, n_k=40, is_causal=True),
    "window hides early blocks' rows": dict(n_q=64, n_k=200, is_causal=True, window=5),
    "uneven shards": dict(n_q=101, n_k=103, is_causal=True, shards=3),
    "single shard": dict(n_q=80, n_k=120, shards=1),
    "more shards than workers": dict(n_q=150, n_k=150, is_causal=True, shards=5, query_blocks=7),
    "gqa": dict(n_q=120, n_k=120, is_causal=True, heads=4, kv_heads=2),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", list(CASES))
def test_equals_tiled_attention(client, rng, case, dtype):
    o = dict(CASES[case])
    q, k, v = qkv(rng, o.pop("n_q"), o.pop("n_k"), heads=o.pop("heads", 2), kv_heads=o.pop("kv_heads", None),
                  dtype=dtype)
    mask_opts = {name: o[name] for name in ("is_causal", "window") if name in o}
    want, want_lse = tiled_attention(q, k, v, return_lse=True, **mask_opts)
    got, got_lse = sequence_parallel_attention(q, k, v, client=client, return_lse=True, timeout=60, **o)
    assert isinstance(got, np.ndarray)
    assert_close(got, want, dtype)
    assert_close(got_lse, want_lse, dtype)


def test_fully_masked_rows_are_zero_with_lse_minus_inf(client, rng):
    q, k, v = qkv(rng, 50, 20)
    out, lse = sequence_parallel_attention(q, k, v, client=client, is_causal=True, return_lse=True, timeout=60)
    assert np.array_equal(out[:, :30], np.zeros((2, 30, 8))) and np.all(lse[:, :30] == -np.inf)
    assert np.all(np.isfinite(lse[:, 30:]))


def test_float16_in_float16_out(client, rng):
    q, k, v = qkv(rng, 64, 96, dtype=np.float16)
    got = sequence_parallel_attention(q, k, v, client=client, is_causal=True, timeout=60)
    assert got.dtype == np.float16
    assert np.allclose(got, tiled_attention(q, k, v, is_causal=True), atol=2e-3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("opts,chunks", [(dict(is_causal=True, window=30), 64),
                                         (dict(is_causal=True), (50, 83, 67)),
                                         (dict(), 100)])
def test_dask_inputs_give_a_dask_array(client, rng, opts, chunks, dtype):
    q, k, v = qkv(rng, 120, 200, dtype=dtype)
    dq = da.from_array(q, chunks=(2, 60, 16))
    dk = da.from_array(k, chunks=(2, chunks, 16))
    dv = da.from_array(v, chunks=(2, chunks, 8))
    out, lse = sequence_parallel_attention(dq, dk, dv, client=client, return_lse=True, **opts)
    assert isinstance(out, da.Array) and isinstance(lse, da.Array)
    assert out.shape == (2, 120, 8) and out.dtype == dtype
    want, want_lse = tiled_attention(q, k, v, return_lse=True, **opts)
    assert_close(out.compute(), want, dtype)
    assert_close(lse.compute(), want_lse, dtype)


def test_dask_inputs_made_on_the_workers(client):
    # random inputs built by tasks: the client never holds them
    rs = da.random.RandomState(5)
    dq, dk, dv = (rs.standard_normal((1, 256, 8), chunks=(1, 64, 8)) for _ in range(3))
    out = sequence_parallel_attention(dq, dk, dv, client=client, is_causal=True)
    q, k, v = client.compute([dq, dk, dv], sync=True)
    assert_close(out.compute(), tiled_attention(q, k, v, is_causal=True), np.float64)


# ----------------------------------------------------------------------------------------------------
# the sharded KV cache


def test_cache_decode_step_by_step_equals_one_pass(client, rng):
    q, k, v = qkv(rng, 70, 70, heads=4, kv_heads=2, d=16, d_v=16, dtype=np.float32)
    cache = ShardedKVCache(client, n_heads=2, d_head=16, shard_capacity=16)
    cache.append(k[:, :20], v[:, :20])                            # a prompt over two shards
    steps = [cache.attend(q[:, :20])]                             # (4, 20, 16) the prompt's own block
    for t in range(20, 70):
        assert cache.append(k[:, t:t + 1], v[:, t:t + 1]) == t + 1
        steps.append(cache.attend(q[:, t:t + 1]))                 # (4, 1, 16) one decode step
    assert len(cache) == 70 and len(cache.shards) == 5
    assert [s["stop"] - s["start"] for s in cache.shards] == [16, 16, 16, 16, 6]
    want = tiled_attention(q, k, v, is_causal=True)               # (4, 70, 16) one full pass
    assert_close(np.concatenate(steps, axis=1), want, np.float32)


def test_cache_with_one_kv_head_serves_many_query_heads(client, rng):
    q, k, v = qkv(rng, 12, 12, heads=4, kv_heads=1, d=8, d_v=8, dtype=np.float64)
    cache = ShardedKVCache(client, n_heads=1, d_head=8, shard_capacity=5, dtype=np.float64)
    cache.append(k, v)
    assert_close(cache.attend(q[:, -1:]), tiled_attention(q[:, -1:], k, v), np.float64)      # (4, 1, 8)
    assert_close(cache.attend(q[:, -4:]), tiled_attention(q[:, -4:], k, v, is_causal=True), np.float64)


def test_cache_places_shards_on_the_least_loaded_worker(client, rng):
    cache = ShardedKVCache(client, n_heads=1, d_head=4, shard_capacity=10)
    cache.append(*(rng.normal(size=(1, 45, 4)).astype(np.float32) for _ in range(2)))
    holders = [s["workers"][0] for s in cache.shards]
    assert len(set(holders)) == 2 and all(a != b for a, b in zip(holders, holders[1:]))
    assert sorted(cache.load().values()) == [20, 25]


def test_cache_with_two_replicas_holds_each_shard_twice(client, rng):
    cache = ShardedKVCache(client, n_heads=1, d_head=4, shard_capacity=10, replicas=2)
    cache.append(*(rng.normal(size=(1, 25, 4)).astype(np.float32) for _ in range(2)))
    assert all(len(set(s["workers"])) == 2 for s in cache.shards)
    with pytest.raises(ValueError, match="replicas=3 needs at least as many workers, the cluster has 2"):
        ShardedKVCache(client, n_heads=1, d_head=4, shard_capacity=10, replicas=3)


def test_failed_appends_leave_the_cache_as_it_was(client, rng):
    k, v = (rng.normal(size=(2, 30, 8)).astype(np.float32) for _ in range(2))
    cache = ShardedKVCache(client, n_heads=2, d_head=8, shard_capacity=8, max_tokens=30)
    cache.append(k[:, :20], v[:, :20])
    q = rng.normal(size=(2, 1, 8)).astype(np.float32)
    before, shards = cache.attend(q), cache.shards
    bad_nan = k[:, 20:25].copy()
    bad_nan[1, 2, 3] = np.nan
    attempts = [((k[:, :11], v[:, :11]), ValueError, "cannot append 11 tokens: the cache holds 20 of its max_tokens 30"),
                ((bad_nan, v[:, 20:25]), ValueError, "key must be finite"),
                ((k[:, 20:25].astype(np.float64), v[:, 20:25]), TypeError, "key has dtype float64, the cache holds float32"),
                ((k[:1, 20:25], v[:1, 20:25]), ValueError, r"key has shape \(1, 5, 8\), the cache expects \(2, 't', 8\)"),
                ((k[:, 20:25], v[:, 20:24]), ValueError, "key has 5 tokens, value has 4")]
    for args, error, message in attempts:
        with pytest.raises(error, match=message):
            cache.append(*args)
        assert len(cache) == 20 and cache.shards == shards
        assert np.array_equal(cache.attend(q), before)
    cache.append(k[:, 20:], v[:, 20:])                           # and it still works afterwards
    assert_close(cache.attend(q), tiled_attention(q, k, v), np.float32)


def test_cache_bad_queries(client, rng):
    cache = ShardedKVCache(client, n_heads=2, d_head=8, shard_capacity=8)
    with pytest.raises(ValueError, match="the cache is empty"):
        cache.attend(np.zeros((2, 1, 8), np.float32))
    cache.append(np.zeros((2, 3, 8), np.float32), np.zeros((2, 3, 8), np.float32))
    with pytest.raises(ValueError, match=r"query has shape \(2, 1, 4\), the cache expects \(h, t, 8\)"):
        cache.attend(np.zeros((2, 1, 4), np.float32))
    with pytest.raises(ValueError, match=r"query has 3 heads \(shape \(3, 1, 8\)\), the cache holds 2: expected 2 "
                       "or a multiple of it") as e:
        cache.attend(np.zeros((3, 1, 8), np.float32))
    assert "key" not in str(e.value) and "value" not in str(e.value)   # names only what the caller passed
    with pytest.raises(ValueError, match="query has 1 heads"):
        cache.attend(np.zeros((1, 1, 8), np.float32))
    with pytest.raises(TypeError, match="shard_capacity must be a positive integer"):
        ShardedKVCache(client, n_heads=2, d_head=8, shard_capacity=2.5)


# ----------------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize("change,error", [
    (lambda q, k, v: (q.astype(int), k, v, {}), TypeError),
    (lambda q, k, v: (q, k[..., :3], v, {}), ValueError),
    (lambda q, k, v: (q, k, v[:, :5], {}), ValueError),
    (lambda q, k, v: (q, k, v, {"window": 4}), ValueError),
    (lambda q, k, v: (q, k, v, {"is_causal": 1}), TypeError),
    (lambda q, k, v: (q, k, v, {"scale": -1.0}), ValueError),
    (lambda q, k, v: (np.where(q > 1, np.inf, q), k, v, {}), ValueError),
    (lambda q, k, v: (np.concatenate([q, q, q[:1]]), k, v, {}), ValueError),     # 5 heads over 2 KV heads
])
def test_bad_input_same_errors_as_tiled(client, rng, change, error):
    q, k, v, opts = change(*qkv(rng, 10, 12))
    with pytest.raises(error) as want:
        tiled_attention(q, k, v, **opts)
    with pytest.raises(error) as got:
        sequence_parallel_attention(q, k, v, client=client, **opts)
    assert str(got.value) == str(want.value)


def test_bad_input_of_its_own(client, rng):
    q, k, v = qkv(rng, 10, 12)
    with pytest.raises(ValueError, match="shards must be a positive integer, got 0"):
        sequence_parallel_attention(q, k, v, client=client, shards=0)
    with pytest.raises(TypeError, match="all numpy arrays or all dask arrays, got query ndarray, key dask"):
        sequence_parallel_attention(q, da.from_array(k), v, client=client)
    with pytest.raises(TypeError, match="client must be a distributed.Client, a scheduler address or None"):
        sequence_parallel_attention(q, k, v, client=42)
    with pytest.raises(ValueError, match=r"key has shape \(2, 12, 3\)|width"):
        sequence_parallel_attention(da.from_array(q), da.from_array(k[..., :3]), da.from_array(v), client=client)


def test_unreachable_scheduler_fails_fast_naming_it(rng):
    q, k, v = qkv(rng, 10, 12)
    start = time.monotonic()
    with pytest.raises(ValueError, match="tcp://127.0.0.1:9"):
        sequence_parallel_attention(q, k, v, client="tcp://127.0.0.1:9", timeout=2)
    assert time.monotonic() - start < 10


# ----------------------------------------------------------------------------------------------------
# the command line, on the module's cluster


def test_longctx_cli_json(cluster, capsys):
    import json
    assert main(["longctx", "--n", "3000", "--heads", "2", "--causal", "--scheduler", cluster[0].scheduler_address,
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["n"] == 3000 and r["causal"] is True and r["workers"] == 2
    assert r["max_weight_error"] < 1e-6 and r["max_output_error"] < 1e-5 and len(r["rows_checked"]) >= 4
    assert r["single_process_s"] > 0 and r["wall_s"] > 0 and r["bytes_moved"] > 0
    assert all(w["peak_rss"] > 0 for w in r["worker_memory"].values())


def test_longctx_cli_without_dask_says_how_to_install(capsys, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "distributed", None)        # as if Dask were not installed
    assert main(["longctx", "--n", "64"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'attnlab[distributed]'" in err


def test_longctx_cli_bad_input(capsys):
    assert main(["longctx", "--n", "0"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert main(["longctx", "--n", "64", "--scheduler", "tcp://127.0.0.1:9", "--timeout", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tcp://127.0.0.1:9" in err


def never_runs(*args, **kwargs):
    raise AssertionError("run_longctx started the run before checking its arguments")


@pytest.mark.parametrize("kwargs,error,match", [
    ({"dtype": np.float16}, ValueError, "dtype must be float32 or float64, got float16"),
    ({"dtype": None}, TypeError, "dtype must be a numpy dtype, float32 or float64, got NoneType"),
    ({"dtype": "nonsense"}, TypeError, "dtype must be a numpy dtype, float32 or float64, got str 'nonsense'"),
    ({"is_causal": 1}, TypeError, "is_causal must be True or False, got int 1"),
    ({"single": None}, TypeError, "single must be True or False, got NoneType"),
    ({"timeout": -1.0}, ValueError, "timeout must be a positive finite number, got -1.0"),
    ({"progress": 3}, TypeError, "progress must be a callable"),
])
def test_run_longctx_checks_its_arguments_before_running(client, monkeypatch, kwargs, error, match):
    from attnlab.distributed import longctx
    monkeypatch.setattr(longctx, "sequence_parallel_attention", never_runs)
    with pytest.raises(error, match=match):
        longctx.run_longctx(client, 64, **kwargs)


def test_run_longctx_needs_a_client():
    from attnlab.distributed.longctx import run_longctx
    with pytest.raises(TypeError, match="client must be a distributed.Client, got NoneType None"):
        run_longctx(None, 64)


def test_longctx_cli_bad_dtype_is_one_line(cluster, capsys, monkeypatch):
    import functools

    from attnlab.distributed import longctx
    monkeypatch.setattr(longctx, "sequence_parallel_attention", never_runs)
    monkeypatch.setattr(longctx, "run_longctx", functools.partial(longctx.run_longctx, dtype=np.float16))
    assert main(["longctx", "--n", "64", "--scheduler", cluster[0].scheduler_address]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "dtype must be float32 or float64, got float16" in err


# ----------------------------------------------------------------------------------------------------
# faults: each test kills a worker process of its own fresh 2-worker cluster, so no test waits on a
# nanny's restart, and waits on facts (the process is dead, the scheduler dropped it), never on a sleep.


@pytest.fixture
def doomed():
    """A fresh 2-worker cluster for one fault test; closed afterwards whatever the test did to it."""
    cl, client = local_cluster(2)
    client.wait_for_workers(2, timeout=120)
    yield client
    client.close()
    cl.close()


def worker_pid(client, address=None) -> tuple[str, int]:
    pids = client.run(os.getpid)
    address = address or sorted(pids)[0]
    return address, pids[address]


def kill_and_reap(pid: int) -> None:
    """SIGKILL a worker process and return once it no longer runs (its nanny reaps it)."""
    import psutil
    os.kill(pid, signal.SIGKILL)
    try:
        psutil.Process(pid).wait(timeout=30)
    except psutil.NoSuchProcess:
        pass


def wait_until_dropped(client, address, timeout=60.0):
    """Block until the scheduler no longer lists ``address`` (it learns of the death on its own)."""
    deadline = time.monotonic() + timeout
    while address in client.scheduler_info(n_workers=-1)["workers"]:
        assert time.monotonic() < deadline, f"the scheduler still lists {address} after {timeout} s"
        time.sleep(0.05)


def computed(client, out, timeout=90):
    """A numpy result as it is, a dask one computed on ``client`` within ``timeout`` seconds."""
    return client.compute(out).result(timeout=timeout) if isinstance(out, da.Array) else out


def accept_right_or_clear(run, want):
    """``run()`` gives ``want`` (Dask recomputed), or raises a clear error naming lost workers or the
    timeout; a wrong answer fails, and so does anything else (an OSError, a bare CancelledError)."""
    try:
        got = run()
    except (RuntimeError, TimeoutError) as e:
        assert "lost workers" in str(e) or "did not finish within" in str(e), repr(e)
        return type(e).__name__
    assert_close(got, want, np.float32)
    return "right"


@pytest.mark.filterwarnings("ignore:Sending large graph")       # from_array puts the test's data in the graph
@pytest.mark.parametrize("after", [0.3, 0.6])
@pytest.mark.parametrize("inputs", ["numpy", "dask"])
def test_killed_worker_during_sequence_parallel_attention(doomed, rng, inputs, after):
    q, k, v = qkv(rng, 8192, 8192, d=64, d_v=64, dtype=np.float32)
    want = tiled_attention(q, k, v, is_causal=True)
    if inputs == "dask":
        q, k, v = (da.from_array(x, chunks=(2, 2048, 64)) for x in (q, k, v))
    _, pid = worker_pid(doomed)
    killer = threading.Timer(after, kill_and_reap, (pid,))      # late: shards sent, pairs running
    start = time.monotonic()
    killer.start()
    try:
        outcome = accept_right_or_clear(lambda: computed(doomed, sequence_parallel_attention(
            q, k, v, client=doomed, is_causal=True, timeout=90)), want)
        print(f"killed {after} s in, {inputs} inputs: {outcome}")      # seen with -s: which way it went
    finally:
        killer.join()
    assert time.monotonic() - start < 120


def test_worker_lost_between_listing_and_sending(doomed, rng, monkeypatch):
    # the worker dies after sequence_parallel_attention listed it and before its shard is sent: the
    # scheduler may still list it, and Dask dials it until its connect timeout (an OSError) — that is a
    # lost worker, retried on the survivor, not an OSError for the caller
    import dask

    import attnlab.distributed.sequence as sequence
    q, k, v = qkv(rng, 300, 300, dtype=np.float32)
    listed = sequence.worker_addresses

    def list_then_kill(client):
        workers = listed(client)
        if not killed:
            killed.append(worker_pid(client, workers[0]))
            kill_and_reap(killed[0][1])
        return workers

    killed = []
    monkeypatch.setattr(sequence, "worker_addresses", list_then_kill)
    with dask.config.set({"distributed.comm.timeouts.connect": "3s"}):
        got = sequence_parallel_attention(q, k, v, client=doomed, is_causal=True, timeout=90)
    assert killed and killed[0][0] not in doomed.scheduler_info(n_workers=-1)["workers"]
    assert_close(got, tiled_attention(q, k, v, is_causal=True), np.float32)


@pytest.mark.parametrize("error", [
    OSError("Timed out trying to connect to tcp://127.0.0.1:1 after 30 s"),   # a worker killed late
    ConnectionResetError(104, "Connection reset by peer"),
])
def test_connection_errors_are_lost_workers_not_osErrors(client, rng, monkeypatch, error):
    import attnlab.distributed.sequence as sequence
    q, k, v = qkv(rng, 64, 64)
    real, calls = sequence.numpy_path, []

    def fail_once(*args):
        calls.append(1)
        if len(calls) == 1:
            raise error
        return real(*args)

    monkeypatch.setattr(sequence, "numpy_path", fail_once)
    got = sequence_parallel_attention(q, k, v, client=client, is_causal=True)      # retried: right
    assert len(calls) == 2
    assert_close(got, tiled_attention(q, k, v, is_causal=True), np.float64)

    def always(*args):
        raise error

    monkeypatch.setattr(sequence, "numpy_path", always)
    with pytest.raises(RuntimeError, match=f"lost workers 3 times and gave up: {type(error).__name__}"):
        sequence_parallel_attention(q, k, v, client=client)


def test_the_callers_timeout_is_not_a_lost_worker(client, rng, monkeypatch):
    import attnlab.distributed.sequence as sequence
    q, k, v = qkv(rng, 64, 64)
    calls = []

    def too_slow(*args):
        calls.append(1)
        raise sequence.DeadlinePassed("3 of 9 tasks done on 2 workers")

    monkeypatch.setattr(sequence, "numpy_path", too_slow)
    with pytest.raises(TimeoutError, match=r"did not finish within 5 s \(3 of 9 tasks done on 2 workers\)"):
        sequence_parallel_attention(q, k, v, client=client, timeout=5)
    assert len(calls) == 1                                      # never retried


def test_replicated_cache_survives_a_killed_worker(doomed, rng):
    q, k, v = qkv(rng, 40, 40, heads=2, d=8, d_v=8, dtype=np.float32)
    cache = ShardedKVCache(doomed, n_heads=2, d_head=8, shard_capacity=8, replicas=2, timeout=10)
    cache.append(k, v)
    victim, pid = worker_pid(doomed, cache.shards[0]["workers"][0])
    kill_and_reap(pid)
    start = time.monotonic()
    assert_close(cache.attend(q), tiled_attention(q, k, v, is_causal=True), np.float32)
    assert_close(cache.attend(q[:, -1:]), tiled_attention(q[:, -1:], k, v), np.float32)
    assert all(s["workers"] == [w for w in s["workers"] if w != victim] for s in cache.shards)
    assert time.monotonic() - start < 60


@pytest.mark.parametrize("dropped", [False, True], ids=["at once", "after the scheduler dropped it"])
def test_unreplicated_cache_names_the_lost_shard(doomed, rng, dropped):
    q, k, v = qkv(rng, 40, 40, heads=2, d=8, d_v=8, dtype=np.float32)
    cache = ShardedKVCache(doomed, n_heads=2, d_head=8, shard_capacity=16, timeout=10)
    cache.append(k, v)
    victim, pid = worker_pid(doomed, cache.shards[1]["workers"][0])   # holds shard 1 (tokens 16-31)
    lost = [s["shard"] for s in cache.shards if s["workers"] == [victim]]
    kill_and_reap(pid)
    if dropped:
        wait_until_dropped(doomed, victim)
    start = time.monotonic()
    with pytest.raises(ShardLostError, match=f"shard 1 of the KV cache \\(tokens 16–31\\) is lost.*{victim}") as e:
        cache.attend(q[:, -1:])
    assert (e.value.shard, e.value.start, e.value.stop, e.value.workers) == (1, 16, 32, [victim])
    with pytest.raises(ShardLostError, match="shard 1 .*tokens 16–31"):       # and again, without waiting
        cache.attend(q[:, -1:])
    assert len(cache) == 40 and all(cache.shards[i]["workers"] == [] for i in lost)
    assert time.monotonic() - start < 60
