-- Conveyor's pgmq dialect, 0004: less work per message and per call in pgmq._send
-- (measured by server CPU time in a scratch database; docs/benchmarks.md, "Dialects
-- against the real peers"):
--   - MessageIds as the engine's sends make them since engine migration 0018 (one random
--     seed per statement, each message's UUID from it and the message's id:
--     conveyor._message_uuid), not the column default's gen_random_uuid() per message;
--   - the body's text is made once per message: the check (conveyor._message_ok, an
--     inlined SQL function) named it twice and the insert once, and the planner repeats
--     an inlined argument where it is named, so every jsonb message was printed three
--     times; OFFSET 0 keeps the conversion in the subquery that makes it;
--   - the queue is looked up by a statement of the function's own (pgmq._q, a function
--     call, only when the exact name is not found), and conveyor._wake is called only
--     when someone listens (its own test, done before the call).
-- Rows, results and errors are 0002's.

CREATE OR REPLACE FUNCTION pgmq._send(queue_name text, msgs jsonb[], headers jsonb[], delay_seconds integer)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgmq AS $$
DECLARE
    q conveyor.queues;
    ts timestamptz := now();
    seed text := gen_random_uuid()::text;
    n bigint;
    sent bigint := 0;
    lo integer := 1;
BEGIN
    -- the exact name straight away; pgmq._q for its case folding and its error
    SELECT * INTO q FROM conveyor.queues x WHERE x.name = _send.queue_name;
    IF NOT FOUND THEN
        q := pgmq._q(queue_name);
    END IF;
    IF delay_seconds > 43200 THEN
        RAISE EXCEPTION USING ERRCODE = 'CVV01', MESSAGE = format(
            'delay must be at most 43200 seconds (12 hours) in Conveyor''s pgmq dialect, got %s', delay_seconds);
    END IF;
    IF NOT q.fifo THEN
        -- conveyor._send's standard insert: ids drawn in input order, every row checked
        RETURN QUERY
        INSERT INTO conveyor.messages AS t (queue_id, id, vt, sent_at, body, content_type, headers, group_id,
                                            message_uuid)
        SELECT q.id, s.id, ts + make_interval(secs => delay_seconds), ts, s.body, 'application/json',
               s.headers, s.headers ->> 'x-pgmq-group', conveyor._message_uuid(seed, s.id)
          FROM (SELECT nextval(q.seq) AS id, x.body, x.headers
                  FROM (SELECT coalesce(u.msg, 'null')::text AS body,
                               CASE WHEN jsonb_typeof(u.h) <> 'null' THEN u.h END AS headers, u.ord
                          FROM unnest(msgs, headers) WITH ORDINALITY AS u(msg, h, ord)
                        OFFSET 0) x
                 WHERE conveyor._message_ok(q, x.body, x.headers, least(delay_seconds, 900), NULL, NULL)
                 ORDER BY x.ord) s
        RETURNING t.id;
        GET DIAGNOSTICS sent = ROW_COUNT;
    ELSE
        -- FIFO: the engine's message-by-message path, 10000 at a time (its batch limit)
        WHILE lo <= cardinality(msgs) LOOP
            RETURN QUERY SELECT s.id FROM conveyor._send(q, pgmq._objects(msgs[lo:lo + 9999], headers[lo:lo + 9999],
                                                                         delay_seconds)) s;
            GET DIAGNOSTICS n = ROW_COUNT;
            sent := sent + n;
            lo := lo + 10000;
        END LOOP;
    END IF;
    IF q.listened_until > ts THEN
        PERFORM conveyor._wake(q, sent::integer);
    END IF;
END $$;
