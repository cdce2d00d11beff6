"""A plugin op engine that passes the conformance kit at start but returns a wrong shape
while serving: the task fails naming the engine, and the executor withdraws the engine's
ops from the registry so placement stops sending them (an executor in this process, on
127.0.0.1, with an in-memory registry)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest

from triplane.engines import registry as engines
from triplane.executor.daemon import Executor
from triplane.proto import dtypes as dt
from triplane.proto.errors import KernelError
from triplane.proto.ir import Attrs, TensorType
from triplane.registry import MemoryBackend, list_op_engines


class _LiesWhenServing:
    """Declares ``neg`` on float32, which the kit has a case for at (3, 4): right there,
    wrong on any other shape."""

    name, device = "flaky", "cpu"
    ops = {"neg": ["float32"]}

    def supports(self, op: str, dtypes: Any = ()) -> bool:
        return op == "neg" and all(d == "float32" for d in dtypes)

    def run(self, op: str, inputs: Any, attrs: Any, out: Any) -> Any:
        x = inputs[0]
        return -x if x.shape == (3, 4) else np.zeros(1, np.float32)

    def benchmark(self) -> dict[str, float]:
        return {"matmul_gflops": 0.0, "elementwise_gbps": 1.0}


def test_an_engine_wrong_while_serving_is_withdrawn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engines, "_op_cache", {"flaky": _LiesWhenServing()})

    async def go() -> tuple[list[Any], list[Any], dict[str, Any]]:
        reg = MemoryBackend()
        ex = Executor(reg, b"s" * 32, memory_bytes=16 << 20, engines=["numpy", "flaky"], name="exf",
                      stats_interval_s=0.05, benchmark_size=32)
        await ex.start()
        try:
            before = await list_op_engines(reg, "exf")
            flaky = ex.op_engines[1]
            with pytest.raises(KernelError, match=r"engine 'flaky' returned float32\[1\] for neg, expected "
                                                  r"float32\[5\]") as e:
                flaky.run("neg", [np.ones(5, np.float32)], Attrs(), TensorType((5,), dt.float32))
            assert e.value.kind == "infra"
            for _ in range(100):
                await asyncio.sleep(0.05)
                after = await list_op_engines(reg, "exf")
                if not next(r for r in after if r.engine == "flaky").ops:
                    break
            entry = await reg.get("stats/exf")
            return before, after, json.loads(entry.value) if entry else {}
        finally:
            await ex.stop()

    before, after, stats = asyncio.run(go())
    assert next(r for r in before if r.engine == "flaky").ops == ("neg",)
    assert next(r for r in after if r.engine == "flaky").ops == ()
    assert "neg" in next(r for r in after if r.engine == "numpy").ops  # the node still runs it, on numpy
    assert [p["name"] for p in stats["plugins"]] == ["flaky"]
