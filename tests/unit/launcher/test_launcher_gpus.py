"""What each executor of a local cluster is given for ``--engines`` and ``--gpus``
(launcher/gpus.py), checked on the command lines and environments the launcher builds,
without starting a process (no GPU is needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from triplane.launcher import ClusterConfig, LocalCluster
from triplane.launcher.gpus import GpuUnavailable, _gpu_count, check_gpus


def _arg(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_gpu_executors_get_one_gpu_each_the_cupy_engine_and_device_memory(tmp_path: Path) -> None:
    c = LocalCluster(tmp_path, ClusterConfig(executors=3, gpus=2), env={"CUDA_VISIBLE_DEVICES": "4,6"})
    specs = [c.executor_argv(i) for i in range(3)]
    assert [_arg(a, "--engines") for a, _ in specs] == ["cupy,numpy", "cupy,numpy", "numpy"]
    assert [_arg(a, "--memory-engine") for a, _ in specs] == ["device", "device", None]
    assert [env for _, env in specs] == [{"CUDA_VISIBLE_DEVICES": "4"}, {"CUDA_VISIBLE_DEVICES": "6"}, {}]
    assert [_arg(a, "--name") for a, _ in specs] == ["executor-0", "executor-1", "executor-2"]


def test_engines_named_go_to_every_executor_and_executor_args_still_win(tmp_path: Path) -> None:
    cfg = ClusterConfig(executors=2, gpus=1, engines="cupy", executor_args=["--memory-engine", "host"])
    c = LocalCluster(tmp_path, cfg, env={"CUDA_VISIBLE_DEVICES": ""})
    (gpu, env0), (cpu, env1) = c.executor_argv(0), c.executor_argv(1)
    assert _arg(gpu, "--engines") == _arg(cpu, "--engines") == "cupy"
    assert env0 == {"CUDA_VISIBLE_DEVICES": "0"} and env1 == {}
    assert gpu[len(gpu) - 1 - gpu[::-1].index("--memory-engine") + 1] == "host"  # the last one given


def test_the_network_engine_named_goes_to_every_executor(tmp_path: Path) -> None:
    c = LocalCluster(tmp_path, ClusterConfig(executors=2, network_engine="udp"))
    assert [_arg(c.executor_argv(i)[0], "--network-engine") for i in range(2)] == ["udp", "udp"]
    assert "--network-engine" not in LocalCluster(tmp_path, ClusterConfig()).executor_argv(0)[0]


@pytest.mark.parametrize(("config", "message"), [
    ({"engines": "numpy,nosuch"}, "unknown op engine 'nosuch' in --engines (known: ["),
    ({"engines": " , "}, "names no engine"),
    ({"executors": 1, "gpus": 2}, "--gpus 2 needs at least 2 executors (one per GPU), --executors is 1"),
    ({"gpus": -1}, "--gpus must be 0 or more, got -1"),
    ({"network_engine": "rdma"}, "unknown network engine 'rdma' in --network-engine (known: ["),
])
def test_bad_engines_or_gpus_are_refused_naming_what_was_wrong(config: dict[str, object],
                                                             message: str) -> None:
    with pytest.raises(ValueError) as info:
        ClusterConfig(**config)  # type: ignore[arg-type]
    assert message in str(info.value)


def test_more_gpus_than_here_is_one_clear_error_naming_what_is_missing() -> None:
    count, why = _gpu_count()
    with pytest.raises(GpuUnavailable) as info:
        check_gpus(count + 1, None)
    text = str(info.value)
    assert text.startswith(f"--gpus {count + 1} ")
    assert (why and why in text) or f"cupy finds {count}" in text
    check_gpus(0, "numpy,auto")  # nothing asked of a GPU: nothing checked
