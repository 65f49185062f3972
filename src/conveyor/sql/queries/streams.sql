-- Queries over the stream functions of migration 0003.

-- name: stream_create
SELECT * FROM conveyor.stream_create(%(name)s::text, %(options)s::jsonb)

-- name: stream_drop
SELECT conveyor.stream_drop(%(name)s::text)

-- name: stream_get
SELECT * FROM conveyor.stream_get(%(name)s::text)

-- name: stream_list
SELECT * FROM conveyor.stream_list()

-- name: stream_set_config
SELECT * FROM conveyor.stream_set_config(%(name)s::text, %(options)s::jsonb)

-- name: stream_send_json
SELECT conveyor.stream_send_json(%(name)s::text, %(events)s::jsonb)

-- name: stream_send_at
SELECT conveyor.stream_send_at(%(name)s::text, %(payload)s::text, %(deliver_at)s::timestamptz, %(type)s::text,
                               %(extra1)s::text, %(extra2)s::text, %(extra3)s::text, %(extra4)s::text,
                               %(traceparent)s::text)

-- name: stream_subscribe
SELECT conveyor.stream_subscribe(%(name)s::text, %(consumer)s::text)

-- name: stream_unsubscribe
SELECT conveyor.stream_unsubscribe(%(name)s::text, %(consumer)s::text)

-- name: stream_receive
SELECT * FROM conveyor.stream_receive(%(name)s::text, %(consumer)s::text, %(max)s::integer,
                                      %(after)s::bigint)

-- name: stream_batch_read_all
SELECT conveyor.stream_batch_read_all(%(batch_id)s::bigint)

-- name: stream_next_batch
SELECT conveyor.stream_next_batch_custom(%(name)s::text, %(consumer)s::text, %(min_lag)s::interval,
                                         %(min_count)s::integer, %(min_interval)s::interval)

-- name: stream_get_batch_events
SELECT * FROM conveyor.stream_get_batch_events(%(batch_id)s::bigint)

-- name: stream_ack
SELECT conveyor.stream_ack(%(batch_id)s::bigint)

-- name: stream_nack
SELECT conveyor.stream_nack(%(batch_id)s::bigint, %(event_id)s::bigint, %(retry_after)s::interval, %(reason)s::text)

-- name: stream_dead_letter
SELECT conveyor.stream_dead_letter(%(batch_id)s::bigint, %(event_id)s::bigint, %(reason)s::text)

-- name: stream_event_retry
SELECT conveyor.stream_event_retry(%(batch_id)s::bigint, %(event_id)s::bigint, %(retry_seconds)s::integer)

-- name: stream_batch_retry
SELECT conveyor.stream_batch_retry(%(batch_id)s::bigint, %(retry_seconds)s::integer)

-- name: stream_dead_letters
SELECT * FROM conveyor.stream_dead_letters(%(name)s::text, %(max)s::integer)

-- name: stream_dead_letter_replay
SELECT conveyor.stream_dead_letter_replay(%(id)s::bigint, %(name)s::text)

-- name: stream_of_batch
SELECT conveyor.stream_of_batch(%(batch_id)s::bigint)

-- name: stream_dead_letter_replay_all
SELECT conveyor.stream_dead_letter_replay_all(%(name)s::text)

-- name: stream_dead_letter_purge
SELECT conveyor.stream_dead_letter_purge(%(name)s::text, %(older_than)s::interval)

-- name: stream_ticker
SELECT conveyor.ticker()

-- name: stream_force_tick
SELECT conveyor.stream_force_tick(%(name)s::text)

-- name: stream_maint
SELECT stream, operation, count FROM conveyor.maint()

-- name: stream_stats
SELECT * FROM conveyor.stream_stats()

-- name: stream_consumer_stats
SELECT * FROM conveyor.consumer_stats()

-- name: stream_health
SELECT * FROM conveyor.stream_health()

