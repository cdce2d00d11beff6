"""The events table holds the scheduler's event stream (scheduler/events.py).

Revision ID: 0003_events_stream
Revises: 0002_jobs_owner_index
Create Date: 2026-11-25

``seq``: the event's id in the stream (the EventBus numbers events itself, so that a
subscriber sees them in one order before they are written; rows the scheduler keeps for
itself have none), indexed for replay by id. ``node``: the executor an event is about.
``job_id`` becomes nullable: an executor's event (node.up, node.down) has no job.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_events_stream"
down_revision = "0002_jobs_owner_index"
branch_labels = None
depends_on = None

ID = 128


def upgrade() -> None:
    with op.batch_alter_table("events") as b:  # batch mode: SQLite cannot ALTER a column
        b.add_column(sa.Column("seq", sa.BigInteger(), nullable=True))
        b.add_column(sa.Column("node", sa.String(ID), nullable=True))
        b.alter_column("job_id", existing_type=sa.String(ID), nullable=True)
    op.create_index("ix_events_seq", "events", ["seq"])


def downgrade() -> None:
    op.drop_index("ix_events_seq", table_name="events")
    op.execute("DELETE FROM events WHERE job_id IS NULL")
    with op.batch_alter_table("events") as b:
        b.alter_column("job_id", existing_type=sa.String(ID), nullable=False)
        b.drop_column("node")
        b.drop_column("seq")
