"""A job's intermediates go as soon as their readers are done (docs/scheduler.md,
"Intermediates"), on a real local cluster: a chain of matmuls whose intermediates add up
to more than the executor's memory completes, equals numpy, and leaves the executor's
memory where it was (``memory.free`` from ``GET /v1/nodes``, published every second)."""

from __future__ import annotations

import numpy as np
from cluster_memory import settled_free

import triplane as tp
from triplane.sdk.remote import RemoteSession
from triplane.sdk.session import use_session

MIB = 1 << 20


def test_a_matmul_chain_larger_than_executor_memory_completes(start_cluster) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    n, steps = 512, 120  # 120 intermediates of 1 MiB (float32) on one executor of 64 MiB
    x0 = rng.standard_normal((n, n)).astype(np.float32)
    w0 = (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)
    want = x0
    for _ in range(steps):
        want = np.tanh(want @ w0)
    with start_cluster(bound_s=180.0, executors=1, memory="64MiB") as c:
        base = settled_free(c)
        with RemoteSession(c.url, c.token, poll_s=0.2) as s, use_session(s):
            x, w = tp.tensor(x0), tp.tensor(w0)
            for _ in range(steps):
                x = tp.tanh(x @ w)
            got = x.numpy()
            del x, w
            s.keeper.flush()
            after = settled_free(c, base)
        print(f"\nexecutor free bytes: {base} before, {after} after {steps} matmuls of {n}x{n}")
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
        assert after == base
