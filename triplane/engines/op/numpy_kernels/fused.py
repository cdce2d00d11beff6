"""The fused-program kernel: runs a chain of elementwise kernels slice by slice, so the
temporaries are the size of one slice (cache-sized) rather than of the whole tensor."""

from __future__ import annotations

import math

import numpy as np

from triplane.engines.op.numpy_engine import KERNELS, kernel
from triplane.proto.ir import TensorType
from triplane.proto.ops.fused import program_types

SLICE_ELEMENTS = 1 << 15


@kernel("fused")
def _fused(ins, a, out):
    program = a["program"]
    step_types = program_types([TensorType(x.shape, _dt(x)) for x in ins], a)
    shape = out.shape
    result = np.empty(shape, dtype=out.dtype.np)
    if not shape or math.prod(shape) <= SLICE_ELEMENTS or shape[0] == 1:
        result[...] = _run(program, step_types, list(ins), shape)
        return result
    nd = len(shape)
    aligned = [x.reshape((1,) * (nd - x.ndim) + x.shape) for x in ins]
    rows = max(1, SLICE_ELEMENTS // max(1, math.prod(shape[1:])))
    for start in range(0, shape[0], rows):
        stop = min(start + rows, shape[0])
        part = [x[start:stop] if x.shape[0] != 1 else x for x in aligned]
        result[start:stop] = _run(program, step_types, part, (stop - start, *shape[1:]))
    return result


def _run(program, step_types, values, shape):
    vals = list(values)
    # Drop each value after its last reader, so a slice holds a few temporaries at a
    # time rather than one per step.
    last = {}
    for k, (_, args, _) in enumerate(program):
        for i in args:
            last[i] = k
    for k, ((op, args, attrs), t) in enumerate(zip(program, step_types)):
        out_t = TensorType(shape if t.shape else (), t.dtype)
        vals.append(KERNELS[op]([vals[i] for i in args], attrs, out_t))
        for i in args:
            if last[i] == k:
                vals[i] = None
    return vals[-1]


def _dt(x):
    from triplane.proto import dtypes

    return dtypes.dtype(x.dtype)
