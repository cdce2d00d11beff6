// Against a live local cluster (skipped, with the reason, when TRIPLANE_TEST_URL is unset):
// upload, submit, wait, fetch, a gradient through the server's grad request and an update
// reading it by ref; and the bad inputs of issue 14: a refused token (the server's 401/403
// message), a job failing on the cluster (the server's message and node), an aborted
// signal (the job is cancelled on the cluster).
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import * as tp from "../src/index.js";
import { READ_TOKEN, SKIP, URL_, liveClient } from "../testing/live.mjs";

const close = (got, want, tol = 1e-5) => {
  assert.equal(got.length, want.length);
  for (let i = 0; i < want.length; i++) {
    assert.ok(Math.abs(got[i] - want[i]) <= tol * (1 + Math.abs(want[i])), `element ${i}: ${got[i]} != ${want[i]}`);
  }
};

describe("live cluster", { skip: SKIP }, () => {
  const client = liveClient();

  test("upload, submit, wait, fetch: (x @ w + 1) and a sum, as the host computes them", async () => {
    const xs = Float32Array.from({ length: 6 }, (_, i) => i + 1);
    const ws = Float32Array.from([1, 0, -1, 2, 0.5, 0.25]);
    const x = await client.upload(xs, [2, 3]);
    const w = await client.upload(ws, [3, 2]);
    const y = x.matmul(w).add(1);
    const s = tp.sum(y);
    const job = await client.submit([y, s]);
    const st = await job.wait();
    assert.equal(st.state, "done");
    const got = await job.fetch(y);
    assert.deepEqual([got.shape, got.dtype], [[2, 2], "float32"]);
    assert.ok(got.data instanceof Float32Array);
    const want = [1 * 1 + 2 * -1 + 3 * 0.5 + 1, 1 * 0 + 2 * 2 + 3 * 0.25 + 1, 4 - 5 + 3 + 1, 0 + 10 + 1.5 + 1];
    close(got.data, want);
    const total = await job.fetch(s);
    assert.deepEqual(total.shape, []);
    close(total.data, [want.reduce((a, b) => a + b)]);
    await job.release();
  });

  test("int64 data round-trips as BigInt64Array", async () => {
    const a = await client.upload(BigInt64Array.from([1n, -2n, 3n, 2n ** 40n]), [4]);
    const { values: [v] } = await client.run([a.add(1)]);
    assert.ok(v.data instanceof BigInt64Array);
    assert.deepEqual([...v.data], [2n, -1n, 4n, 2n ** 40n + 1n]);
  });

  test("gradients through the server's grad request; an SGD step reads them by ref", async () => {
    const xs = Float32Array.from([1, 2, 3, 4, 5, 6]);
    const ws = Float32Array.from([0.5, -1, 2]);
    const x = await client.upload(xs, [2, 3]);
    const w = await client.upload(ws, [3]);
    const loss = tp.mean(tp.square(x.matmul(w)));
    const job = await client.submit([loss], { grad: { of: loss, wrt: [w] } });
    await job.wait();
    // d/dw mean((x w)^2) = 2/N x^T (x w)
    const xw = [0.5 - 2 + 6, 2 - 5 + 12];
    const gw = [0, 1, 2].map((j) => (2 / 2) * (xs[j] * xw[0] + xs[3 + j] * xw[1]));
    const g = await job.fetch(job.grad(w));
    assert.deepEqual(g.shape, [3]);
    close(g.data, gw);
    const step = await client.run([tp.sgdStep(w, job.gradRef(w), 0.1)]);
    close(step.values[0].data, [0, 1, 2].map((j) => ws[j] - 0.1 * gw[j]));
    await job.release();
  });

  test("a refused token: AuthError with the server's 401 message", async () => {
    const bad = liveClient({ token: "not-a-token" });
    await assert.rejects(bad.whoami(), (e) => {
      assert.ok(e instanceof tp.AuthError, String(e));
      assert.equal(e.status, 401);
      assert.equal(e.kind, "unauthorized");
      assert.ok(e.message.length > 0 && !/^HTTP/.test(e.message), e.message);
      return true;
    });
  });

  test("a token whose role may not submit: AuthError with the server's 403 message",
    { skip: READ_TOKEN ? false : "TRIPLANE_TEST_READ_TOKEN is unset (a token of role read)" }, async () => {
      const reader = liveClient({ token: READ_TOKEN });
      await assert.rejects(reader.upload(new Float32Array(2), [2]), (e) => {
        assert.ok(e instanceof tp.AuthError, String(e));
        assert.equal(e.status, 403);
        assert.equal(e.kind, "forbidden");
        assert.match(e.message, /read|role|may not/i);
        return true;
      });
    });

  test("a ref the scheduler does not know: ServerError with its status, kind, message and ref", async () => {
    const x = await client.upload(new Float32Array(6), [2, 3]);
    const wrong = client.ref("j0000000000000000:nothing", [3, 3], "float32");
    await assert.rejects(client.submit([x.matmul(wrong)]), (e) => {
      assert.ok(e instanceof tp.ServerError && !(e instanceof tp.AuthError), String(e));
      assert.deepEqual([e.status, e.kind, e.ref], [404, "not_found", "j0000000000000000:nothing"]);
      assert.match(e.message, /unknown job j0000000000000000/);
      return true;
    });
  });

  test("a job failing on the cluster: JobError with the server's message and node", async () => {
    const logits = await client.upload(new Float32Array(8), [2, 4]);
    const labels = await client.upload(BigInt64Array.from([1n, 99n]), [2]);
    const loss = tp.crossEntropy(logits, labels).named("the_loss");
    const job = await client.submit([loss]);
    await assert.rejects(job.wait(), (e) => {
      assert.ok(e instanceof tp.JobError, String(e));
      assert.equal(e.state, "failed");
      assert.equal(e.kind, "user");
      assert.equal(e.node, "the_loss");
      assert.ok(e.serverMessage.length > 0);
      assert.ok(e.message.includes(e.serverMessage));
      return true;
    });
    await job.release().catch(() => {});
  });

  test("an aborted signal cancels the job on the cluster", async () => {
    let a = tp.uniform({ shape: [1024, 1024], seed: 1 });
    for (let i = 0; i < 24; i++) a = tp.tanh(a.matmul(a));
    const job = await client.submit([tp.sum(a)]);
    const controller = new AbortController();
    setTimeout(() => controller.abort(new Error("user pressed stop")), 200);
    const started = Date.now();
    await assert.rejects(job.wait({ signal: controller.signal }), (e) => {
      assert.ok(e instanceof tp.AbortedError, String(e));
      assert.equal(e.kind, "aborted");
      return true;
    });
    assert.ok(Date.now() - started < 10_000, "the abort ended the wait promptly");
    const st = await job.status();
    assert.equal(st.state, "cancelled", JSON.stringify(st));
  });
});

test("live tests: the cluster they ran against", { skip: SKIP }, () => {
  assert.ok(URL_);
});
