-- Conveyor 0020: the hot statements cost the same whatever the backlog (issue 26 item 1).
--
-- Measured (docs/benchmarks.md, "Cost under a backlog"): with 2,000 messages waiting, 8
-- SQS clients received and deleted 4,927 messages a second; with 200,000, 251. The
-- acknowledgements that take each delivery's receive count (delete, archive, change of
-- visibility: migration 0007) joined conveyor._deliveries(ids, receive_counts), a
-- PL/pgSQL function the planner estimates at 1,000 rows, and under the generic plans of
-- migration 0014 it hashed that against a bitmap scan of every message of the queue: a
-- delete of 10 read 200,000 rows. FIFO receives, and grouped receives of standard queues,
-- read whole groups (or the whole queue) to find the groups with nothing in flight.
-- Partitioned queues' pops planned with the values of each call could read a whole
-- partition by the wrong index when the statistics predated it.
--
-- The rule now, for every statement on the hot path: its rows are found by a key, so
-- that no plan the statistics can lead to reads more than a bounded number of rows per
-- message (tests/sql/test_plans.py counts them over a backlog loaded in bulk, never
-- analyzed, and again after ANALYZE):
--   - acknowledgements look the messages up by primary key (id = ANY (ids)); the receive
--     counts are checked on the rows found (a join with unnest on the ids they hold);
--   - a FIFO or grouped receive finds each group's oldest visible message by the group
--     index (one row per group), asks whether a group has a message in flight through a
--     new partial index holding only received messages of groups (messages_received_idx),
--     and claims from the chosen groups by the group index, in id order, group by group
--     (as SQS fills a receive from one group before the next); grouped receives of
--     standard queues list their groups by a skip scan of the group index instead of
--     grouping every message of the queue. Their cost is a few probes per group holding
--     messages, not per message;
--   - a receive with an attempt id clears its queue's expired attempts through a new index
--     instead of reading every attempt of the last five minutes;
--   - partitioned queues' pops, pushes, acks, renewals and transactions keep generic plans
--     (as the queue functions have since 0014: planned once per session, on an average
--     partition), and a pop's check for messages older than maxWaitTimeSeconds reads from
--     the cursor and stops at the first younger one.
-- Streams read a batch by its tick snapshots through the event tables' ev_txid index
-- (migration 0003): their cost follows the batch, not the events waiting after it.

------------------------------------------------------------------------------------------
-- Acknowledgements by primary key
------------------------------------------------------------------------------------------

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
CREATE FUNCTION conveyor._deliveries_check(ids bigint[], receive_counts integer[]) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF cardinality(ids) IS DISTINCT FROM cardinality(receive_counts) THEN
        PERFORM conveyor._raise('CVV01', format('ids and receive_counts must have the same length, got %s and %s',
                                                cardinality(ids), cardinality(receive_counts)));
    END IF;
END $$;

DROP FUNCTION conveyor._deliveries(bigint[], integer[]);

