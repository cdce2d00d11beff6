"""Bounds that every part of triplane shares, declared once.

``MAX_RANK`` is the most dimensions a tensor may have anywhere: graph validation refuses
more at submit, and the upload store, the data-port codec, the task packet's replies and
the metadb's tile rows use the same figure, so a tensor that is accepted can always be
stored, moved and fetched. ``MAX_ID_LENGTH`` bounds node ids and fetched names (the
metadb's id columns hold as many characters).
"""

from __future__ import annotations

__all__ = ["MAX_ID_LENGTH", "MAX_RANK"]

MAX_RANK = 16
MAX_ID_LENGTH = 128
