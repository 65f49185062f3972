-- Queries over the queue functions of migrations 0001 and 0016. Parameters are psycopg named
-- placeholders; every one is cast so that NULLs and arrays get the right type.

-- name: queue_create
SELECT * FROM conveyor.queue_create(%(name)s::text, %(attributes)s::jsonb)

-- name: queue_alter
SELECT * FROM conveyor.queue_alter(%(name)s::text, %(attributes)s::jsonb)

-- name: queue_drop
SELECT conveyor.queue_drop(%(name)s::text)

-- name: queue_get
SELECT * FROM conveyor.queue_get(%(name)s::text)

-- name: queue_list
SELECT * FROM conveyor.queue_list(%(prefix)s::text)

-- name: queue_purge
SELECT conveyor.queue_purge(%(name)s::text)

-- name: queue_tag
SELECT conveyor.queue_tag(%(name)s::text, %(tags)s::jsonb)

-- name: queue_untag
SELECT conveyor.queue_untag(%(name)s::text, %(keys)s::text[])

-- name: queue_listen
SELECT conveyor.queue_listen(%(name)s::text, %(seconds)s::integer)

-- name: queue_storage
SELECT * FROM conveyor.queue_storage(%(name)s::text)

-- name: queue_metrics
SELECT * FROM conveyor.queue_metrics(%(name)s::text)

-- name: queue_metrics_all
SELECT * FROM conveyor.queue_metrics_all()

-- name: queue_maintenance
SELECT task, removed FROM conveyor.maintenance(%(max_rows)s::integer)
