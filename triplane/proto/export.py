"""The op table as data, for the SDKs of other languages: ``proto/ops.json`` (every op's
name, arity, attribute schema, accepted dtypes, result dtype rule and properties) and
``proto/vectors/shapes/<op>.json`` (inference cases with their expected result), both
generated from the Python table and checked in.

    python -m triplane.proto.export           # write them (from the repository root)
    python -m triplane.proto.export --check   # exit 1, naming the stale files, if out of date

tests/unit/proto/test_export.py fails when the checked-in files differ from what this
writes. The files are JSON with sorted keys, ending in a newline (ops.json indented, the
vectors one case a line).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from triplane.proto import dtypes as dt
from triplane.proto import optable
from triplane.proto.errors import GraphError
from triplane.proto.infer import infer_node
from triplane.proto.ir import thaw
from triplane.proto.opcases import cases_for, parse_type
from triplane.proto.opdef import REQUIRED, OpDef

__all__ = ["OPS_VERSION", "files", "main", "ops_document", "vectors_of"]

OPS_VERSION = 1


def vectors_of(op: str) -> dict[str, Any]:
    """``op``'s vector document: each case with its expected output type (and the attributes
    as the op table normalises them, defaults filled) or its expected error kind."""
    cases = []
    for inputs, attrs in cases_for(op):
        types = [parse_type(t) for t in inputs]
        case: dict[str, Any] = {"inputs": [{"shape": list(t.shape), "dtype": t.dtype.name} for t in types],
                                "attrs": attrs}
        try:
            normalised, out = infer_node(op, types, attrs)
        except GraphError as e:
            case["error"] = e.kind
        else:
            case["output"] = {"shape": list(out.shape), "dtype": out.dtype.name}
            case["normalised_attrs"] = thaw(normalised)
        cases.append(case)
    return {"version": OPS_VERSION, "op": op, "cases": cases}


def _attr_schema(spec: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"type": spec.kind, "required": spec.default is REQUIRED}
    if spec.default is not REQUIRED:
        d["default"] = thaw(spec.default) if isinstance(spec.default, tuple) else spec.default
    if spec.nullable or spec.kind in ("axes", "any"):
        d["nullable"] = True
    if spec.choices is not None:
        d["choices"] = list(spec.choices)
    return d


def _result_dtype(opdef: OpDef, vectors: dict[str, Any]) -> str:
    """The rule its vectors' successful cases all follow: ``input:<k>`` (input k's dtype),
    ``attr:dtype`` (the ``dtype`` attribute), or ``fixed:<dtype>``."""
    ok = [c for c in vectors["cases"] if "output" in c]
    rules = [f"input:{k}" for k in range(max((len(c["inputs"]) for c in ok), default=0))]
    rules += ["attr:dtype"] + [f"fixed:{d}" for d in dt.BY_NAME]
    for rule in rules:
        if ok and all(c["output"]["dtype"] == _dtype_by(rule, c) for c in ok):
            return rule
    raise AssertionError(f"no dtype rule fits the vectors of {opdef.name}")


def _dtype_by(rule: str, case: dict[str, Any]) -> str | None:
    kind, _, arg = rule.partition(":")
    if kind == "input":
        return case["inputs"][int(arg)]["dtype"] if int(arg) < len(case["inputs"]) else None
    if kind == "attr":
        return case["normalised_attrs"].get("dtype")
    return arg


def ops_document() -> dict[str, Any]:
    """``proto/ops.json``: every op of the table (see proto/README.md for the fields)."""
    ops = {}
    for name, o in sorted(optable.table().items()):
        ops[name] = {
            "group": o.group,
            "arity": o.arity,
            "attrs": {k: _attr_schema(v) for k, v in o.attrs.items()},
            "dtypes": sorted(o.dtypes, key=list(dt.BY_NAME).index),
            "result_dtype": _result_dtype(o, vectors_of(name)),
            "differentiable": o.differentiable,
            "nograd_inputs": sorted(o.nograd_inputs),
            "elementwise": o.elementwise,
            "random": o.random,
            "view": o.view,
            "internal": o.internal,
            "doc": o.doc,
        }
    return {"version": OPS_VERSION, "dtypes": list(dt.BY_NAME), "ops": ops}


def _render(doc: Any) -> bytes:
    return (json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=True) + "\n").encode()


def _render_vectors(doc: dict[str, Any]) -> bytes:
    """One case a line (the same JSON as ``_render`` would give, laid out for diffs)."""
    cases = ",\n".join("  " + json.dumps(c, sort_keys=True, ensure_ascii=True) for c in doc["cases"])
    head = json.dumps({k: v for k, v in doc.items() if k != "cases"}, sort_keys=True)[:-1]
    return f'{head}, "cases": [\n{cases}\n]}}\n'.encode()


def files(root: Path) -> dict[Path, bytes]:
    """Every generated file under the repository ``root`` -> its bytes."""
    out = {root / "proto" / "ops.json": _render(ops_document())}
    for name in optable.names():
        out[root / "proto" / "vectors" / "shapes" / f"{name}.json"] = _render_vectors(vectors_of(name))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m triplane.proto.export", description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path.cwd(), help="the repository root (default: .)")
    ap.add_argument("--check", action="store_true", help="only say which files are out of date")
    args = ap.parse_args(argv)
    wanted = files(args.root)
    shapes_dir = args.root / "proto" / "vectors" / "shapes"
    extra = sorted(set(shapes_dir.glob("*.json")) - set(wanted)) if shapes_dir.is_dir() else []
    stale = [p for p, data in wanted.items() if not p.is_file() or p.read_bytes() != data]
    if args.check:
        for p in [*stale, *extra]:
            print(f"out of date: {p.relative_to(args.root)}", file=sys.stderr)
        return 1 if stale or extra else 0
    for p in extra:
        p.unlink()
    for p in stale:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(wanted[p])
    print(f"wrote {len(stale)} file(s), removed {len(extra)}, of {len(wanted)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