-- Receives with an attempt id (SQS's ReceiveRequestAttemptId, 0002) first clear their
-- queue's expired attempts, a hundred at a time: found by this index, not by reading every
-- attempt of the last five minutes (one per such receive).
CREATE INDEX receive_attempts_expiry_idx ON conveyor.receive_attempts (queue_id, expires_at);

------------------------------------------------------------------------------------------
-- FIFO and grouped receives: one probe per group
------------------------------------------------------------------------------------------

-- The received messages of groups: whether a group has a message in flight is one probe
-- here (received, and invisible until after now), where the group index would read the
-- whole group when nothing of it is in flight.
CREATE INDEX messages_received_idx ON conveyor.messages (queue_id, group_id, vt)
    WHERE receive_count > 0 AND group_id IS NOT NULL;

-- The oldest messages of a group are read by the group index in id order, a LIMIT at a
-- time. Without statistics (a table filled since its last ANALYZE) a generic plan expects a
-- handful of rows per group and prefers a bitmap scan of the whole group, sorted; so the
-- two group claims run without bitmap scans (a SET clause: for the claim and what it calls,
-- such as _dead_letter, whose statements go by key anyway), which leaves the ordered index
-- scan as the plan (tests/sql/test_plans.py).

-- Claims up to qty messages of a FIFO queue: only from groups with nothing in flight, in
-- id order within each group. Two statements choose the groups (0001 says why): the first
-- locks the group rows (concurrent receivers skip them), the second sees, with a snapshot
-- taken after the locks were granted, whether a receiver that just committed left messages
-- of the group in flight. Groups are taken oldest visible message first. The candidates
-- are split as in 0019 (max_receive_count).
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
    n integer;
BEGIN
    SELECT array_agg(x.group_id ORDER BY x.head) INTO groups FROM (
        SELECT g.group_id, h.id AS head FROM conveyor.message_groups g
         CROSS JOIN LATERAL (SELECT m.id FROM conveyor.messages m
                              WHERE m.queue_id = q.id AND m.group_id = g.group_id AND m.vt <= ts
                              ORDER BY m.id LIMIT 1) h
         WHERE g.queue_id = q.id
           AND NOT EXISTS (SELECT 1 FROM conveyor.messages m
                            WHERE m.queue_id = q.id AND m.group_id = g.group_id
                              AND m.receive_count > 0 AND m.vt > ts)
         ORDER BY h.id
         LIMIT qty
         FOR UPDATE OF g SKIP LOCKED) x;
    IF groups IS NULL THEN
        RETURN;
    END IF;
    ts := clock_timestamp();
    SELECT array_agg(g ORDER BY k) INTO groups FROM unnest(groups) WITH ORDINALITY AS u(g, k)
     WHERE NOT EXISTS (SELECT 1 FROM conveyor.messages m
                        WHERE m.queue_id = q.id AND m.group_id = u.g
                          AND m.receive_count > 0 AND m.vt > ts);
    IF groups IS NULL THEN
        RETURN;
    END IF;
    FOR i IN 1 .. 10 LOOP  -- as in _claim (0019)
        SELECT array_agg(c.id) FILTER (WHERE q.max_receive_count IS NULL OR c.receive_count < q.max_receive_count),
               array_agg(c.id) FILTER (WHERE c.receive_count >= q.max_receive_count)
          INTO picked, expired
          FROM (SELECT c.id, c.receive_count FROM unnest(groups) AS u(g)
                 CROSS JOIN LATERAL (SELECT m.id, m.receive_count FROM conveyor.messages m
                                      WHERE m.queue_id = q.id AND m.group_id = u.g AND m.vt <= ts
                                        AND m.id <> ALL (taken)
                                      ORDER BY m.id LIMIT wanted
                                      FOR UPDATE SKIP LOCKED) c
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

------------------------------------------------------------------------------------------
-- Partitioned queues
------------------------------------------------------------------------------------------

-- As in 0009, but the messages older than maxWaitTimeSeconds are found from the cursor by
-- primary key, in seq order: they are the pending messages before the first one that is
-- not (messages are numbered as they are pushed, so their times follow their numbers),
-- and reading them stops there. 0009 read every pending message of the partition, or by
-- the (partition_id, created_at) index every message ever kept before the deadline.
CREATE OR REPLACE FUNCTION conveyor._partition_claim(q conveyor.pqueues, part conveyor.partitions, group_name text,
                                                     batch integer, lease uuid, lease_seconds integer, worker text)
RETURNS SETOF jsonb
LANGUAGE plpgsql AS $$
DECLARE
    c conveyor.partition_cursors;
    ts timestamptz := clock_timestamp();
    through bigint;
    expired bigint[];
    deadline timestamptz;
BEGIN
    c := conveyor._partition_cursor(part, group_name);
    SELECT * INTO c FROM conveyor.partition_cursors x
     WHERE x.partition_id = part.id AND x.consumer_group = group_name
       FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        -- another pop or an ack has the row right now: this pop did not look at the
        -- partition, which its caller must know (see pqueue_pop's scanned_xid)
        RETURN NEXT jsonb_build_object('skipped', true);
        RETURN;
    END IF;
    IF c.lease_id IS NOT NULL AND c.lease_expires_at > ts THEN
        RETURN;  -- another worker holds it
    END IF;
    IF q.window_buffer > 0 AND part.head_at > ts - make_interval(secs => q.window_buffer) THEN
        -- the partition is still being written to: wait until it is quiet (look again later)
        UPDATE conveyor.partition_cursors x SET behind = true
         WHERE x.partition_id = part.id AND x.consumer_group = group_name AND NOT x.behind;
        RETURN;
    END IF;
    IF q.max_wait_time_seconds > 0 THEN
        -- too old to be worth processing: dead-lettered unread
        deadline := ts - make_interval(secs => q.max_wait_time_seconds);
        SELECT array_agg(m.seq) INTO expired FROM conveyor.partition_messages m
         WHERE m.partition_id = part.id AND m.seq > c.cursor AND m.seq <> ALL (c.done)
           AND m.seq < coalesce((SELECT f.seq FROM conveyor.partition_messages f
                                  WHERE f.partition_id = part.id AND f.seq > c.cursor AND f.created_at >= deadline
                                  ORDER BY f.seq LIMIT 1), 9223372036854775807)
           AND m.created_at < deadline;
        IF expired IS NOT NULL THEN
            PERFORM conveyor._partition_dead_letter(q, part.id, group_name, s, 'expired: waited longer than '
                                                    || q.max_wait_time_seconds || ' seconds') FROM unnest(expired) s;
            SELECT * INTO c FROM conveyor.partition_cursors x
             WHERE x.partition_id = part.id AND x.consumer_group = group_name;
        END IF;
    END IF;
    SELECT max(m.seq) INTO through FROM (
        SELECT m.seq FROM conveyor.partition_messages m
         WHERE m.partition_id = part.id AND m.seq > c.cursor AND m.seq <> ALL (c.done)
           AND (q.delayed_processing = 0 OR m.created_at <= ts - make_interval(secs => q.delayed_processing))
         ORDER BY m.seq LIMIT batch) m;
    IF through IS NULL THEN
        UPDATE conveyor.partition_cursors x SET behind = (q.delayed_processing > 0 AND
                                                          (SELECT p.head FROM conveyor.partitions p WHERE p.id = part.id) > x.cursor),
                                                lease_id = NULL, lease_expires_at = NULL, leased_through = NULL
         WHERE x.partition_id = part.id AND x.consumer_group = group_name AND (x.behind OR x.lease_id IS NOT NULL);
        RETURN;
    END IF;
    UPDATE conveyor.partition_cursors x
       SET lease_id = lease, lease_expires_at = ts + make_interval(secs => lease_seconds), leased_through = through,
           worker_id = worker, behind = (part.head > through)
     WHERE x.partition_id = part.id AND x.consumer_group = group_name;
    RETURN QUERY
    SELECT jsonb_build_object(
               'id', m.id, 'transactionId', m.transaction_id, 'traceId', m.trace_id, 'data', m.payload,
               'encrypted', m.is_encrypted, 'producerSub', m.producer_sub,
               'createdAt', to_char(m.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
               'seq', m.seq, 'queue', q.name, 'partition', part.name, 'partitionId', part.uuid,
               'consumerGroup', group_name, 'leaseId', lease,
               'retryCount', coalesce(r.failures, 0), 'priority', q.priority)
      FROM conveyor.partition_messages m
      LEFT JOIN conveyor.partition_retries r
        ON r.partition_id = m.partition_id AND r.consumer_group = group_name AND r.seq = m.seq
     WHERE m.partition_id = part.id AND m.seq > c.cursor AND m.seq <= through AND m.seq <> ALL (c.done)
     ORDER BY m.seq;
END $$;

-- The hot functions of partitioned queues keep generic plans, as the queue functions do
-- (0014): planned with each call's values, a statement on a partition the statistics have
-- not seen expects one row, and every index starting with partition_id looks as good as
-- the one the statement needs (measured: a pop read a new partition of 200,000 messages
-- through partition_messages' transaction id index). A generic plan expects an average
-- partition and takes the index that holds its conditions. Their tables are not
-- partitioned, so these plans do not follow the queue storage kinds (see _message_plans).
ALTER FUNCTION conveyor.pqueue_pop(jsonb) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION conveyor.pqueue_pop_many(jsonb) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION conveyor.pqueue_push(jsonb) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION conveyor.pqueue_renew(jsonb) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION conveyor.pqueue_transaction(jsonb) SET plan_cache_mode = force_generic_plan;
-- An acknowledgement finds its message by (partition_id, transaction_id): planned per call
-- on a partition the statistics have not seen, it went by partition_messages_created_idx
-- and read every message kept before it, consumed or not. A migration that redefines
-- pqueue_ack must keep this clause (tests/sql/test_plans.py fails without it).
ALTER FUNCTION conveyor.pqueue_ack(jsonb, boolean) SET plan_cache_mode = force_generic_plan;

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

------------------------------------------------------------------------------------------
-- Plans
------------------------------------------------------------------------------------------

-- The redefined functions carry force_generic_plan; while queues with tables of their own
-- exist, _message_plans switches them to per-call plans like the others (0016).
SELECT conveyor._message_plans();

REVOKE ALL ON FUNCTION conveyor._deliveries_check(bigint[], integer[]) FROM PUBLIC;
