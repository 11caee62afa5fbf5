"""The HTML view in a real headless Chromium (Debian's ``chromium`` package), driven by Playwright.

Chromium starts with the flags CI uses and an empty ``--user-data-dir`` (Playwright's persistent
context is given a fresh folder). Nothing is downloaded: Playwright drives /usr/bin/chromium, and any
request the page makes other than its own file is refused and counted.
"""

import io
import math
import re
import shutil

import numpy as np
import pytest

from attnlab import AttentionMap
from attnlab.viz import demo_map, save_html, show

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("Debian's chromium is not installed (apt-get install -y chromium): HTML view browser tests skipped",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (it is in the 'test' extra)")

FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
         "--disable-component-update", "--disable-sync", "--disable-quic"]   # plus --headless, from Playwright
EVIL = "<script>alert(1)</script>"
SNEAKY = '<img src=x onerror="window.__pwned = 1">'


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    profile = tmp_path_factory.mktemp("chromium-profile")                 # empty --user-data-dir
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=FLAGS,
            viewport={"width": 1400, "height": 1000}, device_scale_factor=1)
        yield context
        context.close()


class Page:
    """A page of the view, with what it logged: errors, dialogs, and requests to anything but itself."""

    def __init__(self, context):
        self.page = context.new_page()
        self.errors, self.dialogs, self.requests = [], [], []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.route(re.compile(r"^(?!file:|about:|data:|blob:)"), self._refuse)

    def _refuse(self, route):
        self.requests.append(route.request.url)
        route.abort()

    def open(self, path):
        self.page.goto(path.as_uri())
        self.page.wait_for_function("document.body.dataset.ready")
        assert self.page.evaluate("document.body.dataset.ready") == "1", self.page.inner_text("#status")
        return self.page

    def pixels(self, canvas_id):
        """A hash of the canvas's pixels, and how many of them are not white."""
        return tuple(self.page.evaluate("""(id) => {
            const c = document.getElementById(id), d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
            let h = 0, ink = 0;
            for (let i = 0; i < d.length; i += 4) {
              h = (h * 31 + d[i] + 7 * d[i + 1] + 13 * d[i + 2]) % 1000000007;
              if (d[i] < 240 || d[i + 1] < 240 || d[i + 2] < 240) ink++;
            }
            return [h, ink];
        }""", canvas_id))

    def hover_query(self, i, row_height=20):
        box = self.page.locator("#head-view").bounding_box()
        self.page.mouse.move(box["x"] + 100, box["y"] + 4 + row_height * i + row_height / 2)
        return self.shown_row()

    def shown_row(self):
        self.page.wait_for_function("() => new Promise(r => requestAnimationFrame(() => r(true)))")
        return self.page.inner_text("#row")

    def close(self):
        self.page.close()


@pytest.fixture
def view(browser):
    v = Page(browser)
    yield v
    v.close()


@pytest.fixture
def amap():
    return demo_map(["The", " cat", " sat", EVIL, " on", SNEAKY, " mat"], rng=np.random.default_rng(3), n_layers=2)


SHOWN = 0.5e-3 + 1 / 65535      # three decimals, of weights stored as 16-bit fractions


def _same_top(top, want):
    """The readout's best key is the argmax of ``want`` and its weight is ``want``'s max, as printed."""
    return top[1] == int(want.argmax()) and abs(top[0] - float(want.max())) <= SHOWN


def _top_keys(row_text):
    """(weight, key index) pairs from the row readout, e.g. '0.994  #2 sat'."""
    return [(float(w), int(j)) for w, j in re.findall(r"^(\d\.\d{3})  #(\d+) ", row_text, re.M)]


def test_page_renders_offline(tmp_path, view, amap):
    save_html(tmp_path / "view.html", amap)
    page = view.open(tmp_path / "view.html")
    assert page.inner_text("#status") == "2 layers × 4 heads, 7 queries × 7 keys"
    for canvas in ("head-view", "grid", "model-view"):
        assert view.pixels(canvas)[1] > 500, canvas                     # drawn, not blank
    assert page.locator("#summary tbody tr").count() == amap.n_heads
    assert page.locator("#layer option").count() == 2 and page.locator("#head option").count() == 4
    assert view.errors == [] and view.requests == [] and view.dialogs == []


