"""``triplane jobs``, ``job``, ``tasks``, ``tiles``, ``cancel`` and ``retry``: a cluster's jobs over the
REST API (docs/cli.md). Registered on the ``triplane`` app by :func:`register`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

from triplane.cli_kit import (
    App,
    CliError,
    Common,
    client_of,
    console,
    emit_json,
    emit_page,
    error_text,
    parse_when,
    seconds,
    table,
    wait_job,
    when,
)

__all__ = ["register"]

JobArg = Annotated[str, typer.Argument(metavar="JOB", help="the job's id (`triplane jobs` lists them)")]
Limit = Annotated[int, typer.Option("--limit", min=1, max=1000, help="rows per page")]
Cursor = Annotated[str | None, typer.Option("--cursor", help="start at this page (the `next` a "
                                            "listing printed)")]
All = Annotated[bool, typer.Option("--all", help="follow every page to the end")]


def register(app: App) -> None:
    for name, fn in (("jobs", jobs), ("job", job), ("tasks", tasks), ("tiles", tiles), ("cancel", cancel),
                     ("retry", retry)):
        app.command(name)(fn)


def progress_text(j: dict[str, Any]) -> str:
    p = j.get("progress") or {}
    return f"{p.get('done', '?')}/{p.get('total', '?')}"


States = Annotated[list[str] | None, typer.Option(
    "--state", metavar="STATE", help="only jobs in this state (queued, running, done, failed, cancelled); "
                                     "repeat for several")]
Owner = Annotated[str | None, typer.Option("--owner", metavar="NAME", help="only this token name's jobs")]
Name = Annotated[str | None, typer.Option("--name", metavar="NAME", help="only jobs of this name")]
Tags = Annotated[list[str] | None, typer.Option("--tag", metavar="TAG", help="only jobs with this tag; "
                                                "repeat: all must match")]


def jobs(state: States = None, owner: Owner = None, name: Name = None, tag: Tags = None,
         since: Annotated[str | None, typer.Option("--since", help="created at or after: unix seconds, "
                                                   "ISO date/time or an age (10m, 2h, 7d)")] = None,
         until: Annotated[str | None, typer.Option("--until", help="created before (same forms)")] = None,
         limit: Limit = 50, cursor: Cursor = None, every: All = False, *, common: Common) -> None:
    """List jobs, newest first: id, name, state, progress, owner, created, error.

    One page of --limit rows; the next page's cursor is printed under the table (or is
    "next" in --json). --all follows every page."""
    params: list[tuple[str, Any]] = [("limit", limit)]
    params += [("state", s) for s in state or []]
    params += [("owner", owner), ("name", name), ("since", parse_when(since)), ("until", parse_when(until))]
    params += [("tag", t) for t in tag or []]
    items, nxt = _listing(common, "/v1/jobs", params, cursor, every)
    if common.as_json:
        emit_page(items, nxt)
        return
    table(None, ("id", "name", "state", "progress", "owner", "created", "tags", "error"),
          [(j.get("id"), j.get("name") or "", j.get("state"), progress_text(j), j.get("owner") or "",
            when(j.get("created")), ",".join(j.get("tags") or []), error_text(j.get("error")))
           for j in items])
    if not items:
        console.print("no jobs match")
    if nxt:
        console.print(f"next page: triplane jobs --cursor {nxt}", soft_wrap=True)


def _listing(common: Common, path: str, params: list[tuple[str, Any]], cursor: str | None, every: bool,
             what: str | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """The rows of a listing and the next page's cursor: one page from ``cursor``, or with
    ``--all`` every page (no next then)."""
    with client_of(common) as client:
        if every:
            return list(client.pages(path, params, what=what)), None
        page = client.page(path, [*params, ("cursor", cursor)], what=what)
        return page.items, page.next


def job(job: JobArg, *, common: Common) -> None:
    """One job: state, progress, name, tags, owner, times and error."""
    with client_of(common) as client:
        body = client.get(f"/v1/jobs/{job}", what=f"job {job!r}")
    if common.as_json:
        emit_json(body)
        return
    rows = [("id", body.get("id")), ("state", body.get("state")),
            ("progress", progress_text(body) + " tasks"),
            ("name", body.get("name") or ""), ("tags", ", ".join(body.get("tags") or [])),
            ("owner", body.get("owner") or ""), ("created", when(body.get("created"))),
            ("updated", when(body.get("updated")))]
    if body.get("retry_of"):
        rows.append(("retry of", body["retry_of"]))
    if body.get("error"):
        rows.append(("error", error_text(body["error"])))
    table(None, ("field", "value"), rows)


def tasks(job: JobArg, limit: Limit = 50, cursor: Cursor = None, every: All = False, *,
          common: Common) -> None:
    """A job's tasks: op, state, attempt, node, predicted and actual seconds, error, drifts."""
    _of_job("tasks", job, limit, cursor, every, common,
            ("id", "op", "state", "attempt", "node", "predicted s", "actual s", "drifts", "error"),
            lambda t: (t.get("id"), t.get("op"), t.get("state"), t.get("attempt"), t.get("node") or "",
                       seconds(t.get("predicted_s")), seconds(t.get("actual_s")), _drifts(t.get("drifts")),
                       error_text(t.get("error"))))


