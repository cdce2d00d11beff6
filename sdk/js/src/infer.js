// Shape and dtype inference for every op of the op table, the same rules as the Python
// reference (triplane/proto/ops/*.py), checked against proto/vectors/shapes/. An op's
// signature (arity, attribute schema, accepted dtypes) comes from proto/ops.json through
// ops.gen.js; the checks an attribute schema cannot say, and each op's inference, are here.

import { ITEMSIZE, isDType, isFloat, isInt } from "./dtypes.js";
import { GraphError } from "./errors.js";
import { SPEC } from "./spec.gen.js";

/** @typedef {import("./dtypes.js").DType} DType */
/** @typedef {{shape: number[], dtype: DType}} TensorType */

export const MAX_RANK = 16;
const MAX_RANGE = 2 ** 48;
const SAFE = 2 ** 53;

const err = (kind) => (/** @type {string} */ msg) => new GraphError(msg, { kind });
const shapeErr = err("shape");
const dtypeErr = err("dtype");
const attrErr = err("attr");
const limitErr = err("limit");

/** A shape as Python prints a tuple: (2, 3), (3,), (). @param {readonly number[]} s */
export const tup = (s) => (s.length === 1 ? `(${s[0]},)` : `(${s.join(", ")})`);
/** @param {readonly number[]} s */
const lst = (s) => `[${s.join(", ")}]`;
/** A type as the server names it: float32[2, 3]. @param {TensorType} t */
export const typeText = (t) => `${t.dtype}${lst(t.shape)}`;
const prod = (/** @type {readonly number[]} */ s) => s.reduce((a, b) => a * b, 1);
const sameShape = (/** @type {readonly number[]} */ a, /** @type {readonly number[]} */ b) =>
  a.length === b.length && a.every((x, i) => x === b[i]);
const T = (/** @type {number[]} */ shape, /** @type {DType} */ dtype) => ({ shape, dtype });
const isIntV = (/** @type {unknown} */ v) => typeof v === "number" && Number.isInteger(v);
const isNum = (/** @type {unknown} */ v) => typeof v === "number";
const finite = (/** @type {number} */ v) => (Number.isFinite(v) ? null : "must be finite");

// --- attribute normalisation (opdef.py Attr.normalise / OpDef.normalise_attrs) ----------

const KIND_TEXT = {
  int: "an integer", float: "a number", bool: "true or false", str: "a string",
  ints: "a list of integers", floats: "a list of numbers",
  axes: "an axis or a list of axes (or null for all)", shape: "a list of non-negative integers",
  dtype: "a dtype name", any: "a value",
};
const BAD = Symbol("bad");

/** @param {string} kind @param {any} v */
function coerce(kind, v) {
  switch (kind) {
    case "int": return isIntV(v) ? v : BAD;
    case "float": return isNum(v) ? v : BAD;
    case "bool": return typeof v === "boolean" ? v : BAD;
    case "str": return typeof v === "string" ? v : BAD;
    case "ints": case "shape":
      if (!Array.isArray(v) || !v.every(isIntV)) return BAD;
      if (kind === "shape" && v.some((x) => x < 0)) return BAD;
      return [...v];
    case "floats": return Array.isArray(v) && v.every(isNum) ? [...v] : BAD;
    case "axes":
      if (isIntV(v)) return [v];
      return Array.isArray(v) && v.every(isIntV) ? [...v] : BAD;
    case "dtype": return isDType(v) ? v : BAD;
    case "any": return v;
    default: throw new Error(`unknown attribute kind ${kind}`);
  }
}

const positivePair = (/** @type {number[]} */ v) => (v.length === 2 && v.every((x) => x >= 1) ? null : "must be 2 integers >= 1");
const nonnegPair = (/** @type {number[]} */ v) => (v.length === 2 && v.every((x) => x >= 0) ? null : "must be 2 integers >= 0");
const atLeast = (/** @type {number} */ n) => (/** @type {number} */ v) => (v >= n ? null : `must be >= ${n}`);
const jsonSafe = (/** @type {number} */ v) => (v >= 0 && v < SAFE ? null : "must be in [0, 2**53)");
const floatDtype = (/** @type {string} */ v) => (isFloat(v) ? null : "random ops make floating-point tensors");
const fillValue = (/** @type {any} */ v) => {
  if (typeof v !== "boolean" && typeof v !== "number") return "must be a number or a boolean";
  return typeof v === "number" && !Number.isFinite(v) ? "must be finite (use a 0-d constant node for nan and infinities)" : null;
};
const pads = (/** @type {any} */ v) => (Array.isArray(v) && v.every((p) => Array.isArray(p) && p.length === 2
  && p.every((q) => isIntV(q) && q >= 0)) ? null : "must be a list of [before, after] pairs of non-negative integers");
