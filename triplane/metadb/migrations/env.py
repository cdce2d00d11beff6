"""Alembic's entry point, run by ``triplane.metadb.db.migrate_engine``.

It only ever runs "online" on the connection (and transaction) that ``migrate_engine``
opened, so the advisory lock and the upgrade share one transaction.
"""

from __future__ import annotations

from alembic import context

from triplane.metadb.models import Base

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations with triplane.metadb.migrate(url), not the alembic CLI")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    version_table=config.attributes["version_table"],
    render_as_batch=True,  # SQLite cannot ALTER most things; batch mode copies the table
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
