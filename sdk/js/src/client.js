// The REST client (docs/runtime.md, "The REST API"): upload typed arrays, submit graphs
// (with the server's `grad` request), wait (AbortSignal: an abort cancels the job on the
// cluster), fetch, cancel. Built-in fetch only, so it runs unchanged in a browser.

import { ITEMSIZE, dtypeOfArray, fromBytes, isDType, toBytes } from "./dtypes.js";
import { AbortedError, AuthError, ConnectionError, GraphError, JobError, ServerError, TriplaneError } from "./errors.js";
import { Tensor, apply, buildGraph, callerLoc } from "./tensor.js";

/** @typedef {import("./dtypes.js").DType} DType */
/** @typedef {{data: ArrayBufferView & ArrayLike<number|bigint>, shape: number[], dtype: DType}} HostTensor */
/** @typedef {{retries?: number, backoffMs?: number, maxBackoffMs?: number}} RetryPolicy */

const TERMINAL = new Set(["done", "failed", "cancelled"]);
const WAIT_SLICE_S = 10;
// Connection errors after which a request may have reached the server (Node's codes; a
// browser's fetch says nothing, and its errors count as never sent).
const MAYBE_ARRIVED = new Set(["ECONNRESET", "EPIPE", "ETIMEDOUT", "UND_ERR_SOCKET", "UND_ERR_CLOSED"]);

/** A client of one scheduler. */
export class Client {
  /**
   * @param {{url: string, token?: string|null, fetch?: typeof fetch} & RetryPolicy} o
   *   retries: attempts after the first on a connection error (default 4); backoffMs: the
   *   first pause, doubled each time up to maxBackoffMs (defaults 100 and 2000 ms). Errors
   *   the server answered (4xx, 5xx) are never retried, nor a POST whose connection broke
   *   after it was made (the scheduler may have received it).
   */
  constructor(o) {
    if (!o || typeof o.url !== "string" || !/^https?:\/\//.test(o.url)) {
      throw new TypeError(`Client needs {url: "http://host:port"}, got ${JSON.stringify(o?.url)}`);
    }
    this.url = o.url.replace(/\/+$/, "");
    this.token = o.token ?? null;
    this.retries = o.retries ?? 4;
    this.backoffMs = o.backoffMs ?? 100;
    this.maxBackoffMs = o.maxBackoffMs ?? 2000;
    this.fetchImpl = o.fetch ?? globalThis.fetch.bind(globalThis);
  }

  /**
   * One request, retried with bounded backoff when the scheduler cannot be reached; an
   * error answer throws ServerError (AuthError for 401/403) with the server's message.
   * @param {string} method @param {string} path
   * @param {{json?: unknown, body?: BodyInit, headers?: Record<string, string>, signal?: AbortSignal}} [o]
   * @returns {Promise<Response>}
   */
  async request(method, path, o = {}) {
    /** @type {Record<string, string>} */
    const headers = { ...(o.headers ?? {}) };
    if (this.token) headers.authorization = `Bearer ${this.token}`;
    let body = o.body;
    if (o.json !== undefined) {
      headers["content-type"] = "application/json";
      body = JSON.stringify(o.json);
    }
    let pause = this.backoffMs;
    for (let attempt = 0; ; attempt++) {
      let res;
      try {
        res = await this.fetchImpl(this.url + path, { method, headers, body, signal: o.signal });
      } catch (e) {
        if (o.signal?.aborted) throw new AbortedError(`${method} ${path}: aborted`, o.signal.reason);
        if (method === "POST" && MAYBE_ARRIVED.has(codeOf(e))) {
          // The connection broke after it was made: the scheduler may have acted on it, and a
          // second submit would make a second job. Only a request that never left is retried.
          throw new ConnectionError(`the connection to ${this.url} broke during ${method} ${path} `
            + `(${causeText(e)}); not retried, since the scheduler may have received it`, e);
        }
        if (attempt >= this.retries) {
          throw new ConnectionError(`cannot reach the scheduler at ${this.url} (${method} ${path}): `
            + `${causeText(e)}; gave up after ${attempt + 1} attempt(s)`, e);
        }
        await sleep(pause, o.signal);
        pause = Math.min(pause * 2, this.maxBackoffMs);
        continue;
      }
      if (res.ok) return res;
      throw await errorOf(res, method, path);
    }
  }

  /**
   * A request whose answer is JSON (parsed).
   * @param {string} method @param {string} path
   * @param {{json?: unknown, body?: BodyInit, headers?: Record<string, string>, signal?: AbortSignal}} [o]
   * @returns {Promise<any>}
   */
  async json(method, path, o) {
    return (await this.request(method, path, o)).json();
  }

  /** `GET /v1/health` (no token needed). */
  health() { return this.json("GET", "/v1/health"); }

  /** `GET /v1/whoami`: the token's name and role (a refused token throws AuthError). */
  whoami() { return this.json("GET", "/v1/whoami"); }

