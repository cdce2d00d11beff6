"""The initial schema: graphs, plans, jobs, tasks, tiles, events.

Revision ID: 0001_initial
Revises:
Create Date: 2025-01-01

Written out in full (not generated from the models at run time) so that it stays what it was
when later revisions change the models; a test checks that head matches the models.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None

ID = 128
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "graphs",
        sa.Column("hash", sa.String(ID), nullable=False),
        sa.Column("canonical", sa.LargeBinary(), nullable=False),
        sa.Column("node_count", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("hash", name="pk_graphs"),
    )
    op.create_table(
        "plans",
        sa.Column("id", sa.String(ID), nullable=False),
        sa.Column("graph_hash", sa.String(ID), nullable=False),
        sa.Column("structure_hash", sa.String(ID), nullable=False),
        sa.Column("plan", sa.JSON(), nullable=False),
        sa.Column("predicted_makespan", sa.Float(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_plans"),
        sa.ForeignKeyConstraint(["graph_hash"], ["graphs.hash"], name="fk_plans_graph_hash_graphs"),
        sa.UniqueConstraint("graph_hash", "structure_hash", name="uq_plans_graph_hash_structure_hash"),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(ID), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("graph_hash", sa.String(ID), nullable=False),
        sa.Column("plan_id", sa.String(ID), nullable=True),
        sa.Column("fetch", sa.JSON(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("owner", sa.String(ID), nullable=True),
        sa.Column("tasks_total", sa.Integer(), nullable=False),
        sa.Column("tasks_done", sa.Integer(), nullable=False),
        sa.Column("tasks_failed", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
        sa.ForeignKeyConstraint(["graph_hash"], ["graphs.hash"], name="fk_jobs_graph_hash_graphs"),
        sa.ForeignKeyConstraint(["plan_id"], ["plans.id"], name="fk_jobs_plan_id_plans"),
    )
    op.create_index("ix_jobs_state_created_at", "jobs", ["state", "created_at"])
    op.create_index("ix_jobs_created_at", "jobs", ["created_at"])
    op.create_table(
        "tasks",
        sa.Column("job_id", sa.String(ID), nullable=False),
        sa.Column("task_id", sa.String(ID), nullable=False),
        sa.Column("op", sa.String(ID), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(ID), nullable=True),
        sa.Column("queued_at", sa.Float(), nullable=True),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("predicted_s", sa.Float(), nullable=True),
        sa.Column("actual_s", sa.Float(), nullable=True),
        sa.Column("error_kind", sa.String(16), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("job_id", "task_id", name="pk_tasks"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_tasks_job_id_jobs", ondelete="CASCADE"),
    )
    op.create_index("ix_tasks_job_id_state", "tasks", ["job_id", "state"])
    op.create_table(
        "tiles",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(ID), nullable=False),
        sa.Column("tensor", sa.String(ID), nullable=False),
        sa.Column("index", sa.JSON(), nullable=False),
        sa.Column("index_key", sa.String(255), nullable=False),
        sa.Column("shape", sa.JSON(), nullable=False),
        sa.Column("dtype", sa.String(32), nullable=False),
        sa.Column("node", sa.String(ID), nullable=True),
        sa.Column("memory_engine", sa.String(ID), nullable=True),
        sa.Column("nbytes", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_tiles"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_tiles_job_id_jobs", ondelete="CASCADE"),
        sa.UniqueConstraint("job_id", "tensor", "index_key", name="uq_tiles_job_id_tensor_index_key"),
    )
    op.create_index("ix_tiles_node", "tiles", ["node"])
    op.create_table(
        "events",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(ID), nullable=False),
        sa.Column("task_id", sa.String(ID), nullable=True),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("stimulus_id", sa.String(ID), nullable=True),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_events"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_events_job_id_jobs", ondelete="CASCADE"),
    )
    op.create_index("ix_events_job_id_at", "events", ["job_id", "at"])


def downgrade() -> None:
    for table in ("events", "tiles", "tasks", "jobs", "plans", "graphs"):
        op.drop_table(table)
