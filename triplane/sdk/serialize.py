"""``tp.save(obj, path)`` / ``tp.load(path)``: state dicts in files that no pickle reads.

What can be saved: a state dict, i.e. nested dicts (str or int keys), lists and tuples
whose leaves are numpy arrays, Tensors (saved as their values), numbers, bools, strings
and None: ``model.state_dict()``, ``opt.state_dict()``, ``sched.state_dict()`` or a dict
of them. Anything else (a Module, a function, an object array) is refused with
``TypeError`` naming where in the structure it is, before anything is written.

The file is a ``.npz`` (numpy's zip of ``.npy`` arrays): one entry per array and a
``__triplane__`` entry holding the structure as UTF-8 JSON in a uint8 array. Arrays are
written without object dtypes and read with ``allow_pickle=False``, so loading a file
never runs code; a file holding pickled data, or of another format, is refused with
``ValueError``. A plain ``np.savez(path, **model.state_dict())`` file (no structure
entry) loads as the flat dict it holds. The file is written to a temporary name and
renamed, so an interrupted save leaves the previous file whole.

A path ending in ``.safetensors`` uses that format instead (when the ``safetensors``
package is installed; ``ImportError`` with the install command otherwise): the same
arrays, the structure in the file's metadata. A plain safetensors file (no structure)
loads as its flat dict of arrays.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from triplane.proto import dtypes as dt
from triplane.sdk.tensor import Tensor

__all__ = ["load", "save"]

_META = "__triplane__"
_FORMAT = "triplane.state/1"
_WHAT = ("a state dict holds arrays, Tensors, numbers, bools, strings, None, and lists, tuples "
         "and dicts (str or int keys) of them")


def _check_path(path: str | os.PathLike[str], verb: str) -> str:
    p = os.fspath(path)
    if not p.endswith((".npz", ".safetensors")):
        raise ValueError(f"tp.{verb}: {p!r}: unknown format; tp.save and tp.load use .npz files "
                         "(numpy's zip of arrays, no pickle), so name the file '*.npz' "
                         "(or '*.safetensors' with the safetensors package)")
    return p


def _safetensors() -> Any:
    try:
        from safetensors import numpy as st  # type: ignore[import-not-found]
    except ImportError as e:
        raise ImportError("tp.save/tp.load of a .safetensors file needs the safetensors package: "
                          "python3 -m pip install safetensors (or use a .npz file name)") from e
    return st


def _encode(obj: Any, arrays: dict[str, np.ndarray], where: str) -> Any:
    if isinstance(obj, Tensor):
        obj = np.array(obj.numpy())
    if isinstance(obj, np.generic):
        obj = np.asarray(obj)
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject or obj.dtype.kind not in "biufc":
            if obj.dtype.name == "bfloat16":  # not a dtype .npy knows: stored as its bits
                name = f"a{len(arrays)}"
                arrays[name] = obj.view(np.uint16)
                return {"array": name, "dtype": "bfloat16"}
            raise TypeError(f"tp.save: {where} is an array of dtype {obj.dtype}; {_WHAT}")
        name = f"a{len(arrays)}"
        arrays[name] = obj
        return {"array": name}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return {"value": obj}
    if isinstance(obj, Mapping):
        items = []
        for k, v in obj.items():
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise TypeError(f"tp.save: {where} has a key {k!r} of type {type(k).__name__}; {_WHAT}")
            items.append([k, _encode(v, arrays, f"{where}[{k!r}]")])
        return {"dict": items}
    if isinstance(obj, (list, tuple)):
        kind = "list" if isinstance(obj, list) else "tuple"
        return {kind: [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(obj)]}
    hint = " (save its state_dict())" if hasattr(obj, "state_dict") else ""
    raise TypeError(f"tp.save: {where} is a {type(obj).__name__}{hint}; {_WHAT}")


def save(obj: Any, path: str | os.PathLike[str]) -> None:
    """Write ``obj`` (a state dict, see the module docstring) to ``path`` (``*.npz``)."""
    p = _check_path(path, "save")
    arrays: dict[str, np.ndarray] = {}
    tree = _encode(obj, arrays, "the object")
    meta = json.dumps({"format": _FORMAT, "tree": tree}, allow_nan=True).encode()
    st = _safetensors() if p.endswith(".safetensors") else None
    if st is None:
        arrays[_META] = np.frombuffer(meta, dtype=np.uint8)
    fd, tmp = tempfile.mkstemp(prefix=".tp-save-", suffix=".tmp", dir=os.path.dirname(os.path.abspath(p)))
    try:
        with os.fdopen(fd, "wb") as f:
            if st is None:
                np.savez(f, **arrays)
        if st is not None:
            st.save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, tmp,
                         metadata={_META: meta.decode()})
        os.replace(tmp, p)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _decode(node: Any, files: Any, p: str) -> Any:
    if not isinstance(node, dict) or len(node) not in (1, 2):
        raise ValueError(f"tp.load: {p!r}: malformed structure entry near {str(node)[:80]!r}")
    if "array" in node:
        arr = files[node["array"]]
        if node.get("dtype") == "bfloat16":
            arr = arr.view(dt.bfloat16.np)
        return arr
    if "value" in node:
        return node["value"]
    if "dict" in node:
        return {k: _decode(v, files, p) for k, v in node["dict"]}
    if "list" in node:
        return [_decode(v, files, p) for v in node["list"]]
    if "tuple" in node:
        return tuple(_decode(v, files, p) for v in node["tuple"])
    raise ValueError(f"tp.load: {p!r}: malformed structure entry {sorted(node)}")


def load(path: str | os.PathLike[str]) -> Any:
    """Read what :func:`save` wrote (arrays come back as numpy arrays, ready for
    ``load_state_dict``). Never unpickles: a file with pickled data is refused."""
    p = _check_path(path, "load")
    if p.endswith(".safetensors"):
        return _load_safetensors(p)
    refused = (f"tp.load: {p!r} is not a triplane state file: it holds pickled data, which is never "
               "loaded (pickle can run code); save with tp.save or np.savez of plain arrays")
    try:
        with np.load(p, allow_pickle=False) as files:
            if not isinstance(files, np.lib.npyio.NpzFile):
                raise ValueError(f"tp.load: {p!r} is a single .npy array, not a .npz state file")
            if _META not in files.files:
                return {k: files[k] for k in files.files}
            meta = json.loads(files[_META].tobytes().decode())
            if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
                raise ValueError(f"tp.load: {p!r}: unknown state format {meta.get('format')!r} "
                                 f"(this version reads {_FORMAT!r})")
            return _decode(meta["tree"], files, p)
    except ValueError as e:
        if "pickle" in str(e):
            raise ValueError(refused) from None
        raise
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise ValueError(f"tp.load: {p!r} is not a .npz state file ({e})") from None


def _load_safetensors(p: str) -> Any:
    _safetensors()
    from safetensors import safe_open  # type: ignore[import-not-found]

    if not os.path.exists(p):
        raise FileNotFoundError(p)
    try:
        with safe_open(p, framework="numpy") as f:
            files = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (not a dict)
            meta_text = (f.metadata() or {}).get(_META)
    except Exception as e:  # the package's own error type for a malformed file
        raise ValueError(f"tp.load: {p!r} is not a safetensors file ({e})") from None
    if meta_text is None:
        return files
    meta = json.loads(meta_text)
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
        raise ValueError(f"tp.load: {p!r}: unknown state format (this version reads {_FORMAT!r})")
    return _decode(meta["tree"], files, p)
