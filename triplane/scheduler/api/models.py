"""The response bodies of the REST API as pydantic models: each route names its
``response_model``, so ``/openapi.json`` describes every answer (docs/api.md) and FastAPI
checks each body against it before it leaves (a mismatch is a bug: 500).

Errors are ``{"error": ErrorDetail}`` (``errors.py``); :data:`ERRORS` documents them on
every route. Models of bodies other components may extend (an error's extra fields such
as ``ref``, a plan document) allow extra fields; the others list every field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "Config", "CopyRequest", "CopyResult", "Drift", "ERRORS", "Engine", "EnginePage", "ErrorBody",
    "ErrorDetail", "Health", "JobDetail", "JobPage", "JobRequestBody", "JobStatus", "Node", "NodePage",
    "Ready", "Released", "Retried", "SessionBody", "SessionEnded", "Stats", "SubmitAnswer", "Task",
    "TaskPage", "Tile", "TilePage", "Token", "TokenCreated", "TokenPage", "TokenRequest",
    "TokenRevoked", "Upload", "Whoami",
    "GraphView", "Storage", "Timeline",  # the dashboard's aggregates (api/views.py)
]


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="allow")
    kind: str = Field(description="what went wrong; its HTTP status is api/errors.py's table")
    message: str
    node: str | None = None
    op: str | None = None
    loc: str | None = Field(None, description="a failed job's: the failing node's source line (file:line) "
                                              "as its SDK sent it")


class ErrorBody(BaseModel):
    error: ErrorDetail


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": what} for code, what in (
        (400, "the request is wrong (kind request, graph, shape, ...)"),
        (401, "no or an unknown bearer token"),
        (403, "the token's role may not do this"),
        (404, "unknown job, node, upload, session or token"),
        (409, "a conflict (not ready, unknown plan, not retryable, exists already)"),
        (410, "the value is lost"),
        (413, "the body is over its limit"),
        (503, "standby, no executor or the metadata DB is unavailable"),
    )
}


class Health(BaseModel):
    ok: bool
    role: str = Field(description="leader or standby")
    version: str


class Ready(BaseModel):
    ready: bool = Field(description="leader and the metadata DB answers (else the answer is 503)")
    role: str
    metadb: bool
    version: str


class Whoami(BaseModel):
    name: str
    role: str


class Upload(BaseModel):
    id: str
    shape: list[int]
    dtype: str
    bytes: int


class CopyResult(BaseModel):
    ids: list[str]


class Released(BaseModel):
    id: str
    released: bool


class SessionBody(BaseModel):
    id: str
    ttl_s: float


class SessionEnded(BaseModel):
    id: str
    uploads: int
    jobs: int


class Progress(BaseModel):
    done: int
    total: int


class JobStatus(BaseModel):
    id: str
    state: str = Field(description="queued, running, done, failed or cancelled")
    progress: Progress
    error: ErrorDetail | None = None
    created: float
    updated: float


class JobDetail(JobStatus):
    owner: str | None = Field(None, description="the name of the token that submitted it")
    name: str | None = None
    tags: list[str] = []


class InlineValue(BaseModel):
    shape: list[int]
    dtype: str
    data: str = Field(description="base64 of the raw little-endian C-order bytes")


class SubmitAnswer(BaseModel):
    id: str
    state: str
    plan: str | None = Field(None, description="the canonical graph's hash (a compiled step's plan)")
    args: list[str] | None = None
    job: str | None = Field(None, description="with wait_s: the job id again")
    progress: Progress | None = None
    error: ErrorDetail | None = None
    values: dict[str, InlineValue] | None = None
    ref_values: dict[str, InlineValue] | None = Field(None, description="compiled steps: the values of "
                                                      "inline_refs (the step before's loss)")


class JobRequestBody(BaseModel):
    """The body of ``POST /v1/jobs`` (its schema for /openapi.json: the route parses it as
    strict JSON itself, ``api/jobrequest.py``; docs/runtime.md). The compiled-step form has
    ``plan`` and ``args`` instead of ``graph``."""

    graph: dict[str, Any] = Field(description="a graph document: {version, nodes, outputs}")
    fetch: list[str] | None = Field(None, description="the node ids to read (default: the outputs)")
    deadline_s: float | None = Field(None, gt=0, le=604800)
    wait_s: float | None = Field(None, gt=0, le=60, description="answer when the job ends or this passes")
    inline: list[str] | None = Field(None, description="fetched names whose values come back inline")
    release: list[str] | None = Field(None, max_length=1000, description="job and upload ids to release "
                                      "(as DELETE /v1/jobs/{id} and /v1/tensors/{id}) once this job is "
                                      "submitted and answered")
    grad: dict[str, Any] | None = Field(None, description="{of: <node>, wrt: [<nodes>]}: the gradients, "
                                                           "fetched as grad:<node>")
    persist: Literal["file", "redis"] | None = Field(None, description="keep the job's tiles in the "
                                                     "cluster's persistence target too (docs/storage.md)")
    name: str | None = Field(None, min_length=1, max_length=128)
    tags: list[str] | None = Field(None, max_length=16)
    prefer: str | None = Field(None, min_length=1, max_length=128, description="an executor's name: the "
                               "tasks the dispatcher places run there while it is up (else anywhere)")
    await_refs_s: float | None = Field(None, ge=0, le=60, description="compiled steps: a ref to a job "
                                       "still running waits up to this long for its end (not 409)")
    inline_refs: list[str] | None = Field(None, max_length=64, description="compiled steps: refs whose "
                                          "values (at most 64 KiB each) come back in ref_values")


class CopyRequest(BaseModel):
    from_: list[str] = Field(alias="from", description="refs <job>:<fetched name>", max_length=1000)


class Retried(BaseModel):
    id: str = Field(description="the new job")
    retry_of: str
    state: str


class Drift(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    at: float
    attempt: int
    from_: str | None = Field(None, alias="from", description="the node the attempt left (when known)")
    to: str | None = Field(None, description="the node the next attempt went to (when known)")
    reason: str


class TaskError(BaseModel):
    kind: str
    message: str
    node: str | None = Field(None, description="the submitted graph node the task computes (part of)")
    loc: str | None = Field(None, description="that node's source line as its SDK sent it (file:line)")


class Task(BaseModel):
    id: str
    op: str
    state: str
    attempt: int
    node: str | None
    queued_at: float | None
    started_at: float | None
    finished_at: float | None
    predicted_s: float | None
    actual_s: float | None
    error: TaskError | None
    drifts: list[Drift]


class Tile(BaseModel):
    tensor: str = Field(description="the fetched name it holds (of a part of one: the plan's id of the tile)")
    plan_node: str = Field(description="the plan's id it is stored under (the page order)")
    index: list[int]
    shape: list[int]
    dtype: str
    node: str | None
    memory_engine: str | None
    nbytes: int
    state: str
    updated_at: float


class Memory(BaseModel):
    capacity: int
    free: int


class Calibration(BaseModel):
    flops: float
    bytes: float


class Link(BaseModel):
    """A pair as ``node`` measured it (docs/network.md)."""

    peer: str
    engine: str
    bandwidth_gbps: float
    latency_us: float = Field(description="best round trip, microseconds")
    measured_at: float


class PluginProblem(BaseModel):
    """A plugin the node isolated (docs/plugins.md)."""

    kind: str = Field(description="op, memory, network or ops")
    name: str
    message: str


class Lease(BaseModel):
    """A node's registry lease (docs/api.md): its record vanishes at ``left_s`` unless renewed."""

    ttl_s: float = Field(description="the lease's TTL as granted (etcd: whole seconds)")
    left_s: float = Field(description="seconds left before it expires unless renewed")
    age_s: float = Field(description="seconds since it was last renewed (ttl_s - left_s)")


