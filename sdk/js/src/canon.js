// Canonical JSON (proto/README.md, RFC 8785 style): object keys sorted by UTF-16 code
// units, no whitespace, strings escaped as JSON.stringify does, numbers as ECMAScript's
// Number.prototype.toString. In JavaScript the number and escape rules are the language's
// own; what this module adds is the key order, -0 as 0, and refusing what JSON cannot carry.

import { GraphError } from "./errors.js";

const MAX_SAFE = 2 ** 53;
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/** UTF-16 code unit order (JavaScript's own string comparison). @param {string} a @param {string} b */
const byCodeUnits = (a, b) => (a < b ? -1 : a > b ? 1 : 0);

/**
 * The canonical text of a JSON value (objects, arrays, strings, finite numbers, booleans, null).
 * @param {unknown} value
 * @returns {string}
 */
export function canonicalText(value) {
  const out = [];
  emit(value, out);
  return out.join("");
}

/** The canonical UTF-8 bytes of a JSON value. @param {unknown} value */
export function canonicalJson(value) {
  return new TextEncoder().encode(canonicalText(value));
}

/** @param {unknown} v @param {string[]} out */
function emit(v, out) {
  if (v === null) out.push("null");
  else if (v === true) out.push("true");
  else if (v === false) out.push("false");
  else if (typeof v === "number") out.push(esNumber(v));
  else if (typeof v === "bigint") {
    if (v > BigInt(MAX_SAFE) || v < -BigInt(MAX_SAFE)) {
      throw new GraphError(`integer ${v} is beyond +-2**53: not every SDK can represent it exactly (JSON numbers are doubles)`);
    }
    out.push(v.toString());
  } else if (typeof v === "string") out.push(esString(v));
  else if (Array.isArray(v)) {
    out.push("[");
    v.forEach((x, i) => { if (i) out.push(","); emit(x, out); });
    out.push("]");
  } else if (typeof v === "object") {
    const keys = Object.keys(/** @type {object} */ (v)).sort(byCodeUnits);
    out.push("{");
    let first = true;
    for (const k of keys) {
      const x = /** @type {any} */ (v)[k];
      if (x === undefined) continue;
      if (!first) out.push(",");
      first = false;
      out.push(esString(k), ":");
      emit(x, out);
    }
    out.push("}");
  } else throw new GraphError(`cannot encode ${typeof v} in canonical JSON`);
}

/** A number as ECMAScript prints it; NaN and infinities refused; -0 as 0. @param {number} x */
export function esNumber(x) {
  if (!Number.isFinite(x)) throw new GraphError(`${x} is not representable in JSON (use a constant node)`);
  return Object.is(x, -0) ? "0" : String(x);
}

/** @param {string} s */
function esString(s) {
  if (LONE_SURROGATE.test(s)) throw new GraphError("string is not valid Unicode (lone surrogate)");
  return JSON.stringify(s);
}

/**
 * Lowercase hex SHA-256 of bytes (Web Crypto: Node 20 and browsers).
 * @param {Uint8Array} bytes
 */
export async function sha256Hex(bytes) {
  const digest = await globalThis.crypto.subtle.digest("SHA-256", /** @type {BufferSource} */ (bytes));
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}
