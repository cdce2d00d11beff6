"""Finding engines by name: built-ins first, then installed plugins (entry points)."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from triplane.proto.errors import TriplaneError

_BUILTIN_OP = {
    "numpy": "triplane.engines.op.numpy_engine:NumpyEngine",
    "cupy": "triplane.engines.op.cupy_engine:CupyEngine",
}

_cache: dict[str, Any] = {}


class UnknownEngineError(TriplaneError, LookupError):
    pass


def _load(spec: str) -> Any:
    module, _, attr = spec.partition(":")
    mod = __import__(module, fromlist=[attr])
    return getattr(mod, attr)


def op_engine_names() -> list[str]:
    names = set(_BUILTIN_OP)
    names.update(ep.name for ep in entry_points(group="triplane.engines.op"))
    return sorted(names)


def get_op_engine(name: str = "numpy", **options: Any) -> Any:
    """An op engine instance by name (``numpy``, ``cupy``, or a plugin's name)."""
    key = name if not options else f"{name}:{sorted(options.items())}"
    if key in _cache:
        return _cache[key]
    if name in _BUILTIN_OP:
        cls = _load(_BUILTIN_OP[name])
    else:
        eps = [ep for ep in entry_points(group="triplane.engines.op") if ep.name == name]
        if not eps:
            raise UnknownEngineError(f"unknown op engine {name!r} (known engines: {op_engine_names()})")
        cls = eps[0].load()
    engine = cls(**options)
    _cache[key] = engine
    return engine
