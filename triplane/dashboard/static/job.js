// A job: state and progress (live), cancel and retry (by role), the task timeline, the graph,
// the plan (tiles per tensor and the nodes holding them), and its tasks page by page with
// predicted beside actual times, attempts, drifts and errors.
import * as api from "./api.js";
import { el, clear, table, secs, num, when, progress, stateBadge, section, errorBox, bytes } from "./util.js";
import { Gantt } from "./gantt.js";
import { drawGraph } from "./dag.js";
import { throttle } from "./overview.js";

const PLAN_TASKS = 2000;  // past this many tasks the plan document is not fetched (too big to draw)
const ENDED = ["done", "failed", "cancelled"];

function errorDetail(e) {
  if (!e) return null;
  const where = [e.node && `node ${e.node}`, e.op && `op ${e.op}`].filter(Boolean).join(", ");
  return el("div", { class: "error", role: "alert" }, `${e.kind}: ${e.message}`, where ? `\n(${where})` : "",
    e.loc ? el("div", { class: "loc" }, "at ", el("code", {}, e.loc)) : "");
}

function tasksTable(items) {
  return table([
    { title: "task", cell: (t) => t.id },
    { title: "op", cell: (t) => t.op },
    { title: "state", cell: (t) => stateBadge(t.state) },
    { title: "attempt", cls: "num", cell: (t) => t.attempt },
    { title: "node", cell: (t) => t.node || "–" },
    { title: "predicted", cls: "num hide-narrow", cell: (t) => secs(t.predicted_s) },
    { title: "actual", cls: "num", cell: (t) => secs(t.actual_s) },
    { title: "ratio", cls: "num hide-narrow", cell: (t) => (t.predicted_s && t.actual_s ? `×${num(t.actual_s / t.predicted_s, 2)}` : "–") },
    { title: "drifts", cell: (t) => (t.drifts.length ? t.drifts.map((d) => `#${d.attempt} ${d.from || "?"}→${d.to || "?"} (${d.reason})`).join("; ") : "–") },
    { title: "error", cell: (t) => (t.error ? el("span", { class: "error" }, `${t.error.kind}: ${t.error.message}`,
      t.error.loc ? el("span", { class: "loc" }, " at ", el("code", {}, t.error.loc)) : "") : "") },
  ], items);
}

function planView(plan) {
  const rows = (plan.tensors || []).map((t) => {
    const per = new Map();
    for (const tile of t.tiles) per.set(tile.node, (per.get(tile.node) || 0) + 1);
    return { t, per };
  });
  return [
    el("p", { class: "muted" }, `makespan predicted ${secs(plan.makespan?.predicted_s)}, actual ${secs(plan.makespan?.actual_s)}`,
      plan.makespan?.ratio ? ` (×${num(plan.makespan.ratio, 2)})` : ""),
    table([
      { title: "tensor", cell: (r) => r.t.tensor },
      { title: "type", cell: (r) => r.t.type },
      { title: "grid", cell: (r) => (r.t.grid ? r.t.grid.join("×") : "–") },
      { title: "tiles", cls: "num", cell: (r) => r.t.tiles.length },
      { title: "held by", cell: (r) => [...r.per].map(([n, c]) => `${n} (${c})`).join(", ") },
    ], rows.slice(0, 200), rows.length > 200 ? `the first 200 of ${rows.length} tensors` : null),
    table([
      { title: "node", cell: (n) => n.node },
      { title: "tasks", cls: "num", cell: (n) => n.tasks },
      { title: "busy (predicted)", cls: "num", cell: (n) => secs(n.busy_s) },
      { title: "peak memory", cls: "num", cell: (n) => bytes(n.peak_memory_bytes) },
    ], plan.nodes || [], "per node"),
  ];
}

