"""The per-pair network figures of ``triplane status``: what each executor measured to
each peer (``links`` of ``GET /v1/nodes``, from the registry's ``links/<node>/<peer>``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["links_of", "links_table"]


def links_of(nodes: Iterable[Any]) -> list[dict[str, Any]]:
    """One row per measured pair, sorted: ``{"from", "to", "engine", "bandwidth_gbps",
    "latency_us", "measured_at"}``, from the raw nodes of ``GET /v1/nodes``."""
    rows = []
    for n in nodes:
        if not isinstance(n, dict):
            continue
        for link in n.get("links") or []:
            if isinstance(link, dict):
                rows.append({"from": str(n.get("node") or n.get("id")), "to": str(link.get("peer")),
                             "engine": link.get("engine"), "bandwidth_gbps": link.get("bandwidth_gbps"),
                             "latency_us": link.get("latency_us"), "measured_at": link.get("measured_at")})
    return sorted(rows, key=lambda r: (r["from"], r["to"]))


def links_table(rows: list[dict[str, Any]]) -> Any:
    """The rows as a rich Table titled "links"."""
    from rich.table import Table

    table = Table(title="links (measured per pair)")
    for col in ("from", "to", "engine", "bandwidth", "latency"):
        table.add_column(col)
    for r in rows:
        bw, lat = r.get("bandwidth_gbps"), r.get("latency_us")
        table.add_row(r["from"], r["to"], str(r.get("engine")),
                      f"{bw * 1e3:.1f} MB/s" if isinstance(bw, (int, float)) else "?",
                      f"{lat / 1e3:.2f} ms" if isinstance(lat, (int, float)) else "?")
    return table
