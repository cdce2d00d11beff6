"""From a submitted graph to TaskSpecs (``compile_job``, the one compile entry, and
triplane.scheduler.compiler.jobplan): pure, no sockets."""

from __future__ import annotations

import pytest

from triplane.proto.errors import GraphError
from triplane.proto.ir import Graph
from triplane.scheduler.compiler import PlanCache
from triplane.scheduler.compiler.compile import compile_job
from triplane.scheduler.compiler.jobplan import (
    MAX_ATTRS_BYTES,
    is_job_id,
    is_tensor_id,
    new_job_id,
    new_tensor_id,
    unsupported_op,
)

U = "u-" + "ab" * 16


def graph(extra: dict | None = None, outputs: tuple[str, ...] = ("z",)) -> Graph:
    nodes = {
        "x": {
            "op": "input",
            "shape": [2, 3],
            "dtype": "float32",
            "attrs": {"tensor": U, "shape": [2, 3], "dtype": "float32"},
        },
        "y": {"op": "exp", "inputs": ["x"], "shape": [2, 3], "dtype": "float32"},
        "z": {"op": "add", "inputs": ["y", "x"], "shape": [2, 3], "dtype": "float32"},
        **(extra or {}),
    }
    return Graph.from_dict({"version": 1, "nodes": nodes, "outputs": list(outputs)})


def test_ids_have_the_documented_form() -> None:
    assert is_job_id(new_job_id()) and len(new_job_id()) == 17
    assert is_tensor_id(new_tensor_id()) and not is_tensor_id("u-xyz")
    assert new_job_id() != new_job_id()


def test_one_task_per_non_input_node_with_task_deps_only() -> None:
    jp = compile_job(graph(), ["z", "y"], cache=PlanCache(), job="j0000000000000001", group=False)
    by_op = {s.op: s for s in jp.specs}
    assert set(by_op) == {"exp", "add"}  # the input is no task
    exp, add = by_op["exp"], by_op["add"]
    assert exp.deps == () and add.deps == (exp.id,)  # the upload is not a dep
    assert exp.is_output and add.is_output
    assert add.cost_s > 0 and add.output_bytes == 24
    tpl = jp.templates[add.id]
    assert tpl.inputs == (f"j0000000000000001.{exp.id}", U)  # argument order, tile ids
    assert tpl.uploads == (U,)
    assert jp.fetch_tile("z") == (f"j0000000000000001.{add.id}", add.id)
    assert jp.ops == {"exp", "add"}


def test_a_fetched_node_that_is_not_an_output_is_kept() -> None:
    jp = compile_job(graph(), ["y"], cache=PlanCache(), job="j0000000000000001", group=False)
    assert "y" in jp.fetch and jp.fetch["y"] in jp.templates
    grouped = compile_job(graph(), ["y"], cache=PlanCache(), job="j0000000000000001")
    assert grouped.fetch["y"] in grouped.templates["g"].tiles


def test_fetching_an_upload_reads_the_uploaded_tensor() -> None:
    jp = compile_job(graph(), ["x", "z"], cache=PlanCache(), job="j0000000000000001")
    assert jp.fetch_tile("x") == (U, None)


def test_errors_name_the_submitted_node_not_the_canonical_one() -> None:
    bad = graph(
        {"w": {"op": "matmul", "inputs": ["x", "x"], "shape": [2, 2], "dtype": "float32"}}, outputs=("z", "w")
    )
    with pytest.raises(GraphError) as e:
        compile_job(bad, ["w"], cache=PlanCache(), job="j0000000000000001")
    assert e.value.node == "w" and e.value.op == "matmul"


def test_unknown_fetch_name_is_refused() -> None:
    with pytest.raises(GraphError, match="not a node"):
        compile_job(graph(), ["nope"], cache=PlanCache(), job="j0000000000000001")


def test_input_must_reference_an_uploaded_tensor_id() -> None:
    g = Graph.from_dict(
        {
            "version": 1,
            "nodes": {
                "x": {
                    "op": "input",
                    "shape": [1],
                    "dtype": "float32",
                    "attrs": {"tensor": "t-local", "shape": [1], "dtype": "float32"},
                },
                "y": {"op": "exp", "inputs": ["x"], "shape": [1], "dtype": "float32"},
            },
            "outputs": ["y"],
        }
    )
    with pytest.raises(GraphError, match="uploaded tensor id") as e:
        compile_job(g, ["y"], cache=PlanCache(), job="j0000000000000001")
    assert e.value.node == "x"


def test_attributes_too_large_for_a_packet_are_refused_naming_the_node() -> None:
    import base64

    data = base64.b64encode(bytes(MAX_ATTRS_BYTES)).decode()
    n = MAX_ATTRS_BYTES // 4
    g = Graph.from_dict(
        {
            "version": 1,
            "nodes": {
                "c": {
                    "op": "constant",
                    "shape": [n],
                    "dtype": "float32",
                    "attrs": {"shape": [n], "dtype": "float32", "data": data},
                },
                "y": {"op": "exp", "inputs": ["c"], "shape": [n], "dtype": "float32"},
            },
            "outputs": ["y"],
        }
    )
    with pytest.raises(GraphError, match="do not fit a task packet"):
        compile_job(g, ["y"], cache=PlanCache(), job="j0000000000000001")


def test_unsupported_op_names_the_first_op_no_engine_lists() -> None:
    assert unsupported_op({"exp", "add"}, [["exp"], ["add", "mul"]]) is None
    assert unsupported_op({"exp", "matmul", "add"}, [["exp", "add"]]) == "matmul"
    assert unsupported_op({"exp"}, []) == "exp"


def test_the_same_graph_hits_the_plan_cache() -> None:
    cache = PlanCache()
    compile_job(graph(), ["z"], cache=cache, job="j0000000000000001")
    compile_job(graph(), ["z"], cache=cache, job="j0000000000000002")
    assert cache.hits == 1
