"""``triplane explain``: on a graph document and on a script, as text and as JSON,
called in-process (no subprocess) with the output captured."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import typer

from triplane.explain_cli import cluster_figures, explain_command, load_target
from triplane.proto.builder import Builder


def run(capsys: pytest.CaptureFixture[str], target: Path, **options: object) -> str:
    explain_command(target, **options)  # type: ignore[arg-type]
    return capsys.readouterr().out


def write_graph(tmp_path: Path, suffix: str) -> Path:
    b = Builder()
    a = b.op("uniform", shape=(256, 256), seed=1)
    w = b.op("normal", shape=(256, 256), seed=2)
    y = b.op("sum", b.op("matmul", a, w))
    g = b.graph([y])
    path = tmp_path / f"graph{suffix}"
    if suffix == ".json":
        path.write_bytes(g.to_json())
    else:
        path.write_text(g.to_yaml())
    return path


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_graph_document_is_placed_and_explained(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  suffix: str) -> None:
    path = write_graph(tmp_path, suffix)
    doc = json.loads(run(capsys, path, nodes=2, as_json=True))
    assert [t["op"] for t in doc["tasks"]].count("matmul") == 1 and len(doc["tasks"]) == 4
    assert {t["node"] for t in doc["tasks"]} <= {"n0", "n1"}
    assert [c["node"] for c in doc["cluster"]] == ["n0", "n1"]
    assert doc["cluster"][0]["memory_free_bytes"] == 768 * 2**20
    assert doc["makespan"]["predicted_s"] == max(t["predicted"]["finish_s"] for t in doc["tasks"])
    text = run(capsys, path, nodes=2, width=200)
    assert "predicted makespan" in text
    for t in doc["tasks"]:  # same plan as text: every task on its node
        assert any(ln.startswith(f"│ {t['task']} ") and f"│ {t['node']} " in ln for ln in text.splitlines())


def test_cluster_options_change_the_prediction(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_graph(tmp_path, ".json")
    slow = json.loads(run(capsys, path, nodes=1, gflops=10.0, as_json=True))
    fast = json.loads(run(capsys, path, nodes=1, gflops=100.0, as_json=True))
    mm = [next(t for t in d["tasks"] if t["op"] == "matmul") for d in (slow, fast)]
    overhead = 200e-6
    assert mm[0]["predicted"]["compute_s"] - overhead == pytest.approx(
        10 * (mm[1]["predicted"]["compute_s"] - overhead), rel=1e-9)


SCRIPT = """
import numpy as np
import triplane as tp

x = tp.tensor(np.ones((64, 32), dtype=np.float32))
w = tp.randn(32, 16)
hidden = tp.relu(x @ w)
scores = hidden.sum(axis=1)
unused = tp.zeros(3)
{marker}
"""


def test_a_script_marks_what_to_explain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent(SCRIPT.format(marker="explain = [scores]")))
    doc = json.loads(run(capsys, path, as_json=True))
    ops = sorted(t["op"] for t in doc["tasks"])
    assert "matmul" in ops and "full" not in ops  # `unused` is not explained
    assert {t["origin"] for t in doc["tasks"]} >= {"w", "scores"}  # the script's names
    uploads = [t for t in doc["tensors"] if t["tiles"][0]["node"] == "scheduler"]
    assert [u["type"] for u in uploads] == ["float32[64, 32]"]  # x: host data, uploaded
    text = run(capsys, path)
    assert "(scores)" in text and "matmul" in text


def test_without_a_marker_the_script_results_are_explained(tmp_path: Path) -> None:
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent(SCRIPT.format(marker="")))
    graph, labels = load_target(path)
    results = {labels.get(o) for o in graph.outputs}
    assert results == {"scores", "unused"}  # what no other module-level tensor reads


def test_a_bad_marker_is_an_error_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent(SCRIPT.format(marker="explain = 42")))
    with pytest.raises(typer.Exit) as e:
        run(capsys, path)
    assert e.value.exit_code == 1
    assert "`explain` must be a tensor" in capsys.readouterr().err


def test_a_script_that_raises_is_reported_with_its_line_not_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.py"
    path.write_text("import triplane as tp\n\na = tp.no_such_op((4, 4))\n")
    with pytest.raises(typer.Exit) as e:
        run(capsys, path)
    assert e.value.exit_code == 1
    err = capsys.readouterr().err
    assert "script broken.py failed at line 3: AttributeError" in err
    assert "no_such_op" in err and "Traceback" not in err


def test_a_graph_too_big_for_the_nodes_fails_naming_the_limit(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    b = Builder()
    # Tiling cuts what is too big for one node; 32 MiB outgrows all three nodes together.
    big = b.op("uniform", shape=(1024, 8192), seed=0)
    path = tmp_path / "big.json"
    path.write_bytes(b.graph([b.op("exp", big)]).to_json())
    with pytest.raises(typer.Exit):
        run(capsys, path, memory="6MiB")
    err = capsys.readouterr().err
    assert "float32[1024, 8192] needs 32 MiB" in err and "total memory of 18 MiB" in err


def test_unknown_target_kind_and_bad_sizes_are_errors(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "graph.txt"
    path.write_text("{}")
    with pytest.raises(typer.Exit):
        run(capsys, path)
    assert ".json, .yaml" in capsys.readouterr().err
    with pytest.raises(ValueError, match="as a size"):
        cluster_figures(nodes=1, memory="lots", gflops=1, gbps=1, bandwidth="1GB/s", latency_us=0)


def test_the_live_registry_supplies_the_nodes() -> None:
    import asyncio

    from triplane.registry.connect import connect_registry
    from triplane.registry.records import MemoryEngineInfo, NetworkEngineInfo, NodeInfo, OpEngineInfo
    from triplane.registry.records import encode as enc

    url = "memory://t2-explain-test"
    backend = connect_registry(url)

    async def fill() -> None:
        for name, gf in (("a", 30.0), ("b", 60.0)):
            for rec in (NodeInfo(name, "127.0.0.1", 1, 1, 2, "0", 0.0, 1),
                        OpEngineInfo(name, "numpy", "numpy", "cpu", ("matmul",), ("float32",), gf, 5.0),
                        MemoryEngineInfo(name, "host", "host", 2**30, 2**29),
                        NetworkEngineInfo(name, "tcp", "tcp", 1.25, 50.0)):
                await backend.put(rec.key(), enc(rec))

    asyncio.run(fill())
    figs = cluster_figures(nodes=9, memory="1GiB", gflops=1, gbps=1, bandwidth="1GB/s", latency_us=0,
                           registry=url)
    assert [(f.name, f.gflops, f.free, f.bandwidth_gbps) for f in figs] == [
        ("a", 30.0, 2**29, 1.25), ("b", 60.0, 2**29, 1.25)]