def test_hover_and_click_change_the_weights_shown(tmp_path, view, amap):
    save_html(tmp_path / "view.html", amap)
    page = view.open(tmp_path / "view.html")
    before_row, before_lines = page.inner_text("#row"), view.pixels("head-view")
    row = view.hover_query(2)
    assert row != before_row and "query #2  sat" in row
    assert view.pixels("head-view") != before_lines                    # lines drawn for query 2
    top = _top_keys(row)
    want = amap.weights[0, 0, 2]
    assert _same_top(top[0], want)
    assert [j for _, j in top] == [j for j in np.argsort(-want, kind="stable") if j <= 2]
    row6 = view.hover_query(6)
    assert row6 != row and _top_keys(row6)[0][1] == int(amap.weights[0, 0, 6].argmax())
    box = page.locator("#head-view").bounding_box()
    page.mouse.move(box["x"] + 400, box["y"] + 4 + 20 * 1 + 10)          # key 1: its column instead
    column = view.shown_row()
    assert column.startswith("layer 0, head 0, key #1  cat")
    top_queries = [(float(w), int(i)) for w, i in re.findall(r"^(\d\.\d{3})  #(\d+) ", column, re.M)]
    want = amap.weights[0, 0, :, 1]
    assert _same_top(top_queries[0], want) and len(top_queries) == min(8, len(want) - 1)   # query 0 cannot see it
    page.mouse.click(*_query_point(page, 4))                            # pin query 4 ...
    page.mouse.move(5, 5)                                               # ... and leave the canvas
    assert "query #4" in view.shown_row()
    page.select_option("#head", "2")                                    # another head: its row for query 4
    assert _top_keys(view.shown_row())[0][1] == int(amap.weights[0, 2, 4].argmax())


def _query_point(page, i, row_height=20):
    box = page.locator("#head-view").bounding_box()
    return box["x"] + 100, box["y"] + 4 + row_height * i + row_height / 2


def test_picking_layer_and_head(tmp_path, view, amap):
    save_html(tmp_path / "view.html", amap)
    page = view.open(tmp_path / "view.html")
    grid = view.pixels("grid")
    page.select_option("#head", "3")
    assert view.pixels("grid") != grid
    assert page.inner_text("#summary tbody tr.selected").startswith("head 3")
    box = page.locator("#model-view").bounding_box()
    thumb = page.evaluate("Math.max(24, Math.min(64, Math.floor(720 / 4)))")
    page.mouse.click(box["x"] + 60 + 1 * (thumb + 4) + thumb / 2, box["y"] + 20 + 1 * (thumb + 4) + thumb / 2)
    assert page.input_value("#layer") == "1" and page.input_value("#head") == "1"
    assert page.inner_text("#summary-title") == "Per-head summary, layer 1"


def test_escaped_tokens_show_as_text_and_do_not_run(tmp_path, view, amap):
    evil_map = AttentionMap(tokens=amap.tokens, weights=amap.weights, keep=amap.keep,
                            source="</script><script>alert(2)</script>")
    save_html(tmp_path / "view.html", evil_map)
    page = view.open(tmp_path / "view.html")
    assert page.inner_text(".source") == "</script><script>alert(2)</script>"
    assert page.title() == "attnlab · </script><script>alert(2)</script>"
    assert EVIL in view.hover_query(3)                                    # the token, as text
    assert SNEAKY in view.hover_query(5)
    page.wait_for_timeout(200)
    assert view.dialogs == [] and page.evaluate("window.__pwned") is None and view.errors == []
    assert page.locator("script").count() == 2 and page.locator("img").count() == 0


