"""Differential test: random small programs run by triplane (embedded, ``.numpy()``) and by
numpy must agree on every step's result dtype, shape and value, and on which steps fail.

A program draws 1-3 input arrays (bool, int8, int16, int32, int64, uint8, float16,
float32, float64; shapes that broadcast, some with a dimension of 0) and 1-6 steps over
the ops of numpy_ops.py: Python operators (reversed ones too), SDK functions, reductions
in numpy's and PyTorch's spellings, matmul, shape ops, with Python and numpy scalars
standing in for operands. Each step's numpy twin reads triplane's values of its operands,
so rounding does not accumulate along a chain and a mismatch names the step that made it.
The program runs as one graph (its last steps first, so chains are fused as they would be
in a user's program), then the rest.

Tolerances (floats; exact for integers and bools): ``|got - want| <= rtol * |want| +
atol * scale`` with (rtol, atol) below and ``scale`` the largest magnitude the step
combines (its operands' for elementwise ops; times the count for reductions and matmul).
Where triplane deliberately differs from numpy, numpy_ops.EXCLUSIONS says so and why.

Run more programs: ``pytest -m slow tests/unit/ops/test_differential.py`` (20,000), or
``TRIPLANE_DIFF_PROGRAMS=N``. A failure prints the seed and the program.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from numpy_ops import EVERY, OPS, Op, Refused

import triplane as tp
from triplane.proto.errors import KernelError, TriplaneError
from triplane.sdk.tensor import Tensor

TOLERANCE = {"float16": (2e-3, 2e-3), "float32": (4e-6, 2e-6), "float64": (1e-12, 1e-13)}
SCALARS: list[Any] = [0, 1, 2, 3, -1, -2, 7, 0.5, -1.5, 2.0, 0.1, True, False]
NUMPY_SCALARS: list[Any] = [np.float32(1.5), np.int8(3), np.float64(-0.5), np.uint8(2), np.int64(-4)]


@dataclass
class Value:
    name: str
    tensor: Tensor
    array: np.ndarray | None = None  # triplane's value, once computed
    failed: bool = False             # its step (or one it reads) raised when the graph ran


@dataclass
class Step:
    op: Op
    args: list[Any]                  # Values, Python or numpy scalars
    params: dict[str, Any]
    text: str
    out: Value | None = None
    error: BaseException | None = None  # raised while recording


@dataclass
class Program:
    seed: int
    inputs: list[Value] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)

    def text(self) -> str:
        lines = [f"{v.name} = np.array({v.array.tolist()!r}, {v.array.dtype.name!r})"  # type: ignore[union-attr]
                 f".reshape({v.array.shape})" for v in self.inputs]
        return "\n".join([*lines, *(s.text for s in self.steps)])


# --- making programs ---------------------------------------------------------------------------


def _array(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype == "uint8":
        return rng.integers(0, 12, shape).astype(dtype)
    if dtype.startswith("int"):
        return rng.integers(-6, 7, shape).astype(dtype)
    x = rng.uniform(-3, 3, shape)
    if rng.random() < 0.3:
        x = np.round(x * 2) / 2  # halves: ties, exact quotients, integral values
    return x.astype(dtype)


def _fitting(rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts with ``shape``: some trailing dims, some of them 1."""
    keep = int(rng.integers(0, len(shape) + 1)) if rng.random() < 0.3 else len(shape)
    return tuple(1 if rng.random() < 0.25 else d for d in shape[len(shape) - keep:])


def _broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    try:
        np.broadcast_shapes(a, b)
    except ValueError:
        return False
    return True


