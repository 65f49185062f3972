-- Grouped receives of any queue (seed 000's receive_fifo, REST ?fifo=true): messages in
-- group order, one group to one consumer at a time, also on a standard queue whose
-- messages carry group ids (SQS fair queues, REST group_id). A FIFO queue is always read
-- this way; message_receive_fifo on it is message_receive.

-- Claims up to qty messages of a standard queue from groups with nothing in flight, in id
-- order within each group; messages without a group id form one group of their own (as
-- seed 000's GROUP BY does). Standard queues keep no group rows to lock, so a receiver
-- takes a transaction-level advisory lock per group (skipping groups another receiver
-- holds) and then, in a second statement with a snapshot taken after the locks, checks
-- again that nothing of the group is in flight: a receiver that committed meanwhile is seen.
CREATE FUNCTION conveyor._claim_grouped(q conveyor.queues, vt_seconds integer, qty integer)
RETURNS SETOF conveyor.messages
LANGUAGE plpgsql AS $$
DECLARE
    ts timestamptz := clock_timestamp();
    candidate text;
    groups text[] := '{}';
    expired bigint[];
BEGIN
    FOR candidate IN
        SELECT coalesce(m.group_id, '') FROM conveyor.messages m
         WHERE m.queue_id = q.id
         GROUP BY coalesce(m.group_id, '')
        HAVING bool_or(m.vt <= ts) AND NOT bool_or(m.vt > ts AND m.receive_count > 0)
         ORDER BY min(m.id)
         LIMIT qty * 4
    LOOP
        IF pg_try_advisory_xact_lock(hashtextextended(q.id::text || '/' || candidate, 7306554612)) THEN
            groups := groups || candidate;
            EXIT WHEN cardinality(groups) >= qty;
        END IF;
    END LOOP;
    IF cardinality(groups) = 0 THEN
        RETURN;
    END IF;
    ts := clock_timestamp();
    SELECT coalesce(array_agg(g), '{}') INTO groups FROM unnest(groups) g
     WHERE NOT EXISTS (SELECT 1 FROM conveyor.messages m
                        WHERE m.queue_id = q.id AND coalesce(m.group_id, '') = g
                          AND m.vt > ts AND m.receive_count > 0);
    IF cardinality(groups) = 0 THEN
        RETURN;
    END IF;
    IF q.max_receive_count IS NOT NULL THEN
        SELECT array_agg(m.id) INTO expired FROM conveyor.messages m
         WHERE m.queue_id = q.id AND coalesce(m.group_id, '') = ANY (groups) AND m.vt <= ts
           AND m.receive_count >= q.max_receive_count;
        IF expired IS NOT NULL THEN
            PERFORM conveyor._dead_letter(q, expired, format('received more than %s times', q.max_receive_count));
        END IF;
    END IF;
    RETURN QUERY
    WITH c AS (
        SELECT m.id FROM conveyor.messages m
         WHERE m.queue_id = q.id AND coalesce(m.group_id, '') = ANY (groups) AND m.vt <= ts
         ORDER BY m.id LIMIT qty
         FOR UPDATE SKIP LOCKED
    )
    UPDATE conveyor.messages m
       SET vt = ts + make_interval(secs => vt_seconds),
           receive_count = m.receive_count + 1,
           first_received_at = coalesce(m.first_received_at, ts)
      FROM c
     WHERE m.queue_id = q.id AND m.id = c.id
    RETURNING m.*;
END $$;

-- Receives up to qty messages in group order (see above) and hides them for vt seconds
-- (the queue's visibility timeout when NULL).
CREATE FUNCTION conveyor.message_receive_fifo(queue_name text, vt integer DEFAULT NULL, qty integer DEFAULT 1)
RETURNS SETOF conveyor.messages
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
    vt_seconds integer := coalesce(vt, q.visibility_timeout);
BEGIN
    IF q.fifo THEN
        RETURN QUERY SELECT * FROM conveyor.message_receive(queue_name, vt, qty);
        RETURN;
    END IF;
    IF vt_seconds < 0 OR vt_seconds > 43200 THEN
        PERFORM conveyor._raise('CVV01', format('vt must be from 0 to 43200 seconds, got %s', vt_seconds));
    END IF;
    IF qty IS NULL OR qty < 1 OR qty > 1000 THEN
        PERFORM conveyor._raise('CVV01', format('qty must be from 1 to 1000, got %s', qty));
    END IF;
    RETURN QUERY SELECT * FROM conveyor._claim_grouped(q, vt_seconds, qty);
END $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA conveyor FROM PUBLIC;

DO $$
BEGIN
    GRANT EXECUTE ON FUNCTION conveyor.message_receive_fifo(text, integer, integer) TO conveyor_writer;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: roles missing, grants skipped (%)', SQLERRM;
END $$;
