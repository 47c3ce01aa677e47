
(function () {
"use strict";
var D = JSON.parse(document.getElementById("report-data").textContent);
var NS = "http://www.w3.org/2000/svg";
var report = window.commscopeReportError || function (m) { throw new Error(m); };
var PARAMS = new URLSearchParams((location.search || "").slice(1) + "&" + (location.hash || "").slice(1));
var API = window.commscopeReport = {};

/* ---------------------------------------------------------------- helpers (presentation only) */
function el(tag, attrs, parent, text) {
  var e = document.createElement(tag);
  if (attrs) for (var k in attrs) if (attrs[k] !== undefined && attrs[k] !== null) e.setAttribute(k, attrs[k]);
  if (text !== undefined && text !== null) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}
function sv(tag, attrs, parent, text) {
  var e = document.createElementNS(NS, tag);
  if (attrs) for (var k in attrs) if (attrs[k] !== undefined && attrs[k] !== null) e.setAttribute(k, attrs[k]);
  if (text !== undefined && text !== null) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}
function svgRoot(parent, w, h) {
  return sv("svg", {viewBox: "0 0 " + w + " " + h, width: w, height: h, role: "img"}, parent);
}
function titled(node, text) { sv("title", null, node, text); return node; }
function sig(v) {
  if (Number.isInteger(v)) return String(v);
  var a = Math.abs(v);
  return String(parseFloat(a >= 100 ? v.toFixed(0) : a >= 10 ? v.toFixed(1) : v.toFixed(2)));
}
function fmtBytes(b) {
  if (b === null || b === undefined) return "\u2013";
  var u = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"], i = 0, v = Math.abs(b);
  while (Number(sig(v)) >= 1024 && i < u.length - 1) { v /= 1024; i++; }
  return (b < 0 ? "-" : "") + (i === 0 ? String(Math.round(v)) : sig(v)) + " " + u[i];
}
function fmtSec(s) {
  if (s === null || s === undefined) return "\u2013";
  var a = Math.abs(s);
  if (a === 0) return "0 s";
  if (a < 1e-3) return sig(s * 1e6) + " \u00b5s";
  if (a < 1) return sig(s * 1e3) + " ms";
  return sig(s) + " s";
}
function fmtPct(x) { return x === null || x === undefined ? "\u2013" : (100 * x).toFixed(1) + "%"; }
function fmtCount(n) {
  if (n === null || n === undefined) return "\u2013";
  return n.toLocaleString("en-US", {maximumFractionDigits: Math.abs(n) >= 100 ? 0 : 2});
}
function fmtGBps(b) { return b === null || b === undefined ? "\u2013" : sig(b / 1e9) + " GB/s"; }
function fmtFactor(x) {  /* a ratio with two significant digits however small (0.0031, not 0.00) */
  return x === null || x === undefined ? "\u2013" : x >= 0.1 ? x.toFixed(2) : String(parseFloat(x.toPrecision(2)));
}
function fmtRatio(x) { return x === null || x === undefined ? "\u2013" : "\u00d7" + x.toFixed(x >= 10 ? 1 : 3); }
function fmt(kind, v) {
  return kind === "bytes" ? fmtBytes(v) : kind === "seconds" ? fmtSec(v) : kind === "ratio" ? fmtPct(v) : fmtCount(v);
}
function niceTicks(max, n) {  /* about n round ticks from 0 to >= max */
  if (!(max > 0)) return [0, 1];
  var step = Math.pow(10, Math.floor(Math.log10(max / n))), err = max / n / step;
  step *= err >= 7.5 ? 10 : err >= 3.5 ? 5 : err >= 1.5 ? 2 : 1;
  var out = [];
  for (var t = 0; t <= max * 1.0001 + step * 0.999; t += step) { out.push(t); if (t >= max) break; }
  return out;
}
function hexRgb(hex) { var n = parseInt(hex.slice(1), 16); return [(n >> 16) & 255, (n >> 8) & 255, n & 255]; }
function mix(a, b, t) { return [0, 1, 2].map(function (i) { return Math.round(a[i] + (b[i] - a[i]) * t); }); }
function rgb(c) { return "rgb(" + c[0] + "," + c[1] + "," + c[2] + ")"; }
var VIRIDIS = ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"].map(hexRgb);
function viridis(t) {
  t = Math.max(0, Math.min(1, t));
  var x = t * (VIRIDIS.length - 1), i = Math.min(Math.floor(x), VIRIDIS.length - 2);
  return mix(VIRIDIS[i], VIRIDIS[i + 1], x - i);
}
function axisShade(hex, t) {  /* light tint (few bytes) -> the axis colour -> a dark shade (many bytes) */
  var c = hexRgb(hex), white = [255, 255, 255], black = [20, 20, 30];
  t = Math.max(0, Math.min(1, t));
  return t < 0.6 ? mix(mix(c, white, 0.72), c, t / 0.6) : mix(c, black, (t - 0.6) / 0.4 * 0.4);
}
var tip = document.getElementById("tip");
function showTip(evt, head, lines) {
  tip.textContent = "";
  el("div", {class: "h"}, tip, head);
  (lines || []).forEach(function (l) { el("div", null, tip, l); });
  tip.style.display = "block";
  var x = evt.clientX + 14, y = evt.clientY + 14, w = tip.offsetWidth, h = tip.offsetHeight;
  if (x + w > window.innerWidth - 8) x = evt.clientX - w - 14;
  if (y + h > window.innerHeight - 8) y = evt.clientY - h - 14;
  tip.style.left = x + "px"; tip.style.top = y + "px";
}
function hideTip() { tip.style.display = "none"; }
function sizeCanvas(cv, w, h) {  /* w x h CSS pixels, sharp on high-density screens; returns the context */
  var dpr = Math.max(1, Math.min(3, window.devicePixelRatio || 1));
  cv.width = Math.round(w * dpr); cv.height = Math.round(h * dpr);
  cv.style.width = w + "px";
  cv.cssWidth = w; cv.cssHeight = h;
  var ctx = cv.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  return ctx;
}
function canvasPoint(canvas, evt) {  /* mouse position in the canvas's CSS pixels */
  var r = canvas.getBoundingClientRect();
  return [(evt.clientX - r.left) * canvas.cssWidth / r.width, (evt.clientY - r.top) * canvas.cssHeight / r.height];
}
function stripes(defs, id, color) {
  var p = sv("pattern", {id: id, width: 6, height: 6, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)"}, defs);
  sv("rect", {width: 6, height: 6, fill: rgb(mix(hexRgb(color), [255, 255, 255], 0.72))}, p);
  sv("rect", {width: 3, height: 6, fill: color}, p);
  return "url(#" + id + ")";
}
function notesList(parent, notes) {
  if (!notes || !notes.length) return;
  var ul = el("ul", {class: "notes"}, parent);
  notes.forEach(function (n) { el("li", null, ul, n); });
}
function legend(parent, items) {
  var box = el("div", {class: "legend"}, parent);
  items.forEach(function (it) {
    var k = el("span", {class: "k"}, box);
    var i = el("i", null, k);
    i.style.background = it.color;
    if (it.border) i.style.border = it.border;
    el("span", null, k, it.label);
  });
  return box;
}
function buttons(parent, label, options, current, onpick) {
  var box = el("div", {class: "controls"}, parent);
  if (label) el("span", {class: "lab"}, box, label);
  var made = options.map(function (o) {
    var b = el("button", {class: "btn", type: "button", "aria-pressed": String(o.key === current), "data-key": o.key}, box, o.label);
    b.addEventListener("click", function () {
      made.forEach(function (m) { m.setAttribute("aria-pressed", String(m === b)); });
      onpick(o.key);
    });
    return b;
  });
  return box;
}
var NAV = document.getElementById("nav"), SECTIONS = document.getElementById("sections");
function card(id, title, what) {
  var c = el("section", {class: "card", id: id}, SECTIONS);
  el("h2", null, c, title);
  if (what) el("p", {class: "what"}, c, what);
  el("a", {href: "#" + id}, NAV, title);
  return c;
}
function section(name, fn) {
  try { fn(); } catch (err) { report("section " + name + ": " + (err && err.stack ? err.stack.split("\n")[0] : err)); }
}
var AXES = {};
D.axes.forEach(function (a) { AXES[a.key] = a; });

/* ---------------------------------------------------------------- header and summary */
section("summary", function () {
  var inp = D.inputs || {}, parts = [];
  if (inp.model) parts.push("model " + inp.model.name);
  if (inp.cluster) parts.push("cluster " + inp.cluster.name + " (" + inp.cluster.gpu + ")");
  if (inp.parallel) parts.push("global batch " + inp.parallel.global_batch_size + ", micro-batch " + inp.parallel.micro_batch_size);
  if (inp.algorithm) parts.push(inp.algorithm + " collectives");
  document.getElementById("subtitle").textContent = parts.filter(Boolean).join(" \u00b7 ");
  var box = document.getElementById("summary");
  (D.summary || []).forEach(function (k) {
    var d = el("div", {class: "kpi"}, box);
    el("div", {class: "l"}, d, k.label);
    el("div", {class: "v"}, d, fmt(k.kind, k.value));
    if (k.detail) el("div", {class: "d"}, d, k.detail);
  });
});

/* ---------------------------------------------------------------- traffic heatmap */
function drawHeatmap(H, id, title, intro) {
  var c = card(id, title, intro || ("Bytes each " + H.unit + " (row, sender) sends to each " + H.unit + " (column, receiver) in one iteration. " +
    "Colour: the parallelism axis that sends the most between the pair; darker = more bytes (log scale). " +
    "Toggle axes to see each pattern alone."));
  var primary = id === "heatmap";
  var controls = el("div", {class: "controls"}, c);
  el("span", {class: "lab"}, controls, "axes");
  var enabled = {}, chips = {};
  H.layers.forEach(function (l) { enabled[l.axis] = true; });
  var requested = PARAMS.get("axes");
  if (requested !== null) {
    var want = requested.split(",").filter(Boolean);
    H.layers.forEach(function (l) { enabled[l.axis] = want.indexOf(l.axis) >= 0; });
  }
  var mode = PARAMS.get("colour") === "bytes" ? "bytes" : "axis";
  H.layers.forEach(function (l) {
    var b = el("button", {class: "chip", type: "button", "data-axis": l.axis, "aria-pressed": String(!!enabled[l.axis])}, controls);
    el("span", {class: "sw"}, b).style.background = l.color;
    el("span", null, b, l.label + " \u00b7 " + fmtBytes(l.total_bytes));
    b.addEventListener("click", function () { enabled[l.axis] = !enabled[l.axis]; sync(); });
    chips[l.axis] = b;
  });
  var all = el("button", {class: "btn", type: "button"}, controls, "all");
  all.addEventListener("click", function () { H.layers.forEach(function (l) { enabled[l.axis] = true; }); sync(); });
  var none = el("button", {class: "btn", type: "button"}, controls, "none");
  none.addEventListener("click", function () { H.layers.forEach(function (l) { enabled[l.axis] = false; }); sync(); });
  el("span", {class: "sep"}, controls);
  el("span", {class: "lab"}, controls, "colour");
  var modeButtons = [["axis", "by axis"], ["bytes", "by bytes"]].map(function (m) {
    var b = el("button", {class: "btn", type: "button", "aria-pressed": String(mode === m[0])}, controls, m[1]);
    b.addEventListener("click", function () {
      mode = m[0];
      modeButtons.forEach(function (x) { x.setAttribute("aria-pressed", String(x === b)); });
      draw();
    });
    return b;
  });

  var row = el("div", {class: "row"}, c);
  /* whole pixels per cell up to 310 cells a side; above, fractional, and every busy cell drawn at least
     2 px wide so that sparse patterns (a DP diagonal among 2,048 nodes) stay visible */
  var N = H.cells, scale = N <= 310 ? Math.max(1, Math.floor(620 / N)) : 620 / N, dot = Math.max(scale, 2);
  var M = {l: 66, t: 12, r: 12, b: 50}, P = Math.round(N * scale);
  var canvas = el("canvas", {id: id + "-canvas", "aria-label": title}, row);
  var ctx = sizeCanvas(canvas, M.l + P + M.r, M.t + P + M.b);
  var side = el("div", {class: "side"}, row);
  var legendCanvas = el("canvas", {id: id + "-legend"}, side);
  var status = el("p", {class: "stat"}, side);
  var explain = el("ul", {class: "notes"}, side);
  ["TP groups: blocks on the diagonal (neighbouring GPUs, inside a node).",
   "DP groups: diagonals at a stride of tp \u00d7 cp; PP: lines to the next stage (and back).",
   "EMB: first and last pipeline stage; EP: all-to-all blocks; CP: ring to the neighbour."].forEach(function (t) {
    el("li", null, explain, t);
  });
  notesList(side, H.notes.concat([H.algorithm + " algorithm, " + H.view + " view; total " + fmtBytes(H.total_bytes)]));

  var maps = H.layers.map(function (l) {
    var m = new Map();
    for (var i = 0; i < l.r.length; i++) m.set(l.r[i] * N + l.c[i], l.b[i]);
    return m;
  });
  var allMap = new Map();
  for (var i = 0; i < H.all.r.length; i++) allMap.set(H.all.r[i] * N + H.all.c[i], H.all.b[i]);
  var lo = Math.log(Math.max(1, H.min_bytes)), hi = Math.log(Math.max(1, H.max_bytes));
  if (hi - lo < Math.log(10)) lo = hi - Math.log(10);
  function level(v) { return (Math.log(v) - lo) / (hi - lo); }
  var lastBest = new Map();

  function sync() {
    H.layers.forEach(function (l) { chips[l.axis].setAttribute("aria-pressed", String(!!enabled[l.axis])); });
    draw();
  }
  function draw() {
    var best = new Map(), on = 0;
    H.layers.forEach(function (l, li) {
      if (!enabled[l.axis]) return;
      on++;
      for (var i = 0; i < l.r.length; i++) {
        var k = l.r[i] * N + l.c[i], cur = best.get(k);
        if (!cur || l.b[i] > cur[1]) best.set(k, [li, l.b[i]]);
      }
    });
    var allOn = on === H.layers.length;
    lastBest = best;
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.cssWidth, canvas.cssHeight);
    ctx.fillStyle = "#fcfcfd"; ctx.fillRect(M.l, M.t, P, P);
    if (scale >= 6) {
      ctx.strokeStyle = "#eef0f3"; ctx.lineWidth = 1; ctx.beginPath();
      for (var g = 1; g < N; g++) {
        ctx.moveTo(M.l + g * scale + 0.5, M.t); ctx.lineTo(M.l + g * scale + 0.5, M.t + P);
        ctx.moveTo(M.l, M.t + g * scale + 0.5); ctx.lineTo(M.l + P, M.t + g * scale + 0.5);
      }
      ctx.stroke();
    }
    var gap = scale >= 6 ? 1 : 0, cells = [];
    best.forEach(function (cur, k) { cells.push([k, cur[0], allOn ? (allMap.get(k) || cur[1]) : cur[1]]); });
    cells.sort(function (a, b) { return a[2] - b[2]; });  /* busiest on top where widened cells overlap */
    cells.forEach(function (cell) {
      var k = cell[0], r = Math.floor(k / N), col = k - r * N, cur = [cell[1]];
      var t = level(cell[2]);
      ctx.fillStyle = rgb(mode === "axis" ? axisShade(H.layers[cur[0]].color, t) : viridis(t));
      ctx.fillRect(M.l + col * scale + gap, M.t + r * scale + gap, dot - gap, dot - gap);
    });
    if (H.level === "gpu" && H.block === 1 && H.num_nodes > 1 && H.num_nodes <= 64) {
      ctx.strokeStyle = "rgba(60,70,80,.55)"; ctx.lineWidth = 1; ctx.beginPath();
      for (var n = 1; n < H.num_nodes; n++) {
        var p = Math.round(n * H.gpus_per_node * scale) + 0.5;
        ctx.moveTo(M.l + p, M.t); ctx.lineTo(M.l + p, M.t + P);
        ctx.moveTo(M.l, M.t + p); ctx.lineTo(M.l + P, M.t + p);
      }
      ctx.stroke();
    }
    ctx.strokeStyle = "#9aa5b1"; ctx.lineWidth = 1; ctx.strokeRect(M.l - 0.5, M.t - 0.5, P + 1, P + 1);
    /* ticks: powers of two giving about 8 labels, or node starts at GPU level */
    var step = Math.pow(2, Math.max(0, Math.ceil(Math.log2(Math.max(H.side, 1) / 8))));
    if (H.level === "gpu" && H.gpus_per_node > step && H.side / H.gpus_per_node >= 4) step = H.gpus_per_node;
    ctx.fillStyle = "#52606d"; ctx.font = "11px system-ui, sans-serif";
    for (var idx = 0; idx < H.side; idx += step) {
      var pos = (Math.floor(idx / H.block) + 0.5) * scale;
      ctx.textAlign = "center"; ctx.textBaseline = "top"; ctx.fillText(String(idx), M.l + pos, M.t + P + 5);
      ctx.textAlign = "right"; ctx.textBaseline = "middle"; ctx.fillText(String(idx), M.l - 6, M.t + pos);
    }
    ctx.font = "12px system-ui, sans-serif"; ctx.fillStyle = "#323f4b";
    ctx.textAlign = "center"; ctx.textBaseline = "alphabetic";
    ctx.fillText("destination " + H.unit + " (dst, receives) \u2192", M.l + P / 2, M.t + P + 38);
    ctx.save(); ctx.translate(16, M.t + P / 2); ctx.rotate(-Math.PI / 2);
    ctx.fillText("\u2190 source " + H.unit + " (src, sends)", 0, 0); ctx.restore();
    canvas.setAttribute("data-cells", String(best.size));
    canvas.setAttribute("data-axes", H.layers.filter(function (l) { return enabled[l.axis]; }).map(function (l) { return l.axis; }).join(","));
    if (primary) document.body.setAttribute("data-heatmap-cells", String(best.size));
    if (!H.layers.length) {
      ctx.fillStyle = "#9aa5b1"; ctx.font = "14px system-ui, sans-serif"; ctx.textAlign = "center"; ctx.textBaseline = "middle";
      ctx.fillText("no communication", M.l + P / 2, M.t + P / 2);
    }
    status.textContent = best.size.toLocaleString("en-US") + " cells drawn" +
      (allOn ? " \u00b7 shade: all axes together" : on ? " \u00b7 shade: the largest selected axis" : " \u00b7 no axis selected");
    drawLegend(allOn);
  }
  function drawLegend() {
    var rows = mode === "axis" ? H.layers.filter(function (l) { return enabled[l.axis]; }) : [{label: "bytes", color: null}];
    var lc = legendCanvas, h = 16, top = 4;
    var lctx = sizeCanvas(lc, 300, top + Math.max(rows.length, 1) * (h + 3) + 22), x0 = 44, w = 240;
    lctx.font = "11px system-ui, sans-serif"; lctx.textBaseline = "middle";
    rows.forEach(function (l, i) {
      var y = top + i * (h + 3);
      for (var px = 0; px < w; px++) {
        lctx.fillStyle = rgb(l.color ? axisShade(l.color, px / (w - 1)) : viridis(px / (w - 1)));
        lctx.fillRect(x0 + px, y, 1, h);
      }
      lctx.fillStyle = "#52606d"; lctx.textAlign = "right"; lctx.fillText(l.label, x0 - 6, y + h / 2);
    });
    var yb = top + Math.max(rows.length, 1) * (h + 3) + 8;
    lctx.fillStyle = "#52606d";
    lctx.textAlign = "left"; lctx.fillText(fmtBytes(Math.exp(lo)), x0, yb);
    lctx.textAlign = "center"; lctx.fillText(fmtBytes(Math.exp((lo + hi) / 2)), x0 + w / 2, yb);
    lctx.textAlign = "right"; lctx.fillText(fmtBytes(Math.exp(hi)), x0 + w, yb);
  }
  canvas.addEventListener("mousemove", function (evt) {
    var p = canvasPoint(canvas, evt), col = Math.floor((p[0] - M.l) / scale), r = Math.floor((p[1] - M.t) / scale);
    if (col < 0 || r < 0 || col >= N || r >= N) { hideTip(); return; }
    var k = r * N + col, span = function (i) {
      var a = i * H.block, b = Math.min(H.side, a + H.block) - 1;
      return a === b ? H.unit + " " + a : H.unit + "s " + a + "\u2013" + b;
    };
    var lines = [];
    H.layers.forEach(function (l, li) {
      var v = maps[li].get(k);
      if (v) lines.push(l.label + ": " + fmtBytes(v) + (enabled[l.axis] ? "" : " (hidden)"));
    });
    if (allMap.get(k)) lines.push("all axes: " + fmtBytes(allMap.get(k)));
    if (!lines.length) lines.push("no traffic");
    if (H.block > 1) lines.push("largest pair of the block");
    showTip(evt, span(r) + " \u2192 " + span(col), lines);
  });
  canvas.addEventListener("mouseleave", hideTip);
  if (primary) {
    API.setAxes = function (list) { H.layers.forEach(function (l) { enabled[l.axis] = list.indexOf(l.axis) >= 0; }); sync(); return lastBest.size; };
    API.heatmapCells = function () { return lastBest.size; };
  }
  sync();
}

/* ---------------------------------------------------------------- bytes by axis and link */
function drawBytes(B) {
  var c = card("bytes", "Bytes by axis and link",
    "What each kind of parallelism puts on the links per iteration: solid inside a node (NVLink, PCIe), striped between nodes (the network).");
  var rows = B.rows, W = 1120, lh = 30, L = 70, R = 300, H = rows.length * lh + 30;
  var s = svgRoot(c, W, H), defs = sv("defs", null, s);
  var max = Math.max.apply(null, rows.map(function (r) { return r.bytes; }).concat([1]));
  var bw = W - L - R;
  rows.forEach(function (r, i) {
    var y = 8 + i * lh, g = sv("g", null, s);
    sv("text", {x: L - 10, y: y + 15, "text-anchor": "end", "font-size": 13, fill: "#323f4b"}, g, r.label);
    sv("rect", {x: L, y: y + 3, width: bw, height: 18, fill: "#f5f7fa"}, g);
    var wi = bw * r.intra_node_bytes / max, we = bw * r.inter_node_bytes / max;
    titled(sv("rect", {x: L, y: y + 3, width: wi, height: 18, fill: r.color}, g), r.label + " intra-node: " + fmtBytes(r.intra_node_bytes));
    titled(sv("rect", {x: L + wi, y: y + 3, width: we, height: 18, fill: stripes(defs, "st-" + r.axis, r.color)}, g),
           r.label + " inter-node: " + fmtBytes(r.inter_node_bytes));
    var text = r.bytes ? fmtBytes(r.bytes) + "  \u00b7  " + fmtPct(r.share) + " of all  \u00b7  " + fmtPct(r.inter_node_share) + " inter-node" : "none";
    sv("text", {x: L + bw + 12, y: y + 16, "font-size": 12, fill: r.bytes ? "#323f4b" : "#9aa5b1"}, g, text);
  });
  var y = 8 + rows.length * lh + 14;
  sv("text", {x: L, y: y, "font-size": 12, fill: "#616e7c"}, s,
     "all axes: " + fmtBytes(B.total_bytes) + "  \u00b7  intra-node " + fmtBytes(B.intra_node_bytes) +
     "  \u00b7  inter-node " + fmtBytes(B.inter_node_bytes) + " (" + fmtPct(B.inter_node_share) + ")");
  var t = el("table", null, c), hr = el("tr", null, el("thead", null, t));
  ["axis", "bytes sent", "share", "intra-node", "inter-node", "op bytes (sum of message sizes)"].forEach(function (h) { el("th", null, hr, h); });
  var tb = el("tbody", null, t);
  rows.forEach(function (r) {
    var tr = el("tr", null, tb), td = el("td", null, tr);
    el("span", {class: "sw"}, td).style.background = r.color;
    td.appendChild(document.createTextNode(r.label));
    [fmtBytes(r.bytes), fmtPct(r.share), fmtBytes(r.intra_node_bytes), fmtBytes(r.inter_node_bytes),
     r.logical_bytes === null || r.logical_bytes === undefined ? "\u2013" : fmtBytes(r.logical_bytes)].forEach(function (v) { el("td", null, tr, v); });
  });
}

/* ---------------------------------------------------------------- message sizes */
function histogram(parent, Hh, what) {
  var box = el("div", null, parent);
  var W = 1120, Hgt = 300, M = {l: 70, r: 16, t: 14, b: 58};
  var n = Hh.edges_bytes.length - 1;
  function draw() {
    box.textContent = "";
    if (n <= 0) { el("p", {class: "muted"}, box, "no ops with a size"); return; }
    var s = svgRoot(box, W, Hgt), pw = W - M.l - M.r, ph = Hgt - M.t - M.b, bw = pw / n;
    var key = what.mode === "bytes" ? "bytes" : "counts", totals = [];
    for (var i = 0; i < n; i++) totals.push(Hh.series.reduce(function (a, se) { return a + se[key][i]; }, 0));
    var ticks = niceTicks(Math.max.apply(null, totals.concat([1])), 5), top = ticks[ticks.length - 1];
    ticks.forEach(function (t) {
      var y = M.t + ph - ph * t / top;
      sv("line", {x1: M.l, x2: M.l + pw, y1: y, y2: y, stroke: "#eef0f3"}, s);
      sv("text", {x: M.l - 8, y: y + 4, "text-anchor": "end", "font-size": 11, fill: "#616e7c"}, s, key === "bytes" ? fmtBytes(t) : fmtCount(t));
    });
    for (var b = 0; b < n; b++) {
      var y0 = M.t + ph;
      Hh.series.forEach(function (se) {
        var v = se[key][b];
        if (!v) return;
        var h = ph * v / top;
        titled(sv("rect", {x: M.l + b * bw + 1, y: y0 - h, width: Math.max(bw - 2, 1), height: h, fill: se.color}, s),
               se.label + ", " + fmtBytes(Hh.edges_bytes[b]) + " \u2264 size < " + fmtBytes(Hh.edges_bytes[b + 1]) + ": " +
               fmtCount(se.counts[b]) + " ops, " + fmtBytes(se.bytes[b]));
        y0 -= h;
      });
      if (totals[b] > 0) sv("text", {x: M.l + (b + 0.5) * bw, y: y0 - 4, "text-anchor": "middle", "font-size": 10, fill: "#52606d"}, s,
                            key === "bytes" ? fmtBytes(totals[b]) : fmtCount(totals[b]));
    }
    var every = Math.max(1, Math.ceil(n / 14));
    for (var e = 0; e <= n; e += every) {
      var x = M.l + e * bw;
      sv("line", {x1: x, x2: x, y1: M.t + ph, y2: M.t + ph + 4, stroke: "#9aa5b1"}, s);
      sv("text", {x: x, y: M.t + ph + 17, "text-anchor": "middle", "font-size": 11, fill: "#616e7c"}, s, fmtBytes(Hh.edges_bytes[e]));
    }
    sv("line", {x1: M.l, x2: M.l + pw, y1: M.t + ph + 0.5, y2: M.t + ph + 0.5, stroke: "#9aa5b1"}, s);
    sv("text", {x: M.l + pw / 2, y: Hgt - 12, "text-anchor": "middle", "font-size": 12, fill: "#323f4b"}, s,
       "message size (power-of-two bins, nccl-tests' size convention)");
    sv("text", {x: 14, y: M.t + ph / 2, "text-anchor": "middle", "font-size": 12, fill: "#323f4b",
                transform: "rotate(-90 14 " + (M.t + ph / 2) + ")"}, s, key === "bytes" ? "bytes" : "ops per iteration");
    legend(box, Hh.series.map(function (se) { return {label: se.label, color: se.color}; }));
  }
  what.redraw = draw;
  draw();
}
function drawSizes(S) {
  var c = card("sizes", "Message sizes",
    "How many ops of each size one iteration issues, by axis: small messages pay latency, large ones bandwidth.");
  var what = {mode: "counts"}, views = [];
  if (S.predicted) views.push({key: "predicted", label: "predicted (" + fmtCount(S.predicted.total_ops) + " ops)", h: S.predicted});
  if (S.measured) views.push({key: "measured", label: "measured (" + fmtCount(S.measured.total_ops) + " ops, mean of " +
                                S.measured.num_iterations + " iteration" + (S.measured.num_iterations === 1 ? "" : "s") + ")", h: S.measured});
  var current = views[0], holder;
  var bar = el("div", {class: "controls"}, c);
  buttons(bar, "count", [{key: "counts", label: "ops"}, {key: "bytes", label: "bytes"}], "counts",
          function (k) { what.mode = k; what.redraw(); });
  if (views.length > 1) buttons(bar, "source", views, current.key, function (k) {
    current = views.filter(function (v) { return v.key === k; })[0]; holder.textContent = ""; histogram(holder, current.h, what);
  });
  holder = el("div", null, c);
  histogram(holder, current.h, what);
  notesList(c, ["a collective counts once per group, a point-to-point transfer once (its send), an all_to_all once per issuing rank" +
                (S.measured ? "; measured: recv and setup records left out, per iteration" : "")]);
}

/* ---------------------------------------------------------------- iteration time */
function drawBreakdown(B) {
  var c = card("breakdown", "Where the iteration time goes",
    "The " + B.method + " estimate of one iteration, term by term (critical pipeline stage " + B.critical_stage + ").");
  var W = 1120, s = svgRoot(c, W, 92), L = 10, bw = W - 20, x = L;
  B.terms.forEach(function (t) {
    if (!(t.seconds > 0)) return;
    var w = bw * t.share, g = sv("g", null, s);
    titled(sv("rect", {x: x, y: 26, width: Math.max(w, 0.5), height: 40, fill: t.color, stroke: "#fff", "stroke-width": 1}, g),
           t.label + ": " + fmtSec(t.seconds) + " (" + fmtPct(t.share) + ")");
    if (w > 70) {
      sv("text", {x: x + w / 2, y: 44, "text-anchor": "middle", "font-size": 12, fill: t.key === "bubble" ? "#323f4b" : "#fff",
                  "font-weight": 600}, g, t.label);
      sv("text", {x: x + w / 2, y: 59, "text-anchor": "middle", "font-size": 11, fill: t.key === "bubble" ? "#323f4b" : "#fff"}, g,
         fmtPct(t.share));
    }
    x += w;
  });
  sv("text", {x: L, y: 16, "font-size": 12, fill: "#323f4b"}, s, B.label + " \u2014 " + fmtSec(B.iteration_time_s) + " per iteration");
  sv("text", {x: L + bw, y: 16, "font-size": 12, fill: "#616e7c", "text-anchor": "end"}, s,
     "communication " + fmtPct(B.comm_ratio) + " \u00b7 bubble " + fmtPct(B.bubble_ratio) + " \u00b7 " +
     fmtCount(B.tokens_per_s) + " tokens/s");
  var t = el("table", {style: "margin-top:8px"}, c), hr = el("tr", null, el("thead", null, t));
  el("th", null, hr, "");
  B.terms.forEach(function (term) {
    var th = el("th", null, hr);
    el("span", {class: "sw"}, th).style.background = term.color;
    th.appendChild(document.createTextNode(term.label));
  });
  el("th", null, hr, "iteration");
  var tb = el("tbody", null, t), r1 = el("tr", null, tb), r2 = el("tr", null, tb);
  el("td", null, r1, "seconds"); el("td", null, r2, "share");
  B.terms.forEach(function (term) { el("td", null, r1, fmtSec(term.seconds)); el("td", null, r2, fmtPct(term.share)); });
  el("td", null, r1, fmtSec(B.iteration_time_s)); el("td", null, r2, "100%");
  if (B.terms.some(function (term) { return term.hidden_seconds > 0; })) {
    var r3 = el("tr", null, tb);
    el("td", {title: "communication that runs under compute (overlapped) and so adds no time"}, r3, "hidden");
    B.terms.forEach(function (term) { el("td", null, r3, term.hidden_seconds > 0 ? fmtSec(term.hidden_seconds) : ""); });
    el("td", null, r3, "");
  }
  if (B.plan) drawPlan(c, B);
}
function drawPlan(c, B) {
  var P = B.plan;
  el("h2", {style: "margin-top:18px"}, c, "Top configurations of the plan");
  el("p", {class: "what"}, c, P.num_gpus.toLocaleString("en-US") + " GPUs, global batch " + P.global_batch_size + ": " +
     fmtCount(P.num_candidates) + " candidates, " + fmtCount(P.num_valid) + " valid, " + fmtCount(P.num_fit) +
     " fit in memory; the fastest, estimated op by op, beside this job.");
  var cols = [{label: "this job", sub: B.label, terms: B.terms, iteration_time_s: B.iteration_time_s, reason: ""}].concat(
    P.entries.map(function (e) { return {label: "#" + e.rank, sub: e.label, terms: e.terms, iteration_time_s: e.iteration_time_s,
                                         reason: e.reason + " \u00b7 " + sig(e.memory_GiB) + " GiB \u00b7 MFU " + fmtPct(e.mfu)}; }));
  var W = 1120, H = 360, M = {l: 70, r: 10, t: 14, b: 100}, pw = W - M.l - M.r, ph = H - M.t - M.b;
  var s = svgRoot(c, W, H);
  var ticks = niceTicks(Math.max.apply(null, cols.map(function (k) { return k.iteration_time_s; })), 5), top = ticks[ticks.length - 1];
  ticks.forEach(function (t) {
    var y = M.t + ph - ph * t / top;
    sv("line", {x1: M.l, x2: M.l + pw, y1: y, y2: y, stroke: "#eef0f3"}, s);
    sv("text", {x: M.l - 8, y: y + 4, "text-anchor": "end", "font-size": 11, fill: "#616e7c"}, s, fmtSec(t));
  });
  var slot = pw / cols.length, bw = Math.min(64, slot * 0.6);
  cols.forEach(function (k, i) {
    var x = M.l + i * slot + (slot - bw) / 2, y = M.t + ph;
    var g = titled(sv("g", null, s), k.label + ": " + k.sub + " \u2014 " + fmtSec(k.iteration_time_s) + (k.reason ? "\n" + k.reason : ""));
    k.terms.forEach(function (t) {
      if (!(t.seconds > 0)) return;
      var h = ph * t.seconds / top;
      titled(sv("rect", {x: x, y: y - h, width: bw, height: h, fill: t.color}, g), t.label + ": " + fmtSec(t.seconds));
      y -= h;
    });
    sv("text", {x: x + bw / 2, y: y - 5, "text-anchor": "middle", "font-size": 11, fill: "#323f4b"}, g, fmtSec(k.iteration_time_s));
    sv("text", {x: x + bw / 2, y: M.t + ph + 16, "text-anchor": "middle", "font-size": 12, "font-weight": 600,
                fill: i === 0 ? "#3e6ea8" : "#323f4b"}, g, k.label);
    var parts = [];
    k.sub.split(" \u00b7 ").forEach(function (p) {  /* one line per word where the column is narrow */
      if (p.length * 5.6 > slot - 6) parts = parts.concat(p.split(" ")); else parts.push(p);
    });
    parts.forEach(function (p, j) {
      sv("text", {x: x + bw / 2, y: M.t + ph + 31 + 13 * j, "text-anchor": "middle", "font-size": 10, fill: "#616e7c"}, g, p);
    });
  });
  legend(c, B.terms.map(function (t) { return {label: t.label, color: t.color}; }));
  notesList(c, P.notes);
}

/* ---------------------------------------------------------------- pipeline schedule */
function drawSchedule(S) {
  var c = card("schedule", "Pipeline schedule of one iteration",
    "Each row is a pipeline stage; boxes are forward (light) and backward (dark) passes of a micro-batch, numbered; " +
    "hatched gaps are the bubble, where a stage waits.");
  if (!S.schedules.length) { notesList(c, S.notes); return; }
  var current = S.schedules.filter(function (x) { return x.configured; })[0] || S.schedules[0];
  var requested = PARAMS.get("schedule");
  S.schedules.forEach(function (x) { if (requested && x.name === requested) current = x; });
  if (S.schedules.length > 1) buttons(c, "schedule", S.schedules.map(function (x) { return {key: x.label, label: x.label}; }), current.label,
    function (k) { current = S.schedules.filter(function (x) { return x.label === k; })[0]; draw(); });
  var stat = el("p", {class: "stat"}, c);
  var canvas = el("canvas", {id: "schedule-canvas", "aria-label": "pipeline timeline"}, c);
  legend(c, [{label: "forward", color: "#9ec5e8"}, {label: "backward", color: "#3a78b5"},
             {label: "bubble (idle)", color: "#f6d7d3", border: "1px solid #e0a39a"}].concat(
             S.tail.map(function (t) { return {label: t.label, color: t.color}; })));
  notesList(c, S.notes);
  var ctx, M = {l: 74, r: 14, t: 8, b: 34}, W = 1120, rowH, total, pw, byStage;
  var hatch = document.createElement("canvas"); hatch.width = 8; hatch.height = 8;
  var hc = hatch.getContext("2d");
  hc.fillStyle = "#fbe9e6"; hc.fillRect(0, 0, 8, 8);
  hc.strokeStyle = "#e9b3aa"; hc.lineWidth = 1.5; hc.beginPath(); hc.moveTo(0, 8); hc.lineTo(8, 0); hc.moveTo(-2, 2); hc.lineTo(2, -2);
  hc.moveTo(6, 10); hc.lineTo(10, 6); hc.stroke();
  function chunkColor(kind, chunk, v) {
    var base = kind === "fwd" ? [158, 197, 232] : [58, 120, 181];
    return rgb(v > 1 ? mix(base, kind === "fwd" ? [120, 170, 220] : [24, 72, 130], chunk / Math.max(1, v - 1)) : base);
  }
  function draw() {
    var X = current, p = X.pp, sl = X.slots;
    rowH = Math.max(9, Math.min(28, Math.floor(440 / p)));
    ctx = sizeCanvas(canvas, W, M.t + p * rowH + M.b);
    total = X.makespan_s + S.tail.reduce(function (a, t) { return a + t.seconds; }, 0);
    pw = W - M.l - M.r;
    var xs = function (t) { return M.l + pw * t / total; };
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, canvas.cssHeight);
    var pattern = ctx.createPattern(hatch, "repeat");
    ctx.font = "11px system-ui, sans-serif";
    for (var st = 0; st < p; st++) {
      var y = M.t + st * rowH;
      ctx.fillStyle = pattern; ctx.fillRect(xs(0), y + 1, xs(X.makespan_s) - xs(0), rowH - 2);
      ctx.fillStyle = "#52606d"; ctx.textAlign = "right"; ctx.textBaseline = "middle";
      if (rowH >= 11 || st % Math.ceil(11 / rowH) === 0) ctx.fillText("stage " + st, M.l - 8, y + rowH / 2);
    }
    byStage = [];
    for (var s2 = 0; s2 < p; s2++) byStage.push([]);
    for (var i = 0; i < sl.stage.length; i++) {
      var s = sl.stage[i], x0 = xs(sl.t_start_s[i]), x1 = xs(sl.t_end_s[i]), yy = M.t + s * rowH;
      byStage[s].push(i);
      ctx.fillStyle = chunkColor(sl.kind[i], sl.chunk[i], X.virtual_pipeline_size);
      ctx.fillRect(x0, yy + 1, Math.max(x1 - x0 - (x1 - x0 > 3 ? 1 : 0), 0.6), rowH - 2);
      if (x1 - x0 >= 15 && rowH >= 12) {
        ctx.fillStyle = sl.kind[i] === "fwd" ? "#1f3b57" : "#fff"; ctx.textAlign = "center"; ctx.textBaseline = "middle";
        ctx.fillText(String(sl.micro_batch[i]), (x0 + x1) / 2, yy + rowH / 2 + 0.5);
      }
    }
    var t0 = X.makespan_s;
    S.tail.forEach(function (t) {
      ctx.fillStyle = t.color; ctx.fillRect(xs(t0), M.t + 1, Math.max(xs(t0 + t.seconds) - xs(t0), 1), p * rowH - 2);
      if (xs(t0 + t.seconds) - xs(t0) > 30) {
        ctx.save(); ctx.fillStyle = "#fff"; ctx.textAlign = "center"; ctx.textBaseline = "middle";
        ctx.fillText(t.key.toUpperCase(), (xs(t0) + xs(t0 + t.seconds)) / 2, M.t + p * rowH / 2); ctx.restore();
      }
      t0 += t.seconds;
    });
    var ticks = niceTicks(total, 8), base = M.t + p * rowH;
    ctx.strokeStyle = "#9aa5b1"; ctx.beginPath(); ctx.moveTo(M.l, base + 0.5); ctx.lineTo(M.l + pw, base + 0.5); ctx.stroke();
    ctx.fillStyle = "#616e7c"; ctx.textAlign = "center"; ctx.textBaseline = "top";
    ticks.forEach(function (t) {
      if (t > total * 1.0001) return;
      ctx.beginPath(); ctx.moveTo(xs(t) + 0.5, base); ctx.lineTo(xs(t) + 0.5, base + 4); ctx.stroke();
      ctx.fillText(fmtSec(t), xs(t), base + 7);
    });
    canvas.setAttribute("data-slots", String(sl.stage.length));
    stat.textContent = "";
    var add = function (label, value) { el("b", null, stat, label + " "); stat.appendChild(document.createTextNode(value + "    ")); };
    add(X.label + ":", "p = " + X.pp + ", m = " + X.num_micro_batches + (X.virtual_pipeline_size > 1 ? ", v = " + X.virtual_pipeline_size : ""));
    add("pipeline", fmtSec(X.makespan_s));
    add("idle", fmtPct(X.idle_fraction) + " of stage time (" + fmtSec(X.idle_s[0]) + " per stage on stage 0)");
    add("iteration", fmtSec(X.makespan_s + S.tail.reduce(function (a, t) { return a + t.seconds; }, 0)) +
        " (estimate " + fmtSec(S.iteration_time_s) + ")");
  }
  canvas.addEventListener("mousemove", function (evt) {
    var pt = canvasPoint(canvas, evt), st = Math.floor((pt[1] - M.t) / rowH), X = current, sl = X.slots;
    if (st < 0 || st >= X.pp || pt[0] < M.l) { hideTip(); return; }
    var t = (pt[0] - M.l) / pw * total;
    if (t > X.makespan_s) {
      var t0 = X.makespan_s;
      for (var j = 0; j < S.tail.length; j++) {
        if (t <= t0 + S.tail[j].seconds) { showTip(evt, S.tail[j].label, [fmtSec(S.tail[j].seconds) + ", after the pipeline flush"]); return; }
        t0 += S.tail[j].seconds;
      }
      hideTip(); return;
    }
    var ids = byStage[st];
    for (var k = 0; k < ids.length; k++) {
      var i = ids[k];
      if (t >= sl.t_start_s[i] && t <= sl.t_end_s[i]) {
        showTip(evt, "stage " + st + " \u00b7 micro-batch " + sl.micro_batch[i] + (X.virtual_pipeline_size > 1 ? " \u00b7 chunk " + sl.chunk[i] : ""),
                [(sl.kind[i] === "fwd" ? "forward" : "backward") + ", " + fmtSec(sl.t_start_s[i]) + " \u2192 " + fmtSec(sl.t_end_s[i])]);
        return;
      }
    }
    showTip(evt, "stage " + st + ": bubble", ["idle at " + fmtSec(t)]);
  });
  canvas.addEventListener("mouseleave", hideTip);
  draw();
}

/* ---------------------------------------------------------------- measured vs predicted */
function drawMeasured(Mm) {
  var rows = Mm.rows, hasPred = rows.some(function (r) { return r.predicted_bytes !== null; });
  /* without a prediction (report --no-predicted) the panel shows what was measured, no column of dashes */
  var c = hasPred ? card("measured", "Measured vs predicted",
    "Bytes per iteration of each axis's ops (sum of message sizes), from the measured ranks' op logs and from the prediction.")
    : card("measured", "Measured bytes by axis",
    "Bytes per iteration of each axis's ops (sum of message sizes), from the measured ranks' op logs.");
  var W = 1120, lh = hasPred ? 44 : 28, L = 70, R = 380, H = rows.length * lh + 16;
  var s = svgRoot(c, W, H), defs = sv("defs", null, s), bw = W - L - R;
  var max = Math.max.apply(null, rows.map(function (r) { return Math.max(r.measured_bytes || 0, r.predicted_bytes || 0); }).concat([1]));
  rows.forEach(function (r, i) {
    var y = 6 + i * lh, g = sv("g", null, s);
    sv("text", {x: L - 10, y: y + (hasPred ? 21 : 14), "text-anchor": "end", "font-size": 13, fill: "#323f4b"}, g, r.label);
    var yy = y + 2;
    if (hasPred) {
      titled(sv("rect", {x: L, y: yy, width: bw * (r.predicted_bytes || 0) / max, height: 15, fill: r.color}, g),
             "predicted " + fmtBytes(r.predicted_bytes));
      sv("text", {x: L + bw * (r.predicted_bytes || 0) / max + 6, y: yy + 12, "font-size": 11, fill: "#616e7c"}, g,
         "predicted " + fmtBytes(r.predicted_bytes));
      yy += 18;
    }
    titled(sv("rect", {x: L, y: yy, width: bw * r.measured_bytes / max, height: 15, fill: stripes(defs, "ms-" + r.axis, r.color)}, g),
           "measured " + fmtBytes(r.measured_bytes));
    sv("text", {x: L + bw * r.measured_bytes / max + 6, y: yy + 12, "font-size": 11, fill: "#616e7c"}, g, "measured " + fmtBytes(r.measured_bytes));
    if (hasPred) sv("text", {x: W - 10, y: y + 21, "text-anchor": "end", "font-size": 13, "font-weight": 600,
                             fill: r.ratio !== null && Math.abs(r.ratio - 1) <= 0.05 ? "#2f855a" : "#b7791f"}, g,
                    r.ratio === null ? "not predicted" : "measured/predicted " + fmtRatio(r.ratio));
  });
  legend(c, (hasPred ? [{label: "predicted", color: "#7b8794"}] : []).concat([{label: "measured (striped)", color: "repeating-linear-gradient(45deg,#7b8794 0 3px,#d9dde2 3px 6px)"}]));
  var t = el("table", null, c), hr = el("tr", null, el("thead", null, t));
  (hasPred ? ["axis", "measured bytes", "predicted bytes", "ratio", "measured ops", "predicted ops"] : ["axis", "measured bytes", "measured ops"])
    .forEach(function (h) { el("th", null, hr, h); });
  var tb = el("tbody", null, t);
  rows.forEach(function (r) {
    var tr = el("tr", null, tb), td = el("td", null, tr);
    el("span", {class: "sw"}, td).style.background = r.color;
    td.appendChild(document.createTextNode(r.label));
    (hasPred ? [fmtBytes(r.measured_bytes), fmtBytes(r.predicted_bytes), fmtRatio(r.ratio), fmtCount(r.measured_ops), fmtCount(r.predicted_ops)]
     : [fmtBytes(r.measured_bytes), fmtCount(r.measured_ops)]).forEach(function (v) { el("td", null, tr, v); });
  });
  var tr = el("tr", null, tb);
  (hasPred ? ["all", fmtBytes(Mm.measured_total_bytes), fmtBytes(Mm.predicted_total_bytes), fmtRatio(Mm.ratio), "", ""]
   : ["all", fmtBytes(Mm.measured_total_bytes), ""]).forEach(function (v) { el("td", null, tr, v); });
  notesList(c, Mm.notes);
}

/* ---------------------------------------------------------------- bandwidth curves */
/* Tableau 10, then its lighter ten: twenty series before a colour repeats (a bench of 12 groups repeated two) */
var PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#ff9da7", "#bab0ac",
               "#a0cbe8", "#ffbe7d", "#8cd17d", "#b6992d", "#f1ce63", "#86bcb6", "#d37295", "#fabfd2", "#d4a6c8", "#79706e"];
