"""The generic C-ABI op engine: a shared library of ``triplane_engine.h``, through ctypes.

No pickle and no Python objects cross the boundary: buffers, shapes, dtype names and a
JSON string of attributes go in; a status code and a message come back. The engine
checks what it can on the Python side: the library's ABI version at load, each buffer's
byte size against its shape and dtype, and a guard zone after the output that the
kernel must leave untouched (a kernel writing past its output fails the task, naming
the op, instead of corrupting the heap silently -- bounded, not a sandbox).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from triplane.engines.errors import EngineError
from triplane.proto import dtypes as dt
from triplane.proto import optable
from triplane.proto.errors import KernelError, TriplaneError
from triplane.proto.ir import TensorType

__all__ = ["ABI_VERSION", "ABI_VERSIONS", "AbiError", "CAbiEngine", "header_path"]

ABI_VERSION = 2  # the header's; libraries of version 1 (no tp_engine_claim) load too
ABI_VERSIONS = (1, 2)
_ERR_LEN = 1024
_GUARD = 64  # bytes after the output that a kernel must not touch
_GUARD_BYTE = 0xA5
_CODES = {1: "unsupported", 2: "invalid", 3: "out of memory", 4: "internal"}


def header_path() -> Path:
    """Where ``triplane_engine.h`` is installed (give it to your C compiler with -I)."""
    return Path(__file__).with_name("triplane_engine.h")


class AbiError(EngineError):
    """A library that does not implement this ABI (missing symbol, other version, bad
    capabilities) or that failed to make its engine."""

    kind = "engine"


class _Buffer(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("ndim", ctypes.c_int32), ("dtype", ctypes.c_char_p), ("nbytes", ctypes.c_int64)]


def _bind(lib: ctypes.CDLL, path: str) -> None:
    sigs = {
        "tp_abi_version": ([], ctypes.c_uint32),
        "tp_engine_create": ([ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p,
                              ctypes.c_size_t], ctypes.c_int),
        "tp_engine_destroy": ([ctypes.c_void_p], None),
        "tp_engine_capabilities": ([ctypes.c_void_p], ctypes.c_char_p),
        "tp_engine_run": ([ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int32,
                           ctypes.POINTER(_Buffer), ctypes.POINTER(_Buffer), ctypes.c_char_p,
                           ctypes.c_size_t], ctypes.c_int),
    }
    for symbol, (args, res) in sigs.items():
        try:
            fn = getattr(lib, symbol)
        except AttributeError:
            raise AbiError(f"{path} does not export {symbol} (not a triplane_engine.h library)") from None
        fn.argtypes, fn.restype = args, res


class CAbiEngine:
    """An op engine backed by a shared library of the C ABI (``triplane_engine.h``).

    ``CAbiEngine(path, options={...})`` loads the library, checks its ABI version, makes
    its engine with ``options`` (as JSON) and reads its capabilities: ``name``, ``device``
    and the ops with their dtypes, which :meth:`supports` answers from.
    """

    def __init__(self, path: str | os.PathLike[str], *, options: Mapping[str, Any] | None = None,
                 name: str | None = None) -> None:
        self.path = os.fspath(path)
        try:
            self._lib = ctypes.CDLL(self.path)
        except OSError as e:
            raise AbiError(f"cannot load {self.path}: {e}") from None
        _bind(self._lib, self.path)
        version = int(self._lib.tp_abi_version())
        if version not in ABI_VERSIONS:
            raise AbiError(f"{self.path} implements ABI version {version}; this triplane loads "
                           f"versions {' and '.join(map(str, ABI_VERSIONS))}")
        self.abi_version = version
        # Optional since version 2: fused chains claimed in the manner of ONNX Runtime's
        # GetCapability (claim, run_chain).
        self._claim = getattr(self._lib, "tp_engine_claim", None) if version >= 2 else None
        if self._claim is not None:
            self._claim.argtypes, self._claim.restype = [ctypes.c_void_p, ctypes.c_char_p], ctypes.c_int32
        handle, err = ctypes.c_void_p(), ctypes.create_string_buffer(_ERR_LEN)
        rc = self._lib.tp_engine_create(json.dumps(dict(options or {})).encode(), ctypes.byref(handle),
                                        err, _ERR_LEN)
        if rc != 0 or not handle.value:
            raise AbiError(f"{self.path}: tp_engine_create failed ({_CODES.get(rc, rc)}): "
                           f"{err.value.decode(errors='replace')}")
        self._handle = handle
        self._lock = threading.Lock()
        try:
            caps = json.loads(self._lib.tp_engine_capabilities(handle).decode())
            self.name = name or str(caps["name"])
            self.device = str(caps.get("device", "cpu"))
            self.ops: dict[str, frozenset[str]] = {
                str(op): frozenset(map(str, dts)) for op, dts in dict(caps["ops"]).items()}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            self.close()
            raise AbiError(f"{self.path}: bad capabilities JSON ({type(e).__name__}: {e})") from None

    def close(self) -> None:
        """Destroy the library's engine (idempotent)."""
        handle, self._handle = getattr(self, "_handle", None), None
        if handle is not None and handle.value:
            self._lib.tp_engine_destroy(handle)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: the library may be gone
            self.close()

    def supports(self, op: str, dtypes: Sequence[str] = ()) -> bool:
        accepted = self.ops.get(op)
        return accepted is not None and all(d in accepted for d in dtypes)

    def run(self, op: str, inputs: Sequence[Any], attrs: Mapping[str, Any], out: TensorType) -> np.ndarray:
        if self._handle is None:
            raise KernelError(f"engine {self.name!r} is closed", op=op, kind="infra")
        arrays = [np.asarray(x) for x in inputs]
        if not self.supports(op, [a.dtype.name for a in arrays]):
            raise KernelError(f"engine {self.name!r} does not run {op} on "
                              f"{[a.dtype.name for a in arrays]}", op=op, kind="infra")
        return self._call(op, arrays, attrs, out, broadcast=_elementwise(op))

    def claim(self, ops: Sequence[str], dtype: str) -> int:
        """How many of the leading ops of the chain ``ops`` (each after the first reads the
        previous one's output as its first input; every input of ``dtype``) the library runs
        as one kernel (``tp_engine_claim``); 0 when it fuses none of it, has no claim
        function (ABI version 1) or does not run every op of the chain on ``dtype``."""
        if self._claim is None or self._handle is None or len(ops) < 2:
            return 0
        if not all(self.supports(op, [dtype]) for op in ops):
            return 0
        n = int(self._claim(self._handle, json.dumps({"ops": list(ops), "dtype": dtype}).encode()))
        return n if 2 <= n <= len(ops) else 0

    def run_chain(self, ops: Sequence[str], attrs: Sequence[Mapping[str, Any]], inputs: Sequence[Any],
                  out: TensorType) -> np.ndarray:
        """Run a claimed chain as one kernel: ``tp_engine_run`` with op ``chain:<op>+<op>...``,
        attributes ``{"attrs": [each op's]}`` and ``inputs`` (the first op's, then each later
        op's other inputs, in order). KernelError (infra) for a chain it did not claim whole."""
        arrays = [np.asarray(x) for x in inputs]
        dtype = arrays[0].dtype.name if arrays else out.dtype.name
        if self._handle is None or self.claim(ops, dtype) != len(ops):
            raise KernelError(f"engine {self.name!r} does not claim the chain {'+'.join(ops)} on {dtype}",
                              op=ops[0] if ops else "chain", kind="infra")
        return self._call("chain:" + "+".join(ops), arrays, {"attrs": [dict(a) for a in attrs]}, out,
                          broadcast=all(_elementwise(op) for op in ops))

    def _call(self, op: str, arrays: list[np.ndarray], attrs: Mapping[str, Any], out: TensorType, *,
              broadcast: bool) -> np.ndarray:
        if broadcast:
            arrays = [np.broadcast_to(a, out.shape) for a in arrays]
        arrays = [np.ascontiguousarray(a) for a in arrays]
        shapes = [np.asarray(a.shape, dtype=np.int64) for a in arrays]
        dtypes = [a.dtype.name.encode() for a in arrays]
        bufs = (_Buffer * max(len(arrays), 1))()
        for i, a in enumerate(arrays):
            bufs[i] = _Buffer(a.ctypes.data, shapes[i].ctypes.data_as(ctypes.POINTER(ctypes.c_int64)),
                              a.ndim, dtypes[i], a.nbytes)
        want = np.dtype(out.dtype.np)
        nbytes = int(np.prod(out.shape, dtype=np.int64)) * want.itemsize
        raw = np.full(nbytes + _GUARD, _GUARD_BYTE, dtype=np.uint8)
        out_shape = np.asarray(out.shape, dtype=np.int64)
        out_dtype = want.name.encode()
        obuf = _Buffer(raw.ctypes.data, out_shape.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)),
                       len(out.shape), out_dtype, nbytes)
        err = ctypes.create_string_buffer(_ERR_LEN)
        attrs_json = json.dumps(dict(attrs), default=_jsonable).encode()
        rc = self._lib.tp_engine_run(self._handle, op.encode(), attrs_json, len(arrays), bufs,
                                     ctypes.byref(obuf), err, _ERR_LEN)
        if rc != 0:
            message = err.value.decode(errors="replace") or "no message"
            raise KernelError(f"engine {self.name!r} ({_CODES.get(rc, f'code {rc}')}): {message}", op=op,
                              kind="user" if rc == 2 else "infra")
        if not (raw[nbytes:] == _GUARD_BYTE).all():
            raise KernelError(f"engine {self.name!r} wrote past the end of its {nbytes}-byte output",
                              op=op, kind="infra")
        return raw[:nbytes].view(want).reshape(out.shape)

    def benchmark(self, size: int = 256, budget_s: float = 0.1) -> dict[str, float]:
        """matmul GFLOP/s and elementwise GB/s where the library runs matmul / add on
        float32 (0.0 for what it does not run)."""
        figures = {"matmul_gflops": 0.0, "elementwise_gbps": 0.0}
        a = np.ones((size, size), dtype=np.float32)
        runs = (("matmul", "matmul_gflops", 2 * size**3), ("add", "elementwise_gbps", 3 * a.nbytes))
        for op, key, work in runs:
            if self.supports(op, ["float32", "float32"]):
                best, deadline = 0.0, time.perf_counter() + budget_s / 2
                for i in range(50):
                    if i >= 2 and time.perf_counter() > deadline:
                        break
                    t = time.perf_counter()
                    self.run(op, [a, a], {}, TensorType((size, size), dt.float32))
                    best = max(best, work / max(time.perf_counter() - t, 1e-9))
                figures[key] = best / 1e9
        return figures


def _elementwise(op: str) -> bool:
    try:
        return optable.get(op).elementwise
    except TriplaneError:
        return False


def _jsonable(value: Any) -> Any:
    if isinstance(value, (tuple, frozenset, set)):
        return list(value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return str(value)
