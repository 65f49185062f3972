-- Conveyor's pgmq dialect, 0001: pgmq 1.x's SQL API (as of pgmq 1.13, the version the
-- `pgmq` Python client 1.1.x ships and calls) in schema `pgmq`, over Conveyor's engine.
--
-- A pgmq queue is a Conveyor queue: the functions below call conveyor.queue_* and
-- conveyor.message_* and keep no state of their own, so a queue created here is seen by
-- SQS, REST and the CLI, and a message sent by any of them is read here. What differs
-- from pgmq, and why, is in docs/dialects/pgmq.md.
--
-- Mapping:
--   queue name     the Conveyor queue of that exact name, else the one whose name folds to
--                  the same lower case (pgmq's tables are lower-cased: q_<lower(name)>)
--   message jsonb  the body as JSON text, content_type 'application/json'; a body sent
--                  by another protocol reads back parsed when it is JSON, else as a string
--   headers        Conveyor's headers (a JSON object); 'x-pgmq-group' also sets group_id
--   read_ct        receive_count; enqueued_at sent_at; archive -> conveyor.archive
--   unlogged / partitioned kinds: recorded in the queue's extra_attributes.pgmq (the
--                  engine stores every queue in its one logged messages table)
--
-- Errors are pgmq's own words and SQLSTATEs where pgmq raises them (a missing queue is
-- 42P01 'relation "pgmq.q_<name>" does not exist', as the missing table is in pgmq);
-- limits that are Conveyor's (vt up to 43200 s, message size) raise Conveyor's CV codes.
--
-- The functions run with the caller's rights (SECURITY INVOKER) and so need the caller's
-- Conveyor role for the conveyor.* functions they call; only pgmq._views and
-- pgmq._drop_views, which make and remove the q_/a_ views, are SECURITY DEFINER. Names
-- are schema-qualified throughout.

CREATE SCHEMA pgmq;
ALTER DEFAULT PRIVILEGES IN SCHEMA pgmq REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;

