"""User ops: Python and C kernels registered from the SDK run like built-ins."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

import triplane as tp
from triplane.proto import optable
from triplane.proto.builder import Builder, Ref
from triplane.proto.errors import GraphError, KernelError, NotDifferentiableError, ShapeError
from triplane.proto.ir import Attrs, TensorType
from triplane.proto.opdef import GradCtx
from triplane.scheduler.compiler.pipeline import compile_graph
from triplane.sdk.custom import load_kernel_library, register_op, unregister_op
from triplane.sdk.tensor import Tensor, build_graph
from triplane.testing import assert_close, check_grad

EXAMPLE_C = Path(__file__).resolve().parents[3] / "examples" / "user_op_c" / "hypot.c"


@pytest.fixture
def seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**63)


@pytest.fixture
def cleanup() -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for n in names:
        unregister_op(n)


def _same_shape(ins: Sequence[TensorType], a: Attrs) -> TensorType:
    if len({t for t in ins}) != 1:
        raise ShapeError("operands differ: " + " and ".join(str(t) for t in ins))
    return ins[0]


def _g_scaled_cube(b: Builder, n: GradCtx, g: Ref) -> list[Ref | None]:
    (x,) = n.inputs
    return [g * x * x * (3.0 * n.attrs["scale"])]


def _register_cube(name: str, cleanup: list[str]) -> Callable[..., Tensor]:
    fn = register_op(name, infer=lambda ins, a: (ins[0].shape, ins[0].dtype),
                     kernel=lambda ins, a, out: a["scale"] * ins[0] ** 3,
                     grad=_g_scaled_cube, arity=1, attrs={"scale": 1.0})
    cleanup.append(name)
    return fn


def test_python_user_op_value_and_attrs(seed: int, cleanup: list[str]) -> None:
    cube = _register_cube("user_cube_v", cleanup)
    x = np.random.default_rng(seed).uniform(-2, 2, size=(3, 4)).astype(np.float32)
    got = cube(Tensor.from_array(x), scale=0.5).numpy()
    assert_close(got, 0.5 * x.astype(np.float64) ** 3, "float32", what=f"seed={seed}")
    assert optable.get("user_cube_v").group == "user"
    assert optable.get("user_cube_v").differentiable


def test_python_user_op_gradient(seed: int, cleanup: list[str]) -> None:
    cube = _register_cube("user_cube_g", cleanup)
    rng = np.random.default_rng(seed)
    x, w = rng.uniform(-1.5, 1.5, size=(2, 3)), rng.uniform(-1, 1, size=(3, 2))
    # the user op composed with built-ins: gradients flow through both
    check_grad(lambda a, b: cube(a @ b, scale=2.0), [x, w])


def test_user_op_passes_validation_and_compiles(cleanup: list[str]) -> None:
    cube = _register_cube("user_cube_c", cleanup)
    y = cube(Tensor.from_array(np.ones((2, 2), np.float32))) + 1.0
    graph, _, _ = build_graph([y])
    plan = compile_graph(graph)
    assert "user_cube_c" in {n.op for n in plan.graph.nodes.values()}


def test_registering_an_existing_name_is_refused(cleanup: list[str]) -> None:
    with pytest.raises(ValueError, match=r"'matmul' is already registered.*built-in"):
        register_op("matmul", infer=_same_shape, kernel=lambda ins, a, out: ins[0], arity=2)
    _register_cube("user_cube_dup", cleanup)
    with pytest.raises(ValueError, match=r"'user_cube_dup' is already registered.*user op"):
        _register_cube("user_cube_dup", [])


def test_wrong_arity_and_bad_shapes_name_the_op(cleanup: list[str]) -> None:
    add3 = register_op("user_add3", infer=_same_shape, arity=3,
                       kernel=lambda ins, a, out: ins[0] + ins[1] + ins[2])
    cleanup.append("user_add3")
    a = Tensor.from_array(np.ones((2, 3), np.float32))
    with pytest.raises(GraphError, match=r"user_add3.*takes 3 input\(s\), got 2"):
        add3(a, a)
    with pytest.raises(ShapeError, match=r"user_add3.*float32\[2, 3\] and float32\[3\]"):
        add3(a, a, Tensor.from_array(np.ones(3, np.float32)))
    assert_close(add3(a, a, a).numpy(), np.full((2, 3), 3.0))


def test_user_op_without_grad_is_not_differentiable(cleanup: list[str]) -> None:
    f = register_op("user_nograd", infer=_same_shape, arity=1, kernel=lambda ins, a, out: ins[0] * 2)
    cleanup.append("user_nograd")
    x = Tensor.from_array(np.ones(3, np.float32), requires_grad=True)
    with pytest.raises(NotDifferentiableError, match="user_nograd"):
        tp.grad(f(x).sum(), x)


def _compile(tmp_path: Path) -> Path:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (gcc/cc) on PATH: cannot build the C kernel")
    lib = tmp_path / "libhypot.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(EXAMPLE_C), "-lm"],
                   check=True, capture_output=True)
    return lib


def test_c_kernel_through_triplane(tmp_path: Path, seed: int, cleanup: list[str]) -> None:
    kernel = load_kernel_library(_compile(tmp_path), "tp_hypot")
    hypot = register_op("user_hypot", infer=_same_shape, kernel=kernel, arity=2, dtypes=["float32"])
    cleanup.append("user_hypot")
    rng = np.random.default_rng(seed)
    x, y = (rng.uniform(-3, 3, size=(4, 5)).astype(np.float32) for _ in range(2))
    tx, ty = Tensor.from_array(x), Tensor.from_array(y)
    got = (hypot(tx, ty) * 2.0).numpy()  # composed with a built-in in one graph
    want = 2.0 * np.hypot(x.astype(np.float64), y.astype(np.float64))
    assert_close(got, want, "float32", rtol=1e-6, what=f"seed={seed}")


def test_c_kernel_error_code_becomes_kernel_error(tmp_path: Path, cleanup: list[str]) -> None:
    kernel = load_kernel_library(_compile(tmp_path), "tp_hypot")
    hypot = register_op("user_hypot_err", infer=_same_shape, kernel=kernel, arity=2, dtypes=["float32"])
    cleanup.append("user_hypot_err")
    x = Tensor.from_array(np.array([1.0, np.nan], np.float32))
    with pytest.raises(KernelError, match=r"user_hypot_err.*error code 2") as info:
        hypot(x, x).numpy()
    assert info.value.kind == "user"


def test_missing_symbol_is_named(tmp_path: Path) -> None:
    with pytest.raises(AttributeError, match="no_such_fn"):
        load_kernel_library(_compile(tmp_path), "no_such_fn")
