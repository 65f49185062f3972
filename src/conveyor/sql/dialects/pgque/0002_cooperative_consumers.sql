-- Conveyor dialect pgque 0002: PgQue's cooperative consumers (experimental in PgQue 0.2,
-- called by pgque-py 0.2.2's receive_coop and its Consumer(subconsumer=...)), on the
-- engine's cooperative members (migration 0023).
--
-- PgQue's model, kept: a consumer (the "main", which keeps the cursor) has subconsumers,
-- each a consumer row of its own named <consumer>.<subconsumer>; each subconsumer takes the
-- next tick range after the main's cursor as a batch of its own, so the batches are split
-- between them and none goes to two; a retry made by any of them comes back to the group.
--
--   subscribe_subconsumer / register_subconsumer(queue, consumer, sub [, convert_normal])
--                     1 for a new member (the consumer is subscribed first when it is not);
--                     a plain consumer becomes cooperative only when asked (convert_normal)
--   unsubscribe_subconsumer / unregister_subconsumer(queue, consumer, sub [, batch_handling])
--                     with an open batch: refused (0, the default), or (1) its events go
--                     through nack's rule (retry in 60 s, or dead letter past max_retries)
--   touch_subconsumer the member's heartbeat (what dead_interval measures)
--   receive_coop      the member's batch, whole, or an overflow (54000, PgQue's text) that
--                     allocates nothing: the statement fails, the cursor stays
--   next_batch(queue, consumer, sub [, dead_interval]), next_batch_custom(7 arguments)
--                     PgQ's primitives in their cooperative form
--
-- A cooperative main consumer refuses the plain calls (receive, next_batch), a member too,
-- in PgQue's words; unregister_consumer refuses a main that still has members.

-- PgQue's role names in pgque.subscription; a member shares its main's sub_id.
CREATE OR REPLACE VIEW pgque.subscription AS
SELECT coalesce(c.coop_of, c.id)::int4 AS sub_id, c.stream_id::int4 AS sub_queue, c.id::int4 AS sub_consumer,
       c.last_tick AS sub_last_tick, c.active_at AS sub_active, c.batch_id AS sub_batch,
       c.next_tick AS sub_next_tick,
       CASE WHEN c.coop_of IS NOT NULL THEN 'coop_member'
            WHEN EXISTS (SELECT 1 FROM conveyor.stream_consumers m WHERE m.coop_of = c.id) THEN 'coop_main'
            ELSE 'normal' END AS sub_role
  FROM conveyor.stream_consumers c;

