"""attnlab bench on tiny sizes: the data it returns and the table it prints (no timing is asserted)."""

import json

import numpy as np
import pytest

from attnlab import bench
from attnlab.cli import main


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(bench, "QUICK_SIZES", (64,))
    monkeypatch.setattr(bench, "DECODE_CONTEXTS", (32,))
    monkeypatch.setattr(bench, "QUICK_BACKWARD_SIZES", (32,))
    monkeypatch.setattr(bench, "SCALE_N", 128)
    monkeypatch.setattr(bench, "gemm_gflops", lambda: 100.0)


def test_attention_flops_counts_the_visible_scores():
    assert bench.attention_flops(4, False) == 2 * 16 * 2 * 64 * 12
    assert bench.attention_flops(4, True) == 2 * 10 * 2 * 64 * 12     # 4 + 3 + 2 + 1 scores


def test_median_times_alternates_and_takes_the_median():
    order = []
    ms = bench.median_times({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, repeat=3)
    assert order == ["a", "b"] * 4 and set(ms) == {"a", "b"} and all(t >= 0 for t in ms.values())


def test_extra_peak_counts_numpy_allocations():
    assert 7.9 < bench.extra_peak_mib(lambda: np.ones(2**20)) < 8.5          # 8 MiB of float64


def test_bench_json_has_every_section(tiny, capsys):
    assert main(["bench", "--quick", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert [(f["n"], f["is_causal"]) for f in r["forward"]] == [(64, True), (64, False)]
    f = r["forward"][0]
    assert f["tiled_ms"] > 0 and f["naive_ms"] > 0 and f["tiled_vs_gemm"] == pytest.approx(f["tiled_gflops"] / 100)
    assert [d["context"] for d in r["decode"]] == [32] and [b["n"] for b in r["backward"]] == [32]
    assert r["gemm_gflops"] == 100.0 and isinstance(r["blas"], list)


def test_bench_judges_against_the_faster_of_two_gemm_measurements(tiny, monkeypatch):
    rates = iter([50.0, 200.0])                          # a core was busy during the first measurement
    monkeypatch.setattr(bench, "gemm_gflops", lambda: next(rates))
    r = bench.run_bench(quick=True)
    assert r["gemm_gflops_measured"] == [50.0, 200.0] and r["gemm_gflops"] == 200.0
    for f in r["forward"]:
        assert f["tiled_vs_gemm"] == pytest.approx(f["tiled_gflops"] / 200.0)


def test_bench_table_and_scale(tiny, capsys):
    assert main(["bench", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "numpy float32 GEMM: 100 GFLOP/s" in out and "decode: context" in out and "backward: n" in out
    assert main(["bench", "--scale", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["n"] == 128 and r["finite"] and r["seconds"] > 0


def test_bench_bad_flag_is_one_line_exit_2(capsys):
    assert main(["bench", "--sizes", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab: error:") and "--sizes" in err and err.count("\n") == 1


def test_n_steps_counts_the_steps_run_bench_announces(tiny):
    steps = []
    bench.run_bench(quick=True, progress=steps.append)
    assert bench.n_steps(quick=True) == len(steps) == 2 + 2 + 1 + 1   # GEMM twice, 64 causal/full, decode, backward
