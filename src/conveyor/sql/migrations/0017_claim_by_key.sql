-- Conveyor 0017: a claim's update finds its rows by primary key under any plan.
--
-- Migration 0014 made the message functions keep generic plans. A generic plan does not
-- know the receive's qty, nor which queue: it estimates `LIMIT qty` at a tenth of an
-- average queue's visible messages, and where one queue is most of conveyor.messages (a
-- database with one busy queue: the common case, and every benchmark's) that is
-- thousands of rows. The claim's UPDATE joined its locked ids (a CTE) to
-- conveyor.messages, and for thousands of ids the planner hashed the queue's whole table:
-- a receive of one message read every message of the queue (60,000 in the measurement,
-- 26 ms; receive+delete at 16 clients fell from about 3,500 to 150 a second;
-- docs/benchmarks.md). Here the UPDATE takes the ids as an array, `id = ANY (ARRAY(...))`,
-- which every plan, generic or custom, looks up in the primary key: the same rows,
-- locked the same way (FOR UPDATE SKIP LOCKED, oldest visible first), read by index.
-- message_pop (0014) already reads this way. Only the last statement of each claim
-- changes; tests/sql/test_plans.py counts the rows a receive reads.

CREATE OR REPLACE FUNCTION conveyor._claim(q conveyor.queues, vt_seconds integer, qty integer)
RETURNS SETOF conveyor.messages
LANGUAGE plpgsql AS $$
DECLARE
    ts timestamptz := clock_timestamp();
    expired bigint[];
BEGIN
    IF q.max_receive_count IS NOT NULL THEN
        -- claim first, then split: the over-limit ones leave, the rest are delivered
        SELECT array_agg(id) FILTER (WHERE receive_count >= q.max_receive_count)
          INTO expired
          FROM (SELECT m.id, m.receive_count FROM conveyor.messages m
                 WHERE m.queue_id = q.id AND m.vt <= ts
                 ORDER BY m.vt, m.id LIMIT qty
                 FOR UPDATE SKIP LOCKED) c;
        IF expired IS NOT NULL THEN
            PERFORM conveyor._dead_letter(q, expired, format('received more than %s times', q.max_receive_count));
        END IF;
    END IF;
    RETURN QUERY
    UPDATE conveyor.messages m
       SET vt = ts + make_interval(secs => vt_seconds),
           receive_count = m.receive_count + 1,
           first_received_at = coalesce(m.first_received_at, ts)
     WHERE m.queue_id = q.id
       AND m.id = ANY (ARRAY(SELECT c.id FROM conveyor.messages c
                              WHERE c.queue_id = q.id AND c.vt <= ts
                              ORDER BY c.vt, c.id LIMIT qty
                              FOR UPDATE SKIP LOCKED))
    RETURNING m.*;
END $$;

CREATE OR REPLACE FUNCTION conveyor._claim_fifo(q conveyor.queues, vt_seconds integer, qty integer)
RETURNS SETOF conveyor.messages
LANGUAGE plpgsql AS $$
DECLARE
    ts timestamptz := clock_timestamp();
    groups text[];
    expired bigint[];
BEGIN
    SELECT array_agg(g.group_id) INTO groups FROM (
        SELECT g.group_id FROM conveyor.message_groups g
         WHERE g.queue_id = q.id
           AND EXISTS (SELECT 1 FROM conveyor.messages m
                        WHERE m.queue_id = q.id AND m.group_id = g.group_id AND m.vt <= ts)
           AND NOT EXISTS (SELECT 1 FROM conveyor.messages m
                            WHERE m.queue_id = q.id AND m.group_id = g.group_id
                              AND m.vt > ts AND m.receive_count > 0)
         ORDER BY (SELECT min(m.id) FROM conveyor.messages m
                    WHERE m.queue_id = q.id AND m.group_id = g.group_id)
         LIMIT qty
         FOR UPDATE SKIP LOCKED) g;
    IF groups IS NULL THEN
        RETURN;
    END IF;
    ts := clock_timestamp();
    SELECT array_agg(g) INTO groups FROM unnest(groups) g
     WHERE NOT EXISTS (SELECT 1 FROM conveyor.messages m
                        WHERE m.queue_id = q.id AND m.group_id = g
                          AND m.vt > ts AND m.receive_count > 0);
    IF groups IS NULL THEN
        RETURN;
    END IF;
    IF q.max_receive_count IS NOT NULL THEN
        SELECT array_agg(m.id) INTO expired FROM conveyor.messages m
         WHERE m.queue_id = q.id AND m.group_id = ANY (groups) AND m.vt <= ts
           AND m.receive_count >= q.max_receive_count;
        IF expired IS NOT NULL THEN
            PERFORM conveyor._dead_letter(q, expired, format('received more than %s times', q.max_receive_count));
        END IF;
    END IF;
    RETURN QUERY
    UPDATE conveyor.messages m
       SET vt = ts + make_interval(secs => vt_seconds),
           receive_count = m.receive_count + 1,
           first_received_at = coalesce(m.first_received_at, ts)
     WHERE m.queue_id = q.id
       AND m.id = ANY (ARRAY(SELECT c.id FROM conveyor.messages c
                              WHERE c.queue_id = q.id AND c.group_id = ANY (groups) AND c.vt <= ts
                              ORDER BY c.id LIMIT qty
                              FOR UPDATE SKIP LOCKED))
    RETURNING m.*;
END $$;

CREATE OR REPLACE FUNCTION conveyor._claim_grouped(q conveyor.queues, vt_seconds integer, qty integer)
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
    UPDATE conveyor.messages m
       SET vt = ts + make_interval(secs => vt_seconds),
           receive_count = m.receive_count + 1,
           first_received_at = coalesce(m.first_received_at, ts)
     WHERE m.queue_id = q.id
       AND m.id = ANY (ARRAY(SELECT c.id FROM conveyor.messages c
                              WHERE c.queue_id = q.id AND coalesce(c.group_id, '') = ANY (groups) AND c.vt <= ts
                              ORDER BY c.id LIMIT qty
                              FOR UPDATE SKIP LOCKED))
    RETURNING m.*;
END $$;
