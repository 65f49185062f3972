-- Queries over the dashboard's history (migration 0012).

-- name: history_record
SELECT conveyor.history_record(make_interval(secs => %(keep_seconds)s::double precision),
                               make_interval(secs => %(min_gap_seconds)s::double precision))

-- name: history_prune
SELECT conveyor.history_prune(make_interval(secs => %(keep_seconds)s::double precision))

-- name: history_latest_queues
SELECT * FROM conveyor.history_latest_queues(make_interval(secs => %(max_age_seconds)s::double precision))

-- name: history_series
SELECT * FROM conveyor.history_series(%(kind)s::text, %(name)s::text, %(since)s::timestamptz)

-- name: history_rates
SELECT * FROM conveyor.history_rates(%(kind)s::text, make_interval(secs => %(span_seconds)s::double precision))

-- name: history_message
SELECT conveyor.history_message(%(queue)s::text, %(id)s::bigint)
