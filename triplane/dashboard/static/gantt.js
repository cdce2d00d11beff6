// The task timeline of a job: one lane per node. Drawn from the server's aggregates per node
// and time bucket (GET /v1/jobs/{id}/timeline) and, once a window holds few enough tasks,
// task by task (actual bars, predicted outlines; retried attempts and failures coloured).
// Zoom: the buttons, the wheel, a drag, or the keys + - ← → 0 while it has focus.
import * as api from "./api.js";
import { el, fitCanvas, cssVar, secs, download } from "./util.js";

const LANE = 26, AXIS = 20, LABEL = 90, TASKS = 2000;

export class Gantt {
  constructor(box, job) {
    this.job = job;
    this.view = null;  // [start, end] unix seconds; null: the whole job
    this.data = null;
    this.busy = false;
    this.again = false;
    this.canvas = el("canvas", { tabindex: 0, role: "img", "aria-label": "task timeline per node; + and - zoom, arrows pan, 0 resets" });
    this.info = el("span", { class: "muted" });
    const btn = (label, fn, title) => el("button", { onclick: fn, title }, label);
    box.append(el("div", { class: "toolbar" },
      btn("+", () => this.zoom(0.5), "zoom in"), btn("−", () => this.zoom(2), "zoom out"),
      btn("←", () => this.pan(-0.25), "earlier"), btn("→", () => this.pan(0.25), "later"),
      btn("whole job", () => this.set(null)), btn("export Chrome trace", () => this.exportTrace()), this.info),
      el("div", { class: "gantt" }, this.canvas),
      el("div", { class: "legend" },
        el("span", {}, el("span", { class: "swatch sw-actual" }), "actual"),
        el("span", {}, el("span", { class: "swatch sw-pred" }), "predicted"),
        el("span", {}, el("span", { class: "swatch sw-retry" }), "retried attempt"),
        el("span", {}, el("span", { class: "swatch sw-fail" }), "failed")));
    this.canvas.addEventListener("keydown", (e) => {
      const k = { "+": () => this.zoom(0.5), "=": () => this.zoom(0.5), "-": () => this.zoom(2),
        ArrowLeft: () => this.pan(-0.25), ArrowRight: () => this.pan(0.25), 0: () => this.set(null) }[e.key];
      if (k) { e.preventDefault(); k(); }
    });
    this.canvas.addEventListener("wheel", (e) => {
      e.preventDefault();
      this.zoom(e.deltaY < 0 ? 0.7 : 1.4, this.fraction(e.offsetX));
    }, { passive: false });
    let down = null;
    this.canvas.addEventListener("pointerdown", (e) => { down = e.offsetX; });
    this.canvas.addEventListener("pointerup", (e) => {
      if (down !== null && Math.abs(e.offsetX - down) > 8 && this.data) {
        const a = this.at(Math.min(down, e.offsetX)), b = this.at(Math.max(down, e.offsetX));
        this.set([a, b]);
      }
      down = null;
    });
    this.resize = () => this.draw();
    window.addEventListener("resize", this.resize);
  }

  stop() { window.removeEventListener("resize", this.resize); clearTimeout(this.timer); }

  fraction(x) { return Math.min(1, Math.max(0, (x - LABEL) / Math.max(1, this.width - LABEL))); }
  at(x) { const d = this.data; return d.start + this.fraction(x) * (d.end - d.start); }

  zoom(f, centre = 0.5) {
    const d = this.data;
    if (!d || d.start === null) return;
    const span = (d.end - d.start) * f, mid = d.start + (d.end - d.start) * centre;
    if (f > 1 && d.first !== null && span >= (d.last - d.first)) { this.set(null); return; }
    this.set([mid - span * centre, mid + span * (1 - centre)]);
  }

  pan(f) {
    const d = this.data;
    if (!d || d.start === null) return;
    const dt = (d.end - d.start) * f;
    this.set([d.start + dt, d.end + dt]);
  }

  set(view) { this.view = view; this.refresh(); }

  /** A refresh for a live update: at most every 3 s, and no more than a 25th of the time
   *  (a slow answer means a busy scheduler: ask it less often). */
  soon() {
    if (this.timer) return;
    const gap = Math.max(3000, 25 * (this.lastMs || 0));
    const wait = Math.max(0, (this.lastAt || 0) + gap - performance.now());
    this.timer = setTimeout(() => { this.timer = null; this.refresh(); }, wait);
  }

  /** Fetch the window's aggregates (one request at a time; a refresh asked meanwhile runs after). */
  async refresh() {
    if (this.busy) { this.again = true; return; }
    this.busy = true;
    try {
      const buckets = Math.max(20, Math.min(400, Math.floor((this.canvas.clientWidth || 600) - LABEL) / 3));
      const params = { buckets: Math.floor(buckets), tasks: TASKS };
      if (this.view) { params.start = Math.max(0, this.view[0]); params.end = this.view[1]; }
      const t0 = performance.now();
      this.data = await api.get(`/v1/jobs/${encodeURIComponent(this.job)}/timeline`, params);
      const t1 = performance.now();
      this.draw();
      const t2 = performance.now();
      this.lastMs = t2 - t0;
      this.lastAt = t2;
      (window.__tp.timeline ||= []).push(t2 - t0);
      (window.__tp.draws ||= []).push(t2 - t1);
    } catch (e) {
      this.info.textContent = String(e.message);
    } finally {
      this.busy = false;
      if (this.again) { this.again = false; this.refresh(); }
    }
  }

