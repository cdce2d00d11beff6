"""The op-engine conformance kit: run it against your engine.

The numpy engine is the oracle. :data:`CASES` holds at least one case per op of the
table (built-in ops; user ops bring their own); :func:`check_op_engine` runs every case
the engine supports on fresh random inputs, on the engine and on numpy, and reports each
disagreement. A vendor's test suite can reuse the pytest mixin::

    from triplane.engines.testing import OpEngineConformance

    class TestMyEngine(OpEngineConformance):
        @pytest.fixture
        def op_engine(self):
            return MyEngine()

From a shell, ``python -m triplane.engines.testing --engine NAME`` runs the kit on an
installed engine and prints a table per op and dtype (pass or fail, the largest error
against numpy); it exits 1 when a case fails. The same command runs the memory kit
(``memory/testing.py``) on a memory engine and the network kit (``network/testing.py``) on
a network engine: the kind is the one whose registry knows the name (``--kind`` to say).

An engine may convert inputs to its own array type and return its own array type; the
kit converts results with ``numpy.asarray`` (cupy: ``.get()``) before comparing.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from triplane.proto import dtypes as dt
from triplane.proto import optable
from triplane.proto.ir import Attrs, TensorType

__all__ = ["CASES", "Case", "Mismatch", "OpEngineConformance", "Result", "check_op_engine", "format_table",
           "main", "run_cases"]

# An input spec: (kind, shape[, high]); kind f = float in [-2, 2), p = positive float in
# [0.5, 2), i = integer in [0, high), b = bool. Float inputs take the case's float dtype.
Spec = tuple[Any, ...]


@dataclass(frozen=True)
class Case:
    op: str
    inputs: tuple[Spec, ...] = ()
    attrs: dict[str, Any] = field(default_factory=dict)
    rtol: float = 1e-5
    atol: float = 1e-6


def _c(op: str, *inputs: Spec, rtol: float = 1e-5, atol: float = 1e-6, **attrs: Any) -> Case:
    return Case(op, tuple(inputs), attrs, rtol, atol)


def _const_data() -> str:
    return base64.b64encode(np.arange(6, dtype="<f4").tobytes()).decode()


_UNARY_ANY = ["neg", "abs", "sign", "square", "relu", "floor", "ceil", "sin", "cos", "tanh",
              "sigmoid", "gelu", "silu", "erf", "exp"]
_UNARY_POS = ["log", "sqrt", "rsqrt", "reciprocal", "tan"]
_BINARY = ["add", "sub", "mul", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge"]

CASES: list[Case] = [
    # creation
    _c("full", value=1.5, shape=(2, 3), dtype="float32"),
    _c("constant", data=_const_data(), shape=(2, 3), dtype="float32"),
    _c("arange", start=1.0, stop=10.0, step=2.0, dtype="int64"),
    _c("eye", n=3, m=4, k=1, dtype="float32"),
    _c("uniform", shape=(5, 7), dtype="float32", seed=3, low=-1.0, high=2.0),
    _c("normal", shape=(4, 6), dtype="float32", seed=5, mean=1.0, std=0.5),
    # elementwise
    *[_c(op, ("f", (3, 4))) for op in _UNARY_ANY],
    *[_c(op, ("p", (3, 4))) for op in _UNARY_POS],
    *[_c(op, ("f", (3, 4)), ("f", (1, 4))) for op in _BINARY],
    _c("div", ("f", (3, 4)), ("p", (3, 1))),
    _c("floor_divide", ("f", (3, 4)), ("p", (3, 1))),
    _c("remainder", ("f", (3, 4)), ("p", (3, 1))),
    _c("pow", ("p", (3, 4)), ("f", (3, 4))),
    _c("cast", ("f", (3, 4)), dtype="float64"),
    _c("where", ("b", (3, 4)), ("f", (3, 4)), ("f", (3, 1))),
    _c("logical_and", ("b", (5,)), ("b", (5,))),
    _c("logical_or", ("b", (5,)), ("b", (5,))),
    _c("logical_not", ("b", (5,))),
    _c("fused", ("f", (64, 33)), ("f", (1, 33)),
       program=[["mul", [0, 1], {}], ["exp", [2], {}], ["sub", [3, 0], {}]]),
    # fused programs ending in a reduction, large enough for the numpy kernel's slices
    _c("fused", ("f", (300, 250)), program=[["exp", [0], {}], ["sum", [1], {"axes": None}]],
       rtol=1e-5, atol=1e-3),
    _c("fused", ("f", (300, 250)), ("f", (1, 250)),
       program=[["mul", [0, 1], {}], ["max", [2], {"axes": [1], "keepdims": True}]]),
    _c("fused", ("f", (300, 250)), program=[["square", [0], {}], ["mean", [1], {"axes": [0]}]]),
    # reductions
    *[_c(op, ("f", (3, 4, 5)), axes=[0, 2], keepdims=kd)
      for op in ("sum", "mean", "max", "min", "prod", "logsumexp") for kd in (False, True)],
    _c("var", ("f", (6, 5)), axes=[1], ddof=1),
    _c("argmax", ("f", (4, 5)), axis=1),
    _c("argmin", ("f", (4, 5)), axis=0, keepdims=True),
    # linear algebra
    _c("matmul", ("f", (2, 1, 3, 4)), ("f", (5, 4, 2)), rtol=1e-4, atol=1e-5),
    _c("matmul", ("f", (7,)), ("f", (7, 3)), rtol=1e-4, atol=1e-5),
    # shape
    _c("reshape", ("f", (3, 4)), shape=(2, 6)),
    _c("transpose", ("f", (2, 3, 4)), perm=[2, 0, 1]),
    _c("broadcast_to", ("f", (3, 1)), shape=(2, 3, 4)),
    _c("squeeze", ("f", (3, 1, 4)), axes=[1]),
    _c("unsqueeze", ("f", (3, 4)), axes=[0, 2]),
    _c("concat", ("f", (2, 3)), ("f", (4, 3)), axis=0),
    _c("stack", ("f", (2, 3)), ("f", (2, 3)), axis=1),
    _c("slice", ("f", (6, 7)), starts=[1, 0], stops=[5, 7], steps=[2, 3]),
    _c("unslice", ("f", (2, 3)), shape=(6, 7), starts=[1, 0], stops=[5, 7], steps=[2, 3]),
    _c("gather", ("f", (5, 3)), ("i", (4,), 5), axis=0),
    _c("scatter_add", ("f", (4, 3)), ("i", (4,), 5), axis=0, size=5),
    _c("pad", ("f", (2, 3)), pads=[[1, 0], [2, 1]], value=0.5),
    _c("flip", ("f", (3, 4)), axes=[1]),
    # nn
    _c("softmax", ("f", (3, 5)), axis=-1),
    _c("log_softmax", ("f", (3, 5)), axis=0),
    _c("cross_entropy", ("f", (4, 5)), ("i", (4,), 5)),
    _c("cross_entropy_grad", ("f", (4, 5)), ("i", (4,), 5), ("f", ())),
    _c("mse_loss", ("f", (4, 5)), ("f", (4, 5))),
    _c("conv2d", ("f", (2, 4, 7, 7)), ("f", (6, 2, 3, 3)), stride=[2, 1], padding=[1, 1],
       dilation=[1, 2], groups=2, rtol=1e-4, atol=1e-5),
    _c("conv2d_grad_input", ("f", (2, 6, 4, 5)), ("f", (6, 2, 3, 3)), stride=[2, 1],
       padding=[1, 1], dilation=[1, 2], groups=2, input_shape=(2, 4, 7, 7), rtol=1e-4, atol=1e-5),
    _c("conv2d_grad_weight", ("f", (2, 4, 7, 7)), ("f", (2, 6, 4, 5)), stride=[2, 1],
       padding=[1, 1], dilation=[1, 2], groups=2, weight_shape=(6, 2, 3, 3), rtol=1e-4, atol=1e-5),
    _c("max_pool2d", ("f", (2, 3, 6, 6)), kernel=[2, 2], stride=[2, 2]),
    _c("max_pool2d_grad", ("f", (2, 3, 6, 6)), ("f", (2, 3, 3, 3)), kernel=[2, 2], stride=[2, 2]),
    _c("avg_pool2d", ("f", (2, 3, 6, 6)), kernel=[3, 3], stride=[1, 1], padding=[1, 1]),
    _c("avg_pool2d_grad", ("f", (2, 3, 6, 6)), kernel=[3, 3], stride=[1, 1], padding=[1, 1],
       input_shape=(2, 3, 6, 6)),
    _c("embedding", ("f", (10, 4)), ("i", (3, 2), 10)),
    _c("embedding_grad", ("i", (3, 2), 10), ("f", (3, 2, 4)), num_embeddings=10),
    _c("dropout", ("f", (8, 9)), p=0.25, seed=11, training=True),
    _c("layer_norm", ("f", (3, 4, 5)), ("f", (4, 5)), ("f", (4, 5)), normalized_ndim=2),
    _c("batch_norm", ("f", (4, 3, 2, 2)), ("f", (3,)), ("f", (3,)), ("f", (3,)), ("p", (3,)),
       training=True),
    _c("batch_norm", ("f", (4, 3, 2, 2)), ("f", (3,)), ("f", (3,)), ("f", (3,)), ("p", (3,)),
       training=False),
    _c("one_hot", ("i", (2, 3), 4), num_classes=4),
]


@dataclass(frozen=True)
class Mismatch:
    case: Case
    dtype: str
    message: str

    def __str__(self) -> str:
        return f"{self.case.op} ({self.dtype}, attrs {self.case.attrs}): {self.message}"


def _make(spec: Spec, float_dtype: str, rng: np.random.Generator) -> np.ndarray:
    kind, shape = spec[0], tuple(spec[1])
    if kind == "f":
        return rng.uniform(-2, 2, size=shape).astype(float_dtype)
    if kind == "p":
        return rng.uniform(0.5, 2, size=shape).astype(float_dtype)
    if kind == "i":
        return rng.integers(0, spec[2], size=shape).astype(np.int64)
    if kind == "b":
        return rng.random(shape) < 0.5
    raise ValueError(f"unknown input kind {kind!r}")


def _to_host(x: Any) -> np.ndarray:
    get = getattr(x, "get", None)  # cupy arrays
    return np.asarray(get() if callable(get) else x)


@dataclass(frozen=True)
class Result:
    """One case on one float dtype: ``ok``, the largest absolute error against numpy
    (None when there are no values to compare) and what went wrong."""

    case: Case
    dtype: str
    ok: bool
    max_error: float | None = None
    message: str = ""


def run_cases(engine: Any, *, cases: Iterable[Case] = CASES,
              float_dtypes: Sequence[str] = ("float32", "float64"),
              rng: np.random.Generator | None = None,
              to_engine: Callable[[np.ndarray], Any] = lambda a: a) -> list[Result]:
    """Every case ``engine`` supports, on fresh random inputs, against numpy: one Result
    per case and float dtype it ran (cases it does not support are left out)."""
    from triplane.engines.registry import get_op_engine

    reference = get_op_engine("numpy")
    rng = rng or np.random.default_rng()
    results: list[Result] = []
    for case in cases:
        opdef = optable.get(case.op)
        for fd in float_dtypes:
            attrs = dict(case.attrs)
            if "dtype" in attrs and attrs["dtype"] in dt.FLOATS and case.op not in ("cast", "constant"):
                attrs["dtype"] = fd
            xs = [_make(s, fd, rng) for s in case.inputs]
            a = opdef.normalise_attrs(attrs)
            out = opdef.check([TensorType(x.shape, dt.dtype(x.dtype)) for x in xs], a)
            if not engine.supports(case.op, [x.dtype.name for x in xs]):
                continue
            name = _dtype_label(xs, out)
            if any(r.case is case and r.dtype == name for r in results):
                continue  # a case without float inputs or results runs once
            want = reference.run(case.op, xs, Attrs(a), out)
            try:
                got = _to_host(engine.run(case.op, [to_engine(x) for x in xs], Attrs(a), out))
            except Exception as e:  # the kit reports, it does not stop at the first failure
                results.append(Result(case, name, False, None, f"raised {type(e).__name__}: {e}"))
                continue
            if got.shape != want.shape or got.dtype != want.dtype:
                results.append(Result(case, name, False, None, f"gave {got.dtype}{list(got.shape)}, numpy "
                                                               f"gives {want.dtype}{list(want.shape)}"))
                continue
            err = (float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)), initial=0.0))
                   if want.dtype.kind in "fcbiu" else None)
            if want.dtype.kind in "fc":
                ok = bool(np.allclose(got, want, rtol=case.rtol, atol=case.atol, equal_nan=True))
            else:
                ok = bool(np.array_equal(got, want))
            results.append(Result(case, name, ok, err,
                                  "" if ok else f"values differ from numpy (max abs error {err:g})"))
    return results


def _dtype_label(xs: Sequence[np.ndarray], out: TensorType) -> str:
    names = {x.dtype.name for x in xs} | {out.dtype.name}
    floats = sorted(names & set(dt.FLOATS))
    return ",".join(floats or sorted(names))


def check_op_engine(engine: Any, *, cases: Iterable[Case] = CASES,
                    float_dtypes: Sequence[str] = ("float32", "float64"),
                    rng: np.random.Generator | None = None,
                    to_engine: Callable[[np.ndarray], Any] = lambda a: a) -> list[Mismatch]:
    """Run every case ``engine`` supports and return the disagreements with numpy (empty
    when the engine conforms). ``to_engine`` converts inputs to the engine's arrays."""
    return [Mismatch(r.case, r.dtype, r.message)
            for r in run_cases(engine, cases=cases, float_dtypes=float_dtypes, rng=rng, to_engine=to_engine)
            if not r.ok]


