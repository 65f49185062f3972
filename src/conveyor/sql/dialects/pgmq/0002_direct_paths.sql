-- Conveyor's pgmq dialect, 0002: the hot calls (send, send_batch, read, read_with_poll,
-- pop, archive, delete) with one queue lookup and one call into the engine each.
--
-- Measured (docs/benchmarks.md, "Dialects against the real peers"; perf and
-- pg_stat_user_functions in a scratch database): in 0001 a pgmq.send cost about six times
-- the server time of the real pgmq's, an archive about two. Where the time went:
--   - SQL functions that the planner cannot inline (a SETOF function called in a SELECT
--     list, a SECURITY DEFINER one, one with an aggregate such as pgmq._objects) are
--     parsed and planned again at every call: pgmq.send and pgmq._objects were two of
--     them, conveyor.message_archive(text, bigint) a third;
--   - a send built a JSON array of message objects for conveyor._send to take apart
--     again, and every call looked its queue up twice (pgmq._queue, conveyor._queue).
-- So the hot functions are PL/pgSQL (plans kept for the session), look the queue up once
-- (pgmq._q: the row of conveyor.queues) and then use the engine's own parts:
--   send     standard queues: conveyor._send's standard INSERT, with the engine's checks
--            (conveyor._message_ok) and wake-up (conveyor._wake), straight from the
--            arrays, a delay beyond a send's 900 s set in the same row (0001 set it by a
--            second statement); FIFO queues: conveyor._send itself (deduplication, groups)
--   read     conveyor._claim / conveyor._claim_fifo (redrive, receive counts), polling as
--            conveyor.message_receive does
--   pop, archive, delete   conveyor.message_pop / _archive / _delete under the queue's name
-- Results, errors and stored rows are 0001's: tests/dialects/test_pgmq.py compares a send
-- with the engine's row for row, and pgmq's clients and the real pgmq answer for the rest.
--
-- Rights: the hot functions are SECURITY DEFINER with a pinned search_path, granted as
-- before (conveyor_writer), so a role may do through pgmq.* what it may through conveyor.*.

-- The queue a pgmq name designates (exact name, else the one that folds to the same lower
-- case, as pgmq._find), or pgmq's error for a missing table (as pgmq._queue).
CREATE FUNCTION pgmq._q(queue_name text) RETURNS conveyor.queues
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q conveyor.queues;
BEGIN
    SELECT * INTO q FROM conveyor.queues x WHERE x.name = _q.queue_name;
    IF NOT FOUND THEN
        SELECT * INTO q FROM conveyor.queues x WHERE x.name = pgmq._find(_q.queue_name);
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = '42P01', MESSAGE = format('relation "pgmq.%s" does not exist',
                                                                       coalesce(pgmq.format_table_name(queue_name, 'q'), 'q_'));
        END IF;
    END IF;
    RETURN q;
END $$;

------------------------------------------------------------------------------------------
-- Sending
------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION pgmq._send(queue_name text, msgs jsonb[], headers jsonb[], delay_seconds integer)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgmq AS $$
DECLARE
    q conveyor.queues := pgmq._q(queue_name);
    ts timestamptz := now();
    n bigint;
    sent bigint := 0;
    lo integer := 1;
BEGIN
    IF delay_seconds > 43200 THEN
        RAISE EXCEPTION USING ERRCODE = 'CVV01', MESSAGE = format(
            'delay must be at most 43200 seconds (12 hours) in Conveyor''s pgmq dialect, got %s', delay_seconds);
    END IF;
    IF NOT q.fifo THEN
        -- conveyor._send's standard insert: ids drawn in input order, every row checked
        RETURN QUERY
        INSERT INTO conveyor.messages AS t (queue_id, id, vt, sent_at, body, content_type, headers, group_id)
        SELECT q.id, nextval(q.seq), ts + make_interval(secs => delay_seconds), ts, x.body, 'application/json',
               x.headers, x.headers ->> 'x-pgmq-group'
          FROM (SELECT coalesce(u.msg, 'null')::text AS body,
                       CASE WHEN jsonb_typeof(u.h) <> 'null' THEN u.h END AS headers, u.ord
                  FROM unnest(msgs, headers) WITH ORDINALITY AS u(msg, h, ord)) x
         WHERE conveyor._message_ok(q, x.body, x.headers, least(delay_seconds, 900), NULL, NULL)
         ORDER BY x.ord
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
    PERFORM conveyor._wake(q, sent::integer);
END $$;

