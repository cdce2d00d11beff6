// The library runs unchanged where only a browser's globals exist: testing/browserlike.mjs
// loads src/ into a fresh V8 context without process, Buffer, require or node: modules,
// builds the golden mlp graph (same hash), and meets a shape error located at the page's line.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { test } from "node:test";

import { SDK } from "../testing/paths.mjs";

test("the library runs in a browser-like context (no Node globals or modules)", () => {
  const r = spawnSync(process.execPath, ["--no-warnings", "--experimental-vm-modules", join(SDK, "testing", "browserlike.mjs")],
    { encoding: "utf8", timeout: 60_000 });
  assert.equal(r.status, 0, r.stdout + r.stderr);
  assert.match(r.stdout, /browser-like context: ok; shape matmul: inner dimensions differ: \(4, 3\) @ \(4, 3\)/);
  assert.match(r.stdout, /\(at page\.mjs:\d+\)/, "the loc comes from the page's https: stack frame");
});