function seriesColor(i) { return PALETTE[i % PALETTE.length]; }
/* Busbw values that span more than this ratio (measured gloo at MB/s beside a preset's NVLink at 100 GB/s) go on a
   log axis: on a linear one scaled to the largest, the smaller curves lie flat on zero. */
var LOG_AXIS_RATIO = 30;
function drawBench(Bn) {
  var c = card("bench", "Bus bandwidth against message size",
    "Measured busbw of each collective and group size (nccl-tests' definition); dashed: what the cluster model assumes.");
  var W = 1120, H = 380, M = {l: 70, r: 210, t: 14, b: 46}, pw = W - M.l - M.r, ph = H - M.t - M.b;
  var s = svgRoot(c, W, H), series = Bn.series, hidden = {};
  s.setAttribute("id", "bench-chart");
  var sizes = [], values = [];
  series.forEach(function (se) {
    sizes = sizes.concat(se.size_bytes);
    values = values.concat(positive(se.busbw_bytes_per_s.concat(se.model_busbw_bytes_per_s || [])));
  });
  var lx0 = Math.log2(Math.max(1, Math.min.apply(null, sizes))), lx1 = Math.log2(Math.max.apply(null, sizes));
  if (lx1 - lx0 < 1) { lx0 -= 1; lx1 += 1; }
  var vmin = values.length ? Math.min.apply(null, values) : 1, vmax = values.length ? Math.max.apply(null, values) : 1e9;
  var log = vmax / vmin > LOG_AXIS_RATIO, Y, ticks;
  if (log) {
    Y = logScale(vmin, vmax, M.t + ph, M.t, 0.08);
    ticks = logTicks(Y.l0, Y.l1);
  } else {
    ticks = niceTicks(vmax / 1e9, 6).map(function (t) { return t * 1e9; });
    var top = ticks[ticks.length - 1];
    Y = function (v) { return M.t + ph - ph * v / top; };
  }
  s.setAttribute("data-scale", log ? "log" : "linear");
  var X = function (b) { return M.l + pw * (Math.log2(b) - lx0) / (lx1 - lx0); };
  function shown(v) { return v !== null && v !== undefined && (!log || v > 0); }
  var plot = sv("g", null, s);
  function draw() {
    plot.textContent = "";
    ticks.forEach(function (t) {
      sv("line", {x1: M.l, x2: M.l + pw, y1: Y(t), y2: Y(t), stroke: "#eef0f3"}, plot);
      sv("text", {x: M.l - 8, y: Y(t) + 4, "text-anchor": "end", "font-size": 11, fill: "#616e7c", class: "y-tick"}, plot, fmtTick(t / 1e9));
    });
    var stepE = Math.max(1, Math.ceil((lx1 - lx0) / 10));
    for (var e = Math.ceil(lx0); e <= lx1; e += stepE) {
      sv("line", {x1: X(Math.pow(2, e)), x2: X(Math.pow(2, e)), y1: M.t, y2: M.t + ph, stroke: "#f3f4f6"}, plot);
      sv("text", {x: X(Math.pow(2, e)), y: M.t + ph + 16, "text-anchor": "middle", "font-size": 11, fill: "#616e7c"}, plot, fmtBytes(Math.pow(2, e)));
    }
    sv("line", {x1: M.l, x2: M.l + pw, y1: M.t + ph + 0.5, y2: M.t + ph + 0.5, stroke: "#9aa5b1"}, plot);
    sv("text", {x: M.l + pw / 2, y: H - 6, "text-anchor": "middle", "font-size": 12, fill: "#323f4b"}, plot, "message size (log scale)");
    sv("text", {x: 16, y: M.t + ph / 2, "text-anchor": "middle", "font-size": 12, fill: "#323f4b",
                transform: "rotate(-90 16 " + (M.t + ph / 2) + ")"}, plot, "bus bandwidth (GB/s" + (log ? ", log scale)" : ")"));
    series.forEach(function (se, i) {
      if (hidden[i]) return;
      var col = seriesColor(i);
      if (se.model_busbw_bytes_per_s) {
        var pts = [];
        se.size_bytes.forEach(function (b, j) { var v = se.model_busbw_bytes_per_s[j]; if (shown(v)) pts.push(X(b) + "," + Y(v)); });
        sv("polyline", {points: pts.join(" "), fill: "none", stroke: col, "stroke-width": 1.5, "stroke-dasharray": "5 4", opacity: 0.75,
                        class: "model-curve"}, plot);
      }
      var line = [];
      se.size_bytes.forEach(function (b, j) { var v = se.busbw_bytes_per_s[j]; if (shown(v)) line.push(X(b) + "," + Y(v)); });
      sv("polyline", {points: line.join(" "), fill: "none", stroke: col, "stroke-width": 2.2, class: "measured-curve"}, plot);
      se.size_bytes.forEach(function (b, j) {
        var noisy = se.noisy && se.noisy[j];
        if (!shown(se.busbw_bytes_per_s[j])) return;
        titled(sv("circle", {cx: X(b), cy: Y(se.busbw_bytes_per_s[j]), r: noisy ? 3.5 : 3, fill: noisy ? "#fff" : col, stroke: col,
                             "stroke-width": noisy ? 1.5 : 0}, plot),
               se.label + ": " + fmtBytes(b) + " \u2192 " + fmtGBps(se.busbw_bytes_per_s[j]) +
               (se.time_s[j] !== null && se.time_s[j] !== undefined ? ", " + fmtSec(se.time_s[j]) : "") + (noisy ? " (noisy)" : "") +
               (se.model_busbw_bytes_per_s && se.model_busbw_bytes_per_s[j] !== null ? " (model " + fmtGBps(se.model_busbw_bytes_per_s[j]) + ")" : ""));
      });
    });
  }
  var lg = sv("g", null, s);
  series.forEach(function (se, i) {
    var y = M.t + 6 + i * 18, g = sv("g", {style: "cursor:pointer"}, lg);
    var swatch = sv("rect", {x: M.l + pw + 16, y: y - 6, width: 14, height: 4, fill: seriesColor(i)}, g);
    var label = sv("text", {x: M.l + pw + 36, y: y, "font-size": 12, fill: "#323f4b"}, g, se.label);
    g.addEventListener("click", function () {
      hidden[i] = !hidden[i]; label.setAttribute("opacity", hidden[i] ? 0.35 : 1); swatch.setAttribute("opacity", hidden[i] ? 0.35 : 1); draw();
    });
  });
  draw();
  var meta = Bn.meta || {}, keys = Object.keys(meta);
  if (keys.length) {
    var t = el("table", {class: "kv"}, c), tb = el("tbody", null, t);
    keys.forEach(function (k) {
      var tr = el("tr", null, tb);
      el("td", null, tr, k);
      el("td", null, tr, plain(meta[k]));
    });
  }
  notesList(c, ["source: " + Bn.source].concat(Bn.notes));
}

