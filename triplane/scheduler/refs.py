"""Refs: a done job's fetched output bound as an input of a later job, where it lives
(issue 12, "resident parameters"; docs/runtime.md, "Refs").

A ref is the string ``"<job>:<name>"``: a job id, a colon, and a name that job listed in
``fetch``. It stands wherever an upload id stands as a graph input: the ``tensor`` of an
``input`` node of a submitted graph, or an element of a compiled step's ``args``. What it
is bound to (:meth:`Refs.resolve`):

* an output held in one tile: that tile, ``<job>.<task>``, on the executor holding it.
  Task packets name that executor as the tile's source (``DispatchShell.sources``), so a
  task placed there reads it in place and any other pulls it over the data port;
  placement counts it as held there (a laid-out job: as a cached upload tile; a job the
  dispatcher places: its readers prefer the holder when the ref is their largest input).
* an output held in several tiles (a tiled job): the reading job is tiled knowing how
  (``ClusterSnapshot.held``, :meth:`Refs.snapshot`), so it reads the value as it would a
  tiled producer of its own -- its tasks read those tiles, slices of them, or ``concat`` s
  of them, never the whole value at once unless a task needs it whole -- and its cuts
  align with them. Each region it reads is one of the tiles, bound to the tile on its
  holder, as above.
* any other read an executor cannot serve (a job laid out for no cluster, or too small
  to be tiled, reading a tiled output): a *copy* in the upload store, made at submit
  (the value read once through the scheduler and written to its disk, as
  ``POST /v1/tensors/copy`` does), bound as that upload. The copy belongs to the job and
  is deleted with its release. This costs what uploading the value would.
* a fetched name that is itself an upload: that upload.

Lifetime: from resolution to the end of the job reading it, the ref's job is *pinned*
(``Results.pin``): its tiles stay even if it is released meanwhile (the deletion waits
for the last reader; the release is answered at once and the ref cannot be used again).

Errors (domain errors, the ``ref`` field set): ``NotFound`` for an unknown job, a name it
did not fetch, a failed or cancelled job or released tensors; ``NotReady`` while the job
runs; ``Lost`` (HTTP 410) when the executor holding the value is gone and the value cannot
be computed again from its job's lineage (``lineage.py``: a value whose holder is gone is
recomputed at resolution, unless an input it needs was released); ``BadRequest`` when
the value's type is not the input's. A job whose ref's holder goes down while it runs
fails with job error kind ``lost`` and ``ref`` (the service's node-down hook,
:meth:`Refs.lost_on`). A resumed job (a restarted scheduler) finds its refs again from the
``refs`` of its ``job.bindings`` record, or fails if one is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from triplane import metadb as mdb
from triplane.net.dataport import DataPortError
from triplane.scheduler.compiler.compile import ClusterSnapshot
from triplane.scheduler.compiler.jobplan import JobPlan, is_tensor_id, tile_id
from triplane.scheduler.compiler.tiling import Region
from triplane.scheduler.dispatch.shell import DispatchShell
from triplane.scheduler.earlier import REBUILD_ERRORS, read_released
from triplane.scheduler.errors import BadRequest, Lost, NotFound, NotReady, Unavailable
from triplane.scheduler.store import TensorStore, expected_bytes

if TYPE_CHECKING:
    from triplane.scheduler.livejob import LiveJob
    from triplane.scheduler.results import Results

__all__ = ["Held", "Refs", "Resolved", "parse_ref", "refs_by_job", "refs_in_args", "refs_in_graph"]

_REF = re.compile(r"(j[0-9a-f]{16}):([^\x00-\x1f/]{1,128})")
MAX_COPY = 1000  # refs one POST /v1/tensors/copy may name
COPY_READS = 8  # ... read at a time (data-port requests in flight)


def parse_ref(s: object) -> tuple[str, str] | None:
    """(job, fetched name) of a ref string, else None."""
    if type(s) is not str or len(s) > 146:
        return None
    m = _REF.fullmatch(s)
    return (m[1], m[2]) if m else None


def refs_by_job(refs: Iterable[str]) -> dict[str, list[str]]:
    """Refs grouped by job: job -> fetched names (a string that is not a ref is skipped)."""
    out: dict[str, list[str]] = {}
    for ref in refs:
        parsed = parse_ref(ref)
        if parsed is not None:
            out.setdefault(parsed[0], []).append(parsed[1])
    return out


def refs_in_graph(doc: Any) -> list[str]:
    """The refs bound by the ``input`` nodes of a graph document (each once; a malformed
    document has none here: parsing it says what is wrong)."""
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    if not isinstance(nodes, dict):
        return []
    out: dict[str, None] = {}
    for n in nodes.values():
        if isinstance(n, dict) and n.get("op") == "input" and isinstance(n.get("attrs"), dict):
            t = n["attrs"].get("tensor")
            if parse_ref(t) is not None:
                out[t] = None
    return list(out)


def refs_in_args(args: Iterable[Any]) -> list[str]:
    return list(dict.fromkeys(a for a in args if parse_ref(a) is not None))


@dataclass(frozen=True)
class Resolved:
    """What a ref is bound to: ``tile`` (``<job>.<task>`` on ``holder``, or an upload id
    with no holder), ``owner`` the job whose tile it is (pinned while a reader runs; None
    once copied), the value's type, and for a value held in several tiles, ``parts``:
    (region, tile, holder) of each (``tile`` is then the first, standing for the whole)."""

    ref: str
    tile: str
    holder: str | None
    owner: str | None
    shape: tuple[int, ...]
    dtype: str
    parts: tuple[tuple[Region, str, str], ...] = ()

    @property
    def tiles(self) -> int:
        return len(self.parts) or 1

    def held(self) -> list[tuple[str, str]]:
        """(tile, holder) of each executor tile of the value."""
        if self.parts:
            return [(t, h) for _, t, h in self.parts]
        return [(self.tile, self.holder)] if self.holder is not None else []


@dataclass
class Held:
    """The refs of one job: pinned from resolution to the job's end (or its refusal)."""

    refs: dict[str, Resolved] = field(default_factory=dict)
    copies: list[str] = field(default_factory=list)  # uploads made for it (the job's own)
    done: bool = False  # bound to a running job, or dropped

    @property
    def bind(self) -> dict[str, str]:
        """ref -> the tile or upload an input is bound to."""
        return {ref: r.tile for ref, r in self.refs.items()}

    def by_tile(self) -> dict[str, Resolved]:
        return {r.tile: r for r in self.refs.values()}


