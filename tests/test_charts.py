import numpy as np
import pytest

pytest.importorskip("matplotlib")

from attnlab.viz.charts import save_growth, save_histograms  # noqa: E402

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
