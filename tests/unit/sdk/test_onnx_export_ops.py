"""Every triplane op with an ONNX form, exported alone and run by onnxruntime, on the op
table's own cases (``triplane/proto/opcases.py``: every dtype, broadcasting, empty and
0-d tensors, negative axes): its outputs match triplane's. A case onnxruntime cannot run
(no kernel for the dtype, or a dtype ONNX's operator excludes) is counted apart; the
number that match must not fall below the floor docs/onnx.md records."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")

from triplane.proto.opcases import cases_for, parse_type  # noqa: E402
from triplane.sdk.onnx import EXPORTS, Unsupported, to_onnx  # noqa: E402
from triplane.sdk.tensor import Tensor, apply  # noqa: E402

MATCH_FLOOR = 585  # of 663 cases, onnxruntime 1.32
# Where onnxruntime's answer is not the op's: the mean of nothing is 0 there, NaN in numpy.
KNOWN_DIFFERENT = {("mean", ("f32[0,3]",))}


def _value(rng: np.random.Generator, t: object, op: str) -> np.ndarray:
    d = t.dtype  # type: ignore[attr-defined]
    shape = t.shape  # type: ignore[attr-defined]
    if d.kind == "bool":
        return rng.random(shape) < 0.5
    if d.is_int:
        lo, hi = (0, 2) if op in ("gather", "embedding", "one_hot") else (1, 5)
        return rng.integers(lo, hi, size=shape).astype(d.np)
    x = rng.normal(size=shape)
    if op in ("log", "sqrt", "rsqrt", "pow", "reciprocal"):
        x = np.abs(x) + 0.5
    return x.astype(d.np)


def _run(op: str, ins: list[str], attrs: dict, rng: np.random.Generator) -> str:
    """"match", "differs", or why onnxruntime could not run it."""
    xs = [Tensor.from_array(_value(rng, parse_type(s), op)) for s in ins]
    try:
        want = apply(op, xs, **attrs).numpy()
    except Exception:
        return "refused by triplane"  # an error case of the op table: nothing to export
    try:
        proto = to_onnx(lambda *a: apply(op, list(a), **attrs), [x.numpy() for x in xs])
    except Unsupported:
        return "no ONNX form (training mode, label smoothing)"
    try:
        session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        (got,) = session.run(None, {i.name: x.numpy() for i, x in zip(proto.graph.input, xs)})
    except Exception as e:
        text = str(e)
        if "NOT_IMPLEMENTED" in text or "MLDataType" in text:
            return "onnxruntime has no kernel for the dtype"
        if "Type Error" in text:
            return "the dtype is outside the ONNX operator's"
        return f"onnxruntime failed: {text[:200]}"
    same = got.shape == want.shape and got.dtype == want.dtype and np.allclose(
        got.astype(np.float64), want.astype(np.float64), rtol=1e-3, atol=1e-3, equal_nan=True)
    return "match" if same else "differs"


def test_every_exported_op_runs_in_onnxruntime_as_in_triplane() -> None:
    ort.set_default_logger_severity(3)
    rng = np.random.default_rng(0)
    outcomes: dict[str, Counter] = defaultdict(Counter)
    differs, failed = [], []
    for op in sorted(EXPORTS):
        for ins, attrs in cases_for(op):
            got = _run(op, ins, attrs, rng)
            outcomes[op][got] += 1
            if got == "differs" and (op, tuple(ins)) not in KNOWN_DIFFERENT:
                differs.append((op, ins, attrs))
            if got.startswith("onnxruntime failed"):
                failed.append((op, ins, got))
    for op, c in outcomes.items():
        print(f"{op:14s} {dict(c)}")
    total = Counter()
    for c in outcomes.values():
        total.update(c)
    print(dict(total))
    assert not differs, f"exported ops whose onnxruntime outputs differ from triplane's: {differs}"
    assert not failed, f"exports onnxruntime refused: {failed}"
    assert all(c["match"] for c in outcomes.values()), \
        f"exported ops with no case that matches: {[op for op, c in outcomes.items() if not c['match']]}"
    assert total["match"] >= MATCH_FLOOR, f"{total['match']} cases match, below the floor of {MATCH_FLOOR}"