  draw() {
    const d = this.data;
    if (!d) return;
    const lanes = d.nodes.map((n) => n.node);
    for (const t of d.tasks || []) if (t.node && !lanes.includes(t.node)) lanes.push(t.node);
    const { ctx, w, h } = fitCanvas(this.canvas, AXIS + Math.max(1, lanes.length) * LANE + 4);
    this.width = w;
    ctx.clearRect(0, 0, w, h);
    if (d.start === null) { this.info.textContent = "no task has run yet"; return; }
    const span = d.end - d.start, plot = w - LABEL;
    const x = (t) => LABEL + ((t - d.start) / span) * plot;
    const fg = cssVar("--fg"), muted = cssVar("--muted"), lane = cssVar("--lane");
    const colours = { actual: cssVar("--accent"), pred: cssVar("--pred"), retry: cssVar("--warn"), fail: cssVar("--bad") };
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = muted;
    const ticks = plot < 400 ? 2 : 4;
    for (let i = 0; i <= ticks; i++) {
      const t = (span * i) / ticks;
      ctx.fillText(`+${secs(d.start - (d.first ?? d.start) + t)}`, LABEL + (plot * i) / ticks - (i === ticks ? 50 : 0), 12);
    }
    lanes.forEach((name, i) => {
      const y = AXIS + i * LANE;
      ctx.fillStyle = lane;
      ctx.fillRect(LABEL, y, plot, LANE - 4);
      ctx.fillStyle = fg;
      ctx.fillText(name.length > 13 ? `${name.slice(0, 12)}…` : name, 2, y + 15);
    });
    if (d.tasks) {
      for (const t of d.tasks) {
        const y = AXIS + lanes.indexOf(t.node) * LANE;
        const x0 = x(t.start), x1 = Math.max(x0 + 1, x(t.end ?? t.start));
        ctx.fillStyle = t.state === "failed" ? colours.fail : t.attempt > 1 ? colours.retry : colours.actual;
        ctx.fillRect(x0, y + 2, x1 - x0, LANE - 14);
        if (t.predicted_s) {
          ctx.fillStyle = colours.pred;
          ctx.fillRect(x0, y + LANE - 11, Math.max(1, (t.predicted_s / span) * plot), 4);
        }
      }
      this.info.textContent = `${d.tasks.length} task(s) in this window of ${secs(span)}`;
    } else {
      const bw = plot / d.buckets;
      d.nodes.forEach((n) => {
        const y = AXIS + lanes.indexOf(n.node) * LANE;
        for (let b = 0; b < d.buckets; b++) {
          if (!n.tasks[b]) continue;
          const util = Math.min(1, n.busy_s[b] / d.bucket_s / 4), pred = Math.min(1, n.predicted_s[b] / d.bucket_s / 4);
          ctx.fillStyle = n.failed[b] ? colours.fail : n.retried[b] ? colours.retry : colours.actual;
          ctx.globalAlpha = 0.25 + 0.75 * util;
          ctx.fillRect(LABEL + b * bw, y + 2, Math.max(1, bw - 0.5), LANE - 14);
          ctx.globalAlpha = 0.25 + 0.75 * pred;
          ctx.fillStyle = colours.pred;
          ctx.fillRect(LABEL + b * bw, y + LANE - 11, Math.max(1, bw - 0.5), 4);
        }
      });
      ctx.globalAlpha = 1;
      this.info.textContent = `${d.rows} task(s) ran; ${secs(span)} in ${d.buckets} buckets of ${secs(d.bucket_s)} (zoom in for single tasks)`;
    }
  }

  /** The window as a Chrome trace (chrome://tracing, Perfetto): tasks as complete events
   *  when the window is small enough, else the buckets as counters per node. */
  async exportTrace() {
    const params = { buckets: 400, tasks: 5000 };
    if (this.view) { params.start = Math.max(0, this.view[0]); params.end = this.view[1]; }
    const d = await api.get(`/v1/jobs/${encodeURIComponent(this.job)}/timeline`, params);
    const trace = traceOf(d);
    download(`${this.job}-timeline.json`, JSON.stringify(trace));
    return trace;
  }
}

export function traceOf(d) {
  const events = [];
  const t0 = d.first ?? d.start ?? 0;
  const pids = new Map();
  const pid = (node) => {
    if (!pids.has(node)) {
      pids.set(node, pids.size + 1);
      events.push({ name: "process_name", ph: "M", pid: pids.get(node), tid: 0, args: { name: node } });
    }
    return pids.get(node);
  };
  if (d.tasks) {
    for (const t of d.tasks) {
      if (t.start === null) continue;
      events.push({ name: t.op, cat: t.state, ph: "X", pid: pid(t.node || "?"), tid: t.attempt,
        ts: (t.start - t0) * 1e6, dur: Math.max(0, ((t.end ?? t.start) - t.start) * 1e6),
        args: { task: t.id, attempt: t.attempt, predicted_s: t.predicted_s, error: t.error } });
    }
  } else if (d.start !== null) {
    for (const n of d.nodes) {
      for (let b = 0; b < d.buckets; b++) {
        events.push({ name: "tasks", ph: "C", pid: pid(n.node), ts: (d.start - t0 + b * d.bucket_s) * 1e6,
          args: { started: n.tasks[b], busy_s: n.busy_s[b], predicted_s: n.predicted_s[b], failed: n.failed[b] } });
      }
    }
  }
  return { traceEvents: events, displayTimeUnit: "ms", otherData: { job: d.job } };
}
