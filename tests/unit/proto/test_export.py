"""The op table exported as data (proto/ops.json, proto/vectors/shapes/): the checked-in
files are what ``python -m triplane.proto.export`` writes, they cover every op, and every
vector holds against the Python inference (as the Go and JS SDKs run them)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from triplane.proto import optable
from triplane.proto.errors import GraphError
from triplane.proto.export import files, main
from triplane.proto.infer import infer_node
from triplane.proto.ir import TensorType, thaw
from triplane.proto.opdef import REQUIRED

ROOT = Path(__file__).parents[3]
SHAPES = ROOT / "proto" / "vectors" / "shapes"
KINDS = {"graph", "shape", "dtype", "attr", "limit", "unknown_op"}


def test_the_checked_in_files_are_up_to_date() -> None:
    stale = [str(p.relative_to(ROOT)) for p, data in files(ROOT).items()
             if not p.is_file() or p.read_bytes() != data]
    assert not stale, f"run `python -m triplane.proto.export` and commit: out of date {stale}"
    assert {p.stem for p in SHAPES.glob("*.json")} == set(optable.names())


def test_check_fails_and_names_a_stale_file_then_writing_fixes_it(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "proto", tmp_path / "proto")
    (tmp_path / "proto" / "vectors" / "shapes" / "add.json").write_text("{}\n")
    (tmp_path / "proto" / "vectors" / "shapes" / "gone.json").write_text("{}\n")
    run = [sys.executable, "-m", "triplane.proto.export", "--root", str(tmp_path)]
    r = subprocess.run([*run, "--check"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 1
    assert "proto/vectors/shapes/add.json" in r.stderr and "gone.json" in r.stderr
    assert subprocess.run(run, capture_output=True, cwd=ROOT).returncode == 0
    assert main(["--root", str(tmp_path), "--check"]) == 0
    assert not (tmp_path / "proto" / "vectors" / "shapes" / "gone.json").exists()


def test_ops_json_describes_every_op_of_the_table() -> None:
    doc = json.loads((ROOT / "proto" / "ops.json").read_bytes())
    assert set(doc["ops"]) == set(optable.names())
    for name, entry in doc["ops"].items():
        o = optable.get(name)
        assert (entry["arity"], entry["differentiable"], entry["internal"]) == (o.arity, o.grad is not None,
                                                                               o.internal)
        assert set(entry["dtypes"]) == set(o.dtypes)
        for attr, spec in o.attrs.items():
            e = entry["attrs"][attr]
            assert (e["type"], e["required"]) == (spec.kind, spec.default is REQUIRED)
            if spec.default is not REQUIRED:
                assert e["default"] == thaw(spec.default)
    rules = {name: doc["ops"][name]["result_dtype"] for name in ("add", "eq", "cast", "where", "argmax")}
    assert rules == {"add": "input:0", "eq": "fixed:bool", "cast": "attr:dtype", "where": "input:1",
                     "argmax": "fixed:int64"}


def _vectors() -> list[tuple[str, int, dict[str, Any]]]:
    out = []
    for p in sorted(SHAPES.glob("*.json")):
        doc = json.loads(p.read_bytes())
        out += [(doc["op"], i, c) for i, c in enumerate(doc["cases"])]
    return out


VECTORS = _vectors()


def test_every_op_has_a_case_that_infers_and_the_usual_ones_a_refusal() -> None:
    ok = {op for op, _, c in VECTORS if "output" in c}
    refused = {op for op, _, c in VECTORS if "error" in c}
    assert ok == set(optable.names())
    public = {n for n in optable.names() if not optable.get(n).internal}
    assert len(public - refused) <= 2, sorted(public - refused)
    assert {c["error"] for _, _, c in VECTORS if "error" in c} <= KINDS
    broadcast = [c for op, _, c in VECTORS if op == "add" and "output" in c]
    assert {"shape": [2, 4], "dtype": "float32"} in [c["output"] for c in broadcast]


@pytest.mark.parametrize(("op", "i", "case"), VECTORS, ids=[f"{op}-{i}" for op, i, _ in VECTORS])
def test_the_vector_holds_against_the_python_inference(op: str, i: int, case: dict[str, Any]) -> None:
    ins = [TensorType(tuple(t["shape"]), _dtype(t["dtype"])) for t in case["inputs"]]
    if "error" in case:
        with pytest.raises(GraphError) as e:
            infer_node(op, ins, case["attrs"])
        assert e.value.kind == case["error"]
    else:
        attrs, out = infer_node(op, ins, case["attrs"])
        assert {"shape": list(out.shape), "dtype": out.dtype.name} == case["output"]
        assert thaw(attrs) == case["normalised_attrs"]


def _dtype(name: str) -> Any:
    from triplane.proto import dtypes as dt

    return dt.dtype(name)