export function jobPage(main, id, ctx) {
  const mayChange = ctx.role === "admin" || ctx.role === "submit";
  const head = el("div", {}, "loading…");
  const actions = el("div", { class: "toolbar" });
  const timelineBox = el("div", {});
  const graphBox = el("div", {}, "loading…");
  const planBox = el("div", {}, "loading…");
  const tasksBox = el("div", {}, "loading…");
  const pager = el("div", { class: "pager" });
  const driftBox = el("div", { id: "drifts" }, "loading…");
  main.append(el("h1", {}, "Job ", el("span", { id: "job-id" }, id)), head, actions,
    section("Timeline", timelineBox), section("Graph", graphBox),
    section("Plan", planBox), section("Drifts, failures and recomputes", driftBox), section("Tasks", tasksBox, pager));
  const gantt = new Gantt(timelineBox, id);
  let status = null;
  let stopped = false;
  let cursor = null;
  const back = [];
  const path = `/v1/jobs/${encodeURIComponent(id)}`;

  function renderHead() {
    const j = status;
    clear(head).append(el("dl", { class: "kv" },
      el("dt", {}, "state"), el("dd", { id: "job-state" }, stateBadge(j.state)),
      el("dt", {}, "progress"), el("dd", { id: "job-progress" }, progress(j.progress.done, j.progress.total)),
      el("dt", {}, "name"), el("dd", {}, j.name || "–"),
      el("dt", {}, "owner"), el("dd", {}, j.owner || "–"),
      el("dt", {}, "created"), el("dd", {}, when(j.created)),
      el("dt", {}, "tags"), el("dd", {}, (j.tags || []).join(", ") || "–")));
    if (j.error) head.append(errorDetail(j.error));
    clear(actions);
    if (!mayChange) return;  // a read token sees no button (and the API refuses it anyway)
    if (!ENDED.includes(j.state)) {
      actions.append(el("button", { class: "danger", id: "cancel", onclick: async (ev) => {
        ev.target.disabled = true;
        try { status = { ...status, ...(await api.post(`${path}/cancel`)) }; renderHead(); } catch (e) { actions.append(errorBox(e)); }
      } }, "Cancel job"));
    }
    if (j.state === "failed" || j.state === "cancelled") {
      actions.append(el("button", { id: "retry", onclick: async (ev) => {
        ev.target.disabled = true;
        try { const r = await api.post(`${path}/retry`); location.hash = `#/job/${encodeURIComponent(r.id)}`; } catch (e) { actions.append(errorBox(e)); }
      } }, "Retry as a new job"));
    }
  }

  async function loadStatus() {
    try { status = await api.get(path); if (!stopped) renderHead(); } catch (e) { clear(head).append(errorBox(e)); }
  }

  async function loadTasks() {
    try {
      const page = await api.get(`${path}/tasks`, { limit: 50, cursor });
      if (stopped) return;
      clear(tasksBox).append(tasksTable(page.items));
      clear(pager).append(
        el("button", { disabled: !back.length, onclick: () => { cursor = back.pop() || null; loadTasks(); } }, "previous"),
        el("button", { disabled: !page.next, onclick: () => { back.push(cursor); cursor = page.next; loadTasks(); } }, "next"),
        el("span", { class: "muted" }, `50 a page, by task id`));
    } catch (e) { clear(tasksBox).append(errorBox(e)); }
  }

  async function loadDrifts() {
    try {
      const page = await api.get("/v1/events", { job: id, kind: ["task.drifted", "task.failed", "task.recomputed"], limit: 200 });
      if (stopped) return;
      clear(driftBox).append(page.items.length ? table([
        { title: "when", cell: (e) => when(e.at) },
        { title: "event", cell: (e) => e.kind.slice(5) },
        { title: "task", cell: (e) => e.task },
        { title: "attempt", cls: "num", cell: (e) => e.data.attempt },
        { title: "left node", cell: (e) => (e.node ? el("span", { class: "s-down" }, e.node) : "–") },
        { title: "reason", cell: (e) => e.data.reason || "" },
      ], page.items, page.next ? "the first 200" : null) : el("p", { class: "muted" }, "none: every task ran where it was placed"));
    } catch (e) { clear(driftBox).append(errorBox(e)); }
  }

  async function loadGraph() {
    try {
      const g = await api.get(`${path}/graph`, { limit: 300 });
      const box = el("div", { class: "dag" });
      clear(graphBox).append(
        el("p", { class: "muted" }, `${g.total} node(s) (${g.source})`, g.truncated ? `; the first ${g.nodes.length} are drawn` : ""),
        el("div", { class: "chips" }, Object.entries(g.ops).map(([op, n]) => el("span", { class: "chip" }, `${op} ×${n}`))), box);
      drawGraph(box, g);
    } catch (e) { clear(graphBox).append(errorBox(e)); }
  }

  async function loadPlan() {
    try {
      if (status && status.progress.total > PLAN_TASKS) {
        const tiles = await api.get(`${path}/tiles`, { limit: 50 });
        clear(planBox).append(el("p", { class: "muted" }, `${status.progress.total} tasks: the plan is summarised by the timeline; where the fetched results live:`),
          table([{ title: "tensor", cell: (t) => t.tensor }, { title: "index", cell: (t) => t.index.join(",") },
            { title: "node", cell: (t) => t.node || "–" }, { title: "bytes", cls: "num", cell: (t) => bytes(t.nbytes) }], tiles.items));
        return;
      }
      const plan = await api.get(`${path}/plan`);
      clear(planBox).append(...planView(plan));
    } catch (e) {
      clear(planBox).append(el("p", { class: "muted" }, e.status === 409 ? "no plan yet" : String(e.message)));
    }
  }

  const ganttSoon = () => gantt.soon();
  const tasksSoon = throttle(() => { loadTasks(); loadDrifts(); }, 2000);
  const statusSoon = throttle(loadStatus, 1000);
  loadStatus().then(() => { loadPlan(); });
  loadGraph();
  loadTasks();
  loadDrifts();
  gantt.refresh();

  return {
    onEvent(e) {
      if (e.job !== id) {
        if (e.kind === "node.down") tasksSoon();
        return;
      }
      if (e.kind === "job.progress" && status) {  // drawn at once from the event
        status.progress = { done: e.data.done, total: e.data.total };
        const p = document.getElementById("job-progress");
        if (p) clear(p).append(progress(e.data.done, e.data.total));
        ganttSoon();
        return;
      }
      if (e.kind.startsWith("task.")) { tasksSoon(); ganttSoon(); return; }
      const state = e.kind.slice(4);  // job.running, job.done, ...: drawn at once, details fetched after
      const badge = document.getElementById("job-state");
      if (status && badge && ["running", ...ENDED].includes(state)) {
        status.state = state;
        clear(badge).append(stateBadge(state));
        if (ENDED.includes(state)) document.getElementById("cancel")?.remove();
      }
      statusSoon();
      if (ENDED.includes(state)) { ganttSoon(); tasksSoon(); loadPlan(); }
    },
    stop() { stopped = true; gantt.stop(); },
  };
}
