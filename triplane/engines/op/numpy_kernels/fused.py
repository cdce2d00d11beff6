"""The fused-program kernel: runs a chain of elementwise kernels slice by slice, so the
temporaries are the size of one slice (cache-sized) rather than of the whole tensor.

A program ending in a reduction (proto/ops/fused.py) reduces each slice as it goes: a
slice's partial comes from the reduction's own kernel (numpy's pairwise sum within the
slice, in at least float32), and the partials of the slices are merged in float64 for
float sums, products and means (the integers' own dtype for integers, wrapping as
numpy's fixed-width sums do), rounded once at the end. The error is then a few float32
ulps of a slice's partial whatever the number of slices: tests/unit/compiler/
test_fusion_reduce.py holds float32 results within 1e-6 of the float64 result relative
to the sum of the terms' magnitudes (1e-13 for float64), and a sum of 2^24 float32 terms
within numpy's own error (measured once: exp(x * 2 + 1).sum() of 2048 x 8192 float32 is
6e-9 off the float64 sum, numpy's float32 sum 1e-7).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from triplane.engines.op.numpy_kernels.table import KERNELS, KernelGroup
from triplane.proto import optable
from triplane.proto.ir import Attrs, TensorType
from triplane.proto.opdef import normalise_axes
from triplane.proto.ops.fused import program_types, reduce_step

KERNEL_GROUP = KernelGroup()  # registered by numpy_kernels.register_all
kernel = KERNEL_GROUP.kernel

SLICE_ELEMENTS = 1 << 16  # measured here: 49 ms for a 4096x8192 chain, 59-68 ms at 1 << 15

# The steps a plain ufunc computes exactly as their kernel does (elementwise.py) when the
# operands already have the result's float dtype: _Steps runs these into kept buffers.
_UFUNCS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
           "maximum": np.maximum,
           "minimum": np.minimum, "neg": np.negative, "exp": np.exp, "log": np.log,
           "sqrt": np.sqrt, "sin": np.sin, "cos": np.cos, "tan": np.tan, "tanh": np.tanh,
           "square": np.square, "abs": np.abs, "reciprocal": np.reciprocal}

# How a reduction's combine merges two slices' partials.
_MERGE = {"add": np.add, "mul": np.multiply, "maximum": np.maximum, "minimum": np.minimum}


# (program attrs, input types) -> step types: a compiled step runs the same program on the
# same types every time, and checking it again cost a fifth of a small MLP's kernels.
_STEP_TYPES: dict[Any, list[TensorType]] = {}


def _step_types(ins: Sequence[Any], a: Attrs) -> list[TensorType]:
    key = (a, tuple(TensorType(x.shape, _dt(x)) for x in ins))
    found = _STEP_TYPES.get(key)
    if found is None:
        found = program_types(list(key[1]), a)
        if len(_STEP_TYPES) >= 4096:
            _STEP_TYPES.clear()
        _STEP_TYPES[key] = found
    return found


@kernel("fused")
def _fused(ins, a, out):
    if _whole(out.shape):
        whole = _whole_program(ins, a)
        if whole is not None:
            return whole.run(ins, out)
    step_types = _step_types(ins, a)
    if reduce_step(a) is not None:
        return _fused_reduce(ins, a, step_types, out)
    program = a["program"]
    shape = out.shape
    result = np.empty(shape, dtype=out.dtype.np)
    if _whole(shape):
        result[...] = run_program(program, step_types, list(ins), shape)
        return result
    steps = _Steps(program, step_types)
    for start, stop, part in _slices(ins, shape):
        result[start:stop] = steps.run(part, (stop - start, *shape[1:]))
    return result


@KERNEL_GROUP.preparer("fused")
def _prepare(a, in_types, out):
    """The kernel for inputs of ``in_types``: a small program's ``_Whole`` run directly."""
    if not _whole(out.shape):
        return None
    types = program_types(list(in_types), a)
    epilogue = reduce_step(a)
    body = types[-2] if epilogue is not None else types[-1]
    if not _whole(body.shape):
        return None
    whole = _Whole(a["program"], list(in_types), types, epilogue)
    return lambda ins: whole.run(ins, out)


