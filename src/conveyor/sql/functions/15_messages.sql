-- Messages of standard and FIFO queues (core/messages.py): send, claim, receive, delete, archive, visibility.
--
-- Current definitions, re-applied whenever a file of this folder changes (docs/architecture.md,
-- "Where each SQL function's current definition lives"). Edit a function here; tables, types,
-- indexes, data and DROPs go in a new numbered migration.

CREATE OR REPLACE FUNCTION conveyor._wake(q conveyor.queues, n integer) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF q.listened_until > now() THEN
        PERFORM pg_notify('conveyor_queue', n || ' ' || q.name);
    END IF;
END $$;

-- Sends a batch given as a JSON array of message objects (see _send); the server's path.
CREATE OR REPLACE FUNCTION conveyor.message_send_json(queue_name text, messages jsonb)
RETURNS SETOF conveyor.sent
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
    n bigint;
BEGIN
    RETURN QUERY SELECT * FROM conveyor._send(q, messages);
    GET DIAGNOSTICS n = ROW_COUNT;
    PERFORM conveyor._wake(q, n::integer);
END $$;

-- generic plans (migration 0014; see _message_plans)
ALTER FUNCTION conveyor.message_send_json(text,jsonb) SET plan_cache_mode = force_generic_plan;

-- Sends a batch given as parallel arrays (handy from psql); ids in input order.
CREATE OR REPLACE FUNCTION conveyor.message_send_batch(queue_name text, bodies text[],
                                            headers jsonb[] DEFAULT NULL,
                                            delays integer[] DEFAULT NULL,
                                            content_types text[] DEFAULT NULL,
                                            group_ids text[] DEFAULT NULL,
                                            dedup_ids text[] DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    n integer := coalesce(cardinality(bodies), 0);
    messages jsonb;
BEGIN
    IF (headers IS NOT NULL AND cardinality(headers) <> n) OR (delays IS NOT NULL AND cardinality(delays) <> n)
       OR (content_types IS NOT NULL AND cardinality(content_types) <> n)
       OR (group_ids IS NOT NULL AND cardinality(group_ids) <> n)
       OR (dedup_ids IS NOT NULL AND cardinality(dedup_ids) <> n) THEN
        PERFORM conveyor._raise('CVV01', 'message arrays must all have one element per message');
    END IF;
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'body', bodies[i], 'headers', headers[i], 'delay', delays[i],
               'content_type', content_types[i], 'group_id', group_ids[i], 'dedup_id', dedup_ids[i])
             ORDER BY i), '[]')
      INTO messages
      FROM generate_series(1, n) AS i;
    RETURN QUERY SELECT s.id FROM conveyor.message_send_json(queue_name, messages) s;
END $$;

-- generic plans (migration 0014; see _message_plans)
ALTER FUNCTION conveyor.message_send_batch(text,text[],jsonb[],integer[],text[],text[],text[]) SET plan_cache_mode = force_generic_plan;

