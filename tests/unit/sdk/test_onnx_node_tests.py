"""The ONNX backend node tests (inside the ``onnx`` package) against triplane: the number
that pass must not fall below the floor recorded with docs/onnx.md's table."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("onnx")

from onnx_nodes import PASS_FLOOR, run_all, table

DEADLINE_S = 120.0  # 5 to 30 s here; past it the rest count as failed, and the floor fails


def test_node_tests_pass_count_holds_the_floor() -> None:
    t0 = time.perf_counter()
    results = run_all(deadline_s=DEADLINE_S)
    passed = sum(r.passed for r in results)
    print(table(results))
    print(f"{passed} of {len(results)} ONNX node tests pass ({time.perf_counter() - t0:.1f} s)")
    assert len(results) > 1000  # the package's node tests were found
    assert passed >= PASS_FLOOR, (f"{passed} ONNX node tests pass, fewer than the floor of {PASS_FLOOR} "
                                  "(the table printed above has the reasons, per operator)")
