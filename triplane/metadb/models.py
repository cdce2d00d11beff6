"""The tables of the metadata DB, as typed SQLAlchemy 2 declarative models.

Times are Unix seconds as floats (``time.time()``), the same clock the task packet's
``deadline`` uses, so they compare directly and behave the same on SQLite and PostgreSQL
(timezone-aware datetimes do not round-trip through SQLite).

States are plain strings checked in Python (``states.py``), not database enums, so adding
a state needs no migration. JSON columns hold small structured values (fetch lists, tile
indexes and shapes, plans, event payloads); their sizes are bounded before they reach here.

The schema itself is created by the Alembic migrations in ``migrations/versions``; these
models must match the latest revision (a test compares them).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Named constraints so that future migrations (and SQLite batch mode) can refer to them.
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets a 64-bit key.
BigId = BigInteger().with_variant(Integer(), "sqlite")

ID = 128  # bound of every id-like string column (job, task, node, engine, tensor names)
NAME, TAG = 128, 64  # bounds of a job's name and of each of its tags


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Graph(Base):
    """A submitted graph, stored once per canonical hash (jobs of a training loop share it)."""

    __tablename__ = "graphs"

    hash: Mapped[str] = mapped_column(String(ID), primary_key=True)
    canonical: Mapped[bytes] = mapped_column(LargeBinary)
    node_count: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float)


class Plan(Base):
    """A compiled execution plan, cached by (graph hash, cluster structure hash)."""

    __tablename__ = "plans"
    __table_args__ = (UniqueConstraint("graph_hash", "structure_hash"),)

    id: Mapped[str] = mapped_column(String(ID), primary_key=True)
    graph_hash: Mapped[str] = mapped_column(ForeignKey("graphs.hash"))
    structure_hash: Mapped[str] = mapped_column(String(ID))
    plan: Mapped[Any] = mapped_column(JSON)
    predicted_makespan: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class Job(Base):
    """One submission: a graph, what to fetch, its state and progress counters."""

    __tablename__ = "jobs"
    __table_args__ = (Index(None, "state", "created_at"), Index(None, "created_at"),
                      Index(None, "owner", "created_at"), Index(None, "name", "created_at"))

    id: Mapped[str] = mapped_column(String(ID), primary_key=True)
    state: Mapped[str] = mapped_column(String(32))
    graph_hash: Mapped[str] = mapped_column(ForeignKey("graphs.hash"))
    plan_id: Mapped[str | None] = mapped_column(ForeignKey("plans.id"))
    fetch: Mapped[list[str]] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    owner: Mapped[str | None] = mapped_column(String(ID))  # the submitting token's name
    name: Mapped[str | None] = mapped_column(String(NAME))  # the submitter's label (optional)
    tags: Mapped[list[str] | None] = mapped_column(JSON)  # its tags, as given (job_tags indexes them)
    tasks_total: Mapped[int] = mapped_column(Integer, default=0)
    tasks_done: Mapped[int] = mapped_column(Integer, default=0)
    tasks_failed: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class JobTag(Base):
    """One tag of a job: the index ``GET /v1/jobs?tag=`` filters with (``jobs.tags`` holds
    the same list for reading)."""

    __tablename__ = "job_tags"
    __table_args__ = (Index(None, "tag", "job_id"),)

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    tag: Mapped[str] = mapped_column(String(TAG), primary_key=True)


class Task(Base):
    """One task of a job's plan; its id is unique within the job."""

    __tablename__ = "tasks"
    __table_args__ = (Index(None, "job_id", "state"),)

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    task_id: Mapped[str] = mapped_column(String(ID), primary_key=True)
    op: Mapped[str] = mapped_column(String(ID))
    state: Mapped[str] = mapped_column(String(32))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    node: Mapped[str | None] = mapped_column(String(ID))
    queued_at: Mapped[float | None] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float)
    predicted_s: Mapped[float | None] = mapped_column(Float)
    actual_s: Mapped[float | None] = mapped_column(Float)
    error_kind: Mapped[str | None] = mapped_column(String(16))
    error_message: Mapped[str | None] = mapped_column(Text)


class Tile(Base):
    """Where one tile of a tensor lives: node, memory engine, size and state."""

    __tablename__ = "tiles"
    __table_args__ = (
        # Also the index for "tiles of a tensor": (job_id, tensor) is its prefix.
        UniqueConstraint("job_id", "tensor", "index_key"),
        Index(None, "node"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    tensor: Mapped[str] = mapped_column(String(ID))
    # The index tuple as JSON for readers, and as "0.1" for the unique key (JSON columns
    # cannot be compared for equality on every backend).
    index: Mapped[list[int]] = mapped_column(JSON)
    index_key: Mapped[str] = mapped_column(String(255))
    shape: Mapped[list[int]] = mapped_column(JSON)
    dtype: Mapped[str] = mapped_column(String(32))
    node: Mapped[str | None] = mapped_column(String(ID))
    memory_engine: Mapped[str | None] = mapped_column(String(ID))
    nbytes: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(32))
    updated_at: Mapped[float] = mapped_column(Float)


class Event(Base):
    """One transition or notable happening of a job (or one of its tasks), append-only."""

    __tablename__ = "events"
    __table_args__ = (Index(None, "job_id", "at"), Index(None, "job_id", "task_id"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    task_id: Mapped[str | None] = mapped_column(String(ID))
    kind: Mapped[str] = mapped_column(String(64))
    stimulus_id: Mapped[str | None] = mapped_column(String(ID))
    at: Mapped[float] = mapped_column(Float)
    payload: Mapped[Any] = mapped_column(JSON)
