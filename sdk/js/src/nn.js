// Training pieces written from the op table's ops: Linear, relu, softmax, crossEntropy,
// an SGD step and Adam. Gradients come from the server's `grad` request (Client.submit
// {grad}); an update runs in the next job, reading them in place by ref (Job.gradRef).

import { apply } from "./tensor.js";

/** @typedef {import("./tensor.js").Tensor} Tensor */
/** @typedef {import("./client.js").Client} Client */
/** @typedef {import("./client.js").Job} Job */

/** max(x, 0). @param {Tensor} x */
export const relu = (x) => apply("relu", [x], {});

/** exp(x) / sum(exp(x)) along `axis` (default the last). @param {Tensor} x @param {{axis?: number}} [o] */
export const softmax = (x, o = {}) => apply("softmax", [x], { axis: o.axis ?? -1 });

/**
 * Softmax cross entropy of logits (N, C) with integer labels (N,); the mean by default.
 * @param {Tensor} logits @param {Tensor} labels
 * @param {{reduction?: "mean"|"sum"|"none", ignore_index?: number|null, label_smoothing?: number}} [o]
 */
export const crossEntropy = (logits, labels, o = {}) => apply("cross_entropy", [logits, labels], o);

/** A dense layer y = x @ weight + bias; weight (in, out), bias (out). */
export class Linear {
  /** @param {Tensor} weight @param {Tensor} bias */
  constructor(weight, bias) {
    this.weight = weight;
    this.bias = bias;
  }

  /**
   * A layer of fresh parameters (uniform in +-1/sqrt(in), torch's default; a seeded
   * generator, so the same seed gives the same values), uploaded to the cluster.
   * @param {Client} client @param {number} inFeatures @param {number} outFeatures @param {{seed?: number}} [o]
   */
  static async create(client, inFeatures, outFeatures, o = {}) {
    const next = mulberry32(o.seed ?? 0);
    const bound = 1 / Math.sqrt(inFeatures);
    const w = Float32Array.from({ length: inFeatures * outFeatures }, () => (next() * 2 - 1) * bound);
    const b = Float32Array.from({ length: outFeatures }, () => (next() * 2 - 1) * bound);
    return new Linear(await client.upload(w, [inFeatures, outFeatures]), await client.upload(b, [outFeatures]));
  }

  /** @param {Tensor} x (N, in) */
  forward(x) {
    return apply("add", [apply("matmul", [x, this.weight], {}), this.bias], {});
  }

  /** @returns {Tensor[]} */
  parameters() {
    return [this.weight, this.bias];
  }
}

/** A 0-d `full` of p's dtype. @param {Tensor} p @param {number} v */
const k = (p, v) => apply("full", [], { value: v, shape: [], dtype: p.dtype });
/** @param {string} op @param {Tensor} a @param {Tensor} b */
const op2 = (op, a, b) => apply(op, [a, b], {});

/** p - lr * g. @param {Tensor} p @param {Tensor} g @param {number} lr */
export function sgdStep(p, g, lr) {
  return op2("sub", p, op2("mul", g, k(p, lr)));
}

/**
 * Adam (Kingma and Ba), written from ops: per parameter the first and second moments
 * live on the cluster between steps (refs to the job that made them).
 */
export class Adam {
  /** @param {{lr?: number, betas?: [number, number], eps?: number}} [o] */
  constructor(o = {}) {
    this.lr = o.lr ?? 1e-3;
    this.betas = o.betas ?? [0.9, 0.999];
    this.eps = o.eps ?? 1e-8;
    /** steps taken @type {number} */
    this.t = 0;
    /** @type {{m: Tensor, v: Tensor}[]|null} */
    this.moments = null;
    /** @type {{m: Tensor, v: Tensor}[]|null} */
    this.pending = null;
  }

  /**
   * The update of one step: new parameters (in the order given) and the new moments (in
   * `outputs`, to fetch with them). Run it, then `keep(job)` so the next step reads the
   * moments in place.
   * @param {Tensor[]} params @param {Tensor[]} grads
   * @returns {{params: Tensor[], outputs: Tensor[]}}
   */
  update(params, grads) {
    const [b1, b2] = this.betas;
    const t = this.t + 1;
    const moments = this.moments ?? params.map((p) => ({
      m: apply("full", [], { value: 0, shape: p.shape, dtype: p.dtype }),
      v: apply("full", [], { value: 0, shape: p.shape, dtype: p.dtype }),
    }));
    const out = params.map((p, i) => {
      const g = grads[i];
      const m = op2("add", op2("mul", moments[i].m, k(p, b1)), op2("mul", g, k(p, 1 - b1)));
      const v = op2("add", op2("mul", moments[i].v, k(p, b2)), op2("mul", op2("mul", g, g), k(p, 1 - b2)));
      const mhat = op2("div", m, k(p, 1 - b1 ** t));
      const vhat = op2("div", v, k(p, 1 - b2 ** t));
      const step = op2("div", op2("mul", mhat, k(p, this.lr)), op2("add", apply("sqrt", [vhat], {}), k(p, this.eps)));
      return { p: op2("sub", p, step), m, v };
    });
    this.pending = out.map(({ m, v }) => ({ m, v }));
    return { params: out.map((o) => o.p), outputs: out.flatMap((o) => [o.p, o.m, o.v]) };
  }

  /** The update ran in `job`: take its moments (by ref) as the state of the next step. @param {Job} job */
  keep(job) {
    if (!this.pending) throw new Error("keep(job) follows update(...)");
    this.moments = this.pending.map(({ m, v }) => ({ m: job.ref(m), v: job.ref(v) }));
    this.pending = null;
    this.t += 1;
  }
}

/** A small seeded generator (mulberry32): floats in [0, 1). @param {number} seed */
export function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
