// attnlab's tour widgets, plain JavaScript: the soft lookup on a plane, the sqrt(d_k) slider, the causal
// mask toggle. Every number shown is also put, unrounded, in its element's data-value, so a test can hold
// it against numpy. User-visible text goes through textContent only.
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("tour-data").textContent);
  const $ = (id) => document.getElementById(id);
  const SVG = "http://www.w3.org/2000/svg";
  const BLUES = ["#f7fbff", "#deebf7", "#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c", "#08306b"]
    .map((c) => [1, 3, 5].map((i) => parseInt(c.slice(i, i + 2), 16)));

  function shade(w) {                                 // the Blues ramp, as attnlab.viz._style.shade
    const x = Math.min(Math.max(w, 0), 1) * (BLUES.length - 1), i = Math.min(Math.floor(x), BLUES.length - 2);
    const rgb = BLUES[i].map((c, k) => Math.round(c + (x - i) * (BLUES[i + 1][k] - c)));
    return `rgb(${rgb[0]},${rgb[1]},${rgb[2]})`;
  }
  function softmax(z) {                               // a row; -Infinity entries get weight exactly 0
    const m = Math.max(...z), e = z.map((v) => Math.exp(v - m)), s = e.reduce((a, b) => a + b, 0);
    return e.map((v) => v / s);
  }
  function show(el, x, digits = 3) {                  // rounded for the eye, exact in data-value
    el.textContent = x.toFixed(digits);
    el.dataset.value = String(x);
    return el;
  }
  function el(tag, attrs = {}, parent = null, ns = null) {
    const e = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (parent) parent.appendChild(e);
    return e;
  }

  // ---- soft lookup: drag the query; scores, weights, output and the hard-lookup verdict follow ----
  function lookup() {
    const L = D.lookup, svg = $("lookup-plane");
    if (!L || !svg) return;
    const size = 360, R = L.range, px = (x) => (x + R) / (2 * R) * size, py = (y) => (R - y) / (2 * R) * size;
    const toData = (sx, sy) => [sx / size * 2 * R - R, R - sy / size * 2 * R];
    for (let t = -R; t <= R; t++) {                   // grid, axes thicker, a number every 4
      const a = { stroke: t === 0 ? "#888" : "#eee", "stroke-width": t === 0 ? 1.2 : 1 };
      el("line", { x1: px(t), y1: 0, x2: px(t), y2: size, ...a }, svg, SVG);
      el("line", { x1: 0, y1: py(t), x2: size, y2: py(t), ...a }, svg, SVG);
      if (t !== 0 && t % 4 === 0 && Math.abs(t) < R) {
        el("text", { x: px(t), y: py(0) + 13, "font-size": 10, fill: "#999", "text-anchor": "middle" }, svg, SVG).textContent = t;
        el("text", { x: px(0) - 4, y: py(t) + 3, "font-size": 10, fill: "#999", "text-anchor": "end" }, svg, SVG).textContent = t;
      }
    }
    const place = (k) => (k[0] === 0 && k[1] === 0 ? [-8, 16, "end"] : k[1] > 0 ? [-6, -8, "end"] : [6, 16, "start"]);
    L.keys.forEach((k, i) => {
      el("line", { x1: px(0), y1: py(0), x2: px(k[0]), y2: py(k[1]), stroke: "#2171b5", "stroke-width": 2.5 }, svg, SVG);
      el("circle", { cx: px(k[0]), cy: py(k[1]), r: 5, fill: "#2171b5" }, svg, SVG);
      const [dx, dy, anchor] = place(k);
      const t = el("text", { x: px(k[0]) + dx, y: py(k[1]) + dy, "font-size": 13, "font-weight": 600, fill: "#08306b",
                             "text-anchor": anchor }, svg, SVG);
      t.textContent = L.tokens[i];
    });
    el("text", { x: 6, y: 16, "font-size": 12, fill: "#2171b5" }, svg, SVG).textContent = "blue: the keys";
    el("text", { x: 6, y: 31, "font-size": 12, fill: "#e6550d" }, svg, SVG).textContent = "orange: the query (drag it)";
    const qLine = el("line", { x1: px(0), y1: py(0), stroke: "#e6550d", "stroke-width": 2 }, svg, SVG);
    const qDot = el("circle", { r: 8, fill: "#fd8d3c", stroke: "#a63603", "stroke-width": 2, id: "lookup-query" }, svg, SVG);
    const tbody = $("lookup-table").tBodies[0];
    const rows = L.tokens.map((tok, i) => {
      const tr = el("tr", {}, tbody);
      el("th", {}, tr).textContent = tok;
      el("td", {}, tr).textContent = `[${L.keys[i].join(", ")}]`;
      const score = el("td", { class: "score" }, tr), weight = el("td", { class: "weight" }, tr);
      const bar = el("div", { class: "bar" }, el("td", { class: "bar-col" }, tr));
      el("td", {}, tr).textContent = `[${L.values[i].join(", ")}]`;
      return { score, weight, bar };
    });
    let q = L.query.slice();
    function update() {
      const scale = $("lookup-scaled").checked ? 1 / Math.sqrt(q.length) : 1;
      const scores = L.keys.map((k) => (q[0] * k[0] + q[1] * k[1]) * scale);
      const w = softmax(scores);
      const out = [0, 1].map((d) => w.reduce((s, wi, i) => s + wi * L.values[i][d], 0));
      show($("lookup-q0"), q[0], 1); show($("lookup-q1"), q[1], 1);
      rows.forEach((r, i) => { show(r.score, scores[i]); show(r.weight, w[i]); r.bar.style.width = `${100 * w[i]}%`; });
      show($("lookup-out0"), out[0]); show($("lookup-out1"), out[1]);
      qDot.setAttribute("cx", px(q[0])); qDot.setAttribute("cy", py(q[1]));
      qLine.setAttribute("x2", px(q[0])); qLine.setAttribute("y2", py(q[1]));
      const top = w.indexOf(Math.max(...w)), v = $("lookup-verdict");
      v.dataset.hard = String(w[top] > 0.999999);
      v.textContent = w[top] > 0.999999
        ? `Hard lookup: ${L.tokens[top]} takes ${w[top].toFixed(7)} of the weight (more than 0.999999), so the ` +
          `output is its value, as a dictionary would return it.`
        : `A blend: ${largest(w)}. Drag far along one key's ` +
          `direction, away from the others, to make its score tower over the rest.`;
    }
    function largest(w) {                             // which token holds the largest weight, or which tie for it
      const top = Math.max(...w), shown = top.toFixed(3);
      const tied = L.tokens.filter((_, i) => w[i].toFixed(3) === shown).map((t) => `“${t}”`);
      return tied.length > 1
        ? `${tied.slice(0, -1).join(", ")} and ${tied[tied.length - 1]} tie for the largest weight, ${shown} each`
        : `the largest weight, ${shown}, is on ${tied[0]}`;
    }
    function moveTo(e) {
      const box = svg.getBoundingClientRect();
      const [x, y] = toData(e.clientX - box.left, e.clientY - box.top);
      q = [Math.round(x * 10) / 10, Math.round(y * 10) / 10].map((c) => Math.max(-R, Math.min(R, c)) + 0);
      update();
    }
    let dragging = false;                             // the window follows the drag, even off the plane
    svg.addEventListener("pointerdown", (e) => { dragging = true; e.preventDefault(); moveTo(e); });
    window.addEventListener("pointermove", (e) => { if (dragging) moveTo(e); });
    window.addEventListener("pointerup", () => { dragging = false; });
    $("lookup-scaled").addEventListener("change", update);
    update();
  }

  // ---- sqrt(d_k): a slider over widths; spreads, top weights and histograms, unscaled and scaled ----
  function sqrtDk() {
    const S = D.sqrt_dk, slider = $("sqrtdk-slider");
    if (!S || !slider) return;
    slider.max = String(S.widths.length - 1);
    slider.value = String(S.widths.findIndex((w) => w.d_k === S.start));
    const canvas = $("sqrtdk-hist"), ctx = canvas.getContext("2d");
    function hist(x0, width, counts, edges, colour, label) {
      const h = canvas.height - 36, top = Math.max(...counts), bw = width / counts.length;
      ctx.fillStyle = colour;
      counts.forEach((c, i) => { const bh = h * c / top; ctx.fillRect(x0 + i * bw, 14 + h - bh, Math.max(bw - 1, 1), bh); });
      ctx.fillStyle = "#333"; ctx.font = "11px system-ui, sans-serif"; ctx.textAlign = "left";
      ctx.fillText(label, x0, 11);
      ctx.fillText(edges[0].toFixed(1), x0, canvas.height - 8);
      ctx.textAlign = "right"; ctx.fillText(edges[1].toFixed(1), x0 + width, canvas.height - 8);
    }
    function update() {
      const w = S.widths[Number(slider.value)];
      show($("sqrtdk-dk"), w.d_k, 0); show($("sqrtdk-root"), Math.sqrt(w.d_k), 2);
      show($("sqrtdk-std"), w.std, 2); show($("sqrtdk-std-scaled"), w.std_scaled, 2);
      show($("sqrtdk-top"), w.top); show($("sqrtdk-top-scaled"), w.top_scaled);
      ctx.clearRect(0, 0, canvas.width, canvas.height);
      const half = canvas.width / 2 - 10;
      hist(0, half, w.counts, S.edges, "#6baed6", `q·k, d_k = ${w.d_k} (fixed axis)`);
      hist(half + 20, half, w.counts_scaled, S.edges_scaled, "#fd8d3c", "q·k / √d_k (fixed axis)");
      $("sqrtdk-note").textContent =
        `Unscaled, the scores spread by about √${w.d_k} = ${Math.sqrt(w.d_k).toFixed(2)} and the largest of 16 ` +
        `weights averages ${w.top.toFixed(3)}${w.top > 0.5 ? ": one key takes most of it, and the softmax saturates" : ""}. ` +
        `Divided by √d_k the spread stays near 1 and the largest weight near ${w.top_scaled.toFixed(3)}, whatever d_k is.`;
    }
    slider.addEventListener("input", update);
    update();
  }

  // ---- causal mask: A = softmax(S + M) on the running example, with M toggled ----
  function mask() {
    const M = D.mask, table = $("mask-grid");
    if (!M || !table) return;
    const n = M.tokens.length;
    const head = el("tr", {}, el("thead", {}, table));
    el("th", {}, head).textContent = "query \\ key";
    M.tokens.forEach((t) => { el("th", {}, head).textContent = t; });
    el("th", {}, head).textContent = "row sum";
    const body = el("tbody", {}, table), cells = [], sums = [];
    for (let i = 0; i < n; i++) {
      const tr = el("tr", {}, body);
      el("th", {}, tr).textContent = M.tokens[i];
      cells.push(M.tokens.map(() => el("td", {}, tr)));
      sums.push(el("td", { class: "sum" }, tr));
    }
    function update() {
      const on = $("mask-toggle").checked;
      for (let i = 0; i < n; i++) {
        const a = softmax(M.S[i].map((s, j) => (on && j > i ? -Infinity : s)));
        a.forEach((w, j) => {
          const c = cells[i][j], masked = on && j > i;
          show(c, w);
          if (masked) c.textContent = "−∞ → 0";
          c.className = masked ? "masked" : "";
          c.style.background = masked ? "" : shade(w);
          c.style.color = !masked && w > 0.6 ? "#fff" : "";
        });
        show(sums[i], a.reduce((x, y) => x + y, 0));
      }
      $("mask-note").textContent = on
        ? `With the mask each token draws only on itself and the tokens before it; the first row is forced to 1.000, ` +
          `and every row still sums to 1.`
        : `Without the mask every token draws on every token, later ones too: "${M.tokens[1]}" puts weight on ` +
          `"${M.tokens[2]}", the very token it is trained to predict.`;
    }
    $("mask-toggle").addEventListener("change", update);
    update();
  }

  // ---- the embedded viewer: as tall as the view inside it (it posts its height), never a nested scroll ----
  function viewer() {
    const frame = $("viewer");
    if (!frame) return;
    window.addEventListener("message", (e) => {
      const h = e.data && e.data.attnlabViewHeight;
      if (e.source === frame.contentWindow && Number.isFinite(h) && h > 0) frame.style.height = `${Math.ceil(h) + 4}px`;
    });
    // The view may have drawn (and told its height) before this listener existed: ask it, now and on load.
    const ask = () => frame.contentWindow && frame.contentWindow.postMessage({ attnlabAskHeight: true }, "*");
    frame.addEventListener("load", ask);
    ask();
  }

  try {
    viewer(); lookup(); sqrtDk(); mask();
    document.body.dataset.ready = "1";
  } catch (err) {
    document.body.dataset.ready = "error";
    document.body.dataset.error = String(err);
    throw err;
  }
})();
