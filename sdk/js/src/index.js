// triplane for JavaScript: build graphs with the op table's ops (shapes checked at each
// call), upload typed arrays, submit, wait, fetch, train. Browser and Node 20+; no
// dependencies. Node-only helpers (environment, run directory) are in "triplane/node".

export * from "./ops.gen.js";
export * as ops from "./ops.gen.js";
export { SPEC } from "./spec.gen.js";
export { Tensor, apply, scalar, tensor, buildGraph, graphJson, graphHash, base64, unbase64, callerLoc } from "./tensor.js";
export { inferNode, normaliseAttrs, broadcastShapes, MAX_RANK } from "./infer.js";
export { canonicalJson, canonicalText, esNumber, sha256Hex } from "./canon.js";
export { DTYPES, ITEMSIZE, arrayClass, dtypeOfArray } from "./dtypes.js";
export { TriplaneError, GraphError, ServerError, AuthError, JobError, ConnectionError, AbortedError } from "./errors.js";
export { Client, Job } from "./client.js";

export { Linear, crossEntropy, softmax, relu, sgdStep, Adam, mulberry32 } from "./nn.js";
