"""The three message kinds, their limits and their validation (wire dict <-> dataclass)."""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Literal, NamedTuple, NoReturn

from triplane.proto import dtypes as dt
from triplane.proto.limits import MAX_RANK
from triplane.proto.packet.errors import invalid_field

VERSION = 2
MAX_DATAGRAM_BYTES = 1472  # 1500-byte Ethernet MTU - 20 (IPv4) - 8 (UDP)
MAX_FRAME_BYTES = 65536    # TCP frame payload bound
MAX_DEPTH = 32             # nesting of attrs; also guards the C YAML composer, which recurses
MAX_ID_CHARS = 128         # keeps every key under YAML's 1024-character simple-key limit
MIN_SECRET_BYTES = 16
DEFAULT_GRACE = 10.0       # seconds a task may arrive after its deadline (clock skew)
DEFAULT_MAX_AHEAD = 86400.0  # a deadline further ahead is refused: it would outlive replay memory
DEFAULT_MAX_AGE = 30.0     # control messages and tasks: |now - t| bound
CARRY_MAX_BYTES = 32768    # a task packet's carried input values (``data``), raw bytes in all
REPLY_CARRY_MAX_BYTES = 256  # a reply's carried output values (``data``): a loss, a few scalars

_ID = re.compile(r"[A-Za-z0-9_.:/@+=,~-]{1,128}")
_TASK_ID = re.compile(r"([A-Za-z0-9_-]{1,48})\.([A-Za-z0-9_-]{1,48})\.a(0|[1-9][0-9]{0,5})")
_DTYPE = re.compile(r"[a-z][a-z0-9_]{0,31}")
_INT64 = (-(2**63), 2**63 - 1)


# --- messages ---------------------------------------------------------------------
# NamedTuples rather than frozen dataclasses: equally immutable and typed, but built five
# times faster, and a decoder builds one per packet. (Caveat: they compare equal to plain
# tuples of the same values.)


class TaskPacket(NamedTuple):
    """One task for one executor. ``task`` is ``<job>.<task>.a<attempt>``; ``pull_from`` maps
    each input tile the executor lacks to the node to pull it from (keys are a subset of
    ``inputs``); ``attrs`` holds JSON-like values; ``deadline`` is unix seconds. ``to`` is
    the node the task is for (an executor refuses a packet for another node) and ``t`` the
    sender's unix time when it wrote the packet (a packet is refused ``DEFAULT_MAX_AGE``
    after it, and by an executor that started after it): both must be given to encode."""

    task: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    deadline: float
    pull_from: Mapping[str, str] = MappingProxyType({})
    attrs: Mapping[str, Any] = MappingProxyType({})
    to: str = ""
    t: float = 0.0
    data: Mapping[str, Carried] = MappingProxyType({})


class Carried(NamedTuple):
    """An input tile's value carried in a task packet's ``data`` instead of pulled: a small
    upload (a compiled step's minibatch) goes with its task, saving the executor a round
    trip to the scheduler's data port. Raw little-endian C-order bytes (base64 on the wire,
    covered by the packet's signature); at most ``CARRY_MAX_BYTES`` in one packet; a
    carried tile is an input (``in``) and is not in ``from``."""

    shape: tuple[int, ...]
    dtype: str
    data: bytes


class TileInfo(NamedTuple):
    tile: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int


class Timings(NamedTuple):
    """Unix seconds on the executor: received, kernel start, kernel end."""

    queued: float
    start: float
    end: float


class TaskError(NamedTuple):
    """``user``: the kernel rejected its data (not retried). ``infra``: the node failed
    (the scheduler drifts the task to another node). ``node``: the node the failure is
    about -- for a failed pull the node the input was to come from, else the executor
    itself; ``input``: the input tile that could not be pulled; ``at``: for a grouped task
    (op ``graph``), the id of the sub-graph node whose kernel failed. All optional on the
    wire (absent = None)."""

    kind: Literal["user", "infra"]
    message: str
    node: str | None = None
    input: str | None = None
    at: str | None = None


