// Network (measured bandwidth and latency between nodes), Storage (memory engines and the tiles
// they hold), Ops (which engine supports which op and dtype).
import * as api from "./api.js";
import { el, clear, table, bytes, num, ago, section, errorBox, stateBadge } from "./util.js";
import { loadNodes, isDown } from "./overview.js";

function page(main, title, load) {
  const box = el("div", {}, "loading…");
  main.append(el("h1", {}, title), box);
  let stopped = false;
  const run = async () => {
    try {
      const body = await load();
      if (!stopped) clear(box).append(...body);
    } catch (e) { clear(box).append(errorBox(e)); }
  };
  run();
  return { onEvent(e) { if (e.kind.startsWith("node.")) run(); }, stop() { stopped = true; } };
}

export function network(main) {
  return page(main, "Network", async () => {
    const { nodes } = await loadNodes();
    const names = nodes.map((n) => n.node).sort();
    const link = new Map();
    for (const n of nodes) for (const l of n.links || []) link.set(`${n.node}\u0000${l.peer}`, l);
    const matrix = (what, cell) => section(what, el("div", { class: "scroll" }, el("table", { class: "matrix" },
      el("caption", {}, "row: the node that measured; column: its peer (links/<from>/<to>)"),
      el("thead", {}, el("tr", {}, el("th", { scope: "col" }, "from \\ to"), names.map((p) => el("th", { scope: "col" }, p)))),
      el("tbody", {}, names.map((a) => el("tr", {}, el("th", { scope: "row" }, a, isDown(a) ? " (down)" : ""),
        names.map((b) => el("td", {}, a === b ? "·" : cell(link.get(`${a}\u0000${b}`))))))))));
    const measured = [...link.values()];
    return [
      matrix("Bandwidth (GB/s)", (l) => (l ? num(l.bandwidth_gbps, 2) : "–")),
      matrix("Latency (µs, best round trip)", (l) => (l ? num(l.latency_us, 0) : "–")),
      el("p", { class: "muted" }, measured.length
        ? `${measured.length} measured pair(s); newest ${ago(Math.max(...measured.map((l) => l.measured_at)))}, engines ${[...new Set(measured.map((l) => l.engine))].join(", ")}`
        : "no pair measured yet (executors measure their peers after they start)"),
    ];
  });
}

export function storage(main) {
  return page(main, "Storage", async () => {
    const s = await api.get("/v1/storage");
    // a tile row that names no memory engine is its node's, when the node has one engine
    const engines = new Map();
    for (const e of s.engines) engines.set(e.node, [...(engines.get(e.node) || []), e.engine]);
    const held = new Map();
    for (const t of s.tiles) {
      const only = engines.get(t.node)?.length === 1 ? engines.get(t.node)[0] : null;
      const k = `${t.node}\u0000${t.memory_engine || only}`;
      const h = held.get(k) || held.set(k, { tiles: 0, bytes: 0, lost: 0 }).get(k);
      if (t.state === "present") { h.tiles += t.tiles; h.bytes += t.bytes; }
      if (t.state === "lost") h.lost += t.tiles;
    }
    return [
      section("Memory engines", table([
        { title: "node", cell: (e) => [e.node, isDown(e.node) ? " " : "", isDown(e.node) ? stateBadge("down") : ""] },
        { title: "engine", cell: (e) => e.engine },
        { title: "kind", cell: (e) => e.kind },
        { title: "used / capacity", cls: "num", cell: (e) => `${bytes(e.capacity - e.free)} / ${bytes(e.capacity)}` },
        { title: "result tiles", cls: "num", cell: (e) => (held.get(`${e.node}\u0000${e.engine}`) || { tiles: 0 }).tiles },
        { title: "their bytes", cls: "num", cell: (e) => bytes((held.get(`${e.node}\u0000${e.engine}`) || { bytes: 0 }).bytes) },
        { title: "spilled", cls: "num", cell: (e) => (e.spill
          ? el("span", { "data-spilled": e.spill.bytes, title: `${e.spill.tiles} tile(s) moved to disk; ${bytes(e.spill.on_disk)} there now` },
            `${bytes(e.spill.bytes)} (${e.spill.tiles})`) : "–") },
        { title: "read back", cls: "num hide-narrow", cell: (e) => (e.spill ? `${bytes(e.spill.read_bytes)} (${e.spill.reads})` : "–") },
        { title: "persisted", cls: "num", cell: (e) => el("span", { "data-persisted": e.persisted.bytes,
          title: `${e.persisted.tiles} tile(s) written to a persistence target` }, `${bytes(e.persisted.bytes)} (${e.persisted.tiles})`) },
      ], s.engines)),
      section("Tiles by state (every job the metadb keeps)", table([
        { title: "node", cell: (t) => t.node || "–" },
        { title: "memory engine", cell: (t) => t.memory_engine || "–" },
        { title: "state", cell: (t) => stateBadge(t.state) },
        { title: "tiles", cls: "num", cell: (t) => t.tiles },
        { title: "bytes", cls: "num", cell: (t) => bytes(t.bytes) },
      ], s.tiles)),
    ];
  });
}

export function ops(main) {
  return page(main, "Ops", async () => {
    const engines = await api.all("/v1/engines");
    const kinds = new Map();  // engine name -> {ops, dtypes, nodes}
    for (const e of engines) {
      const k = kinds.get(e.engine) || kinds.set(e.engine, { ops: new Set(), dtypes: new Set(), nodes: [] }).get(e.engine);
      e.ops.forEach((o) => k.ops.add(o));
      e.dtypes.forEach((d) => k.dtypes.add(d));
      k.nodes.push(e.node);
    }
    const names = [...kinds.keys()].sort();
    const allOps = [...new Set(engines.flatMap((e) => e.ops))].sort();
    return [
      section("Engines", table([
        { title: "engine", cell: (n) => n },
        { title: "nodes", cell: (n) => kinds.get(n).nodes.join(", ") },
        { title: "dtypes", cell: (n) => [...kinds.get(n).dtypes].sort().join(", ") },
        { title: "ops", cls: "num", cell: (n) => kinds.get(n).ops.size },
      ], names)),
      section(`Ops × engines (${allOps.length} ops)`, table([
        { title: "op", cell: (o) => o },
        ...names.map((n) => ({ title: n, cell: (o) => (kinds.get(n).ops.has(o) ? "✓" : "–") })),
      ], allOps)),
    ];
  });
}