# (program attrs, the inputs' shapes and dtypes) -> the program prepared for whole tensors.
_WHOLE: dict[Any, _Whole | None] = {}


def _whole_program(ins: Sequence[Any], a: Attrs) -> _Whole | None:
    """The prepared whole-tensor program of ``a`` for inputs like ``ins`` (None: a body
    larger than a slice, which runs slice by slice)."""
    key = (a, tuple((x.shape, x.dtype) for x in ins))
    try:
        return _WHOLE[key]
    except KeyError:
        pass
    in_types = [TensorType(x.shape, _dt(x)) for x in ins]
    types = program_types(in_types, a)
    epilogue = reduce_step(a)
    body = types[-2] if epilogue is not None else types[-1]
    whole = _Whole(a["program"], in_types, types, epilogue) if _whole(body.shape) else None
    if len(_WHOLE) >= 4096:
        _WHOLE.clear()
    _WHOLE[key] = whole
    return whole


class _Whole:
    """A program over tensors of at most a slice, prepared once per input types (a
    compiled step runs the same program on the same types every step): per step the
    ufunc or kernel to call and its arguments, and the value of each step that is the
    same on every call (0-d constants and steps of them only), computed once. A ufunc is
    called where it gives exactly its kernel's value (``_UFUNCS``: operands of the
    result's float dtype); any other step calls its kernel and rounds as ``_Steps`` does.
    Holds no buffers, so threads may share it."""

    def __init__(self, program, in_types, types, epilogue) -> None:
        n_inputs = len(in_types)
        every = [*in_types, *types]
        self.calls: list[tuple[int, Any, tuple[int, ...], Any, TensorType]] = []
        self.constants: dict[int, Any] = {}
        const = [False] * n_inputs
        body = program[:-1] if epilogue is not None else program
        for k, ((op, args, attrs), t) in enumerate(zip(body, types)):
            slot = n_inputs + k
            fn = KERNELS[op]
            is_const = not t.shape and all(const[i] for i in args)
            const.append(is_const)
            if is_const:
                vals = [self.constants[i] for i in args]
                self.constants[slot] = _rounded(fn(vals, attrs, t), t)
                continue
            ufunc = _UFUNCS.get(op) if t.dtype.name in ("float32", "float64") else None
            if ufunc is not None and all(every[i].dtype == t.dtype for i in args):
                self.calls.append((slot, ufunc, args, None, t))
            else:
                self.calls.append((slot, fn, args, attrs, t))
        self.epilogue = epilogue
        # the values after the inputs: the constants in place, the rest made per call
        self.template = [self.constants.get(n_inputs + k) for k in range(len(body))]

    def run(self, ins, out: TensorType):
        vals = [*ins, *self.template]
        for slot, fn, args, attrs, t in self.calls:
            if attrs is None:
                vals[slot] = fn(*[vals[i] for i in args])
            else:
                vals[slot] = _rounded(fn([vals[i] for i in args], attrs, t), t)
        value = vals[-1]
        if self.epilogue is not None:
            op, attrs = self.epilogue
            return KERNELS[op]([value], attrs, out)
        if (type(value) is np.ndarray and value.flags.owndata and value.flags.c_contiguous
                and value.shape == out.shape and value.dtype == out.dtype.np
                and not any(value is x for x in ins)):
            return value
        result = np.empty(out.shape, dtype=out.dtype.np)  # a view, a broadcast or an input
        result[...] = value
        return result


def run_whole(ins: Sequence[Any], a: Attrs, out: TensorType,
              asarray: Callable[[Any], Any] | None = None) -> Any:
    """The program over whole tensors, in one pass per step (engines whose arrays gain
    nothing from slicing: a GPU's). ``asarray`` moves each step's result to the engine's
    array type (a ``full`` step makes a host array)."""
    step_types = program_types([TensorType(tuple(x.shape), _dt(x)) for x in ins], a)
    program = a["program"]
    epilogue = reduce_step(a)
    body = program[:-1] if epilogue is not None else program
    body_types = step_types[:-1] if epilogue is not None else step_types
    value = run_program(body, body_types, list(ins), body_types[-1].shape, asarray)
    if epilogue is not None:
        op, attrs = epilogue
        value = KERNELS[op]([value], attrs, out)
    return value


