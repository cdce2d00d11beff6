"""Engines as plugins: the example vendor package (a C library behind the C ABI, found
only through entry points), the conformance kit's command line on numpy, the vendor
engine and a deliberately broken engine, the ABI's checks, and bad plugins isolated."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from plugin_sites import ROOT, install_vendor, write_bad_plugins

from triplane.engines import registry
from triplane.engines.cabi import AbiError, CAbiEngine, header_path
from triplane.engines.testing import OpEngineConformance
from triplane.proto import dtypes as dt
from triplane.proto import optable
from triplane.proto.errors import KernelError
from triplane.proto.ir import Attrs, TensorType


@pytest.fixture(scope="module")
def vendor_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_vendor(tmp_path_factory.mktemp("vendor"))


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fresh discovery state; the op table as it was afterwards."""
    before = set(optable.names())
    monkeypatch.setattr(registry, "_op_cache", {})
    monkeypatch.setattr(registry, "_op_plugins", None)
    yield
    for name in set(optable.names()) - before:
        optable.unregister(name)
    for mod in ("bad_plugins", "bad_import", "triplane_vendor", "triplane_vendor.ops"):
        sys.modules.pop(mod, None)


@pytest.fixture
def vendor(vendor_site: Path, plugins: None, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(vendor_site))
    return vendor_site


class TestVendorEngine(OpEngineConformance):
    """The kit's pytest mixin on the engine found by its entry point's name."""

    @pytest.fixture
    def op_engine(self, vendor: Path) -> Any:
        return registry.get_op_engine("vendor_c")


def test_the_vendor_engine_is_found_only_through_entry_points(vendor: Path) -> None:
    assert "vendor_c" in registry.op_engine_names() and "vendor_c" not in registry.BUILTINS["op"]
    assert registry.load_op_plugins() == [] and "vendor_softplus" in optable.names()
    engine = registry.get_op_engine("vendor_c")
    assert isinstance(engine, CAbiEngine) and engine.device == "cpu"
    assert set(engine.ops) == {"add", "mul", "relu", "matmul", "vendor_softplus"}
    assert engine.supports("add", ["float32", "float32"]) and not engine.supports("add", ["float64"])
    assert not engine.supports("exp", ["float32"])
    x = np.linspace(-30, 30, 101, dtype=np.float32)
    got = engine.run("vendor_softplus", [x], Attrs(), TensorType(x.shape, dt.float32))
    np.testing.assert_allclose(got, np.logaddexp(0, x.astype(np.float64)), rtol=1e-6, atol=1e-6)


def _kit(engine: str, pythonpath: list[Path]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, pythonpath), str(ROOT)])}
    return subprocess.run([sys.executable, "-m", "triplane.engines.testing", "--engine", engine],
                          capture_output=True, text=True, env=env, timeout=300)


def _row(out: str, op: str, dtype: str) -> list[str]:
    rows = [line.split() for line in out.splitlines() if line.split()[:2] == [op, dtype]]
    assert rows, f"no row for {op} {dtype} in:\n{out}"
    return rows[0]


def test_the_kit_command_passes_numpy_on_every_op() -> None:
    done = _kit("numpy", [])
    assert done.returncode == 0, done.stdout + done.stderr
    assert _row(done.stdout, "matmul", "float64")[2] == "pass"
    assert _row(done.stdout, "conv2d", "float32")[2] == "pass"
    assert " 0 failed" in done.stdout.splitlines()[-1]


def test_the_kit_command_passes_the_vendor_engine_on_its_declared_ops(vendor_site: Path) -> None:
    done = _kit("vendor_c", [vendor_site])
    assert done.returncode == 0, done.stdout + done.stderr
    for op in ("add", "mul", "relu", "matmul"):
        assert _row(done.stdout, op, "float32")[2] == "pass"
    assert "float64" not in done.stdout  # it declares float32 only: nothing else is run
    assert _row(done.stdout, "vendor_softplus", "-")[2:4] == ["no", "case"]