def test_screenshots_decode(tmp_path, view, amap):
    mpimg = pytest.importorskip("matplotlib.image")
    save_html(tmp_path / "view.html", amap)
    page = view.open(tmp_path / "view.html")
    view.hover_query(5)
    for name, shot in (("page", page.screenshot()),
                       ("head view", page.locator("#head-view").screenshot()),
                       ("model view", page.locator("#model-view").screenshot())):
        assert shot[:8] == b"\x89PNG\r\n\x1a\n", name
        img = mpimg.imread(io.BytesIO(shot), format="png")              # (height, width, channels)
        assert min(img.shape[:2]) >= 100, (name, img.shape)
        colours = np.unique((img[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
        assert len(colours) > 20, name                                   # a picture, not a blank
    assert page.locator("#head-view").bounding_box()["width"] >= 500


def test_512_tokens_render_and_respond(tmp_path, view):
    m = demo_map([f"t{i}" for i in range(512)], rng=np.random.default_rng(5), n_layers=2)
    save_html(tmp_path / "long.html", m)
    page = view.open(tmp_path / "long.html")
    assert page.inner_text("#status") == "2 layers × 4 heads, 512 queries × 512 keys"
    assert page.evaluate("document.querySelectorAll('body *').length") < 200   # canvases, not a node per cell
    box = page.locator("#grid").bounding_box()
    size = page.evaluate("document.getElementById('grid').clientWidth") - 2   # no label margin; 2 px for the outline
    for q in (100, 450):
        y = math.ceil(box["y"] + q * size / 512 + 0.01)                   # mouse events land on whole pixels
        page.mouse.move(math.ceil(box["x"] + 0.01), y)
        row = view.shown_row()
        assert f"query #{q} " in row
        assert _same_top(_top_keys(row)[0], m.weights[0, 0, q])
        shown = re.fullmatch(rf"query #{q} t{q} → key #0 t0: (\d\.\d{{3}})", page.inner_text("#readout"))
        assert abs(float(shown.group(1)) - m.weights[0, 0, q, 0]) <= SHOWN
    assert view.errors == []


def test_repr_html_renders_in_an_iframe(view, amap):
    view.page.set_content(show(amap)._repr_html_())
    frame = view.page.frame_locator("iframe")
    frame.locator("body[data-ready='1']").wait_for()
    assert frame.locator("#status").inner_text() == "2 layers × 4 heads, 7 queries × 7 keys"
    assert view.errors == [] and view.dialogs == []


def test_fewer_queries_than_keys(tmp_path, view):
    a = np.array([[0.1, 0.2, 0.7, 0.0], [0.25, 0.25, 0.25, 0.25]])          # 2 queries, 4 keys (a cache)
    m = AttentionMap(tokens=("a", "b", "c", "d"), weights=a, keep=np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool))
    save_html(tmp_path / "rect.html", m)
    page = view.open(tmp_path / "rect.html")
    assert page.inner_text("#status") == "1 layers × 1 heads, 2 queries × 4 keys"
    row = view.hover_query(0)
    assert "query #2 c" in row and _top_keys(row) == [(0.7, 2), (0.2, 1), (0.1, 0)]   # the masked key left out
    assert view.errors == []


def test_grouped_query_heads_name_their_kv_head(browser, tmp_path, rng):
    w = rng.random((2, 6, 3, 3))
    m = AttentionMap(tokens=("a", "b", "c"), weights=w / w.sum(-1, keepdims=True), n_kv_heads=2)
    save_html(tmp_path / "gqa.html", m, layer=1, head=4)
    p = Page(browser)
    page = p.open(tmp_path / "gqa.html")
    options = page.eval_on_selector_all("#head option", "os => os.map(o => o.textContent)")
    assert options == [f"head {h} (KV head {h // 3})" for h in range(6)]
    assert page.eval_on_selector("#summary", "t => t.tBodies[0].rows[4].cells[0].textContent") == "head 4 (KV head 1)"
    assert p.errors == [] and p.requests == []


def test_neuron_view_shows_the_scores_of_the_query(tmp_path, view, rng):
    """Hovering a query draws its q, k and q ∘ k rows, and the readout's best score is scale · q·k's max."""
    q, k = rng.normal(size=(1, 2, 6, 8)), rng.normal(size=(1, 2, 6, 8))          # (L, h, n, d_head)
    keep = np.tril(np.ones((6, 6), bool))
    s = np.where(keep, q @ np.swapaxes(k, -1, -2) / np.sqrt(8), -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    amap = AttentionMap(tuple("abcdef"), w / w.sum(-1, keepdims=True), keep=keep, queries=q, keys=k)
    save_html(tmp_path / "view.html", amap)
    page = view.open(tmp_path / "view.html")
    blank = view.pixels("neuron")
    view.hover_query(4)
    text = page.inner_text("#neuron-readout")
    assert "query #4" in text and view.pixels("neuron")[1] > blank[1] + 200
    scores = [float(x) for x in re.findall(r"score (-?\d+\.\d{4})", text)]
    want = np.sort(s[0, 0, 4, :5])[::-1]
    np.testing.assert_allclose(scores, want, atol=1e-4)
    assert view.errors == []
