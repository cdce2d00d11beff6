// Every case of proto/vectors/shapes/ for every op: the output type and normalised
// attributes, or the same error kind, as the Python op table gives.
import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { GraphError } from "../src/errors.js";
import { inferNode } from "../src/infer.js";
import { VECTORS } from "../testing/paths.mjs";

const dir = join(VECTORS, "shapes");
const files = readdirSync(dir).filter((f) => f.endsWith(".json")).sort();

test("there is a shape vector file per op", (t) => {
  assert.ok(files.length >= 80, `only ${files.length} vector files in ${dir}`);
  const cases = files.reduce((n, f) => n + JSON.parse(readFileSync(join(dir, f), "utf8")).cases.length, 0);
  t.diagnostic(`shape vectors: ${cases} cases of ${files.length} ops, each run below`);
});

for (const file of files) {
  const doc = JSON.parse(readFileSync(join(dir, file), "utf8"));
  test(`shape vectors: ${doc.op} (${doc.cases.length} cases)`, () => {
    doc.cases.forEach((c, i) => {
      const what = `${doc.op} case ${i}: inputs ${JSON.stringify(c.inputs)} attrs ${JSON.stringify(c.attrs)}`;
      let got;
      try {
        got = inferNode(doc.op, c.inputs, c.attrs);
      } catch (e) {
        if (!(e instanceof GraphError)) throw e;
        assert.ok(c.error, `${what}: threw ${e.kind} (${e.message}), expected ${JSON.stringify(c.output)}`);
        assert.equal(e.kind, c.error, `${what}: error kind (${e.message})`);
        return;
      }
      assert.ok(!c.error, `${what}: gave ${JSON.stringify(got.type)}, expected error ${c.error}`);
      assert.deepEqual(got.type, c.output, what);
      assert.deepEqual(got.attrs, c.normalised_attrs, `${what}: normalised attributes`);
    });
  });
}
