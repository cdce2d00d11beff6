// No cluster needed: an unreachable scheduler fails within the bounded retries (not a
// hang), and only connection errors are retried (an answered error is not).
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { test } from "node:test";

import * as tp from "../src/index.js";

/** A port nothing listens on (bound, then closed). */
async function deadPort() {
  const srv = createServer();
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  const { port } = srv.address();
  await new Promise((r) => srv.close(r));
  return port;
}

test("an unreachable scheduler: ConnectionError after the bounded retries, quickly", async () => {
  const client = new tp.Client({ url: `http://127.0.0.1:${await deadPort()}`, retries: 3, backoffMs: 50, maxBackoffMs: 200 });
  const started = Date.now();
  await assert.rejects(client.whoami(), (e) => {
    assert.ok(e instanceof tp.ConnectionError, String(e));
    assert.equal(e.kind, "unreachable");
    assert.match(e.message, /cannot reach the scheduler at http:\/\/127\.0\.0\.1:\d+ .*gave up after 4 attempt/);
    return true;
  });
  const took = Date.now() - started;
  assert.ok(took >= 50 + 100 + 200 - 20, `backed off (${took} ms)`);
  assert.ok(took < 5000, `bounded (${took} ms)`);
});

test("connection errors are retried; error answers are not, and carry the server's message", async () => {
  let calls = 0;
  const flaky = async (url, init) => {
    calls += 1;
    if (calls < 3) throw new TypeError("fetch failed", { cause: { code: "ECONNREFUSED" } });
    return new Response(JSON.stringify({ error: { kind: "not_found", message: "no job 'j1'", node: null } }), { status: 404 });
  };
  const client = new tp.Client({ url: "http://x.invalid", fetch: flaky, backoffMs: 1 });
  await assert.rejects(client.json("GET", "/v1/jobs/j1"), (e) => {
    assert.ok(e instanceof tp.ServerError && !(e instanceof tp.AuthError));
    assert.deepEqual([e.status, e.kind, e.message], [404, "not_found", "no job 'j1'"]);
    return true;
  });
  assert.equal(calls, 3, "two connection errors retried, the 404 not");
});

test("an aborted signal stops the retries at once", async () => {
  const client = new tp.Client({ url: `http://127.0.0.1:${await deadPort()}`, retries: 50, backoffMs: 1000 });
  const controller = new AbortController();
  setTimeout(() => controller.abort(), 100);
  const started = Date.now();
  await assert.rejects(client.request("GET", "/v1/whoami", { signal: controller.signal }), { kind: "aborted" });
  assert.ok(Date.now() - started < 1000);
});

test("a POST whose connection broke after it was made is not retried (no second job)", async () => {
  let calls = 0;
  const reset = async () => {
    calls += 1;
    throw new TypeError("fetch failed", { cause: { code: "ECONNRESET" } });
  };
  const client = new tp.Client({ url: "http://x.invalid", fetch: reset, backoffMs: 1 });
  await assert.rejects(client.json("POST", "/v1/jobs", { json: {} }), (e) => {
    assert.ok(e instanceof tp.ConnectionError);
    assert.match(e.message, /not retried, since the scheduler may have received it/);
    return true;
  });
  assert.equal(calls, 1);
  calls = 0;
  await assert.rejects(client.json("GET", "/v1/jobs/j1"), tp.ConnectionError);
  assert.equal(calls, 5, "a GET is retried (4 retries by default)");
});
