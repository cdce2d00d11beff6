"""Repository functions for graphs, jobs and plans.

Every function takes an open ``Session`` (from ``MetaDB.transaction()``) so that a caller can
make several writes atomic, e.g. create a job and insert its tasks. Functions validate their
input before any SQL runs and raise the errors of ``errors.py``; on any error the caller's
transaction is rolled back by the context manager, so nothing half-written remains.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from triplane.metadb import validate as v
from triplane.metadb.errors import ConflictError, InvalidInputError, NotFoundError, UnknownJobError
from triplane.metadb.fast import insert_many, json_text
from triplane.metadb.models import Graph, Job, JobTag, Plan, Task
from triplane.metadb.records import GraphInfo, JobInfo, NewEvent, NewTask, PlanInfo
from triplane.metadb.tasks import TASK_COLUMNS, event_row, insert_event_rows, task_rows


def upsert_insert(session: Session, table: Any) -> Any:
    """The dialect's INSERT that supports ON CONFLICT (both SQLite and PostgreSQL do)."""
    name = session.get_bind().dialect.name
    if name == "postgresql":
        return postgresql.insert(table)
    if name == "sqlite":
        return sqlite.insert(table)
    raise InvalidInputError(f"unsupported database dialect {name!r} (known: ['sqlite', 'postgresql'])")


def new_id(prefix: str) -> str:
    """A fresh random id such as ``j3f9a1c0d2b4e``."""
    return prefix + uuid.uuid4().hex[:12]


