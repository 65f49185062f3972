-- The pgmq dialect's functions and views (docs/dialects.md).
--
-- Current definitions, re-applied whenever a file of this folder changes (docs/architecture.md,
-- "Where each SQL function's current definition lives"). Edit a function here; tables, types,
-- indexes, data and DROPs go in a new numbered migration.

-- pgmq's helper, same checks and result (public in pgmq, so kept public here).
CREATE OR REPLACE FUNCTION pgmq.format_table_name(queue_name text, prefix text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF queue_name ~ '\$|;|--|''' THEN
        RAISE EXCEPTION 'queue name contains invalid characters: $, ;, --, or \''';
    END IF;
    RETURN lower(prefix || '_' || queue_name);
END $$;

CREATE OR REPLACE FUNCTION pgmq.validate_queue_name(queue_name text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF length(queue_name) > 47 THEN
        RAISE EXCEPTION 'queue name is too long, maximum length is 47 characters';
    END IF;
END $$;

-- The Conveyor queue a pgmq name designates, or NULL: the exact name first, else the one
-- name that folds to the same lower case (pgmq addresses q_<lower(name)>).
CREATE OR REPLACE FUNCTION pgmq._find(queue_name text) RETURNS text
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
CREATE OR REPLACE FUNCTION pgmq._queue(queue_name text) RETURNS text
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
CREATE OR REPLACE FUNCTION pgmq._text_json(body text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN body::jsonb;
EXCEPTION WHEN invalid_text_representation THEN
    RETURN to_jsonb(body);
END $$;

-- What pgmq calls last_read_at: Conveyor keeps the first receive's time, so it is known for
-- a message read once (reads and pops, which know the time of their own claim, say it).
CREATE OR REPLACE FUNCTION pgmq._last_read(read_ct integer, first_received_at timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN read_ct = 1 THEN first_received_at END
$$;

-- A pgmq delay (an instant) as Conveyor's seconds from now; pgmq's past instants and
-- negative delays mean "visible now".
CREATE OR REPLACE FUNCTION pgmq._seconds(at timestamptz) RETURNS integer
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN at IS NULL THEN 0
                ELSE greatest(0, ceil(extract(epoch FROM at - clock_timestamp())))::integer END
$$;

CREATE OR REPLACE FUNCTION pgmq._views(queue_name text) RETURNS void
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

CREATE OR REPLACE FUNCTION pgmq._drop_views(queue_name text) RETURNS void
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

CREATE OR REPLACE FUNCTION pgmq.create_non_partitioned(queue_name text) RETURNS void
LANGUAGE sql AS $$
    SELECT pgmq._create(queue_name, '{"kind": "standard"}')
$$;

CREATE OR REPLACE FUNCTION pgmq."create"(queue_name text) RETURNS void
LANGUAGE sql AS $$
    SELECT pgmq.create_non_partitioned(queue_name)
$$;

CREATE OR REPLACE FUNCTION pgmq.create_unlogged(queue_name text) RETURNS void
LANGUAGE sql AS $$
    SELECT pgmq._create(queue_name, '{"kind": "unlogged"}')
$$;

CREATE OR REPLACE FUNCTION pgmq.drop_queue(queue_name text) RETURNS boolean
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

CREATE OR REPLACE FUNCTION pgmq.drop_queue(queue_name text, partitioned boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    RAISE WARNING 'drop_queue(queue_name, partitioned) is deprecated and will be removed in PGMQ v2.0. Use drop_queue(queue_name) instead';
    PERFORM pgmq.drop_queue(queue_name);
    RETURN true;
END $$;

CREATE OR REPLACE FUNCTION pgmq.purge_queue(queue_name text) RETURNS bigint
LANGUAGE sql AS $$
    SELECT conveyor.queue_purge(pgmq._queue(queue_name))
$$;

CREATE OR REPLACE FUNCTION pgmq.detach_archive(queue_name text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE WARNING 'detach_archive(queue_name) is deprecated and is a no-op. It will be removed in PGMQ v2.0. Archive tables are no longer member objects.';
END $$;

CREATE OR REPLACE FUNCTION pgmq._validate_batch_params(msgs jsonb[], headers jsonb[]) RETURNS void
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

CREATE OR REPLACE FUNCTION pgmq._set_vt(queue_name text, msg_ids bigint[], vt_seconds integer)
RETURNS SETOF pgmq.message_record
LANGUAGE sql AS $$
    SELECT m.id, m.receive_count, m.sent_at, pgmq._last_read(m.receive_count, m.first_received_at),
           m.vt, pgmq._message(m.body, m.content_type), m.headers
      FROM conveyor.message_set_vt(pgmq._queue(queue_name), msg_ids, greatest(vt_seconds, 0)) m
$$;

CREATE OR REPLACE FUNCTION pgmq.set_vt(queue_name text, msg_id bigint, vt timestamptz) RETURNS SETOF pgmq.message_record
LANGUAGE sql AS $$
    SELECT * FROM pgmq._set_vt(queue_name, ARRAY[msg_id], pgmq._seconds(vt))
$$;

CREATE OR REPLACE FUNCTION pgmq.set_vt(queue_name text, msg_id bigint, vt integer) RETURNS SETOF pgmq.message_record
LANGUAGE sql AS $$
    SELECT * FROM pgmq._set_vt(queue_name, ARRAY[msg_id], vt)
$$;

CREATE OR REPLACE FUNCTION pgmq.set_vt(queue_name text, msg_ids bigint[], vt timestamptz) RETURNS SETOF pgmq.message_record
LANGUAGE sql AS $$
    SELECT * FROM pgmq._set_vt(queue_name, msg_ids, pgmq._seconds(vt))
$$;

CREATE OR REPLACE FUNCTION pgmq.set_vt(queue_name text, msg_ids bigint[], vt integer) RETURNS SETOF pgmq.message_record
LANGUAGE sql AS $$
    SELECT * FROM pgmq._set_vt(queue_name, msg_ids, vt)
$$;

-- The queue a pgmq name designates (exact name, else the one that folds to the same lower
-- case, as pgmq._find), or pgmq's error for a missing table (as pgmq._queue).
CREATE OR REPLACE FUNCTION pgmq._q(queue_name text) RETURNS conveyor.queues
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

-- pgmq's create*: the queue, found or made, with its views. `kind` is {"kind": "standard"},
-- {"kind": "unlogged"} or {"kind": "partitioned", "partition_interval", "retention_interval",
-- "premake"}. Every pgmq queue keeps messages for Conveyor's longest retention, 14 days;
-- a partitioned one loses whole partitions before that when its retention says so.
-- (retention_seconds is no longer used, kept for the signature.)
CREATE OR REPLACE FUNCTION pgmq._create(queue_name text, kind jsonb, retention_seconds integer DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    attrs jsonb := jsonb_build_object('retention_seconds', 1209600);
    found text;
BEGIN
    PERFORM pgmq.format_table_name(queue_name, 'q');
    PERFORM pgmq.validate_queue_name(queue_name);
    PERFORM pg_advisory_xact_lock(hashtext('pgmq.queue_' || lower(queue_name)));
    found := pgmq._find(queue_name);
    IF found IS NULL THEN
        IF kind ->> 'kind' = 'unlogged' THEN
            attrs := attrs || '{"storage": "unlogged"}';
        ELSIF kind ->> 'kind' = 'partitioned' THEN
            attrs := attrs || jsonb_build_object('storage', 'partitioned',
                                                 'partition_interval', kind -> 'partition_interval',
                                                 'partition_retention', kind -> 'retention_interval',
                                                 'partition_premake', kind -> 'premake');
        END IF;
        PERFORM conveyor.queue_create(queue_name, attrs);
        found := queue_name;
    END IF;
    PERFORM pgmq._views(found);
END $$;

CREATE OR REPLACE FUNCTION pgmq.list_queues() RETURNS SETOF pgmq.queue_record
LANGUAGE sql STABLE AS $$
    SELECT q.name::varchar, q.storage = 'partitioned', q.storage = 'unlogged', q.created_at
      FROM conveyor.queues q
     ORDER BY q.created_at, q.id
$$;

-- pgmq's signal that partition upkeep is failing: rows in the DEFAULT partitions (the
-- planner's estimate, so that a large spill does not slow every scrape); NULL for a queue
-- that is not partitioned.
CREATE OR REPLACE FUNCTION pgmq._default_partition_length(q conveyor.queues) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN q.storage = 'partitioned' THEN
               (SELECT coalesce(sum(greatest(c.reltuples, 0)), 0)::bigint FROM pg_catalog.pg_class c
                 WHERE c.oid IN (to_regclass(format('conveyor.%I', 'messages_q' || q.id || '_default')),
                                 to_regclass(format('conveyor.%I', 'archive_q' || q.id || '_default'))))
           END
$$;

CREATE OR REPLACE FUNCTION pgmq.metrics(queue_name text) RETURNS pgmq.metrics_result
LANGUAGE sql STABLE AS $$
    SELECT metrics.queue_name, m.queue_length + m.in_flight + m.delayed, m.newest_msg_age_sec,
           m.oldest_msg_age_sec, m.total_messages, m.scrape_time, m.queue_length,
           pgmq._default_partition_length(q)
      FROM conveyor.queue_metrics(pgmq._queue(metrics.queue_name)) m
      JOIN conveyor.queues q ON q.name = m.queue_name
$$;

CREATE OR REPLACE FUNCTION pgmq.metrics_all() RETURNS SETOF pgmq.metrics_result
LANGUAGE sql STABLE AS $$
    SELECT m.queue_name, m.queue_length + m.in_flight + m.delayed, m.newest_msg_age_sec,
           m.oldest_msg_age_sec, m.total_messages, m.scrape_time, m.queue_length,
           pgmq._default_partition_length(q)
      FROM conveyor.queue_metrics_all() m
      JOIN conveyor.queues q ON q.name = m.queue_name
     ORDER BY q.created_at, q.id
$$;

-- pgmq stores a NULL message as NULL. Conveyor's bodies are text and never NULL, so a NULL
-- message is stored as the JSON text 'null' (what SQS and REST readers see) with a content
-- type of its own, and read back here as NULL.
CREATE OR REPLACE FUNCTION pgmq._message(body text, content_type text) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN content_type = 'application/json' THEN body::jsonb
                WHEN content_type = 'application/json; pgmq=null' THEN NULL
                ELSE pgmq._text_json(body) END
$$;

CREATE OR REPLACE FUNCTION pgmq._content_type(msg jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN msg IS NULL THEN 'application/json; pgmq=null' ELSE 'application/json' END
$$;

CREATE OR REPLACE FUNCTION pgmq._objects(msgs jsonb[], headers jsonb[], delay_seconds integer) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'body', coalesce(msgs[i], 'null'::jsonb)::text,
               'content_type', pgmq._content_type(msgs[i]),
               'headers', CASE WHEN jsonb_typeof(headers[i]) = 'null' THEN NULL ELSE headers[i] END,
               'group_id', headers[i] ->> 'x-pgmq-group',
               'delay', least(delay_seconds, 900)) ORDER BY i), '[]')
      FROM generate_subscripts(msgs, 1) AS i
$$;

-- 0004's send with the content type of a NULL message; rows and plans otherwise 0004's.
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
        SELECT q.id, s.id, ts + make_interval(secs => delay_seconds), ts, s.body, s.content_type,
               s.headers, s.headers ->> 'x-pgmq-group', conveyor._message_uuid(seed, s.id)
          FROM (SELECT nextval(q.seq) AS id, x.body, x.content_type, x.headers
                  FROM (SELECT coalesce(u.msg, 'null')::text AS body,
                               CASE WHEN u.msg IS NULL THEN 'application/json; pgmq=null'
                                    ELSE 'application/json' END AS content_type,
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

-- The engine's claim (conveyor._claim: oldest visible first, FOR UPDATE SKIP LOCKED,
-- receive counts, redrive past max_receive_count) restricted to the messages whose JSON
-- contains `conditional`. The engine's receive has no body filter, so this one statement
-- is the dialect's; it follows _claim line for line otherwise (keep them together). Like
-- pgmq's, it reads every visible message of the queue to test it.
CREATE OR REPLACE FUNCTION pgmq._claim_matching(q conveyor.queues, vt_seconds integer, qty integer, conditional jsonb)
RETURNS SETOF conveyor.messages
LANGUAGE plpgsql AS $$
DECLARE
    ts timestamptz := clock_timestamp();
    expired bigint[];
BEGIN
    IF q.max_receive_count IS NOT NULL THEN
        SELECT array_agg(id) FILTER (WHERE receive_count >= q.max_receive_count)
          INTO expired
          FROM (SELECT m.id, m.receive_count FROM conveyor.messages m
                 WHERE m.queue_id = q.id AND m.vt <= ts
                   AND pgmq._message(m.body, m.content_type) @> conditional
                 ORDER BY m.vt, m.id LIMIT qty
                 FOR UPDATE SKIP LOCKED) c;
        IF expired IS NOT NULL THEN
            PERFORM conveyor._dead_letter(q, expired, conveyor._receive_limit_reason(q.max_receive_count));
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
                                -- never past the limit (those beyond the first candidates wait)
                                AND (q.max_receive_count IS NULL OR c.receive_count < q.max_receive_count)
                                AND pgmq._message(c.body, c.content_type) @> conditional
                              ORDER BY c.vt, c.id LIMIT qty
                              FOR UPDATE SKIP LOCKED))
    RETURNING m.*;
END $$;

-- 0002's read, with `conditional` (pgmq: only messages whose JSON contains it; '{}' and
-- NULL: every message). A FIFO queue is read in group order only, which a body filter
-- would break: conditional reads of FIFO queues are refused.
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
    filtered boolean := conditional IS NOT NULL AND conditional <> '{}'::jsonb;
    n bigint;
BEGIN
    IF filtered AND q.fifo THEN
        RAISE EXCEPTION USING ERRCODE = '0A000',
            MESSAGE = format('conditional reads of FIFO queue %s are not supported by Conveyor''s pgmq dialect', q.name),
            HINT = 'a FIFO queue is read in group order; read without the conditional argument';
    END IF;
    IF left_to_read < 0 THEN
        RAISE EXCEPTION USING ERRCODE = '2201W', MESSAGE = 'LIMIT must not be negative';
    END IF;
    IF left_to_read > 0 AND vt_seconds > 43200 THEN
        PERFORM conveyor._raise('CVV01', format('vt must be from 0 to 43200 seconds, got %s', vt_seconds));
    END IF;
    WHILE left_to_read > 0 LOOP
        IF filtered THEN
            RETURN QUERY
            SELECT m.id, m.receive_count, m.sent_at,
                   coalesce(m.vt - make_interval(secs => vt_given), pgmq._last_read(m.receive_count, m.first_received_at)),
                   m.vt, pgmq._message(m.body, m.content_type), m.headers
              FROM pgmq._claim_matching(q, vt_seconds, least(left_to_read, 1000)::integer, conditional) m;
        ELSIF q.fifo THEN
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

-- generic plans (migration 0014; see _message_plans)
ALTER FUNCTION pgmq._read(text,integer,integer,integer,integer,jsonb) SET plan_cache_mode = force_generic_plan;

-- pgmq's read plans as the engine's receive has them (as 0003 set them; a redefinition
-- resets a function's settings).
DO $$
DECLARE
    mode text := (SELECT substr(c, length('plan_cache_mode=') + 1)
                    FROM pg_proc p, unnest(p.proconfig) c
                   WHERE p.oid = 'conveyor.message_receive(text, integer, integer, integer, integer)'::regprocedure
                     AND c LIKE 'plan_cache_mode=%');
BEGIN
    IF mode IS NOT NULL THEN
        EXECUTE format('ALTER FUNCTION pgmq._read(text, integer, integer, integer, integer, jsonb) SET plan_cache_mode = %s',
                       mode);
    END IF;
END $$;

-- The engine's group choice (conveyor._claim_grouped's, kept in step with it) with pgmq's
-- round-robin order over the chosen groups' visible messages.
CREATE OR REPLACE FUNCTION pgmq._claim_round_robin(q conveyor.queues, vt_seconds integer, qty integer)
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
            PERFORM conveyor._dead_letter(q, expired, conveyor._receive_limit_reason(q.max_receive_count));
        END IF;
    END IF;
    RETURN QUERY
    UPDATE conveyor.messages m
       SET vt = ts + make_interval(secs => vt_seconds),
           receive_count = m.receive_count + 1,
           first_received_at = coalesce(m.first_received_at, ts)
     WHERE m.queue_id = q.id AND m.vt <= ts
       AND m.id = ANY (ARRAY(SELECT r.id
                               FROM (SELECT c.id,
                                            row_number() OVER (PARTITION BY coalesce(c.group_id, '') ORDER BY c.id) AS layer,
                                            min(c.id) OVER (PARTITION BY coalesce(c.group_id, '')) AS head
                                       FROM conveyor.messages c
                                      WHERE c.queue_id = q.id AND coalesce(c.group_id, '') = ANY (groups)
                                        AND c.vt <= ts) r
                              ORDER BY r.layer, r.head
                              LIMIT qty))
    RETURNING m.*;
END $$;

-- One grouped read (see above), polling up to wait_seconds for the first message as
-- pgmq's _with_poll functions do. Rows come in pgmq's order: round-robin by layer, else
-- group by group.
CREATE OR REPLACE FUNCTION pgmq._read_grouped(queue_name text, vt integer, qty integer, wait_seconds integer,
                                   poll_interval_ms integer, how text)
RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgmq AS $$
DECLARE
    q conveyor.queues := pgmq._q(queue_name);
    vt_given integer := CASE WHEN _read_grouped.vt IS NOT NULL THEN greatest(_read_grouped.vt, 0) END;
    vt_seconds integer := coalesce(vt_given, q.visibility_timeout);
    stop_at timestamptz := clock_timestamp() + make_interval(secs => greatest(coalesce(wait_seconds, 0), 0));
    claimed conveyor.messages[];
    one conveyor.messages[];
BEGIN
    IF qty < 0 THEN
        RAISE EXCEPTION USING ERRCODE = '2201W', MESSAGE = 'LIMIT must not be negative';
    END IF;
    IF coalesce(qty, 1) > 0 AND vt_seconds > 43200 THEN
        PERFORM conveyor._raise('CVV01', format('vt must be from 0 to 43200 seconds, got %s', vt_seconds));
    END IF;
    LOOP
        IF q.fifo AND how <> 'head' THEN
            claimed := ARRAY(SELECT m FROM conveyor._claim_fifo(q, vt_seconds, coalesce(qty, 1000)) m);
        ELSIF how = 'sqs' THEN
            claimed := ARRAY(SELECT m FROM conveyor._claim_grouped(q, vt_seconds, coalesce(qty, 1000)) m);
        ELSIF how = 'rr' THEN
            claimed := ARRAY(SELECT m FROM pgmq._claim_round_robin(q, vt_seconds, coalesce(qty, 1000)) m);
        ELSE
            claimed := '{}';
            FOR i IN 1 .. coalesce(qty, 1000) LOOP
                one := CASE WHEN q.fifo THEN ARRAY(SELECT m FROM conveyor._claim_fifo(q, vt_seconds, 1) m)
                            ELSE ARRAY(SELECT m FROM conveyor._claim_grouped(q, vt_seconds, 1) m) END;
                EXIT WHEN cardinality(one) = 0;
                claimed := claimed || one;
            END LOOP;
        END IF;
        EXIT WHEN cardinality(claimed) > 0 OR clock_timestamp() >= stop_at;
        PERFORM pg_sleep(least(greatest(coalesce(poll_interval_ms, 100), 10), 10000) / 1000.0);
    END LOOP;
    RETURN QUERY
    SELECT m.id, m.receive_count, m.sent_at,
           coalesce(m.vt - make_interval(secs => vt_given), pgmq._last_read(m.receive_count, m.first_received_at)),
           m.vt, pgmq._message(m.body, m.content_type), m.headers
      FROM unnest(claimed) m
     ORDER BY CASE WHEN how = 'rr' THEN row_number() OVER (PARTITION BY coalesce(m.group_id, '') ORDER BY m.id) END,
              min(m.id) OVER (PARTITION BY coalesce(m.group_id, '')), m.id;
END $$;

CREATE OR REPLACE FUNCTION pgmq.read_grouped(queue_name text, vt integer, qty integer) RETURNS SETOF pgmq.message_record
LANGUAGE sql AS $$
    SELECT * FROM pgmq._read_grouped(queue_name, vt, qty, 0, 100, 'sqs')
$$;

CREATE OR REPLACE FUNCTION pgmq.read_grouped_with_poll(queue_name text, vt integer, qty integer, max_poll_seconds integer DEFAULT 5,
                                            poll_interval_ms integer DEFAULT 100) RETURNS SETOF pgmq.message_record
LANGUAGE sql AS $$
    SELECT * FROM pgmq._read_grouped(queue_name, vt, qty, max_poll_seconds, poll_interval_ms, 'sqs')
$$;

CREATE OR REPLACE FUNCTION pgmq.read_grouped_rr(queue_name text, vt integer, qty integer) RETURNS SETOF pgmq.message_record
LANGUAGE sql AS $$
    SELECT * FROM pgmq._read_grouped(queue_name, vt, qty, 0, 100, 'rr')
$$;

CREATE OR REPLACE FUNCTION pgmq.read_grouped_rr_with_poll(queue_name text, vt integer, qty integer, max_poll_seconds integer DEFAULT 5,
                                               poll_interval_ms integer DEFAULT 100) RETURNS SETOF pgmq.message_record
LANGUAGE sql AS $$
    SELECT * FROM pgmq._read_grouped(queue_name, vt, qty, max_poll_seconds, poll_interval_ms, 'rr')
$$;

CREATE OR REPLACE FUNCTION pgmq.read_grouped_head(queue_name text, vt integer, qty integer) RETURNS SETOF pgmq.message_record
LANGUAGE sql AS $$
    SELECT * FROM pgmq._read_grouped(queue_name, vt, qty, 0, 100, 'head')
$$;

CREATE OR REPLACE FUNCTION pgmq.read_grouped_head_with_poll(queue_name text, vt integer, qty integer,
                                                 max_poll_seconds integer DEFAULT 5, poll_interval_ms integer DEFAULT 100)
RETURNS SETOF pgmq.message_record
LANGUAGE sql AS $$
    SELECT * FROM pgmq._read_grouped(queue_name, vt, qty, max_poll_seconds, poll_interval_ms, 'head')
$$;

-- pgmq's queue table, for code that reads it: every Conveyor queue.
CREATE OR REPLACE VIEW pgmq.meta AS
SELECT q.name::varchar AS queue_name, q.storage = 'partitioned' AS is_partitioned,
       q.storage = 'unlogged' AS is_unlogged, q.created_at
  FROM conveyor.queues q;

-- pgmq's lock around queue creation (the same advisory lock key).
CREATE OR REPLACE FUNCTION pgmq.acquire_queue_lock(queue_name text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('pgmq.queue_' || queue_name));
END $$;

-- pgmq's GIN index on headers, for its grouped reads: Conveyor keeps a message's group in
-- its own column (x-pgmq-group becomes group_id) with the engine's indexes, so there is
-- nothing to create. As in pgmq, a queue that does not exist is an error.
CREATE OR REPLACE FUNCTION pgmq.create_fifo_index(queue_name text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgmq._q(queue_name);
END $$;

CREATE OR REPLACE FUNCTION pgmq.create_fifo_indexes_all() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RETURN;
END $$;

-- pgmq turns a queue's archive table into a partitioned one (pg_partman). A Conveyor
-- queue's archive is stored as its queue is, chosen when the queue is created: a
-- partitioned queue's archive is partitioned already (pgmq's NOTICE for that case); the
-- archive of any other queue cannot become partitioned on its own.
CREATE OR REPLACE FUNCTION pgmq.convert_archive_partitioned(table_name text, partition_interval text DEFAULT '10000',
                                                 retention_interval text DEFAULT '100000',
                                                 leading_partition integer DEFAULT 10)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    a_table text := pgmq.format_table_name(table_name, 'a');
    q conveyor.queues;
BEGIN
    SELECT * INTO q FROM conveyor.queues x WHERE x.name = pgmq._find(table_name);
    IF NOT FOUND THEN
        RAISE NOTICE 'Table %s does not exists', a_table;
        RETURN;
    END IF;
    IF q.storage = 'partitioned' THEN
        RAISE NOTICE 'Table %s is already partitioned', a_table;
        RETURN;
    END IF;
    RAISE EXCEPTION USING ERRCODE = '0A000',
        MESSAGE = format('the archive of queue %s is stored as its queue is (%s) and cannot be partitioned on its own in Conveyor',
                         q.name, q.storage),
        HINT = 'create a partitioned queue (pgmq.create_partitioned) and move producers and consumers to it';
END $$;

-- pgmq's checks first (premake; an interval that is neither a number nor an interval),
-- then pg_partman's smallest interval (a second) in its words, then Conveyor's: a time
-- partition of at least a minute (pg_partman takes any interval from a second; here
-- partitions are made ahead by maintenance, run every minute), refused the same way.
CREATE OR REPLACE FUNCTION pgmq.create_partitioned(queue_name text, partition_interval text DEFAULT '10000',
                                                   retention_interval text DEFAULT '100000', premake integer DEFAULT 4)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF premake < 1 THEN
        RAISE EXCEPTION 'premake must be at least 1, got %', premake;
    END IF;
    IF partition_interval IS NULL OR partition_interval !~ '^\s*\d+\s*$' THEN
        IF partition_interval::interval < interval '1 second' THEN
            RAISE EXCEPTION 'Partitioning interval must be 1 second or greater';
        END IF;
        IF partition_interval::interval < interval '1 minute' THEN
            RAISE EXCEPTION USING
                MESSAGE = 'Partitioning interval must be 1 minute or greater in Conveyor''s pgmq dialect',
                DETAIL = format('got %s', partition_interval),
                HINT = 'Conveyor''s maintenance makes time partitions ahead once a minute';
        END IF;
    END IF;
    IF retention_interval IS NULL OR retention_interval !~ '^\s*\d+\s*$' THEN
        PERFORM retention_interval::interval;
    END IF;
    PERFORM pgmq._create(queue_name,
        jsonb_build_object('kind', 'partitioned', 'partition_interval', partition_interval,
                           'retention_interval', retention_interval, 'premake', premake));
END $$;

-- For each message inserted into a queue with notifications on: NOTIFY on pgmq's channel
-- pgmq.q_<queue>.INSERT with an empty payload, unless one was sent less than the queue's
-- throttle interval ago (then nothing: as in pgmq, listeners that need every message poll
-- as well). The throttle row is updated as pgmq updates it, so concurrent senders to one
-- queue take turns on it until they commit, as in pgmq.
CREATE OR REPLACE FUNCTION pgmq.notify_queue_listeners() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    channel text;
BEGIN
    UPDATE pgmq.notify_insert_throttle t
       SET last_notified_at = clock_timestamp()
     WHERE t.queue_id = NEW.queue_id
       AND (t.throttle_interval_ms = 0
            OR clock_timestamp() - t.last_notified_at >= t.throttle_interval_ms * interval '1 millisecond')
    RETURNING 'pgmq.' || lower('q_' || t.queue_name) || '.' || TG_OP INTO channel;
    IF channel IS NOT NULL THEN
        PERFORM pg_notify(channel, NULL);
    END IF;
    RETURN NEW;
END $$;

-- The one trigger on conveyor.messages (inherited by every queue's storage) that calls it,
-- for the queues listed in pgmq.notify_insert_throttle only: other queues' inserts pay a
-- comparison of their queue id, and none while no queue has notifications on. Made again
-- whenever the list changes.
CREATE OR REPLACE FUNCTION pgmq._notify_trigger() RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    ids bigint[] := ARRAY(SELECT t.queue_id FROM pgmq.notify_insert_throttle t ORDER BY 1);
BEGIN
    DROP TRIGGER IF EXISTS pgmq_notify_insert ON conveyor.messages;
    IF cardinality(ids) > 0 THEN
        EXECUTE format('CREATE TRIGGER pgmq_notify_insert AFTER INSERT ON conveyor.messages FOR EACH ROW
                        WHEN (NEW.queue_id = ANY (%L::bigint[])) EXECUTE FUNCTION pgmq.notify_queue_listeners()',
                       ids);
    END IF;
END $$;

CREATE OR REPLACE FUNCTION pgmq.disable_notify_insert(queue_name text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    q conveyor.queues := pgmq._q(queue_name);
BEGIN
    DELETE FROM pgmq.notify_insert_throttle t WHERE t.queue_id = q.id;
    IF FOUND THEN
        PERFORM pgmq._notify_trigger();
    END IF;
END $$;

CREATE OR REPLACE FUNCTION pgmq.enable_notify_insert(queue_name text, throttle_interval_ms integer DEFAULT 250)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    q conveyor.queues;
BEGIN
    IF throttle_interval_ms < 0 THEN
        RAISE EXCEPTION 'throttle_interval_ms must be non-negative';
    END IF;
    SELECT * INTO q FROM conveyor.queues x WHERE x.name = pgmq._find(enable_notify_insert.queue_name);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'Queue "%" does not exist. Create it first using pgmq.create()', queue_name;
    END IF;
    IF octet_length('pgmq.q_' || lower(q.name) || '.INSERT') > 63 THEN
        RAISE EXCEPTION USING ERRCODE = '0A000',
            MESSAGE = format('queue name %s is too long for a NOTIFY channel (pgmq.q_<name>.INSERT, at most 63 bytes)',
                             q.name);
    END IF;
    INSERT INTO pgmq.notify_insert_throttle AS t (queue_name, throttle_interval_ms, queue_id)
    VALUES (q.name, enable_notify_insert.throttle_interval_ms, q.id)
    ON CONFLICT (queue_id) DO UPDATE
       SET throttle_interval_ms = excluded.throttle_interval_ms, last_notified_at = to_timestamp(0);
    PERFORM pgmq._notify_trigger();
END $$;

CREATE OR REPLACE FUNCTION pgmq.update_notify_insert(queue_name text, throttle_interval_ms integer) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    target text := pgmq._find(update_notify_insert.queue_name);
BEGIN
    IF throttle_interval_ms < 0 THEN
        RAISE EXCEPTION 'throttle_interval_ms must be non-negative, got: %', throttle_interval_ms;
    END IF;
    IF target IS NULL THEN
        RAISE EXCEPTION 'Queue "%" does not exist. Create the queue first using pgmq.create()', queue_name;
    END IF;
    UPDATE pgmq.notify_insert_throttle t
       SET throttle_interval_ms = update_notify_insert.throttle_interval_ms, last_notified_at = to_timestamp(0)
     WHERE t.queue_name = target;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'Queue "%" does not have notify_insert enabled. Enable it first using pgmq.enable_notify_insert()',
            queue_name;
    END IF;
END $$;

CREATE OR REPLACE FUNCTION pgmq.list_notify_insert_throttles()
RETURNS TABLE (queue_name text, throttle_interval_ms integer, last_notified_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT t.queue_name, t.throttle_interval_ms, t.last_notified_at
      FROM pgmq.notify_insert_throttle t
     ORDER BY t.queue_name
$$;

-- pgmq's routing rules, in its words.
CREATE OR REPLACE FUNCTION pgmq.validate_routing_key(routing_key text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF routing_key IS NULL OR routing_key = '' THEN
        RAISE EXCEPTION 'routing_key cannot be NULL or empty';
    ELSIF length(routing_key) > 255 THEN
        RAISE EXCEPTION 'routing_key length cannot exceed 255 characters, got % characters', length(routing_key);
    ELSIF routing_key !~ '^[a-zA-Z0-9._-]+$' THEN
        RAISE EXCEPTION 'routing_key contains invalid characters. Only alphanumeric, dots, hyphens, and underscores are allowed. Got: %',
            routing_key;
    ELSIF left(routing_key, 1) = '.' THEN
        RAISE EXCEPTION 'routing_key cannot start with a dot. Got: %', routing_key;
    ELSIF right(routing_key, 1) = '.' THEN
        RAISE EXCEPTION 'routing_key cannot end with a dot. Got: %', routing_key;
    ELSIF strpos(routing_key, '..') > 0 THEN
        RAISE EXCEPTION 'routing_key cannot contain consecutive dots. Got: %', routing_key;
    END IF;
    RETURN true;
END $$;

CREATE OR REPLACE FUNCTION pgmq.validate_topic_pattern(pattern text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF pattern IS NULL OR pattern = '' THEN
        RAISE EXCEPTION 'pattern cannot be NULL or empty';
    ELSIF length(pattern) > 255 THEN
        RAISE EXCEPTION 'pattern length cannot exceed 255 characters, got % characters', length(pattern);
    ELSIF pattern !~ '^[a-zA-Z0-9._*#-]+$' THEN
        RAISE EXCEPTION 'pattern contains invalid characters. Only alphanumeric, dots, hyphens, underscores, *, and # are allowed. Got: %',
            pattern;
    ELSIF left(pattern, 1) = '.' THEN
        RAISE EXCEPTION 'pattern cannot start with a dot. Got: %', pattern;
    ELSIF right(pattern, 1) = '.' THEN
        RAISE EXCEPTION 'pattern cannot end with a dot. Got: %', pattern;
    ELSIF strpos(pattern, '..') > 0 THEN
        RAISE EXCEPTION 'pattern cannot contain consecutive dots. Got: %', pattern;
    ELSIF strpos(pattern, '**') > 0 THEN
        RAISE EXCEPTION 'pattern cannot contain consecutive stars (**). Use # for multi-segment matching. Got: %', pattern;
    ELSIF strpos(pattern, '##') > 0 THEN
        RAISE EXCEPTION 'pattern cannot contain consecutive hashes (##). A single # already matches zero or more segments. Got: %',
            pattern;
    ELSIF strpos(pattern, '*#') > 0 OR strpos(pattern, '#*') > 0 THEN
        RAISE EXCEPTION 'pattern cannot contain adjacent wildcards (*# or #*). Separate wildcards with dots. Got: %', pattern;
    END IF;
    RETURN true;
END $$;

CREATE OR REPLACE FUNCTION pgmq.bind_topic(pattern text, queue_name text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    q conveyor.queues;
BEGIN
    PERFORM pgmq.validate_topic_pattern(pattern);
    IF queue_name IS NULL OR queue_name = '' THEN
        RAISE EXCEPTION 'queue_name cannot be NULL or empty';
    END IF;
    SELECT * INTO q FROM conveyor.queues x WHERE x.name = pgmq._find(bind_topic.queue_name);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'Queue "%" does not exist. Create the queue first using pgmq.create()', queue_name;
    END IF;
    INSERT INTO pgmq.topic_bindings (pattern, queue_name, queue_id) VALUES (pattern, q.name, q.id)
    ON CONFLICT ON CONSTRAINT topic_bindings_unique_pattern_queue DO NOTHING;
END $$;

CREATE OR REPLACE FUNCTION pgmq.unbind_topic(pattern text, queue_name text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    IF pattern IS NULL OR pattern = '' THEN
        RAISE EXCEPTION 'pattern cannot be NULL or empty';
    END IF;
    IF queue_name IS NULL OR queue_name = '' THEN
        RAISE EXCEPTION 'queue_name cannot be NULL or empty';
    END IF;
    DELETE FROM pgmq.topic_bindings b
     WHERE b.pattern = unbind_topic.pattern
       AND b.queue_name = coalesce(pgmq._find(unbind_topic.queue_name), unbind_topic.queue_name);
    RETURN FOUND;
END $$;

CREATE OR REPLACE FUNCTION pgmq.list_topic_bindings()
RETURNS TABLE (pattern text, queue_name text, bound_at timestamptz, compiled_regex text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT b.pattern, b.queue_name, b.bound_at, b.compiled_regex FROM pgmq.topic_bindings b
     ORDER BY b.bound_at DESC, b.pattern, b.queue_name
$$;

CREATE OR REPLACE FUNCTION pgmq.list_topic_bindings(queue_name text)
RETURNS TABLE (pattern text, queue_name text, bound_at timestamptz, compiled_regex text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT b.pattern, b.queue_name, b.bound_at, b.compiled_regex FROM pgmq.topic_bindings b
     WHERE b.queue_name = list_topic_bindings.queue_name
     ORDER BY b.bound_at DESC, b.pattern
$$;

CREATE OR REPLACE FUNCTION pgmq.test_routing(routing_key text)
RETURNS TABLE (pattern text, queue_name text, compiled_regex text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    PERFORM pgmq.validate_routing_key(routing_key);
    RETURN QUERY SELECT b.pattern, b.queue_name, b.compiled_regex FROM pgmq.topic_bindings b
                  WHERE test_routing.routing_key ~ b.compiled_regex
                  ORDER BY b.pattern;
END $$;

-- The queues a routing key reaches, each once, by name.
CREATE OR REPLACE FUNCTION pgmq._routes(routing_key text) RETURNS SETOF text
LANGUAGE sql STABLE AS $$
    SELECT DISTINCT b.queue_name FROM pgmq.topic_bindings b WHERE routing_key ~ b.compiled_regex ORDER BY 1
$$;

-- One message to every matching queue (pgmq.send's path); how many queues got it.
CREATE OR REPLACE FUNCTION pgmq.send_topic(routing_key text, msg jsonb, headers jsonb, delay integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    target text;
    n integer := 0;
BEGIN
    PERFORM pgmq.validate_routing_key(routing_key);
    IF msg IS NULL THEN
        RAISE EXCEPTION 'msg cannot be NULL';
    END IF;
    IF delay < 0 THEN
        RAISE EXCEPTION 'delay cannot be negative, got: %', delay;
    END IF;
    FOR target IN SELECT pgmq._routes(routing_key) LOOP
        PERFORM pgmq._send(target, ARRAY[msg], ARRAY[headers], coalesce(delay, 0));
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;

CREATE OR REPLACE FUNCTION pgmq.send_topic(routing_key text, msg jsonb) RETURNS integer
LANGUAGE sql AS $$
    SELECT pgmq.send_topic(routing_key, msg, NULL, 0)
$$;

CREATE OR REPLACE FUNCTION pgmq.send_topic(routing_key text, msg jsonb, delay integer) RETURNS integer
LANGUAGE sql AS $$
    SELECT pgmq.send_topic(routing_key, msg, NULL, delay)
$$;

-- A batch to every matching queue: (queue, id) for each message sent.
CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], headers jsonb[], delay timestamptz)
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    target text;
BEGIN
    PERFORM pgmq.validate_routing_key(routing_key);
    PERFORM pgmq._validate_batch_params(msgs, headers);
    FOR target IN SELECT pgmq._routes(routing_key) LOOP
        RETURN QUERY SELECT target, s.id FROM pgmq._send(target, msgs, headers, pgmq._seconds(delay)) AS s(id);
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[])
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE sql AS $$
    SELECT * FROM pgmq.send_batch_topic(routing_key, msgs, NULL, clock_timestamp())
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], headers jsonb[])
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE sql AS $$
    SELECT * FROM pgmq.send_batch_topic(routing_key, msgs, headers, clock_timestamp())
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], delay integer)
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE sql AS $$
    SELECT * FROM pgmq.send_batch_topic(routing_key, msgs, NULL, clock_timestamp() + make_interval(secs => delay))
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], delay timestamptz)
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE sql AS $$
    SELECT * FROM pgmq.send_batch_topic(routing_key, msgs, NULL, delay)
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], headers jsonb[], delay integer)
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE sql AS $$
    SELECT * FROM pgmq.send_batch_topic(routing_key, msgs, headers, clock_timestamp() + make_interval(secs => delay))
$$;

DO $$
BEGIN
    GRANT SELECT ON pgmq.meta, pgmq.notify_insert_throttle, pgmq.topic_bindings TO conveyor_reader;
    GRANT EXECUTE ON FUNCTION
        pgmq._content_type(jsonb), pgmq.list_notify_insert_throttles(),
        pgmq.list_topic_bindings(), pgmq.list_topic_bindings(text), pgmq.test_routing(text),
        pgmq.validate_routing_key(text), pgmq.validate_topic_pattern(text), pgmq._topic_regex(text)
        TO conveyor_reader;
    GRANT EXECUTE ON FUNCTION
        pgmq._claim_matching(conveyor.queues, integer, integer, jsonb), pgmq._routes(text),
        pgmq._claim_round_robin(conveyor.queues, integer, integer),
        pgmq._read_grouped(text, integer, integer, integer, integer, text),
        pgmq.read_grouped(text, integer, integer), pgmq.read_grouped_with_poll(text, integer, integer, integer, integer),
        pgmq.read_grouped_rr(text, integer, integer),
        pgmq.read_grouped_rr_with_poll(text, integer, integer, integer, integer),
        pgmq.read_grouped_head(text, integer, integer),
        pgmq.read_grouped_head_with_poll(text, integer, integer, integer, integer),
        pgmq.send_topic(text, jsonb), pgmq.send_topic(text, jsonb, integer),
        pgmq.send_topic(text, jsonb, jsonb, integer),
        pgmq.send_batch_topic(text, jsonb[]), pgmq.send_batch_topic(text, jsonb[], jsonb[]),
        pgmq.send_batch_topic(text, jsonb[], integer), pgmq.send_batch_topic(text, jsonb[], timestamptz),
        pgmq.send_batch_topic(text, jsonb[], jsonb[], integer),
        pgmq.send_batch_topic(text, jsonb[], jsonb[], timestamptz)
        TO conveyor_writer;
    GRANT EXECUTE ON FUNCTION
        pgmq.acquire_queue_lock(text), pgmq.create_fifo_index(text), pgmq.create_fifo_indexes_all(),
        pgmq.convert_archive_partitioned(text, text, text, integer),
        pgmq.enable_notify_insert(text, integer), pgmq.disable_notify_insert(text),
        pgmq.update_notify_insert(text, integer), pgmq.bind_topic(text, text), pgmq.unbind_topic(text, text)
        TO conveyor_admin;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: roles missing, pgmq grants skipped (%)', SQLERRM;
END $$;

REVOKE ALL ON ALL ROUTINES IN SCHEMA pgmq FROM PUBLIC;
