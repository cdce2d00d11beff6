"""``triplane submit FILE``: post a graph document (JSON or YAML) as a job, optionally wait
for it with a progress bar and print or save what it fetched (docs/cli.md).

The file is either a graph document (``{"version", "nodes", "outputs"}``, the IR's format)
or a whole job request (``{"graph": ..., "fetch": [...], "name", "tags", "deadline_s", ...}``
as ``POST /v1/jobs`` takes it). YAML is read with the safe loader (no tags, no aliases:
``triplane.proto.safeyaml``); JSON strictly (no duplicate keys, NaN or Infinity). Nothing
is checked here beyond that: the scheduler validates the graph and answers a 400 naming
the node, which is printed as it is.

Ctrl-C while waiting cancels the job (``--on-interrupt cancel``, the default) or leaves
it running (``--on-interrupt detach``); either way the command says which and exits 130.
"""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from triplane.cli_kit import (
    App,
    CliError,
    Common,
    client_of,
    console,
    emit_json,
    err_console,
    error_text,
    wait_job,
)

__all__ = ["load_job_request", "register"]

MAX_FILE_BYTES = 256 * 1024 * 1024


class OnInterrupt(str, Enum):
    cancel = "cancel"
    detach = "detach"


Fetch = Annotated[list[str] | None, typer.Option("--fetch", metavar="NODE", help="a node to fetch (repeat; "
                                                 "default: the request's fetch, else the outputs)")]
Name = Annotated[str | None, typer.Option("--name", metavar="NAME", help="the job's name (at most 128 "
                                          "characters)")]
Tags = Annotated[list[str] | None, typer.Option("--tag", metavar="TAG", help="a tag of the job (repeat)")]


def register(app: App) -> None:
    app.command("submit")(submit)


def load_job_request(path: Path) -> dict[str, Any]:
    """The ``POST /v1/jobs`` body a file holds (a graph document is wrapped as ``{"graph": doc}``).
    CliError naming the file for an unreadable, malformed or unknown kind of file."""
    from triplane.proto.canonjson import loads_strict
    from triplane.proto.ir import MAX_YAML_DEPTH
    from triplane.proto.safeyaml import YamlRefused, bounded_load

    suffix = path.suffix.lower()
    if suffix not in (".json", ".yaml", ".yml"):
        raise CliError(f"{path}: expected a graph document or job request ending in .json, .yaml or .yml", 2)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise CliError(f"{path} is {size} bytes, more than the limit of {MAX_FILE_BYTES}", 2)
        data = path.read_bytes()
    except OSError as e:
        raise CliError(f"cannot read {path}: {e.strerror or e}", 2) from None
    try:
        if suffix == ".json":
            doc = loads_strict(data)
        else:
            doc = bounded_load(data.decode("utf-8"), max_depth=MAX_YAML_DEPTH)
    except (ValueError, YamlRefused, RecursionError) as e:  # GraphError and yaml's errors too
        raise CliError(f"{path} is not valid {'JSON' if suffix == '.json' else 'YAML'}: {e}", 2) from None
    except Exception as e:  # yaml.YAMLError is not a ValueError
        raise CliError(f"{path} is not valid YAML: {e}", 2) from None
    if not isinstance(doc, dict):
        raise CliError(f"{path}: expected a mapping (a graph document or a job request), "
                       f"got {type(doc).__name__}", 2)
    return dict(doc) if "graph" in doc else {"graph": doc}


def submit(file: Annotated[Path, typer.Argument(metavar="FILE", help="a graph document or job request: "
                                                ".json, .yaml, .yml")],
           fetch: Fetch = None, name: Name = None, tag: Tags = None,
           deadline: Annotated[float | None, typer.Option("--deadline", min=0.001, help="seconds after which "
                                                          "the job fails with kind 'deadline'")] = None,
           wait: Annotated[bool, typer.Option("--wait", help="wait for the job to end (progress bar on "
                                              "stderr), then print its fetched values")] = False,
           timeout: Annotated[float | None, typer.Option("--timeout", min=0.0, help="with --wait: give up "
                                                         "waiting after this many seconds")] = None,
           on_interrupt: Annotated[OnInterrupt, typer.Option("--on-interrupt", help="with --wait, what "
                                                             "Ctrl-C does to the job")] = OnInterrupt.cancel,
           save: Annotated[Path | None, typer.Option("--save", metavar="DIR", help="with --wait: write each "
                                                     "fetched value to DIR/<node>.npy")] = None,
           keep: Annotated[bool, typer.Option("--keep", help="with --wait: keep the job's tiles on the "
                                              "cluster (by default they are released once fetched)")] = False,
           *, common: Common) -> None:
    """Submit a graph as a job; print its id (with --wait: its end state and fetched values).

    Exit status: 0 when submitted (with --wait: when done), 1 when the job failed or was
    cancelled or the request was refused, 130 on Ctrl-C."""
    body = load_job_request(file)
    if fetch:
        body["fetch"] = list(fetch)
    if name is not None:
        body["name"] = name
    if tag:
        body["tags"] = list(tag)
    if deadline is not None:
        body["deadline_s"] = deadline
    with client_of(common) as client:
        answer = client.post("/v1/jobs", body)
        job = str(answer.get("id"))
        if not wait:
            if common.as_json:
                emit_json(answer)
            else:
                console.print(f"job {job} submitted ({answer.get('state')}); `triplane job {job}` shows it")
            return
        fetched = _fetch_names(body)
        then = "cancels it" if on_interrupt is OnInterrupt.cancel else "detaches, the job goes on"
        err_console.print(f"job {job} submitted; waiting for it (Ctrl-C {then})")
        try:
            status = wait_job(client, job, timeout_s=timeout)
        except KeyboardInterrupt:
            _interrupted(client, job, on_interrupt)
        values = _values(client, job, fetched) if status.get("state") == "done" else {}
        if values and not keep:
            client.delete(f"/v1/jobs/{job}", what=f"job {job!r}")
    if save is not None:
        _save(save, values)
    _report(status, values, common.as_json)
    if status.get("state") != "done":
        raise typer.Exit(1)