class OpEngineConformance:
    """A pytest mixin: subclass it and provide an ``op_engine`` fixture."""

    def test_every_supported_op_matches_numpy(self, op_engine: Any) -> None:
        problems = check_op_engine(op_engine)
        assert not problems, "\n".join(map(str, problems))

    def test_declares_what_it_supports(self, op_engine: Any) -> None:
        assert isinstance(op_engine.name, str) and op_engine.name
        assert isinstance(op_engine.supports("matmul", ["float32", "float32"]), bool)

    def test_benchmark_reports_figures(self, op_engine: Any) -> None:
        figures = op_engine.benchmark()
        assert figures["matmul_gflops"] > 0 and figures["elementwise_gbps"] > 0


def covered_ops() -> set[str]:
    return {c.op for c in CASES}



def uncovered(engine: Any) -> list[str]:
    """Ops the engine declares (``engine.ops``, where it lists them) that no case covers."""
    declared = getattr(engine, "ops", None)
    return sorted(set(declared or ()) - covered_ops())


def format_table(engine_name: str, results: Sequence[Result], missing: Sequence[str] = ()) -> str:
    """The kit's report: one row per op and dtype, then a summary line."""
    rows = [("op", "dtype", "result", "max error", "detail")]
    for r in results:
        err = "-" if r.max_error is None else f"{r.max_error:.3g}"
        rows.append((r.case.op, r.dtype, "pass" if r.ok else "FAIL", err, r.message))
    rows += [(op, "-", "no case", "-", "the kit has no case for this op (bring one)") for op in missing]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [f"conformance of op engine {engine_name!r} against numpy"]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + ("  " + row[4] if row[4] else "")
              for row in rows]
    failed = sum(not r.ok for r in results)
    lines.append(f"{len(results)} cases, {len(results) - failed} passed, {failed} failed")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m triplane.engines.testing --engine NAME [--kind op|memory|network]``: the
    conformance kit of the engine's kind (by default the kind whose registry knows the
    name). Exit 0 when every check passed, 1 when one failed (or the engine cannot be
    made), 2 for an unknown name or bad options."""
    import argparse

    from triplane.engines.errors import UnknownEngineError
    from triplane.engines.registry import KINDS, engine_names, get_op_engine, load_op_plugins

    parser = argparse.ArgumentParser(prog="python -m triplane.engines.testing",
                                     description="Run an engine's conformance kit (op engines: against "
                                                 "numpy).")
    parser.add_argument("--engine", required=True, help="an engine's name (built-in or installed)")
    parser.add_argument("--kind", choices=KINDS, help="op, memory or network (default: the kind that "
                                                      "has an engine of that name)")
    parser.add_argument("--dtypes", default="float32,float64",
                        help="op engines: float dtypes to run the cases in")
    parser.add_argument("--seed", type=int, default=0, help="op engines: seed of the random inputs")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="memory engines: an argument of its factory (url=redis://HOST:PORT/0, path=DIR)")
    args = parser.parse_args(argv)
    load_op_plugins()
    kinds = [args.kind] if args.kind else [k for k in KINDS if args.engine in engine_names(k)]
    if not kinds:
        known = "; ".join(f"{k}: {engine_names(k)}" for k in KINDS)
        print(f"error: unknown engine {args.engine!r} (known: {known})")
        return 2
    if len(kinds) > 1:
        print(f"error: {args.engine!r} names a {' and a '.join(kinds)} engine: say which with --kind")
        return 2
    if kinds[0] != "op":
        return _main_other(kinds[0], args.engine, args.option)
    try:
        engine = get_op_engine(args.engine)
    except UnknownEngineError as e:
        print(f"error: {e}")
        return 2
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    results = run_cases(engine, float_dtypes=dtypes, rng=np.random.default_rng(args.seed))
    print(format_table(args.engine, results, uncovered(engine)))
    return 0 if results and all(r.ok for r in results) else 1


def _main_other(kind: str, name: str, options: Sequence[str]) -> int:
    """The memory or network kit of ``main``."""
    from triplane.engines.checks import check_table
    from triplane.engines.errors import UnknownEngineError

    parsed: dict[str, str] = {}
    for opt in options:
        key, eq, value = opt.partition("=")
        if not eq or not key:
            print(f"error: bad --option {opt!r}: expected KEY=VALUE (e.g. url=redis://127.0.0.1:6379/0)")
            return 2
        parsed[key] = value
    try:
        if kind == "network":
            from triplane.engines.network.testing import check_engine

            if parsed:
                print(f"error: network engines take no --option (got {sorted(parsed)})")
                return 2
            checks = check_engine(name)
        else:
            from triplane.engines.memory.testing import check_memory_engine, memory_engine_makers

            with memory_engine_makers(name, parsed) as (make, reopen):
                checks = check_memory_engine(make, reopen)
    except UnknownEngineError as e:
        print(f"error: {e}")
        return 2
    print(check_table(f"conformance of {kind} engine {name!r}", checks))
    return 0 if checks and all(c.ok for c in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
