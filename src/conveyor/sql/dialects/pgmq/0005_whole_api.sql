-- Conveyor's pgmq dialect, 0006: the rest of pgmq's SQL API (as the `pgmq` wheel 1.1.4
-- carries it), so that every method of the pinned Python client has a function to call:
--
--   read / read_with_poll with `conditional`   messages whose JSON contains the given
--                                              object (pgmq's `message @> conditional`)
--   read_grouped(_with_poll), read_grouped_rr(_with_poll), read_grouped_head(_with_poll)
--                                              pgmq's FIFO reads, on the engine's message
--                                              groups (x-pgmq-group is a message's group_id)
--   enable_notify_insert, disable_notify_insert, update_notify_insert,
--   list_notify_insert_throttles, notify_queue_listeners
--                                              pgmq's NOTIFY on insert: channel
--                                              pgmq.q_<queue>.INSERT, empty payload, at most
--                                              one per throttle interval, for every insert
--                                              into the queue whichever interface sends
--   send_topic, send_batch_topic, bind_topic, unbind_topic, list_topic_bindings,
--   test_routing, validate_routing_key, validate_topic_pattern
--                                              pgmq's topic routing: bindings of patterns to
--                                              queues, a send to every queue whose pattern
--                                              matches the routing key (pgmq's own matching)
--   convert_archive_partitioned, create_fifo_index, create_fifo_indexes_all,
--   acquire_queue_lock, the pgmq.meta view    storage and locking calls, answered as far
--                                              as they mean something here (below)
--   a SQL NULL message                         read back as SQL NULL (pgmq stores it as is),
--                                              not as JSON null
--   create_partitioned with an interval under a minute
--                                              refused in pg_partman's words (P0001)
--
-- What differs from pgmq, and why, is in docs/dialects/pgmq.md; tests/dialects/test_pgmq_api.py compares every function with
-- the real pgmq's SQL.
--
-- State: the notify throttles and the topic bindings are settings only pgmq has; they are
-- kept in pgmq.notify_insert_throttle and pgmq.topic_bindings (pgmq's names and columns,
-- plus the Conveyor queue's id, whose drop removes its rows), the only tables the dialect
-- owns. Messages stay in the engine's tables.

------------------------------------------------------------------------------------------
-- SQL NULL messages
------------------------------------------------------------------------------------------

-- pgmq stores a NULL message as NULL. Conveyor's bodies are text and never NULL, so a NULL
-- message is stored as the JSON text 'null' (what SQS and REST readers see) with a content
-- type of its own, and read back here as NULL.
CREATE OR REPLACE FUNCTION pgmq._message(body text, content_type text) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN content_type = 'application/json' THEN body::jsonb
                WHEN content_type = 'application/json; pgmq=null' THEN NULL
                ELSE pgmq._text_json(body) END
$$;

CREATE FUNCTION pgmq._content_type(msg jsonb) RETURNS text
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

------------------------------------------------------------------------------------------
-- Conditional reads
------------------------------------------------------------------------------------------

-- The engine's claim (conveyor._claim: oldest visible first, FOR UPDATE SKIP LOCKED,
-- receive counts, redrive past max_receive_count) restricted to the messages whose JSON
-- contains `conditional`. The engine's receive has no body filter, so this one statement
-- is the dialect's; it follows _claim line for line otherwise (keep them together). Like
-- pgmq's, it reads every visible message of the queue to test it.
CREATE FUNCTION pgmq._claim_matching(q conveyor.queues, vt_seconds integer, qty integer, conditional jsonb)
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

------------------------------------------------------------------------------------------
-- Grouped (FIFO) reads
------------------------------------------------------------------------------------------

-- pgmq's three ways of filling a batch from message groups (the x-pgmq-group header,
-- which the dialect stores as the message's group_id; messages without one form one group),
-- mapped onto the engine's grouped claims, which decide which groups a reader may take
-- (those with nothing in flight, under the engine's per-group lock):
--   sqs    read_grouped: as many messages as possible from the oldest group, then the next
--          (conveyor._claim_grouped, whose order this is);
--   head   read_grouped_head: the first message of each of up to qty groups (the engine's
--          claim of one message, repeated: each takes the oldest group still free);
--   rr     read_grouped_rr: layer by layer, the first message of every group, then the
--          second, ... (pgmq._claim_round_robin below: the engine's choice of groups, then
--          pgmq's order within them).
-- A Conveyor FIFO queue (.fifo, made through SQS or REST) is read in its own group order
-- (conveyor._claim_fifo) whichever of the three is asked for.

-- The engine's group choice (conveyor._claim_grouped's, kept in step with it) with pgmq's
-- round-robin order over the chosen groups' visible messages.
CREATE FUNCTION pgmq._claim_round_robin(q conveyor.queues, vt_seconds integer, qty integer)
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
CREATE FUNCTION pgmq._read_grouped(queue_name text, vt integer, qty integer, wait_seconds integer,
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

CREATE FUNCTION pgmq.read_grouped(queue_name text, vt integer, qty integer) RETURNS SETOF pgmq.message_record
LANGUAGE sql AS $$
    SELECT * FROM pgmq._read_grouped(queue_name, vt, qty, 0, 100, 'sqs')
$$;

CREATE FUNCTION pgmq.read_grouped_with_poll(queue_name text, vt integer, qty integer, max_poll_seconds integer DEFAULT 5,
                                            poll_interval_ms integer DEFAULT 100) RETURNS SETOF pgmq.message_record
LANGUAGE sql AS $$
    SELECT * FROM pgmq._read_grouped(queue_name, vt, qty, max_poll_seconds, poll_interval_ms, 'sqs')
$$;

CREATE FUNCTION pgmq.read_grouped_rr(queue_name text, vt integer, qty integer) RETURNS SETOF pgmq.message_record
LANGUAGE sql AS $$
    SELECT * FROM pgmq._read_grouped(queue_name, vt, qty, 0, 100, 'rr')
$$;

CREATE FUNCTION pgmq.read_grouped_rr_with_poll(queue_name text, vt integer, qty integer, max_poll_seconds integer DEFAULT 5,
                                               poll_interval_ms integer DEFAULT 100) RETURNS SETOF pgmq.message_record
LANGUAGE sql AS $$
    SELECT * FROM pgmq._read_grouped(queue_name, vt, qty, max_poll_seconds, poll_interval_ms, 'rr')
$$;

CREATE FUNCTION pgmq.read_grouped_head(queue_name text, vt integer, qty integer) RETURNS SETOF pgmq.message_record
LANGUAGE sql AS $$
    SELECT * FROM pgmq._read_grouped(queue_name, vt, qty, 0, 100, 'head')
$$;

CREATE FUNCTION pgmq.read_grouped_head_with_poll(queue_name text, vt integer, qty integer,
                                                 max_poll_seconds integer DEFAULT 5, poll_interval_ms integer DEFAULT 100)
RETURNS SETOF pgmq.message_record
LANGUAGE sql AS $$
    SELECT * FROM pgmq._read_grouped(queue_name, vt, qty, max_poll_seconds, poll_interval_ms, 'head')
$$;

------------------------------------------------------------------------------------------
-- Storage calls
------------------------------------------------------------------------------------------

-- pgmq's queue table, for code that reads it: every Conveyor queue.
CREATE VIEW pgmq.meta AS
SELECT q.name::varchar AS queue_name, q.storage = 'partitioned' AS is_partitioned,
       q.storage = 'unlogged' AS is_unlogged, q.created_at
  FROM conveyor.queues q;

-- pgmq's lock around queue creation (the same advisory lock key).
CREATE FUNCTION pgmq.acquire_queue_lock(queue_name text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('pgmq.queue_' || queue_name));
END $$;

-- pgmq's GIN index on headers, for its grouped reads: Conveyor keeps a message's group in
-- its own column (x-pgmq-group becomes group_id) with the engine's indexes, so there is
-- nothing to create. As in pgmq, a queue that does not exist is an error.
CREATE FUNCTION pgmq.create_fifo_index(queue_name text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgmq._q(queue_name);
END $$;

CREATE FUNCTION pgmq.create_fifo_indexes_all() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RETURN;
END $$;

-- pgmq turns a queue's archive table into a partitioned one (pg_partman). A Conveyor
-- queue's archive is stored as its queue is, chosen when the queue is created: a
-- partitioned queue's archive is partitioned already (pgmq's NOTICE for that case); the
-- archive of any other queue cannot become partitioned on its own.
CREATE FUNCTION pgmq.convert_archive_partitioned(table_name text, partition_interval text DEFAULT '10000',
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

------------------------------------------------------------------------------------------
-- NOTIFY on insert
------------------------------------------------------------------------------------------

-- pgmq's table, with the queue's id: dropping the queue (through any interface) drops its
-- row. Unlogged, as pgmq's.
CREATE UNLOGGED TABLE pgmq.notify_insert_throttle (
    queue_name           varchar NOT NULL UNIQUE,
    throttle_interval_ms integer NOT NULL DEFAULT 0,
    last_notified_at     timestamptz NOT NULL DEFAULT to_timestamp(0),
    queue_id             bigint NOT NULL UNIQUE REFERENCES conveyor.queues (id) ON DELETE CASCADE
);

-- For each message inserted into a queue with notifications on: NOTIFY on pgmq's channel
-- pgmq.q_<queue>.INSERT with an empty payload, unless one was sent less than the queue's
-- throttle interval ago (then nothing: as in pgmq, listeners that need every message poll
-- as well). The throttle row is updated as pgmq updates it, so concurrent senders to one
-- queue take turns on it until they commit, as in pgmq.
CREATE FUNCTION pgmq.notify_queue_listeners() RETURNS trigger
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
CREATE FUNCTION pgmq._notify_trigger() RETURNS void
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

CREATE FUNCTION pgmq.disable_notify_insert(queue_name text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    q conveyor.queues := pgmq._q(queue_name);
BEGIN
    DELETE FROM pgmq.notify_insert_throttle t WHERE t.queue_id = q.id;
    IF FOUND THEN
        PERFORM pgmq._notify_trigger();
    END IF;
END $$;

CREATE FUNCTION pgmq.enable_notify_insert(queue_name text, throttle_interval_ms integer DEFAULT 250)
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

CREATE FUNCTION pgmq.update_notify_insert(queue_name text, throttle_interval_ms integer) RETURNS void
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

CREATE FUNCTION pgmq.list_notify_insert_throttles()
RETURNS TABLE (queue_name text, throttle_interval_ms integer, last_notified_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT t.queue_name, t.throttle_interval_ms, t.last_notified_at
      FROM pgmq.notify_insert_throttle t
     ORDER BY t.queue_name
$$;

------------------------------------------------------------------------------------------
-- Topics
------------------------------------------------------------------------------------------

-- pgmq's routing rules, in its words.
CREATE FUNCTION pgmq.validate_routing_key(routing_key text) RETURNS boolean
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

CREATE FUNCTION pgmq.validate_topic_pattern(pattern text) RETURNS boolean
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

-- A pattern as pgmq matches it: anchored, '.' literal, '*' one or more characters other
-- than a dot, '#' any characters. (pgmq's rule, kept as is: it differs from Conveyor's
-- own topic patterns, where '#' stands for whole segments; docs/dialects/pgmq.md.)
CREATE FUNCTION pgmq._topic_regex(pattern text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT '^' || replace(replace(replace(pattern, '.', '\.'), '*', '[^.]+'), '#', '.*') || '$'
$$;

-- pgmq's bindings, with the queue's id: dropping the queue drops its bindings.
CREATE TABLE pgmq.topic_bindings (
    pattern        text NOT NULL,
    queue_name     text NOT NULL,
    bound_at       timestamptz NOT NULL DEFAULT now(),
    compiled_regex text GENERATED ALWAYS AS (pgmq._topic_regex(pattern)) STORED,
    queue_id       bigint NOT NULL REFERENCES conveyor.queues (id) ON DELETE CASCADE,
    CONSTRAINT topic_bindings_unique_pattern_queue UNIQUE (pattern, queue_name)
);
CREATE INDEX ON pgmq.topic_bindings (queue_id);

CREATE FUNCTION pgmq.bind_topic(pattern text, queue_name text) RETURNS void
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

CREATE FUNCTION pgmq.unbind_topic(pattern text, queue_name text) RETURNS boolean
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

CREATE FUNCTION pgmq.list_topic_bindings()
RETURNS TABLE (pattern text, queue_name text, bound_at timestamptz, compiled_regex text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT b.pattern, b.queue_name, b.bound_at, b.compiled_regex FROM pgmq.topic_bindings b
     ORDER BY b.bound_at DESC, b.pattern, b.queue_name
$$;

CREATE FUNCTION pgmq.list_topic_bindings(queue_name text)
RETURNS TABLE (pattern text, queue_name text, bound_at timestamptz, compiled_regex text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT b.pattern, b.queue_name, b.bound_at, b.compiled_regex FROM pgmq.topic_bindings b
     WHERE b.queue_name = list_topic_bindings.queue_name
     ORDER BY b.bound_at DESC, b.pattern
$$;

CREATE FUNCTION pgmq.test_routing(routing_key text)
RETURNS TABLE (pattern text, queue_name text, compiled_regex text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    PERFORM pgmq.validate_routing_key(routing_key);
    RETURN QUERY SELECT b.pattern, b.queue_name, b.compiled_regex FROM pgmq.topic_bindings b
                  WHERE test_routing.routing_key ~ b.compiled_regex
                  ORDER BY b.pattern;
END $$;

-- The queues a routing key reaches, each once, by name.
CREATE FUNCTION pgmq._routes(routing_key text) RETURNS SETOF text
LANGUAGE sql STABLE AS $$
    SELECT DISTINCT b.queue_name FROM pgmq.topic_bindings b WHERE routing_key ~ b.compiled_regex ORDER BY 1
$$;

-- One message to every matching queue (pgmq.send's path); how many queues got it.
CREATE FUNCTION pgmq.send_topic(routing_key text, msg jsonb, headers jsonb, delay integer) RETURNS integer
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

CREATE FUNCTION pgmq.send_topic(routing_key text, msg jsonb) RETURNS integer
LANGUAGE sql AS $$
    SELECT pgmq.send_topic(routing_key, msg, NULL, 0)
$$;

CREATE FUNCTION pgmq.send_topic(routing_key text, msg jsonb, delay integer) RETURNS integer
LANGUAGE sql AS $$
    SELECT pgmq.send_topic(routing_key, msg, NULL, delay)
$$;

-- A batch to every matching queue: (queue, id) for each message sent.
CREATE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], headers jsonb[], delay timestamptz)
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

CREATE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[])
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE sql AS $$
    SELECT * FROM pgmq.send_batch_topic(routing_key, msgs, NULL, clock_timestamp())
$$;

CREATE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], headers jsonb[])
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE sql AS $$
    SELECT * FROM pgmq.send_batch_topic(routing_key, msgs, headers, clock_timestamp())
$$;

CREATE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], delay integer)
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE sql AS $$
    SELECT * FROM pgmq.send_batch_topic(routing_key, msgs, NULL, clock_timestamp() + make_interval(secs => delay))
$$;

CREATE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], delay timestamptz)
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE sql AS $$
    SELECT * FROM pgmq.send_batch_topic(routing_key, msgs, NULL, delay)
$$;

CREATE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], headers jsonb[], delay integer)
RETURNS TABLE (queue_name text, msg_id bigint)
LANGUAGE sql AS $$
    SELECT * FROM pgmq.send_batch_topic(routing_key, msgs, headers, clock_timestamp() + make_interval(secs => delay))
$$;

------------------------------------------------------------------------------------------
-- Plans and roles
------------------------------------------------------------------------------------------

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

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgmq FROM PUBLIC;
REVOKE ALL ON pgmq.notify_insert_throttle, pgmq.topic_bindings FROM PUBLIC;

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
