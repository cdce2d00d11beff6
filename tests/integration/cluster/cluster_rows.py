"""A job's task rows as the cluster tests read them from the metadb (the journal writes them
in batches, so a reader waits until the job's rows exist and every one is done)."""

from __future__ import annotations

import time
from typing import Any


def task_rows(db_url: str, job: str, timeout_s: float = 10.0) -> list[Any]:
    """The job's task rows once all are done, or as they are at ``timeout_s``."""
    from triplane import metadb as mdb
    from triplane.metadb.tasks import list_tasks

    db = mdb.open_db(db_url)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with db.read() as s:
                    rows = list(list_tasks(s, job))
            except mdb.UnknownJobError:  # a compiled step's rows trail its answer by a batch
                if time.monotonic() > deadline:
                    raise
                rows = []
            if (rows and all(r.state == "done" for r in rows)) or time.monotonic() > deadline:
                return rows
            time.sleep(0.1)
    finally:
        db.close()