class Node(BaseModel):
    node: str
    address: str
    udp_port: int
    tcp_port: int
    data_port: int
    version: str
    started_at: float
    pid: int
    cpus: int
    health: str = Field(description="up (lease renewed within 2/3 of its TTL), late (renewals missed), "
                                    "unknown (lease unreadable)")
    lease: Lease | None = Field(description="its registry lease; None when unreadable")
    running: int = Field(description="tasks the dispatcher has there now")
    memory: Memory
    calibration: Calibration
    drained: bool = Field(description="an admin drained it: no new tasks go there")
    drained_at: float | None
    links: list[Link] = Field(default_factory=list, description="per-pair network figures it measured")
    plugins: list[PluginProblem] = Field(default_factory=list, description="plugins it isolated")


class Engine(BaseModel):
    node: str
    engine: str
    kind: str
    device: str
    ops: list[str]
    dtypes: list[str]
    gflops: float
    gbps: float
    memory_engine: str | None = Field(description="the memory engine it computes on (its binding)")


class Token(BaseModel):
    name: str
    role: str
    created: float


class TokenRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="1 to 64 letters, digits, '.', '_' or '-' (the owner of its jobs)")
    role: Literal["admin", "submit", "read"]


class TokenCreated(Token):
    token: str = Field(description="the token itself: shown this once, never again")


