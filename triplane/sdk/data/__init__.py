"""Feeding host data to models: :class:`DataLoader`, :class:`Dataset` and
:class:`TensorDataset` (``loader.py``), batch :mod:`transforms` and small bundled
:mod:`datasets` (nothing downloads)."""

from triplane.sdk.data import datasets as datasets
from triplane.sdk.data import transforms as transforms
from triplane.sdk.data.loader import DataLoader, Dataset, TensorDataset

__all__ = ["DataLoader", "Dataset", "TensorDataset", "datasets", "transforms"]