/* ---------------------------------------------------------------- time: measured vs predicted */
function logScale(lo, hi, a, b, pad) {  /* log10 axis from value lo..hi (widened by pad decades) onto pixels a..b */
  var l0 = Math.log10(lo) - (pad || 0), l1 = Math.log10(hi) + (pad || 0);
  if (l1 - l0 < 0.5) { var mid = (l0 + l1) / 2; l0 = mid - 0.25; l1 = mid + 0.25; }
  var f = function (v) { return a + (b - a) * (Math.log10(v) - l0) / (l1 - l0); };
  f.l0 = l0; f.l1 = l1;
  return f;
}
function logTicks(l0, l1) {  /* round values between 10^l0 and 10^l1: decades, with 2 and 5 between when few */
  var steps = l1 - l0 > 3 ? [1] : l1 - l0 > 1.2 ? [1, 3] : [1, 2, 5], out = [];
  for (var e = Math.floor(l0); e <= Math.ceil(l1); e++) {
    steps.forEach(function (m) { var v = m * Math.pow(10, e); if (Math.log10(v) >= l0 - 1e-9 && Math.log10(v) <= l1 + 1e-9) out.push(v); });
  }
  return out;
}
function fmtTick(v) {  /* an axis value as short as it can be and still itself: 0.001, 1e-5, 20, 1.5 */
  if (v === 0 || v >= 0.01) return sig(v);
  return v >= 1e-4 ? String(parseFloat(v.toPrecision(2))) : v.toExponential(0).replace("e-", "e\u2212");
}
function positive(values) { return values.filter(function (v) { return v !== null && v !== undefined && v > 0; }); }
function drawTime(T) {
  var c = card("time", "Time: measured vs predicted",
    "Each recorded op's duration (issue to completion seen) against the bandwidth model's time for the same op, size and " +
    "group (" + (T.bandwidth || "the cluster") + "); exposed communication per step; the predicted step against the measured one.");
  /* durations against message size, the model's curve dashed */
  var W = 1120, H = 380, M = {l: 80, r: 230, t: 14, b: 46}, pw = W - M.l - M.r, ph = H - M.t - M.b;
  var xs = [], ys = [];
  T.series.forEach(function (se) {
    xs = xs.concat(se.size_bytes, se.model_size_bytes || []);
    ys = ys.concat(positive(se.measured_p95_s.concat(se.measured_median_s, se.predicted_median_s, se.model_s || [])));
  });
  xs = positive(xs);
  if (xs.length && ys.length) {
    var s = svgRoot(c, W, H), plot = sv("g", null, s);
    s.setAttribute("id", "time-chart");
    var X = logScale(Math.min.apply(null, xs), Math.max.apply(null, xs), M.l, M.l + pw);
    var Y = logScale(Math.min.apply(null, ys), Math.max.apply(null, ys), M.t + ph, M.t, 0.08);  /* whiskers inside */
    var yt = logTicks(Y.l0, Y.l1);
    yt.forEach(function (v) {
      sv("line", {x1: M.l, x2: M.l + pw, y1: Y(v), y2: Y(v), stroke: "#eef0f3"}, plot);
      sv("text", {x: M.l - 8, y: Y(v) + 4, "text-anchor": "end", "font-size": 11, fill: "#616e7c", class: "y-tick"}, plot, fmtSec(v));
    });
    var b0 = Math.ceil(X.l0 / Math.log10(2)), b1 = Math.floor(X.l1 / Math.log10(2)), bstep = Math.max(1, Math.ceil((b1 - b0) / 10));
    for (var b = b0; b <= b1; b += bstep) {
      sv("text", {x: X(Math.pow(2, b)), y: M.t + ph + 16, "text-anchor": "middle", "font-size": 11, fill: "#616e7c"}, plot, fmtBytes(Math.pow(2, b)));
    }
    sv("line", {x1: M.l, x2: M.l + pw, y1: M.t + ph + 0.5, y2: M.t + ph + 0.5, stroke: "#9aa5b1"}, plot);
    sv("text", {x: M.l + pw / 2, y: H - 6, "text-anchor": "middle", "font-size": 12, fill: "#323f4b"}, plot, "message size (the median of each power-of-two bin, log scale)");
    sv("text", {x: 16, y: M.t + ph / 2, "text-anchor": "middle", "font-size": 12, fill: "#323f4b",
                transform: "rotate(-90 16 " + (M.t + ph / 2) + ")"}, plot, "op duration (log scale)");
    var curves = 0;
    T.series.forEach(function (se, i) {
      var col = seriesColor(i), model = [];
      (se.model_size_bytes || []).forEach(function (sz, j) { if (se.model_s[j] > 0) model.push(X(sz) + "," + Y(se.model_s[j])); });
      if (model.length > 1) {
        sv("polyline", {points: model.join(" "), fill: "none", stroke: col, "stroke-width": 1.5, "stroke-dasharray": "5 4",
                        class: "model-curve"}, plot);
        curves++;
      }
      se.size_bytes.forEach(function (sz, j) {
        var p = se.predicted_median_s[j], m = se.measured_median_s[j], q = se.measured_p95_s[j];
        if (q > 0 && m > 0) sv("line", {x1: X(sz), x2: X(sz), y1: Y(m), y2: Y(q), stroke: col, "stroke-width": 1.2, class: "whisker"}, plot);
        if (p > 0) titled(sv("rect", {x: X(sz) - 3.5, y: Y(p) - 3.5, width: 7, height: 7, fill: "#fff", stroke: col, "stroke-width": 1.5,
                                      class: "model-point"}, plot), se.label + " at " + fmtBytes(sz) + ": model " + fmtSec(p));
        if (m > 0) titled(sv("circle", {cx: X(sz), cy: Y(m), r: 3.5, fill: col}, plot),
                          se.label + " at " + fmtBytes(sz) + " (its bin's median size): median " + fmtSec(m) + ", p95 " + fmtSec(q) + ", model " +
                          fmtSec(p) + ", factor " + fmtFactor(se.factor[j]) + " (" + se.count[j] + " records)");
      });
      var y = M.t + 6 + i * 18;
      sv("rect", {x: M.l + pw + 16, y: y - 6, width: 14, height: 4, fill: col}, s);
      sv("text", {x: M.l + pw + 36, y: y, "font-size": 12, fill: "#323f4b"}, s, se.label);
    });
    s.setAttribute("data-model-curves", String(curves));
    s.setAttribute("data-plot-top", String(M.t));
    s.setAttribute("data-plot-bottom", String(M.t + ph));
    legend(c, [{label: "measured median (dot) to p95 (line)", color: "#7b8794"},
               {label: "bandwidth model at the same sizes (hollow square) and between them (dashed)",
                color: "repeating-linear-gradient(90deg,#7b8794 0 5px,#fff 5px 9px)"}]);
  }
  /* effective-bandwidth factors per op kind */
  el("h3", null, c, "Effective-bandwidth factor per op kind (model time / measured time)");
  var t = el("table", {id: "time-factors"}, c), hr = el("tr", null, el("thead", null, t));
  ["axis/op", "records", "measured median", "measured p95", "model median", "achieved busbw", "model busbw", "factor (median)", "factor (time-weighted)"]
    .forEach(function (h) { el("th", null, hr, h); });
  var tb = el("tbody", null, t);
  T.factors.forEach(function (r) {
    var tr = el("tr", null, tb);
    [r.axis + "/" + r.op, fmtCount(r.count), fmtSec(r.measured_median_s), fmtSec(r.measured_p95_s), fmtSec(r.predicted_median_s),
     fmtGBps(r.achieved_busbw_bytes_per_s), fmtGBps(r.model_busbw_bytes_per_s),
     fmtFactor(r.factor), fmtFactor(r.time_weighted_factor)]
      .forEach(function (v) { el("td", null, tr, v); });
  });
  /* exposed communication per step and axis */
  if (T.steps.length) {
    el("h3", null, c, "Exposed communication per step (union of op intervals, mean over ranks)");
    var axes = [];
    T.steps.forEach(function (st) { Object.keys(st.by_axis_s).forEach(function (a) { if (axes.indexOf(a) < 0) axes.push(a); }); });
    var t2 = el("table", {id: "time-exposed"}, c), hr2 = el("tr", null, el("thead", null, t2));
    ["step", "step time (slowest rank)", "communication", "share"].concat(axes).forEach(function (h) { el("th", null, hr2, h); });
    var tb2 = el("tbody", null, t2);
    T.steps.forEach(function (st) {
      var tr = el("tr", null, tb2);
      [String(st.step), fmtSec(st.step_s), fmtSec(st.comm_s), fmtPct(st.step_s > 0 ? st.comm_s / st.step_s : null)]
        .concat(axes.map(function (a) { return fmtSec(st.by_axis_s[a] || 0); })).forEach(function (v) { el("td", null, tr, v); });
    });
  }
  /* predicted vs measured step, term by term */
  if (T.terms.length) {
    var S = T.step;
    el("h3", null, c, "Predicted vs measured step: " + fmtSec(S.predicted_s) + " predicted, " + fmtSec(S.measured_median_s) +
       " measured (median of " + S.num_steps + "; " + fmtSec(S.measured_min_s) + "\u2013" + fmtSec(S.measured_max_s) + ")");
    var mx = 1e-12;
    T.terms.forEach(function (r) { mx = Math.max(mx, r.predicted_s || 0, r.measured_max_s || 0); });
    var lh = 40, L = 190, W2 = 1120, bw = W2 - L - 260, s2 = svgRoot(c, W2, T.terms.length * lh + 10);
    T.terms.forEach(function (r, i) {
      var y = 6 + i * lh, col = r.axis && AXES[r.axis] ? AXES[r.axis].color : "#7b8794";
      sv("text", {x: L - 10, y: y + 19, "text-anchor": "end", "font-size": 13, fill: "#323f4b"}, s2, r.term);
      titled(sv("rect", {x: L, y: y, width: bw * (r.predicted_s || 0) / mx, height: 14, fill: col}, s2), "predicted " + fmtSec(r.predicted_s));
      titled(sv("rect", {x: L, y: y + 17, width: bw * (r.measured_s || 0) / mx, height: 14, fill: col, opacity: 0.55}, s2),
             "measured " + fmtSec(r.measured_s) + " (" + fmtSec(r.measured_min_s) + "\u2013" + fmtSec(r.measured_max_s) + ")");
      if (r.measured_max_s) sv("line", {x1: L + bw * r.measured_min_s / mx, x2: L + bw * r.measured_max_s / mx, y1: y + 24, y2: y + 24,
                                        stroke: "#323f4b", "stroke-width": 1.2}, s2);
      sv("text", {x: W2 - 250, y: y + 19, "font-size": 12, fill: "#616e7c"}, s2,
         "predicted " + fmtSec(r.predicted_s) + ", measured " + fmtSec(r.measured_s) + " (" + fmtRatio(r.ratio) + ")");
    });
    legend(c, [{label: "predicted (solid)", color: "#7b8794"}, {label: "measured median (light) with min\u2013max", color: "#c5cbd3"}]);
  }
  notesList(c, T.notes);
}