class TokenRevoked(BaseModel):
    name: str
    revoked: bool


class Stats(BaseModel):
    sent: int
    resent: int
    replies: int
    acks: int
    unsendable: int
    stale_replies: int
    drops: dict[str, int]
    plan_cache: dict[str, int]


class Config(BaseModel):
    model_config = ConfigDict(extra="allow")
    version: str
    id: str
    role: str
    host: str
    packet_port: int
    data_port: int
    elect: bool
    slots: int
    lease_ttl_s: float
    resume_wait_s: float
    session_ttl_s: float
    keep_jobs: int | None
    retention_period_s: float
    retain_finished: int
    group_tiny_jobs: bool
    max_upload_bytes: int
    max_graph_bytes: int
    metadb: str
    registry: str
    policy: dict[str, float | int | bool]
    drained: list[str]
    at: float


class _Page(BaseModel):
    next: str | None = Field(description="the cursor of the next page; null on the last")


class JobPage(_Page):
    items: list[JobDetail]


class TaskPage(_Page):
    items: list[Task]


class TilePage(_Page):
    items: list[Tile]


class NodePage(_Page):
    items: list[Node]


class EnginePage(_Page):
    items: list[Engine]


class TokenPage(_Page):
    items: list[Token]


class TimelineLane(BaseModel):
    node: str
    tasks: list[int] = Field(description="tasks whose kernel started in each bucket")
    busy_s: list[float] = Field(description="their kernel seconds")
    predicted_s: list[float] = Field(description="their predicted seconds")
    failed: list[int]
    retried: list[int] = Field(description="attempts after the first")


class TimelineTask(BaseModel):
    id: str
    op: str
    state: str
    attempt: int
    node: str | None
    start: float | None
    end: float | None
    predicted_s: float | None
    error: TaskError | None


class Timeline(BaseModel):
    job: str
    first: float | None = Field(description="the earliest kernel start (unix seconds); null before any")
    last: float | None
    rows: int = Field(description="tasks with a kernel start")
    start: float | None
    end: float | None
    buckets: int
    bucket_s: float | None
    nodes: list[TimelineLane]
    tasks: list[TimelineTask] | None = Field(description="the window's tasks, when at most the asked number")


class GraphNode(BaseModel):
    id: str
    op: str
    shape: list[int]
    dtype: str
    inputs: list[str] = Field(description="inputs among the nodes shown")
    hidden_inputs: int = Field(description="inputs not shown (past the limit)")
    steps: list[str] | None = Field(description="a fused node's program: the ops it fuses")


class GraphView(BaseModel):
    job: str
    source: str = Field(description="compiled (the job is held in memory) or submitted")
    total: int
    truncated: bool
    ops: dict[str, int]
    outputs: list[str]
    nodes: list[GraphNode]


class Spill(BaseModel):
    """A spilling memory engine's counters since its executor started (docs/storage.md)."""

    tiles: int = Field(description="tiles moved from memory to the spill directory")
    bytes: int = Field(description="their bytes")
    reads: int = Field(description="spilled tiles read back")
    read_bytes: int
    on_disk: int = Field(description="bytes in the spill directory now")


class Persisted(BaseModel):
    tiles: int = Field(description="tiles its node wrote to a persistence target")
    bytes: int = Field(description="their bytes")


class MemoryEngineView(BaseModel):
    node: str
    engine: str
    kind: str
    capacity: int
    free: int
    spill: Spill | None = Field(description="None for an engine that does not spill")
    persisted: Persisted


class TileTotal(BaseModel):
    node: str | None
    memory_engine: str | None
    state: str
    tiles: int
    bytes: int


class Storage(BaseModel):
    engines: list[MemoryEngineView]
    tiles: list[TileTotal]


def body_of(model: type[BaseModel], media: str = "application/json") -> dict[str, Any]:
    """``openapi_extra`` documenting the body of a route that reads its body itself."""
    return {"requestBody": {"required": True, "content": {media: {"schema": model.model_json_schema()}}}}


UPLOAD_BODY: dict[str, Any] = {
    "requestBody": {"required": True, "content": {"application/octet-stream": {
        "schema": {"type": "string", "format": "binary"}}}},
    "parameters": [
        {"name": "X-Triplane-Shape", "in": "header", "required": True, "schema": {"type": "string"},
         "description": "the dimensions, comma-separated (empty for 0-d)", "example": "2,2"},
        {"name": "X-Triplane-Dtype", "in": "header", "required": True, "schema": {"type": "string"},
         "example": "float32"},
    ],
}
