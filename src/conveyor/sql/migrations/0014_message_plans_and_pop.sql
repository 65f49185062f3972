-- Conveyor 0014: the message functions keep one plan per statement (generic plans), and
-- a pop of a standard queue is one DELETE.
--
-- PL/pgSQL keeps a statement's plan for the session, but by default PostgreSQL plans it
-- again with each call's values ("custom plans") for as long as those look cheaper than
-- the one generic plan. For conveyor.messages, one table for every queue, the values make
-- the estimates worse, not better: the statistics hold the queues that existed at the last
-- ANALYZE, so a queue created since (one a benchmark, a test or an application has just
-- made and filled) is estimated at one row. With one row expected, every plan looks as
-- cheap as any other, and the planner reads the queue's whole (queue_id, ...) index range
-- and filters on id: measured (auto_explain, docs/benchmarks.md), a receive, a delete by
-- receipt, an archive and even a delete of one message by (queue_id, id) visited every
-- message of the queue, so their cost grew with the queue's depth. A generic plan
-- estimates `queue_id = $1` as an average queue and looks rows up by primary key, and it
-- is planned once per session instead of at every call (a third of a delete's server
-- time, perf).
--
-- So the functions that touch conveyor.messages by queue run with
-- plan_cache_mode = force_generic_plan (a SET clause: it holds for the helpers they call,
-- conveyor._claim and the like, and nothing else). Where conveyor.messages is a
-- partitioned table (one partition per queue), a partition's statistics are its own, the
-- estimates are right, and a generic plan would lock every partition at each call; there
-- the clause is left off.

-- A pop (read and delete at once) of a standard queue without a redrive policy deletes
-- the rows _claim would claim in one statement, instead of claiming them (an UPDATE: a
-- new row version and new index entries for every message) and deleting them after. It
-- returns them as the claim would have left them. FIFO queues and queues with a redrive
-- policy claim first as before: the claim orders groups and dead-letters messages past
-- max_receive_count.
CREATE OR REPLACE FUNCTION conveyor.message_pop(queue_name text, qty integer DEFAULT 1)
RETURNS SETOF conveyor.messages
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
    claimed bigint[];
    ts timestamptz;
    m conveyor.messages;
BEGIN
    IF qty IS NULL OR qty < 1 OR qty > 1000 THEN
        PERFORM conveyor._raise('CVV01', format('qty must be from 1 to 1000, got %s', qty));
    END IF;
    IF q.fifo OR q.max_receive_count IS NOT NULL THEN
        IF q.fifo THEN
            SELECT array_agg(c.id) INTO claimed FROM conveyor._claim_fifo(q, 0, qty) c;
        ELSE
            SELECT array_agg(c.id) INTO claimed FROM conveyor._claim(q, 0, qty) c;
        END IF;
        RETURN QUERY
        DELETE FROM conveyor.messages x WHERE x.queue_id = q.id AND x.id = ANY (claimed) RETURNING x.*;
        RETURN;
    END IF;
    ts := clock_timestamp();
    FOR m IN
        DELETE FROM conveyor.messages x
         WHERE x.queue_id = q.id
           AND x.id = ANY (ARRAY(SELECT c.id FROM conveyor.messages c
                                  WHERE c.queue_id = q.id AND c.vt <= ts
                                  ORDER BY c.vt, c.id LIMIT qty
                                  FOR UPDATE SKIP LOCKED))
        RETURNING x.*
    LOOP
        m.vt := ts;
        m.receive_count := m.receive_count + 1;
        m.first_received_at := coalesce(m.first_received_at, ts);
        RETURN NEXT m;
    END LOOP;
END $$;

DO $$
DECLARE
    fn regprocedure;
BEGIN
    IF (SELECT c.relkind FROM pg_class c WHERE c.oid = 'conveyor.messages'::regclass) = 'p' THEN
        RETURN;
    END IF;
    FOREACH fn IN ARRAY ARRAY[
        'conveyor.message_send(text, text, jsonb, integer, text, text, text)',
        'conveyor.message_send_json(text, jsonb)',
        'conveyor.message_send_batch(text, text[], jsonb[], integer[], text[], text[], text[])',
        'conveyor.message_receive(text, integer, integer, integer, integer)',
        'conveyor.message_receive_fifo(text, integer, integer)',
        'conveyor.message_receive_attempt(text, text, integer, integer)',
        'conveyor.message_pop(text, integer)',
        'conveyor.message_peek(text, integer, bigint)',
        'conveyor.message_delete(text, bigint[])',
        'conveyor.message_delete(text, bigint)',
        'conveyor.message_delete(text, bigint[], integer[])',
        'conveyor.message_archive(text, bigint[])',
        'conveyor.message_archive(text, bigint)',
        'conveyor.message_archive(text, bigint[], integer[])',
        'conveyor.message_fail(text, bigint, text)',
        'conveyor.message_fail(text, bigint, text, integer)',
        'conveyor.message_set_vt(text, bigint[], integer, boolean)',
        'conveyor.message_set_vt(text, bigint, integer, boolean)',
        'conveyor.message_set_vt(text, bigint[], integer[], integer, boolean)'
    ]::regprocedure[] LOOP
        EXECUTE format('ALTER FUNCTION %s SET plan_cache_mode = force_generic_plan', fn);
    END LOOP;
END $$;
