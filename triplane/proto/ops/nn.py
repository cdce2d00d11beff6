"""Neural-network ops: activations over axes, losses, convolution, pooling, normalisation."""

from __future__ import annotations
