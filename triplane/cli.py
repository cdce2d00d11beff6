"""The ``triplane`` command.

    triplane demo [--steps N] [--seed S]   fit a small MLP to scikit-learn's digits on a temporary local
                                          cluster of two executors (``--embedded``: in this process)
    triplane up [--executors N] ...       start a local cluster in the background (docs/cluster.md)
    triplane status [--json]              its nodes and recent jobs
    triplane down                         stop it
    triplane scheduler / executor ...     run one scheduler / executor process (docs/runtime.md)
    triplane config show ROLE             the effective configuration of a scheduler or executor
                                          (file, environment, flags; secrets masked; docs/deploy.md)
    triplane ops                          the op table: name, group, gradient, dtypes
    triplane version                      the installed version (also `triplane --version`)

A cluster's jobs, nodes, events and tokens over its REST API (docs/cli.md), each command in
the module that registers it here:

    cli_jobs.py     jobs, job JOB, tasks JOB, tiles JOB, cancel JOB, retry JOB
    cli_submit.py   submit FILE (a graph document or job request, JSON or YAML; --wait)
    cli_admin.py    nodes, drain NODE, undrain NODE, tokens add/list/remove
    cli_events.py   events [--job J] [--follow], logs [PROCESS | --job J]
    cli_serve.py    serve MODEL (the model server, docs/serving.md; also tp.serve)
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from triplane import cli_admin, cli_events, cli_jobs, cli_serve, cli_submit
from triplane.cli_kit import App, console, err_console

app = App(help="triplane: run deep-learning compute graphs on a cluster (or in this process).")

if TYPE_CHECKING:
    from rich.console import Console

    from triplane.demo import DemoData, DemoResult


def _print_version(value: bool) -> None:
    if value:
        import triplane

        typer.echo(f"triplane {triplane.__version__}")
        raise typer.Exit()


@app.callback()
def _top(version: bool = typer.Option(False, "--version", "-V", callback=_print_version, is_eager=True,
                                      help="print the installed version and exit")) -> None:
    """triplane: run deep-learning compute graphs on a cluster (or in this process).

    Every command takes -h/--help; those that print data take --json. A command that talks
    to a cluster finds it as tp.connect() does: --url/--token, else TRIPLANE_URL and
    TRIPLANE_TOKEN, else the run directory of `triplane up` (docs/cli.md)."""


@app.command()
def version(as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Print the installed version."""
    import triplane

    if as_json:
        typer.echo(json.dumps({"version": triplane.__version__}))
    else:
        console.print(f"triplane {triplane.__version__}")


@app.command()
def ops(as_json: bool = typer.Option(False, "--json", help="print JSON: one object per op")) -> None:
    """List the op table."""
    from triplane.proto import optable

    if as_json:
        typer.echo(json.dumps([{"name": name, "group": op.group, "differentiable": op.differentiable,
                                "dtypes": sorted(op.dtypes)}
                               for name, op in sorted(optable.table().items()) if not op.internal], indent=2))
        return
    table = Table(title=f"triplane ops ({len(optable.names())})")
    for col in ("name", "group", "differentiable", "dtypes"):
        table.add_column(col)
    for name, op in sorted(optable.table().items(), key=lambda kv: (kv[1].group, kv[0])):
        if op.internal:
            continue
        table.add_row(name, op.group, "yes" if op.differentiable else "no", _dtypes_text(op.dtypes))
    console.print(table)


def _dtypes_text(dtypes: frozenset[str]) -> str:
    from triplane.proto import dtypes as dt

    if dtypes == dt.EVERY:
        return "all"
    if dtypes == dt.NUMERIC:
        return "numeric"
    if dtypes == dt.FLOATS:
        return "floats"
    return ", ".join(sorted(dtypes))