class Reply(NamedTuple):
    """An executor's answer. ``ok`` is true iff ``error`` is None; a failed task has no
    outputs. ``data`` carries the values of some small outputs (at most
    ``REPLY_CARRY_MAX_BYTES`` in all; keys among ``outputs``' tiles, each value of its
    tile's shape and dtype), so that the scheduler answers them without reading them back."""

    task: str
    ok: bool
    timings: Timings
    outputs: tuple[TileInfo, ...] = ()
    error: TaskError | None = None
    data: Mapping[str, Carried] = MappingProxyType({})


class Control(NamedTuple):
    """``ping``/``pong`` (``id`` is a nonce the pong echoes) or ``ack`` (``id`` is the task id
    received; the scheduler stops retransmitting it). ``t`` is the sender's unix time.
    ``since`` (acks only, optional): the unix time the task's kernel started on the
    executor -- the progress report of a task still running (absent while it is queued
    or pulling its inputs)."""

    kind: Literal["ping", "pong", "ack"]
    id: str
    t: float
    since: float | None = None


Message = TaskPacket | Reply | Control


def parse_task_id(task: str) -> tuple[str, str, int]:
    """``"j42.t17.a0"`` -> ``("j42", "t17", 0)``; ``PacketInvalid`` if it is not of that form."""
    m = _TASK_ID.fullmatch(task) if type(task) is str else None
    if m is None:
        invalid_field("task", f"expected '<job>.<task>.a<attempt>', got {task!r}")
    return m.group(1), m.group(2), int(m.group(3))


# --- schema --------------------------------------------------------------------------


_id_match = _ID.fullmatch
_ids_match = re.compile(r"[A-Za-z0-9_.:/@+=,~-]{1,128}(?: [A-Za-z0-9_.:/@+=,~-]{1,128})*").fullmatch
_task_id_match = _TASK_ID.fullmatch
_dtype_match = _DTYPE.fullmatch


def _bad_id(v: Any, path: str) -> NoReturn:
    invalid_field(path, f"expected an id (1-{MAX_ID_CHARS} of A-Z a-z 0-9 _.:/@+=,~-), got {v!r:.80}")


def _id(v: Any, path: str) -> str:
    if type(v) is not str or _id_match(v) is None:
        _bad_id(v, path)
    return v


def _ids(v: Any, path: str) -> tuple[str, ...]:
    if type(v) is not list and type(v) is not tuple:
        invalid_field(path, f"expected a list of ids, got {type(v).__name__}")
    for i, x in enumerate(v):
        if type(x) is not str or _id_match(x) is None:
            _bad_id(x, f"{path}[{i}]")  # the path is built only on failure: this is the hot path
    return tuple(v)


def _time(v: Any, path: str) -> float:
    if (type(v) is not float and type(v) is not int) or not math.isfinite(v):
        invalid_field(path, f"expected a finite number of unix seconds, got {v!r:.80}")
    return float(v)


def _keys(d: Any, expected: frozenset[str], path: str) -> None:
    if type(d) is not dict:
        invalid_field(path, f"expected a mapping, got {type(d).__name__}")
    if d.keys() != expected:
        missing, unknown = sorted(expected - d.keys()), sorted(map(str, d.keys() - expected))
        what = f"missing {missing}" if missing else f"unknown {unknown}"
        invalid_field(path, f"{what} (fields: {sorted(expected)})")


class _BadValue(Exception):
    """Internal: a bad attribute value; ``where`` collects its path on the way up."""

    def __init__(self, message: str) -> None:
        self.message, self.where = message, ""


def _value(v: Any, depth: int) -> None:
    t = type(v)
    if t is str or t is bool or v is None:
        return
    if t is int:
        if not _INT64[0] <= v <= _INT64[1]:
            raise _BadValue("integer outside the signed 64-bit range")
    elif t is float:
        if not math.isfinite(v):
            raise _BadValue(f"{v!r} is not allowed (NaN and infinities have no JSON form)")
    elif depth >= MAX_DEPTH:
        raise _BadValue(f"nested deeper than {MAX_DEPTH} levels")
    elif t is list or t is tuple:
        for i, x in enumerate(v):
            try:
                _value(x, depth + 1)
            except _BadValue as e:
                e.where = f"[{i}]{e.where}"
                raise
    elif t is dict:
        for k, x in v.items():
            if type(k) is not str or len(k) > MAX_ID_CHARS:
                raise _BadValue(f"keys must be strings of at most {MAX_ID_CHARS} characters: {k!r:.80}")
            try:
                _value(x, depth + 1)
            except _BadValue as e:
                e.where = f".{k}{e.where}"
                raise
    else:
        raise _BadValue(f"unsupported type {t.__name__} (use str, int, float, bool, None, list, dict)")


