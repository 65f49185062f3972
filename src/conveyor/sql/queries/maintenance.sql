-- The server's upkeep of the database (conveyor.core.vacuum, conveyor.server.workers).

-- name: lock_try_advisory
SELECT pg_try_advisory_lock(%(key)s::bigint)

-- name: table_vacuum_due
SELECT * FROM conveyor.tables_to_vacuum(%(kept)s::jsonb)

-- name: table_dead_rows
SELECT table_name, dead FROM conveyor.dead_rows(%(tables)s::text[])
