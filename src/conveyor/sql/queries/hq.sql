-- Queries over the hq dialect's functions (sql/dialects/hq).

-- name: message_hq_locate
SELECT queue_name, id, receive_count, in_flight FROM hq.message_locate(%(message_uuid)s::uuid)