def _attrs(v: Any) -> dict[str, Any]:
    if type(v) is not dict:
        invalid_field("attrs", f"expected a mapping, got {type(v).__name__}")
    try:
        _value(v, 0)
    except _BadValue as e:
        invalid_field(f"attrs{e.where}", e.message)
    return v


_TASK_KEYS = frozenset({"v", "task", "op", "in", "out", "from", "attrs", "deadline", "to", "t"})
_REPLY_KEYS = frozenset({"v", "task", "ok", "error", "outputs", "timings"})
_CONTROL_KEYS = frozenset({"v", "kind", "id", "t"})
_TASK_CARRY_KEYS = _TASK_KEYS | {"data"}
_REPLY_CARRY_KEYS = _REPLY_KEYS | {"data"}
_CARRIED_KEYS = frozenset({"shape", "dtype", "b64"})
_TILE_KEYS = frozenset({"tile", "shape", "dtype", "bytes"})
_TIMING_KEYS = frozenset({"queued", "start", "end"})
_ERROR_KEYS = frozenset({"kind", "message"})
_ERROR_OPTIONAL = frozenset({"node", "input", "at"})
_ACK_SINCE_KEYS = _CONTROL_KEYS | {"since"}


def task_from_wire(d: dict[str, Any]) -> TaskPacket:
    """The ``TaskPacket`` of wire dict ``d`` (without ``sig``), or ``PacketInvalid``."""
    carried = type(d) is dict and "data" in d
    _keys(d, _TASK_CARRY_KEYS if carried else _TASK_KEYS, "")
    task, op, inputs, outputs, src, to = d["task"], d["op"], d["in"], d["out"], d["from"], d["to"]
    # Fast accept: every id of the packet checked by one regex over their space-joined text
    # (ids hold no spaces, so the count of separators proves none was split); a failure is
    # explained field by field below.
    try:
        ids = [to, op, *inputs, *outputs, *src.values()]
        joined = " ".join(ids)
        fast = (type(inputs) is list and type(outputs) is list and type(src) is dict
                and joined.count(" ") == len(ids) - 1 and _ids_match(joined) is not None)
    except (TypeError, AttributeError):
        fast = False
    if not fast:
        _id(to, "to")
        _id(op, "op")
        _ids(inputs, "in")
        _ids(outputs, "out")
        if type(src) is not dict:
            invalid_field("from", f"expected a mapping tile id -> node id, got {type(src).__name__}")
        for tile, node in src.items():
            _id(node, f"from.{tile}")
    if type(task) is not str or _task_id_match(task) is None:
        parse_task_id(task)  # raises, explaining
    if len(set(outputs)) != len(outputs):
        invalid_field("out", "output tile ids must be distinct")
    for tile in src:
        if tile not in inputs:
            invalid_field(f"from.{tile}", "names a tile that is not among the inputs ('in')")
    return TaskPacket(task, op, tuple(inputs), tuple(outputs), _time(d["deadline"], "deadline"),
                      src, _attrs(d["attrs"]), to, _time(d["t"], "t"),
                      _carried(d["data"], lambda t: t in inputs and t not in src,
                               "an input ('in') that is not pulled ('from')", CARRY_MAX_BYTES)
                      if carried else MappingProxyType({}))


