import numpy as np
import pytest

pytest.importorskip("matplotlib")

from attnlab.viz.charts import (  # noqa: E402
    save_floors, save_growth, save_histograms, save_lookup, save_score_grids, save_shapes, save_vectors)

PNG = b"\x89PNG\r\n\x1a\n"


def test_histograms_png(tmp_path, rng):
    path = tmp_path / "h.png"
    save_histograms(path, [("a", "x", {"one": rng.normal(size=100), "two": rng.normal(2, 1, 100)}),
                           ("b", "y", {"flat": np.ones(10)})], title="t")
    assert path.read_bytes()[:8] == PNG


def test_growth_png(tmp_path):
    path = tmp_path / "g.png"
    n = 2.0 ** np.arange(8)
    save_growth(path, n, {"n²": n**2, "n": n}, ylabel="count", marks=[(16, "mark")])
    assert path.read_bytes()[:8] == PNG


def test_chart_bad_input_leaves_no_file(tmp_path):
    with pytest.raises(ValueError, match="panels must hold at least one"):
        save_histograms(tmp_path / "h.png", [])
    with pytest.raises(ValueError, match="has no samples"):
        save_histograms(tmp_path / "h.png", [("a", "x", {})])
    with pytest.raises(ValueError, match="bins must be a positive integer, got 0"):
        save_histograms(tmp_path / "h.png", [("a", "x", {"s": np.array([1.0, 2.0])})], bins=0)
    with pytest.raises(ValueError, match="must be finite"):
        save_histograms(tmp_path / "h.png", [("a", "x", {"s": np.array([1.0, np.nan])})])
    with pytest.raises(ValueError, match=r"series\['y'\] must hold 3 positive values"):
        save_growth(tmp_path / "g.png", [1, 2, 3], {"y": [1, 0, 2]}, ylabel="y")
    with pytest.raises(ValueError, match="n must be a 1-D array of positive numbers"):
        save_growth(tmp_path / "g.png", [0, 1], {"y": [1, 2]}, ylabel="y")
    with pytest.raises(FileNotFoundError):
        save_growth(tmp_path / "missing" / "g.png", [1, 2], {"y": [1, 2]}, ylabel="y")
    assert list(tmp_path.rglob("*")) == []


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == PNG
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")   # IHDR width, height


def test_tour_figures_png(tmp_path):
    k = np.array([[0., 0.], [2., 0.], [1., 1.]])
    save_floors(tmp_path / "f.png", [0, 1, 2], [2.3, 0.9, 0.3], [127, 127, 126])
    save_lookup(tmp_path / "l.png", [1., 0.], k, np.eye(3)[:, :2], ["the", "cat", "sat"])
    s = np.array([[0.5, -np.inf], [1.0, -2.0]])
    save_score_grids(tmp_path / "g.png", [("S + M", s, ["a", "b"], ["a", "b"], "scores"),
                                          ("A", np.array([[1., 0.], [0.9, 0.1]]), ["a", "b"], ["a", "b"], "weights")])
    save_vectors(tmp_path / "v.png", [("x", {"one": [1., -1.], "two": [0.5, 0.]})])
    save_shapes(tmp_path / "s.png", [(("X", (5, 768)), ("W", (768, 64)), ("Q", (5, 64)))], title="t")
    sizes = {p.name: png_size(p) for p in tmp_path.iterdir()}
    assert sizes["f.png"] == (640, 360) and sizes["l.png"] == (840, 360) and sizes["g.png"] == (680, 320)
    assert sizes["v.png"] == (420, 320) and sizes["s.png"][0] == 700


def test_tour_figures_bad_input_leaves_no_file(tmp_path):
    k = np.array([[0., 0.], [2., 0.]])
    with pytest.raises(ValueError, match=r"k, floors and predictions must be three 1-D arrays of one length"):
        save_floors(tmp_path / "f.png", [0, 1], [2.3, 0.9], [127])
    with pytest.raises(ValueError, match=r"query must have shape \(2,\), keys \(m, 2\).*got \(3,\)"):
        save_lookup(tmp_path / "l.png", [1., 0., 0.], k, k, ["a", "b"])
    with pytest.raises(ValueError, match="and 1 names"):
        save_lookup(tmp_path / "l.png", [1., 0.], k, k, ["a"])
    with pytest.raises(ValueError, match=r"panel 'S' must be a \(2, 2\) grid of kind 'scores' or 'weights', "
                                         r"got shape \(2, 3\)"):
        save_score_grids(tmp_path / "g.png", [("S", np.zeros((2, 3)), "ab", "ab", "scores")])
    with pytest.raises(ValueError, match="kind 'bias'"):
        save_score_grids(tmp_path / "g.png", [("S", np.zeros((2, 2)), "ab", "ab", "bias")])
    with pytest.raises(ValueError, match=r"panel 'x' must hold vectors of one length, got \[2, 3\]"):
        save_vectors(tmp_path / "v.png", [("x", {"a": [1., 2.], "b": [1., 2., 3.]})])
    with pytest.raises(ValueError, match="a matrix size must be a positive integer, got 0"):
        save_shapes(tmp_path / "s.png", [(("X", (0, 4)), ("W", (4, 4)), ("Q", (0, 4)))])
    for save, args in ((save_score_grids, ([],)), (save_vectors, ([],)), (save_shapes, ([],))):
        with pytest.raises(ValueError, match="must hold at least one"):
            save(tmp_path / "x.png", *args)
    assert list(tmp_path.iterdir()) == []