const eps = (/** @type {number} */ v) => (v > 0 ? null : "must be > 0");
const conv = { stride: positivePair, padding: nonnegPair, dilation: positivePair, groups: atLeast(1) };
const pool = { kernel: positivePair, stride: positivePair, padding: nonnegPair };
const random = { dtype: floatDtype, seed: jsonSafe, offset: jsonSafe };

/** Value checks the schema in ops.json cannot say (opdef Attr.check), per op and attribute. */
const CHECKS = /** @type {Record<string, Record<string, (v: any) => string|null>>} */ ({
  full: { value: fillValue },
  arange: { start: finite, stop: finite, step: (v) => finite(v) ?? (v !== 0 ? null : "must not be zero") },
  eye: { n: atLeast(0), m: atLeast(0) },
  uniform: { ...random, low: finite, high: finite },
  normal: { ...random, mean: finite, std: (v) => finite(v) ?? (v >= 0 ? null : "must be >= 0") },
  pad: { pads, value: (v) => (typeof v === "boolean" || isNum(v) ? null : "must be a number or a boolean") },
  scatter_add: { size: atLeast(0) },
  var: { ddof: atLeast(0) },
  conv2d: conv, conv2d_grad_input: conv, conv2d_grad_weight: conv,
  max_pool2d: pool, avg_pool2d: pool, max_pool2d_grad: pool, avg_pool2d_grad: pool,
  cross_entropy: { label_smoothing: (v) => (v >= 0 && v < 1 ? null : "must be in [0, 1)") },
  cross_entropy_grad: { label_smoothing: (v) => (v >= 0 && v < 1 ? null : "must be in [0, 1)") },
  embedding_grad: { num_embeddings: atLeast(1) },
  one_hot: { num_classes: atLeast(1) },
  dropout: { p: (v) => (v >= 0 && v < 1 ? null : "the drop probability must be in [0, 1)"), seed: jsonSafe },
  layer_norm: { eps }, batch_norm: { eps },
});

const clone = (/** @type {any} */ v) => (v === undefined ? v : JSON.parse(JSON.stringify(v)));

/**
 * An op's attributes with the schema applied: defaults filled, types checked, unknown
 * names refused (a GraphError of kind "attr" or "unknown_op").
 * @param {string} op @param {Record<string, any>} [attrs]
 * @returns {Record<string, any>}
 */
export function normaliseAttrs(op, attrs = {}) {
  const spec = SPEC.ops[op];
  if (!spec) throw new GraphError(`unknown op ${JSON.stringify(op)}`, { kind: "unknown_op" });
  const unknown = Object.keys(attrs).filter((k) => attrs[k] !== undefined && !Object.hasOwn(spec.attrs, k)).sort();
  if (unknown.length) {
    const known = Object.keys(spec.attrs).sort();
    throw new GraphError(`unknown attribute(s) ${JSON.stringify(unknown)} (known: ${known.length ? JSON.stringify(known) : "none"})`, { kind: "attr", op });
  }
  /** @type {Record<string, any>} */
  const out = {};
  for (const [name, a] of Object.entries(spec.attrs)) {
    const given = attrs[name];
    if (given === undefined) {
      if (a.required) throw new GraphError(`missing required attribute '${name}'`, { kind: "attr", op });
      out[name] = clone(a.default);
      continue;
    }
    if (given === null && (a.nullable || a.type === "axes" || a.type === "any")) { out[name] = null; continue; }
    const v = coerce(a.type, given);
    if (v === BAD) throw new GraphError(`attribute '${name}' must be ${KIND_TEXT[a.type]}, got ${show(given)}`, { kind: "attr", op });
    if (a.choices && !a.choices.includes(v)) {
      throw new GraphError(`attribute '${name}' must be one of ${JSON.stringify(a.choices)}, got ${show(given)}`, { kind: "attr", op });
    }
    const why = CHECKS[op]?.[name]?.(v);
    if (why) throw new GraphError(`attribute '${name}'=${show(given)}: ${why}`, { kind: "attr", op });
    out[name] = a.type === "any" ? clone(v) : v;
  }
  return out;
}

/** @param {unknown} v */
function show(v) {
  try { return typeof v === "bigint" ? String(v) : JSON.stringify(v) ?? String(v); } catch { return String(v); }
}

// --- helpers (opdef.py) ----------------------------------------------------------------------

/** @param {number} axis @param {number} ndim */
function normAxis(axis, ndim, what = "axis") {
  const n = Math.max(ndim, 1);
  if (!(-n <= axis && axis < n)) throw shapeErr(`${what} ${axis} is out of range for a ${ndim}-d tensor`);
  return ((axis % n) + n) % n;
}

/** @param {number[]|null} axes @param {number} ndim */
function normAxes(axes, ndim) {
  if (axes === null) return [...Array(ndim).keys()];
  const out = ndim ? axes.map((a) => normAxis(a, ndim)).sort((a, b) => a - b) : [];
  if (new Set(out).size !== out.length) throw shapeErr(`repeated axis in ${lst(axes)}`);
  return out;
}