def _fused_reduce(ins, a, step_types, out):
    program = a["program"]
    op, attrs = reduce_step(a)  # type: ignore[misc]
    body, shape = program[:-1], step_types[-2].shape
    if _whole(shape):
        value = run_program(body, step_types[:-1], list(ins), shape)
        return KERNELS[op]([value], attrs, out)
    axes = normalise_axes(attrs["axes"], len(shape))
    # Per slice: the reduction keeping its axes (mean: the sum; divided once at the end).
    per_slice = "sum" if op == "mean" else op
    keep = Attrs({"axes": axes, "keepdims": True})
    merge = _MERGE[_combine(per_slice)]
    whole_kept = tuple(1 if d in axes else n for d, n in enumerate(shape))
    acc = None  # the merged partial when the slicing axis (0) is reduced
    rows = None  # else: each slice's rows of the result
    steps = _Steps(body, step_types[:-1])
    for start, stop, part in _slices(ins, shape):
        value = steps.run(part, (stop - start, *shape[1:]))
        kept = (1 if 0 in axes else stop - start, *whole_kept[1:])
        r = KERNELS[per_slice]([value], keep, TensorType(kept, out.dtype))
        if 0 not in axes:
            if rows is None:
                rows = np.empty(whole_kept, dtype=r.dtype)
            rows[start:stop] = r
        elif acc is None:
            acc = r.astype(_merge_dtype(r.dtype, per_slice))
        else:
            merge(acc, r, out=acc)
    value = rows if acc is None else acc
    if op == "mean":
        value = np.true_divide(value, math.prod(shape[d] for d in axes))
    return np.asarray(value).reshape(out.shape).astype(out.dtype.np, copy=False)


def _combine(op: str) -> str:
    combine = optable.get(op).split.combine  # type: ignore[union-attr]
    assert combine is not None
    return combine


def _merge_dtype(dtype: np.dtype, op: str) -> np.dtype:
    """The accumulator's dtype: float64 for float sums and products (merging thousands of
    slice partials in float32 would round once per slice); the partials' own otherwise."""
    if dtype.kind == "f" and op in ("sum", "prod"):
        return np.dtype(np.float64)
    return dtype


def _whole(shape: tuple[int, ...]) -> bool:
    return not shape or math.prod(shape) <= SLICE_ELEMENTS or shape[0] == 1