def _node_count(canonical: bytes) -> int:
    try:
        doc = json.loads(canonical.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidInputError(f"graph is not UTF-8 JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), dict):
        raise InvalidInputError("graph JSON must be an object with a 'nodes' object")
    return len(doc["nodes"])


def put_graph(session: Session, graph_hash: str, canonical: bytes, *, now: float | None = None,
              node_count: int | None = None) -> GraphInfo:
    """Store a graph once per hash and return it. ``node_count``: the caller's count, when it
    has the graph parsed already (else the JSON is parsed here to count its nodes).

    Storing the same (hash, bytes) again is a no-op, also when two sessions race. The same hash
    with different bytes raises ConflictError (a hash collision or a client lying about it).
    """
    v.check_id("graph_hash", graph_hash)
    if not isinstance(canonical, (bytes, bytearray)):
        raise InvalidInputError(f"graph canonical form must be bytes, got {type(canonical).__name__}")
    if len(canonical) > v.MAX_GRAPH_BYTES:
        raise v.PayloadTooLargeError(f"graph is {len(canonical)} bytes (at most {v.MAX_GRAPH_BYTES})")
    canonical = bytes(canonical)
    count = _node_count(canonical) if node_count is None else v.check_count("node_count", node_count)
    stmt = upsert_insert(session, Graph).values(
        hash=graph_hash, canonical=canonical, node_count=count,
        created_at=time.time() if now is None else now,
    ).on_conflict_do_nothing(index_elements=["hash"])
    session.execute(stmt)
    row = session.get(Graph, graph_hash, populate_existing=True)
    assert row is not None
    if bytes(row.canonical) != canonical:
        raise ConflictError(f"graph hash {graph_hash!r} is already stored with different bytes")
    return GraphInfo.of(row)


def get_graph(session: Session, graph_hash: str) -> GraphInfo:
    row = session.get(Graph, v.check_id("graph_hash", graph_hash))
    if row is None:
        raise NotFoundError(f"unknown graph hash {graph_hash!r}")
    return GraphInfo.of(row)


def create_job(session: Session, *, graph_hash: str, graph_json: bytes, fetch: Sequence[str],
               owner: str | None = None, job_id: str | None = None, state: str = "submitted",
               now: float | None = None, node_count: int | None = None, name: str | None = None,
               tags: Sequence[str] = ()) -> JobInfo:
    """Create a job in ``state`` with its graph (stored once per hash; ``node_count`` as
    ``put_graph``), its optional ``name`` and ``tags``. Returns the job.

    ``fetch`` lists the tensors the client will read. ``job_id`` defaults to a fresh id; an id
    already used raises ConflictError.
    """
    job_id = v.check_id("job_id", job_id) if job_id is not None else new_id("j")
    v.check_state("state", state, v.JOB_STATES)
    v.check_optional_id("owner", owner)
    if isinstance(fetch, (str, bytes)) or not isinstance(fetch, Sequence):
        raise InvalidInputError(f"fetch must be a list of tensor names, got {fetch!r}")
    if len(fetch) > v.MAX_FETCH:
        raise v.PayloadTooLargeError(f"fetch lists {len(fetch)} tensors (at most {v.MAX_FETCH})")
    names = [v.check_id(f"fetch[{i}]", f) for i, f in enumerate(fetch)]
    label = None if name is None else v.check_label("name", name, v.MAX_NAME)
    tag_list = v.check_tags(list(tags))
    put_graph(session, graph_hash, graph_json, now=now, node_count=node_count)
    if session.get(Job, job_id) is not None:
        raise ConflictError(f"job id {job_id!r} already exists")
    t = time.time() if now is None else now
    row = Job(id=job_id, state=state, graph_hash=graph_hash, plan_id=None, fetch=names, error=None,
              owner=owner, tasks_total=0, tasks_done=0, tasks_failed=0, created_at=t, updated_at=t,
              name=label, tags=list(tag_list) or None)
    session.add(row)
    session.add_all(JobTag(job_id=job_id, tag=tag) for tag in tag_list)
    session.flush()
    return JobInfo.of(row)


def insert_job(session: Session, *, graph_hash: str, graph_json: bytes, fetch: Sequence[str],
               tasks: Sequence[NewTask], events: Sequence[NewEvent] = (), owner: str | None = None,
               job_id: str, state: str = "submitted", now: float, node_count: int | None = None) -> None:
    """A new job with its graph, tasks and events: what ``create_job``, ``insert_tasks``
    and ``add_events`` store, with the same checks and errors (ConflictError for a job id
    in use or a graph hash stored with other bytes), in four to five driver statements
    instead of about a dozen ORM ones (the submit path of a small job: a compiled training
    step stored this way took a third of the scheduler's time per step, bench/README.md).
    No name or tags (``create_job`` and ``set_job_labels`` have them). The checks and the
    rows are :func:`job_rows`, the statements :func:`write_job_rows` (the batch writer
    queues the one and runs the other in its transaction: ``BatchWriter.new_job``)."""
    write_job_rows(session.connection(), job_rows(
        graph_hash=graph_hash, graph_json=graph_json, fetch=fetch, tasks=tasks, events=events, owner=owner,
        job_id=job_id, state=state, now=now, node_count=node_count))


@dataclass(frozen=True)
class JobRows:
    """A new job's rows, checked (:func:`job_rows`): written by :func:`write_job_rows`."""

    job_id: str
    graph: tuple[str, bytes, int, float]  # hash, canonical bytes, node count, created at
    job: tuple[Any, ...]  # JOB_COLUMNS
    tasks: list[tuple[Any, ...]]
    events: list[dict[str, Any]]


def job_rows(*, graph_hash: str, graph_json: bytes, fetch: Sequence[str], tasks: Sequence[NewTask],
             events: Sequence[NewEvent] = (), owner: str | None = None, job_id: str,
             state: str = "submitted", now: float, node_count: int | None = None) -> JobRows:
    """Check a new job (the errors of :func:`insert_job`, but for conflicts with stored
    rows) and build its rows; no database access."""
    v.check_id("job_id", job_id)
    v.check_state("state", state, v.JOB_STATES)
    v.check_optional_id("owner", owner)
    v.check_id("graph_hash", graph_hash)
    if isinstance(fetch, (str, bytes)) or not isinstance(fetch, Sequence):
        raise InvalidInputError(f"fetch must be a list of tensor names, got {fetch!r}")
    if len(fetch) > v.MAX_FETCH:
        raise v.PayloadTooLargeError(f"fetch lists {len(fetch)} tensors (at most {v.MAX_FETCH})")
    names = [v.check_id(f"fetch[{i}]", f) for i, f in enumerate(fetch)]
    if not isinstance(graph_json, (bytes, bytearray)):
        raise InvalidInputError(f"graph canonical form must be bytes, got {type(graph_json).__name__}")
    if len(graph_json) > v.MAX_GRAPH_BYTES:
        raise v.PayloadTooLargeError(f"graph is {len(graph_json)} bytes (at most {v.MAX_GRAPH_BYTES})")
    canonical = bytes(graph_json)
    count = _node_count(canonical) if node_count is None else v.check_count("node_count", node_count)
    rows, _ = task_rows(job_id, tasks)
    evs = [event_row(e, now) for e in events]
    if any(e["job_id"] not in (None, job_id) for e in evs):
        raise UnknownJobError(next(e["job_id"] for e in evs if e["job_id"] not in (None, job_id)))
    job = (job_id, state, graph_hash, None, json_text(names), None, owner, None, None, len(rows), 0, 0,
           now, now)
    return JobRows(job_id, (graph_hash, canonical, count, now), job, rows, evs)


def write_job_rows(conn: sa.Connection, r: JobRows, *, graph_stored: bool = False) -> None:
    """Insert :func:`job_rows`' rows on ``conn`` (in the caller's transaction): the graph
    unless stored (ConflictError if stored with other bytes; ``graph_stored``: the caller
    knows this transaction's database holds it, with these bytes: not written or read),
    the job (ConflictError for an id in use), its tasks and events."""
    mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
    graph_hash, canonical = r.graph[0], r.graph[1]
    added = 0 if graph_stored else conn.exec_driver_sql(
        f"INSERT INTO graphs (hash, canonical, node_count, created_at) VALUES ({', '.join([mark] * 4)}) "
        "ON CONFLICT (hash) DO NOTHING", r.graph).rowcount
    if added != 1 and not graph_stored:  # stored before: the same bytes, or a collision
        (stored,) = conn.exec_driver_sql(f"SELECT canonical FROM graphs WHERE hash = {mark}",
                                         (graph_hash,)).one()
        if bytes(stored) != canonical:
            raise ConflictError(f"graph hash {graph_hash!r} is already stored with different bytes")
    try:
        insert_many(conn, Job.__table__, JOB_COLUMNS, [r.job])
    except sa.exc.IntegrityError:
        raise ConflictError(f"job id {r.job_id!r} already exists") from None
    insert_many(conn, Task.__table__, TASK_COLUMNS, r.tasks)
    insert_event_rows(conn, r.events)


JOB_COLUMNS = ("id", "state", "graph_hash", "plan_id", "fetch", "error", "owner", "name", "tags",
               "tasks_total", "tasks_done", "tasks_failed", "created_at", "updated_at")


def set_job_labels(session: Session, job_id: str, name: str | None, tags: Sequence[str]) -> JobInfo:
    """Give a job its ``name`` and ``tags`` (as ``create_job`` does: checked, the tags
    indexed in ``job_tags``); UnknownJobError for an unknown job."""
    label = None if name is None else v.check_label("name", name, v.MAX_NAME)
    tag_list = v.check_tags(list(tags))
    row = _job_row(session, job_id)
    row.name, row.tags = label, list(tag_list) or None
    session.execute(sa.delete(JobTag).where(JobTag.job_id == job_id))
    session.add_all(JobTag(job_id=job_id, tag=tag) for tag in tag_list)
    session.flush()
    return JobInfo.of(row)


def _job_row(session: Session, job_id: str, *, lock: bool = False) -> Job:
    v.check_id("job_id", job_id)
    row = session.get(Job, job_id, with_for_update=lock, populate_existing=True)
    if row is None:
        raise UnknownJobError(job_id)
    return row


def get_job(session: Session, job_id: str) -> JobInfo:
    """The job, or UnknownJobError."""
    return JobInfo.of(_job_row(session, job_id))


def list_jobs(session: Session, *, limit: int = 50, states: Iterable[str] | None = None,
              owner: str | None = None, name: str | None = None, tags: Sequence[str] = (),
              since: float | None = None, until: float | None = None,
              before: tuple[float, str] | None = None) -> list[JobInfo]:
    """The most recently created jobs first, at most ``limit`` (1..10000): of ``states``,
    ``owner``, ``name``, with every one of ``tags``, created in [``since``, ``until``).

    ``before``: (created_at, id) of the last job of the previous page -- keyset paging over
    the ``(created_at, id)`` order (an index: ``ix_jobs_created_at``, or the owner's, state's
    or name's), never an OFFSET scan; a job stored meanwhile does not shift the pages."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
        raise InvalidInputError(f"limit must be an int in 1..10000, got {limit!r}")
    q = sa.select(Job).order_by(Job.created_at.desc(), Job.id.desc()).limit(limit)
    if states is not None:
        wanted = [v.check_state("states", s, v.JOB_STATES) for s in states]
        q = q.where(Job.state.in_(wanted))
    if owner is not None:
        q = q.where(Job.owner == v.check_id("owner", owner))
    if name is not None:
        q = q.where(Job.name == v.check_label("name", name, v.MAX_NAME))
    for tag in v.check_tags(list(tags)):
        q = q.where(sa.exists().where(JobTag.job_id == Job.id, JobTag.tag == tag))
    if since is not None:
        q = q.where(Job.created_at >= v.check_time("since", since))
    if until is not None:
        q = q.where(Job.created_at < v.check_time("until", until))
    if before is not None:
        at, last = float(before[0]), v.check_id("before", before[1])
        # the range bound alone lets the index seek; the OR only sorts out the ties
        q = q.where(Job.created_at <= at, sa.or_(Job.created_at < at, Job.id < last))
    return [JobInfo.of(r) for r in session.scalars(q)]


def set_job_state(session: Session, job_id: str, state: str, *, expect: str | None = None,
                  error: str | None = None, plan_id: str | None = None,
                  tasks_total: int | None = None, tasks_done: int | None = None,
                  tasks_failed: int | None = None, now: float | None = None) -> JobInfo:
    """Set a job's state (and optionally error, plan and progress counters); returns the job.

    With ``expect``, the change only happens if the stored state equals it, else
    ConflictError (so a cancelled job is not flipped back to running by a late reply).
    """
    v.check_state("state", state, v.JOB_STATES)
    row = _job_row(session, job_id, lock=True)
    if expect is not None:
        v.check_state("expect", expect, v.JOB_STATES)
        if row.state != expect:
            raise ConflictError(f"job {job_id!r} is {row.state!r}, not {expect!r}")
    if plan_id is not None:
        v.check_id("plan_id", plan_id)
        if session.get(Plan, plan_id) is None:
            raise NotFoundError(f"unknown plan id {plan_id!r}")
        row.plan_id = plan_id
    for name, value in (("tasks_total", tasks_total), ("tasks_done", tasks_done),
                        ("tasks_failed", tasks_failed)):
        if value is not None:
            setattr(row, name, v.check_count(name, value))
    row.state = state
    if error is not None:
        row.error = v.clip_error(error)
    row.updated_at = time.time() if now is None else now
    session.flush()
    return JobInfo.of(row)


def upsert_plan(session: Session, *, graph_hash: str, structure_hash: str, plan: Any,
                predicted_makespan: float | None = None, now: float | None = None) -> PlanInfo:
    """Store the plan for (graph hash, cluster structure hash), replacing an older one.

    The plan id stays the same across replacements, so jobs that point at it stay valid.
    Raises NotFoundError for an unknown graph and PayloadTooLargeError for a plan whose JSON
    exceeds MAX_PLAN_BYTES.
    """
    v.check_id("graph_hash", graph_hash)
    v.check_id("structure_hash", structure_hash)
    v.json_size("plan", plan, v.MAX_PLAN_BYTES)
    makespan = v.check_time("predicted_makespan", predicted_makespan)
    if session.get(Graph, graph_hash) is None:
        raise NotFoundError(f"unknown graph hash {graph_hash!r}; store the graph first")
    t = time.time() if now is None else now
    stmt = upsert_insert(session, Plan).values(
        id=new_id("p"), graph_hash=graph_hash, structure_hash=structure_hash, plan=plan,
        predicted_makespan=makespan, created_at=t, updated_at=t)
    stmt = stmt.on_conflict_do_update(
        index_elements=["graph_hash", "structure_hash"],
        set_={"plan": stmt.excluded.plan, "predicted_makespan": stmt.excluded.predicted_makespan,
              "updated_at": stmt.excluded.updated_at})
    session.execute(stmt)
    found = get_plan(session, graph_hash, structure_hash)
    assert found is not None
    return found


def get_plan(session: Session, graph_hash: str, structure_hash: str) -> PlanInfo | None:
    """The cached plan for (graph hash, structure hash), or None."""
    row = session.scalars(sa.select(Plan).where(
        Plan.graph_hash == v.check_id("graph_hash", graph_hash),
        Plan.structure_hash == v.check_id("structure_hash", structure_hash),
    ).execution_options(populate_existing=True)).one_or_none()
    return None if row is None else PlanInfo.of(row)


def job_plan(session: Session, job_id: str) -> PlanInfo | None:
    """The plan a job points at (``jobs.plan_id``: the prediction recorded at submit), or
    None if it has none; UnknownJobError for an unknown job."""
    row = _job_row(session, job_id)
    if row.plan_id is None:
        return None
    plan = session.get(Plan, row.plan_id, populate_existing=True)
    return None if plan is None else PlanInfo.of(plan)
