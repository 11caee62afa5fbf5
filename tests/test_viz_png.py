"""PNG views: decoded, sized, and masked cells told apart from zero-weight cells."""

import os

import numpy as np
import pytest

pytest.importorskip("matplotlib")
import matplotlib.image as mpimg  # noqa: E402
from matplotlib import colormaps  # noqa: E402

from attnlab import AttentionMap, causal_mask  # noqa: E402
from attnlab.viz import demo_map, save_head, save_layer, save_mask, save_model_view  # noqa: E402
from attnlab.viz.png import (DPI, MAX_PNG_TOKENS, MOST_INCHES, fit_grid, head_figure,  # noqa: E402
                             layer_figure, model_view_figure)

# Three tokens, causal: cells (1, 0) and (2, 1) are visible with weight exactly 0; (0, 1), (0, 2), (1, 2) masked.
WEIGHTS = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.5, 0.0, 0.5]])
TOKENS = ("The", " cat", " sat")
ZERO_CELLS, MASKED_CELLS = [(1, 0), (2, 1)], [(0, 1), (0, 2), (1, 2)]


@pytest.fixture
def amap():
    return AttentionMap(tokens=TOKENS, weights=np.broadcast_to(WEIGHTS, (2, 3, 3, 3)).copy(),
                        keep=causal_mask(3), source="hand-made")


def _decode(path):
    img = mpimg.imread(path)                          # (height, width, 4) floats in [0, 1]
    assert img.ndim == 3 and img.shape[2] in (3, 4)
    return img[..., :3]


def _assert_size(img, fig):
    """The PNG is the figure's size in pixels (to the pixel matplotlib rounds off)."""
    want = fig.get_size_inches()[::-1] * DPI                # (height, width)
    assert np.all(np.abs(np.array(img.shape[:2]) - want) <= 1), (img.shape, want)


def _cell_colour(fig, img, ax_index, i, j):
    """Mean colour of the top band of cell (i, j) of axes ``ax_index`` (above any value written in it)."""
    ax = fig.axes[ax_index]
    (x0, y0), (x1, y1) = ax.transData.transform([(j - 0.4, i - 0.42), (j + 0.4, i - 0.22)])
    h = img.shape[0]                                   # display y grows upwards, image rows downwards
    rows = slice(int(round(h - max(y0, y1))), int(round(h - min(y0, y1))))
    cols = slice(int(round(min(x0, x1))), int(round(max(x0, x1))))
    patch = img[rows, cols]
    assert patch.size > 0
    return patch.reshape(-1, 3).mean(0)


def _assert_masked_differs_from_zero(fig, img, ax_index):
    fig.draw_without_rendering()                       # runs the layout, as savefig does
    blues0 = np.array(colormaps["Blues"](0.0)[:3])
    for i, j in ZERO_CELLS:
        zero = _cell_colour(fig, img, ax_index, i, j)
        np.testing.assert_allclose(zero, blues0, atol=0.03)            # weight 0: the ramp's near-white
        for mi, mj in MASKED_CELLS:
            masked = _cell_colour(fig, img, ax_index, mi, mj)
            assert np.abs(masked - zero).sum() > 0.3, (masked, zero)     # clearly another colour
            assert np.ptp(masked) < 0.05 and masked.mean() < 0.85         # grey


def test_head_png_size_and_masked_cells(tmp_path):
    path = tmp_path / "head.png"
    save_head(path, WEIGHTS, TOKENS, keep=causal_mask(3), title="hand")
    img = _decode(path)
    fig = head_figure(WEIGHTS, TOKENS, keep=causal_mask(3), title="hand")
    _assert_size(img, fig)
    _assert_masked_differs_from_zero(fig, img, 0)


def test_layer_png_has_a_panel_per_head(tmp_path, amap):
    path = tmp_path / "layer.png"
    save_layer(path, amap, 1)
    img = _decode(path)
    fig = layer_figure(amap, 1)
    _assert_size(img, fig)
    panels = [ax for ax in fig.axes if ax.get_title().startswith("head")]
    assert len(panels) == amap.n_heads
    for k in range(amap.n_heads):
        _assert_masked_differs_from_zero(fig, img, k)