  /**
   * Upload host data (`POST /v1/tensors`); returns an `input` Tensor bound to it.
   * @param {ArrayBufferView} data a typed array (Float32Array, Float64Array, BigInt64Array, Int32Array, ...)
   * @param {number[]} shape @param {{dtype?: DType, signal?: AbortSignal}} [o]
   * @returns {Promise<Tensor>}
   */
  async upload(data, shape, o = {}) {
    const loc = callerLoc();
    const dtype = o.dtype ?? dtypeOfArray(data);
    if (!isDType(dtype)) throw new TypeError(`unknown dtype ${JSON.stringify(dtype)}`);
    checkShape(shape, loc);
    const bytes = toBytes(data);
    const want = shape.reduce((a, b) => a * b, 1) * ITEMSIZE[dtype];
    if (bytes.byteLength !== want) {
      throw new GraphError(`data holds ${bytes.byteLength} bytes; ${dtype}[${shape.join(", ")}] needs ${want}`, { kind: "shape", op: "input", loc });
    }
    const res = await this.json("POST", "/v1/tensors", {
      body: /** @type {BodyInit} */ (/** @type {unknown} */ (bytes)), signal: o.signal,
      headers: { "content-type": "application/octet-stream", "x-triplane-shape": shape.join(","), "x-triplane-dtype": dtype },
    });
    const t = apply("input", [], { tensor: res.id, shape, dtype });
    t.loc = loc;
    return t;
  }

  /** Release an upload (`DELETE /v1/tensors/{id}`). @param {Tensor|string} t */
  async releaseUpload(t) {
    const id = t instanceof Tensor ? t.attrs.tensor : t;
    return this.json("DELETE", `/v1/tensors/${encodeURIComponent(id)}`);
  }

  /**
   * An `input` Tensor bound to a ref, "<job>:<name>" (a done job's output, read where it lives).
   * @param {string} ref @param {number[]} shape @param {DType} dtype
   */
  ref(ref, shape, dtype) {
    return apply("input", [], { tensor: ref, shape, dtype });
  }

  /**
   * Submit the graph `outputs` span (`POST /v1/jobs`), fetching `outputs` (and `fetch`);
   * `grad` asks the server for d of / d w of each `wrt` (fetched as `job.grad(w)`).
   * @param {Tensor[]} outputs
   * @param {{fetch?: Tensor[], grad?: {of: Tensor, wrt: Tensor[]}, deadlineS?: number, signal?: AbortSignal}} [o]
   * @returns {Promise<Job>}
   */
  async submit(outputs, o = {}) {
    const roots = [...outputs, ...(o.fetch ?? []), ...(o.grad ? [o.grad.of, ...o.grad.wrt] : [])];
    const { doc, ids } = buildGraph(roots, { loc: true });
    doc.outputs = doc.outputs.slice(0, outputs.length);
    const fetchIds = [...new Set([...outputs, ...(o.fetch ?? [])].map((t) => /** @type {string} */ (ids.get(t))))];
    /** @type {Record<string, unknown>} */
    const body = { graph: doc, fetch: fetchIds };
    if (o.grad) body.grad = { of: ids.get(o.grad.of), wrt: o.grad.wrt.map((w) => ids.get(w)) };
    if (o.deadlineS !== undefined) body.deadline_s = o.deadlineS;
    const res = await this.json("POST", "/v1/jobs", { json: body, signal: o.signal });
    return new Job(this, res.id, ids);
  }

  /**
   * Submit, wait, fetch every output (and gradient), release the job.
   * @param {Tensor[]} outputs
   * @param {{grad?: {of: Tensor, wrt: Tensor[]}, signal?: AbortSignal, deadlineS?: number}} [o]
   * @returns {Promise<{values: HostTensor[], grads: HostTensor[]}>}
   */
  async run(outputs, o = {}) {
    const job = await this.submit(outputs, o);
    try {
      await job.wait({ signal: o.signal });
      const values = await Promise.all(outputs.map((t) => job.fetch(t)));
      const grads = await Promise.all((o.grad?.wrt ?? []).map((w) => job.fetch(job.grad(w))));
      return { values, grads };
    } finally {
      if (!o.signal?.aborted) await job.release().catch(() => {});
    }
  }
}

/** A submitted job. */
export class Job {
  /** @param {Client} client @param {string} id @param {Map<Tensor, string>} ids */
  constructor(client, id, ids) {
    this.client = client;
    /** @readonly */ this.id = id;
    this.ids = ids;
  }

  /** The fetched name of a gradient the job's grad request asked for. @param {Tensor} w */
  grad(w) {
    return `grad:${this.nameOf(w)}`;
  }

  /** @param {Tensor|string} t */
  nameOf(t) {
    if (typeof t === "string") return t;
    const id = this.ids.get(t);
    if (id === undefined) throw new TriplaneError(`${t} is not a node of job ${this.id}`, { kind: "request" });
    return id;
  }