------------------------------------------------------------------------------------------
-- Types (pgmq's, field for field: clients read them by position)
------------------------------------------------------------------------------------------

CREATE TYPE pgmq.message_record AS (
    msg_id       bigint,
    read_ct      integer,
    enqueued_at  timestamptz,
    last_read_at timestamptz,
    vt           timestamptz,
    message      jsonb,
    headers      jsonb
);

CREATE TYPE pgmq.queue_record AS (
    queue_name     varchar,
    is_partitioned boolean,
    is_unlogged    boolean,
    created_at     timestamptz
);

CREATE TYPE pgmq.metrics_result AS (
    queue_name               text,
    queue_length             bigint,
    newest_msg_age_sec       integer,
    oldest_msg_age_sec       integer,
    total_messages           bigint,
    scrape_time              timestamptz,
    queue_visible_length     bigint,
    default_partition_length bigint
);

------------------------------------------------------------------------------------------
-- Helpers
------------------------------------------------------------------------------------------

-- pgmq's helper, same checks and result (public in pgmq, so kept public here).
CREATE FUNCTION pgmq.format_table_name(queue_name text, prefix text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF queue_name ~ '\$|;|--|''' THEN
        RAISE EXCEPTION 'queue name contains invalid characters: $, ;, --, or \''';
    END IF;
    RETURN lower(prefix || '_' || queue_name);
END $$;

CREATE FUNCTION pgmq.validate_queue_name(queue_name text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF length(queue_name) > 47 THEN
        RAISE EXCEPTION 'queue name is too long, maximum length is 47 characters';
    END IF;
END $$;

-- The Conveyor queue a pgmq name designates, or NULL: the exact name first, else the one
-- name that folds to the same lower case (pgmq addresses q_<lower(name)>).
CREATE FUNCTION pgmq._find(queue_name text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT q.name FROM conveyor.queues q WHERE q.name = _find.queue_name),
        (SELECT min(q.name) FROM conveyor.queues q
          WHERE lower(q.name) = lower(_find.queue_name) AND _find.queue_name IS NOT NULL
         HAVING count(*) = 1))
$$;

-- The Conveyor queue name for a pgmq call, or pgmq's errors: invalid characters, and for
-- a queue that does not exist the error pgmq gets from its missing table. (A name with
-- pgmq's invalid characters is never a Conveyor queue, so they are checked only when
-- nothing is found: one function call less on every call that succeeds.)
CREATE FUNCTION pgmq._queue(queue_name text) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    found text := pgmq._find(queue_name);
BEGIN
    IF found IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '42P01', MESSAGE = format('relation "pgmq.%s" does not exist',
                                                                   coalesce(pgmq.format_table_name(queue_name, 'q'), 'q_'));
    END IF;
    RETURN found;
END $$;

-- A stored body as pgmq's jsonb message. Bodies sent as JSON (pgmq, REST JSON) are cast;
-- others (SQS, REST text) are parsed when they are JSON, else returned as a JSON string.
CREATE FUNCTION pgmq._text_json(body text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN body::jsonb;
EXCEPTION WHEN invalid_text_representation THEN
    RETURN to_jsonb(body);
END $$;

CREATE FUNCTION pgmq._message(body text, content_type text) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN content_type = 'application/json' THEN body::jsonb ELSE pgmq._text_json(body) END
$$;

-- What pgmq calls last_read_at: Conveyor keeps the first receive's time, so it is known for
-- a message read once (reads and pops, which know the time of their own claim, say it).
CREATE FUNCTION pgmq._last_read(read_ct integer, first_received_at timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN read_ct = 1 THEN first_received_at END
$$;

-- A pgmq delay (an instant) as Conveyor's seconds from now; pgmq's past instants and
-- negative delays mean "visible now".
CREATE FUNCTION pgmq._seconds(at timestamptz) RETURNS integer
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN at IS NULL THEN 0
                ELSE greatest(0, ceil(extract(epoch FROM at - clock_timestamp())))::integer END
$$;

-- Conveyor's message objects for pgmq messages (see conveyor._send).
CREATE FUNCTION pgmq._objects(msgs jsonb[], headers jsonb[], delay_seconds integer) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'body', coalesce(msgs[i], 'null'::jsonb)::text,
               'content_type', 'application/json',
               'headers', CASE WHEN jsonb_typeof(headers[i]) = 'null' THEN NULL ELSE headers[i] END,
               'group_id', headers[i] ->> 'x-pgmq-group',
               'delay', least(delay_seconds, 900)) ORDER BY i), '[]')
      FROM generate_subscripts(msgs, 1) AS i
$$;

-- Sends with Conveyor's one insert path, then, for delays beyond a send's 900 seconds,
-- sets the visibility in the same transaction (nobody sees the message in between).
CREATE FUNCTION pgmq._send(queue_name text, msgs jsonb[], headers jsonb[], delay_seconds integer)
RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
DECLARE
    target text := pgmq._queue(queue_name);
    ids bigint[];
BEGIN
    IF delay_seconds > 43200 THEN
        RAISE EXCEPTION USING ERRCODE = 'CVV01', MESSAGE = format(
            'delay must be at most 43200 seconds (12 hours) in Conveyor''s pgmq dialect, got %s', delay_seconds);
    END IF;
    SELECT array_agg(s.id) INTO ids
      FROM conveyor.message_send_json(target, pgmq._objects(msgs, headers, delay_seconds)) s;
    IF delay_seconds > 900 THEN
        PERFORM conveyor.message_set_vt(target, ids, delay_seconds);
    END IF;
    RETURN QUERY SELECT unnest(ids);
END $$;

-- Reads up to qty messages (pgmq has no upper bound; Conveyor's receive takes 1000 at a
-- time), polling up to wait_seconds for the first. A NULL vt is the queue's visibility
-- timeout; a negative one, visible at once (as in pgmq).
CREATE FUNCTION pgmq._read(queue_name text, vt integer, qty integer, wait_seconds integer,
                           poll_interval_ms integer, conditional jsonb)
RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql AS $$
DECLARE
    target text := pgmq._queue(queue_name);
    vt_seconds integer := CASE WHEN _read.vt IS NOT NULL THEN greatest(_read.vt, 0) END;
    left_to_read bigint := coalesce(qty, 9223372036854775807);
    stop_at timestamptz := clock_timestamp() + make_interval(secs => greatest(coalesce(wait_seconds, 0), 0));
    wait integer;
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
    WHILE left_to_read > 0 LOOP
        wait := least(ceil(greatest(extract(epoch FROM stop_at - clock_timestamp()), 0)), 60);
        RETURN QUERY
        SELECT m.id, m.receive_count, m.sent_at,
               coalesce(m.vt - make_interval(secs => vt_seconds), pgmq._last_read(m.receive_count, m.first_received_at)),
               m.vt, pgmq._message(m.body, m.content_type), m.headers
          FROM conveyor.message_receive(target, vt_seconds, least(left_to_read, 1000)::integer, wait,
                                        coalesce(poll_interval_ms, 100)) m;
        GET DIAGNOSTICS n = ROW_COUNT;
        left_to_read := left_to_read - n;
        IF n > 0 THEN
            -- a full chunk: more may be waiting, taken at once; anything less: done
            EXIT WHEN n < 1000;
            stop_at := clock_timestamp();
        ELSE
            EXIT WHEN clock_timestamp() >= stop_at;
        END IF;
    END LOOP;
END $$;

-- Creates the queue (or finds it: pgmq's create is idempotent) and its q_/a_ views.
CREATE FUNCTION pgmq._create(queue_name text, kind jsonb, retention_seconds integer DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    attrs jsonb := jsonb_build_object('retention_seconds', coalesce(retention_seconds, 1209600),
                                      'extra_attributes', jsonb_build_object('pgmq', kind));
    found text;
BEGIN
    PERFORM pgmq.format_table_name(queue_name, 'q');
    PERFORM pgmq.validate_queue_name(queue_name);
    PERFORM pg_advisory_xact_lock(hashtext('pgmq.queue_' || lower(queue_name)));
    found := pgmq._find(queue_name);
    IF found IS NULL THEN
        PERFORM conveyor.queue_create(queue_name, attrs);
        found := queue_name;
    END IF;
    PERFORM pgmq._views(found);
END $$;

------------------------------------------------------------------------------------------
-- pgmq.q_<name> / pgmq.a_<name>: read-only views of a queue's messages and archive, for
-- code that queries pgmq's tables directly. Named as pgmq names its tables; the name is
-- a Conveyor queue name (A-Z a-z 0-9 _ -, checked when it was created) lower-cased and
-- quoted with %I. Made by create*, removed by drop_queue.
------------------------------------------------------------------------------------------

CREATE FUNCTION pgmq._views(queue_name text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgmq AS $$
DECLARE
    q text := pgmq.format_table_name(queue_name, 'q');
    a text := pgmq.format_table_name(queue_name, 'a');
BEGIN
    IF NOT EXISTS (SELECT 1 FROM conveyor.queues WHERE name = queue_name) OR length(q) > 63 THEN
        RETURN;
    END IF;
    EXECUTE format($v$
        CREATE OR REPLACE VIEW pgmq.%I AS
        SELECT m.id AS msg_id, m.receive_count AS read_ct, m.sent_at AS enqueued_at,
               pgmq._last_read(m.receive_count, m.first_received_at) AS last_read_at,
               m.vt, pgmq._message(m.body, m.content_type) AS message, m.headers
          FROM conveyor.messages m
         WHERE m.queue_id = (SELECT id FROM conveyor.queues WHERE name = %L)$v$, q, queue_name);
    EXECUTE format($v$
        CREATE OR REPLACE VIEW pgmq.%I AS
        SELECT a.id AS msg_id, a.receive_count AS read_ct, a.sent_at AS enqueued_at,
               pgmq._last_read(a.receive_count, a.first_received_at) AS last_read_at,
               a.archived_at, NULL::timestamptz AS vt,
               pgmq._message(a.body, a.content_type) AS message, a.headers
          FROM conveyor.archive a
         WHERE a.queue_id = (SELECT id FROM conveyor.queues WHERE name = %L)$v$, a, queue_name);
    EXECUTE format('GRANT SELECT ON pgmq.%I, pgmq.%I TO conveyor_reader', q, a);
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: role conveyor_reader missing, views of % not granted (%)', queue_name, SQLERRM;
END $$;

CREATE FUNCTION pgmq._drop_views(queue_name text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgmq AS $$
BEGIN
    -- only this dialect's views: a relation of that name that is not a view stays
    IF to_regclass(format('pgmq.%I', pgmq.format_table_name(queue_name, 'q'))) IN
       (SELECT c.oid FROM pg_class c WHERE c.relkind = 'v') THEN
        EXECUTE format('DROP VIEW pgmq.%I', pgmq.format_table_name(queue_name, 'q'));
    END IF;
    IF to_regclass(format('pgmq.%I', pgmq.format_table_name(queue_name, 'a'))) IN
       (SELECT c.oid FROM pg_class c WHERE c.relkind = 'v') THEN
        EXECUTE format('DROP VIEW pgmq.%I', pgmq.format_table_name(queue_name, 'a'));
    END IF;
END $$;

------------------------------------------------------------------------------------------
-- Queues
------------------------------------------------------------------------------------------

CREATE FUNCTION pgmq.create_non_partitioned(queue_name text) RETURNS void
LANGUAGE sql AS $$
    SELECT pgmq._create(queue_name, '{"kind": "standard"}')
$$;

CREATE FUNCTION pgmq."create"(queue_name text) RETURNS void
LANGUAGE sql AS $$
    SELECT pgmq.create_non_partitioned(queue_name)
$$;

CREATE FUNCTION pgmq.create_unlogged(queue_name text) RETURNS void
LANGUAGE sql AS $$
    SELECT pgmq._create(queue_name, '{"kind": "unlogged"}')
$$;

-- pg_partman is not needed: the kind and its parameters are recorded; a time retention
-- becomes the queue's retention period (within Conveyor's 60 s to 14 days).
CREATE FUNCTION pgmq.create_partitioned(queue_name text, partition_interval text DEFAULT '10000',
                                        retention_interval text DEFAULT '100000', premake integer DEFAULT 4)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    retention interval;
BEGIN
    IF premake < 1 THEN
        RAISE EXCEPTION 'premake must be at least 1, got %', premake;
    END IF;
    IF partition_interval IS NULL OR partition_interval !~ '^\s*\d+\s*$' THEN
        PERFORM partition_interval::interval;
    END IF;
    IF retention_interval IS NULL OR retention_interval !~ '^\s*\d+\s*$' THEN
        retention := retention_interval::interval;
    END IF;
    PERFORM pgmq._create(queue_name,
        jsonb_build_object('kind', 'partitioned', 'partition_interval', partition_interval,
                           'retention_interval', retention_interval, 'premake', premake),
        CASE WHEN retention IS NOT NULL
             THEN least(greatest(extract(epoch FROM retention), 60), 1209600)::integer END);
END $$;

CREATE FUNCTION pgmq.drop_queue(queue_name text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    table_name text := pgmq.format_table_name(queue_name, 'q');
    found text := pgmq._find(queue_name);
BEGIN
    IF found IS NULL THEN
        RAISE NOTICE 'pgmq queue `%` does not exist', queue_name;
        RETURN false;
    END IF;
    PERFORM pgmq._drop_views(found);
    RETURN conveyor.queue_drop(found);
END $$;

CREATE FUNCTION pgmq.drop_queue(queue_name text, partitioned boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    RAISE WARNING 'drop_queue(queue_name, partitioned) is deprecated and will be removed in PGMQ v2.0. Use drop_queue(queue_name) instead';
    PERFORM pgmq.drop_queue(queue_name);
    RETURN true;
END $$;

CREATE FUNCTION pgmq.purge_queue(queue_name text) RETURNS bigint
LANGUAGE sql AS $$
    SELECT conveyor.queue_purge(pgmq._queue(queue_name))
$$;

CREATE FUNCTION pgmq.detach_archive(queue_name text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE WARNING 'detach_archive(queue_name) is deprecated and is a no-op. It will be removed in PGMQ v2.0. Archive tables are no longer member objects.';
END $$;

-- Every Conveyor queue, whichever interface created it, oldest first (pgmq.meta's order).
CREATE FUNCTION pgmq.list_queues() RETURNS SETOF pgmq.queue_record
LANGUAGE sql STABLE AS $$
    SELECT q.name::varchar,
           coalesce(q.extra_attributes #>> '{pgmq,kind}' = 'partitioned', false),
           coalesce(q.extra_attributes #>> '{pgmq,kind}' = 'unlogged', false),
           q.created_at
      FROM conveyor.queues q
     ORDER BY q.created_at, q.id
$$;

CREATE FUNCTION pgmq._metrics(queue_name text, m conveyor.queue_metrics, partitioned boolean)
RETURNS pgmq.metrics_result
LANGUAGE sql STABLE AS $$
    SELECT queue_name, m.queue_length + m.in_flight + m.delayed, m.newest_msg_age_sec,
           m.oldest_msg_age_sec, m.total_messages, m.scrape_time, m.queue_length,
           CASE WHEN partitioned THEN 0::bigint END
$$;

CREATE FUNCTION pgmq.metrics(queue_name text) RETURNS pgmq.metrics_result
LANGUAGE sql STABLE AS $$
    SELECT pgmq._metrics(metrics.queue_name, m,
                         q.extra_attributes #>> '{pgmq,kind}' IS NOT DISTINCT FROM 'partitioned')
      FROM conveyor.queue_metrics(pgmq._queue(metrics.queue_name)) m
      JOIN conveyor.queues q ON q.name = m.queue_name
$$;

CREATE FUNCTION pgmq.metrics_all() RETURNS SETOF pgmq.metrics_result
LANGUAGE sql STABLE AS $$
    SELECT m.queue_name, m.queue_length + m.in_flight + m.delayed, m.newest_msg_age_sec,
           m.oldest_msg_age_sec, m.total_messages, m.scrape_time, m.queue_length,
           CASE WHEN q.extra_attributes #>> '{pgmq,kind}' = 'partitioned' THEN 0::bigint END
      FROM conveyor.queue_metrics_all() m
      JOIN conveyor.queues q ON q.name = m.queue_name
     ORDER BY q.created_at, q.id
$$;

------------------------------------------------------------------------------------------
-- Sending: pgmq's overloads, each down to the (queue, msgs, headers, instant) form
------------------------------------------------------------------------------------------

CREATE FUNCTION pgmq.send(queue_name text, msg jsonb, headers jsonb, delay timestamptz)
RETURNS SETOF bigint
LANGUAGE sql AS $$
    SELECT pgmq._send(queue_name, ARRAY[msg], ARRAY[headers], pgmq._seconds(delay))
$$;

CREATE FUNCTION pgmq.send(queue_name text, msg jsonb) RETURNS SETOF bigint
LANGUAGE sql AS $$
    SELECT pgmq._send(queue_name, ARRAY[msg], ARRAY[NULL::jsonb], 0)
$$;

CREATE FUNCTION pgmq.send(queue_name text, msg jsonb, headers jsonb) RETURNS SETOF bigint
LANGUAGE sql AS $$
    SELECT pgmq._send(queue_name, ARRAY[msg], ARRAY[headers], 0)
$$;

CREATE FUNCTION pgmq.send(queue_name text, msg jsonb, delay integer) RETURNS SETOF bigint
LANGUAGE sql AS $$
    SELECT pgmq._send(queue_name, ARRAY[msg], ARRAY[NULL::jsonb], greatest(coalesce(delay, 0), 0))
$$;

CREATE FUNCTION pgmq.send(queue_name text, msg jsonb, delay timestamptz) RETURNS SETOF bigint
LANGUAGE sql AS $$
    SELECT pgmq._send(queue_name, ARRAY[msg], ARRAY[NULL::jsonb], pgmq._seconds(delay))
$$;

CREATE FUNCTION pgmq.send(queue_name text, msg jsonb, headers jsonb, delay integer) RETURNS SETOF bigint
LANGUAGE sql AS $$
    SELECT pgmq._send(queue_name, ARRAY[msg], ARRAY[headers], greatest(coalesce(delay, 0), 0))
$$;

CREATE FUNCTION pgmq._validate_batch_params(msgs jsonb[], headers jsonb[]) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF msgs IS NULL OR array_length(msgs, 1) IS NULL THEN
        RAISE EXCEPTION 'msgs cannot be NULL or empty';
    END IF;
    IF headers IS NOT NULL AND coalesce(array_length(headers, 1), 0) != coalesce(array_length(msgs, 1), 0) THEN
        RAISE EXCEPTION 'headers array length (%) must match msgs array length (%)',
            coalesce(array_length(headers, 1), 0), coalesce(array_length(msgs, 1), 0);
    END IF;
END $$;

-- A batch larger than Conveyor's 10000 per call goes in several calls of one transaction.
CREATE FUNCTION pgmq._send_batch(queue_name text, msgs jsonb[], headers jsonb[], delay_seconds integer)
RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
DECLARE
    n integer := array_length(msgs, 1);
    lo integer := 1;
BEGIN
    PERFORM pgmq._validate_batch_params(msgs, headers);
    WHILE lo <= n LOOP
        RETURN QUERY SELECT pgmq._send(queue_name, msgs[lo:lo + 9999], headers[lo:lo + 9999], delay_seconds);
        lo := lo + 10000;
    END LOOP;
END $$;

CREATE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[], headers jsonb[], delay timestamptz)
RETURNS SETOF bigint
LANGUAGE sql AS $$
    SELECT pgmq._send_batch(queue_name, msgs, headers, pgmq._seconds(delay))
$$;

CREATE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[]) RETURNS SETOF bigint
LANGUAGE sql AS $$
    SELECT pgmq._send_batch(queue_name, msgs, NULL, 0)
$$;

CREATE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[], headers jsonb[]) RETURNS SETOF bigint
LANGUAGE sql AS $$
    SELECT pgmq._send_batch(queue_name, msgs, headers, 0)
$$;

CREATE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[], delay integer) RETURNS SETOF bigint
LANGUAGE sql AS $$
    SELECT pgmq._send_batch(queue_name, msgs, NULL, greatest(coalesce(delay, 0), 0))
$$;

CREATE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[], delay timestamptz) RETURNS SETOF bigint
LANGUAGE sql AS $$
    SELECT pgmq._send_batch(queue_name, msgs, NULL, pgmq._seconds(delay))
$$;

CREATE FUNCTION pgmq.send_batch(queue_name text, msgs jsonb[], headers jsonb[], delay integer)
RETURNS SETOF bigint
LANGUAGE sql AS $$
    SELECT pgmq._send_batch(queue_name, msgs, headers, greatest(coalesce(delay, 0), 0))
$$;

------------------------------------------------------------------------------------------
-- Reading
------------------------------------------------------------------------------------------

CREATE FUNCTION pgmq.read(queue_name text, vt integer, qty integer, conditional jsonb DEFAULT '{}')
RETURNS SETOF pgmq.message_record
LANGUAGE sql AS $$
    SELECT * FROM pgmq._read(queue_name, vt, qty, 0, 100, conditional)
$$;

CREATE FUNCTION pgmq.read_with_poll(queue_name text, vt integer, qty integer, max_poll_seconds integer DEFAULT 5,
                                    poll_interval_ms integer DEFAULT 100, conditional jsonb DEFAULT '{}')
RETURNS SETOF pgmq.message_record
LANGUAGE sql AS $$
    SELECT * FROM pgmq._read(queue_name, vt, qty, max_poll_seconds, poll_interval_ms, conditional)
$$;

-- Reads and deletes. Conveyor's pop counts the claim as a receive; pgmq's does not.
CREATE FUNCTION pgmq.pop(queue_name text, qty integer DEFAULT 1) RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql AS $$
DECLARE
    target text := pgmq._queue(queue_name);
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
-- Acknowledging and visibility
------------------------------------------------------------------------------------------

CREATE FUNCTION pgmq.archive(queue_name text, msg_id bigint) RETURNS boolean
LANGUAGE sql AS $$
    SELECT conveyor.message_archive(pgmq._queue(queue_name), msg_id)
$$;

CREATE FUNCTION pgmq.archive(queue_name text, msg_ids bigint[]) RETURNS SETOF bigint
LANGUAGE sql AS $$
    SELECT conveyor.message_archive(pgmq._queue(queue_name), msg_ids)
$$;

CREATE FUNCTION pgmq.delete(queue_name text, msg_id bigint) RETURNS boolean
LANGUAGE sql AS $$
    SELECT conveyor.message_delete(pgmq._queue(queue_name), msg_id)
$$;

CREATE FUNCTION pgmq.delete(queue_name text, msg_ids bigint[]) RETURNS SETOF bigint
LANGUAGE sql AS $$
    SELECT conveyor.message_delete(pgmq._queue(queue_name), msg_ids)
$$;

CREATE FUNCTION pgmq._set_vt(queue_name text, msg_ids bigint[], vt_seconds integer)
RETURNS SETOF pgmq.message_record
LANGUAGE sql AS $$
    SELECT m.id, m.receive_count, m.sent_at, pgmq._last_read(m.receive_count, m.first_received_at),
           m.vt, pgmq._message(m.body, m.content_type), m.headers
      FROM conveyor.message_set_vt(pgmq._queue(queue_name), msg_ids, greatest(vt_seconds, 0)) m
$$;

CREATE FUNCTION pgmq.set_vt(queue_name text, msg_id bigint, vt timestamptz) RETURNS SETOF pgmq.message_record
LANGUAGE sql AS $$
    SELECT * FROM pgmq._set_vt(queue_name, ARRAY[msg_id], pgmq._seconds(vt))
$$;

CREATE FUNCTION pgmq.set_vt(queue_name text, msg_id bigint, vt integer) RETURNS SETOF pgmq.message_record
LANGUAGE sql AS $$
    SELECT * FROM pgmq._set_vt(queue_name, ARRAY[msg_id], vt)
$$;

CREATE FUNCTION pgmq.set_vt(queue_name text, msg_ids bigint[], vt timestamptz) RETURNS SETOF pgmq.message_record
LANGUAGE sql AS $$
    SELECT * FROM pgmq._set_vt(queue_name, msg_ids, pgmq._seconds(vt))
$$;

CREATE FUNCTION pgmq.set_vt(queue_name text, msg_ids bigint[], vt integer) RETURNS SETOF pgmq.message_record
LANGUAGE sql AS $$
    SELECT * FROM pgmq._set_vt(queue_name, msg_ids, vt)
$$;

------------------------------------------------------------------------------------------
-- Roles, as Conveyor grants its own: reader (look) < writer (send, read, acknowledge) <
-- admin (create, drop, purge). The functions run with the caller's rights, so the helpers
-- they call are granted with them; what they may do is still what the caller's Conveyor
-- role allows in conveyor.*.
------------------------------------------------------------------------------------------

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgmq FROM PUBLIC;

DO $$
BEGIN
    GRANT USAGE ON SCHEMA pgmq TO conveyor_reader;
    GRANT EXECUTE ON FUNCTION
        pgmq.format_table_name(text, text), pgmq.validate_queue_name(text),
        pgmq.list_queues(), pgmq.metrics(text), pgmq.metrics_all(),
        -- helpers the functions above (which run with the caller's rights) and the views call
        pgmq._find(text), pgmq._queue(text), pgmq._text_json(text), pgmq._message(text, text),
        pgmq._last_read(integer, timestamptz), pgmq._metrics(text, conveyor.queue_metrics, boolean)
        TO conveyor_reader;
    GRANT EXECUTE ON FUNCTION
        pgmq.send(text, jsonb), pgmq.send(text, jsonb, jsonb), pgmq.send(text, jsonb, integer),
        pgmq.send(text, jsonb, timestamptz), pgmq.send(text, jsonb, jsonb, integer),
        pgmq.send(text, jsonb, jsonb, timestamptz),
        pgmq.send_batch(text, jsonb[]), pgmq.send_batch(text, jsonb[], jsonb[]),
        pgmq.send_batch(text, jsonb[], integer), pgmq.send_batch(text, jsonb[], timestamptz),
        pgmq.send_batch(text, jsonb[], jsonb[], integer), pgmq.send_batch(text, jsonb[], jsonb[], timestamptz),
        pgmq.read(text, integer, integer, jsonb),
        pgmq.read_with_poll(text, integer, integer, integer, integer, jsonb),
        pgmq.pop(text, integer),
        pgmq.archive(text, bigint), pgmq.archive(text, bigint[]),
        pgmq.delete(text, bigint), pgmq.delete(text, bigint[]),
        pgmq.set_vt(text, bigint, integer), pgmq.set_vt(text, bigint, timestamptz),
        pgmq.set_vt(text, bigint[], integer), pgmq.set_vt(text, bigint[], timestamptz),
        pgmq._seconds(timestamptz), pgmq._objects(jsonb[], jsonb[], integer),
        pgmq._send(text, jsonb[], jsonb[], integer), pgmq._validate_batch_params(jsonb[], jsonb[]),
        pgmq._send_batch(text, jsonb[], jsonb[], integer),
        pgmq._read(text, integer, integer, integer, integer, jsonb), pgmq._set_vt(text, bigint[], integer)
        TO conveyor_writer;
    GRANT EXECUTE ON FUNCTION
        pgmq."create"(text), pgmq.create_non_partitioned(text), pgmq.create_unlogged(text),
        pgmq.create_partitioned(text, text, text, integer),
        pgmq.drop_queue(text), pgmq.drop_queue(text, boolean),
        pgmq.purge_queue(text), pgmq.detach_archive(text),
        -- the q_/a_ views, made and removed by create* and drop_queue with the owner's rights
        pgmq._views(text), pgmq._drop_views(text), pgmq._create(text, jsonb, integer)
        TO conveyor_admin;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: roles missing, pgmq grants skipped (%)', SQLERRM;
END $$;
