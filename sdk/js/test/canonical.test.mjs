// The golden graphs of proto/vectors/graphs, built with this SDK, serialise to the same
// bytes and hash as the Python SDK's (tests/unit/proto/test_canonical_json.py builds them
// there); and the number vectors print as proto/vectors/numbers.json says.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import * as tp from "../src/index.js";
import { VECTORS } from "../testing/paths.mjs";

const input = (tensor, shape, dtype) => tp.input({ tensor, shape, dtype });

const GOLDEN = {
  mlp() {
    const x = input("t-9f2c", [4, 3], "float32");
    const w = input("t-w", [3, 2], "float32");
    const bias = tp.full({ value: 0.1, shape: [2], dtype: "float32" });
    const y = tp.add(tp.matmul(x, w), bias);
    return { outputs: [tp.sum(tp.exp(y), { axes: [-1], keepdims: false })], prefix: "n" };
  },
  numbers() {
    let s = input("t", [2, 2], "float64");
    for (const v of [1e21, 1e-7, 1e-6, 0.30000000000000004, 5e-324, -1.7976931348623157e308, 2 ** 53, -3]) {
      s = tp.mul(s, tp.full({ value: v, shape: [], dtype: "float64" }));
    }
    return { outputs: [s], prefix: "c" };
  },
  unicode() {
    const f = (id, tensor) => input(tensor, [3], "float16").named(id);
    const smile = f("\u{1f600}", "données/é\u00e9\"\\\n\t\u0001\u007f");
    const pua = f("\ue000", "τ-\u2028");
    const a = f("a", "");
    const z = tp.sub(tp.add(smile, pua).named("Z"), a).named("z");
    return { outputs: [z], prefix: "_b" };
  },
  shapes() {
    const x = input("x", [2, 3, 4], "int32");
    const t = tp.transpose(x, { perm: [2, 0, 1] });
    const r = tp.reshape(t, { shape: [4, 6] });
    const c = tp.cast(tp.broadcast_to(r, { shape: [5, 4, 6] }), { dtype: "bfloat16" });
    const e = tp.full({ value: true, shape: [0], dtype: "bool" });
    return { outputs: [c, e], prefix: "s" };
  },
};

for (const [name, make] of Object.entries(GOLDEN)) {
  test(`golden graph ${name}: byte-identical canonical JSON and hash`, async () => {
    const want = readFileSync(join(VECTORS, "graphs", `${name}.json`));
    const wantHash = readFileSync(join(VECTORS, "graphs", `${name}.sha256`), "utf8").split(/\s/)[0];
    const { outputs, prefix } = make();
    const got = tp.graphJson(outputs, { prefix });
    assert.equal(Buffer.from(got).toString("utf8"), want.toString("utf8"));
    assert.ok(Buffer.from(got).equals(want), `${name}: bytes differ`);
    assert.equal(await tp.graphHash(outputs, { prefix }), wantHash);
    // the file parses and re-serialises unchanged
    assert.ok(Buffer.from(tp.canonicalJson(JSON.parse(want.toString("utf8")))).equals(want));
  });
}

test("number vectors print as proto/vectors/numbers.json says", () => {
  const { cases } = JSON.parse(readFileSync(join(VECTORS, "numbers.json"), "utf8"));
  assert.ok(cases.length >= 20);
  for (const c of cases) {
    const x = new DataView(Uint8Array.from(Buffer.from(c.bits, "hex")).buffer).getFloat64(0, false);
    assert.equal(tp.esNumber(x), c.canonical, c.bits);
    assert.equal(tp.canonicalText([x]), `[${c.canonical}]`);
  }
});

test("keys sort by UTF-16 code units; strings escape as JSON.stringify; bad values refused", () => {
  assert.equal(tp.canonicalText({ "\ue000": 1, "\u{1f600}": 2, a: 3, B: 4, "": 5 }), '{"":5,"B":4,"a":3,"\u{1f600}":2,"\ue000":1}');
  assert.equal(tp.canonicalText(["\"\\/\b\f\n\r\t\u0000\u001f\u007f\u2028é"]), '["\\"\\\\/\\b\\f\\n\\r\\t\\u0000\\u001f\u007f\u2028é"]');
  assert.equal(tp.canonicalText([-0, 1e21, 1e-7, 2.5e25, 123.456]), "[0,1e+21,1e-7,2.5e+25,123.456]");
  for (const bad of [NaN, Infinity, -Infinity]) assert.throws(() => tp.canonicalText({ v: bad }), /not representable/);
  assert.throws(() => tp.canonicalText(["\ud800"]), /lone surrogate/);
});

test("NaN, infinities and -0 scalars travel as constant nodes", () => {
  for (const [v, dtype] of [[NaN, "float32"], [-Infinity, "float64"], [-0, "float32"], [Infinity, "float16"]]) {
    const s = tp.scalar(v, dtype);
    assert.equal(s.op, "constant");
    assert.deepEqual([s.shape, s.dtype], [[], dtype]);
  }
  assert.equal(tp.scalar(0.5).op, "full");
});
