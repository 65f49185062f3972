-- Queries over the schedule functions of migration 0004. Every parameter is cast so that
-- NULLs and arrays get the right type.

-- name: schedule_create
SELECT * FROM conveyor.schedule_create(%(name)s::text, %(spec)s::jsonb)

-- name: schedule_upsert
SELECT conveyor.schedule_upsert(%(name)s::text, %(spec)s::jsonb)

-- name: schedule_alter
SELECT * FROM conveyor.schedule_alter(%(name)s::text, %(spec)s::jsonb)

-- name: schedule_drop
SELECT conveyor.schedule_drop(%(name)s::text)

-- name: schedule_get
SELECT * FROM conveyor.schedule_get(%(name)s::text)

-- name: schedule_list
SELECT * FROM conveyor.schedule_list(%(status)s::text, %(target_kind)s::text, %(name_prefix)s::text,
                                     %(max_rows)s::integer)

-- name: schedule_claim
SELECT * FROM conveyor.schedule_claim(%(at)s::timestamptz, %(max_rows)s::integer)

-- name: schedule_advance
SELECT conveyor.schedule_advance(%(name)s::text, %(fired)s::timestamptz[], %(next_fire_at)s::timestamptz)

-- name: schedule_failed
SELECT conveyor.schedule_failed(%(name)s::text, %(error)s::text, %(next_fire_at)s::timestamptz,
                                %(at)s::timestamptz)