@app.command()
def demo(steps: int = typer.Option(40, min=1, max=10_000, help="gradient-descent steps"),
         seed: int = typer.Option(0, help="seed of the split and the initial weights"),
         embedded: bool = typer.Option(False, "--embedded", help="run in this process, no cluster"),
         executors: int = typer.Option(2, min=1, max=16, help="executors of the temporary cluster"),
         as_json: bool = typer.Option(False, "--json", help="print only the result as JSON: losses, "
                                      "test accuracy, compiled-step counts")) -> None:
    """Fit a small MLP (64 -> 32 -> 10) to scikit-learn's digits with SGD, printing step and
    loss, then the test accuracy.

    Every step is a compiled step (tp.compile). By default the steps run on a temporary
    local cluster (a scheduler and two executors on loopback, in a throw-away run
    directory) that is torn down at the end. Without scikit-learn it fits a small
    synthetic regression instead, and says so."""
    from triplane.demo import load_data

    out = err_console if as_json else console  # with --json, stdout holds only the JSON
    data = load_data(seed)
    where = "in this process" if embedded else f"on a local cluster of {executors} executors"
    d, k = data.x_train.shape[1], 10 if data.kind == "digits" else 1
    out.print(f"[bold]triplane demo[/bold]: MLP {d}-32-{k}, SGD(momentum=0.9), full batch, "
                  f"{steps} compiled steps (tp.compile), seed {seed}, {where}")
    out.print(f"data: {data.description}")

    def show(i: int, v: float) -> None:
        out.print(f"step {i:4d}  loss {v:.6f}")

    t0 = time.perf_counter()
    if embedded:
        result = _demo_fit(data, steps, seed, show)
    else:
        result = _demo_on_cluster(data, steps, seed, executors, show, out)
    dt = time.perf_counter() - t0
    losses, info = result.losses, result.cache_info
    out.print(f"loss {losses[0]:.6f} -> {losses[-1]:.6f} in {dt:.2f}s; compiled steps: "
                  f"{info.get('hits', 0)} replayed, {info.get('misses', 0)} compiled")
    if result.test_accuracy is not None:
        out.print(f"test accuracy {result.test_accuracy:.4f} ({len(data.y_test)} held-out digits)")
    if as_json:
        typer.echo(json.dumps({"data": data.kind, "losses": losses, "test_accuracy": result.test_accuracy,
                               "compiled_steps": {"replayed": info.get("hits", 0),
                                                  "compiled": info.get("misses", 0)}, "seconds": dt}))


def _demo_fit(data: DemoData, steps: int, seed: int, show: Callable[[int, float], None]) -> DemoResult:
    from triplane.demo import fit

    return fit(data, steps, seed, on_step=show)


def _demo_on_cluster(data: DemoData, steps: int, seed: int, executors: int,
                     show: Callable[[int, float], None], out: Console) -> DemoResult:
    import tempfile

    from triplane.launcher import ClusterConfig, LaunchError, LocalCluster
    from triplane.sdk.remote import RemoteSession
    from triplane.sdk.session import use_session

    with tempfile.TemporaryDirectory(prefix="triplane-demo-") as home:
        try:
            cluster = LocalCluster(home, ClusterConfig(executors=executors, memory="256MiB",
                                                       log_level="warning"))
            cluster.start()
        except LaunchError as e:
            out.print(f"[red]could not start the demo cluster:[/red] {e}\n"
                          "(`triplane demo --embedded` runs without one)")
            raise typer.Exit(1) from None
        try:
            out.print(f"cluster: {cluster.url}, {executors} executors (run dir {home})")
            with RemoteSession(cluster.url, cluster.token, job_timeout_s=120) as session, \
                    use_session(session):
                return _demo_fit(data, steps, seed, show)
        finally:
            cluster.stop()
            out.print("cluster stopped")


# --- the local cluster ---------------------------------------------------------------------------

HomeOption = typer.Option(None, "--home", help="run directory (default: $TRIPLANE_HOME or ~/.triplane)")


