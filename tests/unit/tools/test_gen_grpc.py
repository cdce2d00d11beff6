"""tools/gen_grpc.py: the checked-in gRPC stubs are what the .proto generates today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "tools" / "gen_grpc.py"
STUBS = ROOT / "triplane" / "scheduler" / "grpc"
SERVING = ROOT / "triplane" / "serving"


def test_the_checked_in_stubs_are_what_the_proto_generates(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    written = [Path(line) for line in r.stdout.split()]
    assert sorted(p.name for p in written) == [
        "serving_pb2.py", "serving_pb2.pyi", "serving_pb2_grpc.py",
        "triplane_pb2.py", "triplane_pb2.pyi", "triplane_pb2_grpc.py"]
    for fresh in written:
        checked_in = ROOT / fresh.relative_to(tmp_path)
        assert checked_in.read_text() == fresh.read_text(), (
            f"{checked_in.relative_to(ROOT)} is out of date with proto/triplane.proto: "
            "run `python3 tools/gen_grpc.py` and commit the result")


def test_the_stubs_import_one_another_by_the_package_path() -> None:
    """Generated under the package's proto path: no top-level ``import triplane_pb2``."""
    text = (STUBS / "triplane_pb2_grpc.py").read_text()
    assert "from triplane.scheduler.grpc import triplane_pb2 as" in text
    assert "\nimport triplane_pb2" not in text
    assert "from triplane.serving import serving_pb2 as" in (SERVING / "serving_pb2_grpc.py").read_text()


def test_a_changed_proto_is_noticed(tmp_path: Path) -> None:
    """The comparison can fail: a stub generated from an edited .proto differs."""
    root = tmp_path / "checkout"
    (root / "proto").mkdir(parents=True)
    (root / "tools").mkdir()
    proto = (ROOT / "proto" / "triplane.proto").read_text()
    edited = proto.replace("message ListNodesRequest {}", "message ListNodesRequest { bool all = 1; }")
    (root / "proto" / "triplane.proto").write_text(edited)
    (root / "proto" / "serving.proto").write_text((ROOT / "proto" / "serving.proto").read_text())
    (root / "tools" / "gen_grpc.py").write_text(SCRIPT.read_text())
    r = subprocess.run([sys.executable, str(root / "tools" / "gen_grpc.py")], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    fresh = root / "triplane" / "scheduler" / "grpc" / "triplane_pb2.py"
    assert fresh.read_text() != (STUBS / "triplane_pb2.py").read_text()