/** numpy broadcasting. @param {...number[]} shapes */
export function broadcastShapes(...shapes) {
  const nd = Math.max(0, ...shapes.map((s) => s.length));
  const out = [];
  for (let i = 0; i < nd; i++) {
    let dim = 1;
    for (const s of shapes) {
      const j = i - nd + s.length;
      const d = j >= 0 ? s[j] : 1;
      if (d !== 1) {
        if (dim !== 1 && dim !== d) throw shapeErr(`shapes ${shapes.map(tup).join(" and ")} do not broadcast`);
        dim = d;
      }
    }
    out.push(dim);
  }
  return out;
}

/** @param {TensorType[]} ins @param {string} [what] */
function oneDtype(ins, what = "operands") {
  if (new Set(ins.map((t) => t.dtype)).size > 1) {
    throw dtypeErr(`${what} have dtypes ${ins.map((t) => t.dtype).join(what === "inputs" ? ", " : " and ")}; cast them to one dtype first`);
  }
  return ins[0].dtype;
}

// --- inference per op ------------------------------------------------------------------------

/** @typedef {(ins: TensorType[], a: Record<string, any>) => TensorType} Infer */

const same = /** @type {Infer} */ ((ins) => ins[0]);
const binary = /** @type {Infer} */ ((ins) => T(broadcastShapes(ins[0].shape, ins[1].shape), oneDtype(ins)));
const predicate = /** @type {Infer} */ ((ins) => T(binary(ins, {}).shape, "bool"));
const declared = /** @type {Infer} */ ((ins, a) => T([...a.shape], a.dtype));

/** @param {number[]} shape @param {Record<string, any>} a */
function checkRegion(shape, a) {
  const full = a.full_shape;
  const start = a.start;
  if (full === null && start === null) return;
  if (full === null || start === null) throw attrErr("attributes 'full_shape' and 'start' go together (both null, or both set)");
  if (!(full.length === start.length && start.length === shape.length)
    || start.some((/** @type {number} */ s, /** @type {number} */ i) => s < 0 || s + shape[i] > full[i])) {
    throw shapeErr(`a region of shape ${tup(shape)} at start ${lst(start)} does not fit full_shape ${lst(full)}`);
  }
}

/** @param {string} b64 */
function b64Length(b64) {
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(b64) || b64.length % 4) return -1;
  const pad = b64.endsWith("==") ? 2 : b64.endsWith("=") ? 1 : 0;
  return (b64.length / 4) * 3 - pad;
}

/** @param {number[]} shape @param {Record<string, any>} a */
function reducedAxes(shape, a) {
  try {
    return normAxes(a.axes, shape.length);
  } catch (e) {
    if (e instanceof GraphError) throw shapeErr(`${e.reason} of shape ${tup(shape)}`);
    throw e;
  }
}

/** @param {number[]} shape @param {Record<string, any>} a */
function reducedShape(shape, a) {
  const axes = reducedAxes(shape, a);
  return a.keepdims ? shape.map((s, i) => (axes.includes(i) ? 1 : s)) : shape.filter((_, i) => !axes.includes(i));
}

/** @param {string} name @param {TensorType} x @param {number[]} axes */
function needElements(name, x, axes) {
  if (axes.some((i) => x.shape[i] === 0)) {
    throw shapeErr(`${name} of an empty set: axes ${lst(axes)} of shape ${tup(x.shape)} include a dimension of size 0`);
  }
}

/** @param {string} name @param {boolean} nonempty @returns {Infer} */
const reduction = (name, nonempty) => (ins, a) => {
  const x = ins[0];
  const shape = reducedShape(x.shape, a);
  if (nonempty) needElements(name, x, reducedAxes(x.shape, a));
  return T(shape, x.dtype);
};

/** @param {string} name @returns {Infer} */
const argReduce = (name) => (ins, a) => {
  const x = ins[0];
  if (a.axis === null) {
    needElements(name, x, [...Array(x.shape.length).keys()]);
    return T(a.keepdims ? x.shape.map(() => 1) : [], "int64");
  }
  const nd = x.shape.length;
  if (nd === 0 || !(-nd <= a.axis && a.axis < nd)) throw shapeErr(`axis ${a.axis} is out of range for shape ${tup(x.shape)}`);
  const ax = normAxis(a.axis, nd);
  needElements(name, x, [ax]);
  return T(a.keepdims ? x.shape.map((s, i) => (i === ax ? 1 : s)) : x.shape.filter((_, i) => i !== ax), "int64");
};

