-- Conveyor's hq dialect 0001: what hq's HTTP API (seed 003) needs beyond the engine.
--
-- hq names a message by its UUID alone (PUT /messages/{id}/complete): no queue, no
-- receipt. conveyor.messages is keyed by (queue_id, id), so finding a message by
-- message_uuid needs an index of its own. It costs every send a little, which is why it
-- comes with this optional dialect rather than with the engine.

CREATE SCHEMA hq;

CREATE INDEX hq_messages_uuid_idx ON conveyor.messages (message_uuid);

-- The live message with this UUID: its queue, id, current delivery (receive_count) and
-- whether that delivery is in flight (received and still invisible: hq's "locked").
-- No row: there is none (never sent, or already completed, failed or deleted). A UUID
-- reused by a sender that chose it (SQS MessageId is free text at send) may name
-- several messages; the one in flight, else the oldest, is returned.
CREATE FUNCTION hq.message_locate(message_uuid uuid)
RETURNS TABLE (queue_name text, id bigint, receive_count integer, in_flight boolean)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT q.name, m.id, m.receive_count, m.receive_count > 0 AND m.vt > clock_timestamp()
      FROM conveyor.messages m JOIN conveyor.queues q ON q.id = m.queue_id
     WHERE m.message_uuid = message_locate.message_uuid
     ORDER BY (m.receive_count > 0 AND m.vt > clock_timestamp()) DESC, m.queue_id, m.id
     LIMIT 1
$$;

REVOKE ALL ON FUNCTION hq.message_locate(uuid) FROM PUBLIC;

DO $$
BEGIN
    GRANT USAGE ON SCHEMA hq TO conveyor_reader;
    GRANT EXECUTE ON FUNCTION hq.message_locate(uuid) TO conveyor_writer;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: roles missing, grants skipped (%)', SQLERRM;
END $$;