def test_the_kit_command_names_the_op_dtype_and_error_of_a_broken_engine(tmp_path: Path) -> None:
    done = _kit("broken", [write_bad_plugins(tmp_path)])
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert _row(out, "add", "float32")[2] == "FAIL" and "gave float32[12], numpy gives float32[3, 4]" in out
    assert _row(out, "mul", "float32")[2] == "FAIL" and "gave float64[3, 4], numpy gives float32[3, 4]" in out
    assert _row(out, "relu", "float32")[2:4] == ["pass", "0"]
    relu64 = _row(out, "relu", "float64")
    assert relu64[2:4] == ["FAIL", "0.5"]
    assert "values differ from numpy (max abs error 0.5)" in " ".join(relu64)
    assert _row(out, "mul", "float64")[2] == "pass"  # float64 was asked: right
    assert out.splitlines()[-1] == "6 cases, 2 passed, 4 failed"


def test_the_kit_command_lists_the_known_engines_for_an_unknown_name() -> None:
    done = _kit("tpu9", [])
    assert done.returncode == 2
    assert "unknown engine 'tpu9' (known: op: ['cupy', 'numpy']; memory: [" in done.stdout
    assert "network: ['tcp', 'udp']" in done.stdout


# --- the C ABI's own checks ------------------------------------------------------------------

_LIB = r"""
#include <string.h>
#include "triplane_engine.h"
struct tp_engine { int x; };
static struct tp_engine one;
uint32_t tp_abi_version(void) { return VERSION; }
int tp_engine_create(const char *o, tp_engine **out, char *err, size_t n) {
    (void)o; *out = &one; (void)err; (void)n; return 0; }
void tp_engine_destroy(tp_engine *e) { (void)e; }
const char *tp_engine_capabilities(tp_engine *e) {
    (void)e; return "{\"name\": \"tiny\", \"ops\": {\"neg\": [\"float32\"]}}"; }
#ifndef NO_RUN
int tp_engine_run(tp_engine *e, const char *op, const char *a, int32_t n, const tp_buffer *in,
                  tp_buffer *out, char *err, size_t len) {
    (void)e; (void)a; (void)n;
    if (in[0].shape[0] == 3) { strncpy(err, "three is not allowed", len); return TP_ERR_INVALID; }
    memset(out->data, 0, (size_t)out->nbytes + OVERRUN);
    (void)op; return TP_OK;
}
#endif
"""


def _build(tmp_path: Path, name: str, *defines: str) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    src, lib = tmp_path / "tiny.c", tmp_path / f"lib{name}.so"
    src.write_text(_LIB)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src), f"-I{header_path().parent}",
                    *[f"-D{d}" for d in defines]], check=True)
    return lib


def test_the_abi_refuses_another_version_and_missing_symbols(tmp_path: Path) -> None:
    with pytest.raises(AbiError, match="implements ABI version 3; this triplane loads versions 1 and 2"):
        CAbiEngine(_build(tmp_path, "v3", "VERSION=3", "OVERRUN=0"))
    with pytest.raises(AbiError, match="does not export tp_engine_run"):
        CAbiEngine(_build(tmp_path, "norun", "VERSION=1", "NO_RUN"))


def test_errors_come_back_as_codes_with_messages_and_overruns_are_caught(tmp_path: Path) -> None:
    good = CAbiEngine(_build(tmp_path, "ok", "VERSION=1", "OVERRUN=0"))
    assert good.name == "tiny" and good.device == "cpu" and good.supports("neg", ["float32"])
    out = TensorType((4,), dt.float32)
    assert good.run("neg", [np.ones(4, np.float32)], Attrs(), out).tolist() == [0.0] * 4
    with pytest.raises(KernelError, match="engine 'tiny' \\(invalid\\): three is not allowed") as e:
        good.run("neg", [np.ones(3, np.float32)], Attrs(), TensorType((3,), dt.float32))
    assert e.value.kind == "user"
    with pytest.raises(KernelError, match="does not run neg on \\['float64'\\]"):
        good.run("neg", [np.ones(4)], Attrs(), TensorType((4,), dt.float64))
    bad = CAbiEngine(_build(tmp_path, "overrun", "VERSION=1", "OVERRUN=8"))
    with pytest.raises(KernelError, match="wrote past the end of its 16-byte output") as e:
        bad.run("neg", [np.ones(4, np.float32)], Attrs(), out)
    assert e.value.kind == "infra"