CREATE FUNCTION pgque._validate_coop_names(i_queue text, i_consumer text, i_subconsumer text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog AS $$
BEGIN
    IF i_queue IS NULL OR i_queue = '' THEN
        RAISE EXCEPTION 'queue name must not be empty';
    ELSIF i_consumer IS NULL OR i_consumer = '' THEN
        RAISE EXCEPTION 'consumer name must not be empty';
    ELSIF i_subconsumer IS NULL OR i_subconsumer = '' THEN
        RAISE EXCEPTION 'subconsumer name must not be empty';
    ELSIF strpos(i_consumer, '.') > 0 THEN
        RAISE EXCEPTION 'cooperative consumer name must not contain dot: %', i_consumer;
    ELSIF strpos(i_subconsumer, '.') > 0 THEN
        RAISE EXCEPTION 'cooperative subconsumer name must not contain dot: %', i_subconsumer;
    END IF;
END $$;

-- PgQue's refusal of the plain batch calls for a cooperative main or member.
CREATE FUNCTION pgque._plain_consumer(c conveyor.stream_consumers, i_queue text) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog AS $$
BEGIN
    IF c.coop_of IS NOT NULL THEN
        RAISE EXCEPTION 'consumer % on queue % is a cooperative subconsumer; use receive_coop / next_batch (cooperative form) instead of the legacy 5-arg next_batch_custom',
            c.name, i_queue;
    ELSIF EXISTS (SELECT 1 FROM conveyor.stream_consumers m WHERE m.coop_of = c.id) THEN
        RAISE EXCEPTION 'consumer % on queue % is a cooperative main consumer; use cooperative receive/next_batch with a subconsumer',
            c.name, i_queue;
    END IF;
END $$;

CREATE FUNCTION pgque.register_subconsumer(i_queue text, i_consumer text, i_subconsumer text,
                                           i_convert_normal boolean DEFAULT false) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    s conveyor.streams;
    main conveyor.stream_consumers;
    member conveyor.stream_consumers;
    member_name text := i_consumer || '.' || i_subconsumer;
BEGIN
    PERFORM pgque._validate_coop_names(i_queue, i_consumer, i_subconsumer);
    s := pgque._queue(i_queue, 'Event queue not created yet');
    SELECT * INTO main FROM conveyor.stream_consumers c WHERE c.stream_id = s.id AND c.name = i_consumer FOR UPDATE;
    IF main.coop_of IS NOT NULL THEN
        RAISE EXCEPTION 'consumer % on queue % is not a cooperative main consumer', i_consumer, i_queue;
    END IF;
    IF main.id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM conveyor.stream_consumers m WHERE m.coop_of = main.id) THEN
        IF NOT coalesce(i_convert_normal, false) THEN
            RAISE EXCEPTION 'consumer % on queue % is already a normal consumer; explicit conversion is required',
                i_consumer, i_queue;
        END IF;
        IF main.batch_id IS NOT NULL THEN
            RAISE EXCEPTION 'cannot convert active normal consumer % on queue % to cooperative main', i_consumer, i_queue;
        END IF;
    END IF;
    SELECT * INTO member FROM conveyor.stream_consumers c WHERE c.stream_id = s.id AND c.name = member_name;
    IF member.id IS NOT NULL AND member.coop_of IS DISTINCT FROM main.id THEN
        RAISE EXCEPTION 'consumer name % on queue % is already registered incompatibly', member_name, i_queue;
    END IF;
    RETURN CASE WHEN conveyor.stream_coop_join(i_queue, i_consumer, member_name) OR main.id IS NULL THEN 1 ELSE 0 END;
END $$;

CREATE FUNCTION pgque.subscribe_subconsumer(i_queue text, i_consumer text, i_subconsumer text,
                                            i_convert_normal boolean DEFAULT false) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.register_subconsumer(i_queue, i_consumer, i_subconsumer, i_convert_normal)
$$;

CREATE FUNCTION pgque.touch_subconsumer(i_queue text, i_consumer text, i_subconsumer text) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    n integer;
BEGIN
    PERFORM pgque._validate_coop_names(i_queue, i_consumer, i_subconsumer);
    UPDATE conveyor.stream_consumers c SET active_at = clock_timestamp()
      FROM conveyor.streams s
     WHERE s.name = i_queue AND c.stream_id = s.id AND c.name = i_consumer || '.' || i_subconsumer
       AND c.coop_of IS NOT NULL;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- 1 when the member was removed, 0 when there was none. Its open batch: refused, or
-- (batch_handling 1) every event of it through nack's rule, then the batch finished.
CREATE FUNCTION pgque.unregister_subconsumer(i_queue text, i_consumer text, i_subconsumer text,
                                             i_batch_handling integer DEFAULT 0) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    member conveyor.stream_consumers;
    ev bigint;
BEGIN
    PERFORM pgque._validate_coop_names(i_queue, i_consumer, i_subconsumer);
    IF i_batch_handling IS NULL OR i_batch_handling NOT IN (0, 1) THEN
        RAISE EXCEPTION 'unsupported batch_handling value: %', i_batch_handling;
    END IF;
    SELECT c.* INTO member
      FROM conveyor.stream_consumers c
      JOIN conveyor.streams s ON s.id = c.stream_id
      JOIN conveyor.stream_consumers main ON main.id = c.coop_of AND main.name = i_consumer
     WHERE s.name = i_queue AND c.name = i_consumer || '.' || i_subconsumer
       FOR UPDATE OF c;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    IF member.batch_id IS NOT NULL THEN
        IF i_batch_handling = 0 THEN
            RAISE EXCEPTION 'cannot unregister active cooperative subconsumer %/%/% without batch_handling = 1',
                i_queue, i_consumer, i_subconsumer;
        END IF;
        FOR ev IN SELECT e.id FROM conveyor.stream_get_batch_events(member.batch_id) e LOOP
            PERFORM conveyor.stream_nack(member.batch_id, ev, interval '60 seconds', 'subconsumer unregistered');
        END LOOP;
        PERFORM conveyor.stream_finish_batch(member.batch_id);
    END IF;
    PERFORM conveyor.stream_unsubscribe(i_queue, member.name);
    RETURN 1;
