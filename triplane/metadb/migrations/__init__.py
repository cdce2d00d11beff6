"""Alembic migrations of the metadata DB, shipped inside the package and run by
``triplane.metadb.migrate`` (no alembic.ini needed). New revision files go in ``versions/``;
each must be transactional on both SQLite (use ``op.batch_alter_table``) and PostgreSQL."""
