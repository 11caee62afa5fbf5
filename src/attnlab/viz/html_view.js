// attnlab's attention view. Everything is drawn on canvases (a 512-token grid is 262,144 cells, far too
// many for DOM nodes), and every piece of user text reaches the page through textContent or fillText,
// never innerHTML, so a token that looks like an HTML tag shows as text.
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("attnlab-data").textContent);
  const L = D.n_layers, H = D.n_heads, NQ = D.n_q, NK = D.n_k, OFF = NK - NQ;
  const $ = (id) => document.getElementById(id);
  const status = $("status");
  const state = { layer: 0, head: 0, hover: null, pinned: null, key: null };   // key: a hovered key, for its column
  let W = null, KEEP = null;                       // Uint16Array (L·H·NQ·NK), Uint8Array (NQ·NK) or null
  const ramp = D.ramp.map((c) => [1, 3, 5].map((i) => parseInt(c.slice(i, i + 2), 16)));
  const MASKED = [1, 3, 5].map((i) => parseInt(D.masked.slice(i, i + 2), 16));

  function shade(w) {                              // the Blues ramp, as _style.shade does in Python
    const x = Math.min(Math.max(w, 0), 1) * (ramp.length - 1), i = Math.min(Math.floor(x), ramp.length - 2);
    return ramp[i].map((c, k) => Math.round(c + (x - i) * (ramp[i + 1][k] - c)));
  }
  const css = (rgb) => `rgb(${rgb[0]},${rgb[1]},${rgb[2]})`;
  const weight = (l, h, i, j) => W[((l * H + h) * NQ + i) * NK + j] / 65535;
  const kept = (i, j) => KEEP === null || KEEP[i * NK + j] === 1;
  const fmt = (w) => w.toFixed(3);
  const label = (t, n) => (t.length > n ? t.slice(0, n - 1) + "\u2026" : t);
  const shown = (t) => t.replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5");
  const tokens = D.tokens.map(shown);
  const qToken = (i) => tokens[i + OFF];
  const active = () => (state.hover !== null ? state.hover : state.pinned);

  async function unpack(b64) {                     // base64 of zlib-deflated bytes -> Uint8Array
    const raw = Uint8Array.fromBase64 ? Uint8Array.fromBase64(b64)
      : Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    const stream = new Blob([raw]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }

  function sizeCanvas(c, w, h) {                   // CSS size w × h, sharp on high-DPI screens
    const dpr = Math.min(window.devicePixelRatio || 1, Math.floor(30000 / Math.max(h, 1)) || 1);
    c.width = Math.round(w * dpr); c.height = Math.round(h * dpr);
    c.style.width = w + "px"; c.style.height = h + "px";
    const ctx = c.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    return ctx;
  }

  // ---- head view: queries on the left, keys on the right; lines for the active query's row of weights,
  //      or, while a key is hovered, for its column (how much each query takes from it) ----
  const HV = { w: 560, left: 200, right: 360, rh: NK <= 40 ? 20 : NK <= 128 ? 16 : 13 };
  function drawHeadView() {
    const c = $("head-view"), n = Math.max(NQ, NK), ctx = sizeCanvas(c, HV.w, n * HV.rh + 8);
    const q = active(), rh = HV.rh;
    ctx.font = `${rh - 6}px system-ui, sans-serif`;
    ctx.textBaseline = "middle";
    const y = (i) => 4 + i * rh + rh / 2;
    const line = (i, j, w) => {
      ctx.strokeStyle = `rgba(33,113,181,${Math.min(1, w)})`; ctx.lineWidth = 0.5 + 2.5 * w;
      ctx.beginPath(); ctx.moveTo(HV.left + 4, y(i)); ctx.lineTo(HV.right - 4, y(j)); ctx.stroke();
    };
    const k = state.key;
    if (k !== null) {
      for (let i = 0; i < NQ; i++) {
        const w = weight(state.layer, state.head, i, k);
        if (w > 0.002 && kept(i, k)) line(i, k, w);
      }
    } else if (q !== null) {
      for (let j = 0; j < NK; j++) {
        const w = weight(state.layer, state.head, q, j);
        if (w > 0.002 && kept(q, j)) line(q, j, w);
      }
    } else if (NQ * NK <= 64 * 64) {              // nothing chosen: every line, faint, when that is few enough
      for (let i = 0; i < NQ; i++) for (let j = 0; j < NK; j++) {
        const w = weight(state.layer, state.head, i, j);
        if (w > 0.01 && kept(i, j)) line(i, j, 0.5 * w);
      }
    }
    for (let i = 0; i < NQ; i++) {                // queries, right-aligned; shaded by their weight on a hovered key
      let fg = "#1b1b1b";
      if (k !== null) {
        const w = kept(i, k) ? weight(state.layer, state.head, i, k) : 0;
        ctx.fillStyle = kept(i, k) ? css(shade(w)) : css(MASKED);
        ctx.fillRect(4, y(i) - rh / 2, HV.left - 4, rh);
        if (w > D.dark_above) fg = "#fff";
      } else if (i === q) { ctx.fillStyle = "#fdd49e"; ctx.fillRect(4, y(i) - rh / 2, HV.left - 4, rh); }
      ctx.fillStyle = fg; ctx.textAlign = "right";
      ctx.fillText(label(qToken(i), 24), HV.left - 2, y(i), HV.left - 8);
    }
    for (let j = 0; j < NK; j++) {                // keys, shaded by the active query's weight
      let fg = "#1b1b1b";
      if (j === k) { ctx.fillStyle = "#fdd49e"; ctx.fillRect(HV.right, y(j) - rh / 2, HV.w - HV.right - 4, rh); }
      else if (k === null && q !== null) {
        const w = kept(q, j) ? weight(state.layer, state.head, q, j) : 0;
        ctx.fillStyle = kept(q, j) ? css(shade(w)) : css(MASKED);
        ctx.fillRect(HV.right, y(j) - rh / 2, HV.w - HV.right - 4, rh);
        if (w > D.dark_above) fg = "#fff";
      }
      ctx.fillStyle = fg; ctx.textAlign = "left";
      ctx.fillText(label(tokens[j], 24), HV.right + 2, y(j), HV.w - HV.right - 8);
    }
  }
  function headViewTarget(ev) {                  // [query, key] under the mouse: one of them, or neither
    const r = $("head-view").getBoundingClientRect(), x = ev.clientX - r.left;
    const i = Math.floor((ev.clientY - r.top - 4) / HV.rh);
    if (x < HV.left + 4) return [i >= 0 && i < NQ ? i : null, null];
    return [null, x >= HV.right && i >= 0 && i < NK ? i : null];
  }

  // ---- grid: the whole head as a heatmap, one pixel per cell, scaled up without smoothing ----
  const G = { size: Math.min(560, Math.max(NQ, NK) * 28), margin: Math.max(NQ, NK) <= 40 ? 90 : 0, image: null };
  function renderGridImage() {
    const img = new ImageData(NK, NQ), px = img.data;
    for (let i = 0; i < NQ; i++) for (let j = 0; j < NK; j++) {
      const rgb = kept(i, j) ? shade(weight(state.layer, state.head, i, j)) : MASKED, o = 4 * (i * NK + j);
      px[o] = rgb[0]; px[o + 1] = rgb[1]; px[o + 2] = rgb[2]; px[o + 3] = 255;
    }
    const off = document.createElement("canvas");
    off.width = NK; off.height = NQ;
    off.getContext("2d").putImageData(img, 0, 0);
    G.image = off;
  }
  function drawGrid() {
    const m = G.margin, cw = G.size / NK, ch = G.size / NQ, q = active();
    const ctx = sizeCanvas($("grid"), G.size + m + 2, G.size + m + 2);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(G.image, m, m, G.size, G.size);
    if (m) {                                      // token labels on both axes, when they fit
      ctx.fillStyle = "#1b1b1b"; ctx.font = `${Math.min(12, ch - 2)}px system-ui, sans-serif`;
      ctx.textBaseline = "middle"; ctx.textAlign = "right";
      for (let i = 0; i < NQ; i++) ctx.fillText(label(qToken(i), 14), m - 4, m + (i + 0.5) * ch, m - 6);
      for (let j = 0; j < NK; j++) {
        ctx.save(); ctx.translate(m + (j + 0.5) * cw, m - 4); ctx.rotate(-Math.PI / 2); ctx.textAlign = "left";
        ctx.fillText(label(tokens[j], 14), 0, 0, m - 6); ctx.restore();
      }
      if (NQ * NK <= 144) {                       // values in the cells when the grid is small
        ctx.textAlign = "center"; ctx.font = "11px system-ui, sans-serif";
        for (let i = 0; i < NQ; i++) for (let j = 0; j < NK; j++) if (kept(i, j)) {
          const w = weight(state.layer, state.head, i, j);
          ctx.fillStyle = w > D.dark_above ? "#fff" : "#1b1b1b";
          ctx.fillText(w.toFixed(2), m + (j + 0.5) * cw, m + (i + 0.5) * ch);
        }
      }
    }
    ctx.strokeStyle = "#e6550d"; ctx.lineWidth = 2;
    if (state.key !== null) ctx.strokeRect(m + state.key * cw, m, Math.max(cw, 2), G.size);
    else if (q !== null) ctx.strokeRect(m, m + q * ch, G.size, Math.max(ch, 2));
  }
  function gridCell(ev) {
    const r = $("grid").getBoundingClientRect();
    const j = Math.floor((ev.clientX - r.left - G.margin) / (G.size / NK));
    const i = Math.floor((ev.clientY - r.top - G.margin) / (G.size / NQ));
    return i >= 0 && i < NQ && j >= 0 && j < NK ? [i, j] : null;
  }

  // ---- the active query's row of weights (or the hovered key's column), as text ----
  function showColumn(k) {
    const col = [];
    for (let i = 0; i < NQ; i++) if (kept(i, k)) col.push([weight(state.layer, state.head, i, k), i]);
    col.sort((a, b) => b[0] - a[0]);
    const top = col.slice(0, 8).map(([w, i]) => `${fmt(w)}  #${i + OFF} ${label(qToken(i), 30)}`);
    $("row").textContent = `layer ${state.layer}, head ${state.head}, key #${k} ${tokens[k]}\n` +
      `queries that take the most from it (of ${col.length} that see it):\n` + top.join("\n");
  }
  function showRow() {
    if (state.key !== null) { showColumn(state.key); return; }
    const q = active();
    if (q === null) { $("row").textContent = "Hover over or click a query token to see its row of weights."; return; }
    const row = [];
    for (let j = 0; j < NK; j++) if (kept(q, j)) row.push([weight(state.layer, state.head, q, j), j]);
    row.sort((a, b) => b[0] - a[0]);
    const top = row.slice(0, 8).map(([w, j]) => `${fmt(w)}  #${j} ${label(tokens[j], 30)}`);
    $("row").textContent = `layer ${state.layer}, head ${state.head}, query #${q + OFF} ${qToken(q)}\n` +
      `top keys (of ${row.length} visible):\n` + top.join("\n");
  }

  // ---- model view: a thumbnail per head (each pixel the largest weight it covers), and the summary ----
  const T = Math.max(24, Math.min(64, Math.floor(720 / H)));
  const MV = { left: 60, top: 20, gap: 4, thumbs: null };
  function renderThumbs() {                       // Ry × Rx pixels per head, scaled to T × T when drawn
    const Ry = Math.min(T, NQ), Rx = Math.min(T, NK);
    const img = new ImageData(H * Rx, L * Ry), px = img.data;
    const best = new Uint16Array(Ry * Rx), seen = new Uint8Array(Ry * Rx);
    const pj = Int32Array.from({ length: NK }, (_, j) => Math.floor((j * Rx) / NK));
    for (let l = 0; l < L; l++) for (let h = 0; h < H; h++) {
      best.fill(0); seen.fill(0);
      for (let i = 0; i < NQ; i++) {
        const base = ((l * H + h) * NQ + i) * NK, row = Math.floor((i * Ry) / NQ) * Rx;
        for (let j = 0; j < NK; j++) {
          if (!kept(i, j)) continue;
          const k = row + pj[j], w = W[base + j];
          seen[k] = 1; if (w > best[k]) best[k] = w;
        }
      }
      for (let y = 0; y < Ry; y++) for (let x = 0; x < Rx; x++) {
        const rgb = seen[y * Rx + x] ? shade(best[y * Rx + x] / 65535) : MASKED;
        const o = 4 * ((l * Ry + y) * H * Rx + h * Rx + x);
        px[o] = rgb[0]; px[o + 1] = rgb[1]; px[o + 2] = rgb[2]; px[o + 3] = 255;
      }
    }
    const off = document.createElement("canvas");
    off.width = H * Rx; off.height = L * Ry;
    off.getContext("2d").putImageData(img, 0, 0);
    MV.thumbs = off; MV.Rx = Rx; MV.Ry = Ry;
  }
  function drawModelView() {
    const step = T + MV.gap;
    const ctx = sizeCanvas($("model-view"), MV.left + H * step, MV.top + L * step);
    ctx.imageSmoothingEnabled = false;
    ctx.font = "11px system-ui, sans-serif"; ctx.fillStyle = "#1b1b1b"; ctx.textBaseline = "middle";
    for (let h = 0; h < H; h++) {
      ctx.textAlign = "center";
      ctx.fillText(`h${h}` + (D.kv_heads ? `·kv${D.kv_heads[h]}` : ""), MV.left + h * step + T / 2, MV.top / 2);
    }
    for (let l = 0; l < L; l++) {
      ctx.textAlign = "right"; ctx.fillText(`layer ${l}`, MV.left - 6, MV.top + l * step + T / 2);
      for (let h = 0; h < H; h++)
        ctx.drawImage(MV.thumbs, h * MV.Rx, l * MV.Ry, MV.Rx, MV.Ry, MV.left + h * step, MV.top + l * step, T, T);
    }
    ctx.strokeStyle = "#e6550d"; ctx.lineWidth = 2;
    ctx.strokeRect(MV.left + state.head * step - 1, MV.top + state.layer * step - 1, T + 2, T + 2);
  }
  function modelViewHead(ev) {
    const r = $("model-view").getBoundingClientRect(), step = T + MV.gap;
    const h = Math.floor((ev.clientX - r.left - MV.left) / step), l = Math.floor((ev.clientY - r.top - MV.top) / step);
    return l >= 0 && l < L && h >= 0 && h < H ? [l, h] : null;
  }
  function kvLabel(h) {                          // grouped-query attention: the KV head a query head reads
    return D.kv_heads ? ` (KV head ${D.kv_heads[h]})` : "";
  }
  function drawSummary() {
    const body = $("summary").tBodies[0];
    body.replaceChildren();
    for (let h = 0; h < H; h++) {
      const tr = body.insertRow();
      tr.insertCell().textContent = `head ${h}` + kvLabel(h);
      for (const f of D.summary_fields) tr.insertCell().textContent = D.summary[f][state.layer][h].toFixed(3);
      if (h === state.head) tr.className = "selected";
      tr.addEventListener("click", () => select(state.layer, h));
    }
    $("summary-title").textContent = `Per-head summary, layer ${state.layer}`;
  }

  // ---- neuron view (bertviz's): for the active query, q; per key, k and q ∘ k per dimension, then the score
  //      scale · q·k and the weight. Red is positive, blue negative, each block scaled by its largest |value| ----
  const N = D.neuron;
  let QV = null, KV = null;                        // Float32Array (L·H·NQ·DH), (L·H·NK·DH)
  const diverging = (v) => v >= 0 ? `rgba(203,24,29,${Math.min(1, v)})` : `rgba(33,113,181,${Math.min(1, -v)})`;
  function neuronRows(q) {                         // [{j, k, qk, score, w}] for every key the query sees
    const DH = N.d_head, qo = ((state.layer * H + state.head) * NQ + q) * DH, rows = [];
    for (let j = 0; j < NK; j++) {
      if (!kept(q, j)) continue;
      const ko = ((state.layer * H + state.head) * NK + j) * DH, k = KV.subarray(ko, ko + DH);
      const qk = Float32Array.from(k, (x, d) => x * QV[qo + d]);
      rows.push({ j, k, qk, score: N.scale * qk.reduce((a, b) => a + b, 0), w: weight(state.layer, state.head, q, j) });
    }
    return rows;
  }
  function drawNeuron() {
    if (!QV) return;
    const q = active(), DH = N.d_head, cw = Math.max(3, Math.min(10, Math.floor(320 / DH))), rh = 14;
    const X = { label: 110, k: 116, qk: 116 + DH * cw + 14, score: 116 + 2 * DH * cw + 28 };
    X.w = X.score + 70;
    const rows = q === null ? [] : neuronRows(q);
    const ctx = sizeCanvas($("neuron"), X.w + 110, (rows.length + 2) * rh + 8);
    ctx.font = "11px system-ui, sans-serif"; ctx.textBaseline = "middle"; ctx.fillStyle = "#1b1b1b";
    if (q === null) { $("neuron-readout").textContent = "Hover over or click a query token to see its q and k."; return; }
    const qo = ((state.layer * H + state.head) * NQ + q) * DH, qv = QV.subarray(qo, qo + DH);
    let mk = Math.max(...Array.from(qv, Math.abs)), mqk = 1e-30;
    for (const r of rows) for (let d = 0; d < DH; d++) { mk = Math.max(mk, Math.abs(r.k[d])); mqk = Math.max(mqk, Math.abs(r.qk[d])); }
    mk = Math.max(mk, 1e-30);
    const y = (i) => 4 + i * rh;
    ctx.textAlign = "center";
    ctx.fillText("k (q on top)", X.k + DH * cw / 2, y(0) + rh / 2);
    ctx.fillText("q \u2218 k", X.qk + DH * cw / 2, y(0) + rh / 2);
    ctx.fillText("scale\u00b7q\u00b7k", X.score + 30, y(0) + rh / 2);
    ctx.fillText("weight", X.w + 30, y(0) + rh / 2);
    ctx.textAlign = "right"; ctx.fillText(`q: ${label(qToken(q), 14)}`, X.label, y(1) + rh / 2, X.label - 4);
    for (let d = 0; d < DH; d++) { ctx.fillStyle = diverging(qv[d] / mk); ctx.fillRect(X.k + d * cw, y(1) + 1, cw, rh - 2); }
    rows.forEach((r, i) => {
      const yy = y(i + 2);
      ctx.fillStyle = "#1b1b1b"; ctx.textAlign = "right";
      ctx.fillText(`#${r.j} ${label(tokens[r.j], 12)}`, X.label, yy + rh / 2, X.label - 4);
      for (let d = 0; d < DH; d++) {
        ctx.fillStyle = diverging(r.k[d] / mk); ctx.fillRect(X.k + d * cw, yy + 1, cw, rh - 2);
        ctx.fillStyle = diverging(r.qk[d] / mqk); ctx.fillRect(X.qk + d * cw, yy + 1, cw, rh - 2);
      }
      ctx.fillStyle = "#1b1b1b"; ctx.textAlign = "right"; ctx.fillText(r.score.toFixed(3), X.score + 60, yy + rh / 2);
      ctx.fillStyle = css(shade(r.w)); ctx.fillRect(X.w, yy + 1, 60 * Math.min(1, r.w) + 1, rh - 2);
      ctx.fillStyle = "#1b1b1b"; ctx.textAlign = "left"; ctx.fillText(fmt(r.w), X.w + 64, yy + rh / 2);
    });
    const top = rows.slice().sort((a, b) => b.score - a.score).slice(0, 5)
      .map((r) => `score ${r.score.toFixed(4)}  weight ${fmt(r.w)}  #${r.j} ${label(tokens[r.j], 30)}`);
    $("neuron-readout").textContent = `layer ${state.layer}, head ${state.head}, query #${q + OFF} ${qToken(q)}: ` +
      `the keys it scores highest\n` + top.join("\n");
  }

  // ---- wiring ----
  let queued = false;
  function redrawQuery() {                         // cheap redraw after the active query changes
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => { queued = false; drawHeadView(); drawGrid(); showRow(); drawNeuron(); });
  }
  function select(l, h) {
    state.layer = l; state.head = h;
    $("layer").value = String(l); $("head").value = String(h);
    renderGridImage(); drawHeadView(); drawGrid(); showRow(); drawModelView(); drawSummary(); drawNeuron();
  }
  function setHover(i, k = null) {
    if (i !== state.hover || k !== state.key) { state.hover = i; state.key = k; redrawQuery(); }
  }

  function wire() {
    for (let l = 0; l < L; l++) $("layer").add(new Option(`layer ${l}`, String(l)));
    for (let h = 0; h < H; h++) $("head").add(new Option(`head ${h}` + kvLabel(h), String(h)));
    $("layer").addEventListener("change", (e) => select(Number(e.target.value), state.head));
    $("head").addEventListener("change", (e) => select(state.layer, Number(e.target.value)));
    const hv = $("head-view"), grid = $("grid"), mv = $("model-view");
    hv.addEventListener("mousemove", (e) => setHover(...headViewTarget(e)));
    hv.addEventListener("mouseleave", () => setHover(null));
    hv.addEventListener("click", (e) => {
      const i = headViewTarget(e)[0];
      if (i !== null) { state.pinned = i === state.pinned ? null : i; redrawQuery(); }
    });
    grid.addEventListener("mousemove", (e) => {
      const c = gridCell(e);
      $("readout").textContent = c === null ? "" : `query #${c[0] + OFF} ${qToken(c[0])} \u2192 key #${c[1]} ` +
        `${tokens[c[1]]}: ${kept(c[0], c[1]) ? fmt(weight(state.layer, state.head, c[0], c[1])) : "masked"}`;
      setHover(c === null ? null : c[0]);
    });
    grid.addEventListener("mouseleave", () => { $("readout").textContent = ""; setHover(null); });
    grid.addEventListener("click", (e) => {         // pin the row, and scroll the head view to its query
      const c = gridCell(e);
      if (c === null) return;
      state.pinned = c[0];
      hv.parentElement.scrollTop = Math.max(0, 4 + c[0] * HV.rh - hv.parentElement.clientHeight / 2);
      redrawQuery();
    });
    mv.addEventListener("click", (e) => { const c = modelViewHead(e); if (c) select(c[0], c[1]); });
    mv.addEventListener("mousemove", (e) => {
      const c = modelViewHead(e);
      mv.title = c === null ? "" : `layer ${c[0]}, head ${c[1]}: ` +
        D.summary_fields.map((f) => `${f} ${D.summary[f][c[0]][c[1]].toFixed(3)}`).join(", ");
    });
  }

  // Embedded in a page (the tour's iframe), say how tall the view is, so the page can show all of it
  // without a scroll inside a scroll. The sandboxed frame cannot be measured from outside, so it tells.
  function tellParentHeight() {
    if (window.parent === window) return;
    const post = () => window.parent.postMessage({ attnlabViewHeight: document.documentElement.scrollHeight }, "*");
    new ResizeObserver(post).observe(document.body);
    window.addEventListener("message", (e) => {       // the page asks again if it missed the first answer
      if (e.source === window.parent && e.data && e.data.attnlabAskHeight) post();
    });
    post();
  }

  async function main() {
    try {
      const bytes = await unpack(D.weights);
      W = new Uint16Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 2);
      if (W.length !== L * H * NQ * NK) throw new Error(`weights hold ${W.length} numbers, expected ${L * H * NQ * NK}`);
      KEEP = D.keep === null ? null : await unpack(D.keep);
      if (N && !N.omitted) {
        const qb = await unpack(N.q), kb = await unpack(N.k);
        QV = new Float32Array(qb.buffer, qb.byteOffset, qb.byteLength / 4);
        KV = new Float32Array(kb.buffer, kb.byteOffset, kb.byteLength / 4);
        if (QV.length !== L * H * NQ * N.d_head || KV.length !== L * H * NK * N.d_head)
          throw new Error(`the neuron view's q and k hold ${QV.length} and ${KV.length} numbers`);
      } else {
        $("neuron-section").hidden = !N;
        if (N) $("neuron-readout").textContent = `No neuron view: ${N.omitted}.`;
      }
      wire();
      renderThumbs();
      select(D.start ? D.start[0] : 0, D.start ? D.start[1] : 0);   // the layer and head the caller asked for
      status.textContent = `${L} layers \u00d7 ${H} heads, ${NQ} queries \u00d7 ${NK} keys`;
      document.body.dataset.ready = "1";
      tellParentHeight();
    } catch (err) {
      status.textContent = `could not draw the view: ${err}`;
      status.className = "error";
      document.body.dataset.ready = "error";
    }
  }
  main();
})();
