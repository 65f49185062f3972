-- Conveyor 0024: FIFO queues as Amazon SQS runs them (issue 27, items 1-4), measured against
-- what AWS answers (LocalStack's snapshots recorded against AWS, AWS's API reference).
--
-- 1. A receive returns its messages group by group, each group's in order (g1-m1, g1-m2,
--    g1-m3, then g2-m1), not in global send order: the claims were already made group by
--    group, but the rows came back in id order (and the Python layer sorted them so). Now
--    message_receive returns a FIFO claim's rows in the claim's order; message_receive_fifo
--    returns a standard queue's grouped claim group by group (oldest group first, as pgmq's
--    read_grouped does); message_receive_attempt keeps and replays that order.
-- 2. A group's lock follows visibility. A group is receivable when its first message (in id
--    order) is visible, and a receive takes its visible messages in order up to the first
--    one that is not (in flight, or delayed): a message made visible again (its timeout ran
--    out, or ChangeMessageVisibility 0) reopens its group from there even while later
--    messages of the group are still in flight, and a message kept in flight blocks only
--    the messages after it. Groups are served in the order they became receivable: by their
--    first message's visibility time (a message's vt is its send time plus the queue's delay
--    until it is received, then the time its visibility ended), ties by its id. So a group
--    released by a receive with VisibilityTimeout 0 comes after a group never received, as
--    AWS answers. Until now a group was blocked while any of its messages was in flight, and
--    groups went by their oldest visible message's id.
-- 3. Deduplication per message group (SQS's DeduplicationScope=messageGroup, which its
--    high-throughput mode, FifoThroughputLimit=perMessageGroupId, uses): a queue whose
--    extra_attributes say "dedup_scope": "group" keys its deduplication window by group and
--    deduplication id; a change of scope applies to the sends after it. The window's key is
--    the id alone (queue scope) or "<group> <id>" (group scope): group and deduplication ids
--    are printable ASCII without spaces, so the two forms never meet.
-- 4. PurgeQueue also clears the queue's deduplication window (a resend with the same id
--    after a purge is a new message, as on AWS). message_delete_in_flight deletes deliveries
--    only while they are in flight and says which are not: an SQS DeleteMessage on a FIFO
--    queue with a handle whose visibility ran out is refused ("The receipt handle has
--    expired."), as AWS refuses it.
--
-- tests/sqs/test_fifo_semantics.py checks each item through boto3 in both wire protocols;
-- tests/sql/test_receive_limits.py (no delivery past max_receive_count) and
-- tests/sql/test_plans.py (rows read per message, whatever the backlog) cover the claim.

------------------------------------------------------------------------------------------
-- 1 and 2. The FIFO claim
------------------------------------------------------------------------------------------

-- 0020's _claim_fifo with the visibility-following group lock. The groups: those whose first
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
            SELECT m.id FROM conveyor.messages m
             WHERE m.queue_id = q.id AND m.id = ANY (ARRAY(SELECT c.id FROM candidates c)) AND m.vt <= ts
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

-- 0001's message_receive; its rows come back in a defined order: a FIFO claim's order
-- (group by group), a standard queue's by id.
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

-- 0008's message_receive_fifo; a standard queue's grouped claim comes back group by group
-- (the group of the oldest message first), each group's messages in order.
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

-- 0002's message_receive_attempt; the messages are recorded, and given again, in the order
-- the receive returned them.
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

------------------------------------------------------------------------------------------
-- 3. Deduplication per message group
------------------------------------------------------------------------------------------

-- The key of a FIFO message's deduplication id in conveyor.dedup: the id itself, or under
-- group scope (extra_attributes "dedup_scope": "group", SQS's DeduplicationScope
-- messageGroup) the group and the id.
CREATE FUNCTION conveyor._dedup_key(q conveyor.queues, group_id text, dedup_id text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN q.extra_attributes ->> 'dedup_scope' = 'group' THEN group_id || ' ' || dedup_id
                ELSE dedup_id END
$$;

-- 0018's _send; the deduplication window is keyed by _dedup_key (the message keeps its
-- deduplication id as given).
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

------------------------------------------------------------------------------------------
-- 4. Purges clear the deduplication window; deletes of deliveries still in flight
------------------------------------------------------------------------------------------

-- 0001's queue_purge; the queue's deduplication window goes too.
CREATE OR REPLACE FUNCTION conveyor.queue_purge(queue_name text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
    n bigint;
BEGIN
    DELETE FROM conveyor.messages WHERE queue_id = q.id;
    GET DIAGNOSTICS n = ROW_COUNT;
    DELETE FROM conveyor.message_groups WHERE queue_id = q.id;
    DELETE FROM conveyor.dedup WHERE queue_id = q.id;
    UPDATE conveyor.queues SET purged_at = now() WHERE id = q.id;
    RETURN n;
END $$;

-- Deletes the messages still at the given deliveries and still in flight (received, and
-- invisible until after now); returns, for each message given that still exists, whether
-- it was deleted or its delivery is over (its visibility ran out, or it was received again
-- since). An SQS DeleteMessage on a FIFO queue, where a handle acts only while its
-- visibility lasts. Messages by primary key, as every acknowledgement (0020).
CREATE FUNCTION conveyor.message_delete_in_flight(queue_name text, ids bigint[], receive_counts integer[])
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

REVOKE ALL ON FUNCTION conveyor._dedup_key(conveyor.queues, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION conveyor.message_delete_in_flight(text, bigint[], integer[]) FROM PUBLIC;

DO $$
BEGIN
    GRANT EXECUTE ON FUNCTION conveyor.message_delete_in_flight(text, bigint[], integer[]) TO conveyor_writer;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: roles missing, grants skipped (%)', SQLERRM;
END $$;

-- The redefined functions carry force_generic_plan; while queues with tables of their own
-- exist, _message_plans switches them to per-call plans like the others (0016).
SELECT conveyor._message_plans();
