"""attnlab bench on tiny sizes: the data it returns and the table it prints (no timing is asserted)."""

import json

import numpy as np
import pytest

from attnlab.cli import bench_harness as bench
from attnlab.kernels._kernels import NO_NUMBA_ENV
from attnlab.cli import main


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(bench, "QUICK_SIZES", (64,))
    monkeypatch.setattr(bench, "DECODE_CONTEXTS", (32,))
    monkeypatch.setattr(bench, "QUICK_BACKWARD_SIZES", (32,))
    monkeypatch.setattr(bench, "BATCH", (2, 16))
    monkeypatch.setattr(bench, "SCALE_N", 128)
    monkeypatch.setattr(bench, "gemm_gflops", lambda: 100.0)
    monkeypatch.setattr(bench, "blas_contention", lambda: {"blas_threads": 2, "all_threads_ms": 40.0,
                                                           "one_thread_ms": 20.0, "ratio": 2.0})
    monkeypatch.setattr(bench, "first_call_row", lambda: FIRST_CALL)      # its own test runs the subprocesses


FIRST_CALL = {"n": 1024, "first_over_second_mib": 5.0, "runs": {
    "default": {"first": {"rss_mib": 7.0, "ms": 90.0}, "second": {"rss_mib": 2.0, "ms": 60.0}, "kernel": "numpy"}}}


def test_first_call_row_measures_a_fresh_process():
    f = bench.first_call_row(n=200)
    default = f["runs"]["default"]
    assert default["kernel"] == "numpy"                      # a short call in a fresh process loads no numba
    assert f["first_over_second_mib"] == default["first"]["rss_mib"] - default["second"]["rss_mib"] < 50
    from attnlab.kernels import _kernels
    assert ("numba loaded first" in f["runs"]) == (_kernels.numba_installed() and not _kernels.numba_disabled())
    if "numba loaded first" in f["runs"]:
        loaded = f["runs"]["numba loaded first"]
        assert loaded["kernel"] == "fused" and loaded["load numba"]["rss_mib"] > 20    # numba's import alone


def test_blas_contention_times_the_same_product_on_all_threads_and_one():
    pytest.importorskip("threadpoolctl")
    probe = bench.blas_contention(rounds=1)
    assert probe["all_threads_ms"] > 0 and probe["one_thread_ms"] > 0
    assert probe["ratio"] == pytest.approx(probe["all_threads_ms"] / probe["one_thread_ms"])     # one round
    assert probe["blas_threads"] is None or probe["blas_threads"] >= 1


def test_attention_flops_counts_the_visible_scores():
    assert bench.attention_flops(4, False) == 2 * 16 * 2 * 64 * 12
    assert bench.attention_flops(4, True) == 2 * 10 * 2 * 64 * 12     # 4 + 3 + 2 + 1 scores


def test_paired_alternates_the_pair_alone():
    order = []
    pair = bench.paired(lambda: order.append("a"), lambda: order.append("b"), rounds=4)
    # one warm-up each, then A B, B A, A B, B A: nothing else between the two
    assert order == ["a", "b"] + ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert pair.rounds == 4 and pair.ratio_min <= pair.ratio <= pair.ratio_max


def test_paired_ratio_is_the_median_of_per_round_ratios():
    seconds = iter([2, 1, 1, 4, 6, 2, 2, 2])              # rounds: a 2 b 1 | b 1 a 4 | a 6 b 2 | b 2 a 2
    pair = bench.paired(lambda: None, lambda: None, rounds=4, clock=lambda f: next(seconds))
    # ratios a/b: 2, 4, 3, 1 -> median 2.5, min 1, max 4; medians of a (2, 4, 6, 2) and b (1, 1, 2, 2)
    assert (pair.ratio, pair.ratio_min, pair.ratio_max) == (2.5, 1.0, 4.0)
    assert (pair.a_ms, pair.b_ms) == (3000.0, 1500.0)


def test_extra_peak_counts_numpy_allocations():
    assert 7.9 < bench.extra_peak_mib(lambda: np.ones(2**20)) < 8.5          # 8 MiB of float64


CPUINFO_X86 = """processor\t: 0
model name\t: AMD EPYC 7B13 64-Core Processor
flags\t\t: fpu sse4_1 sse4_2 fma avx avx2 bmi2
"""
CPUINFO_ARM = """processor\t: 0
Features\t: fp asimd evtstrm aes crc32
CPU implementer\t: 0x41
"""


