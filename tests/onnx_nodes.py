"""The ONNX backend node tests (shipped inside the ``onnx`` package) run against triplane.

Each node test is an ONNX model of one operator (or an operator's function expanded
into others, ``*_expanded``) with input and expected output arrays. A test passes when
:class:`~triplane.sdk.onnx.backend.TriplaneBackend` prepares it and every data set's
outputs match, as onnx's own runner checks them (``Runner.assert_similar_outputs``:
same count, shape and dtype, values within the test's ``rtol``/``atol``).

``python tests/onnx_nodes.py`` prints the pass count per operator and the reason of each
failing group (the table of docs/onnx.md); ``tests/unit/sdk/test_onnx_node_tests.py``
runs them all and holds the total above :data:`PASS_FLOOR`.
"""

from __future__ import annotations

import re
import sys
import time
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

# The count of node tests that passed when docs/onnx.md was last written (onnx 1.23.2):
# the test fails when fewer pass. Raise it when more do.
PASS_FLOOR = 1151


@dataclass
class Result:
    name: str
    op: str
    passed: bool
    reason: str  # "" when passed: a short, groupable cause otherwise


def cases() -> list:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_model_tests(kind="node")


def _op_of(case, singles: dict[str, str]) -> str:
    base = re.sub(r"_expanded(_ver\d+)?$", "", case.name)
    if base != case.name and base in singles:
        return singles[base]
    ops = [n.op_type for n in case.model.graph.node]
    return ops[0] if len(set(ops)) == 1 else singles.get(base, ops[0] if ops else "?")


def _reason(e: BaseException) -> str:
    from triplane.sdk.onnx import Unsupported

    msg = str(e).splitlines()[0] if str(e) else ""
    m = re.search(r"unsupported dtype dtype\(\'?(\w+)|element type (\w+) is not one of", msg)
    if m:
        return f"dtype {(m.group(1) or m.group(2)).lower().replace('_', '')} is not one of triplane's"
    if isinstance(e, Unsupported):
        m = re.match(r"ONNX operator\(s\) not supported by triplane: (.*?)\. triplane imports", msg)
        if m:
            ops = sorted({p.split(" (node")[0] for p in m.group(1).split("; ")})
            return "operator not in the op map: " + ", ".join(ops)
        return "unsupported form: " + msg.removeprefix("ONNX ")[:120]
    if isinstance(e, AssertionError):
        if "shape" in msg:
            return "output shape differs"
        if "dtype" in msg or "DTypes" in str(e) or "Items are not equal" in str(e):
            return "output dtype differs"
        return "output values differ"
    msg = re.sub(r" \(at [^)]*\)| \(made at [^)]*\)", "", msg)
    return f"{type(e).__name__}: " + re.sub(r"\d+", "N", msg)[:120]


def run_case(case) -> tuple[bool, str]:
    from onnx.backend.test.runner import Runner

    try:
        from onnx.backend.test.runner import _normalize_tensor as norm
    except ImportError:  # an onnx without the helper: arrays as they are
        def norm(x):
            return x

    from triplane.sdk.onnx.backend import TriplaneBackend

    try:
        rep = TriplaneBackend.prepare(case.model, "CPU")
        for inputs, refs in case.data_sets:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                outs = rep.run([norm(x) for x in inputs])
            Runner.assert_similar_outputs([norm(r) for r in refs], outs, rtol=case.rtol, atol=case.atol)
    except Exception as e:  # every failure is a result to count, never a crash of the run
        return False, _reason(e)
    return True, ""


def run_all(deadline_s: float | None = None) -> list[Result]:
    """Every node test's result; after ``deadline_s`` seconds the rest are not run (each
    counted as failed: "not run: past the time bound")."""
    all_cases = cases()
    singles = {c.name: c.model.graph.node[0].op_type for c in all_cases if len(c.model.graph.node) == 1}
    end = None if deadline_s is None else time.monotonic() + deadline_s
    out = []
    for c in all_cases:
        if end is not None and time.monotonic() > end:
            out.append(Result(c.name, _op_of(c, singles), False, "not run: past the time bound"))
        else:
            out.append(Result(c.name, _op_of(c, singles), *run_case(c)))
    return out


def table(results: list[Result]) -> str:
    """Markdown: per operator with a test that passes, passed / total and the reasons of
    its failures; then the operators with none: those outside the op map in one line,
    each other with its reasons."""
    by_op: dict[str, list[Result]] = defaultdict(list)
    for r in results:
        by_op[r.op].append(r)
    rows = ["| operator | passed | of | why the others fail (tests) |", "|---|---|---|---|"]
    unmapped: list[str] = []
    others: list[str] = []
    for op in sorted(by_op):
        rs = by_op[op]
        ok = sum(r.passed for r in rs)
        why = Counter(r.reason for r in rs if not r.passed)
        text = "; ".join(f"{k} ({v})" for k, v in why.most_common())
        if ok:
            rows.append(f"| {op} | {ok} | {len(rs)} | {text} |")
        elif set(why) == {"operator not in the op map: " + op} or all(
                re.fullmatch(rf"operator not in the op map: [\w.]*\b{op}", k) for k in why):
            unmapped.append(f"{op} ({len(rs)})")
        else:
            others.append(f"* {op} ({len(rs)}): {text}")
    rows += ["", f"Operators none of whose tests pass (tests): not in the op map: {', '.join(unmapped)}.", "",
             *others]
    return "\n".join(rows)


def main() -> None:
    t0 = time.perf_counter()
    results = run_all()
    elapsed = time.perf_counter() - t0
    print(table(results))
    passed = sum(r.passed for r in results)
    ops = {r.op for r in results}
    ops_any = {r.op for r in results if r.passed}
    print(f"\n{passed} of {len(results)} node tests pass, covering {len(ops_any)} of {len(ops)} "
          f"operators ({elapsed:.1f} s)")
    reasons = Counter(r.reason for r in results if not r.passed)
    print("\nfailures by reason (top 25):")
    for k, v in reasons.most_common(25):
        print(f"  {v:4d}  {k}")


if __name__ == "__main__":
    main()