def _fetch_names(body: dict[str, Any]) -> list[str]:
    """What the job fetches: ``fetch``, else the graph's outputs; then ``grad:<w>`` for each
    ``w`` of a ``grad`` request (the scheduler adds those names to the fetch list)."""
    fetch = body.get("fetch")
    if not isinstance(fetch, list):
        graph = body.get("graph")
        fetch = graph.get("outputs") if isinstance(graph, dict) else None
    names = [str(f) for f in fetch] if isinstance(fetch, list) else []
    grad = body.get("grad")
    wrt = grad.get("wrt") if isinstance(grad, dict) else None
    for w in wrt if isinstance(wrt, list) else []:
        if f"grad:{w}" not in names:
            names.append(f"grad:{w}")
    return names


def _interrupted(client: Any, job: str, on_interrupt: OnInterrupt) -> None:
    if on_interrupt is OnInterrupt.detach:
        err_console.print(f"detached: job {job} goes on (`triplane job {job}` shows it, "
                          f"`triplane cancel {job}` cancels it)")
        raise typer.Exit(130)
    try:
        body = client.delete(f"/v1/jobs/{job}", what=f"job {job!r}")
    except CliError as e:
        raise CliError(f"interrupted; cancelling job {job} failed: {e}", code=130) from None
    err_console.print(f"interrupted: job {job} cancelled ({body.get('state')})")
    raise typer.Exit(130)


def _values(client: Any, job: str, names: list[str]) -> dict[str, np.ndarray]:
    from triplane.proto import dtypes as dt
    from triplane.proto.errors import DTypeError

    out: dict[str, np.ndarray] = {}
    for name in names:
        shape, dtype, data = client.tensor(job, name)
        try:
            d = dt.dtype(dtype)
        except DTypeError as e:
            raise CliError(f"tensor {name!r} of job {job}: {e}") from None
        want = int(np.prod(shape, dtype=np.int64)) * d.itemsize
        if len(data) != want:
            raise CliError(f"tensor {name!r} of job {job} is {len(data)} bytes; "
                           f"{dtype}{list(shape)} needs {want}")
        out[name] = np.frombuffer(data, dtype=d.np.newbyteorder("<")).astype(d.np).reshape(shape)
    return out


def _save(folder: Path, values: dict[str, np.ndarray]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, v in values.items():
        path = folder / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.npy"
        np.save(path, v, allow_pickle=False)
        err_console.print(f"saved {name} to {path}")


def _report(status: dict[str, Any], values: dict[str, np.ndarray], as_json: bool) -> None:
    job, state = status.get("id"), status.get("state")
    if as_json:
        emit_json({**status, "values": {k: {"shape": list(v.shape), "dtype": _dtype_name(v),
                                            "data": v.astype(np.float64).tolist()
                                            if v.dtype.kind == "V" or str(v.dtype) == "bfloat16"
                                            else v.tolist()}
                                        for k, v in values.items()}})
        return
    line = f"job {job}: {state}"
    if status.get("error"):
        line += f": {error_text(status['error'])}"
    console.print(line, markup=False, soft_wrap=True)
    for name, v in values.items():
        text = np.array2string(v, threshold=64, edgeitems=3, max_line_width=120)
        console.print(f"{name} {_dtype_name(v)}{list(v.shape)}:\n{text}", markup=False, soft_wrap=True)


def _dtype_name(v: np.ndarray) -> str:
    from triplane.proto import dtypes as dt

    return dt.dtype(v.dtype).name
