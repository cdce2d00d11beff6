"""Neural-network building blocks: ``functional`` (stateless functions, torch's ``F``) and
the modules (``Linear``, ``Conv2d``, ``Sequential``...) built on it."""

from triplane.sdk.nn import functional as functional
from triplane.sdk.nn.modules import *  # noqa: F403
from triplane.sdk.nn.modules import __all__ as _modules_all

__all__ = ["functional", *_modules_all]
