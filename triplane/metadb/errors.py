"""The exceptions the metadata DB raises, in one tree.

    TriplaneError (triplane.proto.errors)
    └── MetaDBError                   base of every metadb error
        ├── InvalidInputError         a value is malformed (bad id, unknown state, wrong type);
        │   │                         nothing was written
        │   └── PayloadTooLargeError  a blob or payload exceeds its bound; nothing was written
        ├── NotFoundError             a row the call needs does not exist; nothing was written
        │   ├── UnknownJobError       ... the job id
        │   └── UnknownTaskError      ... the (job id, task id)
        ├── ConflictError             the write contradicts what is stored (same graph hash with
        │                             different bytes, a task already inserted, a
        │                             compare-and-set transition whose expected state differs)
        ├── SchemaError               the database schema is newer than this triplane, or a
        │                             migration failed (the migration's transaction rolled back)
        └── BatchWriteError           a BatchWriter flush failed; the batch is kept and retried

Every error leaves the database as it was before the call: each repository call runs inside
the caller's transaction, which the ``MetaDB.transaction()`` context manager rolls back on any
exception.
"""

from __future__ import annotations

from triplane.proto.errors import TriplaneError


class MetaDBError(TriplaneError):
    """Base class of every metadata DB error."""


class InvalidInputError(MetaDBError, ValueError):
    """A value handed to the metadata DB is malformed."""


class PayloadTooLargeError(InvalidInputError):
    """A blob or payload exceeds its documented bound."""


class NotFoundError(MetaDBError, LookupError):
    """A row the call needs does not exist."""


class UnknownJobError(NotFoundError):
    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        super().__init__(f"unknown job id {job_id!r}")


class UnknownTaskError(NotFoundError):
    def __init__(self, job_id: str, task_id: str) -> None:
        self.job_id = job_id
        self.task_id = task_id
        super().__init__(f"unknown task {task_id!r} of job {job_id!r}")


class ConflictError(MetaDBError):
    """The write contradicts what is already stored."""


class SchemaError(MetaDBError):
    """The schema cannot be brought to this version of triplane."""


class BatchWriteError(MetaDBError):
    """A BatchWriter could not commit a batch (the database refused or was unreachable)."""
