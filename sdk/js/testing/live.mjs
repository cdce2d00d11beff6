// The live cluster the node tests run against: TRIPLANE_TEST_URL / TRIPLANE_TEST_TOKEN
// (and TRIPLANE_TEST_READ_TOKEN, a token of role "read", for the 403 case), set by
// tests/integration/sdk/test_js_sdk.py, which starts a local cluster. Unset: the live
// tests skip, saying why.
import { Client } from "../src/index.js";

export const URL_ = process.env.TRIPLANE_TEST_URL || null;
export const TOKEN = process.env.TRIPLANE_TEST_TOKEN || null;
export const READ_TOKEN = process.env.TRIPLANE_TEST_READ_TOKEN || null;
export const SKIP = URL_ ? false
  : "no live cluster: TRIPLANE_TEST_URL is unset (tests/integration/sdk/test_js_sdk.py starts one and sets it)";

/** @param {object} [o] */
export function liveClient(o = {}) {
  return new Client({ url: /** @type {string} */ (URL_), token: TOKEN, ...o });
}
