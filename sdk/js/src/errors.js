// The errors the SDK throws, in one tree (each with a machine-readable `kind`):
//
//   TriplaneError              base
//   ├── GraphError             a node the SDK built does not infer (kind: shape, dtype, attr,
//   │                          graph, limit, unknown_op); thrown at the call that made it
//   ├── ServerError            the scheduler answered an error: its status, kind, message, node, op
//   │   └── AuthError          401 / 403 (kind unauthorized / forbidden)
//   ├── JobError               a job failed or was cancelled on the cluster: the job's error
//   │                          (kind user, infra, deadline, lost, cancelled), message, node, op
//   ├── ConnectionError        the scheduler could not be reached within the bounded retries
//   └── AbortedError           an AbortSignal fired (kind "aborted"); the job was cancelled

/** Base of every error the SDK throws on purpose. */
export class TriplaneError extends Error {
  /** @param {string} message @param {{kind?: string, node?: string|null, op?: string|null, cause?: unknown}} [o] */
  constructor(message, o = {}) {
    super(message, o.cause === undefined ? undefined : { cause: o.cause });
    this.name = new.target.name;
    /** machine-readable word ("shape", "unauthorized", "user", ...) @type {string} */
    this.kind = o.kind ?? "internal";
    /** the graph node it is about, when it is about one @type {string|null} */
    this.node = o.node ?? null;
    /** @type {string|null} */
    this.op = o.op ?? null;
  }
}

/** A node that does not infer (thrown where the op was called). */
export class GraphError extends TriplaneError {
  /**
   * @param {string} reason what is wrong, without the location
   * @param {{kind?: string, node?: string|null, op?: string|null, loc?: string|null}} [o]
   */
  constructor(reason, o = {}) {
    super(reason, { kind: o.kind ?? "graph", node: o.node, op: o.op });
    this.reason = reason;
    /** where the SDK's caller made the node ("train.mjs:12") @type {string|null} */
    this.loc = o.loc ?? null;
    this.message = this.compose();
  }

  compose() {
    let prefix = "";
    if (this.node != null && this.op != null) prefix = `node '${this.node}' (${this.op}): `;
    else if (this.op != null) prefix = `${this.op}: `;
    return `${prefix}${this.reason}${this.loc ? ` (at ${this.loc})` : ""}`;
  }

  /** Locate the error (fields already set are kept). @param {{node?: string, op?: string, loc?: string|null}} o */
  at(o) {
    this.node ??= o.node ?? null;
    this.op ??= o.op ?? null;
    this.loc ??= o.loc ?? null;
    this.message = this.compose();
    return this;
  }
}

/** An error answer of the scheduler. */
export class ServerError extends TriplaneError {
  /** @param {number} status @param {{kind?: string, message?: string, node?: string|null, op?: string|null, ref?: string|null}} body */
  constructor(status, body) {
    super(body.message ?? `HTTP ${status}`, { kind: body.kind ?? "internal", node: body.node, op: body.op });
    /** the HTTP status @type {number} */
    this.status = status;
    /** the ref the error is about (kind not_found / lost) @type {string|null} */
    this.ref = body.ref ?? null;
  }
}

/** 401 (missing or wrong token) or 403 (the token's role may not do this). */
export class AuthError extends ServerError {}

/** A job that failed or was cancelled on the cluster. */
export class JobError extends TriplaneError {
  /** @param {string} job @param {string} state @param {{kind?: string, message?: string, node?: string|null, op?: string|null}|null} error */
  constructor(job, state, error) {
    const e = error ?? {};
    super(`job ${job} ${state}: ${e.message ?? "(no message)"}`, { kind: e.kind ?? state, node: e.node, op: e.op });
    this.job = job;
    this.state = state;
    /** the server's message, as it gave it @type {string} */
    this.serverMessage = e.message ?? "";
  }
}

/** The scheduler could not be reached (after the bounded retries). */
export class ConnectionError extends TriplaneError {
  /** @param {string} message @param {unknown} [cause] */
  constructor(message, cause) {
    super(message, { kind: "unreachable", cause });
  }
}

/** The caller's AbortSignal fired; the job (if any) was cancelled on the cluster. */
export class AbortedError extends TriplaneError {
  /** @param {string} message @param {unknown} [cause] */
  constructor(message, cause) {
    super(message, { kind: "aborted", cause });
  }
}
