"""``triplane nodes``, ``drain``, ``undrain`` and ``tokens``: a cluster's executors and client
tokens (docs/cli.md). Registered on the ``triplane`` app by :func:`register`.

``tokens`` works over the REST API (``/v1/tokens``, admin) when a cluster runs (the run
directory's, or the one ``--url``/``TRIPLANE_URL`` names), and on the run directory's
``tokens.json`` when none does (or with ``--file``): a scheduler of that run directory
reads the file at its next request, so both ways a token works at once. The run
directory's scheduler that does not serve ``/v1/tokens`` (older than this command) gets the
file too.
"""

from __future__ import annotations

import os
import time
from typing import Annotated, Any

import typer

from triplane.cli_client import NotServed
from triplane.cli_kit import (
    App,
    CliError,
    Common,
    client_of,
    console,
    emit_json,
    emit_page,
    err_console,
    table,
)

__all__ = ["register"]

NodeArg = Annotated[str, typer.Argument(metavar="NODE", help="the node's id (`triplane nodes` lists them)")]
File = Annotated[bool, typer.Option("--file", help="edit the run directory's tokens.json even when a "
                                    "cluster runs (no REST request)")]


def register(app: App) -> None:
    app.command("nodes")(nodes)
    app.command("drain")(drain)
    app.command("undrain")(undrain)
    tokens_app = App(help="Client tokens of the cluster (admin, submit, read): over REST when a cluster "
                          "runs, else the run directory's tokens.json.")
    tokens_app.command("add")(tokens_add)
    tokens_app.command("list")(tokens_list)
    tokens_app.command("remove")(tokens_remove)
    app.add_typer(tokens_app, name="tokens")


# --- nodes ---------------------------------------------------------------------------------

def node_id(n: dict[str, Any]) -> str:
    return str(n.get("node") or n.get("id") or "?")


def _engines(n: dict[str, Any]) -> str:
    engines = n.get("engines") or []
    if isinstance(engines, dict):
        return ", ".join(str(k) for k in engines)
    return ", ".join(str(e.get("engine") or e.get("name")) if isinstance(e, dict) else str(e)
                     for e in engines)


def _memory(n: dict[str, Any]) -> str:
    m = n.get("memory") or {}
    cap, free = m.get("capacity"), m.get("free")
    if not isinstance(cap, (int, float)) or not isinstance(free, (int, float)):
        return ""
    return f"{free / 2**20:.0f}/{cap / 2**20:.0f} MiB free"


def nodes(*, common: Common) -> None:
    """The executors the registry holds: id, address, health, drained, engines, memory."""
    with client_of(common) as client:
        items = list(client.pages("/v1/nodes", [("limit", 1000)]))
        engines = client.get("/v1/engines")  # op engines are records of their own: joined by node
    for e in engines.get("items", []) if isinstance(engines, dict) else engines:
        for n in items:
            if isinstance(e, dict) and e.get("node") == node_id(n) and not n.get("engines"):
                n.setdefault("op_engines", []).append(e.get("engine"))
    if common.as_json:
        emit_page(items)
        return
    table(None, ("id", "address", "health", "drained", "running", "engines", "memory"),
          [(node_id(n), n.get("address", ""), n.get("health") or n.get("state") or "",
            "yes" if n.get("drained") else "no", n.get("running", ""),
            _engines(n) or ", ".join(n.get("op_engines") or []), _memory(n)) for n in items])
    if not items:
        console.print("no executors are registered")


def drain(node: NodeArg,
          wait: Annotated[bool, typer.Option("--wait", help="then wait until no task runs there (a "
                                             "progress line on stderr)")] = False,
          timeout: Annotated[float | None, typer.Option("--timeout", min=0.0, help="with --wait: give up "
                                                        "after this many seconds")] = None,
          *, common: Common) -> None:
    """Drain a node: it gets no new tasks (running ones finish) until `triplane undrain`.

    With --wait, return once none of its tasks runs any more (safe to stop it then)."""
    with client_of(common) as client:
        body = client.post(f"/v1/nodes/{node}/drain", what=f"node {node!r}")
        if not common.as_json:
            console.print(f"node {node}: drained (running tasks finish; no new ones)")
        if wait:
            body = _wait_idle(client, node, timeout)
            if not common.as_json:
                console.print(f"node {node}: no task runs there")
    if common.as_json:
        emit_json(body)


