"""``triplane up`` / ``status`` / ``down``: the launcher's commands as plain functions.

The CLI (triplane/cli.py) parses options and prints; these functions do the work and
return data, so they are callable and testable without a terminal. Errors the user can
act on are :class:`~triplane.launcher.cluster.LaunchError` with the message to print.
"""

from __future__ import annotations

import os
from typing import Any

from triplane.launcher.cluster import ClusterConfig, LocalCluster, live_cluster, stop_recorded
from triplane.launcher.links import links_of
from triplane.launcher.procs import is_ours
from triplane.launcher.rundir import RunDir

__all__ = ["cluster_status", "down", "normalise_node", "plugins_of", "up"]


def up(config: ClusterConfig, home: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Start a cluster in the background and return its ``cluster.json`` record (with the
    token added under ``"token"``). The processes keep running after this returns."""
    cluster = LocalCluster(home, config)
    info = cluster.start()
    # Popen objects must not reap (or kill) the detached children when garbage-collected;
    # dropping the references is enough: Popen.__del__ leaves running processes alone.
    return {**info, "token": cluster.token}


def down(home: str | os.PathLike[str] | None = None, grace_s: float = 5.0) -> dict[str, Any] | None:
    """Stop what ``up`` started in ``home``; the record stopped, None if nothing was."""
    return stop_recorded(RunDir(home), grace_s)


def normalise_node(n: dict[str, Any]) -> dict[str, Any]:
    """One node of ``GET /v1/nodes`` as ``status`` shows it: id, address, pid, engines, health."""
    engines = n.get("engines") or []
    if isinstance(engines, dict):
        names = [str(k) for k in engines]
    else:
        names = [str(e.get("engine") or e.get("name") or e.get("kind")) if isinstance(e, dict) else str(e)
                 for e in engines]
    address = n.get("address", "")
    if n.get("udp_port"):
        address = f"{address}:{n['udp_port']}"
    return {"id": str(n.get("node") or n.get("id") or "?"), "address": str(address),
            "pid": int(n.get("pid") or 0), "engines": names,
            "health": str(n.get("health") or n.get("state") or "up")}


def cluster_status(home: str | os.PathLike[str] | None = None, jobs: int = 10) -> dict[str, Any]:
    """What runs from ``home``: ``{"running": False, "home"}`` when nothing does, else the
    record, the scheduler's health, its nodes and the ``jobs`` most recent jobs. An
    unreachable scheduler is reported in ``"error"``, not raised."""
    import httpx

    run = RunDir(home)
    info = live_cluster(run)
    if info is None:
        return {"running": False, "home": str(run.path)}
    out: dict[str, Any] = {"running": True, "home": str(run.path), "url": info["url"],
                           "registry": info.get("registry"), "db": info.get("db"), "error": None,
                           "nodes": [], "links": [], "plugins": [], "jobs": [], "processes": _processes(info)}
    headers = {"Authorization": f"Bearer {run.read_token() or ''}"}
    try:
        with httpx.Client(base_url=info["url"], headers=headers, timeout=5.0) as client:
            out["health"] = client.get("/v1/health").json()
            nodes = client.get("/v1/nodes", params={"limit": 1000})
            nodes.raise_for_status()
            raw = nodes.json()["items"]
            nodes_list = [normalise_node(n) for n in raw]
            out["links"] = links_of(raw)  # per-pair network figures (launcher/links.py)
            out["plugins"] = plugins_of(raw)
            engines = client.get("/v1/engines", params={"limit": 1000})
            if engines.status_code == 200:  # op engines are separate records: join them by node
                by_node: dict[str, list[str]] = {}
                for e in engines.json()["items"]:
                    gflops = e.get("gflops")
                    rate = f" ({gflops:.1f} GFLOP/s)" if isinstance(gflops, (int, float)) else ""
                    by_node.setdefault(str(e.get("node")), []).append(f"{e.get('engine')}{rate}")
                for n in nodes_list:
                    n["engines"] = n["engines"] or by_node.get(n["id"], [])
            out["nodes"] = nodes_list
            listed = client.get("/v1/jobs", params={"limit": max(1, min(jobs, 1000))})
            listed.raise_for_status()
            out["jobs"] = list(listed.json()["items"])[:jobs]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        out["error"] = f"the scheduler at {info['url']} did not answer properly: {type(e).__name__}: {e}"
    return out


def plugins_of(nodes: list[Any]) -> list[dict[str, str]]:
    """The plugins each node isolated (``plugins`` of ``GET /v1/nodes``, which the scheduler
    reads from the executors' ``stats/<node>`` records), one row each: ``{"process": node,
    "kind", "name", "message", "problem"}`` (``problem`` as the executor's log words it)."""
    rows = []
    for n in nodes:
        for p in (n.get("plugins") or []) if isinstance(n, dict) else []:
            if isinstance(p, dict):
                problem = f"{p.get('kind')} plugin {p.get('name')!r}: {p.get('message')}"
                rows.append({"process": str(n.get("node") or n.get("id")), "kind": str(p.get("kind")),
                             "name": str(p.get("name")), "message": str(p.get("message")),
                             "problem": problem})
    return sorted(rows, key=lambda r: (r["process"], r["kind"], r["name"]))


def _processes(info: dict[str, Any]) -> list[dict[str, Any]]:
    procs = []
    for p in [info.get("scheduler"), *(info.get("executors") or [])]:
        if isinstance(p, dict):
            procs.append({"name": p.get("name"), "pid": p.get("pid"), "alive": is_ours(int(p.get("pid", 0))),
                          "log": p.get("log")})
    if isinstance(info.get("etcd"), dict):
        e = info["etcd"]
        procs.append({"name": "etcd", "pid": e.get("pid"), "alive": is_ours(int(e.get("pid", 0)), "etcd"),
                      "log": e.get("log")})
    return procs