_CHAIN = r"""
#include <string.h>
#include "triplane_engine.h"
struct tp_engine { int x; };
static struct tp_engine one;
uint32_t tp_abi_version(void) { return TRIPLANE_ENGINE_ABI_VERSION; }
int tp_engine_create(const char *o, tp_engine **out, char *err, size_t n) {
    (void)o; *out = &one; (void)err; (void)n; return 0; }
void tp_engine_destroy(tp_engine *e) { (void)e; }
const char *tp_engine_capabilities(tp_engine *e) {
    (void)e; return "{\"name\": \"fma\", \"ops\": {\"mul\": [\"float32\"], \"add\": [\"float32\"]}}"; }
/* claims mul then add (a fused multiply-add), nothing else */
int32_t tp_engine_claim(tp_engine *e, const char *chain) {
    (void)e; return strstr(chain, "[\"mul\", \"add\"") ? 2 : 0; }
int tp_engine_run(tp_engine *e, const char *op, const char *a, int32_t n, const tp_buffer *in,
                  tp_buffer *out, char *err, size_t len) {
    (void)e; (void)a;
    const float *x = in[0].data, *y = in[1].data; float *z = out->data;
    int64_t k = out->nbytes / 4;
    if (strcmp(op, "chain:mul+add") == 0 && n == 3) {
        const float *w = in[2].data;
        for (int64_t i = 0; i < k; i++) z[i] = x[i] * y[i] + w[i];
    } else if (strcmp(op, "mul") == 0) { for (int64_t i = 0; i < k; i++) z[i] = x[i] * y[i]; }
    else if (strcmp(op, "add") == 0) { for (int64_t i = 0; i < k; i++) z[i] = x[i] + y[i]; }
    else { strncpy(err, op, len); return TP_ERR_UNSUPPORTED; }
    return TP_OK;
}
"""


def test_a_version_2_library_claims_a_fused_chain_and_runs_it_as_one_kernel(tmp_path: Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    src, lib = tmp_path / "fma.c", tmp_path / "libfma.so"
    src.write_text(_CHAIN)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src), f"-I{header_path().parent}"],
                   check=True)
    fma = CAbiEngine(lib)
    assert fma.abi_version == 2
    assert fma.claim(["mul", "add"], "float32") == 2
    assert fma.claim(["add", "mul"], "float32") == 0  # not claimed
    assert fma.claim(["mul", "add"], "float64") == 0  # not a dtype it runs: not asked
    x, y, w = (np.arange(6, dtype=np.float32) + i for i in range(3))
    out = TensorType((6,), dt.float32)
    got = fma.run_chain(["mul", "add"], [Attrs(), Attrs()], [x, y, w], out)
    np.testing.assert_array_equal(got, x * y + w)
    with pytest.raises(KernelError, match="does not claim the chain add\\+mul on float32") as e:
        fma.run_chain(["add", "mul"], [Attrs(), Attrs()], [x, y, w], out)
    assert e.value.kind == "infra"
    old = CAbiEngine(_build(tmp_path, "v1", "VERSION=1", "OVERRUN=0"))  # version 1: no claims
    assert old.abi_version == 1 and old.claim(["neg", "neg"], "float32") == 0


# --- bad plugins are isolated ------------------------------------------------------------------


def _executor(**kw: Any) -> Any:
    from triplane.executor.daemon import Executor

    return Executor(registry=None, secret=b"s" * 32, memory_bytes=1 << 20, **kw)  # type: ignore[arg-type]


