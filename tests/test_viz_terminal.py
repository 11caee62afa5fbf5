"""Terminal grids: coloured cells with token labels, fitted to the width, saying what was elided."""

import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab import AttentionMap, causal_mask
from attnlab.viz import demo_map, terminal_text
from attnlab.viz._style import MASKED_COLOUR, shade
from attnlab.viz.terminal import cell_width, layout_grid

rich = pytest.importorskip("rich")
from rich.console import Console  # noqa: E402

from attnlab.viz import terminal_grid  # noqa: E402


def _render(renderable, width=80):
    console = Console(file=io.StringIO(), width=width, record=True, color_system="truecolor", force_terminal=True)
    console.print(renderable)
    return console


def _map(n, rng, tokens=None):
    return demo_map(tokens or [f"w{i}" for i in range(n)], rng=rng, n_layers=1)


def test_small_grid_shows_every_value_and_label(rng):
    m = AttentionMap(tokens=("The", " cat", " sat"),
                     weights=np.array([[1.0, 0.0, 0.0], [0.42, 0.58, 0.0], [0.1, 0.2, 0.7]]), keep=causal_mask(3))
    text = terminal_text(m, 0, 0)
    lines = text.splitlines()
    assert lines[1].split() == ["The", "cat", "sat"]
    assert lines[2].split() == ["The", "1.0", "·", "·"]
    assert lines[3].split() == ["cat", ".42", ".58", "·"]
    assert lines[4].split() == ["sat", ".10", ".20", ".70"]
    assert "Elided" not in text
    rendered = _render(terminal_grid(m, 0, 0)).export_text()
    assert [r.rstrip() for r in rendered.splitlines()[1:5]] == lines[1:5]   # the same grid, with colour


def test_cells_are_coloured_by_weight_and_masked_cells_grey(rng):
    m = AttentionMap(tokens=("a", "b"), weights=np.array([[1.0, 0.0], [0.0, 1.0]]), keep=causal_mask(2))
    console = Console(width=80, color_system="truecolor", force_terminal=True)
    segments = list(console.render(terminal_grid(m, 0, 0)))
    background = {seg.text: seg.style.bgcolor.get_truecolor() for seg in segments
                  if seg.style and seg.style.bgcolor}
    assert tuple(background[" 1.0"]) == shade(1.0)
    assert tuple(background[" .00"]) == shade(0.0)                       # weight 0: near-white
    grey = tuple(int(MASKED_COLOUR[i:i + 2], 16) for i in (1, 3, 5))
    assert tuple(background["  · "]) == grey != shade(0.0)               # masked: grey, not the 0 colour


def test_wide_grid_is_elided_to_80_columns_and_says_so(rng):
    m = _map(60, rng)
    text = terminal_text(m, 0, 0, max_rows=10)
    assert all(len(line) <= 80 for line in text.splitlines())
    header = text.splitlines()[1].split()
    assert header[0] == "w0" and header[-1] == "w59" and "…" in header
    note = " ".join(text.split())
    assert "keys 9–50 (42 of 60)" in note and "queries 4–54 (51 of 60)" in note
    console = _render(terminal_grid(m, 0, 0, max_rows=10))
    lines = console.export_text().splitlines()
    assert all(cell_width(line) <= 80 for line in lines)
    assert "Elided to fit 80 columns" in " ".join(lines)
    narrow = _render(terminal_grid(m, 0, 0, width=50), width=120).export_text().splitlines()
    assert all(cell_width(line.rstrip()) <= 50 for line in narrow)       # the width asked for, not the console's


def test_elided_rows_keep_the_values_of_the_rows_shown(rng):
    m = _map(30, rng)
    g = layout_grid(m, 0, 2, width=80, max_rows=9)
    header = "".join(t for t, _ in g.lines[0]).split()
    last = "".join(t for t, _ in g.lines[-1]).split()
    assert last[0] == "w29" and len(header) == len(last) - 1 and header[0] == "w0" and header[-1] == "w29"
    cols = [int(t[1:]) for t in header if t != "…"]
    shown = [float(v) for v in last[1:] if v != "…"]
    np.testing.assert_allclose(shown, m.head(0, 2)[29, cols], atol=0.0051)   # two places


def test_user_text_is_shown_literally(rng):
    tokens = ["[bold]x[/]", "<script>alert(1)</script>", "line\nbreak", "猫猫猫猫猫猫猫猫"]
    m = _map(4, rng, tokens)
    out = _render(terminal_grid(m, 0, 0)).export_text()
    assert "[bold]x[/]" in out and "<script>a…" in out and "line↵break" in out         # rows: cut to fit
    assert "1=<script>alert(1)</script>" in out                                       # the legend: in full
    assert all(cell_width(line) <= 80 for line in out.splitlines())


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 70), width=st.integers(30, 120), label=st.text(min_size=1, max_size=20))
def test_every_line_fits_the_width(n, width, label):
    m = demo_map([label] * n, rng=np.random.default_rng(n), n_layers=1)
    assert all(cell_width(line) <= width for line in terminal_text(m, 0, 0, width).splitlines())
    g = layout_grid(m, 0, 0, width=width)
    assert all(sum(cell_width(t) for t, _ in line) <= width for line in g.lines)


def test_bad_input_is_named(rng):
    m = _map(3, rng)
    with pytest.raises(ValueError, match="head must be an integer from 0 to 3, got 9"):
        terminal_grid(m, 0, 9)
    with pytest.raises(ValueError, match="width must leave room"):
        terminal_text(m, 0, 0, width=10)
    with pytest.raises(TypeError, match="width must be a positive integer"):
        terminal_text(m, 0, 0, width=80.0)
    with pytest.raises(TypeError, match="amap must be an attnlab.AttentionMap"):
        terminal_text(np.eye(3), 0, 0)


def test_fewer_queries_than_keys_label_the_last_tokens():
    m = AttentionMap(tokens=("a", "b", "c"), weights=np.array([[0.5, 0.25, 0.25]]))
    lines = terminal_text(m, 0, 0).splitlines()
    assert lines[1].split() == ["a", "b", "c"] and lines[2].split() == ["c", ".50", ".25", ".25"]
