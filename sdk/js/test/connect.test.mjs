// Where connect() goes (Node only): the arguments, else TRIPLANE_URL / TRIPLANE_TOKEN, else
// the run directory of `triplane up` (cluster.json's url and the token file), as tp.connect.
import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { resolveTarget } from "../src/node.js";

function withEnv(vars, fn) {
  const saved = Object.fromEntries(Object.keys(vars).map((k) => [k, process.env[k]]));
  for (const [k, v] of Object.entries(vars)) if (v === undefined) delete process.env[k]; else process.env[k] = v;
  try { return fn(); } finally {
    for (const [k, v] of Object.entries(saved)) if (v === undefined) delete process.env[k]; else process.env[k] = v;
  }
}

const home = mkdtempSync(join(tmpdir(), "tp-js-home-"));
writeFileSync(join(home, "cluster.json"), JSON.stringify({ url: "http://127.0.0.1:5555", executors: [] }));
writeFileSync(join(home, "token"), "tok-from-file\n");
const empty = mkdtempSync(join(tmpdir(), "tp-js-empty-"));

test("arguments first, then the environment, then the run directory", () => {
  withEnv({ TRIPLANE_URL: "http://env:1", TRIPLANE_TOKEN: "env-tok", TRIPLANE_HOME: home }, () => {
    assert.deepEqual(resolveTarget({ url: "http://arg:2", token: "arg-tok" }), { url: "http://arg:2", token: "arg-tok" });
    assert.deepEqual(resolveTarget(), { url: "http://env:1", token: "env-tok" });
  });
  withEnv({ TRIPLANE_URL: undefined, TRIPLANE_TOKEN: undefined, TRIPLANE_HOME: home }, () => {
    assert.deepEqual(resolveTarget(), { url: "http://127.0.0.1:5555", token: "tok-from-file" });
    // the recorded token goes with the recorded URL only
    assert.deepEqual(resolveTarget({ url: "http://127.0.0.1:5555/" }), { url: "http://127.0.0.1:5555/", token: "tok-from-file" });
    assert.deepEqual(resolveTarget({ url: "http://elsewhere:1" }), { url: "http://elsewhere:1", token: null });
  });
});

test("nowhere to connect: an error naming the three places", () => {
  withEnv({ TRIPLANE_URL: undefined, TRIPLANE_TOKEN: undefined, TRIPLANE_HOME: empty }, () => {
    assert.throws(() => resolveTarget(), (e) => {
      assert.equal(e.kind, "request");
      assert.match(e.message, /connect\(\{url, token\}\).*TRIPLANE_URL.*triplane up.*nothing found in/);
      assert.ok(e.message.includes(empty));
      return true;
    });
  });
});
