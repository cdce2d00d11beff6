// Dtypes of the op table (proto/ops.json "dtypes") and the typed arrays that hold them.

/** @typedef {"float16"|"bfloat16"|"float32"|"float64"|"int8"|"int16"|"int32"|"int64"|"uint8"|"bool"} DType */

/** Every dtype, in the op table's order. @type {DType[]} */
export const DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"];

/** Bytes per element. @type {Record<DType, number>} */
export const ITEMSIZE = {
  float16: 2, bfloat16: 2, float32: 4, float64: 8, int8: 1, int16: 2, int32: 4, int64: 8, uint8: 1, bool: 1,
};

export const FLOATS = new Set(["float16", "bfloat16", "float32", "float64"]);
export const INTS = new Set(["int8", "int16", "int32", "int64", "uint8"]);

/** @param {string} d */
export const isFloat = (d) => FLOATS.has(d);
/** @param {string} d */
export const isInt = (d) => INTS.has(d);
/** @param {unknown} d @returns {d is DType} */
export const isDType = (d) => typeof d === "string" && Object.hasOwn(ITEMSIZE, d);

/**
 * The typed array class holding a dtype's elements (float16/bfloat16 travel as their raw
 * bits in a Uint16Array; bool as 0/1 bytes in a Uint8Array).
 * @param {DType} dtype
 */
export function arrayClass(dtype) {
  switch (dtype) {
    case "float32": return Float32Array;
    case "float64": return Float64Array;
    case "int8": return Int8Array;
    case "int16": return Int16Array;
    case "int32": return Int32Array;
    case "int64": return BigInt64Array;
    case "uint8": return Uint8Array;
    case "bool": return Uint8Array;
    case "float16": case "bfloat16": return Uint16Array;
    default: throw new TypeError(`unknown dtype ${JSON.stringify(dtype)} (known: ${DTYPES.join(", ")})`);
  }
}

/**
 * The dtype a typed array holds by default (Uint8Array: uint8; Uint16Array: ask for float16).
 * @param {ArrayBufferView} data
 * @returns {DType}
 */
export function dtypeOfArray(data) {
  if (data instanceof Float32Array) return "float32";
  if (data instanceof Float64Array) return "float64";
  if (data instanceof BigInt64Array) return "int64";
  if (data instanceof Int32Array) return "int32";
  if (data instanceof Int16Array) return "int16";
  if (data instanceof Int8Array) return "int8";
  if (data instanceof Uint8Array) return "uint8";
  throw new TypeError(`no dtype for ${data?.constructor?.name ?? typeof data}: pass {dtype} with a typed array `
    + "(Float32Array, Float64Array, BigInt64Array, Int32Array, Int16Array, Int8Array, Uint8Array, Uint16Array)");
}

/** Little-endian bytes of a typed array (a copy only on a big-endian host). @param {ArrayBufferView} data */
export function toBytes(data) {
  const bytes = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  if (LITTLE_ENDIAN || bytesPer(data) === 1) return bytes;
  const out = new Uint8Array(bytes);
  const k = bytesPer(data);
  for (let i = 0; i < out.length; i += k) out.subarray(i, i + k).reverse();
  return out;
}

/**
 * A typed array of `dtype` over little-endian bytes (copied, so it is aligned).
 * @param {Uint8Array} bytes @param {DType} dtype
 */
export function fromBytes(bytes, dtype) {
  const Cls = arrayClass(dtype);
  const k = ITEMSIZE[dtype];
  if (bytes.byteLength % k) throw new RangeError(`${bytes.byteLength} bytes do not hold whole ${dtype} elements`);
  const copy = new Uint8Array(bytes);
  if (!LITTLE_ENDIAN && k > 1) for (let i = 0; i < copy.length; i += k) copy.subarray(i, i + k).reverse();
  return new Cls(copy.buffer, 0, copy.byteLength / k);
}

/** @param {ArrayBufferView} data */
function bytesPer(data) {
  return /** @type {any} */ (data).BYTES_PER_ELEMENT ?? 1;
}

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;