@app.command()
def up(executors: int | None = typer.Option(None, min=0, max=64, help="executor processes to start "
                                            "(default 2, or one per GPU with --gpus)"),
       engines: str | None = typer.Option(None, help="op engines of every executor, comma-separated "
                                          "(default numpy; cupy,numpy on a GPU executor; auto: numpy "
                                          "and every installed plugin)"),
       gpus: int = typer.Option(0, min=0, max=64, help="GPUs: the first N executors get one each "
                                "(CUDA_VISIBLE_DEVICES), the cupy engine and the device memory engine"),
       network_engine: str | None = typer.Option(None, help="the network engine the executors measure "
                                                 "their links with (default tcp; udp or a plugin's name)"),
       etcd: str = typer.Option("", help="'embedded' (a local etcd managed here) or etcd://HOST:PORT; "
                                         "default: the scheduler's served in-memory registry"),
       db: str = typer.Option("", help="metadb URL (default: SQLite in the run directory)"),
       memory: str = typer.Option("1GiB", help="tile memory per executor, e.g. 512MiB, 8GiB"),
       port: int = typer.Option(0, min=0, max=65535, help="scheduler HTTP port (0: a free one)"),
       home: Path | None = HomeOption,
       timeout: float = typer.Option(60.0, min=1.0, help="seconds to wait for the cluster to be ready"),
       show_token: bool = typer.Option(False, "--show-token", help="print the admin token"),
       keep_jobs: int | None = typer.Option(None, min=-1, help="released finished jobs whose metadb rows "
                                            "the scheduler keeps (default 100; -1: all)"),
       as_json: bool = typer.Option(False, "--json", help="print what was started as JSON (the token "
                                    "only with --show-token)"),
       ) -> None:
    """Start a local cluster (scheduler + N executors) in the background; print its URL.

    The admin token is written to the run directory's ``token`` file (where tp.connect()
    finds it); it is printed only with --show-token."""
    from triplane.launcher import ClusterConfig, LaunchError
    from triplane.launcher import up as launch

    if executors is None:
        executors = gpus or 2
    try:
        cfg = ClusterConfig(executors=executors, engines=engines, gpus=gpus, network_engine=network_engine,
                            etcd=etcd or None,
                            db=db or None, memory=memory, port=port, ready_timeout_s=timeout,
                            scheduler_args=[] if keep_jobs is None else ["--keep-jobs", str(keep_jobs)])
        with err_console.status(f"starting a scheduler and {executors} executors ..."):
            info = launch(cfg, home)
    except (LaunchError, ValueError) as e:
        console.print(f"[red]triplane up failed:[/red] {escape(str(e))}", soft_wrap=True)
        raise typer.Exit(1) from None
    if as_json:
        typer.echo(json.dumps(info if show_token else {k: v for k, v in info.items() if k != "token"},
                              indent=2, sort_keys=True, default=str))
        return
    console.print(f"triplane cluster up: [bold]{info['url']}[/bold] ({len(info['executors'])} executors, "
                  f"registry {info['registry']})")
    if show_token:
        console.print(f"token:   {info['token']}")
    else:
        console.print(f"token:   in {info['token_file']} (--show-token prints it)")
    console.print(f"run dir: {info['home']} (logs in {info['home']}/logs)")
    console.print(f"gRPC:    {info.get('grpc') or 'not served'} (docs/grpc.md)")
    console.print("connect: tp.connect()  (or TRIPLANE_URL / TRIPLANE_TOKEN);  stop: triplane down")


@app.command()
def status(as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
           jobs: int = typer.Option(10, min=0, max=1000, help="recent jobs to show"),
           home: Path | None = HomeOption) -> None:
    """Nodes (id, address, pid, engines, health) and recent jobs of the local cluster."""
    from triplane.launcher import cluster_status

    st = cluster_status(home, jobs)
    if as_json:
        typer.echo(json.dumps(st, indent=2, sort_keys=True, default=str))
    elif not st["running"]:
        console.print(f"no cluster is running from {st['home']} (start one with `triplane up`)")
    else:
        _print_status(st)
    if not st["running"]:
        raise typer.Exit(1)


