"""The experience database: one door (`ExperienceStore`), its tables, queries and migrations.

  experience_store  ExperienceStore: records in and out, one transaction per write
  engine            URLs, engines, SQLite pragmas, schema upgrade (Alembic)
  tables            SQLAlchemy models; only this package and the migrations use them
  buffer            per-run question state: buckets, pool slots, retirement
  replay            replay sampling and replayed-trajectory reads
  rollback          undo to a step (exact resume)
  codec             int32 / float32 blobs for token ids and log-probs
  migrations/       Alembic scripts
"""