/* ---------------------------------------------------------------- MoE routing */
function matrixCanvas(parent, mat, vmax, px, id) {
  var n = mat.length, sc = Math.max(1, Math.floor(px / n)), cv = el("canvas", {id: id}, parent);
  var ctx = sizeCanvas(cv, n * sc, n * sc);
  for (var i = 0; i < n; i++) for (var j = 0; j < n; j++) {
    ctx.fillStyle = rgb(viridis(vmax > 0 ? mat[i][j] / vmax : 0));
    ctx.fillRect(j * sc, i * sc, sc, sc);
  }
  return cv;
}
var MOE_MAP_PX = 340;  /* the MoE heatmap's side; .moe-map in report.css is as wide */
function drawMoe(Mo) {
  var c = card("moe", "MoE routing over iterations",
    "Tokens each expert-parallel rank (row) sends to each (column) per iteration: how the all-to-all pattern moves as training goes on.");
  Mo.items.forEach(function (it, idx) {
    var box = el("div", {style: idx ? "margin-top:18px;border-top:1px solid #e4e7eb;padding-top:12px" : ""}, c);
    el("div", {class: "stat"}, box).textContent = it.name + " \u2014 ep = " + it.ep + ", " + fmtCount(it.num_iterations) +
      " iterations (" + it.frames.length + " shown)";
    /* the heatmap's column is as wide as the heatmap (its controls wrap under it), the chart takes the rest: no gap */
    var row = el("div", {class: "row"}, box), left = el("div", {class: "moe-map"}, row), right = el("div", {class: "side"}, row);
    var big = el("div", null, left), ctl = el("div", {class: "controls"}, left);
    el("span", {class: "lab"}, ctl, "iteration");
    var slider = el("input", {type: "range", min: 0, max: it.frames.length - 1, value: 0, step: 1}, ctl);
    var lab = el("span", {class: "lab"}, ctl);
    var chart = el("div", null, right);
    var strip = el("div", {class: "frames"}, box), figs = [];
    var pick = [];
    var k = Math.min(10, it.frames.length);
    for (var q = 0; q < k; q++) pick.push(Math.round(q * (it.frames.length - 1) / Math.max(1, k - 1)));
    pick = pick.filter(function (v, i, a) { return a.indexOf(v) === i; });
    pick.forEach(function (f) {
      var fig = el("figure", null, strip);
      matrixCanvas(fig, it.matrices[f], it.max_tokens, 84);
      el("figcaption", null, fig, "it " + it.frames[f]);
      fig.addEventListener("click", function () { slider.value = f; show(f); });
      figs.push([f, fig]);
    });
    var marker;
    function show(f) {
      big.textContent = "";
      var cv = matrixCanvas(big, it.matrices[f], it.max_tokens, MOE_MAP_PX, "moe-" + idx);
      el("div", {class: "muted", style: "font-size:11px"}, big, "row: sending EP rank (0 at the top) \u00b7 column: receiving EP rank");
      cv.addEventListener("mousemove", function (evt) {
        var p = canvasPoint(cv, evt), n = it.ep, i = Math.floor(p[1] / (cv.cssHeight / n)), j = Math.floor(p[0] / (cv.cssWidth / n));
        if (i < 0 || j < 0 || i >= n || j >= n) { hideTip(); return; }
        showTip(evt, "EP rank " + i + " \u2192 " + j, [fmtCount(it.matrices[f][i][j]) + " tokens, iteration " + it.frames[f]]);
      });
      cv.addEventListener("mouseleave", hideTip);
      var m = it.metrics, fi = it.frames[f];
      lab.textContent = it.frames[f] + "  \u00b7  load imbalance " + m.load_imbalance[fi].toFixed(2) + "  \u00b7  cross-rank " +
        fmtPct(m.cross_rank_fraction[fi]) + "  \u00b7  entropy " + m.entropy[fi].toFixed(2);
      figs.forEach(function (x) { x[1].className = x[0] === f ? "on" : ""; });
      if (marker) { var xx = marker.x(fi); marker.line.setAttribute("x1", xx); marker.line.setAttribute("x2", xx); }
    }
    slider.addEventListener("input", function () { show(+slider.value); });
    marker = metricChart(chart, it);
    show(0);
  });
  legend(c, [{label: "0 tokens", color: rgb(viridis(0))}, {label: "half", color: rgb(viridis(0.5))},
             {label: "the most tokens of any pair in the file (" + Mo.items.map(function (it) { return it.name + ": " + fmtCount(it.max_tokens); }).join(", ") + ")",
              color: rgb(viridis(1))}]);
  notesList(c, Mo.notes.concat(["load imbalance: the busiest rank's received tokens over the mean (1 = balanced); " +
    "cross-rank: share of tokens leaving their rank; entropy: of the (src, dst) distribution, 1 = uniform"]));
}
function metricChart(parent, it) {
  var W = 720, H = 300, M = {l: 46, r: 12, t: 10, b: 30}, pw = W - M.l - M.r, ph = H - M.t - M.b, n = it.num_iterations;
  var s = svgRoot(parent, W, H), m = it.metrics;
  s.style.width = "100%";  /* fills the column beside the heatmap */
  var series = it.series || [{key: "load_imbalance", label: "load imbalance (max / mean)", color: "#e15759"},
    {key: "cross_rank_fraction", label: "cross-rank fraction", color: "#4e79a7"},
    {key: "entropy", label: "normalised entropy", color: "#59a14f"}];
  var ymax = 2;
  series.forEach(function (q) { m[q.key].forEach(function (v) { if (v !== null && v > ymax) ymax = v; }); });
  var ticks = niceTicks(ymax, 4), top = ticks[ticks.length - 1];
  var X = function (i) { return M.l + pw * (n > 1 ? i / (n - 1) : 0.5); }, Y = function (v) { return M.t + ph - ph * v / top; };
  ticks.forEach(function (t) {
    sv("line", {x1: M.l, x2: M.l + pw, y1: Y(t), y2: Y(t), stroke: "#eef0f3"}, s);
    sv("text", {x: M.l - 6, y: Y(t) + 4, "text-anchor": "end", "font-size": 10, fill: "#616e7c"}, s, sig(t));
  });
  var step = Math.max(1, Math.ceil(n / 2000));
  function line(vals, col, label) {
    var pts = [];
    for (var i = 0; i < n; i += step) if (vals[i] !== null) pts.push(X(i).toFixed(1) + "," + Y(vals[i]).toFixed(1));
    titled(sv("polyline", {points: pts.join(" "), fill: "none", stroke: col, "stroke-width": 1.8}, s), label);
  }
  series.forEach(function (q) { line(m[q.key], q.color, q.label); });
  sv("text", {x: M.l + pw / 2, y: H - 6, "text-anchor": "middle", "font-size": 11, fill: "#323f4b"}, s, "iteration");
  sv("text", {x: M.l, y: H - 6, "font-size": 10, fill: "#616e7c"}, s, "0");
  sv("text", {x: M.l + pw, y: H - 6, "text-anchor": "end", "font-size": 10, fill: "#616e7c"}, s, String(n - 1));
  var lineEl = sv("line", {x1: X(0), x2: X(0), y1: M.t, y2: M.t + ph, stroke: "#323f4b", "stroke-dasharray": "3 3"}, s);
  legend(parent, series.map(function (q) { return {label: q.label, color: q.color}; }));
  return {line: lineEl, x: X};
}

