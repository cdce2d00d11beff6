// Loads the library into a fresh V8 context holding only what a browser page has (fetch,
// AbortController, TextEncoder, crypto, btoa/atob, timers, console: no process, Buffer,
// require, or node: modules) and runs a graph build, a shape error and a hash there.
// Run by test/browser.test.mjs as `node --experimental-vm-modules testing/browserlike.mjs`.
import { readFileSync } from "node:fs";
import { fileURLToPath, pathToFileURL } from "node:url";
import vm from "node:vm";

const g = globalThis;
const context = vm.createContext({
  console, fetch: g.fetch, Response: g.Response, Headers: g.Headers, AbortController, AbortSignal,
  TextEncoder, TextDecoder, crypto: g.crypto, btoa, atob, setTimeout, clearTimeout, URL,
});
const modules = new Map();

function load(url) {
  if (url.startsWith("node:") || !url.startsWith("file:")) throw new Error(`the library imports ${url}`);
  if (!modules.has(url)) {
    const mod = new vm.SourceTextModule(readFileSync(fileURLToPath(url), "utf8"), {
      identifier: url, context, initializeImportMeta(meta) { meta.url = url; },
    });
    modules.set(url, mod);
  }
  return modules.get(url);
}

const index = pathToFileURL(fileURLToPath(new URL("../src/index.js", import.meta.url))).href;
const golden = readFileSync(fileURLToPath(new URL("../../../proto/vectors/graphs/mlp.sha256", import.meta.url)), "utf8").split(/\s/)[0];
const page = new vm.SourceTextModule(`
  import * as tp from ${JSON.stringify(index)};
  if (typeof process !== "undefined" || typeof Buffer !== "undefined" || typeof require !== "undefined") {
    throw new Error("not a browser-like context");
  }
  const x = tp.input({ tensor: "t-9f2c", shape: [4, 3], dtype: "float32" });
  const w = tp.input({ tensor: "t-w", shape: [3, 2], dtype: "float32" });
  const bias = tp.full({ value: 0.1, shape: [2], dtype: "float32" });
  const loss = tp.sum(tp.exp(tp.add(tp.matmul(x, w), bias)), { axes: [-1], keepdims: false });
  const hash = await tp.graphHash([loss]);
  if (hash !== ${JSON.stringify(golden)}) throw new Error("hash " + hash);
  let kind = null;
  try { tp.matmul(x, x); } catch (e) { kind = e.kind + " " + e.message; }
  const c = tp.tensor(new Float32Array([1, 2]), [2]);
  new tp.Client({ url: "http://127.0.0.1:1" });
  console.log("browser-like context: ok;", kind, ";", c.attrs.data);
`, { identifier: "https://app.example/page.mjs", context });
// Node links the whole graph from the root, asking for each import by its referrer.
await page.link((spec, ref) => load(new URL(spec, ref.identifier.startsWith("https:") ? index : ref.identifier).href));
await page.evaluate();