CREATE OR REPLACE FUNCTION pgmq._send_batch(queue_name text, msgs jsonb[], headers jsonb[], delay_seconds integer)
RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgmq._validate_batch_params(msgs, headers);
    RETURN QUERY SELECT pgmq._send(queue_name, msgs, headers, delay_seconds);
END $$;

-- The overloads as PL/pgSQL: a SQL wrapper called in a SELECT list (SELECT pgmq.send(...))
-- is planned anew at every call.
CREATE OR REPLACE FUNCTION pgmq.send(queue_name text, msg jsonb, headers jsonb, delay timestamptz)
RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT pgmq._send(queue_name, ARRAY[msg], ARRAY[headers], pgmq._seconds(delay));
END $$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name text, msg jsonb) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT pgmq._send(queue_name, ARRAY[msg], NULL, 0);
END $$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name text, msg jsonb, headers jsonb) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT pgmq._send(queue_name, ARRAY[msg], ARRAY[headers], 0);
END $$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name text, msg jsonb, delay integer) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT pgmq._send(queue_name, ARRAY[msg], NULL, greatest(coalesce(delay, 0), 0));
END $$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name text, msg jsonb, delay timestamptz) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT pgmq._send(queue_name, ARRAY[msg], NULL, pgmq._seconds(delay));
END $$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name text, msg jsonb, headers jsonb, delay integer) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT pgmq._send(queue_name, ARRAY[msg], ARRAY[headers], greatest(coalesce(delay, 0), 0));
END $$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[], headers jsonb[], delay timestamptz)
RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT pgmq._send_batch(queue_name, msgs, headers, pgmq._seconds(delay));
END $$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[]) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT pgmq._send_batch(queue_name, msgs, NULL, 0);
END $$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[], headers jsonb[]) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT pgmq._send_batch(queue_name, msgs, headers, 0);
END $$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[], delay integer) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT pgmq._send_batch(queue_name, msgs, NULL, greatest(coalesce(delay, 0), 0));
END $$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[], delay timestamptz) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT pgmq._send_batch(queue_name, msgs, NULL, pgmq._seconds(delay));
END $$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[], headers jsonb[], delay integer)
RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT pgmq._send_batch(queue_name, msgs, headers, greatest(coalesce(delay, 0), 0));
END $$;

------------------------------------------------------------------------------------------
-- Reading
------------------------------------------------------------------------------------------

-- 0001's loop (chunks of 1000, polling up to wait_seconds for the first message) with
-- conveyor.message_receive's checks and polling inlined around the engine's claim.
CREATE OR REPLACE FUNCTION pgmq._read(queue_name text, vt integer, qty integer, wait_seconds integer,
                                      poll_interval_ms integer, conditional jsonb)
RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgmq AS $$
DECLARE
    q conveyor.queues := pgmq._q(queue_name);
    vt_given integer := CASE WHEN _read.vt IS NOT NULL THEN greatest(_read.vt, 0) END;
    vt_seconds integer := coalesce(vt_given, q.visibility_timeout);
    left_to_read bigint := coalesce(qty, 9223372036854775807);
    stop_at timestamptz := clock_timestamp() + make_interval(secs => greatest(coalesce(wait_seconds, 0), 0));
    n bigint;
BEGIN
    IF conditional IS NOT NULL AND conditional <> '{}'::jsonb THEN
        RAISE EXCEPTION USING ERRCODE = '0A000',
            MESSAGE = 'conditional reads are not supported by Conveyor''s pgmq dialect',
            HINT = 'read without the conditional argument and filter in the consumer';
    END IF;
    IF left_to_read < 0 THEN
        RAISE EXCEPTION USING ERRCODE = '2201W', MESSAGE = 'LIMIT must not be negative';
    END IF;
    IF left_to_read > 0 AND vt_seconds > 43200 THEN
        PERFORM conveyor._raise('CVV01', format('vt must be from 0 to 43200 seconds, got %s', vt_seconds));
    END IF;
    WHILE left_to_read > 0 LOOP
        IF q.fifo THEN
            RETURN QUERY
            SELECT m.id, m.receive_count, m.sent_at,
                   coalesce(m.vt - make_interval(secs => vt_given), pgmq._last_read(m.receive_count, m.first_received_at)),
                   m.vt, pgmq._message(m.body, m.content_type), m.headers
              FROM conveyor._claim_fifo(q, vt_seconds, least(left_to_read, 1000)::integer) m;
        ELSE
            RETURN QUERY
            SELECT m.id, m.receive_count, m.sent_at,
                   coalesce(m.vt - make_interval(secs => vt_given), pgmq._last_read(m.receive_count, m.first_received_at)),
                   m.vt, pgmq._message(m.body, m.content_type), m.headers
              FROM conveyor._claim(q, vt_seconds, least(left_to_read, 1000)::integer) m;
        END IF;
        GET DIAGNOSTICS n = ROW_COUNT;
        left_to_read := left_to_read - n;
        IF n > 0 THEN
            -- a full chunk: more may be waiting, taken at once; anything less: done
            EXIT WHEN n < 1000;
            stop_at := clock_timestamp();
        ELSE
            EXIT WHEN clock_timestamp() >= stop_at;
            PERFORM pg_sleep(least(greatest(coalesce(poll_interval_ms, 100), 10), 10000) / 1000.0);
        END IF;
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION pgmq.read(queue_name text, vt integer, qty integer, conditional jsonb DEFAULT '{}')
RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq._read(queue_name, vt, qty, 0, 100, conditional);
END $$;