def _print_status(st: dict[str, object]) -> None:
    console.print(f"cluster {st['url']}  registry {st['registry']}  run dir {st['home']}")
    if st.get("error"):
        console.print(f"[red]{st['error']}[/red]")
    nodes = Table(title="nodes")
    for col in ("id", "address", "pid", "engines", "health"):
        nodes.add_column(col)
    for n in st["nodes"]:  # type: ignore[attr-defined]
        nodes.add_row(n["id"], n["address"], str(n["pid"]), ", ".join(n["engines"]), n["health"])
    console.print(nodes)
    if st.get("links"):
        from triplane.launcher.links import links_table

        console.print(links_table(st["links"]))  # type: ignore[arg-type]
    for p in st.get("plugins") or []:  # type: ignore[attr-defined]
        console.print(f"[red]{p['process']}: plugin isolated: {p['problem']}[/red]", soft_wrap=True)
    recent = Table(title="recent jobs")
    for col in ("id", "state", "progress", "created", "error"):
        recent.add_column(col)
    for j in st["jobs"]:  # type: ignore[attr-defined]
        prog = j.get("progress") or {}
        err = j.get("error")
        message = (err.get("message") if isinstance(err, dict) else err) or ""
        progress = f"{prog.get('done', '?')}/{prog.get('total', '?')}"
        created = j.get("created")
        when = time.strftime("%H:%M:%S", time.localtime(created)) if isinstance(created, (int, float)) else ""
        recent.add_row(str(j.get("id")), str(j.get("state")), progress, when, message)
    console.print(recent)


@app.command()
def down(home: Path | None = HomeOption,
         grace: float = typer.Option(5.0, min=0.0, help="seconds between SIGTERM and SIGKILL"),
         as_json: bool = typer.Option(False, "--json", help='print {"stopped": URL or null}')) -> None:
    """Stop the local cluster that `triplane up` started (idempotent)."""
    from triplane.launcher import down as stop

    with err_console.status("stopping the cluster ..."):
        info = stop(home, grace)
    if as_json:
        typer.echo(json.dumps({"stopped": None if info is None else info["url"]}))
    elif info is None:
        console.print("no cluster was running")
    else:
        console.print(f"stopped the cluster at {info['url']}")


config_app = App(help="The configuration of `triplane scheduler` and `triplane executor` "
                      "(docs/deploy.md, \"Configuration\").")
app.add_typer(config_app, name="config")


@config_app.command("show")
def config_show(role: Annotated[str, typer.Argument(metavar="ROLE", help="scheduler or executor")],
                config: Annotated[Path | None, typer.Option(
                    help="TOML config file (else $TRIPLANE_CONFIG)")] = None,
                as_json: Annotated[bool, typer.Option(
                    "--json", help="print JSON: key -> {value, source}")] = False) -> None:
    """Print the effective configuration of ROLE on this host: each key's value and where it
    came from (flag, environment, file or default). Secrets are masked: the cluster secret and
    the admin token show only whether they are set and from where; a URL's password is ****."""
    from triplane.config import ConfigError, load, show

    try:
        shown = show(role, load(role, config_file=config))
    except ConfigError as e:
        from rich.markup import escape

        err_console.print(f"[red]triplane config show:[/red] {escape(str(e))}")
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(shown, indent=2, sort_keys=True))
        return
    table = Table(title=f"triplane {role} configuration")
    for col in ("key", "value", "source"):
        table.add_column(col)
    for key, entry in shown.items():
        table.add_row(key, "" if entry["value"] is None else str(entry["value"]), entry["source"])
    console.print(table)


def _mount_process_commands() -> None:
    """``triplane executor`` and ``triplane scheduler``: one process each (their own modules)."""
    from triplane.executor.cli import executor_command
    from triplane.explain_cli import explain_command

    app.command("executor")(executor_command)
    app.command("explain")(explain_command)
    try:
        from triplane.scheduler.cli import scheduler_command
    except ImportError as e:  # the scheduler service needs the [cluster] extra (fastapi, uvicorn)
        missing = str(e)

        @app.command("scheduler")
        def scheduler_unavailable() -> None:
            """Run the scheduler (needs the cluster extra: pip install 'triplane[cluster]')."""
            console.print(f"[red]the scheduler cannot start:[/red] {missing}")
            raise typer.Exit(1)
    else:
        app.command("scheduler")(scheduler_command)


_mount_process_commands()
for _module in (cli_jobs, cli_submit, cli_admin, cli_events, cli_serve):
    _module.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
