-- The hq dialect's functions and views (docs/dialects.md).
--
-- Current definitions, re-applied whenever a file of this folder changes (docs/architecture.md,
-- "Where each SQL function's current definition lives"). Edit a function here; tables, types,
-- indexes, data and DROPs go in a new numbered migration.

-- The live message with this UUID: its queue, id, current delivery (receive_count) and
-- whether that delivery is in flight (received and still invisible: hq's "locked").
-- No row: there is none (never sent, or already completed, failed or deleted). A UUID
-- reused by a sender that chose it (SQS MessageId is free text at send) may name
-- several messages; the one in flight, else the oldest, is returned.
CREATE OR REPLACE FUNCTION hq.message_locate(message_uuid uuid)
RETURNS TABLE (queue_name text, id bigint, receive_count integer, in_flight boolean)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT q.name, m.id, m.receive_count, m.receive_count > 0 AND m.vt > clock_timestamp()
      FROM conveyor.messages m JOIN conveyor.queues q ON q.id = m.queue_id
     WHERE m.message_uuid = message_locate.message_uuid
     ORDER BY (m.receive_count > 0 AND m.vt > clock_timestamp()) DESC, m.queue_id, m.id
     LIMIT 1
$$;

REVOKE ALL ON ALL ROUTINES IN SCHEMA hq FROM PUBLIC;