  /**
   * An `input` Tensor reading this job's fetched value in place (a ref): `t` a fetched
   * Tensor, or a gradient's name with its Tensor `like` giving the type.
   * @param {Tensor|string} t @param {Tensor} [like]
   */
  ref(t, like) {
    const type = t instanceof Tensor ? t : like;
    if (!type) throw new TypeError("ref(name, like): give the Tensor whose type the value has");
    return this.client.ref(`${this.id}:${this.nameOf(t)}`, type.shape, type.dtype);
  }

  /** The input reading d of / d w on the cluster (for an update in the next job). @param {Tensor} w */
  gradRef(w) {
    return this.ref(this.grad(w), w);
  }

  /** `GET /v1/jobs/{id}`. */
  status() {
    return this.client.json("GET", `/v1/jobs/${this.id}`);
  }

  /**
   * Wait until the job ends; throws JobError (the server's kind, message and node) when it
   * failed or was cancelled. An aborted `signal` cancels the job on the cluster and throws
   * AbortedError.
   * @param {{signal?: AbortSignal, timeoutS?: number}} [o]
   */
  async wait(o = {}) {
    const { signal } = o;
    const until = o.timeoutS === undefined ? Infinity : Date.now() + o.timeoutS * 1000;
    try {
      for (;;) {
        signal?.throwIfAborted();
        const left = Math.max(0, Math.min(WAIT_SLICE_S, (until - Date.now()) / 1000));
        const st = await this.client.json("GET", `/v1/jobs/${this.id}/wait?timeout=${left.toFixed(3)}`, { signal });
        if (st.state === "done") return st;
        if (TERMINAL.has(st.state)) throw new JobError(this.id, st.state, st.error);
        if (Date.now() >= until) throw new TriplaneError(`job ${this.id} still ${st.state} after ${o.timeoutS} s`, { kind: "timeout" });
      }
    } catch (e) {
      if (signal?.aborted && !(e instanceof JobError)) {
        await this.cancel().catch(() => {});
        throw new AbortedError(`job ${this.id}: aborted by the caller; cancelled on the cluster`, signal.reason);
      }
      throw e;
    }
  }

  /**
   * A fetched value (`GET /v1/jobs/{id}/tensors/{name}`) as a typed array with its shape.
   * @param {Tensor|string} t a Tensor of the job's fetch list, or a name ("grad:n3")
   * @param {{signal?: AbortSignal}} [o]
   * @returns {Promise<HostTensor>}
   */
  async fetch(t, o = {}) {
    const res = await this.client.request("GET", `/v1/jobs/${this.id}/tensors/${encodeURIComponent(this.nameOf(t))}`, o);
    const header = res.headers.get("x-triplane-shape") ?? "";
    const shape = header === "" ? [] : header.split(",").map(Number);
    const dtype = /** @type {DType} */ (res.headers.get("x-triplane-dtype"));
    const bytes = new Uint8Array(await res.arrayBuffer());
    return { data: /** @type {any} */ (fromBytes(bytes, dtype)), shape, dtype };
  }

  /** Cancel the job and release its values (`DELETE /v1/jobs/{id}`). */
  cancel() {
    return this.client.json("DELETE", `/v1/jobs/${this.id}`);
  }

  /** Release a finished job's values (the same request as cancel). */
  release() {
    return this.cancel();
  }
}

/** @param {unknown} shape @param {string|null} loc */
function checkShape(shape, loc) {
  if (!Array.isArray(shape) || !shape.every((d) => Number.isInteger(d) && d >= 0)) {
    throw new GraphError(`shape must be a list of non-negative integers, got ${JSON.stringify(shape)}`, { kind: "shape", op: "input", loc });
  }
}

/** @param {Response} res @param {string} method @param {string} path */
async function errorOf(res, method, path) {
  let body = {};
  const text = await res.text().catch(() => "");
  try {
    const parsed = JSON.parse(text);
    body = parsed?.error ?? parsed ?? {};
  } catch {
    body = { message: text.slice(0, 500) || res.statusText };
  }
  if (typeof body !== "object" || body === null) body = { message: String(body) };
  const b = /** @type {any} */ (body);
  b.message = b.message ?? `${method} ${path}: HTTP ${res.status}`;
  b.kind = b.kind ?? (res.status === 401 ? "unauthorized" : res.status === 403 ? "forbidden" : "internal");
  return res.status === 401 || res.status === 403 ? new AuthError(res.status, b) : new ServerError(res.status, b);
}

/** @param {unknown} e */
function codeOf(e) {
  const err = /** @type {any} */ (e);
  return err?.cause?.code ?? err?.code ?? null;
}

/** @param {unknown} e */
function causeText(e) {
  const err = /** @type {any} */ (e);
  const cause = err?.cause;
  return [err?.message, cause?.code ?? cause?.message].filter(Boolean).join(": ") || String(e);
}

/** @param {number} ms @param {AbortSignal} [signal] */
function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(timer);
      reject(new AbortedError("aborted while retrying", signal.reason));
    }, { once: true });
  });
}