/** @param {number[]} shape @param {Record<string, any>} a */
function slicedShape(shape, a) {
  const { starts, stops, steps } = a;
  if (!(starts.length === stops.length && stops.length === steps.length && steps.length === shape.length)) {
    throw shapeErr(`starts ${lst(starts)}, stops ${lst(stops)} and steps ${lst(steps)} need one entry per axis of ${tup(shape)}`);
  }
  return shape.map((n, i) => {
    const [lo, hi, st] = [starts[i], stops[i], steps[i]];
    if (!(lo >= 0 && lo <= hi && hi <= n && st >= 1)) {
      throw shapeErr(`axis ${i}: slice ${lo}:${hi}:${st} is not within 0 <= start <= stop <= ${n} with step >= 1 (shape ${tup(shape)})`);
    }
    return Math.ceil((hi - lo) / st);
  });
}

/** @param {TensorType} t @param {string} what */
function needFloat(t, what) {
  if (!isFloat(t.dtype)) throw dtypeErr(`${what} must be floating point, got ${t.dtype} of shape ${tup(t.shape)}`);
}
/** @param {TensorType} t @param {string} what */
function needIndex(t, what) {
  if (!isInt(t.dtype)) throw dtypeErr(`${what} must be integer indices, got ${t.dtype} of shape ${tup(t.shape)}`);
}

/** @param {TensorType} logits @param {TensorType} labels */
function checkCe(logits, labels) {
  needFloat(logits, "logits");
  needIndex(labels, "labels");
  if (logits.shape.length === 0) throw shapeErr("logits must have a class axis: (C,), (N, C) or (N, C, d...), got shape ()");
  const want = logits.shape.length === 1 ? [] : [logits.shape[0], ...logits.shape.slice(2)];
  if (!sameShape(labels.shape, want)) {
    throw shapeErr(`labels of shape ${tup(labels.shape)} do not fit logits of shape ${tup(logits.shape)} (expected labels of shape ${tup(want)}: logits without the class axis 1)`);
  }
}

/** @param {number[]} hw @param {number[]} khw @param {Record<string, any>} a @param {string} what */
function convOutHw(hw, khw, a, what) {
  return hw.map((size, i) => {
    const [k, s, p, d] = [khw[i], a.stride[i], a.padding[i], a.dilation ? a.dilation[i] : 1];
    const span = d * (k - 1) + 1;
    if (size + 2 * p < span) throw shapeErr(`${what}: the window (${span} after dilation) is larger than the padded input (${size} + 2*${p})`);
    return Math.floor((size + 2 * p - span) / s) + 1;
  });
}

/** @type {Infer} */
function conv2d([x, w], a) {
  if (x.dtype !== w.dtype) throw dtypeErr(`input and weight have dtypes ${x.dtype} and ${w.dtype}; cast them to one dtype`);
  if (x.shape.length !== 4 || w.shape.length !== 4) {
    throw shapeErr(`needs input (N, C, H, W) and weight (O, C/groups, kH, kW), got ${tup(x.shape)} and ${tup(w.shape)}`);
  }
  const g = a.groups;
  const what = `input ${tup(x.shape)}, weight ${tup(w.shape)}`;
  if (x.shape[1] % g || w.shape[0] % g) throw shapeErr(`groups=${g} must divide the input channels and the output channels (${what})`);
  if (w.shape[1] * g !== x.shape[1]) {
    throw shapeErr(`weight expects ${w.shape[1] * g} input channels (${w.shape[1]} per group x ${g} groups), the input has ${x.shape[1]} (${what})`);
  }
  const [ho, wo] = convOutHw(x.shape.slice(2), w.shape.slice(2), a, what);
  return T([x.shape[0], w.shape[0], ho, wo], x.dtype);
}

/** @type {Infer} */
function pool2d([x], a) {
  if (x.shape.length !== 4) throw shapeErr(`needs an input (N, C, H, W), got shape ${tup(x.shape)}`);
  const b = a.stride === null ? { ...a, stride: a.kernel } : a;
  if (b.padding.some((/** @type {number} */ p, /** @type {number} */ i) => 2 * p > b.kernel[i])) {
    throw attrErr(`padding ${lst(b.padding)} must be at most half the kernel ${lst(b.kernel)}`);
  }
  const [ho, wo] = convOutHw(x.shape.slice(2), b.kernel, b, `input ${tup(x.shape)}, kernel ${lst(b.kernel)}`);
  return T([x.shape[0], x.shape[1], ho, wo], x.dtype);
}