def test_bad_plugins_leave_the_executor_with_its_other_engines(vendor: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.syspath_prepend(str(write_bad_plugins(tmp_path)))
    ex = _executor(engines=["auto"], memory_engine="liar")
    try:
        assert [e.name for e in ex.op_engines] == ["numpy", "vendor_c"]
        assert ex.store.kind == "host" and ex.store.capacity() == 1 << 20
        problems = {(p["kind"], p["name"]): p["message"] for p in ex.stats()["plugins"]}
        assert set(problems) == {("op", "explodes"), ("op", "broken"), ("memory", "liar")}
        assert problems["op", "explodes"] == ("cannot be made: RuntimeError: vendor driver "
                                              "libfoo.so.3 not found")
        assert problems["op", "broken"].startswith("fails the conformance kit on 2 case(s): add (float32): "
                                                   "gave float32[12], numpy gives float32[3, 4]")
        assert problems["memory", "liar"] == ("claims a capacity of 2097152 bytes, 1048576 were asked; "
                                              "using the host engine")
        vendor_info = ex._op_info(ex.op_engines[1], {"matmul_gflops": 1.0})
        assert vendor_info.dtypes == ("float32",) and "vendor_softplus" in vendor_info.ops
        assert "exp" not in vendor_info.ops
    finally:
        ex.runner.close()
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("plugin isolated: ")]
    assert len(logged) == 3 and any("op plugin 'explodes'" in m for m in logged)


def test_an_explicitly_named_bad_plugin_is_isolated_and_an_unknown_name_is_refused(
        tmp_path: Path, plugins: None, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from triplane.engines.errors import UnknownEngineError
    from triplane.executor.cli import run_executor

    monkeypatch.syspath_prepend(str(write_bad_plugins(tmp_path)))
    monkeypatch.setenv("TRIPLANE_SECRET", "s" * 32)
    ex = _executor(engines=["numpy", "explodes"])
    try:
        assert [e.name for e in ex.op_engines] == ["numpy"] and ex.plugin_problems[0].name == "explodes"
    finally:
        ex.runner.close()
    with pytest.raises(ValueError, match="no usable op engine among \\['broken'\\]: op plugin 'broken'"):
        _executor(engines=["broken"])
    with pytest.raises(UnknownEngineError, match="known:"):
        _executor(engines=["tpu9"])
    assert run_executor("memory://", engines="numpy,tpu9") == 2
    assert ("unknown op engine 'tpu9' (known: ['broken', 'cupy', 'explodes', 'numpy'])"
            in capsys.readouterr().err)


def test_an_ops_plugin_that_raises_is_left_out_with_its_problem(tmp_path: Path, plugins: None,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    site = write_bad_plugins(tmp_path, {"triplane.ops": {"badops": "bad_import:OPS",
                                                         "notops": "bad_plugins:Liar"}})
    monkeypatch.syspath_prepend(str(site))
    problems = {p.name: p.message for p in registry.load_op_plugins()}
    assert problems == {"badops": "RuntimeError: vendor driver libfoo.so.3 not found",
                        "notops": "TypeError: Liar.__init__() missing 1 required positional argument: "
                                  "'capacity'"}


class _LiesLater:
    name, device = "later", "cpu"

    def supports(self, op: str, dtypes: Any = ()) -> bool:
        return op == "neg"

    def run(self, op: str, inputs: Any, attrs: Any, out: Any) -> Any:
        return np.zeros(7, np.float64)


def test_a_wrong_result_while_serving_fails_the_task_naming_the_engine() -> None:
    from triplane.executor.plugins import CheckedEngine

    problems: list[Any] = []
    engine = CheckedEngine(_LiesLater(), problems)
    assert engine.supports("neg")
    for _ in range(2):
        with pytest.raises(KernelError, match=r"engine 'later' (is isolated: engine 'later' )?returned "
                                              r"float64\[7\] for neg, expected float32\[2, 2\]") as e:
            engine.run("neg", [np.ones((2, 2), np.float32)], Attrs(), TensorType((2, 2), dt.float32))
        assert e.value.kind == "infra"
    assert len(problems) == 1 and problems[0].kind == "op"  # recorded once
    assert not engine.supports("neg")  # isolated: the node's other engines take its ops
