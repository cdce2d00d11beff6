"""The plan cache: training steps that differ only in data and node ids share a plan."""

from __future__ import annotations

import numpy as np

from triplane.proto.builder import Builder
from triplane.proto.ir import Graph
from triplane.scheduler.compiler.pipeline import CompileOptions, PlanCache


def _step(prefix: str, w_tensor: str, lr: float = 0.1, reverse: bool = False) -> Graph:
    """loss = sum((x @ w - t)^2); w' = w - lr * dloss/dw, written by hand."""
    b = Builder(prefix=prefix)
    x = b.op("input", tensor=f"{prefix}-x", shape=(4, 3), dtype="float32")
    w = b.op("input", tensor=w_tensor, shape=(3, 2), dtype="float32")
    t = b.op("input", tensor=f"{prefix}-t", shape=(4, 2), dtype="float32")
    r = b.op("sub", b.op("matmul", x, w), t)
    loss = b.op("sum", b.op("mul", r, r))
    gw = b.op("matmul", b.op("transpose", x, perm=[1, 0]), r * 2.0)
    new_w = b.op("sub", w, gw * lr)
    g = b.graph([loss, new_w])
    if reverse:  # same graph, nodes recorded in another order
        g = Graph(dict(reversed(list(g.nodes.items()))), g.outputs)
    return g


def test_training_steps_share_a_canonical_hash_and_a_plan() -> None:
    g1 = _step("a", "w0")
    g2 = _step("b", "w1", reverse=True)  # next step: new ids, new parameter tensor
    assert g1.hash() != g2.hash()
    c1, rename1, args1 = g1.canonical()
    c2, rename2, args2 = g2.canonical()
    assert c1.to_json() == c2.to_json() and c1.hash() == c2.hash()
    assert args1 == ["a-x", "w0", "a-t"] and args2 == ["b-x", "w1", "b-t"]
    assert [rename1[o] for o in g1.outputs] == [rename2[o] for o in g2.outputs]
    cache = PlanCache()
    p1 = cache.get_or_compile(c1)
    p2 = cache.get_or_compile(c2)
    assert p2 is p1 and cache.hits == 1 and cache.misses == 1


def test_a_different_constant_or_options_miss() -> None:
    cache = PlanCache()
    cache.get_or_compile(_step("a", "w").canonical()[0])
    cache.get_or_compile(_step("a", "w", lr=0.01).canonical()[0])
    cache.get_or_compile(_step("a", "w").canonical()[0], CompileOptions(fuse=False))
    assert cache.hits == 0 and cache.misses == 3


def test_cache_evicts_least_recently_used() -> None:
    cache = PlanCache(capacity=2)
    gs = [_step("a", "w", lr=lr).canonical()[0] for lr in (0.1, 0.2, 0.3)]
    cache.get_or_compile(gs[0])
    cache.get_or_compile(gs[1])
    cache.get_or_compile(gs[0])  # hit: gs[1] is now the oldest
    cache.get_or_compile(gs[2])  # evicts gs[1]
    cache.get_or_compile(gs[0])
    assert (cache.hits, cache.misses) == (2, 3)
    cache.get_or_compile(gs[1])
    assert cache.misses == 4


def test_sdk_second_step_is_a_cache_hit() -> None:
    from triplane.embedded import EmbeddedSession
    from triplane.sdk.session import use_session
    from triplane.sdk.tensor import Tensor

    sess = EmbeddedSession()
    rng = np.random.default_rng()
    with use_session(sess):
        for step in range(2):
            x = Tensor.from_array(rng.standard_normal((4, 3)).astype(np.float32))
            w = Tensor.from_array(rng.standard_normal((3, 2)).astype(np.float32))
            y = ((x @ w) * 2.0 + 1.0).exp().numpy()
            np.testing.assert_allclose(y, np.exp((x.numpy() @ w.numpy()) * 2 + 1), rtol=1e-5)
            assert (sess.traces.hits, sess.traces.misses, sess.plans.misses) == (step, 1, 1)
