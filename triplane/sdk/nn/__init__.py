"""Neural-network building blocks: ``functional`` (stateless functions, torch's ``F``) and
the modules (``Linear``, ``Conv2d``, ``Sequential``...) built on it, the recurrent and
attention layers (``LSTM``, ``MultiheadAttention``, ``TransformerEncoderLayer``) and the
loss modules."""

from triplane.sdk.nn import functional as functional
from triplane.sdk.nn.attention import *  # noqa: F403
from triplane.sdk.nn.attention import __all__ as _attention_all
from triplane.sdk.nn.losses import *  # noqa: F403
from triplane.sdk.nn.losses import __all__ as _losses_all
from triplane.sdk.nn.modules import *  # noqa: F403
from triplane.sdk.nn.modules import __all__ as _modules_all
from triplane.sdk.nn.recurrent import *  # noqa: F403
from triplane.sdk.nn.recurrent import __all__ as _recurrent_all

__all__ = ["functional", *_modules_all, *_recurrent_all, *_attention_all, *_losses_all]