class Refs:
    """Resolves refs, keeps their tiles alive and their holders known while jobs read them."""

    def __init__(self, *, live: dict[str, LiveJob], results: Results, shell: DispatchShell,
                 store: TensorStore, job_uploads: dict[str, list[str]]) -> None:
        self.live, self.results, self.shell, self.store = live, results, shell, store
        self.job_uploads = job_uploads  # job -> uploads that go with its release (the service's)
        self._running: dict[str, Held] = {}  # job -> the refs it reads, while it runs
        self._sources: dict[str, int] = {}  # tile -> running jobs pulling it (shell.sources)

    # --- resolution ----------------------------------------------------------------------

    async def resolve(self, refs: Sequence[str], wait_s: float = 0.0) -> Held:
        """Resolve and pin ``refs``; the errors of the module doc. ``wait_s``: a ref to a job
        still running waits up to that long for its end (a pipelined step binds the outputs
        of the step before it, docs/runtime.md) instead of NotReady; if that job failed for
        a lost value, Lost naming that value's ref (the client goes back to its checkpoint)."""
        held = Held()
        try:
            for ref in refs:
                r = await self._resolve(ref, wait_s)
                if r.owner is not None:
                    self.results.pin(r.owner)
                held.refs[ref] = r
        except BaseException:
            self.drop(held)
            raise
        return held

    async def _resolve(self, ref: str, wait_s: float = 0.0) -> Resolved:
        parsed = parse_ref(ref)
        if parsed is None:
            raise BadRequest(f"{ref[:60]!r} is not a ref (<job>:<fetched name>)", ref=ref)
        job, name = parsed
        live = self.live.get(job)
        if wait_s > 0 and live is not None and live.state == "running":
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(live.ended.wait(), wait_s)
            if live.state == "failed" and live.error and live.error.get("kind") == "lost":
                lost = live.error.get("ref") or ref
                raise Lost(f"ref {ref}: job {job} failed, a value it read was lost: "
                           f"{live.error.get('message')}", ref=lost)
        await self.results.settled(job)
        plan, holders = await self._done_job(ref, job, name)
        nid = plan.fetch[name]
        node = plan.plan.graph.nodes[nid]
        shape, dtype = tuple(node.shape), node.dtype
        if nid in plan.uploads:  # the job fetched one of its inputs
            tensor = plan.uploads[nid]
            if is_tensor_id(tensor):
                if tensor not in self.store:
                    raise NotFound(f"ref {ref}: uploaded tensor {tensor} is gone", ref=ref)
                return Resolved(ref, tensor, None, None, shape, dtype)
            owner, _, task = tensor.partition(".")  # itself bound to a ref's tile
            owner_plan, owner_holders = await self._done_job(ref, owner, None)
            holder = owner_holders.get(owner_plan.task_of(task))  # a grouped job's tile: its task g
            return self._alive(Resolved(ref, tensor, holder, owner, shape, dtype))
        grid = plan.fetch_grid(name)
        # A lost tile of a done job (its holder gone, no persisted copy) is computed again.
        if nid not in plan.uploads:
            if grid is not None and len(grid) > 1:
                tasks = list(grid.tiles.values())
            else:
                one = plan.fetch_tile(name)[1]
                tasks = [one] if one else []
            try:
                holders = await self.results.recover(job, plan, holders, tasks)
            except NotFound as e:  # it cannot be computed again (an input was released): lost
                raise Lost(f"ref {ref}: {e}", ref=ref) from None
        if grid is not None and len(grid) > 1:
            parts = []
            for cell, task in sorted(grid.tiles.items()):
                r = self._alive(Resolved(ref, tile_id(job, task), holders.get(task), job, shape, dtype))
                parts.append((grid.region(cell), r.tile, r.holder or ""))
            return Resolved(ref, parts[0][1], parts[0][2], job, tuple(grid.shape), grid.dtype, tuple(parts))
        tile, task = plan.fetch_tile(name)
        return self._alive(Resolved(ref, tile, holders.get(task or ""), job, shape, dtype))

    async def _done_job(self, ref: str, job: str, name: str | None) -> tuple[JobPlan, dict[str, str]]:
        """(plan, task -> holder) of a done, unreleased job fetching ``name``."""
        live = self.live.get(job)
        if live is not None:
            plan, state, holders = live.plan, live.state, live.holders
            released = live.fetched_released
        else:
            try:
                view = await self.results.earlier.get(job)
            except (mdb.UnknownJobError, mdb.InvalidInputError):
                raise NotFound(f"ref {ref}: unknown job {job}", ref=ref) from None
            except REBUILD_ERRORS as e:
                raise NotFound(f"ref {ref}: job {job} cannot be rebuilt from the metadb: {e}",
                               ref=ref) from None
            state, holders = view.state, view.holders
            if view.plan is None:
                if state in ("submitted", "compiling", "running"):
                    raise NotReady(f"ref {ref}: job {job} is running; a ref is used once it is done", ref=ref)
                raise NotFound(f"ref {ref}: job {job} is {state}, its outputs were never made", ref=ref)
            plan = view.plan
            released = state == "done" and await asyncio.to_thread(read_released, self.results.db, job)
        if name is not None and name not in plan.fetch:
            raise NotFound(f"ref {ref}: job {job} did not fetch {name!r}", ref=ref)
        if state == "running":
            raise NotReady(f"ref {ref}: job {job} is running; a ref is used once it is done", ref=ref)
        if state != "done":
            why = f" ({live.error.get('message')})" if live is not None and live.error else ""
            raise NotFound(f"ref {ref}: job {job} is {state}, its outputs were never made{why}", ref=ref)
        if released:
            raise NotFound(f"ref {ref}: the tensors of job {job} were released", ref=ref)
        return plan, holders

    def _alive(self, r: Resolved) -> Resolved:
        if r.holder is None or (r.holder not in self.shell.nodes and not self.shell.suspected(r.holder)):
            where = f"executor {r.holder}, which is gone" if r.holder else "no executor"
            raise Lost(f"ref {r.ref}: its value (tile {r.tile}) was held by {where}", ref=r.ref)
        return r

    # --- copies --------------------------------------------------------------------------

    async def read(self, ref: str) -> tuple[bytes, tuple[int, ...], str]:
        """The value of a ref (raw little-endian C-order bytes, shape, dtype): the errors
        of the module doc; its job is pinned while it is read."""
        r = await self._resolve(ref)
        if r.owner is not None:
            self.results.pin(r.owner)
        try:
            if r.holder is None and r.tiles == 1:  # an upload
                return bytes(self.store.data(r.tile)), r.shape, r.dtype
            if r.tiles > 1:
                job, name = parse_ref(ref)  # type: ignore[misc]
                shape, dtype, _, chunks = await self.results.open_tensor(job, name)
            else:
                info = self.shell.nodes.get(r.holder or "")
                if info is None:
                    raise Lost(f"ref {ref}: executor {r.holder} holding it is gone", ref=ref)
                try:
                    shape, dtype, _, chunks = await self.results.data_client.open_tile(
                        info.address, info.data_port, r.tile)
                except DataPortError as e:
                    raise Unavailable(f"ref {ref}: cannot read tile {r.tile} from {r.holder}: {e}",
                                      ref=ref) from None
            return b"".join([c async for c in chunks]), tuple(shape), dtype
        finally:
            if r.owner is not None:
                self.results.unpin(r.owner)

    async def copy(self, refs: Sequence[str], owner: str | None) -> list[str]:
        """``POST /v1/tensors/copy``: each ref's value stored as an upload of ``owner``. The
        values are read ``COPY_READS`` at a time (one data-port request each) and their files
        written in one worker thread, off the event loop (a training loop's checkpoint)."""
        gate = asyncio.Semaphore(COPY_READS)

        async def read(ref: str) -> tuple[bytes, tuple[int, ...], str]:
            async with gate:
                return await self.read(ref)

        values = await asyncio.gather(*(read(ref) for ref in refs))
        ids: list[str] = []

        def put_all() -> None:
            for data, shape, dtype in values:
                ids.append(self.store.put(data, shape, dtype, owner).id)

        try:
            await asyncio.to_thread(put_all)
        except BaseException:
            for u in ids:
                self.store.delete(u)
            raise
        return ids

    async def copy_into(self, held: Held, refs: Iterable[str], owner: str | None) -> None:
        """Bind ``refs`` of ``held`` to copies of their values instead (see the module doc;
        made as :meth:`copy` makes them)."""
        refs = list(refs)
        for ref, upload in zip(refs, await self.copy(refs, owner), strict=True):
            r = held.refs[ref]
            held.copies.append(upload)
            held.refs[ref] = Resolved(ref, upload, None, None, r.shape, r.dtype)
            if r.owner is not None:
                self.results.unpin(r.owner)

    # --- a job's refs ----------------------------------------------------------------------

    @staticmethod
    def check_types(plan: JobPlan, held: Held) -> None:
        """BadRequest naming the ref and the input when a value's type is not the input's."""
        if not held.refs:
            return
        by_tile = held.by_tile()
        for nid, tensor in plan.uploads.items():
            r = by_tile.get(tensor)
            node = plan.plan.graph.nodes[nid]
            if r is not None and (r.shape != tuple(node.shape) or r.dtype != node.dtype):
                name = plan.back.get(nid, nid)
                raise BadRequest(f"ref {r.ref} is {r.dtype}{list(r.shape)}, the input {name!r} declares "
                                 f"{node.dtype}{list(node.shape)}", node=name, op="input", ref=r.ref)

    @staticmethod
    def bind_regions(plan: JobPlan, held: Held) -> tuple[JobPlan, list[str]]:
        """``plan`` with each region of a tiled ref that is one of its tiles read from that
        tile, and the refs it reads in a way no executor serves (to copy, module doc)."""
        refs = {r.tile: r for r in held.refs.values() if r.holder is not None}
        if not refs:
            return plan, []
        tiles = {r.tile: {reg: t for reg, t, _ in r.parts} for r in refs.values()}
        copy: dict[str, None] = {}
        templates = dict(plan.templates)
        for task, tpl in plan.templates.items():
            swap = {}
            for t in tpl.uploads:
                base, at, spec = t.partition("@")
                r = refs.get(base)
                if r is None:
                    continue
                part = tiles[base].get(_region(spec)) if at else None
                if part is not None:
                    swap[t] = part
                elif at or r.parts:  # a region that is no tile, or the whole of a tiled value
                    copy[r.ref] = None
            if swap:
                templates[task] = dataclasses.replace(
                    tpl, inputs=tuple(swap.get(t, t) for t in tpl.inputs),
                    uploads=tuple(dict.fromkeys(swap.get(t, t) for t in tpl.uploads)))
        if copy:
            return plan, list(copy)
        return (dataclasses.replace(plan, templates=templates) if templates != plan.templates else plan), []

    @staticmethod
    def snapshot(cluster: ClusterSnapshot, held: Held) -> ClusterSnapshot:
        """``cluster`` whose cached-tile lookup also names the holders of ``held``'s tiles."""
        where = {r.tile: r.holder for r in held.refs.values() if r.holder is not None}
        parts = {r.tile: {reg: h for reg, _, h in r.parts} for r in held.refs.values() if r.parts}
        if not where:
            return cluster
        if parts:
            cluster = dataclasses.replace(cluster, held=lambda args: Refs.held_cuts(args, held))
        base = cluster.cached

        def cached(args: Sequence[str]) -> Callable[[str, Any], Sequence[str]]:
            inner = base(args) if base is not None else None

            def at(arg: str, region: Any) -> Sequence[str]:
                try:
                    tensor = args[int(arg[3:])]
                except (ValueError, IndexError):
                    tensor = ""
                if tensor in parts:
                    h = parts[tensor].get(tuple(tuple(x) for x in region)) if region is not None else None
                    return (h,) if h else ()
                if region is None and tensor in where:
                    return (where[tensor],)
                return inner(arg, region) if inner is not None else ()

            return at

        return dataclasses.replace(cluster, cached=cached)

    @staticmethod
    def held_cuts(args: Sequence[str], held: Held) -> dict[str, list[list[int]]]:
        """``argN`` -> the boundaries of each dimension of the tiles holding the value bound
        to it, for each arg bound to a ref held in several tiles (``ClusterSnapshot.held``;
        recorded in ``job.bindings`` so a job planned again is tiled the same way)."""
        tiled = {r.tile: r.parts for r in held.refs.values() if r.parts}
        out: dict[str, list[list[int]]] = {}
        for i, a in enumerate(args):
            parts = tiled.get(a)
            if parts:
                out[f"arg{i}"] = [sorted({b for reg, _, _ in parts for b in reg[d]})
                                  for d in range(len(parts[0][0]))]
        return out

    @staticmethod
    def prefer_holders(plan: JobPlan, held: Held) -> JobPlan:
        """A plan the dispatcher places (no placement): each task whose largest input is a
        ref's tile prefers that tile's holder."""
        if (plan.layout is not None and plan.layout.placement is not None) or not held.refs:
            return plan
        where = {r.tile: (r.holder, r) for r in held.refs.values() if r.holder is not None}
        if not where:
            return plan
        out_bytes = {s.id: s.output_bytes for s in plan.specs}
        specs = []
        for s in plan.specs:
            best, size = None, max((out_bytes[d] for d in s.deps), default=0)
            for t in plan.templates[s.id].uploads:
                if t in where:
                    holder, r = where[t]
                    n = _nbytes(r)
                    if n >= size:
                        best, size = holder, n
            specs.append(dataclasses.replace(s, node=best) if best is not None and s.node is None else s)
        return dataclasses.replace(plan, specs=tuple(specs))

    def bind(self, job: str, held: Held) -> None:
        """``job`` is dispatched now: its tasks pull its refs' tiles from their holders, and
        its copies go with its release. Undone by :meth:`ended`."""
        held.done = True
        if held.copies:
            self.job_uploads.setdefault(job, []).extend(held.copies)
        if not held.refs:
            return
        self._running[job] = held
        for r in held.refs.values():
            for tile, holder in r.held():
                self._sources[tile] = self._sources.get(tile, 0) + 1
                self.shell.sources[tile] = holder

    def drop(self, held: Held) -> None:
        """The job was refused: unpin its refs and delete its copies (never pulled)."""
        if held.done:
            return
        held.done = True
        for r in held.refs.values():
            if r.owner is not None:
                self.results.unpin(r.owner)
        for u in held.copies:
            self.store.delete(u)

    def ended(self, job: str) -> None:
        """``job`` ended: its refs' tiles may go (see ``Results.unpin``)."""
        held = self._running.pop(job, None)
        if held is None:
            return
        for r in held.refs.values():
            for tile, _ in r.held():
                left = self._sources.get(tile, 0) - 1
                if left > 0:
                    self._sources[tile] = left
                else:
                    self._sources.pop(tile, None)
                    self.shell.sources.pop(tile, None)
            if r.owner is not None:
                self.results.unpin(r.owner)

    def ref_of(self, job: str, tile: str) -> str | None:
        """The ref of running ``job`` that ``tile`` is (a part of), if any."""
        held = self._running.get(job)
        if held is None:
            return None
        return next((r.ref for r in held.refs.values() if any(t == tile for t, _ in r.held())), None)

    def lost_on(self, node: str) -> list[tuple[str, Resolved]]:
        """(running job, its first ref held on ``node``) for each job reading a ref there."""
        out = []
        for job, held in self._running.items():
            r = next((r for r in held.refs.values() if any(h == node for _, h in r.held())), None)
            if r is not None:
                out.append((job, r))
        return out

    def recorded(self, held: Held) -> dict[str, str]:
        """For the job's ``job.bindings``: tile -> ref, of the refs read where they live."""
        return {r.tile: ref for ref, r in held.refs.items() if r.holder is not None}

    async def reattach(self, recorded: Mapping[str, str]) -> Held:
        """A resumed job's refs (``recorded`` as :meth:`recorded` gave it), resolved and
        pinned again; the errors of :meth:`resolve` (its value must be the same tile)."""
        held = await self.resolve(list(recorded.values()))
        for tile, ref in recorded.items():
            if held.refs[ref].tile != tile:
                self.drop(held)
                raise Lost(f"ref {ref}: its value is no longer tile {tile}", ref=ref)
        return held


def _region(spec: str) -> Region | None:
    """The region of a region tile's ``lo:hi,lo:hi`` (None if malformed)."""
    try:
        return tuple((int(a), int(b)) for a, b in (p.split(":") for p in spec.split(",")))
    except ValueError:
        return None


def _nbytes(r: Resolved) -> int:
    try:
        return expected_bytes(r.shape, r.dtype)
    except (KeyError, ValueError):
        return 0
