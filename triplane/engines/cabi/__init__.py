"""The op-engine C ABI: ``triplane_engine.h`` (shipped with the package; its path is
:func:`header_path`) and :class:`CAbiEngine`, the one generic engine that loads a shared
library implementing it."""

from triplane.engines.cabi.engine import ABI_VERSION, ABI_VERSIONS, AbiError, CAbiEngine, header_path

__all__ = ["ABI_VERSION", "ABI_VERSIONS", "AbiError", "CAbiEngine", "header_path"]