def test_cpu_model_and_simd_level_from_cpuinfo():
    assert bench.cpu_model(CPUINFO_X86) == "AMD EPYC 7B13 64-Core Processor"
    assert bench.simd_level(bench.cpu_flags(CPUINFO_X86)) == {"level": "AVX2", "flags": ["fma"]}
    assert bench.simd_level({"avx2", "avx512f", "avx512bw", "fma"}) == {
        "level": "AVX-512", "flags": ["avx512bw", "avx512f", "fma"]}
    assert bench.simd_level(bench.cpu_flags(CPUINFO_ARM))["level"] == "NEON"
    assert bench.simd_level(set())["level"] == "unknown"


def test_bench_json_has_every_section(tiny, capsys):
    assert main(["bench", "--quick", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    m = r["machine"]
    assert m["cpu"] and m["simd"] in {"AVX-512", "AVX2", "AVX", "SSE4.2", "SVE", "NEON", "unknown"}
    assert isinstance(m["blas"], list) and m["tile_kernel"] in {"fused", "numpy"}
    assert m["numpy_exp"]["chosen"] in {"exp", "exp2"} and m["numpy_exp"]["reason"].startswith("rule")
    assert m["tune"].startswith("no profile at")
    assert [(f["n"], f["is_causal"]) for f in r["forward"]] == [(64, True), (64, False)]
    f = r["forward"][0]
    assert f["attnlab_ms"] > 0 and f["naive_ms"] > 0 and f["of_gemm"] == pytest.approx(f["gflops"] / 100)
    assert f["path"].startswith("naive")                      # 64 queries: below the tiled crossover
    for row in r["forward"] + r["batch"] + r["decode"] + r["backward"]:
        if row["torch_ms"] is not None:
            assert row["ratio_min"] <= row["ratio"] <= row["ratio_max"]
    assert [(b["batch"], b["n"]) for b in r["batch"]] == [(2, 16)]
    assert [d["context"] for d in r["decode"]] == [32] and r["decode"][0]["path"].startswith("decode")
    assert [b["n"] for b in r["backward"]] == [32]
    assert r["gemm_gflops"] == 100.0 and r["shape"]["rounds"] == 5


def test_bench_reports_the_tiled_path_and_its_kernel(tiny, monkeypatch):
    monkeypatch.setattr(bench, "QUICK_SIZES", (256,))
    monkeypatch.setenv(NO_NUMBA_ENV, "1")
    r = bench.run_bench(quick=True, repeat=1)
    assert r["machine"]["tile_kernel"] == "numpy" and r["machine"]["numba_disabled"]
    assert all(f["path"].startswith("tiled, numpy (exp") for f in r["forward"])


def test_bench_judges_against_the_faster_of_two_gemm_measurements(tiny, monkeypatch):
    rates = iter([50.0, 200.0])                          # a core was busy during the first measurement
    monkeypatch.setattr(bench, "gemm_gflops", lambda: next(rates))
    r = bench.run_bench(quick=True, repeat=1)
    assert r["gemm_gflops_measured"] == [50.0, 200.0] and r["gemm_gflops"] == 200.0
    for f in r["forward"]:
        assert f["of_gemm"] == pytest.approx(f["gflops"] / 200.0)


def test_bench_table_and_scale(tiny, capsys):
    assert main(["bench", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "numpy float32 GEMM: 100 GFLOP/s" in out and "decode: context" in out and "fwd+bwd: n" in out
    assert "SIMD: " in out and "BLAS: " in out and "tile kernel from " in out and "paths: [0]" in out
    assert "BLAS contention probe" in out and "40.0 ms, one thread 20.0 ms (ratio 2.00" in out
    assert main(["bench", "--scale", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["n"] == 128 and r["finite"] and r["seconds"] > 0


@pytest.mark.parametrize("argv, named", [(["--sizes", "0"], "sizes"), (["--sizes", "x"], "--sizes"),
                                         (["--cores", "0"], "cores"), (["--cores", "4096"], "cores"),
                                         (["--speed"], "--speed")])
def test_bench_bad_flag_is_one_line_exit_2(capsys, argv, named):
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab: error:") and named in err and err.count("\n") == 1


def test_bench_sizes_and_cores(tiny, monkeypatch):
    torch = pytest.importorskip("torch")
    import os

    before, threads = os.sched_getaffinity(0), torch.get_num_threads()
    seen = []
    row = bench.forward_row

    def spy(*args, **kw):                         # where the rows run: the pinned cores, torch's threads
        seen.append((len(os.sched_getaffinity(0)), torch.get_num_threads()))
        return row(*args, **kw)

    monkeypatch.setattr(bench, "forward_row", spy)
    r = bench.run_bench(quick=True, repeat=1, cores=1, sizes=[32, 48])
    assert [(f["n"], f["is_causal"]) for f in r["forward"]] == [(32, True), (32, False), (48, True), (48, False)]
    assert seen == [(1, 1)] * 4 and r["machine"]["cores"] == 1 and r["cores_asked"] == 1
    assert [b["num_threads"] for b in r["machine"]["blas"] if b["user_api"] == "blas"] in ([], [1])
    assert os.sched_getaffinity(0) == before and torch.get_num_threads() == threads      # restored
    assert bench.n_steps(quick=True, sizes=[32, 48]) == 1 + 2 + 4 + 1 + 1 + 1


def test_on_cores_restores_after_an_error():
    import os

    before = os.sched_getaffinity(0)
    with pytest.raises(RuntimeError):
        with bench.on_cores(1):
            assert len(os.sched_getaffinity(0)) == 1
            raise RuntimeError("inside")
    assert os.sched_getaffinity(0) == before


def test_n_steps_counts_the_steps_run_bench_announces(tiny):
    steps = []
    bench.run_bench(quick=True, progress=steps.append, repeat=1)
    assert bench.n_steps(quick=True) == len(steps) == 1 + 2 + 2 + 1 + 1 + 1   # first call, GEMM twice, 64
    #                                                                          causal/full, batch, decode, backward


def test_goal_table_judges_each_goal_by_its_worst_figure():
    row = lambda n, causal, ratio, of_gemm=0.5: {"n": n, "is_causal": causal, "ratio": ratio, "of_gemm": of_gemm}  # noqa: E731
    r = {"forward": [row(256, True, 1.4), row(512, False, 1.6), row(1024, True, 0.9), row(4096, False, 0.95, 0.65)],
         "batch": [{"batch": 32, "n": 128, "ratio": 1.1}], "decode": [{"context": 1024, "ratio": None}],
         "backward": [{"n": 1024, "ratio": 0.7}]}
    goals = {g["case"].split(",")[0]: g for g in bench.goal_table(r)}
    assert goals["tiled forward"]["worst"] == 0.95 and goals["tiled forward"]["met"] is True
    assert goals["n = 256 and 512"]["met"] is False and goals["n = 256 and 512"]["figures"] == {
        "n=256 causal": 1.4, "n=512 full": 1.6}
    assert goals["batch of 32 × 128 tokens"]["met"] is True
    assert goals["decode step at contexts 1024 and 4096"]["met"] is None          # torch missing: no verdict
    assert goals["share of numpy's GEMM rate at n >= 4096"]["worst"] == 0.65
    assert goals["backward (forward + backward)"]["met"] is True
    assert goals["memory of the tiled forward from n = 1024: extra peak (output included) / output"]["met"] is None
    assert goals["first call in a fresh process"]["met"] is None                 # not measured: no verdict
    r["first_call"] = FIRST_CALL
    first = {g["case"].split(",")[0]: g for g in bench.goal_table(r)}["first call in a fresh process"]
    assert first["figures"] == {"n=1024 causal": 5.0} and first["met"] is True


def test_goal_table_judges_memory_against_the_output():
    row = lambda n, path, extra: {"n": n, "is_causal": False, "path": path, "ratio": 1.0, "of_gemm": 0.7,   # noqa: E731
                                  "output_mib": 4.0, "extra_mib": extra}
    r = {"forward": [row(64, "naive, numpy softmax (exp)", 40.0), row(1024, "tiled, fused", 5.0),
                     row(2048, "tiled, fused", 6.4)], "batch": [], "decode": [], "backward": []}
    memory = next(g for g in bench.goal_table(r) if g["case"].startswith("memory"))
    assert memory["figures"] == {"n=1024 full": 1.25, "n=2048 full": 1.6}            # the naive row is not judged
    assert memory["worst"] == 1.6 and memory["met"] is False