def _wait_idle(client: Any, node: str, timeout_s: float | None) -> dict[str, Any]:
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    with err_console.status(f"waiting for the tasks running on {node} to finish ...") as status:
        while True:
            body = client.get(f"/v1/nodes/{node}", what=f"node {node!r}")
            running = int(body.get("running") or 0)
            if running == 0:
                return dict(body)
            status.update(f"waiting for the {running} task(s) running on {node} to finish ...")
            if deadline is not None and time.monotonic() > deadline:
                raise CliError(f"node {node} still runs {running} task(s) after {timeout_s:g} s "
                               "(it stays drained)")
            time.sleep(0.5)


def undrain(node: NodeArg, *, common: Common) -> None:
    """Undrain a node: it gets new tasks again."""
    with client_of(common) as client:
        body = client.post(f"/v1/nodes/{node}/undrain", what=f"node {node!r}")
    if common.as_json:
        emit_json(body)
    else:
        console.print(f"node {node}: undrained")


# --- tokens --------------------------------------------------------------------------------

def _over_rest(common: Common, file: bool) -> bool:
    if file:
        return False
    if common.url or os.environ.get("TRIPLANE_URL"):
        return True
    from triplane.launcher import RunDir
    from triplane.launcher.cluster import live_cluster

    return live_cluster(RunDir(common.home)) is not None


def _rest(common: Common, file: bool, method: str, path: str, **kw: Any) -> Any:
    """The REST answer, or None where the file is the place: no cluster runs, ``--file``, or
    the run directory's scheduler does not serve ``/v1/tokens``."""
    if not _over_rest(common, file):
        return None
    with client_of(common) as client:
        try:
            if method == "GET":
                return list(client.pages(path, [("limit", 1000)]))
            return client.request(method, path, **kw)
        except NotServed:
            if common.url or os.environ.get("TRIPLANE_URL"):
                raise
            return None


def tokens_add(name: Annotated[str, typer.Argument(metavar="NAME", help="the token's name: the owner of "
                                                   "the jobs it submits")],
               role: Annotated[str, typer.Option("--role", help="admin, submit or read")],
               file: File = False, *, common: Common) -> None:
    """Make a token with ROLE and print it (once: only its hash is kept).

    A running scheduler accepts it at once."""
    body = _rest(common, file, "POST", "/v1/tokens", body={"name": name, "role": role})
    if body is None:
        from triplane.launcher.rundir import RunDir
        from triplane.scheduler.api.tokens import add_token

        run = RunDir(common.home)
        try:
            with run.locked():
                secret = add_token(run.tokens_file, name, role)
        except ValueError as e:
            raise CliError(str(e), code=2) from None
        body = {"name": name, "role": role, "token": secret}
    if common.as_json:
        emit_json(body)
    else:
        typer.echo(str(body.get("token")))


def tokens_list(file: File = False, *, common: Common) -> None:
    """Name and role of each client token (the admin token of `up` is the run directory's
    token file, not listed)."""
    entries = _rest(common, file, "GET", "/v1/tokens")
    if entries is None:
        from triplane.launcher.rundir import RunDir
        from triplane.scheduler.api.tokens import read_tokens

        try:
            entries = [{"name": e.name, "role": e.role} for e in read_tokens(RunDir(common.home).tokens_file)]
        except ValueError as e:
            raise CliError(str(e)) from None
    if common.as_json:
        emit_page(entries)
        return
    for e in entries:
        typer.echo(f"{e.get('name')}\t{e.get('role')}")


def tokens_remove(name: Annotated[str, typer.Argument(metavar="NAME", help="the token's name")],
                  file: File = False, *, common: Common) -> None:
    """Remove a token; a running scheduler refuses it from its next request."""
    body = _rest(common, file, "DELETE", f"/v1/tokens/{name}", what=f"token {name!r}")
    if body is None:
        from triplane.launcher.rundir import RunDir
        from triplane.scheduler.api.tokens import remove_token

        run = RunDir(common.home)
        with run.locked():
            if not remove_token(run.tokens_file, name):
                raise CliError(f"no token named {name!r}")
        body = {"name": name, "removed": True}
    if common.as_json:
        emit_json(body)
    else:
        console.print(f"removed token {name!r}", markup=False)