/* ---------------------------------------------------------------- inputs */
function plain(v) {
  if (Array.isArray(v)) return v.map(plain).join(", ");
  if (v !== null && typeof v === "object") return Object.keys(v).filter(function (k) { return k !== "source"; }).map(function (k) {
    return k + ": " + plain(v[k]); }).join(" \u00b7 ");
  return String(v);
}
function drawInputs(I) {
  var c = card("inputs", "Inputs", "What produced this report, so that it can be reproduced.");
  if (I.command_line) {
    el("div", {class: "stat"}, c, "command line");
    var pre = el("pre", {id: "command-line"}, c, I.command_line);
    var b = el("button", {class: "btn", type: "button"}, c, "copy command");
    b.addEventListener("click", function () {
      if (navigator.clipboard) navigator.clipboard.writeText(I.command_line).then(function () { b.textContent = "copied"; }, function () {
        b.textContent = "select the text above to copy"; });
      var range = document.createRange(); range.selectNodeContents(pre);
      var sel = window.getSelection(); sel.removeAllRanges(); sel.addRange(range);
    });
  }
  var row = el("div", {class: "row", style: "margin-top:10px"}, c);
  [["model", I.model], ["parallelism", I.parallel], ["cluster", I.cluster]].forEach(function (pair) {
    if (!pair[1]) return;
    var box = el("div", {class: "side"}, row);
    el("div", {class: "stat"}, box).textContent = pair[0];
    var t = el("table", {class: "kv"}, box), tb = el("tbody", null, t);
    Object.keys(pair[1]).forEach(function (k) {
      if (k === "source") return;  /* long citations: in the JSON below */
      var v = pair[1][k], tr = el("tr", null, tb);
      el("td", null, tr, k);
      /* what the job asked, and beside it how the estimate times it where they differ (flash on a V100) */
      var said = k === "attention" && I.attention_timed ? " \u2014 timed " + I.attention_timed
        : k === "gpu_util" && pair[0] === "cluster" && I.estimate_method && I.gpu_util === undefined
          ? " (the flat u of --method seed; this estimate uses the GPU's compute model)" : "";
      el("td", null, tr, plain(v) + said);
    });
  });
  var extra = {commscope_version: I.commscope_version, algorithm: I.algorithm, estimate_method: I.estimate_method, gpu_util: I.gpu_util};
  var files = I.files || {};
  Object.keys(files).forEach(function (k) { extra[k] = Array.isArray(files[k]) ? files[k].join(", ") : files[k]; });
  var t2 = el("table", {class: "kv", style: "margin-top:10px"}, c), tb2 = el("tbody", null, t2);
  Object.keys(extra).forEach(function (k) {
    if (extra[k] === undefined || extra[k] === null) return;
    var tr = el("tr", null, tb2); el("td", null, tr, k); el("td", null, tr, String(extra[k]));
  });
  var det = el("details", null, c);
  el("summary", null, det, "all inputs as JSON (with the presets' sources)");
  el("pre", null, det, JSON.stringify(I, null, 2));
}

