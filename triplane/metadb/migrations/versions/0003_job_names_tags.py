"""A job's optional name and tags; an index for a task's events.

Revision ID: 0003_job_names_tags
Revises: 0002_jobs_owner_index
Create Date: 2026-11-25

``jobs.name`` (at most 128 characters) and ``jobs.tags`` (a JSON list, as submitted) are
nullable: jobs stored before have neither. ``job_tags`` holds one row per (job, tag), the
index ``GET /v1/jobs?tag=`` filters with; ``ix_jobs_name_created_at`` serves ``?name=``.
``ix_events_job_id_task_id`` serves a task's drift history (``GET /v1/jobs/{id}/tasks``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_job_names_tags"
down_revision = "0002_jobs_owner_index"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as b:
        b.add_column(sa.Column("name", sa.String(128), nullable=True))
        b.add_column(sa.Column("tags", sa.JSON(), nullable=True))
    op.create_index("ix_jobs_name_created_at", "jobs", ["name", "created_at"])
    op.create_table(
        "job_tags",
        sa.Column("job_id", sa.String(128), nullable=False),
        sa.Column("tag", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "tag", name="pk_job_tags"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_job_tags_job_id_jobs", ondelete="CASCADE"),
    )
    op.create_index("ix_job_tags_tag_job_id", "job_tags", ["tag", "job_id"])
    op.create_index("ix_events_job_id_task_id", "events", ["job_id", "task_id"])


def downgrade() -> None:
    op.drop_index("ix_events_job_id_task_id", table_name="events")
    op.drop_index("ix_job_tags_tag_job_id", table_name="job_tags")
    op.drop_table("job_tags")
    op.drop_index("ix_jobs_name_created_at", table_name="jobs")
    with op.batch_alter_table("jobs") as b:
        b.drop_column("tags")
        b.drop_column("name")
