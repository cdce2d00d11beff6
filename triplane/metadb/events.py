"""Reading the scheduler's event stream back from the ``events`` table (the rows with a
``seq``: ``scheduler/events.py`` numbers them; the others are the scheduler's own records).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Session

from triplane.metadb import validate as v
from triplane.metadb.errors import InvalidInputError
from triplane.metadb.models import Event, Job
from triplane.metadb.records import EventInfo

__all__ = ["max_event_seq", "stream_events"]


def max_event_seq(session: Session) -> int:
    """The largest stream id in the table (0 when there is none)."""
    return int(session.scalar(sa.select(sa.func.max(Event.seq))) or 0)


def stream_events(session: Session, *, after: int = 0, before: int | None = None, job: str | None = None,
                  kinds: Sequence[str] | None = None, owner: str | None = None,
                  limit: int = 1000) -> list[EventInfo]:
    """The stream's events with ``after`` < seq < ``before``, in seq order, at most ``limit``;
    of ``job``, of ``kinds``, of the jobs of ``owner`` (when given). Each carries its job's
    owner."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100_000:
        raise InvalidInputError(f"limit must be an int in 1..100000, got {limit!r}")
    q = (sa.select(Event, Job.owner).outerjoin(Job, Job.id == Event.job_id)
         .where(Event.seq.is_not(None), Event.seq > v.check_count("after", after)))
    if before is not None:
        q = q.where(Event.seq < before)
    if job is not None:
        q = q.where(Event.job_id == v.check_id("job", job))
    if kinds is not None:
        q = q.where(Event.kind.in_(list(kinds)))
    if owner is not None:
        q = q.where(Job.owner == owner)
    rows = session.execute(q.order_by(Event.seq).limit(limit))
    return [EventInfo.of(row, owner_) for row, owner_ in rows]
