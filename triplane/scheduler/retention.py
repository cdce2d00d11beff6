"""The metadb's retention, run by the acting scheduler (docs/metadb.md, "Retention").

Every ``period_s`` a worker thread deletes the rows of finished, released jobs beyond the
newest ``keep`` (``metadb.retention``), off the event loop and outside the journal's
batches. A job is only deleted once its row has not changed for two periods, so
no write of its end is still queued in the journal's BatchWriter; the writer then forgets
the deleted ids (a stray later write is refused as an unknown job, not retried forever).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from triplane import metadb as mdb
from triplane.metadb.retention import prune

log = logging.getLogger(__name__)

KEEP_JOBS = 100  # released finished jobs whose rows are kept (the newest): docs/metadb.md
PERIOD_S = 1.0


async def retain(db: mdb.MetaDB, keep: int, leading: Callable[[], bool],
                 writer: Callable[[], mdb.BatchWriter | None], *, period_s: float = PERIOD_S) -> None:
    """Prune every ``period_s`` while ``leading()``; runs until cancelled."""
    grace_s = max(2 * period_s, 1.0)  # the journal writes a job's end within a second
    while True:
        await asyncio.sleep(period_s)
        if not leading():
            continue
        try:
            gone = await asyncio.to_thread(prune, db, keep=keep, settled_before=time.time() - grace_s)
        except mdb.MetaDBError as e:
            log.warning("metadb retention failed (next try in %gs): %s", period_s, e)
            continue
        except Exception:
            log.exception("metadb retention failed (next try in %gs)", period_s)
            continue
        if gone:
            w = writer()
            if w is not None:
                w.forget(gone)
            log.debug("metadb retention deleted %d finished jobs", len(gone))
