#!/usr/bin/env node
// The cross-language check (PLAN's contract; tests/integration/sdk/test_cross_language.py
// runs it): `node tools/crosscheck.mjs DIR` with TRIPLANE_URL / TRIPLANE_TOKEN set.
// DIR/spec.json names the inputs (raw little-endian C-order files in DIR) and Adam's
// hyper-parameters. Builds logits = relu(x @ w1 + b1) @ w2 + b2, loss =
// cross_entropy(logits, y) (mean), asks the server for the gradients of loss with respect
// to w1 b1 w2 b2, takes one Adam step (step 1, zero moments) written from ops on the
// cluster (reading the gradients by ref), and prints one line of JSON:
// {"loss", "logits", "w1", "b1", "w2", "b2"} (the updated parameters, flat).
import { readFileSync } from "node:fs";
import { join } from "node:path";

import * as tp from "../src/index.js";
import { fromBytes } from "../src/dtypes.js";
import { connect } from "../src/node.js";

async function main(dir) {
  const spec = JSON.parse(readFileSync(join(dir, "spec.json"), "utf8"));
  const client = await connect();
  /** @type {Record<string, tp.Tensor>} */
  const t = {};
  for (const name of ["x", "y", "w1", "b1", "w2", "b2"]) {
    const input = spec.inputs[name];
    if (!input) throw new Error(`spec.json has no input "${name}"`);
    const data = fromBytes(new Uint8Array(readFileSync(join(dir, input.file))), input.dtype);
    t[name] = await client.upload(data, input.shape, { dtype: input.dtype });
  }
  const params = [t.w1, t.b1, t.w2, t.b2];
  const hidden = tp.relu(new tp.Linear(t.w1, t.b1).forward(t.x));
  const logits = new tp.Linear(t.w2, t.b2).forward(hidden);
  const loss = tp.crossEntropy(logits, t.y);
  const forward = await client.submit([loss, logits], { grad: { of: loss, wrt: params } });
  await forward.wait();
  const adam = new tp.Adam({ lr: spec.lr, betas: spec.betas, eps: spec.eps });
  const update = adam.update(params, params.map((p) => forward.gradRef(p)));
  const { values } = await client.run(update.params);
  const out = {
    loss: (await forward.fetch(loss)).data[0],
    logits: Array.from((await forward.fetch(logits)).data),
  };
  ["w1", "b1", "w2", "b2"].forEach((name, i) => { out[name] = Array.from(values[i].data); });
  await forward.release();
  for (const p of [t.x, t.y, ...params]) await client.releaseUpload(p).catch(() => {});
  process.stdout.write(`${JSON.stringify(out)}\n`);
}

if (process.argv.length !== 3) {
  console.error("usage: node tools/crosscheck.mjs DIR");
  process.exit(2);
}
main(process.argv[2]).catch((e) => {
  console.error(`crosscheck: ${e.name}: ${e.message}`);
  process.exit(1);
});