END $$;

CREATE FUNCTION pgque.unsubscribe_subconsumer(i_queue text, i_consumer text, i_subconsumer text,
                                              i_batch_handling integer DEFAULT 0) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.unregister_subconsumer(i_queue, i_consumer, i_subconsumer, i_batch_handling)
$$;

-- The member's batch (registered on the way, as PgQue does): its open one, a silent
-- member's (dead_interval), or the next range after the main's cursor.
CREATE FUNCTION pgque.next_batch_custom(i_queue text, i_consumer text, i_subconsumer text, i_min_lag interval,
                                        i_min_count int4, i_min_interval interval, i_dead_interval interval DEFAULT NULL,
                                        OUT batch_id bigint, OUT prev_tick_id bigint, OUT next_tick_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    PERFORM pgque.register_subconsumer(i_queue, i_consumer, i_subconsumer);
    batch_id := conveyor.stream_next_batch_coop(i_queue, i_consumer, i_consumer || '.' || i_subconsumer,
                                                i_dead_interval, i_min_lag, i_min_count, i_min_interval);
    IF batch_id IS NOT NULL THEN
        SELECT c.last_tick, c.next_tick INTO prev_tick_id, next_tick_id
          FROM conveyor.stream_consumers c WHERE c.batch_id = next_batch_custom.batch_id;
    END IF;
END $$;

CREATE FUNCTION pgque.next_batch(i_queue text, i_consumer text, i_subconsumer text,
                                 i_dead_interval interval DEFAULT NULL) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT batch_id FROM pgque.next_batch_custom(i_queue, i_consumer, i_subconsumer, NULL, NULL, NULL, i_dead_interval)
$$;

-- The member's batch whole (batches with nothing for the group are finished on the way, as
-- pgque.receive does), or SQLSTATE 54000 when it holds more than i_max_return: the
-- statement fails, so the batch is not allocated and the cursor does not move (a batch the
-- member already held stays its own); retry with a larger ceiling. NULL: no ceiling.
CREATE FUNCTION pgque.receive_coop(i_queue text, i_consumer text, i_subconsumer text, i_max_return integer DEFAULT 100,
                                   i_dead_interval interval DEFAULT NULL)
RETURNS SETOF pgque.message
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    batch bigint;
    page conveyor.stream_event[];
BEGIN
    IF i_max_return < 1 THEN
        RAISE EXCEPTION 'pgque.receive_coop: max_return must be >= 1, got %', i_max_return;
    END IF;
    FOR i IN 1 .. 1000 LOOP
        batch := pgque.next_batch(i_queue, i_consumer, i_subconsumer, i_dead_interval);
        IF batch IS NULL THEN
            RETURN;
        END IF;
        SELECT array_agg(e ORDER BY e.id) INTO page
          FROM (SELECT * FROM conveyor.stream_get_batch_events(batch) x
                 ORDER BY x.id LIMIT CASE WHEN i_max_return < 2147483647 THEN i_max_return + 1 END) e;
        IF page IS NULL THEN
            PERFORM conveyor.stream_finish_batch(batch);
            CONTINUE;
        END IF;
        IF cardinality(page) > i_max_return THEN
            RAISE EXCEPTION USING ERRCODE = 'program_limit_exceeded',
                MESSAGE = format('pgque.receive_coop: batch exceeds max_return of %s', i_max_return),
                DETAIL = format('batch %s holds more than %s events', batch, i_max_return),
                HINT = 'Retry with a larger resource-safe max_return to receive the complete batch. Do not acknowledge after this error.';
        END IF;
        RETURN QUERY SELECT e.id, e.batch_id, e.type, e.payload, e.retry_count, e.created_at,
                            e.extra1, e.extra2, e.extra3, e.extra4
                       FROM unnest(page) e ORDER BY e.id;
        RETURN;
    END LOOP;