CREATE OR REPLACE FUNCTION conveyor.message_send(queue_name text, body text, headers jsonb DEFAULT NULL,
                                      delay integer DEFAULT NULL, content_type text DEFAULT NULL,
                                      group_id text DEFAULT NULL, dedup_id text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
    mid bigint;
BEGIN
    SELECT s.id INTO mid FROM conveyor._send(q, jsonb_build_array(jsonb_build_object(
               'body', body, 'headers', headers, 'delay', delay, 'content_type', content_type,
               'group_id', group_id, 'dedup_id', dedup_id))) s;
    PERFORM conveyor._wake(q, 1);
    RETURN mid;
END $$;

-- generic plans (migration 0014; see _message_plans)
ALTER FUNCTION conveyor.message_send(text,text,jsonb,integer,text,text,text) SET plan_cache_mode = force_generic_plan;

-- Receives up to qty messages and hides them for vt seconds (the queue's visibility
-- timeout when NULL). With wait_seconds > 0, polls inside this call until a message
-- arrives or the time is up (for SQL users; the server long-polls without holding a
-- connection, see docs/architecture.md). The rows come back in a defined order: a FIFO
-- claim's (group by group), a standard queue's by id.
CREATE OR REPLACE FUNCTION conveyor.message_receive(queue_name text, vt integer DEFAULT NULL, qty integer DEFAULT 1,
                                                    wait_seconds integer DEFAULT 0, poll_interval_ms integer DEFAULT 100)
RETURNS SETOF conveyor.messages
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
    vt_seconds integer := coalesce(vt, q.visibility_timeout);
    deadline timestamptz;
BEGIN
    IF vt_seconds < 0 OR vt_seconds > 43200 THEN
        PERFORM conveyor._raise('CVV01', format('vt must be from 0 to 43200 seconds, got %s', vt_seconds));
    END IF;
    IF qty IS NULL OR qty < 1 OR qty > 1000 THEN
        PERFORM conveyor._raise('CVV01', format('qty must be from 1 to 1000, got %s', qty));
    END IF;
    -- bounded: the call holds its snapshot (and so vacuum's horizon) while it waits
    IF wait_seconds IS NULL OR wait_seconds < 0 OR wait_seconds > 60 THEN
        PERFORM conveyor._raise('CVV01', format('wait_seconds must be from 0 to 60, got %s', wait_seconds));
    END IF;
    deadline := clock_timestamp() + make_interval(secs => wait_seconds);
    LOOP
        IF q.fifo THEN
            RETURN QUERY SELECT * FROM conveyor._claim_fifo(q, vt_seconds, qty);
        ELSE
            RETURN QUERY SELECT * FROM conveyor._claim(q, vt_seconds, qty) c ORDER BY c.id;
        END IF;
        IF FOUND OR clock_timestamp() >= deadline THEN
            RETURN;
        END IF;
        PERFORM pg_sleep(least(greatest(poll_interval_ms, 10), 10000) / 1000.0);
    END LOOP;
END $$;

-- generic plans (migration 0014; see _message_plans)
ALTER FUNCTION conveyor.message_receive(text,integer,integer,integer,integer) SET plan_cache_mode = force_generic_plan;

-- message_receive for a call that is its own transaction (the server's receives, one
-- statement in autocommit): a claim on a standard queue commits without waiting for its
-- WAL to reach the disk. Lost in a crash, the claim (visibility, receive count) is undone:
-- the messages are visible again, as when their visibility timeout ends, and the next
-- durable commit (a delete) flushes every earlier record with its own. A FIFO queue's
-- claim flushes: it holds the group for one consumer (docs/architecture.md, "Durability of
-- a receive"). Never polls: the server waits with LISTEN.
CREATE OR REPLACE FUNCTION conveyor.message_receive_lazy(queue_name text, vt integer DEFAULT NULL, qty integer DEFAULT 1)
RETURNS SETOF conveyor.messages
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    RETURN QUERY SELECT * FROM conveyor.message_receive(queue_name, vt, qty);
    IF FOUND AND NOT (conveyor._queue(queue_name)).fifo THEN
        -- (transaction-local: it outlives this function's own settings, not the commit)
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
END $$;

ALTER FUNCTION conveyor.message_receive_lazy(text,integer,integer) SET plan_cache_mode = force_generic_plan;

-- Looks at messages without claiming them, in id order, whatever their visibility.
CREATE OR REPLACE FUNCTION conveyor.message_peek(queue_name text, qty integer DEFAULT 10, after_id bigint DEFAULT 0)
RETURNS SETOF conveyor.messages
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
BEGIN
    RETURN QUERY SELECT * FROM conveyor.messages m
                  WHERE m.queue_id = q.id AND m.id > coalesce(after_id, 0)
                  ORDER BY m.id LIMIT least(greatest(qty, 1), 10000);
END $$;

-- generic plans (migration 0014; see _message_plans)
ALTER FUNCTION conveyor.message_peek(text,integer,bigint) SET plan_cache_mode = force_generic_plan;

-- Deletes messages; returns the ids that existed.
CREATE OR REPLACE FUNCTION conveyor.message_delete(queue_name text, ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
BEGIN
    RETURN QUERY DELETE FROM conveyor.messages m WHERE m.queue_id = q.id AND m.id = ANY (ids) RETURNING m.id;
END $$;

-- generic plans (migration 0014; see _message_plans)
ALTER FUNCTION conveyor.message_delete(text,bigint[]) SET plan_cache_mode = force_generic_plan;

CREATE OR REPLACE FUNCTION conveyor.message_delete(queue_name text, id bigint) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT EXISTS (SELECT 1 FROM conveyor.message_delete(queue_name, ARRAY[id]))
$$;

-- generic plans (migration 0014; see _message_plans)
ALTER FUNCTION conveyor.message_delete(text,bigint) SET plan_cache_mode = force_generic_plan;

-- Moves messages to the archive as completed; returns the ids that existed.
CREATE OR REPLACE FUNCTION conveyor.message_archive(queue_name text, ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
BEGIN
    RETURN QUERY
    WITH moved AS (
        DELETE FROM conveyor.messages m WHERE m.queue_id = q.id AND m.id = ANY (ids) RETURNING m.*
    )
    INSERT INTO conveyor.archive AS a (queue_id, id, sent_at, receive_count, first_received_at, body,
                                       content_type, headers, group_id, dedup_id, source_queue_id,
                                       message_uuid, sender_id, system_attributes, outcome)
    SELECT moved.queue_id, moved.id, moved.sent_at, moved.receive_count, moved.first_received_at,
           moved.body, moved.content_type, moved.headers, moved.group_id, moved.dedup_id,
           moved.source_queue_id, moved.message_uuid, moved.sender_id, moved.system_attributes,
           'completed'
      FROM moved
    RETURNING a.id;
END $$;

-- generic plans (migration 0014; see _message_plans)
ALTER FUNCTION conveyor.message_archive(text,bigint[]) SET plan_cache_mode = force_generic_plan;

CREATE OR REPLACE FUNCTION conveyor.message_archive(queue_name text, id bigint) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT EXISTS (SELECT 1 FROM conveyor.message_archive(queue_name, ARRAY[id]))
$$;

-- generic plans (migration 0014; see _message_plans)
ALTER FUNCTION conveyor.message_archive(text,bigint) SET plan_cache_mode = force_generic_plan;

-- Fails a message on purpose (hq): to the dead-letter queue if the queue has one, else
-- to the archive as failed with the reason. Returns false if the message did not exist.
CREATE OR REPLACE FUNCTION conveyor.message_fail(queue_name text, id bigint, reason text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
BEGIN
    PERFORM 1 FROM conveyor.messages m WHERE m.queue_id = q.id AND m.id = message_fail.id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM conveyor._dead_letter(q, ARRAY[message_fail.id], coalesce(reason, 'failed by consumer'));
    RETURN true;
END $$;

-- generic plans (migration 0014; see _message_plans)
ALTER FUNCTION conveyor.message_fail(text,bigint,text) SET plan_cache_mode = force_generic_plan;

-- Changes the visibility timeout of messages to now + vt seconds (pgmq's set_vt).
-- With in_flight_only, only messages currently received and invisible change (SQS's
-- ChangeMessageVisibility); others are left alone and not returned.
CREATE OR REPLACE FUNCTION conveyor.message_set_vt(queue_name text, ids bigint[], vt integer, in_flight_only boolean DEFAULT false)
RETURNS SETOF conveyor.messages
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
    ts timestamptz := clock_timestamp();
BEGIN
    IF vt IS NULL OR vt < 0 OR vt > 43200 THEN
        PERFORM conveyor._raise('CVV01', format('vt must be from 0 to 43200 seconds, got %s', vt));
    END IF;
    RETURN QUERY
    UPDATE conveyor.messages m SET vt = ts + make_interval(secs => message_set_vt.vt)
     WHERE m.queue_id = q.id AND m.id = ANY (ids)
       AND (NOT in_flight_only OR (m.receive_count > 0 AND m.vt > ts))
    RETURNING m.*;
END $$;

-- generic plans (migration 0014; see _message_plans)
ALTER FUNCTION conveyor.message_set_vt(text,bigint[],integer,boolean) SET plan_cache_mode = force_generic_plan;

CREATE OR REPLACE FUNCTION conveyor.message_set_vt(queue_name text, id bigint, vt integer, in_flight_only boolean DEFAULT false)
RETURNS SETOF conveyor.messages
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT * FROM conveyor.message_set_vt(queue_name, ARRAY[id], vt, in_flight_only)
$$;

-- generic plans (migration 0014; see _message_plans)
ALTER FUNCTION conveyor.message_set_vt(text,bigint,integer,boolean) SET plan_cache_mode = force_generic_plan;

-- A receive with SQS's ReceiveRequestAttemptId: the messages are recorded, and given again
-- to a retry of the same attempt, in the order the receive returned them.
CREATE OR REPLACE FUNCTION conveyor.message_receive_attempt(queue_name text, attempt_id text,
                                                            vt integer DEFAULT NULL, qty integer DEFAULT 1)
RETURNS SETOF conveyor.messages
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
    a conveyor.receive_attempts;
    vt_seconds integer := coalesce(vt, q.visibility_timeout);
    got conveyor.messages[];
BEGIN
    IF attempt_id IS NULL OR attempt_id !~ '^[!-~]{1,128}$' THEN
        PERFORM conveyor._raise('CVV01', 'an attempt id is 1 to 128 printable ASCII characters');
    END IF;
    DELETE FROM conveyor.receive_attempts r
     USING (SELECT x.queue_id, x.attempt_id FROM conveyor.receive_attempts x
             WHERE x.queue_id = q.id AND x.expires_at <= now() LIMIT 100) old
     WHERE r.queue_id = old.queue_id AND r.attempt_id = old.attempt_id;
    SELECT * INTO a FROM conveyor.receive_attempts r
     WHERE r.queue_id = q.id AND r.attempt_id = message_receive_attempt.attempt_id
     FOR UPDATE;
    IF FOUND AND (SELECT count(*) FROM conveyor.messages m
                    JOIN unnest(a.message_ids, a.receive_counts) AS x(id, rc)
                      ON m.queue_id = q.id AND m.id = x.id AND m.receive_count = x.rc)
                 = cardinality(a.message_ids) THEN
        -- the same messages again, their visibility timeout started anew
        RETURN QUERY
        WITH again AS (
            UPDATE conveyor.messages m SET vt = clock_timestamp() + make_interval(secs => vt_seconds)
             WHERE m.queue_id = q.id AND m.id = ANY (a.message_ids)
            RETURNING m.*
        )
        SELECT again.* FROM again ORDER BY array_position(a.message_ids, again.id);
        RETURN;
    END IF;
    got := ARRAY(SELECT c FROM conveyor.message_receive(queue_name, vt, qty) c);
    IF cardinality(got) > 0 THEN
        INSERT INTO conveyor.receive_attempts AS r (queue_id, attempt_id, message_ids, receive_counts, expires_at)
        SELECT q.id, message_receive_attempt.attempt_id, array_agg(g.id ORDER BY g.ordinality),
               array_agg(g.receive_count ORDER BY g.ordinality), now() + interval '5 minutes'
          FROM unnest(got) WITH ORDINALITY AS g
        ON CONFLICT ON CONSTRAINT receive_attempts_pkey DO UPDATE
           SET message_ids = excluded.message_ids, receive_counts = excluded.receive_counts,
               expires_at = excluded.expires_at;
        RETURN QUERY SELECT * FROM unnest(got);
    END IF;
END $$;

-- generic plans (migration 0014; see _message_plans)
ALTER FUNCTION conveyor.message_receive_attempt(text,text,integer,integer) SET plan_cache_mode = force_generic_plan;

-- Fails a message still at the given delivery (see the three-argument form).
CREATE OR REPLACE FUNCTION conveyor.message_fail(queue_name text, id bigint, reason text, receive_count integer)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
BEGIN
    PERFORM 1 FROM conveyor.messages m
     WHERE m.queue_id = q.id AND m.id = message_fail.id
       AND (message_fail.receive_count IS NULL OR m.receive_count = message_fail.receive_count)
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM conveyor._dead_letter(q, ARRAY[message_fail.id], coalesce(reason, 'failed by consumer'));
    RETURN true;
END $$;

-- generic plans (migration 0014; see _message_plans)
ALTER FUNCTION conveyor.message_fail(text,bigint,text,integer) SET plan_cache_mode = force_generic_plan;

-- Receives up to qty messages in group order and hides them for vt seconds (the queue's
-- visibility timeout when NULL): a standard queue's grouped claim comes back group by
-- group (the group of the oldest message first), each group's messages in order.
CREATE OR REPLACE FUNCTION conveyor.message_receive_fifo(queue_name text, vt integer DEFAULT NULL, qty integer DEFAULT 1)
RETURNS SETOF conveyor.messages
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
    vt_seconds integer := coalesce(vt, q.visibility_timeout);
BEGIN
    IF q.fifo THEN
        RETURN QUERY SELECT * FROM conveyor.message_receive(queue_name, vt, qty);
        RETURN;
    END IF;
    IF vt_seconds < 0 OR vt_seconds > 43200 THEN
        PERFORM conveyor._raise('CVV01', format('vt must be from 0 to 43200 seconds, got %s', vt_seconds));
    END IF;
    IF qty IS NULL OR qty < 1 OR qty > 1000 THEN
        PERFORM conveyor._raise('CVV01', format('qty must be from 1 to 1000, got %s', qty));
    END IF;
    RETURN QUERY SELECT * FROM conveyor._claim_grouped(q, vt_seconds, qty) c
                  ORDER BY min(c.id) OVER (PARTITION BY coalesce(c.group_id, '')), c.id;
END $$;

-- generic plans (migration 0014; see _message_plans)
ALTER FUNCTION conveyor.message_receive_fifo(text,integer,integer) SET plan_cache_mode = force_generic_plan;

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

-- generic plans (migration 0014; see _message_plans)
ALTER FUNCTION conveyor.message_pop(text,integer) SET plan_cache_mode = force_generic_plan;

CREATE OR REPLACE FUNCTION conveyor._message_uuid(seed text, id bigint) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (left(seed, 24)
            || lpad(to_hex((id # ('x' || right(seed, 12))::bit(48)::bigint) & 281474976710655), 12, '0'))::uuid
$$;

-- Inserts a statement's messages; each MessageId is made from the statement's seed and the
-- message's id (_message_uuid). The standard insert draws its ids in a subquery ordered by
-- input position (volatile expressions are evaluated after the sort), so that the UUID can
-- be made from the id. The deduplication window is keyed by _dedup_key (the message keeps
-- its deduplication id as given).
CREATE OR REPLACE FUNCTION conveyor._send(q conveyor.queues, messages jsonb) RETURNS SETOF conveyor.sent
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
    m record;
    mid bigint;
    muid uuid;
    did text;
    dkey text;
    ts timestamptz := now();
    seed text := gen_random_uuid()::text;
BEGIN
    IF messages IS NULL OR jsonb_typeof(messages) <> 'array' THEN
        PERFORM conveyor._raise('CVV01', 'messages must be a JSON array of message objects');
    END IF;
    n := jsonb_array_length(messages);
    IF n = 0 THEN
        PERFORM conveyor._raise('CVV01', 'no messages to send');
    END IF;
    IF n > 10000 THEN
        PERFORM conveyor._raise('CVV01', format('a batch holds at most 10000 messages, got %s', n));
    END IF;

    IF NOT q.fifo THEN
        -- a group id on a standard queue is kept (SQS fair queues) but orders nothing;
        -- ids are drawn in input order
        RETURN QUERY
        INSERT INTO conveyor.messages AS t (queue_id, id, vt, sent_at, body, content_type, headers,
                                            group_id, message_uuid, sender_id, system_attributes)
        SELECT q.id, s.id, ts + make_interval(secs => coalesce(s.delay, q.delay_seconds)), ts,
               s.body, s.content_type, s.headers, s.group_id,
               coalesce(s.message_uuid, conveyor._message_uuid(seed, s.id)), s.sender_id, s.system_attributes
          FROM (SELECT nextval(q.seq) AS id, x.*
                  FROM ROWS FROM (jsonb_to_recordset(messages)
                                  AS (body text, headers jsonb, delay integer, content_type text, group_id text,
                                      dedup_id text, message_uuid uuid, sender_id text, system_attributes jsonb))
                       WITH ORDINALITY AS x(body, headers, delay, content_type, group_id, dedup_id, message_uuid,
                                            sender_id, system_attributes, ord)
                 WHERE conveyor._message_ok(q, x.body, x.headers, x.delay, x.system_attributes, x.dedup_id)
                 ORDER BY x.ord) s
        RETURNING t.id, t.message_uuid;
        RETURN;
    END IF;

    FOR m IN SELECT * FROM ROWS FROM (jsonb_to_recordset(messages)
                                      AS (body text, headers jsonb, delay integer, content_type text,
                                          group_id text, dedup_id text, message_uuid uuid, sender_id text,
                                          system_attributes jsonb))
                           WITH ORDINALITY AS x(body, headers, delay, content_type, group_id, dedup_id,
                                                message_uuid, sender_id, system_attributes, ord)
             ORDER BY x.ord LOOP
        PERFORM conveyor._message_ok(q, m.body, m.headers, m.delay, m.system_attributes, NULL);
        IF m.group_id IS NULL OR m.group_id !~ '^[!-~]{1,128}$' THEN
            PERFORM conveyor._raise('CVV01', 'a FIFO message needs a group_id of 1 to 128 printable ASCII characters');
        END IF;
        IF m.delay IS NOT NULL AND m.delay <> 0 THEN
            PERFORM conveyor._raise('CVV01', 'FIFO queues take no per-message delay; set the queue''s delay_seconds instead');
        END IF;
        did := coalesce(m.dedup_id,
                        CASE WHEN q.content_based_deduplication THEN encode(sha256(convert_to(m.body, 'UTF8')), 'hex') END);
        IF did IS NULL THEN
            PERFORM conveyor._raise('CVV01', 'a FIFO message needs a dedup_id unless the queue has content_based_deduplication');
        END IF;
        IF did !~ '^[!-~]{1,128}$' THEN
            PERFORM conveyor._raise('CVV01', 'a dedup_id is 1 to 128 printable ASCII characters');
        END IF;
        dkey := conveyor._dedup_key(q, m.group_id, did);
        mid := nextval(q.seq);
        muid := coalesce(m.message_uuid, conveyor._message_uuid(seed, mid));
        INSERT INTO conveyor.dedup AS d (queue_id, dedup_id, message_id, message_uuid, expires_at)
        VALUES (q.id, dkey, mid, muid, ts + interval '5 minutes')
        ON CONFLICT (queue_id, dedup_id) DO UPDATE
           SET message_id = excluded.message_id, message_uuid = excluded.message_uuid,
               expires_at = excluded.expires_at
         WHERE d.expires_at <= ts
        RETURNING d.message_id INTO mid;
        IF mid IS NULL THEN
            -- a duplicate within the window: accepted, not stored again, answered as the first
            RETURN QUERY SELECT d.message_id, d.message_uuid
                           FROM conveyor.dedup d WHERE d.queue_id = q.id AND d.dedup_id = dkey;
            CONTINUE;
        END IF;
        -- DO UPDATE, not DO NOTHING: it locks the group row, so a concurrent clean-up
        -- cannot delete the group between this insert and the message's
        INSERT INTO conveyor.message_groups AS g (queue_id, group_id) VALUES (q.id, m.group_id)
        ON CONFLICT (queue_id, group_id) DO UPDATE SET group_id = excluded.group_id;
        INSERT INTO conveyor.messages (queue_id, id, vt, sent_at, body, content_type, headers, group_id,
                                       dedup_id, message_uuid, sender_id, system_attributes)
        VALUES (q.id, mid, ts + make_interval(secs => q.delay_seconds), ts, m.body, m.content_type,
                m.headers, m.group_id, did, muid, m.sender_id, m.system_attributes);
        RETURN NEXT ROW(mid, muid)::conveyor.sent;
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION conveyor._receive_limit_reason(max_receive_count integer) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format('reached max_receive_count (%s %s)', max_receive_count,
                  CASE WHEN max_receive_count = 1 THEN 'receive' ELSE 'receives' END)
$$;

-- Claims up to qty visible messages of a standard queue, oldest visible first.
CREATE OR REPLACE FUNCTION conveyor._claim(q conveyor.queues, vt_seconds integer, qty integer)
RETURNS SETOF conveyor.messages
LANGUAGE plpgsql AS $$
DECLARE
    ts timestamptz := clock_timestamp();
    wanted integer := qty;
    taken bigint[] := '{}';
    picked bigint[];
    expired bigint[];
    n integer;
BEGIN
    IF q.max_receive_count IS NULL THEN
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
        RETURN;
    END IF;
    FOR i IN 1 .. 10 LOOP  -- at most ten picks (above)
        -- the candidates, locked once: the same set is split and claimed
        SELECT array_agg(c.id) FILTER (WHERE c.receive_count < q.max_receive_count),
               array_agg(c.id) FILTER (WHERE c.receive_count >= q.max_receive_count)
          INTO picked, expired
          FROM (SELECT m.id, m.receive_count FROM conveyor.messages m
                 WHERE m.queue_id = q.id AND m.vt <= ts AND m.id <> ALL (taken)
                 ORDER BY m.vt, m.id LIMIT wanted
                 FOR UPDATE SKIP LOCKED) c;
        IF expired IS NOT NULL THEN
            PERFORM conveyor._dead_letter(q, expired, conveyor._receive_limit_reason(q.max_receive_count));
        END IF;
        IF picked IS NOT NULL THEN
            RETURN QUERY
            UPDATE conveyor.messages m
               SET vt = ts + make_interval(secs => vt_seconds),
                   receive_count = m.receive_count + 1,
                   first_received_at = coalesce(m.first_received_at, ts)
             WHERE m.queue_id = q.id AND m.id = ANY (picked)
            RETURNING m.*;
            GET DIAGNOSTICS n = ROW_COUNT;
            wanted := wanted - n;
            taken := taken || picked;  -- claimed with vt 0, they are visible again
        END IF;
        EXIT WHEN expired IS NULL OR wanted <= 0;
    END LOOP;
END $$;

-- Deletes the messages still at the given deliveries; returns the ids deleted.
CREATE OR REPLACE FUNCTION conveyor.message_delete(queue_name text, ids bigint[], receive_counts integer[])
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
BEGIN
    PERFORM conveyor._deliveries_check(ids, receive_counts);
    RETURN QUERY
    DELETE FROM conveyor.messages m
     USING unnest(ids, receive_counts) AS d(id, rc)
     WHERE m.queue_id = q.id AND m.id = ANY (ids)
       AND m.id = d.id AND (d.rc IS NULL OR m.receive_count = d.rc)
    RETURNING m.id;
END $$;

-- Moves the messages still at the given deliveries to the archive as completed.
CREATE OR REPLACE FUNCTION conveyor.message_archive(queue_name text, ids bigint[], receive_counts integer[])
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
BEGIN
    PERFORM conveyor._deliveries_check(ids, receive_counts);
    RETURN QUERY SELECT * FROM conveyor.message_archive(queue_name, ARRAY(
        SELECT m.id FROM conveyor.messages m, unnest(ids, receive_counts) AS d(id, rc)
         WHERE m.queue_id = q.id AND m.id = ANY (ids)
           AND m.id = d.id AND (d.rc IS NULL OR m.receive_count = d.rc)
           FOR UPDATE OF m));
END $$;

-- Changes the visibility timeout of the messages still at the given deliveries (and, with
-- in_flight_only, still invisible); returns those changed.
CREATE OR REPLACE FUNCTION conveyor.message_set_vt(queue_name text, ids bigint[], receive_counts integer[], vt integer,
                                                   in_flight_only boolean DEFAULT false)
RETURNS SETOF conveyor.messages
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
    ts timestamptz := clock_timestamp();
BEGIN
    IF vt IS NULL OR vt < 0 OR vt > 43200 THEN
        PERFORM conveyor._raise('CVV01', format('vt must be from 0 to 43200 seconds, got %s', vt));
    END IF;
    PERFORM conveyor._deliveries_check(ids, receive_counts);
    RETURN QUERY
    UPDATE conveyor.messages m SET vt = ts + make_interval(secs => message_set_vt.vt)
      FROM unnest(ids, receive_counts) AS d(id, rc)
     WHERE m.queue_id = q.id AND m.id = ANY (ids)
       AND m.id = d.id AND (d.rc IS NULL OR m.receive_count = d.rc)
       AND (NOT in_flight_only OR (m.receive_count > 0 AND m.vt > ts))
    RETURNING m.*;
END $$;

-- ids and receive_counts pair up (unnest would pad the shorter with NULLs, which match any
-- delivery).
CREATE OR REPLACE FUNCTION conveyor._deliveries_check(ids bigint[], receive_counts integer[]) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF cardinality(ids) IS DISTINCT FROM cardinality(receive_counts) THEN
        PERFORM conveyor._raise('CVV01', format('ids and receive_counts must have the same length, got %s and %s',
                                                cardinality(ids), cardinality(receive_counts)));
    END IF;
END $$;

-- Claims up to qty messages of a FIFO queue, the group lock following visibility. The
-- oldest messages of a group are read by the group index in id order, a LIMIT at a time
-- (the claim runs without bitmap scans, a SET clause, so a generic plan without
-- statistics keeps the ordered index scan: tests/sql/test_plans.py). The groups: those whose first
-- message is visible, one probe of the group index each, oldest visibility first, their
-- rows locked (concurrent receivers skip them: one group, one receiver at a time). Then,
-- in a statement whose snapshot is taken after those locks were granted (a receiver that
-- just committed is seen), each chosen group's first messages in id order, cut at the
-- first that is not visible (reading at most the receive's qty per group, never the whole
-- group); the candidates are locked FOR UPDATE SKIP LOCKED, and a group's candidates stop
-- at the first one another transaction holds (a delete or a change of visibility under
-- way: what it leaves is not known yet, and waiting for it could deadlock with a purge,
-- which holds the messages and then waits for the group rows). The candidates are split
-- as in 0019 (max_receive_count); the rows come back in the claim's order, group by group.
CREATE OR REPLACE FUNCTION conveyor._claim_fifo(q conveyor.queues, vt_seconds integer, qty integer)
RETURNS SETOF conveyor.messages
LANGUAGE plpgsql SET enable_bitmapscan = off AS $$
DECLARE
    ts timestamptz := clock_timestamp();
    groups text[];
    wanted integer := qty;
    taken bigint[] := '{}';
    picked bigint[];
    expired bigint[];
    got conveyor.messages[] := '{}';
    more conveyor.messages[];
BEGIN
    SELECT array_agg(x.group_id ORDER BY x.vt, x.id) INTO groups FROM (
        SELECT g.group_id, h.vt, h.id FROM conveyor.message_groups g
         CROSS JOIN LATERAL (SELECT m.id, m.vt FROM conveyor.messages m
                              WHERE m.queue_id = q.id AND m.group_id = g.group_id
                              ORDER BY m.id LIMIT 1) h
         WHERE g.queue_id = q.id AND h.vt <= ts
         ORDER BY h.vt, h.id
         LIMIT qty
         FOR UPDATE OF g SKIP LOCKED) x;
    IF groups IS NULL THEN
        RETURN;
    END IF;
    FOR i IN 1 .. 10 LOOP  -- as in _claim (0019)
        ts := clock_timestamp();
        WITH candidates AS MATERIALIZED (
            -- each group's visible messages up to its first invisible one, in claim order
            SELECT u.k, c.id, c.receive_count FROM unnest(groups) WITH ORDINALITY AS u(g, k)
             CROSS JOIN LATERAL (
                 SELECT p.id, p.receive_count FROM (
                     SELECT f.id, f.receive_count, bool_and(f.vt <= ts) OVER (ORDER BY f.id) AS open
                       FROM (SELECT m.id, m.receive_count, m.vt FROM conveyor.messages m
                              WHERE m.queue_id = q.id AND m.group_id = u.g AND m.id <> ALL (taken)
                              ORDER BY m.id LIMIT wanted) f) p
                  WHERE p.open) c
             LIMIT wanted
        ), locked AS (
            -- by key: the visibility test is written so that no index can take it (a
            -- generic plan without statistics read the queue's visible messages by vt
            -- instead, O(backlog) per receive)
            SELECT m.id FROM conveyor.messages m
             WHERE m.queue_id = q.id AND m.id = ANY (ARRAY(SELECT c.id FROM candidates c))
               AND (m.vt <= ts) IS TRUE
               FOR UPDATE SKIP LOCKED
        ), ours AS (
            SELECT c.k, c.id, c.receive_count,
                   bool_and(l.id IS NOT NULL) OVER (PARTITION BY c.k ORDER BY c.id) AS held
              FROM candidates c LEFT JOIN locked l ON l.id = c.id
        )
        SELECT array_agg(o.id ORDER BY o.k, o.id)
                   FILTER (WHERE q.max_receive_count IS NULL OR o.receive_count < q.max_receive_count),
               array_agg(o.id) FILTER (WHERE o.receive_count >= q.max_receive_count)
          INTO picked, expired
          FROM ours o WHERE o.held;
        IF expired IS NOT NULL THEN
            PERFORM conveyor._dead_letter(q, expired, conveyor._receive_limit_reason(q.max_receive_count));
        END IF;
        IF picked IS NOT NULL THEN
            WITH claimed AS (
                UPDATE conveyor.messages m
                   SET vt = ts + make_interval(secs => vt_seconds),
                       receive_count = m.receive_count + 1,
                       first_received_at = coalesce(m.first_received_at, ts)
                 WHERE m.queue_id = q.id AND m.id = ANY (picked)
                RETURNING m.*
            )
            SELECT array_agg(c::conveyor.messages) INTO more FROM claimed c;
            got := got || coalesce(more, '{}');
            wanted := wanted - coalesce(cardinality(more), 0);
            taken := taken || picked;
        END IF;
        EXIT WHEN expired IS NULL OR wanted <= 0;
    END LOOP;
    RETURN QUERY SELECT * FROM unnest(got) m ORDER BY array_position(groups, m.group_id), m.id;
END $$;

-- Claims up to qty messages of a standard queue in group order (0008; messages without a
-- group id are the group ''): groups with nothing in flight, oldest visible message first,
-- listed by a skip scan of the group index (one probe per group), each taken under an
-- advisory lock that concurrent grouped receives skip and checked again after the locks;
-- the candidates split as in 0019. No index holds the messages without a group id apart
-- (they are most of a standard queue's), so the group '' is looked for among the 100
-- oldest visible messages only (in a queue that mixes both kinds it waits while more than
-- that many older messages of named groups are visible; 0008 grouped every message of the
-- queue at each receive instead), and whether it has a message in flight is read from the
-- queue's invisible messages in order (queue_id, vt), up to the first such. Statistics
-- from before the queue filled say no message was ever received, and a plan then sorts a
-- sequential scan of every queue's messages for it: so this claim runs without sequential
-- scans too (every statement of it has an index to go by).
CREATE OR REPLACE FUNCTION conveyor._claim_grouped(q conveyor.queues, vt_seconds integer, qty integer)
RETURNS SETOF conveyor.messages
LANGUAGE plpgsql SET enable_bitmapscan = off SET enable_seqscan = off AS $$
DECLARE
    ts timestamptz := clock_timestamp();
    candidate text;
    groups text[] := '{}';
    wanted integer := qty;
    taken bigint[] := '{}';
    picked bigint[];
    expired bigint[];
    n integer;
BEGIN
    FOR candidate IN
        WITH RECURSIVE named(group_id) AS (
            (SELECT m.group_id FROM conveyor.messages m
              WHERE m.queue_id = q.id AND m.group_id IS NOT NULL ORDER BY m.group_id LIMIT 1)
            UNION ALL
            SELECT (SELECT m.group_id FROM conveyor.messages m
                     WHERE m.queue_id = q.id AND m.group_id > named.group_id ORDER BY m.group_id LIMIT 1)
              FROM named WHERE named.group_id IS NOT NULL
        )
        SELECT x.group_id FROM (
            SELECT n.group_id,
                   (SELECT m.id FROM conveyor.messages m
                     WHERE m.queue_id = q.id AND m.group_id = n.group_id AND m.vt <= ts ORDER BY m.id LIMIT 1) AS head
              FROM named n
             WHERE n.group_id IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM conveyor.messages m
                                WHERE m.queue_id = q.id AND m.group_id = n.group_id
                                  AND m.receive_count > 0 AND m.vt > ts)
            UNION ALL
            SELECT '', (SELECT v.id FROM (SELECT m.id, m.group_id FROM conveyor.messages m
                                           WHERE m.queue_id = q.id AND m.vt <= ts
                                           ORDER BY m.vt, m.id LIMIT 100) v
                         WHERE v.group_id IS NULL LIMIT 1)
             WHERE (SELECT m.vt FROM conveyor.messages m
                     WHERE m.queue_id = q.id AND m.vt > ts AND m.group_id IS NULL AND m.receive_count > 0
                     ORDER BY m.vt LIMIT 1) IS NULL
        ) x
         WHERE x.head IS NOT NULL
         ORDER BY x.head
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
    SELECT coalesce(array_agg(u.g ORDER BY u.k), '{}') INTO groups FROM unnest(groups) WITH ORDINALITY AS u(g, k)
     WHERE CASE WHEN u.g = ''
                THEN (SELECT m.vt FROM conveyor.messages m
                       WHERE m.queue_id = q.id AND m.vt > ts AND m.group_id IS NULL AND m.receive_count > 0
                       ORDER BY m.vt LIMIT 1) IS NULL
                ELSE NOT EXISTS (SELECT 1 FROM conveyor.messages m
                                  WHERE m.queue_id = q.id AND m.group_id = u.g AND m.receive_count > 0 AND m.vt > ts)
           END;
    IF cardinality(groups) = 0 THEN
        RETURN;
    END IF;
    FOR i IN 1 .. 10 LOOP  -- as in _claim (0019)
        SELECT array_agg(c.id) FILTER (WHERE q.max_receive_count IS NULL OR c.receive_count < q.max_receive_count),
               array_agg(c.id) FILTER (WHERE c.receive_count >= q.max_receive_count)
          INTO picked, expired
          FROM (SELECT c.id, c.receive_count FROM unnest(groups) AS u(g)
                 CROSS JOIN LATERAL (SELECT x.id, x.receive_count FROM (
                                         SELECT m.id, m.receive_count FROM conveyor.messages m
                                          WHERE u.g <> '' AND m.queue_id = q.id AND m.group_id = u.g AND m.vt <= ts
                                            AND m.id <> ALL (taken)
                                          ORDER BY m.id LIMIT wanted
                                          FOR UPDATE SKIP LOCKED) x
                                     UNION ALL
                                     SELECT y.id, y.receive_count FROM (
                                         SELECT m.id, m.receive_count FROM conveyor.messages m
                                          WHERE u.g = '' AND m.queue_id = q.id AND m.group_id IS NULL AND m.vt <= ts
                                            AND m.id <> ALL (taken)
                                          ORDER BY m.vt, m.id LIMIT wanted
                                          FOR UPDATE SKIP LOCKED) y) c
                 LIMIT wanted) c;
        IF expired IS NOT NULL THEN
            PERFORM conveyor._dead_letter(q, expired, conveyor._receive_limit_reason(q.max_receive_count));
        END IF;
        IF picked IS NOT NULL THEN
            RETURN QUERY
            UPDATE conveyor.messages m
               SET vt = ts + make_interval(secs => vt_seconds),
                   receive_count = m.receive_count + 1,
                   first_received_at = coalesce(m.first_received_at, ts)
             WHERE m.queue_id = q.id AND m.id = ANY (picked)
            RETURNING m.*;
            GET DIAGNOSTICS n = ROW_COUNT;
            wanted := wanted - n;
            taken := taken || picked;
        END IF;
        EXIT WHEN expired IS NULL OR wanted <= 0;
    END LOOP;
END $$;

-- The bytes of a message's headers as SQS counts them toward MaximumMessageSize (names,
-- data types and values). plpgsql, not SQL: a SQL function with a subquery cannot be
-- inlined into the send's INSERT and would be planned again on every call (migration 0025).
CREATE OR REPLACE FUNCTION conveyor._headers_size(headers jsonb) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF headers IS NULL OR headers = '{}'::jsonb THEN
        RETURN 0;
    END IF;
    IF jsonb_typeof(headers) <> 'object' THEN
        RETURN octet_length(headers::text);
    END IF;
    RETURN (SELECT coalesce(sum(octet_length(h.key) + CASE
                WHEN jsonb_typeof(h.value) = 'object' AND jsonb_typeof(h.value -> 'DataType') = 'string' THEN
                    octet_length(h.value ->> 'DataType') + CASE
                        -- base64: three bytes per four characters, padding not counted
                        WHEN h.value ? 'BinaryValue' THEN octet_length(rtrim(h.value ->> 'BinaryValue', '=')) * 3 / 4
                        ELSE coalesce(octet_length(h.value ->> 'StringValue'), 0) END
                ELSE octet_length(h.value #>> '{}') END), 0)
              FROM jsonb_each(headers) h);
END $$;

-- Checks one message of a send (inlined into the send's INSERT). A message without headers,
-- the common case, costs no call of _headers_size (plpgsql: a function call per message).
CREATE OR REPLACE FUNCTION conveyor._message_ok(q conveyor.queues, body text, headers jsonb, delay integer,
                                                system_attributes jsonb, dedup_id text) RETURNS boolean
LANGUAGE sql AS $$
    SELECT CASE
        WHEN body IS NULL OR octet_length(body) + CASE WHEN headers IS NULL OR headers = '{}'::jsonb THEN 0
                                                       ELSE conveyor._headers_size(headers) END
                             > CASE WHEN conveyor._encrypted(q) THEN q.max_message_size / 3 * 4 + 64
                                    ELSE q.max_message_size END
            THEN conveyor._fail('CVM01', format(
                'message must not be null and must be at most %s bytes (body and headers) in queue %s',
                q.max_message_size, quote_literal(q.name)))
        WHEN delay < 0 OR delay > 900
            THEN conveyor._fail('CVV01', 'delay must be from 0 to 900 seconds')
        WHEN jsonb_typeof(headers) <> 'object' OR jsonb_typeof(system_attributes) <> 'object'
            THEN conveyor._fail('CVV01', 'headers and system_attributes must be JSON objects')
        WHEN dedup_id IS NOT NULL
            THEN conveyor._fail('CVV01', 'dedup_id applies to FIFO queues only')
        ELSE true END
$$;

-- 0001's _dead_letter; the moved message keeps receive_count and first_received_at.
CREATE OR REPLACE FUNCTION conveyor._dead_letter(q conveyor.queues, ids bigint[], reason text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
    dlq conveyor.queues;
BEGIN
    IF q.dead_letter_queue_id IS NOT NULL THEN
        SELECT * INTO dlq FROM conveyor.queues WHERE id = q.dead_letter_queue_id;
    END IF;
    IF dlq.id IS NOT NULL THEN
        IF dlq.fifo THEN
            INSERT INTO conveyor.message_groups AS g (queue_id, group_id)
            SELECT DISTINCT dlq.id, m.group_id FROM conveyor.messages m
             WHERE m.queue_id = q.id AND m.id = ANY (ids) AND m.group_id IS NOT NULL
            ON CONFLICT (queue_id, group_id) DO UPDATE SET group_id = excluded.group_id;
        END IF;
        WITH moved AS (
            DELETE FROM conveyor.messages m
             WHERE m.queue_id = q.id AND m.id = ANY (ids)
            RETURNING m.*
        )
        INSERT INTO conveyor.messages (queue_id, id, vt, sent_at, receive_count, first_received_at, body,
                                       content_type, headers, group_id, dedup_id, source_queue_id, message_uuid,
                                       sender_id, system_attributes)
        -- a queue that is its own dead-letter queue starts the count again (else the
        -- message would be moved on every receive and never delivered)
        SELECT dlq.id, nextval(dlq.seq), now(), moved.sent_at,
               CASE WHEN dlq.id = q.id THEN 0 ELSE moved.receive_count END,
               CASE WHEN dlq.id = q.id THEN NULL ELSE moved.first_received_at END,
               moved.body, moved.content_type, moved.headers, moved.group_id, moved.dedup_id, q.id,
               moved.message_uuid, moved.sender_id, moved.system_attributes
          FROM moved ORDER BY moved.id;
        GET DIAGNOSTICS n = ROW_COUNT;
        PERFORM conveyor._wake(dlq, n);
    ELSE
        WITH moved AS (
            DELETE FROM conveyor.messages m
             WHERE m.queue_id = q.id AND m.id = ANY (ids)
            RETURNING m.*
        )
        INSERT INTO conveyor.archive (queue_id, id, sent_at, receive_count, first_received_at, body,
                                      content_type, headers, group_id, dedup_id, source_queue_id,
                                      message_uuid, sender_id, system_attributes, outcome, error)
        SELECT moved.queue_id, moved.id, moved.sent_at, moved.receive_count, moved.first_received_at,
               moved.body, moved.content_type, moved.headers, moved.group_id, moved.dedup_id,
               moved.source_queue_id, moved.message_uuid, moved.sender_id, moved.system_attributes,
               'failed', reason
          FROM moved;
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN n;
END $$;

-- Deletes the messages still at the given deliveries and still in flight (received, and
-- invisible until after now); returns, for each message given that still exists, whether
-- it was deleted or its delivery is over (its visibility ran out, or it was received again
-- since). An SQS DeleteMessage on a FIFO queue, where a handle acts only while its
-- visibility lasts. Messages by primary key, as every acknowledgement (0020).
CREATE OR REPLACE FUNCTION conveyor.message_delete_in_flight(queue_name text, ids bigint[], receive_counts integer[])
RETURNS TABLE (id bigint, deleted boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
    ts timestamptz := clock_timestamp();
BEGIN
    PERFORM conveyor._deliveries_check(ids, receive_counts);
    RETURN QUERY
    WITH gone AS (
        DELETE FROM conveyor.messages m
         USING unnest(ids, receive_counts) AS d(id, rc)
         WHERE m.queue_id = q.id AND m.id = ANY (ids)
           AND m.id = d.id AND (d.rc IS NULL OR m.receive_count = d.rc) AND m.vt > ts AND m.receive_count > 0
        RETURNING m.id
    )
    SELECT g.id, true FROM gone g
    UNION ALL
    SELECT m.id, false FROM conveyor.messages m
     WHERE m.queue_id = q.id AND m.id = ANY (ids) AND m.id NOT IN (SELECT g.id FROM gone g);
END $$;

-- The key of a FIFO message's deduplication id in conveyor.dedup: the id itself, or under
-- group scope (extra_attributes "dedup_scope": "group", SQS's DeduplicationScope
-- messageGroup) the group and the id.
CREATE OR REPLACE FUNCTION conveyor._dedup_key(q conveyor.queues, group_id text, dedup_id text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN q.extra_attributes ->> 'dedup_scope' = 'group' THEN group_id || ' ' || dedup_id
                ELSE dedup_id END
$$;

DO $$
BEGIN
    GRANT EXECUTE ON FUNCTION conveyor.message_delete_in_flight(text, bigint[], integer[]),
                              conveyor.message_receive_lazy(text, integer, integer)
        TO conveyor_writer;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: roles missing, grants skipped (%)', SQLERRM;
END $$;

REVOKE ALL ON ALL ROUTINES IN SCHEMA conveyor FROM PUBLIC;
