"""Kernels of the nn ops."""

from __future__ import annotations
