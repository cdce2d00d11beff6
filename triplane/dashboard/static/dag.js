// A job's graph as a layered DAG (SVG): columns by depth, each column ordered by the mean
// position of its inputs (one barycentre sweep), fused nodes outlined with their steps.
// The server cuts it to `limit` nodes; beyond that the op counts summarise the rest.
import { el, clear } from "./util.js";

const W = 150, H = 38, GX = 40, GY = 10;

export function layout(nodes) {
  const depth = new Map();
  for (const n of nodes) depth.set(n.id, n.inputs.length ? 1 + Math.max(...n.inputs.map((i) => depth.get(i) ?? 0)) : 0);
  const cols = [];
  for (const n of nodes) (cols[depth.get(n.id)] ||= []).push(n);
  const pos = new Map();
  cols.forEach((col, c) => {
    if (c > 0) {
      const key = (n) => (n.inputs.length ? n.inputs.reduce((s, i) => s + (pos.get(i)?.row ?? 0), 0) / n.inputs.length : 0);
      col.sort((a, b) => key(a) - key(b));
    }
    col.forEach((n, r) => pos.set(n.id, { col: c, row: r }));
  });
  return { pos, cols: cols.length, rows: Math.max(1, ...cols.map((c) => c.length)) };
}

function type(n) { return `${n.dtype}[${n.shape.join(",")}]`; }

export function drawGraph(box, g) {
  clear(box);
  const { pos, cols, rows } = layout(g.nodes);
  const width = cols * (W + GX) + GX, height = rows * (H + GY) + GY;
  const svg = el("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "group",
    "aria-label": `graph of ${g.nodes.length} nodes` });
  const xy = (id) => { const p = pos.get(id); return [GX / 2 + p.col * (W + GX), GY + p.row * (H + GY)]; };
  const outs = new Set(g.outputs);
  for (const n of g.nodes) {
    const [x1, y1] = xy(n.id);
    for (const i of n.inputs) {
      const [x0, y0] = xy(i);
      const mx = (x0 + W + x1) / 2;
      svg.append(el("path", { class: "edge", d: `M${x0 + W},${y0 + H / 2} C${mx},${y0 + H / 2} ${mx},${y1 + H / 2} ${x1},${y1 + H / 2}` }));
    }
  }
  for (const n of g.nodes) {
    const [x, y] = xy(n.id);
    const cls = `node${n.steps ? " fused" : ""}${outs.has(n.id) ? " out" : ""}`;
    const label = n.steps ? `fused: ${n.steps.join("→")}` : n.op;
    svg.append(el("g", { class: cls, tabindex: 0, transform: `translate(${x},${y})`,
      "aria-label": `${n.id}: ${label} ${type(n)}` },
      el("title", {}, `${n.id}\n${label}\n${type(n)}${n.hidden_inputs ? `\n+${n.hidden_inputs} input(s) not shown` : ""}`),
      el("rect", { width: W, height: H, rx: 5 }),
      el("text", { x: 6, y: 15 }, trim(`${n.id} · ${label}`, 24)),
      el("text", { x: 6, y: 30 }, trim(type(n), 24))));
  }
  box.append(svg);
}

function trim(s, n) { return s.length > n ? `${s.slice(0, n - 1)}…` : s; }
