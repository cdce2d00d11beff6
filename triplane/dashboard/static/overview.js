// Overview: nodes (engines, cards, memory, health), cluster throughput, running and recent jobs.
import * as api from "./api.js";
import { el, clear, table, bytes, num, ago, progress, stateBadge, section, errorBox, fitCanvas, cssVar, when }
  from "./util.js";

// Nodes seen in this tab: one that leaves the registry (or whose node.down arrives) stays, red.
const seen = new Map();
const down = new Set();
const rates = [];  // [t, tasks/s]

export function throttle(fn, ms) {
  let timer = null, again = false;
  return () => {
    if (timer) { again = true; return; }
    fn();
    timer = setTimeout(() => { timer = null; if (again) { again = false; fn(); } }, ms);
  };
}

export async function loadNodes() {
  const [nodes, engines] = await Promise.all([api.all("/v1/nodes"), api.all("/v1/engines")]);
  const live = new Set(nodes.map((n) => n.node));
  for (const n of nodes) { seen.set(n.node, n); down.delete(n.node); }
  for (const name of seen.keys()) if (!live.has(name)) down.add(name);
  return { nodes: [...seen.values()], engines };
}

export function markDown(node) { if (node) down.add(node); }
export function isDown(node) { return down.has(node); }

function nodesTable(nodes, engines) {
  const byNode = new Map();
  for (const e of engines) (byNode.get(e.node) || byNode.set(e.node, []).get(e.node)).push(e);
  const rows = nodes.slice().sort((a, b) => a.node.localeCompare(b.node));
  const t = table([
    { title: "node", cell: (n) => el("a", { href: `#/storage` }, n.node) },
    { title: "health", cell: (n) => stateBadge(down.has(n.node) ? "down" : n.drained ? "drained" : n.health) },
    { title: "lease", cls: "num", cell: (n) => (down.has(n.node) || !n.lease ? "–"
      : el("span", { class: "lease", title: `renewed ${num(n.lease.age_s, 1)} s ago; expires in ${num(n.lease.left_s, 1)} s unless renewed (TTL ${num(n.lease.ttl_s, 1)} s)` },
        `${num(n.lease.age_s, 1)} s ago`)) },
    { title: "op engines (measured)", cell: (n) => el("div", { class: "chips" }, (byNode.get(n.node) || []).map((e) =>
      el("span", { class: "chip", title: `${e.kind}, memory ${e.memory_engine || "–"}` },
        `${e.engine} ${num(e.gflops)} GFLOP/s ${num(e.gbps)} GB/s`))) },
    { title: "cards", cls: "hide-narrow", cell: (n) => [...new Set((byNode.get(n.node) || []).map((e) => e.device))].join(", ") || "–" },
    { title: "memory used / capacity", cell: (n) => `${bytes(n.memory.capacity - n.memory.free)} / ${bytes(n.memory.capacity)}` },
    { title: "running", cls: "num", cell: (n) => (down.has(n.node) ? "–" : n.running) },
    { title: "calibration", cls: "num hide-narrow", cell: (n) => `×${num(n.calibration.flops, 2)}` },
    { title: "started", cls: "hide-narrow", cell: (n) => ago(n.started_at) },
  ], rows, `${rows.length - down.size} up, ${down.size} down`);
  t.querySelectorAll("tbody tr").forEach((tr, i) => {
    tr.dataset.node = rows[i].node;
    if (down.has(rows[i].node)) tr.classList.add("down");
  });
  return t;
}

function jobsTable(jobs) {
  return table([
    { title: "job", cell: (j) => el("a", { href: `#/job/${encodeURIComponent(j.id)}` }, j.name || j.id) },
    { title: "state", cell: (j) => stateBadge(j.state) },
    { title: "progress", cell: (j) => progress(j.progress.done, j.progress.total, `progress of ${j.id}`) },
    { title: "owner", cls: "hide-narrow", cell: (j) => j.owner || "–" },
    { title: "created", cls: "hide-narrow", cell: (j) => when(j.created) },
  ], jobs);
}