/** @type {Infer} */
function fused(ins, a) {
  const program = a.program;
  if (!Array.isArray(program) || program.length === 0) throw attrErr(`attribute 'program' must be a non-empty list of steps, got ${show(program)}`);
  const types = [...ins];
  const isReduction = (/** @type {string} */ op) => ["sum", "prod", "max", "min", "mean"].includes(op);
  program.forEach((step, k) => {
    if (!(Array.isArray(step) && step.length === 3 && typeof step[0] === "string" && Array.isArray(step[1])
      && step[2] !== null && typeof step[2] === "object" && !Array.isArray(step[2]))) {
      throw attrErr(`program step ${k} must be [op, [args], {attrs}], got ${show(step)}`);
    }
    const [op, args, attrs] = step;
    const spec = SPEC.ops[op];
    if (!spec) throw new GraphError(`unknown op ${JSON.stringify(op)}`, { kind: "unknown_op" });
    const last = k === program.length - 1;
    if (!spec.elementwise && op !== "full") {
      if (!(last && isReduction(op))) {
        throw attrErr(`program step ${k}: ${op} is not elementwise (only the last step may be a reduction with a combine: sum, prod, max, min, mean)`);
      }
      if (!(args.length === 1 && args[0] === types.length - 1) || k === 0) {
        throw attrErr(`program step ${k}: the reduction ${op} must read the step before it`);
      }
    }
    for (const arg of args) {
      if (!isIntV(arg) || arg < 0 || arg >= types.length) throw attrErr(`program step ${k}: argument ${show(arg)} names no earlier value`);
    }
    types.push(check(op, args.map((/** @type {number} */ i) => types[i]), normaliseAttrs(op, attrs)));
  });
  const steps = types.slice(ins.length);
  const reduced = isReduction(program[program.length - 1][0]);
  const body = steps[steps.length - (reduced ? 2 : 1)];
  steps.slice(0, steps.length - (reduced ? 2 : 1)).forEach((t, k) => {
    if (!(sameShape(t.shape, body.shape) || t.shape.length === 0)) {
      throw shapeErr(`program step ${k} has shape ${tup(t.shape)}, not the body's ${tup(body.shape)}`);
    }
  });
  return steps[steps.length - 1];
}

