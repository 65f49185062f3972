-- Queries over the message functions of migration 0001.

-- name: message_send
SELECT conveyor.message_send(%(queue)s::text, %(body)s::text, %(headers)s::jsonb, %(delay)s::integer,
                             %(content_type)s::text, %(group_id)s::text, %(dedup_id)s::text)

-- name: message_send_json
SELECT id, message_uuid FROM conveyor.message_send_json(%(queue)s::text, %(messages)s::jsonb)

-- name: message_receive
SELECT * FROM conveyor.message_receive(%(queue)s::text, %(vt)s::integer, %(qty)s::integer,
                                       %(wait)s::integer)

-- name: message_receive_lazy
SELECT * FROM conveyor.message_receive_lazy(%(queue)s::text, %(vt)s::integer, %(qty)s::integer)

-- name: message_receive_fifo
SELECT * FROM conveyor.message_receive_fifo(%(queue)s::text, %(vt)s::integer, %(qty)s::integer)

-- name: message_pop
SELECT * FROM conveyor.message_pop(%(queue)s::text, %(qty)s::integer)

-- name: message_peek
SELECT * FROM conveyor.message_peek(%(queue)s::text, %(qty)s::integer, %(after_id)s::bigint)

-- Acknowledgements take the receive count of each delivery (NULL: whichever is current),
-- see migration 0007.

-- name: message_delete
SELECT conveyor.message_delete(%(queue)s::text, %(ids)s::bigint[], %(receive_counts)s::integer[])

-- name: message_delete_in_flight
SELECT id, deleted FROM conveyor.message_delete_in_flight(%(queue)s::text, %(ids)s::bigint[],
                                                          %(receive_counts)s::integer[])

-- name: message_archive
SELECT conveyor.message_archive(%(queue)s::text, %(ids)s::bigint[], %(receive_counts)s::integer[])

-- name: message_fail
SELECT conveyor.message_fail(%(queue)s::text, %(id)s::bigint, %(reason)s::text, %(receive_count)s::integer)

-- name: message_set_vt
SELECT * FROM conveyor.message_set_vt(%(queue)s::text, %(ids)s::bigint[], %(receive_counts)s::integer[],
                                      %(vt)s::integer, %(in_flight_only)s::boolean)

-- name: message_receive_attempt
SELECT * FROM conveyor.message_receive_attempt(%(queue)s::text, %(attempt_id)s::text, %(vt)s::integer,
                                               %(qty)s::integer)
