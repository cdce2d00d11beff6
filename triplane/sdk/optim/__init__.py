"""Optimisers and learning-rate schedulers with PyTorch's names and rules.

``base.py`` is the contract (one graph run a step, parameter groups, ``state_dict``),
``optimizers.py`` the update rules, ``lr_scheduler.py`` the schedules
(``optim.lr_scheduler.StepLR``, as in ``torch.optim``), ``regularization.py`` the
penalties to add to a loss.
"""

from triplane.sdk.optim import lr_scheduler as lr_scheduler
from triplane.sdk.optim.base import Optimizer, add_pending_update, clip_grad_norm, flush_pending_updates
from triplane.sdk.optim.lr_scheduler import (
    CosineAnnealingLR,
    LambdaLR,
    LinearLR,
    LRScheduler,
    SequentialLR,
    StepLR,
)
from triplane.sdk.optim.optimizers import SGD, Adam, AdamW, RMSProp, RMSprop
from triplane.sdk.optim.regularization import l1_penalty, l2_penalty

__all__ = [
    "SGD", "Adam", "AdamW", "CosineAnnealingLR", "LRScheduler", "LambdaLR", "LinearLR", "Optimizer",
    "RMSProp", "RMSprop", "SequentialLR", "StepLR", "add_pending_update", "clip_grad_norm",
    "flush_pending_updates", "l1_penalty", "l2_penalty", "lr_scheduler",
]
