"""A job's task timeline as a histogram kept between requests, so that a live job's
timeline costs a scan of its rows, not a sort of them, each time it is asked for.

``metadb.aggregates.timeline_buckets`` groups a job's rows by (node, time bucket): SQLite
sorts every row for that, about 0.1-0.4 s for 100,000 rows on a busy two-core machine
(bench/dashboard.py). A :class:`JobHistogram` keeps that grouping at a fine resolution
(``res``: the job's span over ``CELLS``, doubled as the job grows) from the job's first
kernel start. Each refresh regroups only the rows that started at or after its watermark
(``SLACK_S`` before the latest start it saw, as rows land in the metadb late, in the
journal's batches), after a scan that counts them all; when that count differs from the
histogram's (a row landed later still), it rebuilds from every row. A window is cut from
the cells; one narrower than a tenth of the job is grouped from the rows directly (few
rows: a small sort).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from triplane.metadb import aggregates as agg

__all__ = ["CELLS", "FIELDS", "JobHistogram"]

CELLS = 4000  # cells per node at most, before the resolution doubles
SLACK_S = 5.0
FIELDS = ("tasks", "busy_s", "predicted_s", "failed", "retried")


@dataclass
class JobHistogram:
    job: str
    origin: float = 0.0
    res: float = 0.0
    cells: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    counted: int = 0  # rows in the cells

    def _add(self, rows: Iterable[dict[str, Any]], factor: int = 1) -> None:
        for r in rows:
            cell = self.cells.setdefault((r["node"] or "?", r["bucket"] // factor), [0.0] * len(FIELDS))
            for i, k in enumerate(FIELDS):
                cell[i] += r[k]
            self.counted += r["tasks"]

    def _coarsen(self, top: int) -> int:
        """Double ``res`` until ``top`` fits in CELLS; the factor it grew by."""
        factor = 1
        while top // factor >= CELLS:
            factor *= 2
        if factor > 1:
            old, self.cells, self.counted = self.cells, {}, 0
            self._add(({"node": n, "bucket": k, **dict(zip(FIELDS, v, strict=True))}
                       for (n, k), v in old.items()), factor)
            self.res *= factor
        return factor

    def refresh(self, s: Session, first: float, last: float, rows: int) -> None:
        """Bring the cells up to the job's rows (``first``, ``last``, ``rows``: task_bounds).
        Rows landing meanwhile may leave it a few rows behind; the next refresh catches up."""
        self._update(s, first, last, rows)
        if self.counted != rows:  # a row landed behind the watermark: regroup them all
            self.cells, self.counted = {}, 0
            self._update(s, first, last, rows)

    def _update(self, s: Session, first: float, last: float, rows: int) -> None:
        if not self.cells or self.origin != first or rows < self.counted:
            self.origin, self.res, self.cells, self.counted = first, max((last - first) / CELLS, 1e-6), {}, 0
            since = first
        else:
            top = max(k for _, k in self.cells)
            edge = max(0, top - math.ceil(SLACK_S / self.res))  # regroup cells from here on
            for key in [key for key in self.cells if key[1] >= edge]:
                self.counted -= int(self.cells.pop(key)[0])
            since = self.origin + edge * self.res
        span = max(last - self.origin, self.res) * 1.000001
        n = max(1, math.ceil((span - (since - self.origin)) / self.res))
        got = agg.timeline_buckets(s, self.job, since, since + n * self.res, n) if last >= since else []
        offset = round((since - self.origin) / self.res)
        new = [{**r, "bucket": r["bucket"] + offset} for r in got]
        factor = self._coarsen(max((r["bucket"] for r in new), default=0))
        self._add(new, factor)

    def lanes(self, t0: float, t1: float, buckets: int) -> dict[str, dict[str, list[float]]]:
        """The window ``[t0, t1)`` in ``buckets``: per node, each field per bucket (a cell
        counts in the bucket its start falls in; one that straddles an end of the window, in
        the bucket at that end)."""
        width = (t1 - t0) / buckets
        per: dict[str, dict[str, list[float]]] = {}
        for (node, k), v in self.cells.items():
            start = self.origin + k * self.res
            if start < t1 and start + self.res > t0:
                b = min(buckets - 1, max(0, math.floor((start - t0) / width)))
                lanes = per.setdefault(node, {f: [0] * buckets for f in FIELDS})
                for i, f in enumerate(FIELDS):
                    lanes[f][b] += v[i]
        return per

    def fine_enough(self, t0: float, t1: float, buckets: int) -> bool:
        return (t1 - t0) / buckets >= 4 * self.res