END $$;

------------------------------------------------------------------------------------------
-- 0001's calls that meet cooperative consumers
------------------------------------------------------------------------------------------

-- 0001's receive, refused for a cooperative main or member (PgQue's words), with PgQue's
-- overflow hint.
CREATE OR REPLACE FUNCTION pgque.receive(i_queue text, i_consumer text, i_max_return integer DEFAULT 100)
RETURNS SETOF pgque.message
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    page conveyor.stream_event[];
BEGIN
    IF i_max_return IS NULL OR i_max_return < 1 THEN
        RAISE EXCEPTION 'pgque.receive: max_return must be >= 1, got %', coalesce(i_max_return::text, 'NULL');
    END IF;
    PERFORM pgque._plain_consumer(pgque._subscriber(i_queue, i_consumer), i_queue);
    -- one event more than the ceiling tells whether the batch is bigger (a batch of 2^31
    -- events does not happen: the ceiling itself is then the answer)
    SELECT array_agg(e ORDER BY e.id) INTO page
      FROM conveyor.stream_receive(i_queue, i_consumer, CASE WHEN i_max_return < 2147483647 THEN i_max_return + 1
                                                             ELSE i_max_return END) e;
    IF page IS NULL THEN
        RETURN;
    END IF;
    IF cardinality(page) > i_max_return OR NOT coalesce(conveyor.stream_batch_read_all((page[1]).batch_id), true) THEN
        RAISE EXCEPTION USING ERRCODE = 'program_limit_exceeded',
            MESSAGE = format('pgque.receive: batch exceeds max_return of %s', i_max_return),
            DETAIL = format('batch %s holds more than %s events', (page[1]).batch_id, i_max_return),
            HINT = 'Retry with a larger resource-safe max_return to receive the complete batch. Do not acknowledge after this error.';
    END IF;
    RETURN QUERY SELECT e.id, e.batch_id, e.type, e.payload, e.retry_count, e.created_at,
                        e.extra1, e.extra2, e.extra3, e.extra4
                   FROM unnest(page) e ORDER BY e.id;
END $$;

CREATE OR REPLACE FUNCTION pgque.next_batch_custom(i_queue_name text, i_consumer_name text, i_min_lag interval,
    i_min_count int4, i_min_interval interval,
    OUT batch_id int8, OUT cur_tick_id int8, OUT prev_tick_id int8, OUT cur_tick_time timestamptz,
    OUT prev_tick_time timestamptz, OUT cur_tick_event_seq int8, OUT prev_tick_event_seq int8)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    c conveyor.stream_consumers := pgque._subscriber(i_queue_name, i_consumer_name);
BEGIN
    PERFORM pgque._plain_consumer(c, i_queue_name);
    batch_id := conveyor.stream_next_batch_custom(i_queue_name, i_consumer_name, i_min_lag, i_min_count,
                                                  i_min_interval);
    IF batch_id IS NULL THEN
        RETURN;
    END IF;
    SELECT x.* INTO c FROM conveyor.stream_consumers x WHERE x.id = c.id;
    SELECT t.tick_id, t.tick_time, t.tick_event_seq INTO prev_tick_id, prev_tick_time, prev_tick_event_seq
      FROM conveyor.stream_ticks t WHERE t.stream_id = c.stream_id AND t.tick_id = c.last_tick;
    SELECT t.tick_id, t.tick_time, t.tick_event_seq INTO cur_tick_id, cur_tick_time, cur_tick_event_seq
      FROM conveyor.stream_ticks t WHERE t.stream_id = c.stream_id AND t.tick_id = c.next_tick;
END $$;

