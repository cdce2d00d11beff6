// Every op of proto/ops.json is here under its own name, with its inference; the
// generated files are current; the library imports nothing from Node (browser-safe).
import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import * as tp from "../src/index.js";
import { inferFor } from "../src/infer.js";
import { generate } from "../tools/gen-ops.mjs";
import { OPS_JSON, SDK } from "../testing/paths.mjs";

const table = JSON.parse(readFileSync(OPS_JSON, "utf8"));

/** The ops of the table the SDK lacks (a function under the op's name, or an inference). */
export function missingOps() {
  return Object.keys(table.ops).sort().flatMap((name) => {
    const why = [];
    if (typeof tp.ops[name] !== "function") why.push("no function tp.ops." + name);
    if (typeof tp[name] !== "function" && !["relu", "softmax"].includes(name)) why.push("not exported as tp." + name);
    if (!inferFor(name)) why.push("no inference");
    if (!tp.SPEC.ops[name]) why.push("not in the generated spec");
    return why.length ? [`${name}: ${why.join(", ")}`] : [];
  });
}

test("op table coverage: every op of proto/ops.json, reported", (t) => {
  const names = Object.keys(table.ops);
  const missing = missingOps();
  const vectors = new Set(readdirSync(join(SDK, "..", "..", "proto", "vectors", "shapes")).map((f) => f.replace(/\.json$/, "")));
  const withVectors = names.filter((n) => vectors.has(n)).length;
  const line = `op table coverage: ${names.length - missing.length}/${names.length} ops `
    + `(functions + inference), ${withVectors}/${names.length} with shape vectors run`
    + (missing.length ? `; missing: ${missing.join("; ")}` : "; missing: none");
  t.diagnostic(line);
  console.log(line);
  assert.deepEqual(missing, []);
});

test("a missing op is noticed (the coverage check can fail)", () => {
  const saved = tp.SPEC.ops.matmul;
  delete tp.SPEC.ops.matmul;
  try {
    assert.ok(missingOps().some((m) => m.startsWith("matmul:")));
  } finally {
    tp.SPEC.ops.matmul = saved;
  }
});

test("src/spec.gen.js and src/ops.gen.js are what tools/gen-ops.mjs writes from proto/ops.json", () => {
  for (const [rel, text] of Object.entries(generate(table))) {
    assert.equal(readFileSync(join(SDK, rel), "utf8"), text, `${rel} is stale: run node tools/gen-ops.mjs`);
  }
});

test("the library (all of src/ but node.js) imports nothing from Node: it runs in a browser", () => {
  for (const f of readdirSync(join(SDK, "src"))) {
    if (f === "node.js") continue;
    const src = readFileSync(join(SDK, "src", f), "utf8");
    assert.doesNotMatch(src, /from\s+["']node:|require\(|\bprocess\.|\bBuffer\b/, `src/${f} uses a Node-only API`);
  }
  const pkg = JSON.parse(readFileSync(join(SDK, "package.json"), "utf8"));
  assert.equal(pkg.dependencies, undefined, "no runtime dependencies");
  assert.equal(pkg.type, "module");
});
