"""``tp.save_model`` / ``tp.load_model``: a traced graph and its parameters in one file.

``save_model(fn_or_module, example_inputs, path)`` traces ``fn(*example_inputs)`` (a
module's ``forward``, in eval mode, its parameters and buffers named as in its
``state_dict``) and writes the model file of ``triplane/proto/modelfile.py``: the
canonical graph, the parameters and a manifest with the input and output signatures.
Dimension 0 of the inputs is the batch: it is recorded as dynamic (``None``) when the
function's graph fits any batch (``model_trace.py`` says how that is found) and as the
example's size otherwise, with the reason in ``manifest["batch"]["reason"]``.

``load_model(path, key=None)`` checks the file (every refusal is a
:class:`~triplane.proto.errors.ModelFileError` whose ``kind`` says which check failed)
and returns a :class:`Model`; calling it records the graph on the given inputs in the
current session (in this process, or the cluster of ``tp.connect``). docs/models.md is
the user's guide.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from triplane._version import __version__
from triplane.proto import dtypes as dt
from triplane.proto import modelfile
from triplane.proto.errors import DTypeError, GraphError, ModelFileError, ShapeError, UnknownOpError
from triplane.proto.ir import Graph
from triplane.proto.validate import validate
from triplane.sdk.model_trace import BatchRule, apply_rules, batch_rules, trace, with_batch
from triplane.sdk.tensor import Tensor, apply

__all__ = ["Model", "ModelSignature", "TensorSpec", "build_model", "load_model", "save_model", "trace_model"]


class TensorSpec(NamedTuple):
    """One input or output of a model: its name, dtype name and shape (``None`` for a
    dynamic dimension: the batch)."""

    name: str
    dtype: str
    shape: tuple[int | None, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TensorSpec:
        return cls(str(d["name"]), str(d["dtype"]), tuple(None if s is None else int(s) for s in d["shape"]))


@dataclass(frozen=True)
class ModelSignature:
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]


class Model:
    """A loaded model: ``signature``, ``params`` (name -> array), ``graph`` (the canonical
    IR, traced at ``manifest["batch"]["size"]``), ``manifest`` (the file's manifest as a
    dict), ``version`` (the file's format version) and ``digest`` (SHA-256 of the manifest,
    which covers every byte of the model: two files with equal digests hold the same
    model). Call it with one array or Tensor per input."""

    def __init__(self, manifest: dict[str, Any], graph: Graph, params: dict[str, np.ndarray],
                 digest: str) -> None:
        self.manifest = manifest
        self.graph = graph
        self.params = params
        self.digest = digest
        self.version: int = int(manifest["format_version"])
        self.signature = ModelSignature([TensorSpec.from_dict(s) for s in manifest["inputs"]],
                                        [TensorSpec.from_dict(s) for s in manifest["outputs"]])
        batch = manifest["batch"]
        self._batch: int | None = batch["size"]
        self._rules: list[BatchRule] | None = batch["rules"] if batch["dynamic"] else None
        self._values: dict[str, Tensor] = {}

    def save(self, path: str | os.PathLike[str], *, key: Any = None) -> Model:
        """Write this model to ``path`` (signed with ``key``, as :func:`save_model` says);
        returns the model as written (the same digest)."""
        fields = {k: v for k, v in self.manifest.items() if k not in modelfile.CONTAINER_KEYS}
        written, mbytes = modelfile.write(path, fields, self.graph.to_json(), self.params, key=key)
        return Model(written, self.graph, self.params, hashlib.sha256(mbytes).hexdigest())

    def __repr__(self) -> str:
        ins = ", ".join(f"{s.name}: {s.dtype}{list(s.shape)}" for s in self.signature.inputs)
        outs = ", ".join(f"{s.dtype}{list(s.shape)}" for s in self.signature.outputs)
        return f"Model(({ins}) -> ({outs}), {len(self.params)} params, digest={self.digest[:12]})"

    def check_inputs(self, args: Sequence[Any]) -> tuple[list[Tensor], int | None]:
        """The inputs as Tensors of the signature's dtypes, and their batch size. A wrong
        count is a TypeError; a wrong shape or dtype a ShapeError / DTypeError naming the
        input. Python lists and scalars are cast to the input's dtype (when numpy casts
        them within their kind); arrays and Tensors must have it already."""
        specs = self.signature.inputs
        if len(args) != len(specs):
            names = ", ".join(s.name for s in specs)
            raise TypeError(f"this model takes {len(specs)} input(s) ({names}), got {len(args)}")
        out: list[Tensor] = []
        batch: int | None = None
        for spec, a in zip(specs, args):
            want = dt.BY_NAME[spec.dtype]
            if isinstance(a, Tensor):
                t = a
            else:
                arr = a if isinstance(a, np.ndarray) else np.asarray(a)
                if not isinstance(a, np.ndarray) and arr.dtype != want.np and arr.dtype.kind in "biuf" \
                        and np.can_cast(arr.dtype, want.np, "same_kind"):
                    arr = arr.astype(want.np)
                if arr.dtype.kind not in "biuf" and arr.dtype.name != "bfloat16":
                    raise DTypeError(f"input {spec.name!r}: expected {spec.dtype}, got {arr.dtype} data")
                t = Tensor.from_array(arr)
            if t.dtype.name != spec.dtype:
                raise DTypeError(f"input {spec.name!r}: expected dtype {spec.dtype}, got {t.dtype.name}")
            shape = t.shape
            if len(shape) != len(spec.shape) or any(w not in (None, s) for w, s in zip(spec.shape, shape)):
                raise ShapeError(f"input {spec.name!r}: expected shape {_shown(spec.shape)}, "
                                 f"got {list(shape)}")
            if spec.shape and spec.shape[0] is None:
                if batch is not None and shape[0] != batch:
                    raise ShapeError(f"input {spec.name!r}: batch size {shape[0]} differs from the "
                                     f"other inputs' {batch}")
                batch = shape[0]
            out.append(t)
        return out, batch

    def __call__(self, *args: Any) -> Tensor | tuple[Tensor, ...]:
        """The outputs on these inputs (lazy Tensors of the current session: read them with
        ``.numpy()``); one output is returned as a Tensor, several as a tuple."""
        xs, batch = self.check_inputs(args)
        by_name = {f"input:{s.name}": x for s, x in zip(self.signature.inputs, xs)}
        changed: dict[str, dict[str, Any]] = {}
        if self._rules and batch is not None and batch != self._batch:
            changed = apply_rules(self.graph, self._rules, batch)
        env: dict[str, Tensor] = {}
        for nid, node in self.graph.nodes.items():
            if node.op == "input":
                name = node.attrs["tensor"]
                env[nid] = by_name[name] if name in by_name else self._value(name)
            else:
                attrs = changed.get(nid, node.attrs)
                env[nid] = apply(node.op, [env[i] for i in node.inputs], **attrs)
        outs = tuple(env[o] for o in self.graph.outputs)
        return outs[0] if len(outs) == 1 else outs

    def _value(self, tensor: str) -> Tensor:
        t = self._values.get(tensor)
        if t is None:
            name = tensor.split(":", 1)[1] if tensor.startswith("param:") else tensor
            t = self._values[tensor] = Tensor.from_array(self.params[name])
        return t


def _shown(shape: Sequence[int | None]) -> str:
    return "[" + ", ".join("batch" if s is None else str(s) for s in shape) + "]"


def _input_names(fn: Callable[..., Any], n: int, names: Any) -> tuple[list[str], list[str] | None]:
    outs = None
    if isinstance(names, Mapping):
        outs = list(names.get("outputs", [])) or None
        names = names.get("inputs")
    if names is not None:
        names = [str(x) for x in names]
        if len(names) != n or len(set(names)) != n:
            raise ValueError(f"tp.save_model: names gives {names}, but the model takes {n} inputs "
                             "(one distinct name each)")
        return names, outs
    import inspect

    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    found = [p.name for p in params[:n]]
    return (found if len(found) == n else [f"input{i}" for i in range(n)]), outs


def save_model(fn_or_module: Any, example_inputs: Any, path: str | os.PathLike[str], *,
               key: Any = None, names: Any = None) -> Model:
    """Trace ``fn_or_module(*example_inputs)`` and write it to ``path`` as a model file.

    ``fn_or_module``: a function of Tensors, a ``tp.nn.Module`` (traced in eval mode, its
    parameters and buffers named as in its state dict) or a ``tp.Model``.
    ``example_inputs``: one array/Tensor or a sequence of them (dimension 0 is the batch).
    ``key`` signs the file: ``bytes``/``str`` (HMAC-SHA256) or a ``cryptography``
    ``Ed25519PrivateKey``. ``names``: the inputs' names (a list), or a mapping with
    ``inputs`` and ``outputs`` lists; by default the function's parameter names and
    ``output`` (``output0, output1, ...`` for several). Returns the model as written."""
    return trace_model(fn_or_module, example_inputs, names=names, what="tp.save_model").save(path, key=key)


def trace_model(fn_or_module: Any, example_inputs: Any, *, names: Any = None,
                what: str = "trace_model") -> Model:
    """The model :func:`save_model` writes, in memory (``to_onnx`` traces with it too)."""
    from triplane.sdk.nn.modules import Module

    params: dict[int, str] = {}
    modes: list[tuple[Any, bool]] = []
    sig_fn: Callable[..., Any] | None = None
    if isinstance(fn_or_module, Model):
        model = fn_or_module
        params = {id(model._value(f"param:{k}")): k for k in model.params if not k.startswith("const:")}
        if names is None:
            names = {"inputs": [s.name for s in model.signature.inputs],
                     "outputs": [s.name for s in model.signature.outputs]}
    elif isinstance(fn_or_module, Module):
        sig_fn = fn_or_module.forward
        params = {id(t): n for n, t in [*fn_or_module.named_parameters(), *fn_or_module.named_buffers()]}
        modes = [(m, m.training) for m in fn_or_module.modules()]
        fn_or_module.eval()
    elif not callable(fn_or_module):
        raise TypeError(f"{what}: expected a function, a tp.nn.Module or a tp.Model, got "
                        f"{type(fn_or_module).__name__}")
    try:
        return build_model(fn_or_module, example_inputs, names=names, param_names=params, sig_fn=sig_fn)
    finally:
        for m, mode in modes:
            m.training = mode


def build_model(fn: Callable[..., Any], example_inputs: Any, *, names: Any = None,
                param_names: Mapping[int, str] | None = None,
                sig_fn: Callable[..., Any] | None = None) -> Model:
    """The model :func:`save_model` would write, in memory: ``fn`` traced on
    ``example_inputs``, the tensors of ``param_names`` (id -> name) stored under their names."""
    if isinstance(example_inputs, (Tensor, np.ndarray)) or not isinstance(example_inputs, (list, tuple)):
        example_inputs = (example_inputs,)
    arrays = [np.asarray(x.numpy() if isinstance(x, Tensor) else x) for x in example_inputs]
    arrays = [a.astype(np.float32) if a.dtype == np.float64 and not isinstance(x, (np.ndarray, Tensor)) else a
              for a, x in zip(arrays, example_inputs)]
    params = dict(param_names or {})
    in_names, out_names = _input_names(sig_fn or fn, len(arrays), names)
    graph, values, n_out = trace(fn, arrays, in_names, params)
    more: list[Graph] = []
    batch = {"size": None, "dynamic": False, "rules": [], "reason": "an input has no dimension 0"}
    sizes = {a.shape[0] for a in arrays if a.ndim}
    if arrays and all(a.ndim for a in arrays) and len(sizes) == 1 and min(sizes) >= 1:
        b = sizes.pop()
        batch.update(size=b, reason="")
        try:
            more = [trace(fn, with_batch(arrays, k), in_names, params)[0] for k in (1, 2)]
            rules, reason = batch_rules([graph, *more], b)
        except (GraphError, ValueError, TypeError) as e:
            rules, reason = None, f"tracing it at batch {b + 1} failed: {e}"
        batch.update(dynamic=rules is not None, rules=rules or [], reason=reason)
    elif len(sizes) > 1:
        batch["reason"] = f"its inputs' first dimensions differ ({sorted(sizes)})"
    if out_names is None:
        out_names = ["output"] if n_out == 1 else [f"output{i}" for i in range(n_out)]
    if len(out_names) != n_out:
        raise ValueError(f"tp.save_model: names gives {len(out_names)} outputs, the model has {n_out}")
    dyn = batch["dynamic"]

    def in_spec(name: str, a: np.ndarray) -> dict[str, Any]:
        dims = [None if dyn and i == 0 else d for i, d in enumerate(a.shape)]
        return TensorSpec(name, dt.dtype(a.dtype).name, tuple(dims)).to_dict()

    def out_spec(name: str, nid: str) -> dict[str, Any]:
        # a dimension is dynamic where it changed with the batch (a scalar loss has none)
        o = graph.nodes[nid]
        others = [g.nodes[nid].shape for g in more] if dyn else []
        dims = [None if any(s[i] != d for s in others) else d for i, d in enumerate(o.shape)]
        return TensorSpec(name, o.dtype, tuple(dims)).to_dict()

    manifest = {
        "triplane_version": __version__,
        "inputs": [in_spec(n, a) for n, a in zip(in_names, arrays)],
        "outputs": [out_spec(n, o) for n, o in zip(out_names, graph.outputs)],
        "batch": batch,
    }
    doc, mbytes, _ = modelfile.pack(manifest, graph.to_json(), values)
    return Model(doc, graph, values, hashlib.sha256(mbytes).hexdigest())


def load_model(path: str | os.PathLike[str], *, key: Any = None) -> Model:
    """Read, check and return the model at ``path``; with ``key`` (the HMAC key, or an
    Ed25519 public key) its signature is verified too. Refusals: ModelFileError."""
    manifest, graph_json, params, mbytes = modelfile.read(path, key=key)
    where = f"model file {os.fspath(path)!r}"
    if manifest.get("format") != "triplane.model":
        raise ModelFileError("corrupted", f"{where} is corrupted: format {manifest.get('format')!r}")
    try:
        graph = Graph.from_json(graph_json)
        validate(graph)
        missing = [n.attrs["tensor"] for n in graph.nodes.values() if n.op == "input"
                   and not n.attrs["tensor"].startswith("input:")
                   and n.attrs["tensor"].removeprefix("param:") not in params]
        if missing:
            raise GraphError(f"its graph reads {missing[:5]}, which the file does not hold")
        model = Model(manifest, graph, params, hashlib.sha256(mbytes).hexdigest())
    except UnknownOpError as e:
        raise ModelFileError("unknown_op", f"{where} holds a graph with an op this triplane does not "
                             f"know (a custom op is registered with tp.register_op before loading): "
                             f"{e}") from None
    except GraphError as e:
        raise ModelFileError("corrupted", f"{where} holds a graph triplane cannot run: {e}") from None
    except (KeyError, TypeError, ValueError) as e:
        raise ModelFileError("corrupted", f"{where} is corrupted: its manifest lacks or "
                             f"garbles {e}") from None
    return model
