// Small DOM and formatting helpers shared by the pages.

/** An element: el("td", {class: "num"}, "3", child...). Text is always text (never HTML). */
export function el(tag, attrs, ...children) {
  const ns = ["svg", "g", "rect", "line", "path", "text", "title", "circle", "polyline"].includes(tag)
    ? "http://www.w3.org/2000/svg" : null;
  const e = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

export function clear(node) { while (node.firstChild) node.firstChild.remove(); return node; }

export function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

export function secs(s) {
  if (s === null || s === undefined) return "–";
  if (s < 1e-3) return `${(s * 1e6).toFixed(0)} µs`;
  if (s < 1) return `${(s * 1e3).toFixed(1)} ms`;
  if (s < 120) return `${s.toFixed(2)} s`;
  if (s < 7200) return `${(s / 60).toFixed(1)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

export function ago(t) {
  if (!t) return "–";
  return `${secs(Math.max(0, Date.now() / 1000 - t))} ago`;
}

export function when(t) { return t ? new Date(t * 1000).toLocaleTimeString() : "–"; }

export function num(x, digits = 1) {
  if (x === null || x === undefined) return "–";
  return Number(x).toFixed(digits);
}

/** A table: columns [{title, cell(row) -> node|string, cls}], rows. */
export function table(columns, rows, caption) {
  return el("div", { class: "scroll" }, el("table", {},
    caption ? el("caption", {}, caption) : null,
    el("thead", {}, el("tr", {}, columns.map((c) => el("th", { scope: "col", class: c.cls }, c.title)))),
    el("tbody", {}, rows.map((r) => el("tr", {}, columns.map((c) => el("td", { class: c.cls }, c.cell(r))))))));
}

export function progress(done, total, label) {
  const p = el("progress", { max: Math.max(total, 1), value: done, "aria-label": label || "progress" });
  return el("span", { class: "prog" }, p, ` ${done}/${total}`);
}

export function stateBadge(state) { return el("span", { class: `badge s-${state}` }, state); }

export function section(title, ...body) {
  return el("section", { class: "card" }, el("h2", {}, title), ...body);
}

export function errorBox(e) { return el("p", { class: "error", role: "alert" }, String(e.message || e)); }

/** Draws on a canvas sized to its box at the device's pixel ratio; returns the context. */
export function fitCanvas(canvas, height) {
  const ratio = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || canvas.parentElement.clientWidth || 300;
  canvas.width = Math.round(w * ratio);
  canvas.height = Math.round(height * ratio);
  canvas.style.height = `${height}px`;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  return { ctx, w, h: height };
}

export function cssVar(name) { return getComputedStyle(document.documentElement).getPropertyValue(name).trim(); }

export function download(name, text) {
  const a = el("a", { href: URL.createObjectURL(new Blob([text], { type: "application/json" })), download: name });
  document.body.append(a);
  a.click();
  setTimeout(() => { URL.revokeObjectURL(a.href); a.remove(); }, 0);
}