/** @type {Record<string, Infer>} */
const SPECIAL = {
  // creation
  input: declared,
  full: declared,
  constant(ins, a) {
    const t = declared(ins, a);
    const n = b64Length(a.data);
    if (n < 0) throw attrErr("attribute 'data' is not valid base64");
    const want = prod(t.shape) * ITEMSIZE[t.dtype];
    if (n !== want) throw attrErr(`attribute 'data' holds ${n} bytes; ${typeText(t)} needs ${want}`);
    return t;
  },
  arange(ins, a) {
    const n = Math.ceil((a.stop - a.start) / a.step);
    if (n > MAX_RANGE) throw limitErr(`arange(${a.start}, ${a.stop}, ${a.step}) has ${n} elements, more than ${MAX_RANGE}`);
    if (a.dtype === "bool") throw attrErr("arange cannot make bool tensors (dtype 'bool')");
    return T([Math.max(0, n)], a.dtype);
  },
  eye: (ins, a) => T([a.n, a.m === null ? a.n : a.m], a.dtype),
  uniform(ins, a) {
    if (!(a.low <= a.high)) throw attrErr(`uniform needs low <= high, got low=${a.low} high=${a.high}`);
    checkRegion(a.shape, a);
    return declared(ins, a);
  },
  normal(ins, a) {
    checkRegion(a.shape, a);
    return declared(ins, a);
  },
  // elementwise
  where([c, x, y]) {
    if (c.dtype !== "bool") throw dtypeErr(`the condition has dtype ${c.dtype}; it must be bool (compare it with something first)`);
    if (x.dtype !== y.dtype) throw dtypeErr(`the two branches have dtypes ${x.dtype} and ${y.dtype}; cast them to one dtype first`);
    return T(broadcastShapes(c.shape, x.shape, y.shape), x.dtype);
  },
  cast: ([x], a) => T(x.shape, a.dtype),
  // linalg
  matmul([x, y]) {
    if (x.dtype !== y.dtype) throw dtypeErr(`operands have dtypes ${x.dtype} and ${y.dtype}; cast them to one dtype first`);
    if (x.shape.length === 0 || y.shape.length === 0) {
      throw shapeErr(`matmul needs operands of at least 1 dimension, got ${tup(x.shape)} @ ${tup(y.shape)}`);
    }
    const xs = x.shape.length > 1 ? x.shape : [1, ...x.shape];
    const ys = y.shape.length > 1 ? y.shape : [...y.shape, 1];
    if (xs[xs.length - 1] !== ys[ys.length - 2]) {
      throw shapeErr(`inner dimensions differ: ${tup(x.shape)} @ ${tup(y.shape)} (${xs[xs.length - 1]} != ${ys[ys.length - 2]})`);
    }
    let batch;
    try {
      batch = broadcastShapes(xs.slice(0, -2), ys.slice(0, -2));
    } catch {
      throw shapeErr(`batch dimensions do not broadcast: ${tup(x.shape)} @ ${tup(y.shape)}`);
    }
    let out = [...batch, xs[xs.length - 2], ys[ys.length - 1]];
    if (x.shape.length === 1) out = [...out.slice(0, -2), out[out.length - 1]];
    if (y.shape.length === 1) out = out.slice(0, -1);
    return T(out, x.dtype);
  },
  // shape
  reshape([x], a) {
    if (prod(a.shape) !== prod(x.shape)) {
      throw shapeErr(`cannot reshape ${tup(x.shape)} (${prod(x.shape)} elements) to ${tup(a.shape)} (${prod(a.shape)} elements)`);
    }
    return T([...a.shape], x.dtype);
  },
  transpose([x], a) {
    const sorted = [...a.perm].sort((p, q) => p - q);
    if (!sameShape(sorted, [...Array(x.shape.length).keys()])) {
      throw shapeErr(`perm ${lst(a.perm)} is not a permutation of the ${x.shape.length} axes of ${tup(x.shape)}`);
    }
    return T(a.perm.map((/** @type {number} */ p) => x.shape[p]), x.dtype);
  },
  broadcast_to([x], a) {
    const s = a.shape;
    const ok = s.length >= x.shape.length && x.shape.every((d, i) => {
      const t = s[s.length - x.shape.length + i];
      return d === t || d === 1;
    });
    if (!ok) throw shapeErr(`cannot broadcast ${tup(x.shape)} to ${tup(s)}`);
    return T([...s], x.dtype);
  },
  squeeze([x], a) {
    let drop;
    if (a.axes === null) drop = x.shape.flatMap((s, i) => (s === 1 ? [i] : []));
    else {
      drop = normAxes(a.axes, x.shape.length);
      const bad = drop.filter((i) => x.shape[i] !== 1);
      if (bad.length) {
        throw shapeErr(`cannot squeeze axis ${bad[0]} of shape ${tup(x.shape)}: its size is ${x.shape[bad[0]]}, not 1`);
      }
    }
    return T(x.shape.filter((_, i) => !drop.includes(i)), x.dtype);
  },
  unsqueeze([x], a) {
    if (a.axes === null) throw shapeErr("unsqueeze needs the positions of the new axes");
    const nd = x.shape.length + a.axes.length;
    let neu;
    try {
      neu = normAxes(a.axes, nd);
    } catch (e) {
      if (e instanceof GraphError) throw shapeErr(`${e.reason} (new axes ${lst(a.axes)} for ${tup(x.shape)})`);
      throw e;
    }
    let j = 0;
    return T([...Array(nd).keys()].map((i) => (neu.includes(i) ? 1 : x.shape[j++])), x.dtype);
  },
  concat(ins, a) {
    const d = oneDtype(ins, "inputs");
    const first = ins[0];
    if (first.shape.length === 0) throw shapeErr("cannot concatenate 0-d tensors (stack them instead)");
    const ax = normAxis(a.axis, first.shape.length);
    for (const t of ins.slice(1)) {
      if (t.shape.length !== first.shape.length || t.shape.some((s, i) => i !== ax && s !== first.shape[i])) {
        throw shapeErr(`shapes ${ins.map((u) => tup(u.shape)).join(", ")} differ outside axis ${ax}`);
      }
    }
    const shape = [...first.shape];
    shape[ax] = ins.reduce((n, t) => n + t.shape[ax], 0);
    return T(shape, d);
  },
  stack(ins, a) {
    const d = oneDtype(ins, "inputs");
    const first = ins[0];
    if (ins.some((t) => !sameShape(t.shape, first.shape))) {
      throw shapeErr(`cannot stack tensors of different shapes: ${ins.map((t) => tup(t.shape)).join(", ")}`);
    }
    const ax = normAxis(a.axis, first.shape.length + 1);
    return T([...first.shape.slice(0, ax), ins.length, ...first.shape.slice(ax)], d);
  },
  slice: ([x], a) => T(slicedShape(x.shape, a), x.dtype),
  unslice([g], a) {
    const want = slicedShape(a.shape, a);
    if (!sameShape(want, g.shape)) {
      throw shapeErr(`a slice of ${tup(a.shape)} has shape ${tup(want)}, but the values have shape ${tup(g.shape)}`);
    }
    return T([...a.shape], g.dtype);
  },
  gather([x, idx], a) {
    if (!isInt(idx.dtype)) throw dtypeErr(`gather indices must be integers, got ${idx.dtype} of shape ${tup(idx.shape)}`);
    if (x.shape.length === 0) throw shapeErr(`cannot gather from a 0-d tensor (index shape ${tup(idx.shape)})`);
    const ax = normAxis(a.axis, x.shape.length);
    return T([...x.shape.slice(0, ax), ...idx.shape, ...x.shape.slice(ax + 1)], x.dtype);
  },
  scatter_add([g, idx], a) {
    if (!isInt(idx.dtype)) throw dtypeErr(`scatter_add indices must be integers, got ${idx.dtype} of shape ${tup(idx.shape)}`);
    const ax = a.axis;
    if (!(ax >= 0 && ax <= g.shape.length - idx.shape.length) || !sameShape(g.shape.slice(ax, ax + idx.shape.length), idx.shape)) {
      throw shapeErr(`values of shape ${tup(g.shape)} do not hold index shape ${tup(idx.shape)} at axis ${ax}`);
    }
    return T([...g.shape.slice(0, ax), a.size, ...g.shape.slice(ax + idx.shape.length)], g.dtype);
  },
  pad([x], a) {
    if (a.pads.length !== x.shape.length) {
      throw shapeErr(`pads ${JSON.stringify(a.pads)} need one [before, after] pair per axis of ${tup(x.shape)}`);
    }
    return T(x.shape.map((s, i) => s + a.pads[i][0] + a.pads[i][1]), x.dtype);
  },
  flip([x], a) {
    normAxes(a.axes, x.shape.length);
    return x;
  },
  // reduce
  sum: reduction("sum", false),
  prod: reduction("prod", false),
  max: reduction("max", true),
  min: reduction("min", true),
  mean: reduction("mean", false),
  logsumexp: reduction("logsumexp", false),
  var([x], a) {
    const count = prod(reducedAxes(x.shape, a).map((i) => x.shape[i]));
    if (count - a.ddof <= 0) {
      throw shapeErr(`var with ddof=${a.ddof} over ${count} element(s) (axes ${a.axes === null ? "None" : tup(a.axes)} of shape ${tup(x.shape)}) has no degrees of freedom`);
    }
    return T(reducedShape(x.shape, a), x.dtype);
  },
  argmax: argReduce("argmax"),
  argmin: argReduce("argmin"),
  // nn
  softmax([x], a) {
    const n = Math.max(x.shape.length, 1);
    if (!(-n <= a.axis && a.axis < n)) throw attrErr(`attribute 'axis'=${a.axis} is out of range for a tensor of shape ${tup(x.shape)}`);
    return x;
  },
  cross_entropy([logits, labels], a) {
    checkCe(logits, labels);
    return T(a.reduction === "none" ? [...labels.shape] : [], logits.dtype);
  },
  cross_entropy_grad([logits, labels, g], a) {
    checkCe(logits, labels);
    const want = a.reduction === "none" ? labels.shape : [];
    if (!sameShape(g.shape, want) || g.dtype !== logits.dtype) {
      throw shapeErr(`incoming gradient ${typeText(g)} does not match the loss ${logits.dtype}${lst(want)}`);
    }
    return logits;
  },
  mse_loss([x, y], a) {
    if (x.dtype !== y.dtype) throw dtypeErr(`operands have dtypes ${x.dtype} and ${y.dtype}; cast them to one dtype first`);
    const shape = broadcastShapes(x.shape, y.shape);
    return T(a.reduction === "none" ? shape : [], x.dtype);
  },
  conv2d,
  conv2d_grad_input([g, w], a) {
    const x = T([...a.input_shape], g.dtype);
    const out = conv2d([x, w], a);
    if (!sameShape(g.shape, out.shape)) throw shapeErr(`gradient of shape ${tup(g.shape)} does not match conv2d output ${tup(out.shape)}`);
    return x;
  },
  conv2d_grad_weight([x, g], a) {
    const w = T([...a.weight_shape], x.dtype);
    const out = conv2d([x, w], a);
    if (!sameShape(g.shape, out.shape)) throw shapeErr(`gradient of shape ${tup(g.shape)} does not match conv2d output ${tup(out.shape)}`);
    return w;
  },
  max_pool2d: pool2d,
  avg_pool2d: pool2d,
  max_pool2d_grad([x, g], a) {
    const out = pool2d([x], a);
    if (!sameShape(g.shape, out.shape) || g.dtype !== x.dtype) throw shapeErr(`gradient ${typeText(g)} does not match max_pool2d output ${typeText(out)}`);
    return x;
  },
  avg_pool2d_grad([g], a) {
    const x = T([...a.input_shape], g.dtype);
    const out = pool2d([x], a);
    if (!sameShape(g.shape, out.shape)) throw shapeErr(`gradient of shape ${tup(g.shape)} does not match avg_pool2d output ${tup(out.shape)}`);
    return x;
  },
  embedding([w, idx]) {
    needFloat(w, "weight");
    needIndex(idx, "indices");
    if (w.shape.length !== 2) throw shapeErr(`weight must be (num_embeddings, dim), got shape ${tup(w.shape)}`);
    return T([...idx.shape, w.shape[1]], w.dtype);
  },
  embedding_grad([idx, g], a) {
    needIndex(idx, "indices");
    needFloat(g, "gradient");
    if (g.shape.length !== idx.shape.length + 1 || !sameShape(g.shape.slice(0, -1), idx.shape)) {
      throw shapeErr(`gradient of shape ${tup(g.shape)} does not fit indices of shape ${tup(idx.shape)}`);
    }
    return T([a.num_embeddings, g.shape[g.shape.length - 1]], g.dtype);
  },
  one_hot([idx], a) {
    needIndex(idx, "indices");
    return T([...idx.shape, a.num_classes], a.dtype);
  },
  dropout([x], a) {
    checkRegion(x.shape, a);
    return x;
  },
  layer_norm([x, w, bias], a) {
    const k = a.normalized_ndim;
    if (!(k >= 1 && k <= x.shape.length)) throw attrErr(`attribute 'normalized_ndim'=${k} must be in [1, ${x.shape.length}] for input ${tup(x.shape)}`);
    const want = x.shape.slice(x.shape.length - k);
    if (!sameShape(w.shape, want) || !sameShape(bias.shape, want)) {
      throw shapeErr(`weight ${tup(w.shape)} and bias ${tup(bias.shape)} must have the normalised shape ${tup(want)} (the last ${k} axes of input ${tup(x.shape)})`);
    }
    if (!(x.dtype === w.dtype && w.dtype === bias.dtype)) {
      throw dtypeErr(`input, weight and bias have dtypes ${x.dtype}, ${w.dtype}, ${bias.dtype}; cast them to one dtype`);
    }
    return x;
  },
  batch_norm(ins) {
    const x = ins[0];
    if (x.shape.length < 2) throw shapeErr(`needs an input (N, C, ...), got shape ${tup(x.shape)}`);
    const c = x.shape[1];
    ["weight", "bias", "running_mean", "running_var"].forEach((name, i) => {
      const t = ins[i + 1];
      if (!sameShape(t.shape, [c])) throw shapeErr(`${name} has shape ${tup(t.shape)}; input ${tup(x.shape)} has ${c} channels, so (${c},)`);
      if (t.dtype !== x.dtype) throw dtypeErr(`${name} has dtype ${t.dtype}, the input ${x.dtype}; cast them to one dtype`);
    });
    return x;
  },
  fused,
};
SPECIAL.log_softmax = SPECIAL.softmax;

