#!/usr/bin/env node
// Train a two-layer MLP on scikit-learn's digits for a few Adam steps on a cluster,
// printing the loss of each step (it falls). The data file comes from
// `python3 sdk/js/examples/digits.py digits.json`; the cluster from TRIPLANE_URL /
// TRIPLANE_TOKEN or the run directory of `triplane up`.
//
//   node sdk/js/examples/mlp.mjs digits.json [steps]
//
// Each step is two jobs: the forward pass with the server's grad request, then Adam's
// update reading the gradients in place (refs); parameters and moments stay on the cluster.
import { readFileSync } from "node:fs";

import * as tp from "../src/index.js";
import { connect } from "../src/node.js";

const [file, stepsArg] = process.argv.slice(2);
if (!file) {
  console.error("usage: node mlp.mjs DIGITS.json [steps]");
  process.exit(2);
}
const steps = Number(stepsArg ?? 10);
const data = JSON.parse(readFileSync(file, "utf8"));

const client = await connect();
const x = await client.upload(Float32Array.from(data.x), [data.n, data.features]);
const y = await client.upload(BigInt64Array.from(data.y, BigInt), [data.n]);
const l1 = await tp.Linear.create(client, data.features, 32, { seed: 1 });
const l2 = await tp.Linear.create(client, 32, data.classes, { seed: 2 });
let params = [...l1.parameters(), ...l2.parameters()];
const adam = new tp.Adam({ lr: 0.01 });
let previous = null; // the job holding the parameters this step reads

const losses = [];
for (let step = 1; step <= steps; step++) {
  const [w1, b1, w2, b2] = params;
  const logits = new tp.Linear(w2, b2).forward(tp.relu(new tp.Linear(w1, b1).forward(x)));
  const loss = tp.crossEntropy(logits, y);
  const forward = await client.submit([loss], { grad: { of: loss, wrt: params } });
  await forward.wait();
  const value = (await forward.fetch(loss)).data[0];
  losses.push(value);
  console.log(`step ${step} loss ${value.toFixed(4)}`);
  const update = adam.update(params, params.map((p) => forward.gradRef(p)));
  const job = await client.submit(update.outputs);
  await job.wait();
  adam.keep(job);
  params = update.params.map((p) => job.ref(p));
  await forward.release();
  if (previous) await previous.release();
  previous = job;
}
await previous?.release();
for (const t of [x, y, ...l1.parameters(), ...l2.parameters()]) await client.releaseUpload(t);
if (!(losses.at(-1) < losses[0])) {
  console.error(`the loss did not fall: ${losses.join(", ")}`);
  process.exit(1);
}
console.log(`loss fell from ${losses[0].toFixed(4)} to ${losses.at(-1).toFixed(4)} in ${steps} steps`);
