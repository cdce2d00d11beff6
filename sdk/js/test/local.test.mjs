// Graph building without a cluster: a wrong shape throws at the call that made it,
// naming both shapes, the op, and the caller's file and line; attributes are checked.
import assert from "node:assert/strict";
import { test } from "node:test";

import * as tp from "../src/index.js";

const x = tp.input({ tensor: "u-x", shape: [16, 5], dtype: "float32" });
const w = tp.input({ tensor: "u-w", shape: [6, 3], dtype: "float32" });

test("a bad shape throws at the call, naming both shapes and the caller's line", () => {
  const line = Number(new Error().stack.split("\n")[1].match(/:(\d+):\d+\)?$/)[1]) + 3;
  let err;
  try {
    tp.matmul(x, w);
  } catch (e) {
    err = e;
  }
  assert.ok(err instanceof tp.GraphError, String(err));
  assert.ok(err instanceof tp.TriplaneError);
  assert.equal(err.kind, "shape");
  assert.equal(err.op, "matmul");
  assert.equal(err.loc, `local.test.mjs:${line}`);
  assert.match(err.message, /inner dimensions differ: \(16, 5\) @ \(6, 3\) \(5 != 6\)/);
  assert.match(err.message, /inputs float32\[16, 5\], float32\[6, 3\]/);
  assert.match(err.message, new RegExp(`\\(at local\\.test\\.mjs:${line}\\)$`));
});

test("a node records where it was made (its loc goes on the wire)", () => {
  const y = tp.matmul(x, tp.input({ tensor: "u-v", shape: [5, 2], dtype: "float32" }));
  assert.match(y.loc, /^local\.test\.mjs:\d+$/);
  const { doc } = tp.buildGraph([y], { loc: true });
  assert.equal(Object.values(doc.nodes).at(-1).loc, y.loc);
  assert.ok(!tp.canonicalText(tp.buildGraph([y]).doc).includes("loc"), "loc is no part of the canonical graph");
  assert.deepEqual([y.shape, y.dtype], [[16, 2], "float32"]);
});

test("dtype, attribute and arity errors have their kinds", () => {
  const i = tp.input({ tensor: "u-i", shape: [16], dtype: "int64" });
  assert.throws(() => tp.add(x, tp.full({ value: 1, shape: [], dtype: "float64" })), { kind: "dtype" });
  assert.throws(() => tp.exp(i), { kind: "dtype" });
  assert.throws(() => tp.sum(x, { axes: [0], keepdim: true }), { kind: "attr", message: /unknown attribute/ });
  assert.throws(() => tp.reshape(x, { shape: [7] }), { kind: "shape", message: /cannot reshape \(16, 5\)/ });
  assert.throws(() => tp.concat([]), { kind: "graph" });
  assert.throws(() => tp.cross_entropy(x, tp.input({ tensor: "u-l", shape: [15], dtype: "int64" })), { kind: "shape" });
  assert.throws(() => tp.matmul(x, 3), { kind: "graph", message: /inputs must be Tensors/ });
});

test("Tensor methods lift numbers to 0-d constants of the tensor's dtype", () => {
  const y = x.mul(2).add(1).relu().mean({ axes: 1 });
  assert.deepEqual([y.shape, y.dtype], [[16], "float32"]);
  const g = tp.graphJson([y]);
  assert.ok(new TextDecoder().decode(g).includes('"value":2'));
  assert.equal(tp.var(x, { axes: [0] }).shape[0], 5, "var is exported under its own name");
});

test("the training pieces build the expected types", () => {
  const layer = new tp.Linear(tp.input({ tensor: "w", shape: [5, 4], dtype: "float32" }),
    tp.input({ tensor: "b", shape: [4], dtype: "float32" }));
  const logits = layer.forward(x);
  const labels = tp.input({ tensor: "y", shape: [16], dtype: "int64" });
  const loss = tp.crossEntropy(logits, labels);
  assert.deepEqual([logits.shape, loss.shape], [[16, 4], []]);
  assert.deepEqual(tp.softmax(logits).shape, [16, 4]);
  const [pw, pb] = layer.parameters();
  const upd = new tp.Adam({ lr: 0.01 }).update([pw, pb], [pw, pb]);
  assert.deepEqual(upd.params.map((p) => p.shape), [[5, 4], [4]]);
  assert.equal(upd.outputs.length, 6);
  assert.deepEqual(tp.sgdStep(pw, pw, 0.1).shape, [5, 4]);
});
