// The lazy Tensor: a node of a graph (op, inputs, attributes, inferred shape and dtype,
// and where the caller made it), and the graph document a set of outputs spans.

import { canonicalJson, sha256Hex } from "./canon.js";
import { ITEMSIZE, arrayClass, dtypeOfArray, isDType, toBytes } from "./dtypes.js";
import { GraphError } from "./errors.js";
import { inferNode, typeText } from "./infer.js";

/** @typedef {import("./dtypes.js").DType} DType */

let serial = 0;
const LIB = import.meta.url.slice(0, import.meta.url.lastIndexOf("/") + 1);
const FRAME = /((?:file|https?|blob|node):\/\/[^\s()]+?|\/[^\s():]+|[A-Za-z]:\\[^\s():]+):(\d+):(\d+)/;
const BAD_LOC = /[\u0000-\u001f\u007f-\u009f\ud800-\udfff]/;

/**
 * Where the SDK's caller is: "file.mjs:LINE" of the first stack frame outside the SDK
 * (null when the stack says nothing usable).
 * @returns {string|null}
 */
export function callerLoc() {
  const E = /** @type {any} */ (Error);
  const limit = E.stackTraceLimit;
  if (typeof limit === "number" && limit < 40) E.stackTraceLimit = 40;
  const stack = new Error().stack ?? "";
  if (typeof limit === "number") E.stackTraceLimit = limit;
  for (const line of stack.split("\n").slice(1)) {
    const m = FRAME.exec(line);
    if (!m || m[1].startsWith(LIB)) continue;
    const file = m[1].slice(Math.max(m[1].lastIndexOf("/"), m[1].lastIndexOf("\\")) + 1).split(/[?#]/)[0];
    const loc = `${file}:${m[2]}`;
    return loc.length <= 256 && !BAD_LOC.test(loc) ? loc : null;
  }
  return null;
}

/** A node of a lazily built graph. Made by the op functions; nothing runs until a submit. */
export class Tensor {
  /**
   * @param {string} op @param {Tensor[]} inputs @param {Record<string, any>} attrs normalised
   * @param {{shape: number[], dtype: DType}} type @param {string|null} loc
   */
  constructor(op, inputs, attrs, type, loc) {
    /** @readonly */ this.op = op;
    /** @readonly */ this.inputs = inputs;
    /** @readonly */ this.attrs = attrs;
    /** @readonly @type {number[]} */ this.shape = type.shape;
    /** @readonly @type {DType} */ this.dtype = type.dtype;
    /** where the caller made it ("train.mjs:12"), sent as the node's `loc` @type {string|null} */
    this.loc = loc;
    /** @type {string|null} an explicit node id (see named) */
    this.id = null;
    this.serial = ++serial;
  }

  get ndim() { return this.shape.length; }
  get size() { return this.shape.reduce((a, b) => a * b, 1); }
  toString() { return `Tensor(${this.op}, ${typeText(this)})`; }

  /** Give the node an explicit id in the graphs it joins (else n1, n2, ... in creation order). @param {string} id */
  named(id) {
    this.id = id;
    return this;
  }

  /** @param {Tensor|number|boolean} o */ add(o) { return binop("add", this, o); }
  /** @param {Tensor|number|boolean} o */ sub(o) { return binop("sub", this, o); }
  /** @param {Tensor|number|boolean} o */ mul(o) { return binop("mul", this, o); }
  /** @param {Tensor|number|boolean} o */ div(o) { return binop("div", this, o); }
  /** @param {Tensor|number|boolean} o */ pow(o) { return binop("pow", this, o); }
  /** @param {Tensor|number|boolean} o */ maximum(o) { return binop("maximum", this, o); }
  /** @param {Tensor} o */ matmul(o) { return apply("matmul", [this, o], {}); }
  neg() { return apply("neg", [this], {}); }
  exp() { return apply("exp", [this], {}); }
  log() { return apply("log", [this], {}); }
  sqrt() { return apply("sqrt", [this], {}); }
  relu() { return apply("relu", [this], {}); }
  /** @param {{axes?: number|number[]|null, keepdims?: boolean}} [o] */ sum(o = {}) { return apply("sum", [this], o); }
  /** @param {{axes?: number|number[]|null, keepdims?: boolean}} [o] */ mean(o = {}) { return apply("mean", [this], o); }
  /** @param {number[]} shape */ reshape(shape) { return apply("reshape", [this], { shape }); }
  /** @param {number[]} [perm] (default: reversed axes) */
  transpose(perm) { return apply("transpose", [this], { perm: perm ?? [...this.shape.keys()].reverse() }); }
  /** @param {DType} dtype */ cast(dtype) { return dtype === this.dtype ? this : apply("cast", [this], { dtype }); }
}

/**
 * A node of `op` on `inputs`: attributes normalised and the type inferred now, so that a
 * wrong shape throws here (a GraphError naming the input types and the caller's line).
 * @param {string} op @param {Tensor[]} inputs @param {Record<string, any>} [attrs]
 * @returns {Tensor}
 */
export function apply(op, inputs, attrs = {}) {
  const loc = callerLoc();
  if (!Array.isArray(inputs) || inputs.some((t) => !(t instanceof Tensor))) {
    throw new GraphError(`inputs must be Tensors, got ${describe(inputs)}`, { kind: "graph", op, loc });
  }
  try {
    const { attrs: a, type } = inferNode(op, inputs.map((t) => ({ shape: t.shape, dtype: t.dtype })), attrs ?? {});
    return new Tensor(op, inputs, a, type, loc);
  } catch (e) {
    if (e instanceof GraphError) {
      if (inputs.length) e.reason = `${e.reason}; inputs ${inputs.map((t) => typeText(t)).join(", ")}`;
      throw e.at({ op, loc });
    }
    throw e;
  }
}

/** @param {unknown} v */
function describe(v) {
  if (!Array.isArray(v)) return typeof v;
  return `[${v.map((x) => (x instanceof Tensor ? "Tensor" : typeof x)).join(", ")}]`;
}

/** @param {string} op @param {Tensor} x @param {Tensor|number|boolean} o */
function binop(op, x, o) {
  return apply(op, [x, o instanceof Tensor ? o : scalar(o, x.dtype)], {});
}

/**
 * A 0-d tensor holding `value` (a `full` node; NaN, infinities and -0 as a `constant`,
 * since JSON cannot carry them).
 * @param {number|boolean} value @param {DType} [dtype]
 * @returns {Tensor}
 */
export function scalar(value, dtype = "float32") {
  if (typeof value === "number" && (!Number.isFinite(value) || Object.is(value, -0))) {
    if (dtype === "float16" || dtype === "bfloat16") {
      const bits = specialHalf(value, dtype);
      return apply("constant", [], { data: base64(new Uint8Array(new Uint16Array([bits]).buffer)), shape: [], dtype });
    }
    const Cls = arrayClass(dtype);
    if (Cls !== Float32Array && Cls !== Float64Array) throw new GraphError(`${value} is not a ${dtype} value`, { kind: "attr" });
    return apply("constant", [], { data: base64(toBytes(new Cls([value]))), shape: [], dtype });
  }
  return apply("full", [], { value, shape: [], dtype });
}

/** @param {number} v @param {string} dtype */
function specialHalf(v, dtype) {
  const h = dtype === "float16";
  if (Number.isNaN(v)) return h ? 0x7e00 : 0x7fc0;
  if (v === Infinity) return h ? 0x7c00 : 0x7f80;
  if (v === -Infinity) return h ? 0xfc00 : 0xff80;
  return 0x8000;
}

/**
 * A tensor of host data inlined in the graph (a `constant` node; for small data: at most
 * 1 MiB by default on the scheduler; upload anything bigger with Client.upload).
 * @param {ArrayBufferView} data @param {number[]} shape @param {{dtype?: DType}} [o]
 * @returns {Tensor}
 */
export function tensor(data, shape, o = {}) {
  const dtype = o.dtype ?? dtypeOfArray(data);
  if (!isDType(dtype)) throw new TypeError(`unknown dtype ${dtype}`);
  const bytes = toBytes(data);
  const want = shape.reduce((a, b) => a * b, 1) * ITEMSIZE[dtype];
  if (bytes.byteLength !== want) {
    throw new GraphError(`data holds ${bytes.byteLength} bytes; ${dtype}${JSON.stringify(shape)} needs ${want}`, { kind: "shape", op: "constant", loc: callerLoc() });
  }
  return apply("constant", [], { data: base64(bytes), shape, dtype });
}

/** Standard padded base64 of bytes (btoa, so it works in browsers). @param {Uint8Array} bytes */
export function base64(bytes) {
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

/** Standard base64 to bytes. @param {string} text */
export function unbase64(text) {
  const s = atob(text);
  const out = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
  return out;
}

/**
 * The graph `outputs` span, as a document: nodes named by their explicit id or
 * `<prefix><k>` (k = 1, 2, ... in creation order, skipping explicit ids).
 * @param {Tensor[]} outputs @param {{prefix?: string, loc?: boolean}} [o] loc: add each node's `loc` (the wire form)
 * @returns {{doc: {version: number, nodes: Record<string, any>, outputs: string[]}, ids: Map<Tensor, string>}}
 */
export function buildGraph(outputs, o = {}) {
  const prefix = o.prefix ?? "n";
  /** @type {Set<Tensor>} */
  const seen = new Set();
  const stack = [...outputs];
  while (stack.length) {
    const t = /** @type {Tensor} */ (stack.pop());
    if (!(t instanceof Tensor)) throw new GraphError(`an output is not a Tensor: ${typeof t}`);
    if (seen.has(t)) continue;
    seen.add(t);
    stack.push(...t.inputs);
  }
  const all = [...seen].sort((a, b) => a.serial - b.serial);
  const taken = new Set(all.filter((t) => t.id !== null).map((t) => t.id));
  /** @type {Map<Tensor, string>} */
  const ids = new Map();
  const owner = new Map();
  let k = 0;
  for (const t of all) {
    let id = t.id;
    if (id === null) {
      do id = `${prefix}${++k}`; while (taken.has(id));
    } else if (owner.has(id) && owner.get(id) !== t) {
      throw new GraphError(`two nodes are named ${JSON.stringify(id)}`, { kind: "graph" });
    }
    owner.set(id, t);
    ids.set(t, id);
  }
  /** @type {Record<string, any>} */
  const nodes = {};
  for (const t of all) {
    /** @type {Record<string, any>} */
    const n = { op: t.op };
    if (t.inputs.length) n.inputs = t.inputs.map((i) => /** @type {string} */ (ids.get(i)));
    if (Object.keys(t.attrs).length) n.attrs = t.attrs;
    n.shape = t.shape;
    n.dtype = t.dtype;
    if (o.loc && t.loc) n.loc = t.loc;
    nodes[/** @type {string} */ (ids.get(t))] = n;
  }
  return { doc: { version: 1, nodes, outputs: outputs.map((t) => /** @type {string} */ (ids.get(t))) }, ids };
}

/** The canonical JSON bytes of the graph `outputs` span (proto/README.md). @param {Tensor[]} outputs @param {{prefix?: string}} [o] */
export function graphJson(outputs, o = {}) {
  return canonicalJson(buildGraph(outputs, o).doc);
}

/** The graph's name: hex SHA-256 of its canonical JSON. @param {Tensor[]} outputs @param {{prefix?: string}} [o] */
export function graphHash(outputs, o = {}) {
  return sha256Hex(graphJson(outputs, o));
}
