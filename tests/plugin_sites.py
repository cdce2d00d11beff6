"""Installed plugins for the tests: the example vendor package built by its own build step
(``pip install`` into a directory), and a distribution of deliberately bad plugins (its
module and dist-info written by hand). Put a returned directory on ``sys.path`` (or
``PYTHONPATH`` for processes) and its entry points are found like any installed package's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BAD_PLUGINS = textwrap.dedent('''
    """Deliberately bad plugins."""
    import numpy as np

    from triplane.engines.memory.host import HostMemoryEngine
    from triplane.engines.op.numpy_engine import NumpyEngine


    class Broken(NumpyEngine):
        """add: a wrong shape; mul: a wrong dtype; relu: wrong values in float64 only."""

        name = "broken"
        ops = {"add": ["float32", "float64"], "mul": ["float32", "float64"], "relu": ["float32", "float64"]}

        def supports(self, op, dtypes=()):
            return op in self.ops and all(d in self.ops[op] for d in dtypes)

        def run(self, op, inputs, attrs, out):
            result = super().run(op, inputs, attrs, out)
            if op == "add":
                return result.ravel()
            if op == "mul":
                return result.astype(np.float64)
            if op == "relu" and result.dtype == np.float64:
                return result + 0.5
            return result


    class Liar(HostMemoryEngine):
        """Claims twice the capacity it was given."""

        kind = "liar"

        def __init__(self, capacity, name="liar"):
            super().__init__(capacity, name)

        def capacity(self):
            return 2 * super().capacity()

        def free(self):
            return 2 * super().free()


    from triplane.engines.network.tcp import TcpEngine


    class Garbler(TcpEngine):
        """A tcp engine whose replies lose their last byte."""

        def __init__(self):
            super().__init__(name="garbler")

        async def request(self, address, port, frame, *, timeout_s=2.0):
            return (await super().request(address, port, frame, timeout_s=timeout_s))[:-1]
''')

ENTRY_POINTS = {
    "triplane.engines.op": {"broken": "bad_plugins:Broken", "explodes": "bad_import:Engine"},
    "triplane.engines.memory": {"liar": "bad_plugins:Liar"},
    "triplane.engines.network": {"garbler": "bad_plugins:Garbler"},
}


def install_vendor(dest: Path) -> Path:
    """``pip install examples/vendor_engine`` (its C library compiled by its build step)
    into ``dest/site``, from a copy so that builds never share a source tree."""
    src, site = dest / "vendor_src", dest / "site"
    shutil.copytree(ROOT / "examples" / "vendor_engine", src,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "--no-build-isolation", "--no-deps", "--target", str(site), str(src)],
                   check=True, env=env, capture_output=True, timeout=300)
    return site


PY_OPS = textwrap.dedent('''
    """A user op in Python: py_cube(x) = x ** 3, its definition and the engine that runs it."""
    import numpy as np

    from triplane.proto.opdef import OpDef

    OPS = [OpDef("py_cube", "user", 1, lambda ins, attrs: ins[0], dtypes=frozenset({"float32", "float64"}))]


    class CubeEngine:
        name, device = "pyops", "cpu"
        ops = {"py_cube": ["float32", "float64"]}

        def supports(self, op, dtypes=()):
            return op in self.ops and all(d in self.ops[op] for d in dtypes)

        def run(self, op, inputs, attrs, out):
            return (inputs[0] ** 3).astype(out.dtype.np)

        def benchmark(self):
            return {"matmul_gflops": 0.0, "elementwise_gbps": 1.0}
''')


def write_python_ops(dest: Path) -> Path:
    """A distribution ``py-ops`` under ``dest``: the user op ``py_cube`` (entry point
    ``triplane.ops``) and the op engine ``pyops`` that runs it (``triplane.engines.op``)."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "py_ops.py").write_text(PY_OPS)
    info = dest / "py_ops-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: py-ops\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[triplane.ops]\ncube = py_ops:OPS\n\n"
                                           "[triplane.engines.op]\npyops = py_ops:CubeEngine\n")
    return dest


def write_bad_plugins(dest: Path, entry_points: dict[str, dict[str, str]] | None = None) -> Path:
    """A distribution ``bad-plugins`` under ``dest``: an op engine that raises on import
    (``explodes``), one with wrong shapes, dtypes and values (``broken``), a memory
    engine lying about its capacity (``liar``) and a network engine cutting the last byte
    of each reply (``garbler``)."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "bad_plugins.py").write_text(BAD_PLUGINS)
    (dest / "bad_import.py").write_text('raise RuntimeError("vendor driver libfoo.so.3 not found")\n')
    info = dest / "bad_plugins-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: bad-plugins\nVersion: 0.1\n")
    lines = []
    for group, eps in (entry_points or ENTRY_POINTS).items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {target}" for name, target in eps.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return dest


NET_PLUGINS = textwrap.dedent('''
    """Network engines as plugins: tcp slowed by 30 ms each way, and one whose driver is missing."""
    from triplane.engines.network.tcp import TcpEngine
    from triplane.engines.network.wrappers import Delayed


    class SlowTcp(Delayed):
        def __init__(self):
            super().__init__(TcpEngine(name="slowtcp"), delay_s=0.03)


    class NoDriver:
        def __init__(self):
            raise RuntimeError("libverbs.so.1 not found")
''')


def write_network_plugins(dest: Path) -> Path:
    """A distribution ``net-plugins`` under ``dest``: the network engines ``slowtcp`` (tcp
    with every frame held 30 ms) and ``nodriver`` (raises when made)."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "net_plugins.py").write_text(NET_PLUGINS)
    info = dest / "net_plugins-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: net-plugins\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[triplane.engines.network]\nslowtcp = net_plugins:SlowTcp\n"
                                           "nodriver = net_plugins:NoDriver\n")
    return dest
