"""What every ``triplane`` command shares (docs/cli.md): the Typer classes, the options that
name the cluster, JSON and table output, one-line errors, and waiting on a job with a
progress bar.

**Flags shown as flags.** typer 0.29's rich help panel prints a type for every option,
flags included, so ``--json`` read ``--json <bool>`` and ``--help`` ``--help <bool>``
(typer 0.29 vendors click as ``typer._click`` and draws the panel itself:
``TyperOption.display_type_rich`` has no flag case, while its plain-text help skips the
type of a flag). :class:`Command` and :class:`Group` give each flag an empty metavar before the help
is drawn, which the panel shows as no type at all.

**Options every cluster command shares.** A command whose last parameter is
``common: Common`` says only its own options: :meth:`App.command` puts ``--json``,
``--home``, ``--url`` and ``--token`` in that parameter's place (last in its help) and hands
the command their values as one :class:`Common`; :func:`client_of` makes its client.

**Errors.** A command raises :class:`~triplane.cli_client.CliError`; :class:`Command` prints
``triplane <command>: <message>`` on stderr (no traceback) and exits with its code (1).
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperCommand, TyperGroup, TyperOption

from triplane.cli_client import TERMINAL, AdminClient, CliError, connect_admin

__all__ = [
    "App", "AsJson", "CliError", "Command", "Common", "Group", "Home", "Token", "Url", "client_of",
    "console", "emit_json", "emit_page", "err_console", "error_text", "parse_when", "seconds", "table",
    "wait_job", "when",
]

console = Console()
err_console = Console(stderr=True)

HELP_NAMES = {"help_option_names": ["-h", "--help"]}


def _flags_without_type(command: TyperCommand | TyperGroup, ctx: typer.Context) -> None:
    for p in command.get_params(ctx):
        if isinstance(p, TyperOption) and (p.is_flag or p.count) and p.metavar is None:
            p.metavar = ""


class Command(TyperCommand):
    """A command whose flags show as flags and whose CliError is one line on stderr."""

    def format_help(self, ctx: typer.Context, formatter: Any) -> None:
        _flags_without_type(self, ctx)
        super().format_help(ctx, formatter)

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CliError as e:
            err_console.print(f"[red]{escape(command_name(ctx))}:[/red] {escape(str(e))}", soft_wrap=True)
            raise typer.Exit(e.code) from None


class Group(TyperGroup):
    """A command group whose flags (``--version``, ``--help``) show as flags."""

    def format_help(self, ctx: typer.Context, formatter: Any) -> None:
        _flags_without_type(self, ctx)
        super().format_help(ctx, formatter)


class App(typer.Typer):
    """typer.Typer with :class:`Group`, :class:`Command` by default, and ``-h`` for help."""

    def __init__(self, **kw: Any) -> None:
        kw.setdefault("cls", Group)
        kw.setdefault("add_completion", False)
        kw.setdefault("no_args_is_help", True)
        kw.setdefault("context_settings", HELP_NAMES)
        super().__init__(**kw)

    def command(self, name: str | None = None, *, cls: type[TyperCommand] | None = None,
                **kw: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        register = super().command(name, cls=cls or Command, **kw)
        return lambda fn: register(with_common(fn))


def command_name(ctx: typer.Context) -> str:
    """``triplane jobs``, ``triplane tokens add``: the command as the user typed it."""
    names: list[str] = []
    c: typer.Context | None = ctx
    while c is not None and c.parent is not None:
        names.append(c.info_name or "")
        c = c.parent
    return " ".join(["triplane", *reversed(names)])


# --- where the cluster is ------------------------------------------------------------------

Home = Annotated[Path | None, typer.Option("--home", help="run directory of `triplane up` "
                                           "(default: $TRIPLANE_HOME or ~/.triplane)")]
Url = Annotated[str | None, typer.Option("--url", help="the scheduler's URL (default: $TRIPLANE_URL, "
                                         "else the run directory's cluster)")]
Token = Annotated[str | None, typer.Option("--token", help="bearer token (default: $TRIPLANE_TOKEN, "
                                           "else the run directory's admin token)")]
AsJson = Annotated[bool, typer.Option("--json", help="print JSON (for scripts) instead of a table")]


_COMMON = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind)
           for name, kind, default in (("as_json", AsJson, False), ("home", Home, None), ("url", Url, None),
                                       ("token", Token, None))]


@dataclass(frozen=True)
class Common:
    """What a cluster command's ``--json``, ``--home``, ``--url`` and ``--token`` say."""

    as_json: bool = False
    home: Path | None = None
    url: str | None = None
    token: str | None = None


