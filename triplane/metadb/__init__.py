"""The metadata DB of jobs, graphs, plans, tasks, tiles and events (distributed-runtime issue).

SQLAlchemy 2 models (``models.py``) with Alembic migrations shipped in ``migrations/`` and run
by ``open_db``/``migrate``; SQLite in the run directory by default (WAL mode), PostgreSQL by
URL (psycopg 3). Repository functions take a session from ``MetaDB.transaction()``::

    db = open_db("postgresql://triplane@db:5432/triplane")   # or open_db() for SQLite
    with db.transaction() as s:
        job = create_job(s, graph_hash=h, graph_json=canonical, fetch=["p"])
        insert_tasks(s, job.id, [NewTask("t0", "matmul"), NewTask("t1", "add")])
    with BatchWriter(db) as w:                               # the dispatcher's hot path
        w.transition(job.id, "t0", "dispatched", attempt=0, node="n1", queued_at=time.time())
        w.event(job.id, "task.drifted", task_id="t0", stimulus_id="reply-17")

Errors are in ``errors.py`` (its docstring has the tree); bounds and states in ``validate.py``.
"""

from triplane.metadb.batch import BatchStats, BatchWriter
from triplane.metadb.db import (
    MetaDB,
    create_engine,
    current_revision,
    default_url,
    head_revision,
    migrate,
    open_db,
)
from triplane.metadb.errors import (
    BatchWriteError,
    ConflictError,
    InvalidInputError,
    MetaDBError,
    NotFoundError,
    PayloadTooLargeError,
    SchemaError,
    UnknownJobError,
    UnknownTaskError,
)
from triplane.metadb.events import max_event_seq, stream_events
from triplane.metadb.jobs import (
    JobRows,
    create_job,
    get_graph,
    get_job,
    get_plan,
    insert_job,
    job_rows,
    list_jobs,
    put_graph,
    set_job_labels,
    set_job_state,
    upsert_plan,
    write_job_rows,
)
from triplane.metadb.records import (
    EventInfo,
    GraphInfo,
    JobInfo,
    NewEvent,
    NewTask,
    PlanInfo,
    ResumeJob,
    TaskInfo,
    TileInfo,
    TileLocation,
)
from triplane.metadb.tasks import (
    add_events,
    get_task,
    index_key,
    insert_tasks,
    jobs_to_resume,
    list_events,
    list_tasks,
    list_tiles,
    mark_node_tiles_lost,
    record_tiles,
    task_events,
    task_page,
    tile_page,
    transition_task,
)
from triplane.metadb.validate import (
    JOB_STATES,
    TASK_STATES,
    TERMINAL_JOB_STATES,
    TERMINAL_TASK_STATES,
    TILE_STATES,
    JobState,
    TaskState,
    TileState,
)

__all__ = [
    "BatchStats", "BatchWriter", "MetaDB", "create_engine", "current_revision", "default_url",
    "head_revision", "migrate", "open_db",
    "BatchWriteError", "ConflictError", "InvalidInputError", "MetaDBError", "NotFoundError",
    "PayloadTooLargeError", "SchemaError", "UnknownJobError", "UnknownTaskError",
    "create_job", "insert_job", "JobRows", "job_rows", "write_job_rows",
    "get_graph", "get_job", "get_plan", "list_jobs", "put_graph", "set_job_state",
    "upsert_plan",
    "EventInfo", "GraphInfo", "JobInfo", "NewEvent", "NewTask", "PlanInfo", "ResumeJob", "TaskInfo",
    "TileInfo", "TileLocation",
    "add_events", "get_task", "insert_tasks", "jobs_to_resume", "list_events", "list_tasks",
    "list_tiles", "mark_node_tiles_lost", "record_tiles", "transition_task",
    "index_key", "set_job_labels", "task_events", "task_page", "tile_page",
    "max_event_seq", "stream_events",
    "JOB_STATES", "TASK_STATES", "TERMINAL_JOB_STATES", "TERMINAL_TASK_STATES", "TILE_STATES",
    "JobState", "TaskState", "TileState",
]