/* ---------------------------------------------------------------- assemble */
if (D.heatmap) section("heatmap", function () { drawHeatmap(D.heatmap, "heatmap", "Who sends to whom"); });
if (D.bytes) section("bytes", function () { drawBytes(D.bytes); });
if (D.breakdown) section("breakdown", function () { drawBreakdown(D.breakdown); });
if (D.schedule) section("schedule", function () { drawSchedule(D.schedule); });
if (D.message_sizes && (D.message_sizes.predicted || D.message_sizes.measured)) section("sizes", function () { drawSizes(D.message_sizes); });
if (D.measured) section("measured", function () { drawMeasured(D.measured); });
if (D.measured_heatmap) section("measured heatmap", function () {
  drawHeatmap(D.measured_heatmap, "measured-heatmap", "Who sent to whom (measured)",
              "The measured ops decomposed into flows by the same code as the prediction (logical view), per iteration.");
});
if (D.time) section("time", function () { drawTime(D.time); });
if (D.bench) section("bench", function () { drawBench(D.bench); });
if (D.moe) section("moe", function () { drawMoe(D.moe); });
section("inputs", function () { drawInputs(D.inputs || {}); });
section("notes", function () {
  if (!D.notes || !D.notes.length) return;
  var c = card("notes", "Notes", "What the prediction and the estimate assumed.");
  notesList(c, D.notes);
});
section("footer", function () {
  document.getElementById("footer").textContent = "commscope " + (D.inputs && D.inputs.commscope_version || "") +
    " \u00b7 data format " + D.format + " v" + D.format_version + " \u00b7 built in " + fmtSec(D.build_s) +
    " \u00b7 self-contained: no request leaves this page";
});
document.body.setAttribute("data-ready", "1");
})();