def with_common(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as Typer should see it: its ``common: Common`` parameter (if it has one) turned
    into the options ``--json``, ``--home``, ``--url`` and ``--token``, after its own."""
    sig = inspect.signature(fn, eval_str=True)
    if "common" not in sig.parameters or sig.parameters["common"].annotation is not Common:
        return fn
    own = [p for p in sig.parameters.values() if p.name != "common"]

    @functools.wraps(fn)
    def command(**kw: Any) -> Any:
        common = Common(**{p.name: kw.pop(p.name) for p in _COMMON})
        return fn(**kw, common=common)

    params = [*own, *_COMMON]
    command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    return command


def client_of(common: Common) -> AdminClient:
    """The client of the cluster a command's ``--home``/``--url``/``--token`` name (the
    one seam the commands get their client through)."""
    return connect_admin(common.home, common.url, common.token)


# --- output --------------------------------------------------------------------------------

def emit_json(data: Any) -> None:
    """``data`` as indented JSON on stdout (sorted keys: stable for scripts and diffs)."""
    typer.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def emit_page(items: Sequence[Any], next_cursor: str | None = None) -> None:
    """A listing as JSON: ``{"items": [...], "next": cursor}`` (the REST API's page)."""
    emit_json({"items": list(items), "next": next_cursor})


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    t = Table(title=title)
    for c in columns:
        t.add_column(c)
    for row in rows:
        t.add_row(*(escape("" if v is None else str(v)) for v in row))
    console.print(t)


def when(ts: Any) -> str:
    """A unix time as local ``YYYY-mm-dd HH:MM:SS`` ("" for none)."""
    if not isinstance(ts, (int, float)) or not math.isfinite(ts):
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def seconds(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, (int, float)) else ""


def error_text(err: Any) -> str:
    if isinstance(err, dict):
        where = f" (node {err['node']})" if err.get("node") else ""
        return f"{err.get('kind') or 'error'}: {err.get('message') or ''}{where}"
    return "" if err is None else str(err)


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")


def parse_when(text: str | None, now: float | None = None) -> float | None:
    """A time filter as unix seconds: unix seconds (``1764000000``), an ISO 8601 date or time
    (``2026-11-25``, ``2026-11-25T14:00``, local time unless it names a zone), or an age
    (``30s``, ``10m``, ``2h``, ``7d``: that long ago). CliError otherwise."""
    if text is None:
        return None
    text = text.strip()
    m = _DURATION.match(text)
    if m:
        scale = {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
        return (time.time() if now is None else now) - float(m.group(1)) * scale
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise CliError(f"cannot read the time {text!r}: give unix seconds, an ISO date/time "
                       "(2026-11-25T14:00) or an age (30s, 10m, 2h, 7d)", code=2) from None


# --- waiting on a job ----------------------------------------------------------------------

def wait_job(client: AdminClient, job: str, *, timeout_s: float | None = None,
             show: bool = True) -> dict[str, Any]:
    """Long-poll ``GET /v1/jobs/{job}/wait`` until the job ends, drawing a progress bar of
    its tasks on stderr; the job's last status. ``timeout_s`` passed: CliError.
    KeyboardInterrupt goes to the caller (which cancels or detaches)."""
    from rich import progress as rp

    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    columns = (rp.SpinnerColumn(), rp.TextColumn("job {task.fields[job]} {task.fields[state]}"),
               rp.BarColumn(), rp.MofNCompleteColumn(), rp.TextColumn("tasks"), rp.TimeElapsedColumn())
    with rp.Progress(*columns, console=err_console, transient=True, disable=not show) as progress:
        bar = progress.add_task("", total=None, job=job, state="queued")
        while True:
            status = client.get(f"/v1/jobs/{job}/wait", params={"timeout": 0.5}, what=f"job {job!r}")
            prog = status.get("progress") or {}
            progress.update(bar, total=prog.get("total"), completed=prog.get("done") or 0,
                            state=status.get("state"))
            if status.get("state") in TERMINAL:
                return status
            if deadline is not None and time.monotonic() > deadline:
                raise CliError(f"job {job} is still {status.get('state')} after {timeout_s:g} s "
                               f"(it goes on: `triplane job {job}` shows it)")