-- 0001's unregister, refusing a main with members and a member holding a batch (PgQue's
-- words); a member is otherwise removed as any consumer is.
CREATE OR REPLACE FUNCTION pgque.unregister_consumer(x_queue_name text, x_consumer_name text) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    c conveyor.stream_consumers;
BEGIN
    SELECT x.* INTO c FROM conveyor.stream_consumers x JOIN conveyor.streams s ON s.id = x.stream_id
     WHERE s.name = x_queue_name AND x.name = x_consumer_name;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    IF c.coop_of IS NOT NULL AND c.batch_id IS NOT NULL THEN
        RAISE EXCEPTION 'cannot unregister active cooperative subconsumer without forced batch handling';
    END IF;
    IF EXISTS (SELECT 1 FROM conveyor.stream_consumers m WHERE m.coop_of = c.id) THEN
        RAISE EXCEPTION 'cannot unregister cooperative main consumer with registered subconsumers';
    END IF;
    RETURN CASE WHEN conveyor.stream_unsubscribe(x_queue_name, x_consumer_name) THEN 1 ELSE 0 END;
END $$;

-- 0001's nack and event_retry: a member's retries belong to its main (the engine's rule),
-- so "already waiting" is asked of the main's.
CREATE OR REPLACE FUNCTION pgque.nack(i_batch_id bigint, i_msg pgque.message, i_retry_after interval DEFAULT '60 seconds',
                                      i_reason text DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    c conveyor.stream_consumers := pgque._batch_holder(i_batch_id);
BEGIN
    IF c.id IS NULL THEN
        RAISE EXCEPTION 'batch not found: %', i_batch_id;
    END IF;
    IF i_msg.msg_id IS NULL
       OR NOT EXISTS (SELECT 1 FROM conveyor.stream_get_batch_events(i_batch_id) e WHERE e.id = i_msg.msg_id) THEN
        RAISE EXCEPTION 'msg_id % not found in batch %', coalesce(i_msg.msg_id::text, 'NULL'), i_batch_id;
    END IF;
    IF EXISTS (SELECT 1 FROM conveyor.stream_retries r
                WHERE r.consumer_id = coalesce(c.coop_of, c.id) AND r.ev_id = i_msg.msg_id)
       OR EXISTS (SELECT 1 FROM conveyor.stream_dead_letters d
                   WHERE d.stream_id = c.stream_id AND d.consumer = c.name AND d.ev_id = i_msg.msg_id) THEN
        RETURN 1;
    END IF;
    PERFORM conveyor.stream_nack(i_batch_id, i_msg.msg_id, coalesce(i_retry_after, interval '60 seconds'), i_reason);
    RETURN 1;
END $$;

CREATE OR REPLACE FUNCTION pgque.event_retry(x_batch_id bigint, x_event_id bigint, x_retry_seconds integer)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    c conveyor.stream_consumers := pgque._batch_holder(x_batch_id);
BEGIN
    IF c.id IS NULL THEN
        RAISE EXCEPTION 'batch not found';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM conveyor.stream_get_batch_events(x_batch_id) e WHERE e.id = x_event_id) THEN
        RAISE EXCEPTION 'event not found';
    END IF;
    IF EXISTS (SELECT 1 FROM conveyor.stream_retries r
                WHERE r.consumer_id = coalesce(c.coop_of, c.id) AND r.ev_id = x_event_id) THEN
        RETURN 0;
    END IF;
    RETURN conveyor.stream_event_retry(x_batch_id, x_event_id, greatest(coalesce(x_retry_seconds, 0), 0));
END $$;

------------------------------------------------------------------------------------------
-- Roles: the cooperative calls are a consumer's (pgque_reader), as in PgQue
------------------------------------------------------------------------------------------

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgque FROM PUBLIC;

DO $$
BEGIN
    GRANT SELECT ON pgque.subscription TO pgque_reader, pgque_admin;
    GRANT EXECUTE ON FUNCTION
        pgque.register_subconsumer(text, text, text, boolean), pgque.subscribe_subconsumer(text, text, text, boolean),
        pgque.unregister_subconsumer(text, text, text, integer),
        pgque.unsubscribe_subconsumer(text, text, text, integer),
        pgque.touch_subconsumer(text, text, text), pgque.next_batch(text, text, text, interval),
        pgque.next_batch_custom(text, text, text, interval, int4, interval, interval),
        pgque.receive_coop(text, text, text, integer, interval)
        TO pgque_reader, pgque_admin;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor pgque dialect: roles missing, grants skipped (%)', SQLERRM;
END $$;
