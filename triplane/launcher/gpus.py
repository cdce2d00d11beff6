"""Engines and GPUs of a local cluster's executors: ``triplane up --engines``, ``--gpus``
and ``--network-engine``.

With ``--gpus N`` the first N executors get one GPU each: ``CUDA_VISIBLE_DEVICES`` names
that GPU alone (the i-th of the launcher's own ``CUDA_VISIBLE_DEVICES`` when it has one,
else GPU i), their op engines are the cupy engine beside numpy (which runs the ops cupy
does not claim) unless ``--engines`` names others, and their tiles live in the device
memory engine (``--memory`` is then GPU memory). Executors past the N-th are CPU ones.

Everything is checked before a process starts: an unknown engine name lists the known
ones, and a cluster that asks for cupy or GPUs where cupy or a GPU is missing fails
with one line naming what is missing (:class:`GpuUnavailable`), not an executor's
traceback in a log.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["GPU_ENGINES", "GPU_MEMORY_ENGINE", "GpuUnavailable", "check_engines", "check_gpus",
           "check_network_engine", "executor_engines", "visible_device"]

GPU_ENGINES = "cupy,numpy"
GPU_MEMORY_ENGINE = "device"
_CPU_ENGINES = "numpy"


class GpuUnavailable(ValueError):
    """The cluster asks for cupy or GPUs that this machine does not have; the message says
    which is missing."""


def check_engines(engines: str | None) -> list[str]:
    """The op engine names of ``--engines`` (``auto`` allowed); ValueError for an empty
    list or a name no built-in or installed plugin provides, listing the known ones."""
    if engines is None:
        return []
    names = [e.strip() for e in engines.split(",") if e.strip()]
    if not names:
        raise ValueError(f"--engines {engines!r} names no engine (e.g. --engines numpy)")
    from triplane.engines.registry import engine_names

    known = engine_names("op")
    unknown = [n for n in names if n != "auto" and n not in known]
    if unknown:
        raise ValueError(f"unknown op engine {unknown[0]!r} in --engines (known: {known}, or auto)")
    return names


def check_network_engine(name: str | None) -> None:
    """ValueError for a ``--network-engine`` that no built-in or installed plugin provides,
    listing the known ones (None: the executors' default, tcp)."""
    if name is None:
        return
    from triplane.engines.registry import engine_names

    known = engine_names("network")
    if name not in known:
        raise ValueError(f"unknown network engine {name!r} in --network-engine (known: {known})")


def _gpu_count() -> tuple[int, str]:
    """(GPUs cupy sees, "") or (0, why none)."""
    try:
        import cupy  # type: ignore[import-not-found]
    except ImportError as e:
        return 0, f"cupy is not installed ({e}); pip install 'triplane[gpu]'"
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as e:  # no driver, no device: cupy's CUDARuntimeError and kin
        return 0, f"cupy finds no usable GPU ({type(e).__name__}: {e})"
    return count, "" if count else "cupy finds no GPU"


def check_gpus(gpus: int, engines: str | None) -> None:
    """Raise :class:`GpuUnavailable` when ``gpus`` GPUs, or the cupy engine named in
    ``engines``, cannot be had here (cupy missing, no GPU, fewer GPUs than asked)."""
    wants_cupy = "cupy" in check_engines(engines)
    if not gpus and not wants_cupy:
        return
    count, why = _gpu_count()
    what = f"--gpus {gpus}" if gpus else "--engines cupy"
    if why:
        raise GpuUnavailable(f"{what} needs cupy and a GPU: {why}")
    if gpus > count:
        raise GpuUnavailable(f"--gpus {gpus} asks for {gpus} GPUs; cupy finds {count}")


def visible_device(i: int, env: Mapping[str, str]) -> str:
    """What ``CUDA_VISIBLE_DEVICES`` GPU executor ``i`` gets: the i-th of the launcher's own
    list when it has one (so ``CUDA_VISIBLE_DEVICES=2,3 triplane up --gpus 2`` uses 2 and 3),
    else ``i``."""
    own = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return own[i] if i < len(own) else str(i)


def executor_engines(i: int, gpus: int, engines: str | None,
                     env: Mapping[str, str]) -> tuple[str, list[str], dict[str, str]]:
    """Executor ``i``'s ``--engines`` value, its other arguments (the device memory engine
    on a GPU executor) and the environment it adds (``CUDA_VISIBLE_DEVICES``)."""
    if i < gpus:
        return (engines or GPU_ENGINES, ["--memory-engine", GPU_MEMORY_ENGINE],
                {"CUDA_VISIBLE_DEVICES": visible_device(i, env)})
    return engines or _CPU_ENGINES, [], {}