/**
 * The inference of an op, or undefined when the SDK has none (the coverage test lists those).
 * @param {string} op
 * @returns {Infer|undefined}
 */
export function inferFor(op) {
  if (Object.hasOwn(SPECIAL, op)) return SPECIAL[op];
  const spec = SPEC.ops[op];
  if (!spec || spec.group !== "elementwise") return undefined;
  if (spec.arity === 1) return same;
  if (spec.arity === 2) return spec.result_dtype === "fixed:bool" ? predicate : binary;
  return undefined;
}

/**
 * Arity and dtype checks, then inference (opdef.py OpDef.check). Attributes must be normalised.
 * Throws a GraphError located at the op.
 * @param {string} op @param {TensorType[]} ins @param {Record<string, any>} attrs
 * @returns {TensorType}
 */
export function check(op, ins, attrs) {
  const spec = SPEC.ops[op];
  if (!spec) throw new GraphError(`unknown op ${JSON.stringify(op)}`, { kind: "unknown_op" });
  try {
    if (spec.arity === null) {
      if (ins.length < 1) throw new GraphError("needs at least one input", { kind: "graph" });
    } else if (ins.length !== spec.arity) {
      throw new GraphError(`takes ${spec.arity} input(s), got ${ins.length}`, { kind: "graph" });
    }
    ins.forEach((t, i) => {
      if (!spec.dtypes.includes(t.dtype)) {
        throw dtypeErr(`input ${i} has dtype ${t.dtype}, which ${op} does not accept (accepted: ${[...spec.dtypes].sort().join(", ")})`);
      }
    });
    const infer = inferFor(op);
    if (!infer) throw new GraphError(`the JavaScript SDK has no inference for ${op}`, { kind: "unknown_op" });
    const out = infer(ins, attrs);
    return T([...out.shape], out.dtype);
  } catch (e) {
    if (e instanceof GraphError) throw e.at({ op });
    throw e;
  }
}

/**
 * An op's normalised attributes and result type (infer.py infer_node): what the SDK
 * records for each node. Throws GraphError.
 * @param {string} op @param {TensorType[]} ins @param {Record<string, any>} [attrs]
 * @returns {{attrs: Record<string, any>, type: TensorType}}
 */
export function inferNode(op, ins, attrs = {}) {
  const a = normaliseAttrs(op, attrs);
  const t = check(op, ins, a);
  if (t.shape.length > MAX_RANK) {
    throw new GraphError(`the result would have ${t.shape.length} dimensions, more than the limit of ${MAX_RANK}`, { kind: "limit", op });
  }
  return { attrs: a, type: t };
}