def _slices(ins, shape):
    """(start, stop, the inputs' parts) for slices of ``shape``'s axis 0 of about
    SLICE_ELEMENTS elements; an input broadcast along axis 0 is passed whole."""
    nd = len(shape)
    aligned = [x.reshape((1,) * (nd - x.ndim) + x.shape) for x in ins]
    rows = max(1, SLICE_ELEMENTS // max(1, math.prod(shape[1:])))
    for start in range(0, shape[0], rows):
        stop = min(start + rows, shape[0])
        yield start, stop, [x[start:stop] if x.shape[0] != 1 else x for x in aligned]


def run_program(program, step_types, values, shape, asarray=None):
    """The values of an elementwise program's last step over ``values`` (of ``shape``)."""
    return _Steps(program, step_types).run(values, shape, asarray)


class _Steps:
    """An elementwise program prepared once per kernel call and run per slice: each
    step's kernel, arguments, and the values no later step reads (dropped after it, so a
    slice holds a few temporaries at a time rather than one per step).

    Run per slice, the general path calls each step's kernel, which allocates its result;
    for a slice of 32K elements that overhead is most of the time. So, where it gives the
    same bits: a step whose value is the same for every slice (a 0-d ``full`` constant,
    or a step of such steps only) is computed once, and a plain ufunc step whose operands
    already have its result's float dtype writes into a buffer kept across slices (the
    buffer of an operand it is the last reader of, when there is one: fewer cache lines
    touched). ``np.multiply(x, c, out=buf)`` gives exactly ``np.multiply(x, c)`` then."""

    def __init__(self, program, step_types) -> None:
        last = {}
        for k, (_, args, _) in enumerate(program):
            for i in args:
                last[i] = k
        self.steps = [(KERNELS[op], args, attrs, t, [i for i in set(args) if last[i] == k])
                      for k, ((op, args, attrs), t) in enumerate(zip(program, step_types))]
        self.ufuncs = [_UFUNCS.get(op) if t.dtype.name in ("float32", "float64") else None
                       for (op, _, _), t in zip(program, step_types)]
        self.n_inputs = -1  # known at the first run
        self.constant: list[bool] = []
        self.buffers: dict[int, np.ndarray] = {}  # buffer id -> flat storage
        self.owner: list[int | None] = []  # step -> buffer id it writes (None: kernel path)
        self.types: dict[tuple[int, ...], list[TensorType]] = {}

    def _prepare(self, n_inputs: int) -> None:
        self.n_inputs = n_inputs
        is_const = [False] * n_inputs
        owner: list[int | None] = []
        buffer_of: dict[int, int] = {}  # value index -> buffer id
        free_ids = 0
        for k, (_, args, _, t, drop) in enumerate(self.steps):
            const = not t.shape and all(is_const[i] for i in args)
            is_const.append(const)
            if const or self.ufuncs[k] is None or not t.shape:
                owner.append(None)
                continue
            reuse = next((buffer_of[i] for i in drop if i in buffer_of), None)
            if reuse is None:
                reuse, free_ids = free_ids, free_ids + 1
            buffer_of[n_inputs + k] = reuse
            owner.append(reuse)
        self.constant = is_const[n_inputs:]
        self.owner = owner
        self.const_values: dict[int, Any] = {}

    def run(self, values, shape, asarray=None):
        if asarray is not None:  # another engine's arrays: the general path
            return self._run_general(values, shape, asarray)
        if self.n_inputs != len(values):
            self._prepare(len(values))
        types = self._types(shape)
        size = math.prod(shape)
        vals = list(values)
        for k, ((fn, args, attrs, t, drop), out_t) in enumerate(zip(self.steps, types)):
            operands = [vals[i] for i in args]
            v = self.const_values.get(k)
            if v is None:
                buf = self.owner[k]
                ufunc = self.ufuncs[k]
                if buf is not None and all(getattr(x, "dtype", None) == t.dtype.np for x in operands):
                    v = ufunc(*operands, out=self._buffer(buf, size, t.dtype.np).reshape(shape))
                else:
                    v = _rounded(fn(operands, attrs, out_t), out_t)
                if self.constant[k]:
                    self.const_values[k] = v
            vals.append(v)
            for i in drop:
                vals[i] = None
        return vals[-1]

    def _buffer(self, buf: int, size: int, dtype: np.dtype) -> np.ndarray:
        b = self.buffers.get(buf)
        if b is None or b.size < size or b.dtype != dtype:
            b = self.buffers[buf] = np.empty(max(size, SLICE_ELEMENTS), dtype=dtype)
        return b[:size]

    def _types(self, shape):
        types = self.types.get(shape)
        if types is None:
            types = self.types[shape] = [TensorType(shape if t.shape else (), t.dtype)
                                         for _, _, _, t, _ in self.steps]
        return types

    def _run_general(self, values, shape, asarray):
        vals = list(values)
        for (fn, args, attrs, _, drop), out_t in zip(self.steps, self._types(shape)):
            vals.append(_rounded(asarray(fn([vals[i] for i in args], attrs, out_t)), out_t))
            for i in drop:
                vals[i] = None
        return vals[-1]


def _rounded(v, t: TensorType):
    """A step's value in its own dtype. Kernels may return a wider one (sigmoid of float16
    computes in float64) and leave the rounding to the engine; inside a program the next
    step must read what the graph says this one is, as it would unfused."""
    want = t.dtype.np
    return v if getattr(v, "dtype", want) == want else v.astype(want)


def _dt(x):
    from triplane.proto import dtypes

    return dtypes.dtype(x.dtype)
