-- Queries over the server secrets of migration 0007.

-- name: secret_get
SELECT conveyor.secret_get(%(name)s::text, %(candidate)s::bytea)