class Maker:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.program = Program(seed)
        self.values: list[Value] = []

    def fresh(self, shape: tuple[int, ...], dtype: str | None = None) -> Value:
        d = dtype or str(self.rng.choice(EVERY))
        arr = _array(self.rng, d, shape)
        v = Value(f"x{len(self.program.inputs)}", Tensor.from_array(arr), arr)
        self.program.inputs.append(v)
        self.values.append(v)
        return v

    def operand(self, like: tuple[int, ...] | None, op: Op) -> Any:
        """A value that broadcasts with ``like`` (fresh if none does), or a scalar."""
        r = self.rng
        if like is not None and op.scalars and r.random() < 0.3:
            return r.choice(NUMPY_SCALARS) if r.random() < 0.15 else SCALARS[int(r.integers(len(SCALARS)))]
        fits = [v for v in self.values if v.tensor.dtype.name in op.dtypes
                and (like is None or _broadcasts(like, v.tensor.shape))]
        if fits and r.random() < 0.8:
            return fits[int(r.integers(len(fits)))]
        shape = _fitting(r, like) if like is not None else self.base
        return self.fresh(shape, str(r.choice(op.dtypes)))

    def step(self) -> None:
        r = self.rng
        op = OPS[int(r.integers(len(OPS)))]
        first = self.operand(None, op)
        while first.tensor.ndim < op.needs_ndim:
            first = self.fresh(self.base if len(self.base) >= op.needs_ndim else (2, 3))
        args: list[Any] = [first]
        shape = first.tensor.shape
        for _ in range(op.arity - 1):
            if op.kind == "matmul":
                k = shape[-1]
                other = (k,) if r.random() < 0.3 else (k, int(r.integers(1, 4)))
                args.append(self.fresh(other))
            elif op.kind == "shape":
                args.append(self.fresh(shape))
            else:
                args.append(self.operand(shape, op))
        if op.arity > 1 and op.scalars and r.random() < 0.5:
            args.reverse()  # scalars on the left: reversed operators
        params = op.params(r, shape)
        name = f"v{len(self.program.steps)}"
        text = f"{name} = {op.name}({', '.join(a.name if isinstance(a, Value) else repr(a) for a in args)}" \
               + "".join(f", {k}={v!r}" for k, v in params.items()) + ")"
        s = Step(op, args, params, text)
        try:
            s.out = Value(name, op.tp(*[a.tensor if isinstance(a, Value) else a for a in args], **params))
            self.values.append(s.out)
        except (TriplaneError, TypeError, ValueError, OverflowError) as e:
            s.error = e
        self.program.steps.append(s)

    def make(self) -> Program:
        r = self.rng
        self.base = tuple(int(d) for d in r.integers(1, 5, int(r.integers(0, 4))))
        if self.base and r.random() < 0.08:
            self.base = tuple(0 if i == 0 else d for i, d in enumerate(self.base))
        for _ in range(int(r.integers(1, 4))):
            self.fresh(_fitting(r, self.base) if self.values else self.base)
        for _ in range(int(r.integers(1, 7))):
            self.step()
        return self.program


# --- running and comparing ---------------------------------------------------------------------


def _realize(program: Program) -> None:
    """Compute every recorded step: the last ones (nothing reads them) first, in one graph."""
    outs = [s.out for s in program.steps if s.out is not None]
    read = {id(a) for s in program.steps for a in s.args}
    for group in ([v for v in outs if id(v) not in read], [v for v in outs if id(v) in read]):
        try:
            tp.realize(*(v.tensor for v in group))
        except KernelError:
            for v in group:  # one at a time, to see which fail
                try:
                    tp.realize(v.tensor)
                except KernelError:
                    v.failed = True
    for v in outs:
        if not v.failed:
            v.array = v.tensor.numpy()


def _np_args(step: Step) -> list[Any] | None:
    out = []
    for a in step.args:
        if isinstance(a, Value):
            if a.failed:
                return None
            out.append(a.array)
        else:
            out.append(a)
    return out


def _widen(x: Any, to: np.dtype) -> Any:
    """x for the float64 reference of a step whose numpy result has dtype ``to``: float
    arrays widened; a Python float first rounded to ``to``, as numpy does to a weak scalar."""
    if isinstance(x, np.ndarray | np.generic) and np.asarray(x).dtype.kind == "f":
        return np.asarray(x, np.float64)
    if type(x) is float:
        return float(np.asarray(x, to))
    return x


def _scale(step: Step, args: list[Any], got: np.ndarray) -> float:
    mags = [float(np.max(np.abs(a[np.isfinite(a)]), initial=0.0)) for a in map(np.asarray, args)
            if a.dtype.kind in "fiu" and a.size]
    s = max([1.0, *mags])
    if step.op.kind == "reduce" and args:
        n = np.asarray(args[0]).size / max(got.size, 1)
        s *= max(n, 1.0) * (s if step.op.name == "var" else 1.0)
    if step.op.kind == "matmul":
        s *= s * np.asarray(args[0]).shape[-1]
    return s


def _defined_cast(src: np.ndarray, to: np.dtype) -> np.ndarray:
    """Where a float -> ``to`` cast is defined (finite, and in range for integers)."""
    ok = np.isfinite(src)
    if to.kind in "iu":
        info = np.iinfo(to)
        ok &= (src > int(info.min) - 1) & (src < int(info.max) + 1)
    return ok