def test_model_view_png_has_layers_by_heads_thumbnails(tmp_path, amap):
    path = tmp_path / "model.png"
    save_model_view(path, amap)
    img = _decode(path)
    fig = model_view_figure(amap)
    _assert_size(img, fig)
    thumbs = [ax for ax in fig.axes if ax.images and ax.get_label() != "<colorbar>"]
    assert len(thumbs) == amap.n_layers * amap.n_heads
    _assert_masked_differs_from_zero(fig, img, amap.n_heads + 1)        # layer 1, head 1


def test_mask_png(tmp_path):
    path = tmp_path / "mask.png"
    save_mask(path, TOKENS)
    assert _decode(path).shape[0] > 100


def test_values_are_written_in_small_grids_only(amap):
    small = head_figure(WEIGHTS, TOKENS, keep=causal_mask(3))
    texts = {t.get_text() for t in small.axes[0].texts}
    assert {"1.000", "0.500", "0.000"} <= texts and len(small.axes[0].texts) == int(causal_mask(3).sum())
    big = demo_map([f"t{i}" for i in range(40)], rng=np.random.default_rng(0), n_layers=1)
    assert not head_figure(big.head(0, 0), big.tokens, keep=big.keep).axes[0].texts


def test_many_tokens_are_downscaled_with_a_note(tmp_path):
    m = demo_map([f"t{i}" for i in range(300)], rng=np.random.default_rng(0), n_layers=1)
    fig = head_figure(m.head(0, 0), m.tokens, keep=m.keep)
    assert "downscaled: 300 tokens" in fig.axes[0].get_title()
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert 10 < len(labels) < 300 and labels[:2] == ["t0", f"t{fit_grid(300, 300).step}"]
    save_head(tmp_path / "h.png", m.head(0, 0), m.tokens, keep=m.keep)
    h, w = _decode(tmp_path / "h.png").shape[:2]
    assert max(h, w) <= (MOST_INCHES + 3) * DPI                         # bounded, not 300 · 0.45 in
    assert "token labels left out" in model_view_figure(m)._suptitle.get_text()


def test_too_many_tokens_is_a_clear_error(tmp_path):
    n = MAX_PNG_TOKENS + 1
    with pytest.raises(ValueError, match=rf"{n} tokens are too many for a readable PNG.*save_html"):
        save_head(tmp_path / "x.png", np.zeros((n, n)), [str(i) for i in range(n)])
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("save", [
    lambda p, m: save_layer(p, m, 0), save_model_view, lambda p, m: save_head(p, m.head(0, 0), m.tokens),
    lambda p, m: save_mask(p, m.tokens)])
def test_unwritable_path_names_the_path(tmp_path, amap, save):
    missing = tmp_path / "no-such-folder" / "x.png"
    with pytest.raises(FileNotFoundError) as e:
        save(missing, amap)
    assert str(missing.parent) in str(e.value)
    with pytest.raises(IsADirectoryError) as e:
        save(tmp_path, amap)
    assert str(tmp_path) in str(e.value)
    assert not os.listdir(tmp_path)                                    # no half file left behind


def test_a_folder_that_refuses_files_names_the_path_asked_for(tmp_path, amap, monkeypatch):
    import tempfile

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / ".x.png.abc.part"))
    monkeypatch.setattr(tempfile, "mkstemp", refuse)                      # what a read-only folder does, even as root
    with pytest.raises(PermissionError) as e:
        save_layer(tmp_path / "x.png", amap, 0)
    assert e.value.filename == str(tmp_path / "x.png") and "Permission denied" in e.value.strerror


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write into a read-only folder")
def test_read_only_folder_names_the_path(tmp_path, amap):
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(PermissionError) as e:
            save_model_view(tmp_path / "x.png", amap)
        assert e.value.filename == str(tmp_path / "x.png")
    finally:
        tmp_path.chmod(0o700)


def test_bad_input_is_named(amap):
    with pytest.raises(ValueError, match="layer must be an integer from 0 to 1, got 2"):
        layer_figure(amap, 2)
    with pytest.raises(TypeError, match="amap must be an attnlab.AttentionMap, got ndarray"):
        model_view_figure(WEIGHTS)
    with pytest.raises(TypeError, match="labels_up_to"):
        model_view_figure(amap, labels_up_to="8")
    with pytest.raises(ValueError, match="tokens .* do not match weights"):
        head_figure(WEIGHTS, TOKENS[:2])
