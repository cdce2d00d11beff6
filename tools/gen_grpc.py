"""Generate the gRPC stubs of ``proto/triplane.proto`` into ``triplane/scheduler/grpc/`` and of
``proto/serving.proto`` (the model server's) into ``triplane/serving/``.

    python3 tools/gen_grpc.py            # rewrite the checked-in stubs
    python3 tools/gen_grpc.py --out DIR  # write them under DIR/<package>/ instead

The stubs are checked in (the scheduler needs no code generator at run time) and a test
(tests/unit/tools/test_gen_grpc.py) regenerates them into a temporary directory and fails
when they differ: run this after changing the .proto. The output depends on the version
of grpcio-tools (its headers name it), so the dev extra pins that version and this script
refuses any other. protoc sees the .proto under the package's path
(``--proto_path=triplane/scheduler/grpc=proto``), so the generated modules import one
another as ``triplane.scheduler.grpc.*`` (``triplane.serving.*``) with no editing afterwards.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (the .proto under proto/, the package its stubs go to)
TARGETS = (("triplane.proto", "triplane/scheduler/grpc"), ("serving.proto", "triplane/serving"))
TOOLS_VERSION = "1.85.1"  # grpcio-tools, as pinned in pyproject.toml's dev extra


def generate(out: Path) -> list[Path]:
    """Write the stubs of every target under ``out / package``; their paths. RuntimeError naming what is wrong
    (grpcio-tools missing or of another version, protoc failing)."""
    try:
        have = version("grpcio-tools")
    except PackageNotFoundError:
        raise RuntimeError("grpcio-tools is not installed "
                           f"(pip install grpcio-tools=={TOOLS_VERSION})") from None
    if have != TOOLS_VERSION:
        raise RuntimeError(f"grpcio-tools {have} is installed; the stubs are generated with "
                           f"{TOOLS_VERSION} (pip install grpcio-tools=={TOOLS_VERSION}, "
                           "or change TOOLS_VERSION and the pin)")
    from grpc_tools import protoc

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, package in TARGETS:
        proto = ROOT / "proto" / name
        args = ["protoc", f"--proto_path={package}={proto.parent}", f"--python_out={out}",
                f"--grpc_python_out={out}", f"--pyi_out={out}", str(proto)]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {proto} (its messages are above)")
        stem = name.removesuffix(".proto")
        written += [out / package / f"{stem}{suffix}" for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")]
    return written


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="root to write under (default: this checkout)")
    opts = parser.parse_args(argv)
    try:
        paths = generate(opts.out)
    except RuntimeError as e:
        print(f"gen_grpc: {e}", file=sys.stderr)
        return 1
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