def _compare(step: Step, args: list[Any], got: np.ndarray, want: np.ndarray) -> str | None:
    if got.dtype != want.dtype:
        return f"dtype {got.dtype.name}, numpy {want.dtype.name}"
    if got.shape != want.shape:
        return f"shape {got.shape}, numpy {want.shape}"
    if want.dtype.kind != "f":
        if step.op.name.startswith("astype") and np.asarray(args[0]).dtype.kind == "f":
            ok = _defined_cast(np.asarray(args[0], np.float64), want.dtype)
            got, want = got[ok], want[ok]
        bad = got != want
        if not bad.any():
            return None
        return f"values differ at {np.argwhere(bad)[0].tolist()}: {got[bad][0]!r} vs numpy {want[bad][0]!r}"
    if step.op.native:
        ref = want
    else:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = np.asarray(step.op.np(*(_widen(a, want.dtype) for a in args), **_np_params(step)))
            ref = ref.astype(want.dtype)
    rtol, atol = TOLERANCE[want.dtype.name]
    g, w = got.astype(np.float64), ref.astype(np.float64)
    with np.errstate(all="ignore"):
        close = np.isclose(g, w, rtol=rtol, atol=atol * _scale(step, args, got), equal_nan=True)
        top = np.finfo(want.dtype).max
        close |= (np.abs(g) >= top) & (np.abs(w) >= top * (1 - rtol)) & (np.sign(g) == np.sign(w))
    if close.all():
        return None
    i = tuple(np.argwhere(~close)[0])
    return f"value at {list(i)}: {g[i]!r}, numpy {w[i]!r} (numpy in its own dtype: {want[i]!r})"


def _np_params(step: Step) -> dict[str, Any]:
    return {k: v for k, v in step.params.items() if k != "torch"}


def check_program(seed: int) -> tuple[list[str], int]:
    """Make program ``seed``, run it on both sides; the disagreements and the count of steps
    compared."""
    program = Maker(seed).make()
    _realize(program)
    problems, compared = [], 0
    for step in program.steps:
        args = _np_args(step)
        if args is None:
            continue  # reads a value whose computation failed (checked at that step)
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # numpy's "mean of empty slice" and the like
                want: Any = np.asarray(step.op.np(*args, **_np_params(step)))
            np_error = None
        except (Refused, TypeError, ValueError, OverflowError, ZeroDivisionError) as e:
            np_error = e
        tp_error = step.error or (KernelError("failed when run") if step.out and step.out.failed else None)
        compared += 1
        if np_error is not None or tp_error is not None:
            if (np_error is None) != (tp_error is None):
                problems.append(f"{step.text}: triplane "
                                f"{'raised ' + repr(tp_error) if tp_error else 'did not raise'}, numpy "
                                f"{'raised ' + repr(np_error) if np_error else 'did not raise'}")
            continue
        assert step.out is not None and step.out.array is not None
        if step.out.tensor.dtype.name != step.out.array.dtype.name:
            problems.append(f"{step.text}: inferred {step.out.tensor.dtype.name}, computed "
                            f"{step.out.array.dtype.name}")
        why = _compare(step, args, step.out.array, want)
        if why:
            problems.append(f"{step.text}: {why}")
    if problems:
        problems.append(f"-- program (seed {seed}):\n{program.text()}")
    return problems, compared


def _run(first: int, count: int) -> None:
    start = time.perf_counter()
    failures: list[str] = []
    steps = 0
    for seed in range(first, first + count):
        problems, n = check_program(seed)
        steps += n
        if problems:
            failures.append("\n".join(problems))
            if len(failures) >= 5:
                break
    took = time.perf_counter() - start
    print(f"differential: {count} programs, {steps} steps, {took:.1f} s")
    assert not failures, "\n\n".join(failures)


DEFAULT_PROGRAMS = int(os.environ.get("TRIPLANE_DIFF_PROGRAMS", "1000"))


def test_random_programs_agree_with_numpy() -> None:
    _run(0, DEFAULT_PROGRAMS)


@pytest.mark.slow  # 26-75 s on one core; CI runs slow tests too (deselect with -m "not slow")
def test_many_random_programs_agree_with_numpy() -> None:
    _run(1_000_000, 20_000)


def test_the_generator_covers_the_catalogue() -> None:
    # A test that cannot fail is a defect: the default run must reach every op, compare
    # values for most of them, and meet numpy's errors where they are expected.
    seen: dict[str, int] = {}
    for seed in range(300):
        for step in Maker(seed).make().steps:
            seen[step.op.name] = seen.get(step.op.name, 0) + 1
    assert set(seen) == {op.name for op in OPS}, sorted({op.name for op in OPS} - set(seen))


def test_a_wrong_dtype_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # Break true division the way it was before (integer results): the test must see it.
    import numpy_ops

    broken = [op if op.name != "/" else Op("/", 2, tp=lambda a, b: tp.floor_divide(a, b), np=op.np,
                                           scalars=True) for op in numpy_ops.OPS]
    monkeypatch.setitem(globals(), "OPS", broken)
    found = [p for seed in range(200) for p in check_program(seed)[0] if " = /(" in p]
    assert any("dtype" in p for p in found), found[:3]
