"""``triplane events`` (a page of the scheduler's events, or ``--follow``: the live stream)
and ``triplane logs`` (a process's log file from the run directory, or a job's events)
(docs/cli.md). Registered on the ``triplane`` app by :func:`register`.

``--follow`` reads ``GET /v1/events`` as server-sent events: from ``--after``, else (with
``--job``) from the job's first event, else from now. When the connection drops it
reconnects with the last event id it printed (``Last-Event-ID``), so no event is lost or
printed twice; with ``--job`` it ends after the job's last event (done, failed,
cancelled). Ctrl-C stops following (exit 0).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from triplane.cli_client import AdminClient
from triplane.cli_kit import App, CliError, Common, client_of, console, emit_page, err_console, table, when

__all__ = ["register"]

JOB_ENDS = frozenset({"job.done", "job.failed", "job.cancelled"})
RECONNECTS = 5  # tries in a row without an event before --follow gives up

Follow = Annotated[bool, typer.Option("--follow", "-f", help="keep printing new events as they happen "
                                      "(the live stream; Ctrl-C stops)")]


def register(app: App) -> None:
    app.command("events")(events)
    app.command("logs")(logs)


Kinds = Annotated[list[str] | None, typer.Option("--kind", metavar="KIND", help="only this kind, e.g. "
                                                 "job.failed (repeat for several)")]


def events(job: Annotated[str | None, typer.Option("--job", metavar="JOB", help="only this job's "
                                                   "events")] = None,
           kind: Kinds = None,
           after: Annotated[int | None, typer.Option("--after", min=0, help="only events after this "
                                                     "id")] = None,
           limit: Annotated[int, typer.Option("--limit", min=1, max=1000, help="events per page")] = 100,
           follow: Follow = False, *, common: Common) -> None:
    """The scheduler's events (job, task and node changes), oldest first.

    Without --follow: one page of --limit events after --after; the last id is printed
    for the next page. With --follow: then every new one, as it happens (--json: one JSON
    object a line)."""
    params: list[tuple[str, Any]] = [("job", job), *(("kind", k) for k in kind or [])]
    with client_of(common) as client:
        if follow:
            _follow(client, params, after, job, common.as_json)
            return
        page = client.page("/v1/events", [*params, ("after", after), ("limit", limit)])
    items = page.items
    if common.as_json:
        emit_page(items, page.next)
        return
    _table(items)
    if items:
        console.print(f"next page: triplane events --after {items[-1].get('id')}"
                      + (f" --job {job}" if job else ""), soft_wrap=True)


def _table(items: list[dict[str, Any]]) -> None:
    table(None, ("id", "at", "kind", "job", "task", "node", "data"),
          [(e.get("id"), when(e.get("at")), e.get("kind"), e.get("job") or "", e.get("task") or "",
            e.get("node") or "", _data(e.get("data"))) for e in items])
    if not items:
        console.print("no events match")


def _data(d: Any) -> str:
    return json.dumps(d, sort_keys=True, separators=(",", ":")) if d else ""


def _line(e: dict[str, Any]) -> str:
    where = " ".join(f"{k}={e[k]}" for k in ("job", "task", "node") if e.get(k))
    return f"{e.get('id')}  {when(e.get('at'))}  {e.get('kind')}  {where}  {_data(e.get('data'))}".rstrip()


def _follow(client: AdminClient, params: list[tuple[str, Any]], after: int | None, job: str | None,
            as_json: bool) -> None:
    err_console.print(f"following events from {client.url}" + (f" of job {job}" if job else "")
                      + " (Ctrl-C stops)")
    if job is not None and after is None:
        after = 0  # a job's events from its first: one that has ended already ends the command at once
    try:
        for e in follow_events(client, params, after):
            if as_json:
                typer.echo(json.dumps(e, sort_keys=True))
            else:
                console.print(_line(e), markup=False, soft_wrap=True, highlight=False)
            if job is not None and e.get("kind") in JOB_ENDS and e.get("job") == job:
                return
    except KeyboardInterrupt:
        err_console.print("stopped following")


def follow_events(client: AdminClient, params: list[tuple[str, Any]], after: int | None
                  ) -> Iterator[dict[str, Any]]:
    """The live stream, reconnecting with the last id seen when it drops (at most
    :data:`RECONNECTS` tries in a row that bring no event)."""
    last, tries = after, 0
    while True:
        got = False
        for e in client.stream_events([*params, ("after", last)], last_id=last):
            got = True
            if isinstance(e.get("id"), int):
                last = e["id"]
            yield e
        tries = 0 if got else tries + 1
        if tries >= RECONNECTS:
            raise CliError(f"the event stream of {client.url} closed {RECONNECTS} times in a row "
                           f"without an event (last id {last})")
        time.sleep(0.2 * tries)


# --- logs ----------------------------------------------------------------------------------

Process = Annotated[str | None, typer.Argument(metavar="PROCESS", help="a process of the run directory: "
                                               "scheduler, executor-0, ... (none: list them)")]


def logs(process: Process = None,
         job: Annotated[str | None, typer.Option("--job", metavar="JOB", help="a job's events instead of "
                                                 "a process's log")] = None,
         tail: Annotated[int, typer.Option("--tail", "-n", min=0, help="the last N lines (0: all)")] = 200,
         follow: Follow = False, *, common: Common) -> None:
    """A process's log from the run directory (`triplane up` writes one per process), or
    with --job a job's events (the same as `triplane events --job JOB`)."""
    if job is not None:
        if process is not None:
            raise CliError("give a process or --job, not both", code=2)
        events(job=job, kind=None, after=None, limit=1000, follow=follow, common=common)
        return
    from triplane.launcher import RunDir

    run = RunDir(common.home)
    found = sorted(p.stem for p in run.logs.glob("*.log")) if run.logs.is_dir() else []
    if process is None:
        if common.as_json:
            emit_page([{"process": n, "path": str(run.log(n))} for n in found])
        elif not found:
            console.print(f"no logs in {run.logs} (`triplane up` writes them)", markup=False)
        else:
            console.print(f"logs in {run.logs}:", markup=False, soft_wrap=True)
            table(None, ("process", "bytes"), [(n, run.log(n).stat().st_size) for n in found])
        return
    path = run.log(process)
    if not path.is_file():
        raise CliError(f"no log of {process!r} in {run.logs} (there are: {', '.join(found) or 'none'})")
    _print_log(path, tail, follow)


def _print_log(path: Path, tail: int, follow: bool) -> None:
    with path.open("rb") as f:
        lines = f.read().decode("utf-8", "replace").splitlines()
        for ln in lines[-tail:] if tail else lines:
            typer.echo(ln)
        if not follow:
            return
        err_console.print(f"following {path} (Ctrl-C stops)")
        partial = b""  # a line the process has not finished writing yet
        try:
            while True:
                chunk = f.readline()
                if chunk.endswith(b"\n"):
                    typer.echo((partial + chunk).decode("utf-8", "replace").rstrip("\n"))
                    partial = b""
                elif chunk:
                    partial += chunk
                else:
                    time.sleep(0.2)
        except KeyboardInterrupt:
            err_console.print("stopped following")
