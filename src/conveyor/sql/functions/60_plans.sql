-- Statement plans of the queue functions: applied last, after every other file, since
-- CREATE OR REPLACE resets a function's SET clauses.
--
-- Current definitions, re-applied whenever a file of this folder changes (docs/architecture.md,
-- "Where each SQL function's current definition lives"). Edit a function here; tables, types,
-- indexes, data and DROPs go in a new numbered migration.

-- As in 0016, for the functions whose statements read conveyor.messages only: the
-- partitioned queues' functions above keep their generic plans whatever the storage.
CREATE OR REPLACE FUNCTION conveyor._message_plans() RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    mode text := CASE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_inherits h
                                    WHERE h.inhparent = 'conveyor.messages'::regclass
                                      AND h.inhrelid <> 'conveyor.messages_shared'::regclass)
                      THEN 'force_custom_plan' ELSE 'force_generic_plan' END;
    fn regprocedure;
BEGIN
    PERFORM pg_advisory_xact_lock(7306554613);  -- "conveyor plans"
    FOR fn IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
               WHERE p.pronamespace IN ('conveyor'::regnamespace, coalesce(to_regnamespace('pgmq'), 0))
                 AND p.proconfig && ARRAY['plan_cache_mode=force_generic_plan', 'plan_cache_mode=force_custom_plan']
                 AND p.proname NOT IN ('message_send', 'message_send_json', 'message_send_batch', '_send')
                 AND p.proname !~ '^pqueue_'
                 AND pg_has_role(p.proowner, 'USAGE')  -- another owner's (a dialect installed apart) stays
                 AND NOT p.proconfig @> ARRAY['plan_cache_mode=' || mode]
               ORDER BY p.oid LOOP
        EXECUTE format('ALTER FUNCTION %s SET plan_cache_mode = %s', fn, mode);
    END LOOP;
    RETURN mode;
END $$;

-- While queues with tables of their own exist, the queue functions (re-created above or in
-- earlier files with force_generic_plan) take per-call plans (see _message_plans).
SELECT conveyor._message_plans();

REVOKE ALL ON ALL ROUTINES IN SCHEMA conveyor FROM PUBLIC;
