"""An example vendor op engine: the C library built next to this file, loaded by
triplane's generic C-ABI engine. Registered through the ``triplane.engines.op`` entry
point ``vendor_c`` (and its user op through ``triplane.ops``)."""

from __future__ import annotations

from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from typing import Any

__all__ = ["library_path", "make_engine"]


def library_path() -> Path:
    """The compiled kernel library of this package."""
    here = Path(__file__).parent
    for suffix in EXTENSION_SUFFIXES:
        candidate = here / f"_vendor_kernels{suffix}"
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"no compiled _vendor_kernels library in {here} (was the package built?)")


def make_engine(**options: Any) -> Any:
    from triplane.engines.cabi import CAbiEngine

    return CAbiEngine(library_path(), options=options)