def _carried(v: Any, allowed: Callable[[str], bool], which: str, bound: int) -> dict[str, Carried]:
    """The ``data`` of a task packet or a reply: each key ``allowed`` (``which`` says what
    it must be), each value's shape, dtype and length checked, and ``bound`` on them all."""
    if type(v) is not dict or not v:
        invalid_field("data", "expected a non-empty mapping tile id -> {shape, dtype, b64}")
    out: dict[str, Carried] = {}
    total = 0
    for tile, c in v.items():
        path = f"data.{str(tile)[:MAX_ID_CHARS]}"
        if not allowed(tile):
            invalid_field(path, f"a carried tile must be {which}")
        _keys(c, _CARRIED_KEYS, path)
        shape, dtype, text = c["shape"], c["dtype"], c["b64"]
        if type(shape) is not list or len(shape) > MAX_RANK or \
                any(type(n) is not int or not 0 <= n <= CARRY_MAX_BYTES for n in shape):
            invalid_field(f"{path}.shape", f"expected at most {MAX_RANK} dimensions, each at most "
                                           f"{CARRY_MAX_BYTES}, got {shape!r:.80}")
        if type(dtype) is not str or dtype not in dt.BY_NAME:
            invalid_field(f"{path}.dtype", f"expected a dtype name, got {dtype!r:.40}")
        if type(text) is not str or len(text) > (CARRY_MAX_BYTES + 2) // 3 * 4:
            invalid_field(f"{path}.b64", f"expected base64 of at most {CARRY_MAX_BYTES} bytes")
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            invalid_field(f"{path}.b64", "not valid base64")
        if len(raw) != math.prod(shape) * dt.BY_NAME[dtype].itemsize:
            invalid_field(f"{path}.b64", f"{len(raw)} bytes, a {dtype}{shape} value has "
                                         f"{math.prod(shape) * dt.BY_NAME[dtype].itemsize}")
        total += len(raw)
        if total > bound:
            invalid_field("data", f"carries more than {bound} bytes")
        out[tile] = Carried(tuple(shape), dtype, raw)
    return out


def _tile_from_wire(d: Any, i: int) -> TileInfo:
    # Field paths are formatted only on failure: a scheduler decodes one reply per task.
    if type(d) is not dict or d.keys() != _TILE_KEYS:
        _keys(d, _TILE_KEYS, f"outputs[{i}]")
    shape = d["shape"]
    if type(shape) is not list and type(shape) is not tuple:
        invalid_field(f"outputs[{i}].shape", "expected a list of dimensions")
    if len(shape) > MAX_RANK:
        invalid_field(f"outputs[{i}].shape", f"{len(shape)} dimensions, more than the limit of {MAX_RANK}")
    for j, n in enumerate(shape):
        if type(n) is not int or not 0 <= n <= _INT64[1]:
            invalid_field(f"outputs[{i}].shape[{j}]", f"expected a non-negative integer, got {n!r:.40}")
    tile, dtype, nbytes = d["tile"], d["dtype"], d["bytes"]
    if type(dtype) is not str or _dtype_match(dtype) is None:
        invalid_field(f"outputs[{i}].dtype", f"expected a dtype name, got {dtype!r:.40}")
    if type(nbytes) is not int or not 0 <= nbytes <= _INT64[1]:
        invalid_field(f"outputs[{i}].bytes", f"expected a non-negative integer, got {nbytes!r:.40}")
    if type(tile) is not str or _id_match(tile) is None:
        _bad_id(tile, f"outputs[{i}].tile")
    return TileInfo(tile, tuple(shape), dtype, nbytes)