def tiles(job: JobArg, limit: Limit = 50, cursor: Cursor = None, every: All = False, *,
          common: Common) -> None:
    """Where a job's results live: tensor, tile index, shape, dtype, node, memory engine, bytes."""
    _of_job("tiles", job, limit, cursor, every, common,
            ("tensor", "index", "shape", "dtype", "node", "memory engine", "bytes", "state"),
            lambda t: (t.get("tensor"), t.get("index"), t.get("shape"), t.get("dtype"), t.get("node") or "",
                       t.get("memory_engine") or "", t.get("nbytes"), t.get("state")))


def _of_job(kind: str, job: str, limit: int, cursor: str | None, every: bool, common: Common,
            columns: tuple[str, ...], row: Callable[[dict[str, Any]], tuple[Any, ...]]) -> None:
    """``triplane tasks|tiles JOB``: the listing ``/v1/jobs/JOB/<kind>`` as JSON, or a table
    of ``columns`` (``row`` of each item) and the next page's command."""
    items, nxt = _listing(common, f"/v1/jobs/{job}/{kind}", [("limit", limit)], cursor, every, f"job {job!r}")
    if common.as_json:
        emit_page(items, nxt)
        return
    table(f"{kind} of {job}", columns, [row(t) for t in items])
    if nxt:
        console.print(f"next page: triplane {kind} {job} --cursor {nxt}", soft_wrap=True)


def _drifts(drifts: Any) -> str:
    if not drifts:
        return ""
    return "; ".join(f"{d.get('from')}->{d.get('to')} ({d.get('reason')})" for d in drifts)


def cancel(job: JobArg, *, common: Common) -> None:
    """Cancel a job (DELETE /v1/jobs/JOB): a running job stops and its tiles are released; a
    finished one's tiles are released."""
    with client_of(common) as client:
        body = client.delete(f"/v1/jobs/{job}", what=f"job {job!r}")
    if common.as_json:
        emit_json(body)
        return
    console.print(f"job {job}: {body.get('state')} ({progress_text(body)} tasks done); "
                  "its tiles are released")


def retry(job: JobArg,
          wait: Annotated[bool, typer.Option("--wait", help="wait for the new job to end, with a progress "
                                             "bar; exit 1 unless it is done")] = False,
          *, common: Common) -> None:
    """Run a failed or cancelled job again: a new job with the same graph, fetch list and
    inputs (POST /v1/jobs/JOB/retry). Prints the new job's id."""
    with client_of(common) as client:
        body = client.post(f"/v1/jobs/{job}/retry", what=f"job {job!r}")
        new = str(body.get("id"))
        if wait:
            try:
                body = {**wait_job(client, new), "retry_of": job}
            except KeyboardInterrupt:
                raise CliError(f"stopped waiting; job {new} goes on (`triplane cancel {new}` cancels it)",
                               code=130) from None
    if common.as_json:
        emit_json(body)
    else:
        state = f" ({body.get('state')})" if wait else ""
        console.print(f"job {new}{state}: a retry of {job}")
    if wait and body.get("state") != "done":
        raise typer.Exit(1)
