-- Conveyor 0015: the message functions keep one plan per statement (generic plans).
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
