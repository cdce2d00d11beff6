"""An index on jobs (owner, created_at): a submit token lists its own jobs, newest first.

Revision ID: 0002_jobs_owner_index
Revises: 0001_initial
Create Date: 2026-11-25

The ``owner`` column itself is in 0001 (nullable: jobs of an earlier version, and of a
scheduler without tokens, have none). Since issue 11 every job records the name of the
token that submitted it, and ``GET /v1/jobs`` with a submit token filters on it.
"""

from __future__ import annotations

from alembic import op

revision = "0002_jobs_owner_index"
down_revision = "0001_initial"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_owner_created_at", "jobs", ["owner", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_jobs_owner_created_at", table_name="jobs")
