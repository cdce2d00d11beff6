"""The metadb's retention on a real local cluster (docs/metadb.md, "Retention"): a loop of
jobs, each released once read, leaves a metadb whose size stays flat; a done job that was
not released keeps its rows (and its values) whatever its age."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

import triplane as tp
from triplane.sdk.remote import RemoteSession
from triplane.sdk.session import use_session

KEEP = 50


def db_bytes(run_dir: Path) -> int:
    """The SQLite metadb file's live size (less its free pages) once its write-ahead log is
    copied in (a passive checkpoint, as SQLite makes on its own every 1,000 pages; the log's
    own file keeps its largest size and is left out)."""
    con = sqlite3.connect(run_dir / "metadb.sqlite3")
    try:
        con.execute("PRAGMA wal_checkpoint(PASSIVE)")
        pages = con.execute("PRAGMA freelist_count").fetchone()[0]
        free = pages * con.execute("PRAGMA page_size").fetchone()[0]
    finally:
        con.close()
    # pages on the free list are reused by the next writes: the file's live bytes
    return os.path.getsize(run_dir / "metadb.sqlite3") - free


def job_rows(run_dir: Path) -> int:
    from triplane import metadb as mdb

    db = mdb.open_db(f"sqlite:///{run_dir / 'metadb.sqlite3'}")
    try:
        with db.read() as s:
            return len(mdb.list_jobs(s, limit=10_000))
    finally:
        db.close()


def step(x: Any, i: int) -> Any:
    """A job of a few dozen nodes (a training step's rows are many more): tp or numpy."""
    y = x
    for k in range(12):
        y = y * 0.5 + (x @ y) * (0.01 * (k + 1)) + float(i % 7)
        y = y / (1.0 + abs(y))
    return y.sum(axis=0)


@pytest.mark.slow
def test_released_jobs_leave_a_flat_metadb(start_cluster: Callable[..., Any]) -> None:
    rng = np.random.default_rng(5)
    xa = rng.standard_normal((8, 8)).astype(np.float32)
    with start_cluster(bound_s=240, executors=2,
                       scheduler_args=["--keep-jobs", str(KEEP), "--retention-period", "0.2"]) as cluster:
        run_dir = cluster.run.path
        h = httpx.Client(base_url=cluster.url, headers={"Authorization": f"Bearer {cluster.token}"},
                         timeout=10)
        sizes: dict[int, int] = {}
        with RemoteSession(cluster.url, cluster.token, job_timeout_s=30.0) as s, use_session(s):
            s.release_values = False  # the test releases each job itself
            x = tp.Tensor.from_array(xa)
            kept_job = gone_job = ""
            for i in range(1, 301):
                got = s.evaluate([step(x, i)])
                np.testing.assert_allclose(got[0], step(xa, i), rtol=1e-4, atol=1e-5)
                if i == 1:
                    kept_job = s.last_job  # done, never released: its rows must stay
                else:
                    gone_job = gone_job or s.last_job
                    assert h.delete(f"/v1/jobs/{s.last_job}").status_code == 200
                if i in (100, 300):
                    time.sleep(1.5)  # a retention pass after the grace period
                    sizes[i] = db_bytes(run_dir)
            assert kept_job and gone_job
            rows = job_rows(run_dir)
            # the newest KEEP released jobs (settled or not) and the unreleased one
            assert KEEP + 1 <= rows <= KEEP + 5, rows
            body = h.get(f"/v1/jobs/{kept_job}").json()
            assert body["state"] == "done", body
            assert h.get(f"/v1/jobs/{gone_job}").status_code == 404  # its rows were deleted
        growth = abs(sizes[300] - sizes[100]) / sizes[100]
        print(f"metadb bytes after job 100: {sizes[100]}, after job 300: {sizes[300]} ({growth:.1%})")
        assert growth < 0.10, sizes