def reply_from_wire(d: dict[str, Any]) -> Reply:
    carried = type(d) is dict and "data" in d
    _keys(d, _REPLY_CARRY_KEYS if carried else _REPLY_KEYS, "")
    task = d["task"]
    if type(task) is not str or _task_id_match(task) is None:
        parse_task_id(task)  # raises, explaining
    ok, err, outs = d["ok"], d["error"], d["outputs"]
    if type(ok) is not bool:
        invalid_field("ok", f"expected true or false, got {ok!r:.40}")
    if type(outs) is not list and type(outs) is not tuple:
        invalid_field("outputs", "expected a list")
    outputs = tuple([_tile_from_wire(o, i) for i, o in enumerate(outs)])
    error = None
    if ok:
        if err is not None:
            invalid_field("error", "must be null when ok is true")
    else:
        if type(err) is not dict or not _ERROR_KEYS <= err.keys() <= _ERROR_KEYS | _ERROR_OPTIONAL:
            _keys(err, _ERROR_KEYS, "error")  # raises, explaining
        if err["kind"] not in ("user", "infra"):
            invalid_field("error.kind", f"expected 'user' or 'infra', got {err['kind']!r:.40}")
        if type(err["message"]) is not str:
            invalid_field("error.message", "expected a string")
        node, inp = err.get("node"), err.get("input")
        if "node" in err:
            _id(node, "error.node")
        if "input" in err:
            _id(inp, "error.input")
        at = err.get("at")
        if at is not None or "at" in err:
            _id(at, "error.at")
        if outputs:
            invalid_field("outputs", "a failed task has no outputs")
        error = TaskError(err["kind"], err["message"], node, inp, at)
    t = d["timings"]
    _keys(t, _TIMING_KEYS, "timings")
    timings = Timings(_time(t["queued"], "timings.queued"), _time(t["start"], "timings.start"),
                      _time(t["end"], "timings.end"))
    if not carried:
        return Reply(task, ok, timings, outputs, error)
    if not ok:
        invalid_field("data", "a failed task has no outputs to carry")
    kinds = {o.tile: o for o in outputs}
    data = _carried(d["data"], kinds.__contains__, "an output ('outputs')", REPLY_CARRY_MAX_BYTES)
    for tile, c in data.items():
        if (c.shape, c.dtype) != (kinds[tile].shape, kinds[tile].dtype):
            invalid_field(f"data.{tile}", f"is {c.dtype}{list(c.shape)}, its output says "
                                          f"{kinds[tile].dtype}{list(kinds[tile].shape)}")
    return Reply(task, ok, timings, outputs, error, data)


def control_from_wire(d: dict[str, Any]) -> Control:
    since = None
    if type(d) is dict and "since" in d and d.get("kind") == "ack":
        _keys(d, _ACK_SINCE_KEYS, "")
        since = _time(d["since"], "since")
    else:
        _keys(d, _CONTROL_KEYS, "")
    if d["kind"] not in ("ping", "pong", "ack"):
        invalid_field("kind", f"expected 'ping', 'pong' or 'ack', got {d['kind']!r:.40}")
    if d["kind"] == "ack":
        parse_task_id(d["id"])
    return Control(d["kind"], _id(d["id"], "id"), _time(d["t"], "t"), since)


def task_to_wire(p: TaskPacket) -> dict[str, Any]:
    wire = {"v": VERSION, "task": p.task, "op": p.op, "in": list(p.inputs), "out": list(p.outputs),
            "from": dict(p.pull_from), "attrs": p.attrs if type(p.attrs) is dict else dict(p.attrs),
            "deadline": p.deadline, "to": p.to, "t": p.t}
    if p.data:
        wire["data"] = _carried_to_wire(p.data)
    return wire


def _carried_to_wire(data: Mapping[str, Carried]) -> dict[str, Any]:
    return {tile: {"shape": list(c.shape), "dtype": c.dtype, "b64": base64.b64encode(c.data).decode()}
            for tile, c in data.items()}


def reply_to_wire(r: Reply) -> dict[str, Any]:
    err: dict[str, Any] | None = None
    if r.error is not None:
        err = {"kind": r.error.kind, "message": r.error.message}
        if r.error.node is not None:
            err["node"] = r.error.node
        if r.error.input is not None:
            err["input"] = r.error.input
        if r.error.at is not None:
            err["at"] = r.error.at
    outs = [{"tile": o.tile, "shape": list(o.shape), "dtype": o.dtype, "bytes": o.bytes}
            for o in r.outputs]
    t = r.timings
    wire = {"v": VERSION, "task": r.task, "ok": r.ok, "error": err, "outputs": outs,
            "timings": {"queued": t.queued, "start": t.start, "end": t.end}}
    if r.data:
        wire["data"] = _carried_to_wire(r.data)
    return wire


def control_to_wire(c: Control) -> dict[str, Any]:
    wire = {"v": VERSION, "kind": c.kind, "id": c.id, "t": c.t}
    if c.since is not None:
        wire["since"] = c.since
    return wire