function drawRates(canvas) {
  const { ctx, w, h } = fitCanvas(canvas, 60);
  ctx.clearRect(0, 0, w, h);
  if (rates.length < 2) return;
  const max = Math.max(1, ...rates.map((r) => r[1]));
  ctx.strokeStyle = cssVar("--accent");
  ctx.lineWidth = 2;
  ctx.beginPath();
  rates.forEach(([, v], i) => {
    const x = (i / (rates.length - 1)) * (w - 2) + 1;
    const y = h - 2 - (v / max) * (h - 6);
    if (i) ctx.lineTo(x, y); else ctx.moveTo(x, y);
  });
  ctx.stroke();
}

export function overview(main, ctx) {
  const nodesBox = el("div", {}, "loading…");
  const rateText = el("p", { class: "muted", id: "rate" }, "measuring…");
  const canvas = el("canvas", { class: "spark", role: "img", "aria-label": "cluster throughput, tasks per second" });
  const runningBox = el("div", {}, "loading…");
  const recentBox = el("div", {}, "loading…");
  const pager = el("div", { class: "pager" });
  main.append(el("h1", {}, "Overview"),
    section("Nodes", nodesBox),
    el("div", { class: "grid" },
      section("Cluster throughput", rateText, canvas),
      section("Running jobs", runningBox)),
    section("Recent jobs", recentBox, pager));
  let stopped = false;
  let cursor = null;
  const pages = [];

  const refreshNodes = throttle(async () => {
    try {
      const { nodes, engines } = await loadNodes();
      if (!stopped) clear(nodesBox).append(nodesTable(nodes, engines));
    } catch (e) { clear(nodesBox).append(errorBox(e)); }
  }, 1000);

  async function refreshJobs() {
    try {
      const [running, recent] = await Promise.all([
        api.get("/v1/jobs", { state: ["running", "queued"], limit: 50 }),
        api.get("/v1/jobs", { limit: 20, cursor })]);
      if (stopped) return;
      clear(runningBox).append(running.items.length ? jobsTable(running.items) : el("p", { class: "muted" }, "none"),
        running.next ? el("p", { class: "muted" }, "more than 50: the newest are shown") : "");
      clear(recentBox).append(jobsTable(recent.items));
      clear(pager).append(
        el("button", { disabled: !pages.length, onclick: () => { cursor = pages.pop() || null; refreshJobs(); } }, "newer"),
        el("button", { disabled: !recent.next, onclick: () => { pages.push(cursor); cursor = recent.next; refreshJobs(); } }, "older"));
    } catch (e) { clear(recentBox).append(errorBox(e)); }
  }
  const jobsSoon = throttle(refreshJobs, 500);

  let last = null;
  async function sample() {
    try {
      const s = await api.get("/v1/stats");
      const now = performance.now() / 1000;
      if (last) {
        rates.push([now, Math.max(0, (s.replies - last[1]) / (now - last[0]))]);
        if (rates.length > 90) rates.shift();
        rateText.textContent = `${num(rates[rates.length - 1][1], 0)} tasks/s now (replies from executors); peak ${num(Math.max(...rates.map((r) => r[1])), 0)} over the last ${rates.length * 2} s`;
        drawRates(canvas);
      }
      last = [now, s.replies];
    } catch (e) { rateText.textContent = String(e.message); }
  }
  refreshNodes();
  refreshJobs();
  sample();
  const timer = setInterval(sample, 2000);
  const nodeTimer = setInterval(refreshNodes, 5000);  // memory and running counts move without events

  return {
    onEvent(e) {
      if (e.kind.startsWith("node.")) {
        if (e.kind === "node.down") markDown(e.node);
        refreshNodes();
      } else if (e.kind.startsWith("job.")) {
        jobsSoon();
      }
    },
    stop() { stopped = true; clearInterval(timer); clearInterval(nodeTimer); },
  };
}