CREATE OR REPLACE FUNCTION pgmq.read_with_poll(queue_name text, vt integer, qty integer,
                                               max_poll_seconds integer DEFAULT 5,
                                               poll_interval_ms integer DEFAULT 100, conditional jsonb DEFAULT '{}')
RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgmq._read(queue_name, vt, qty, max_poll_seconds, poll_interval_ms, conditional);
END $$;

-- Reads and deletes (conveyor.message_pop). Conveyor's pop counts the claim as a receive;
-- pgmq's does not, so read_ct is the count before the pop (as 0001 reported it).
CREATE OR REPLACE FUNCTION pgmq.pop(queue_name text, qty integer DEFAULT 1) RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgmq AS $$
DECLARE
    target text := (pgmq._q(queue_name)).name;
    left_to_pop bigint := coalesce(qty, 9223372036854775807);
    n bigint;
BEGIN
    IF left_to_pop < 0 THEN
        RAISE EXCEPTION USING ERRCODE = '2201W', MESSAGE = 'LIMIT must not be negative';
    END IF;
    WHILE left_to_pop > 0 LOOP
        RETURN QUERY
        SELECT m.id, m.receive_count - 1, m.sent_at, pgmq._last_read(m.receive_count - 1, m.first_received_at),
               m.vt, pgmq._message(m.body, m.content_type), m.headers
          FROM conveyor.message_pop(target, least(left_to_pop, 1000)::integer) m;
        GET DIAGNOSTICS n = ROW_COUNT;
        EXIT WHEN n < 1000;
        left_to_pop := left_to_pop - n;
    END LOOP;
END $$;

------------------------------------------------------------------------------------------
-- Acknowledging: the engine's functions, under the queue's own name
------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION pgmq.archive(queue_name text, msg_id bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgmq AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM conveyor.message_archive((pgmq._q(queue_name)).name, ARRAY[msg_id]));
END $$;

CREATE OR REPLACE FUNCTION pgmq.archive(queue_name text, msg_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgmq AS $$
BEGIN
    RETURN QUERY SELECT conveyor.message_archive((pgmq._q(queue_name)).name, msg_ids);
END $$;

CREATE OR REPLACE FUNCTION pgmq.delete(queue_name text, msg_id bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgmq AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM conveyor.message_delete((pgmq._q(queue_name)).name, ARRAY[msg_id]));
END $$;

CREATE OR REPLACE FUNCTION pgmq.delete(queue_name text, msg_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgmq AS $$
BEGIN
    RETURN QUERY SELECT conveyor.message_delete((pgmq._q(queue_name)).name, msg_ids);
END $$;

REVOKE ALL ON FUNCTION pgmq._q(text) FROM PUBLIC;

-- Generic plans for the two functions with statements of their own on conveyor.messages,
-- as Conveyor's message functions have them (migration 0014 says why, and where it leaves
-- them off): the same choice here, taken from the engine's.
DO $$
DECLARE
    fn regprocedure;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_proc p
                    WHERE p.oid = 'conveyor.message_receive(text, integer, integer, integer, integer)'::regprocedure
                      AND 'plan_cache_mode=force_generic_plan' = ANY (p.proconfig)) THEN
        RETURN;
    END IF;
    FOREACH fn IN ARRAY ARRAY[
        'pgmq._send(text, jsonb[], jsonb[], integer)',
        'pgmq._read(text, integer, integer, integer, integer, jsonb)'
    ]::regprocedure[] LOOP
        EXECUTE format('ALTER FUNCTION %s SET plan_cache_mode = force_generic_plan', fn);
    END LOOP;
END $$;
