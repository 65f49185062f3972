-- Partitioned queues (Queen; core/partitioned.py): partitions, consumer groups, leases.
--
-- Current definitions, re-applied whenever a file of this folder changes (docs/architecture.md,
-- "Where each SQL function's current definition lives"). Edit a function here; tables, types,
-- indexes, data and DROPs go in a new numbered migration.

CREATE OR REPLACE FUNCTION conveyor._pqueue(queue_name text) RETURNS conveyor.pqueues
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q conveyor.pqueues;
BEGIN
    SELECT * INTO q FROM conveyor.pqueues WHERE name = queue_name;
    IF NOT FOUND THEN
        PERFORM conveyor._raise('CVK01', format('queue %s does not exist',
                                                coalesce(quote_literal(left(queue_name, 100)), 'NULL')));
    END IF;
    RETURN q;
END $$;

-- The rules for names, as expressions: LANGUAGE sql with one expression and no SET, so
-- they are inlined into the statements that call them (a push checks every item's names
-- in the statement that locks its partitions). A queue name is 1 to 128 characters of
-- A-Z a-z 0-9 _ . : -, tested as a length and a character class: the regular expression
-- '^[A-Za-z0-9_.:-]{1,128}$' says the same, and its bounded repetition cost PostgreSQL
-- ~20 us per name (2 us this way).
CREATE OR REPLACE FUNCTION conveyor._pqueue_name_ok(queue_name text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(length(queue_name) BETWEEN 1 AND 128 AND queue_name !~ '[^A-Za-z0-9_.:-]', false)
$$;

CREATE OR REPLACE FUNCTION conveyor._partition_name_ok(partition_name text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(length(partition_name) BETWEEN 1 AND 256 AND partition_name !~ '[\x00-\x1f]', false)
$$;

CREATE OR REPLACE FUNCTION conveyor._pqueue_name_check(queue_name text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF NOT conveyor._pqueue_name_ok(queue_name) THEN
        PERFORM conveyor._raise('CVV01', format(
            'invalid queue name %s: use 1 to 128 characters of A-Z, a-z, 0-9 and _ . : -',
            coalesce(quote_literal(left(queue_name, 140)), 'NULL')));
    END IF;
END $$;

CREATE OR REPLACE FUNCTION conveyor._partition_name_check(partition_name text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF NOT conveyor._partition_name_ok(partition_name) THEN
        PERFORM conveyor._raise('CVV01', 'a partition name is 1 to 256 characters, no control characters');
    END IF;
END $$;

-- Creates a queue, or changes the configuration of an existing one (options not given
-- keep their value). Options in Queen's names (leaseTime, retryLimit, priority,
-- delayedProcessing, windowBuffer, maxWaitTimeSeconds, retentionSeconds,
-- completedRetentionSeconds, encryptionEnabled, dlqAfterMaxRetries); others are kept in
-- options as given.
CREATE OR REPLACE FUNCTION conveyor.pqueue_configure(queue_name text, options jsonb DEFAULT '{}',
                                          namespace text DEFAULT NULL, task text DEFAULT NULL)
RETURNS conveyor.pqueues
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    o jsonb := coalesce(options, '{}');
    q conveyor.pqueues;
BEGIN
    PERFORM conveyor._pqueue_name_check(queue_name);
    IF jsonb_typeof(o) <> 'object' THEN
        PERFORM conveyor._raise('CVV01', 'options must be a JSON object');
    END IF;
    INSERT INTO conveyor.pqueues AS t (name, namespace, task) VALUES (queue_name, namespace, task)
    ON CONFLICT (name) DO UPDATE SET updated_at = now()
    RETURNING * INTO q;
    UPDATE conveyor.pqueues t SET
        namespace = coalesce(pqueue_configure.namespace, t.namespace),
        task = coalesce(pqueue_configure.task, t.task),
        lease_time = conveyor._int_option(o, 'leaseTime', 1, 86400, t.lease_time),
        retry_limit = conveyor._int_option(o, 'retryLimit', 0, 1000, t.retry_limit),
        priority = conveyor._int_option(o, 'priority', -1000000, 1000000, t.priority),
        delayed_processing = conveyor._int_option(o, 'delayedProcessing', 0, 31536000, t.delayed_processing),
        window_buffer = conveyor._int_option(o, 'windowBuffer', 0, 31536000, t.window_buffer),
        max_wait_time_seconds = conveyor._int_option(o, 'maxWaitTimeSeconds', 0, 31536000, t.max_wait_time_seconds),
        retention_seconds = conveyor._int_option(o, 'retentionSeconds', 0, 315360000, t.retention_seconds),
        completed_retention_seconds = conveyor._int_option(o, 'completedRetentionSeconds', 0, 315360000,
                                                           t.completed_retention_seconds),
        encryption_enabled = conveyor._bool_option(o, 'encryptionEnabled', t.encryption_enabled),
        dlq_after_max_retries = conveyor._bool_option(o, 'dlqAfterMaxRetries', t.dlq_after_max_retries),
        options = t.options || o,
        updated_at = now()
     WHERE t.id = q.id
    RETURNING * INTO q;
    RETURN q;
END $$;

CREATE OR REPLACE FUNCTION conveyor.pqueue_drop(queue_name text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    DELETE FROM conveyor.pqueues WHERE name = queue_name;
    RETURN FOUND;
END $$;

-- (plpgsql, as every function of the partitioned queues' API: see pqueue_pop_many)
CREATE OR REPLACE FUNCTION conveyor.pqueue_listen(queue_name text, seconds integer DEFAULT 60) RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    until timestamptz;
BEGIN
    UPDATE conveyor.pqueues
       SET listened_until = greatest(listened_until, now() + make_interval(secs => least(greatest(seconds, 1), 3600)))
     WHERE name = queue_name
    RETURNING listened_until INTO until;
    RETURN until;
END $$;

-- The mark a push leaves on its partition for wildcard pops (partitions.head_xid, through
-- partitions_pushed_idx): not the pushing transaction's id but the next multiple of 1024
-- above it. A pop that found nothing moves its group's scanned_xid to the oldest
-- transaction still running, and looks next at partitions marked at or after it; a mark
-- at or above the pusher's id keeps every push it did not see in that range, so rounding
-- up loses nothing and only brings back, once, partitions pushed in the last ~1024
-- transactions (their cursors show them consumed). What it buys: pushes to a partition
-- within one range of ids leave the indexed column as it is, so their updates of the
-- partition's row are HOT (no new index entries, the row's old versions pruned in place).
-- With the exact id every push was a non-HOT update, and a queue's 64 partitions grew to
-- hundreds of pages between vacuums, which every push's foreign-key checks and every
-- pop's scans read (14% of PostgreSQL's CPU in heapgetpage under pushes of 10).
CREATE OR REPLACE FUNCTION conveyor._pushed_mark() RETURNS xid8
LANGUAGE sql AS $$ SELECT ((pg_current_xact_id()::text::bigint | 1023) + 1)::text::xid8 $$;

-- Pushes a batch: items [{queue, partition?, payload, transactionId?, traceId?,
-- producerSub?, encrypted?}], creating queues and partitions that do not exist (partition
-- default "Default"). Idempotent per (partition, transactionId), within the batch and
-- against what is stored. Returns one answer per item, in order:
-- {index, status: "queued" | "duplicate", messageId, transactionId, partitionId, queue,
-- partition, seq}.
-- A push of one well-formed item to a partition that exists: what pqueue_push does for
-- such an item, in four plain statements (lock the partition, look for the transaction
-- id, insert, move the head) instead of its general statements for many items, whose
-- plans (windows, sorts, CTEs) cost PostgreSQL 2-3x a single message's work. A lone
-- item is the common call: a client's single push, not fused with another. NULL when it
-- does not apply (a malformed item, a queue or partition to create): then pqueue_push's
-- general path takes the item, with its errors, and nothing was locked here.
CREATE OR REPLACE FUNCTION conveyor._pqueue_push_one(item jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    queue_name text := item ->> 'queue';
    part_name text := coalesce(nullif(item ->> 'partition', ''), 'Default');
    txid text := nullif(item ->> 'transactionId', '');
    q_listened boolean;
    part_id bigint;
    part_uuid uuid;
    head bigint;
    message_id uuid;
    seq bigint;
    status text := 'queued';
BEGIN
    IF jsonb_typeof(item) <> 'object' OR NOT conveyor._pqueue_name_ok(queue_name)
       OR NOT conveyor._partition_name_ok(part_name) OR length(txid) > 512 THEN
        RETURN NULL;
    END IF;
    SELECT p.id, p.uuid, p.head, coalesce(q.listened_until > now(), false) INTO part_id, part_uuid, head, q_listened
      FROM conveyor.pqueues q JOIN conveyor.partitions p ON p.queue_id = q.id AND p.name = part_name
     WHERE q.name = queue_name
       FOR UPDATE OF p;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF txid IS NULL THEN
        txid := gen_random_uuid()::text;
    ELSE
        SELECT m.id, m.seq INTO message_id, seq FROM conveyor.partition_messages m
         WHERE m.partition_id = part_id AND m.transaction_id = txid;
        IF FOUND THEN
            status := 'duplicate';
        END IF;
    END IF;
    IF status = 'queued' THEN
        message_id := gen_random_uuid();
        seq := head + 1;
        INSERT INTO conveyor.partition_messages (partition_id, seq, id, transaction_id, trace_id, payload,
                                                 is_encrypted, producer_sub)
        VALUES (part_id, seq, message_id, txid,
                CASE WHEN conveyor._is_uuid(item ->> 'traceId')
                     THEN (item ->> 'traceId')::uuid END,
                item -> 'payload', coalesce(item ->> 'encrypted', 'false') = 'true', item ->> 'producerSub');
        UPDATE conveyor.partitions p SET head = seq, head_at = clock_timestamp(), head_xid = conveyor._pushed_mark()
         WHERE p.id = part_id;
        IF q_listened THEN  -- a queue someone long-polls got a message
            PERFORM pg_notify('conveyor_queue', '1 partitioned/' || queue_name);
        END IF;
    END IF;
    RETURN jsonb_build_array(jsonb_build_object(
        'index', 0, 'status', status, 'messageId', message_id, 'transactionId', txid,
        'partitionId', part_uuid, 'queue', queue_name, 'partition', part_name, 'seq', seq));
END $$;

ALTER FUNCTION conveyor._pqueue_push_one(jsonb) SET plan_cache_mode = force_generic_plan;

CREATE OR REPLACE FUNCTION conveyor.pqueue_push(items jsonb) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    answers jsonb;
    notify record;
    missing bigint;
    malformed boolean;
    awaited boolean;
BEGIN
    IF items IS NULL OR jsonb_typeof(items) <> 'array' THEN
        PERFORM conveyor._raise('CVV01', 'items must be a JSON array');
    END IF;
    IF jsonb_array_length(items) = 0 THEN
        RETURN '[]';
    END IF;
    IF jsonb_array_length(items) > 10000 THEN
        PERFORM conveyor._raise('CVV01', format('a push holds at most 10000 items, got %s', jsonb_array_length(items)));
    END IF;
    IF jsonb_array_length(items) = 1 THEN
        answers := conveyor._pqueue_push_one(items -> 0);
        IF answers IS NOT NULL THEN
            RETURN answers;
        END IF;
    END IF;
    -- The checks in one statement: every item well formed, and how many of the queues and
    -- partitions named are not there yet. Nothing is locked here: a push that must create
    -- something creates it before it locks anything (below), so that no push holds a
    -- partition while it waits for another's uncommitted creation, which waits for that
    -- partition (a deadlock seen with the locks taken here first).
    WITH named AS (
        SELECT DISTINCT x ->> 'queue' AS queue, coalesce(nullif(x ->> 'partition', ''), 'Default') AS partition
          FROM jsonb_array_elements(items) x
    )
    SELECT (SELECT count(*) FROM named)
           - (SELECT count(*) FROM named n JOIN conveyor.pqueues q ON q.name = n.queue
                JOIN conveyor.partitions p ON p.queue_id = q.id AND p.name = n.partition),
           EXISTS (SELECT 1 FROM jsonb_array_elements(items) x
                    WHERE jsonb_typeof(x) <> 'object' OR NOT conveyor._pqueue_name_ok(x ->> 'queue')
                       OR NOT conveyor._partition_name_ok(coalesce(nullif(x ->> 'partition', ''), 'Default'))
                       OR length(x ->> 'transactionId') > 512)
      INTO missing, malformed;
    IF malformed THEN
        -- which rule an item breaks, in the order the rules are told
        PERFORM conveyor._pqueue_name_check(x ->> 'queue'),
                conveyor._partition_name_check(coalesce(nullif(x ->> 'partition', ''), 'Default'))
           FROM jsonb_array_elements(items) x;
        PERFORM conveyor._raise('CVV01', 'each item is a JSON object; a transactionId is at most 512 characters');
    END IF;

    IF missing > 0 THEN
        -- queues and partitions a push names are created by it, in name order (pushes that
        -- create the same ones wait for each other in one order), then locked with the others
        INSERT INTO conveyor.pqueues (name)
        SELECT DISTINCT x ->> 'queue' FROM jsonb_array_elements(items) x ORDER BY 1
        ON CONFLICT (name) DO NOTHING;
        INSERT INTO conveyor.partitions (queue_id, name)
        SELECT DISTINCT q.id, coalesce(nullif(x ->> 'partition', ''), 'Default')
          FROM jsonb_array_elements(items) x JOIN conveyor.pqueues q ON q.name = x ->> 'queue' ORDER BY 1, 2
        ON CONFLICT (queue_id, name) DO NOTHING;
    END IF;
    -- the partitions, locked in id order (no deadlocks between pushes): from here on this
    -- transaction numbers their messages, and nobody else does until it commits
    PERFORM 1 FROM conveyor.partitions p
     WHERE p.id IN (SELECT p2.id FROM jsonb_array_elements(items) x
                      JOIN conveyor.pqueues q ON q.name = x ->> 'queue'
                      JOIN conveyor.partitions p2 ON p2.queue_id = q.id
                                                  AND p2.name = coalesce(nullif(x ->> 'partition', ''), 'Default'))
     ORDER BY p.id FOR UPDATE;

    -- a new statement, so a new snapshot: it sees what the pushes we waited for stored.
    -- One pass over the items, without joining them to themselves (the generic plan
    -- expects a handful of rows and nested-loops such joins: 10,000 items took seconds):
    -- an item is new if it is the first of its transaction id in the batch and not stored;
    -- new ones are numbered in order per partition; a duplicate in the batch answers with
    -- the first's message, one already stored with the stored one.
    WITH parsed AS MATERIALIZED (
        SELECT (x.ord - 1)::integer AS idx, q.name AS queue, p.name AS partition, p.id AS partition_id,
               p.uuid AS partition_uuid, p.head, x.item -> 'payload' AS payload,
               coalesce(nullif(x.item ->> 'transactionId', ''), gen_random_uuid()::text) AS transaction_id,
               CASE WHEN conveyor._is_uuid(x.item ->> 'traceId')
                    THEN (x.item ->> 'traceId')::uuid END AS trace_id,
               x.item ->> 'producerSub' AS producer_sub,
               coalesce(x.item ->> 'encrypted', 'false') = 'true' AS is_encrypted,
               q.listened_until > now() AS listened
          FROM jsonb_array_elements(items) WITH ORDINALITY AS x(item, ord)
          JOIN conveyor.pqueues q ON q.name = x.item ->> 'queue'
          JOIN conveyor.partitions p ON p.queue_id = q.id AND p.name = coalesce(nullif(x.item ->> 'partition', ''), 'Default')
    ), judged AS MATERIALIZED (
        SELECT x.*, x.idx = min(x.idx) OVER (PARTITION BY x.partition_id, x.transaction_id)
                    AND NOT EXISTS (SELECT 1 FROM conveyor.partition_messages m
                                     WHERE m.partition_id = x.partition_id AND m.transaction_id = x.transaction_id) AS is_new
          FROM parsed x
    ), numbered AS MATERIALIZED (
        SELECT j.*,
               CASE WHEN j.is_new THEN j.head + count(*) FILTER (WHERE j.is_new)
                                                 OVER (PARTITION BY j.partition_id ORDER BY j.idx) END AS seq,
               CASE WHEN j.is_new THEN gen_random_uuid() END AS message_id
          FROM judged j
    ), stored AS (
        INSERT INTO conveyor.partition_messages (partition_id, seq, id, transaction_id, trace_id, payload,
                                                 is_encrypted, producer_sub)
        SELECT f.partition_id, f.seq, f.message_id, f.transaction_id, f.trace_id, f.payload, f.is_encrypted,
               f.producer_sub
          FROM numbered f WHERE f.is_new ORDER BY f.partition_id, f.seq
        RETURNING 1
    ), heads AS (
        UPDATE conveyor.partitions p SET head = n.head, head_at = clock_timestamp(), head_xid = conveyor._pushed_mark()
          FROM (SELECT f.partition_id, max(f.seq) AS head FROM numbered f WHERE f.is_new GROUP BY 1) n
         WHERE p.id = n.partition_id
        RETURNING 1
    )
    SELECT jsonb_agg(jsonb_build_object(
               'index', a.idx, 'status', CASE WHEN a.is_new THEN 'queued' ELSE 'duplicate' END,
               'messageId', coalesce(a.first_id, m.id), 'transactionId', a.transaction_id,
               'partitionId', a.partition_uuid, 'queue', a.queue, 'partition', a.partition,
               'seq', coalesce(a.first_seq, m.seq)) ORDER BY a.idx),
           coalesce(bool_or(a.listened AND a.is_new), false)
      INTO answers, awaited
      FROM (SELECT f.*, first_value(f.message_id) OVER w AS first_id, first_value(f.seq) OVER w AS first_seq
              FROM numbered f WINDOW w AS (PARTITION BY f.partition_id, f.transaction_id ORDER BY f.idx)) a
      LEFT JOIN LATERAL (SELECT m.id, m.seq FROM conveyor.partition_messages m
                          WHERE a.first_id IS NULL AND m.partition_id = a.partition_id
                            AND m.transaction_id = a.transaction_id) m ON true;

    IF awaited THEN  -- a queue someone long-polls got messages
        FOR notify IN
            SELECT q.name, count(*) AS n FROM jsonb_array_elements(answers) a JOIN conveyor.pqueues q ON q.name = a ->> 'queue'
             WHERE a ->> 'status' = 'queued' AND q.listened_until > now() GROUP BY q.name
        LOOP
            PERFORM pg_notify('conveyor_queue', notify.n || ' partitioned/' || notify.name);
        END LOOP;
    END IF;
    RETURN answers;
END $$;

ALTER FUNCTION conveyor.pqueue_push(jsonb) SET plan_cache_mode = force_generic_plan;

-- The cursor of a group in a partition, created where the group starts: 'all' at the
-- beginning, 'new' and 'timestamp' after the messages older than its start.
CREATE OR REPLACE FUNCTION conveyor._partition_cursor(part conveyor.partitions, group_name text)
RETURNS conveyor.partition_cursors
LANGUAGE plpgsql AS $$
DECLARE
    c conveyor.partition_cursors;
    g conveyor.consumer_groups;
    start bigint := 0;
BEGIN
    SELECT * INTO c FROM conveyor.partition_cursors x
     WHERE x.partition_id = part.id AND x.consumer_group = group_name;
    IF FOUND THEN
        RETURN c;
    END IF;
    SELECT * INTO g FROM conveyor.consumer_groups x WHERE x.queue_id = part.queue_id AND x.name = group_name;
    IF FOUND AND g.mode <> 'all' AND g.start_at IS NOT NULL THEN
        SELECT coalesce(max(m.seq), 0) INTO start FROM conveyor.partition_messages m
         WHERE m.partition_id = part.id AND m.created_at < g.start_at;
    END IF;
    INSERT INTO conveyor.partition_cursors AS x (partition_id, consumer_group, queue_id, cursor, behind)
    VALUES (part.id, group_name, part.queue_id, start, part.head > start)
    ON CONFLICT (partition_id, consumer_group) DO NOTHING;
    SELECT * INTO c FROM conveyor.partition_cursors x
     WHERE x.partition_id = part.id AND x.consumer_group = group_name;
    RETURN c;
END $$;

-- The group of a pop, registered on first use with the subscription the pop asks for
-- (from: an instant, or 'now'; mode 'new' is from now; otherwise 'all'); a group that
-- exists keeps its own. Queue mode is the group '__QUEUE_MODE__'.
CREATE OR REPLACE FUNCTION conveyor._consumer_group(q conveyor.pqueues, group_name text, sub_mode text DEFAULT NULL,
                                         sub_from text DEFAULT NULL) RETURNS conveyor.consumer_groups
LANGUAGE plpgsql AS $$
DECLARE
    g conveyor.consumer_groups;
    mode text := 'all';
    start_at timestamptz;
BEGIN
    IF group_name IS NULL OR length(group_name) NOT BETWEEN 1 AND 256 THEN
        PERFORM conveyor._raise('CVV01', 'a consumer group name is 1 to 256 characters');
    END IF;
    SELECT * INTO g FROM conveyor.consumer_groups x WHERE x.queue_id = q.id AND x.name = group_name;
    IF FOUND THEN
        RETURN g;
    END IF;
    IF nullif(sub_from, '') IS NOT NULL AND lower(sub_from) <> 'now' THEN
        BEGIN
            start_at := sub_from::timestamptz;
        EXCEPTION WHEN others THEN
            PERFORM conveyor._raise('CVV01', format('subscriptionFrom must be now or a timestamp, got %s',
                                                    left(sub_from, 60)));
        END;
        mode := 'timestamp';
    ELSIF lower(sub_from) = 'now' OR lower(sub_mode) = 'new' THEN
        mode := 'new';
        start_at := now();
    END IF;
    INSERT INTO conveyor.consumer_groups AS x (queue_id, name, mode, start_at) VALUES (q.id, group_name, mode, start_at)
    ON CONFLICT (queue_id, name) DO NOTHING;
    -- this transaction flushes at commit whatever it is (a lazy pop_many reads this)
    PERFORM set_config('conveyor.group_registered', 'on', true);
    SELECT * INTO g FROM conveyor.consumer_groups x WHERE x.queue_id = q.id AND x.name = group_name;
    RETURN g;
END $$;

-- Whether a partition of the queue was pushed to within the walk's range [(from_xid,
-- from_id), (to_xid, to_id)): the group's mark moves only over such a range. Moving it over
-- an empty one saves no pop any reading, and would make every pop that finds nothing a
-- write (a transaction id, a WAL record and a flush at commit for a read). plpgsql, whose
-- plan is kept: a SQL function holding a subquery is not inlined, and was parsed and
-- planned at every call (a quarter of a pop on an empty queue).
CREATE OR REPLACE FUNCTION conveyor._pushed_between(queue_id bigint, from_xid xid8, from_id bigint,
                                                   to_xid xid8, to_id bigint) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXISTS (SELECT FROM conveyor.partitions p
                    WHERE p.queue_id = _pushed_between.queue_id
                      AND (p.head_xid, p.id) >= (from_xid, from_id) AND (p.head_xid, p.id) < (to_xid, to_id));
END $$;

-- Pops: {queue?, namespace?, task?, partition?, consumerGroup?, batch, maxPartitions?,
-- leaseSeconds?, workerId?}. Without a partition, takes up to maxPartitions partitions
-- with work (one lease shared by all of them), queues by priority. Returns
-- {messages: [...], leaseId} (messages empty when there is nothing to pop).
--
-- A wildcard pop must not scan every partition of a large queue each time. Candidates are
-- (1) partitions pushed to since the group's mark (partitions (head_xid, id) at or after
-- the group's (scanned_xid, scanned_id), through partitions_pushed_idx, in that order),
-- (2) partitions whose cursor says they are behind (a pop took part of their backlog, a
-- failure released a lease), (3) partitions whose lease expired. When a pop finds nothing
-- it moves the group's mark to the oldest transaction still running: every push from
-- before has committed and was looked at, and every later one is found by (1). A pop that
-- skipped a candidate (another pop or an ack held it) did not look at it, and leaves the
-- mark there. A pop whose walk in (1) passed drained or leased partitions before its first
-- with work moves the mark up to that one (see below).
CREATE OR REPLACE FUNCTION conveyor.pqueue_pop(request jsonb) RETURNS json
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    RETURN (conveyor._pqueue_pop(request, NULL)).answer;
END $$;

-- A pop (pqueue_pop's answer), and the candidates its walk listed and did not try. The
-- pops of one pqueue_pop_many call mostly name one queue and group (request fusion): a
-- wildcard pop of a named queue given those (carried) tries them first, as a page of its
-- own, before reading one (the candidates statement was a third of such a call's time);
-- anything they lack, the pop reads afresh. A carried candidate is as good as one the
-- pop would have read: the claim looks at the partition again, under its locks (a
-- concurrent pop or ack may have taken it since), and the partitions the earlier pops
-- took are not carried. What a carried page does not do is move the group's mark: only a
-- pop's own first page does, over partitions it looked at.
CREATE OR REPLACE FUNCTION conveyor._pqueue_pop(request jsonb, carried bigint[], OUT answer json,
                                                OUT left_over bigint[])
LANGUAGE plpgsql AS $$
DECLARE
    batch integer := conveyor._int_option(request, 'batch', 1, 10000, 1);
    max_parts integer := conveyor._int_option(request, 'maxPartitions', 1, 1000, 1);
    group_name text := coalesce(nullif(request ->> 'consumerGroup', ''), '__QUEUE_MODE__');
    part_name text := nullif(request ->> 'partition', '');
    worker text := left(request ->> 'workerId', 256);
    lease uuid := gen_random_uuid();
    got json[] := '{}';  -- the messages taken, each a JSON object (see _partition_claim)
    one json[];
    q conveyor.pqueues;
    g conveyor.consumer_groups;
    part conveyor.partitions;
    taken integer := 0;
    lease_seconds integer;
    snap_xmin xid8;
    scan_xmin xid8;
    scan_ts timestamptz;
    candidates bigint[];
    first_xid xid8;
    first_id bigint;
    tried bigint[];
    page integer;
    cut boolean;
    skipped boolean := false;
    candidate bigint;
    carrying boolean;
    next_at integer := 1;  -- the first candidate not looked at
BEGIN
    IF jsonb_typeof(request) IS DISTINCT FROM 'object' THEN
        PERFORM conveyor._raise('CVV01', 'a pop request must be a JSON object');
    END IF;
    -- the queue named, by its key; or those of a namespace or task (two branches: one
    -- condition with OR scanned every queue for every pop)
    FOR q IN
        SELECT * FROM conveyor.pqueues x WHERE x.name = request ->> 'queue'
        UNION ALL
        SELECT * FROM conveyor.pqueues x
         WHERE request ->> 'queue' IS NULL AND (request ->> 'namespace' IS NOT NULL OR request ->> 'task' IS NOT NULL)
           AND x.namespace IS NOT DISTINCT FROM coalesce(request ->> 'namespace', x.namespace)
           AND x.task IS NOT DISTINCT FROM coalesce(request ->> 'task', x.task)
        ORDER BY priority DESC, id
    LOOP
        EXIT WHEN taken >= max_parts OR cardinality(got) >= batch;
        g := conveyor._consumer_group(q, group_name, request ->> 'subscriptionMode', request ->> 'subscriptionFrom');
        lease_seconds := conveyor._int_option(request, 'leaseSeconds', 1, 86400, q.lease_time);
        IF part_name IS NOT NULL THEN
            SELECT * INTO part FROM conveyor.partitions p WHERE p.queue_id = q.id AND p.name = part_name;
            -- (a partition with nothing new for the group, or leased to another, is not
            -- locked: a pop that finds nothing stays a read. A cursor being changed is read
            -- as it was, which at worst sends the pop on to the claim.)
            IF FOUND AND NOT EXISTS (SELECT FROM conveyor.partition_cursors x
                                      WHERE x.partition_id = part.id AND x.consumer_group = group_name
                                        AND CASE WHEN x.lease_id IS NULL THEN NOT x.behind AND part.head <= x.cursor
                                                 ELSE x.lease_expires_at > clock_timestamp() END) THEN
                got := got || coalesce(conveyor._partition_claim(q, part, group_name, batch, lease, lease_seconds,
                                                                 worker), '{}');
            END IF;
            CONTINUE;
        END IF;
        snap_xmin := pg_snapshot_xmin(pg_current_snapshot());
        scan_ts := clock_timestamp();  -- a value, not a volatile call: the lease index can use it
        tried := '{}';
        page := 16;
        candidates := carried;
        carrying := carried IS NOT NULL AND request ->> 'queue' IS NOT NULL;
        -- The candidates, a page at a time, in one statement that reads each partition's
        -- cursor once: partitions pushed to since the group's mark that hold work for it
        -- and no live lease, oldest push first (their index's order: the scan
        -- stops at the page's end, so a pop reads a page, not every partition holding
        -- work); partitions the group left behind and partitions whose lease expired.
        -- Tried oldest push first. A page that runs out before the pop is served (its
        -- candidates were being claimed by concurrent pops) is followed by one of the rest,
        -- up to 1,000 at a time; when that bound is reached, only those are known to be
        -- looked at: the group's watermark moves to the newest of them, so a push that
        -- lands behind many partitions of one big transaction is still found.
        LOOP
            IF NOT carrying THEN
                -- One pass over the three sources, in the walk's order (their union sorted;
                -- an aggregate over it keeps that order): the candidates (a partition both
                -- pushed to and held back comes twice, side by side; the loop tries it once),
                -- whether a source filled its page (there may be more: cut), and the first
                -- partition pushed to. One aggregate rather than a subquery per figure: each
                -- plan node is set up again at every call (measured, executor start-up was a
                -- sixth of a pop's CPU).
                SELECT array_agg(c.id),
                       count(*) FILTER (WHERE c.src = 0) >= page OR count(*) FILTER (WHERE c.src = 1) >= page
                           OR count(*) FILTER (WHERE c.src = 2) >= page,
                       CASE WHEN count(*) FILTER (WHERE c.src = 0) >= page THEN max(c.head_xid) FILTER (WHERE c.src = 0)
                            ELSE snap_xmin END,
                       (array_agg(c.head_xid) FILTER (WHERE c.src = 0))[1],
                       (array_agg(c.id) FILTER (WHERE c.src = 0))[1]
                  FROM (SELECT u.* FROM (
                    -- partitions pushed to since the group's mark that hold work for it and no
                    -- live lease, oldest push first (their index's order: the scan stops at the
                    -- page's end). A lookup per partition of the range, not a join the planner
                    -- could turn into a scan of every cursor of every group (OFFSET 0 keeps it
                    -- apart).
                    (SELECT 0 AS src, p.id, p.head_xid
                       FROM conveyor.partitions p
                       LEFT JOIN LATERAL (SELECT x.cursor, x.lease_id, x.lease_expires_at
                                            FROM conveyor.partition_cursors x
                                           WHERE x.partition_id = p.id AND x.consumer_group = group_name
                                          OFFSET 0) x ON true
                      WHERE p.queue_id = q.id AND (p.head_xid, p.id) >= (g.scanned_xid, g.scanned_id)
                        AND p.head > coalesce(x.cursor, 0)
                        AND (x.lease_id IS NULL OR x.lease_expires_at <= scan_ts) AND p.id <> ALL (tried)
                      ORDER BY p.head_xid, p.id LIMIT page)
                    UNION ALL
                    -- partitions the group left behind (each cursor's partition looked up by
                    -- its key, for the same reason)
                    (SELECT 1, x.partition_id, p.head_xid FROM conveyor.partition_cursors x
                       CROSS JOIN LATERAL (SELECT p.head, p.head_xid FROM conveyor.partitions p
                                            WHERE p.id = x.partition_id OFFSET 0) p
                      WHERE x.queue_id = q.id AND x.consumer_group = group_name AND x.behind AND p.head > x.cursor
                        AND (x.lease_id IS NULL OR x.lease_expires_at <= scan_ts) AND x.partition_id <> ALL (tried)
                      LIMIT page)
                    UNION ALL
                    -- and those whose lease expired
                    (SELECT 2, x.partition_id, p.head_xid FROM conveyor.partition_cursors x
                       CROSS JOIN LATERAL (SELECT p.head, p.head_xid FROM conveyor.partitions p
                                            WHERE p.id = x.partition_id OFFSET 0) p
                      WHERE x.queue_id = q.id AND x.consumer_group = group_name AND x.lease_id IS NOT NULL
                        AND x.lease_expires_at <= scan_ts AND p.head > x.cursor AND x.partition_id <> ALL (tried)
                      ORDER BY x.lease_expires_at LIMIT page)) u
                    ORDER BY u.head_xid, u.id, u.src) c
                  INTO candidates, cut, scan_xmin, first_xid, first_id;
                IF cardinality(tried) = 0 THEN
                    -- Every partition the walk passed before its first with work (or, if it
                    -- found none, every one it passed) was drained or held under a lease (its
                    -- end is found through the cursor): the mark moves up to it, capped at the
                    -- oldest transaction still running, so no push it passes is still to
                    -- commit. By the pop that can lock the group's row: the others go on.
                    IF first_xid IS NULL OR first_xid >= snap_xmin THEN
                        first_xid := snap_xmin;
                        first_id := 0;
                    END IF;
                    -- (a pop with candidates writes anyway; one without moves the mark only
                    -- over partitions, to stay a read otherwise)
                    IF (first_xid, first_id) > (g.scanned_xid, g.scanned_id) THEN
                        IF candidates IS NOT NULL
                           OR conveyor._pushed_between(q.id, g.scanned_xid, g.scanned_id, first_xid, first_id) THEN
                            UPDATE conveyor.consumer_groups x SET scanned_xid = first_xid, scanned_id = first_id
                             WHERE x.queue_id = q.id AND x.name = group_name
                               AND (x.scanned_xid, x.scanned_id) < (first_xid, first_id)
                               AND x.ctid = (SELECT y.ctid FROM conveyor.consumer_groups y
                                              WHERE y.queue_id = q.id AND y.name = group_name FOR UPDATE SKIP LOCKED);
                        END IF;
                        -- this pop's walk holds nothing before that key: its own later steps (a
                        -- second page, the move below) start there, and do not probe it again
                        g.scanned_xid := first_xid;
                        g.scanned_id := first_id;
                    END IF;
                END IF;
            END IF;
            next_at := 1;
            WHILE next_at <= cardinality(candidates) LOOP
                EXIT WHEN taken >= max_parts OR cardinality(got) >= batch;
                candidate := candidates[next_at];
                next_at := next_at + 1;
                CONTINUE WHEN candidate = ANY (tried);  -- (pushed to and held back: listed twice)
                tried := tried || candidate;
                -- concurrent pops of the group skip a partition another is claiming
                IF NOT pg_try_advisory_xact_lock(hashtextextended(candidate || '/' || group_name, 7306554613)) THEN
                    skipped := true;
                    CONTINUE;
                END IF;
                SELECT * INTO part FROM conveyor.partitions p WHERE p.id = candidate;
                CONTINUE WHEN NOT FOUND;  -- (dropped since it was listed)
                one := conveyor._partition_claim(q, part, group_name, batch - cardinality(got), lease,
                                                 lease_seconds, worker);
                IF one IS NULL THEN
                    skipped := true;
                ELSIF cardinality(one) > 0 THEN
                    got := got || one;
                    taken := taken + 1;
                END IF;
            END LOOP;
            IF carrying THEN  -- then a page of the pop's own, if it still needs one
                carrying := false;
                EXIT WHEN taken >= max_parts OR cardinality(got) >= batch;
                CONTINUE;
            END IF;
            EXIT WHEN taken >= max_parts OR cardinality(got) >= batch OR NOT cut OR page >= 1000;
            page := 1000;
        END LOOP;
        IF taken = 0 AND NOT skipped AND (scan_xmin, 0::bigint) > (g.scanned_xid, g.scanned_id)
           AND conveyor._pushed_between(q.id, g.scanned_xid, g.scanned_id, scan_xmin, 0) THEN
            UPDATE conveyor.consumer_groups x SET scanned_xid = scan_xmin, scanned_id = 0
             WHERE x.queue_id = q.id AND x.name = group_name AND (x.scanned_xid, x.scanned_id) < (scan_xmin, 0);
        END IF;
    END LOOP;
    IF part_name IS NULL AND request ->> 'queue' IS NOT NULL THEN  -- (a wildcard pop of one queue)
        WHILE candidates[next_at] = ANY (tried) LOOP  -- (the last one tried, listed twice)
            next_at := next_at + 1;
        END LOOP;
        left_over := candidates[next_at:];
    END IF;
    IF coalesce(request ->> 'autoAck', 'false') = 'true' AND cardinality(got) > 0 THEN
        -- at most once: delivered means done, and no lease is left behind
        -- (each message's partition looked up by its key: a join read every partition's)
        PERFORM conveyor._partition_done(p.id, group_name, (e ->> 'seq')::bigint)
           FROM unnest(got) e
          CROSS JOIN LATERAL (SELECT p.id FROM conveyor.partitions p
                               WHERE p.uuid = (e ->> 'partitionId')::uuid OFFSET 0) p;
        UPDATE conveyor.partition_cursors x
           SET lease_id = NULL, lease_expires_at = NULL, leased_through = NULL,
               behind = (SELECT p.head FROM conveyor.partitions p WHERE p.id = x.partition_id) > x.cursor
         WHERE x.lease_id = lease;
        answer := json_build_object('messages', (SELECT json_agg(e::jsonb || '{"leaseId": ""}') FROM unnest(got) e),
                                    'leaseId', '');
        RETURN;
    END IF;
    answer := json_build_object('messages', array_to_json(got), 'leaseId', CASE WHEN cardinality(got) > 0 THEN lease END);
END $$;

-- The hot functions of partitioned queues keep generic plans, as the queue functions do
-- (0014): planned with each call's values, a statement on a partition the statistics have
-- not seen expects one row, and every index starting with partition_id looks as good as
-- the one the statement needs (measured: a pop read a new partition of 200,000 messages
-- through partition_messages' transaction id index). A generic plan expects an average
-- partition and takes the index that holds its conditions. Their tables are not
-- partitioned, so these plans do not follow the queue storage kinds (see _message_plans).
ALTER FUNCTION conveyor._pqueue_pop(jsonb, bigint[]) SET plan_cache_mode = force_generic_plan;
-- A pop's statements are lookups by key and walks of an index that stop at a page's end.
-- The tables they read are small and rewritten all the time (a cursor changes at every pop
-- and ack), so their statistics say a sequential scan costs a few pages: taken, it read
-- every dead version of every cursor left since the last vacuum (measured: 3 ms for a
-- pop's candidates, against 0.2), or the partitions table once per candidate. Never
-- sequential, then, whatever the statistics say; and never compiled (JIT): a plan that
-- keeps a sequential scan (the namespace branch above: no index holds its condition) costs
-- 10^10 with them off, past jit_above_cost, and compiling it took 116 ms a pop.
ALTER FUNCTION conveyor._pqueue_pop(jsonb, bigint[]) SET enable_seqscan = off;
ALTER FUNCTION conveyor._pqueue_pop(jsonb, bigint[]) SET jit = off;
-- Nor bitmap scans: the claim reads a partition's next messages in the order of its key
-- and stops at the batch's end; a bitmap scan reads every message of the partition past
-- the cursor, then sorts them (the generic plan's choice where the statistics say a
-- partition holds a few dozen: measured, 362 us against 118 for a pop of ten with
-- 1,024 partitions of 146 messages each, every one on a page of its own).
ALTER FUNCTION conveyor._pqueue_pop(jsonb, bigint[]) SET enable_bitmapscan = off;

-- Several pops in one call (request fusion): one answer per request, in order. They run
-- one after the other in one transaction, so no two of them get the same partition.
-- plpgsql, not LANGUAGE sql: a SQL function with SET clauses is never inlined, and its
-- statement was planned again on every call (migration 0025's lesson).
--
-- lazy: the caller commits this call on its own (the server: one statement, autocommit),
-- and its pops may commit without waiting for their WAL to reach the disk. A pop's writes
-- are a lease, a mark and fresh cursors (placed from the group's start, so made again the
-- same): lost in a crash, the messages are delivered again, as when a lease expires, and
-- an ack flushes every earlier record with its own. Not when a pop acknowledges (autoAck:
-- delivered is done) or registers a group (its start, 'now', would be a later instant
-- after a crash): those flush at commit as everything else does (docs/architecture.md,
-- "Durability of a pop").
CREATE OR REPLACE FUNCTION conveyor.pqueue_pop_many(requests jsonb, lazy boolean DEFAULT false) RETURNS json
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    request jsonb;
    answers json[] := '{}';
    popped record;
    carry bigint[];  -- the candidates the pop before listed and did not try (see _pqueue_pop)
    queue_name text;
    group_name text;
BEGIN
    IF jsonb_typeof(requests) IS DISTINCT FROM 'array' THEN
        PERFORM conveyor._raise('CVV01', 'requests must be a JSON array');
    END IF;
    FOR request IN SELECT r FROM jsonb_array_elements(requests) r LOOP
        IF request ->> 'queue' IS DISTINCT FROM queue_name
           OR coalesce(nullif(request ->> 'consumerGroup', ''), '__QUEUE_MODE__') IS DISTINCT FROM group_name THEN
            carry := NULL;  -- (only a pop of the same queue and group takes them)
        END IF;
        popped := conveyor._pqueue_pop(request, carry);
        answers := answers || popped.answer;
        carry := popped.left_over;
        queue_name := request ->> 'queue';
        group_name := coalesce(nullif(request ->> 'consumerGroup', ''), '__QUEUE_MODE__');
        lazy := lazy AND coalesce(request ->> 'autoAck', 'false') <> 'true';
    END LOOP;
    -- (transaction-local: it outlives this function's own settings, not the commit)
    IF lazy AND coalesce(current_setting('conveyor.group_registered', true), '') <> 'on' THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    RETURN array_to_json(answers);
END $$;

ALTER FUNCTION conveyor.pqueue_pop_many(jsonb, boolean) SET plan_cache_mode = force_generic_plan;

-- Marks one message done for a group: the cursor moves over every done message
-- directly after it. Caller holds the cursor row.
CREATE OR REPLACE FUNCTION conveyor._partition_done(partition_id bigint, group_name text, seq bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    c conveyor.partition_cursors;
BEGIN
    SELECT * INTO c FROM conveyor.partition_cursors x
     WHERE x.partition_id = _partition_done.partition_id AND x.consumer_group = group_name;
    IF seq <= c.cursor OR seq = ANY (c.done) THEN
        RETURN;
    END IF;
    PERFORM conveyor._partition_complete(c, seq, false);
END $$;

-- The cursor as it is once seq is done, in memory (nothing written): moved over the run
-- of done messages directly after it, the rest kept in done; with end_lease, the lease
-- ended once everything it covered is done, as an ack does. Applied one message at a
-- time, several of them, then written once by _cursor_write (an ack of a batch).
CREATE OR REPLACE FUNCTION conveyor._cursor_done(c conveyor.partition_cursors, seq bigint, end_lease boolean)
RETURNS conveyor.partition_cursors
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    now_done bigint[];
    pos bigint;
BEGIN
    IF seq = c.cursor + 1 AND cardinality(c.done) = 0 THEN
        c.cursor := seq;  -- the usual case, acks in order: nothing done ahead to move over
    ELSE
        now_done := c.done || seq;
        pos := c.cursor;
        WHILE pos + 1 = ANY (now_done) LOOP
            pos := pos + 1;
        END LOOP;
        c.cursor := pos;
        c.done := ARRAY(SELECT d FROM unnest(now_done) d WHERE d > pos ORDER BY d);
    END IF;
    c.consumed := c.consumed + 1;
    IF end_lease AND c.lease_id IS NOT NULL AND c.cursor >= c.leased_through THEN
        c.lease_id := NULL;
        c.lease_expires_at := NULL;
        c.leased_through := NULL;
    END IF;
    RETURN c;
END $$;

-- Writes a cursor changed by _cursor_done over its row (held by the caller), in one
-- UPDATE, and drops the retries of the messages it marked done (seqs). Where the lease
-- ended, whether the group is behind comes from the partition's head read afresh, so a
-- push that committed meanwhile is not missed.
CREATE OR REPLACE FUNCTION conveyor._cursor_write(c conveyor.partition_cursors, seqs bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE conveyor.partition_cursors x
       SET cursor = c.cursor, done = c.done, consumed = c.consumed, last_consumed_at = now(),
           lease_id = c.lease_id, lease_expires_at = c.lease_expires_at, leased_through = c.leased_through,
           behind = CASE WHEN x.lease_id IS NOT NULL AND c.lease_id IS NULL
                         THEN (SELECT p.head FROM conveyor.partitions p WHERE p.id = c.partition_id) > c.cursor
                         ELSE x.behind END
     WHERE x.partition_id = c.partition_id AND x.consumer_group = c.consumer_group;
    DELETE FROM conveyor.partition_retries r
     WHERE r.partition_id = c.partition_id AND r.consumer_group = c.consumer_group AND r.seq = ANY (seqs);
END $$;

-- The work of _partition_done given the cursor row as it is (held by the caller, seq not
-- done yet): one message marked done and written. Returns whether the lease ended.
CREATE OR REPLACE FUNCTION conveyor._partition_complete(c conveyor.partition_cursors, seq bigint, end_lease boolean)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    after conveyor.partition_cursors := conveyor._cursor_done(c, seq, end_lease);
BEGIN
    PERFORM conveyor._cursor_write(after, ARRAY[seq]);
    RETURN c.lease_id IS NOT NULL AND after.lease_id IS NULL;
END $$;

-- Moves a message to the dead letters of a group (or drops it when the queue does not
-- keep them) and marks it done. Caller holds the cursor row.
CREATE OR REPLACE FUNCTION conveyor._partition_dead_letter(q conveyor.pqueues, partition_id bigint, group_name text,
                                                seq bigint, error text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF q.dlq_after_max_retries THEN
        INSERT INTO conveyor.partition_dead_letters (queue_id, partition_id, seq, message_id, transaction_id, trace_id,
                                                     consumer_group, payload, is_encrypted, producer_sub, error,
                                                     failures, message_created_at)
        SELECT q.id, m.partition_id, m.seq, m.id, m.transaction_id, m.trace_id, group_name, m.payload, m.is_encrypted,
               m.producer_sub, error, coalesce((SELECT r.failures FROM conveyor.partition_retries r
                                                 WHERE r.partition_id = m.partition_id AND r.consumer_group = group_name
                                                   AND r.seq = m.seq), 0),
               m.created_at
          FROM conveyor.partition_messages m
         WHERE m.partition_id = _partition_dead_letter.partition_id AND m.seq = _partition_dead_letter.seq;
    END IF;
    PERFORM conveyor._partition_done(partition_id, group_name, seq);
END $$;

-- Extends leases: leases [{leaseId, seconds?}] (seconds default: the queue's lease
-- time). Only a lease still held is extended. Returns [{leaseId, success, error,
-- expiresAt}].
CREATE OR REPLACE FUNCTION conveyor.pqueue_renew(leases jsonb) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    l jsonb;
    answers jsonb := '[]';
    until timestamptz;
BEGIN
    IF leases IS NULL OR jsonb_typeof(leases) <> 'array' THEN
        PERFORM conveyor._raise('CVV01', 'leases must be a JSON array');
    END IF;
    FOR l IN SELECT * FROM jsonb_array_elements(leases) LOOP
        until := NULL;
        IF conveyor._is_uuid(l ->> 'leaseId') THEN
            WITH renewed AS (
                UPDATE conveyor.partition_cursors x
                   SET lease_expires_at = clock_timestamp() + make_interval(
                           secs => coalesce(conveyor._int_option(l, 'seconds', 1, 86400, NULL), q.lease_time))
                  FROM conveyor.pqueues q
                 WHERE x.lease_id = (l ->> 'leaseId')::uuid AND x.lease_expires_at > clock_timestamp()
                   AND q.id = x.queue_id
                RETURNING x.lease_expires_at)
            SELECT max(lease_expires_at) INTO until FROM renewed;
        END IF;
        answers := answers || jsonb_build_object(
            'leaseId', l ->> 'leaseId', 'success', until IS NOT NULL,
            'error', CASE WHEN until IS NULL THEN 'Lease not found or expired' END,
            'expiresAt', to_char(until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'));
    END LOOP;
    RETURN answers;
END $$;

ALTER FUNCTION conveyor.pqueue_renew(jsonb) SET plan_cache_mode = force_generic_plan;

-- Registers a group with a subscription mode: 'all' (from the oldest message), 'new'
-- (from now), 'timestamp' (from start_at). An existing group keeps its positions.
CREATE OR REPLACE FUNCTION conveyor.pqueue_subscribe(queue_name text, group_name text, mode text DEFAULT 'all',
                                          start_at timestamptz DEFAULT NULL) RETURNS conveyor.consumer_groups
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.pqueues := conveyor._pqueue(queue_name);
    g conveyor.consumer_groups;
BEGIN
    IF mode NOT IN ('all', 'new', 'timestamp') THEN
        PERFORM conveyor._raise('CVV01', format('subscription mode must be all, new or timestamp, got %s', left(mode, 40)));
    END IF;
    IF mode = 'timestamp' AND start_at IS NULL THEN
        PERFORM conveyor._raise('CVV01', 'subscription mode timestamp needs a start time');
    END IF;
    IF group_name IS NULL OR length(group_name) NOT BETWEEN 1 AND 256 OR group_name = '__QUEUE_MODE__' THEN
        PERFORM conveyor._raise('CVV01', 'a consumer group name is 1 to 256 characters');
    END IF;
    INSERT INTO conveyor.consumer_groups AS x (queue_id, name, mode, start_at)
    VALUES (q.id, group_name, mode, CASE mode WHEN 'new' THEN now() WHEN 'timestamp' THEN start_at END)
    ON CONFLICT (queue_id, name) DO NOTHING;
    SELECT * INTO g FROM conveyor.consumer_groups WHERE queue_id = q.id AND name = group_name;
    RETURN g;
END $$;

-- Moves a group to a point in time in every partition of a queue (replay, or skip):
-- messages from at on come again (at NULL: to the end, nothing comes again); leases are
-- dropped. Returns the partitions moved.
CREATE OR REPLACE FUNCTION conveyor.pqueue_seek(queue_name text, group_name text, at timestamptz) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.pqueues := conveyor._pqueue(queue_name);
    g conveyor.consumer_groups := conveyor._consumer_group(q, coalesce(group_name, '__QUEUE_MODE__'));
    n integer;
BEGIN
    UPDATE conveyor.consumer_groups x SET mode = CASE WHEN at IS NULL THEN 'new' ELSE 'timestamp' END,
                                          start_at = coalesce(at, now()), scanned_xid = '0', scanned_id = 0
     WHERE x.queue_id = q.id AND x.name = g.name;
    INSERT INTO conveyor.partition_cursors (partition_id, consumer_group, queue_id)
    SELECT p.id, g.name, q.id FROM conveyor.partitions p WHERE p.queue_id = q.id
    ON CONFLICT DO NOTHING;
    UPDATE conveyor.partition_cursors x
       SET cursor = CASE WHEN at IS NULL THEN (SELECT p.head FROM conveyor.partitions p WHERE p.id = x.partition_id)
                         ELSE coalesce((SELECT max(m.seq) FROM conveyor.partition_messages m
                                         WHERE m.partition_id = x.partition_id AND m.created_at < at), 0) END,
           done = '{}', lease_id = NULL, lease_expires_at = NULL, leased_through = NULL, behind = true
     WHERE x.queue_id = q.id AND x.consumer_group = g.name;
    GET DIAGNOSTICS n = ROW_COUNT;
    DELETE FROM conveyor.partition_retries r USING conveyor.partitions p
     WHERE p.queue_id = q.id AND r.partition_id = p.id AND r.consumer_group = g.name;
    RETURN n;
END $$;

-- Removes the messages of a queue (or of one partition of it) and every group's
-- position, leases and retries there. Returns the messages removed.
CREATE OR REPLACE FUNCTION conveyor.pqueue_clear(queue_name text, partition_name text DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.pqueues := conveyor._pqueue(queue_name);
    n bigint;
BEGIN
    PERFORM 1 FROM conveyor.partitions p
     WHERE p.queue_id = q.id AND (partition_name IS NULL OR p.name = partition_name) ORDER BY p.id FOR UPDATE;
    DELETE FROM conveyor.partition_messages m USING conveyor.partitions p
     WHERE m.partition_id = p.id AND p.queue_id = q.id AND (partition_name IS NULL OR p.name = partition_name);
    GET DIAGNOSTICS n = ROW_COUNT;
    UPDATE conveyor.partition_cursors x SET cursor = p.head, done = '{}', lease_id = NULL, lease_expires_at = NULL,
                                            leased_through = NULL, behind = false
      FROM conveyor.partitions p
     WHERE x.partition_id = p.id AND p.queue_id = q.id AND (partition_name IS NULL OR p.name = partition_name);
    DELETE FROM conveyor.partition_retries r USING conveyor.partitions p
     WHERE r.partition_id = p.id AND p.queue_id = q.id AND (partition_name IS NULL OR p.name = partition_name);
    RETURN n;
END $$;

-- Forgets a group (its positions, leases and retries) on one queue, or on every queue.
CREATE OR REPLACE FUNCTION conveyor.pqueue_group_delete(group_name text, queue_name text DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    n integer;
BEGIN
    DELETE FROM conveyor.partition_cursors x USING conveyor.pqueues q
     WHERE x.queue_id = q.id AND x.consumer_group = group_name AND (queue_name IS NULL OR q.name = queue_name);
    DELETE FROM conveyor.partition_retries r USING conveyor.partitions p, conveyor.pqueues q
     WHERE r.partition_id = p.id AND p.queue_id = q.id AND r.consumer_group = group_name
       AND (queue_name IS NULL OR q.name = queue_name);
    DELETE FROM conveyor.consumer_groups g USING conveyor.pqueues q
     WHERE g.queue_id = q.id AND g.name = group_name AND (queue_name IS NULL OR q.name = queue_name);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- Every group of every queue (or of one) with its lag: messages not yet done, the oldest
-- of them, partitions behind and leases held.
CREATE OR REPLACE VIEW conveyor.consumer_group_lag AS
SELECT q.name AS queue, g.name AS consumer_group, g.mode, g.start_at, g.created_at,
       coalesce(sum(greatest(p.head - coalesce(x.cursor, 0), 0) - coalesce(cardinality(x.done), 0)), 0)::bigint AS lag,
       count(*) FILTER (WHERE p.head > coalesce(x.cursor, 0))::bigint AS partitions_behind,
       count(x.lease_id) FILTER (WHERE x.lease_expires_at > now())::bigint AS leases,
       (SELECT min(m.created_at) FROM conveyor.partitions p2
          JOIN conveyor.partition_cursors x2 ON x2.partition_id = p2.id AND x2.consumer_group = g.name
          JOIN conveyor.partition_messages m ON m.partition_id = p2.id AND m.seq = x2.cursor + 1
         WHERE p2.queue_id = q.id) AS oldest_pending_at,
       max(x.last_consumed_at) AS last_consumed_at
  FROM conveyor.consumer_groups g
  JOIN conveyor.pqueues q ON q.id = g.queue_id
  LEFT JOIN conveyor.partitions p ON p.queue_id = q.id
  LEFT JOIN conveyor.partition_cursors x ON x.partition_id = p.id AND x.consumer_group = g.name
 GROUP BY q.id, q.name, g.name, g.mode, g.start_at, g.created_at;

-- Pushes dead letters back as new messages of their partitions (new transaction ids) and
-- removes them from the dead letters. Returns the number retried.
CREATE OR REPLACE FUNCTION conveyor.pqueue_dead_letter_retry(ids bigint[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    items jsonb;
BEGIN
    WITH gone AS (
        DELETE FROM conveyor.partition_dead_letters d WHERE d.id = ANY (ids) RETURNING d.*)
    SELECT jsonb_agg(jsonb_build_object('queue', q.name, 'partition', p.name, 'payload', gone.payload,
                                        'encrypted', gone.is_encrypted, 'producerSub', gone.producer_sub,
                                        'traceId', gone.trace_id,
                                        'transactionId', gone.transaction_id || ':retry:' || gone.id) ORDER BY gone.id)
      INTO items
      FROM gone JOIN conveyor.partitions p ON p.id = gone.partition_id JOIN conveyor.pqueues q ON q.id = p.queue_id;
    IF items IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM conveyor.pqueue_push(items);
    RETURN jsonb_array_length(items);
END $$;

-- Records a named event about a message (a trace): data {transactionId, partitionId,
-- consumerGroup?, traceNames?, eventType?, data?, workerId?}. Returns the trace's id, or
-- NULL if the message does not exist.
CREATE OR REPLACE FUNCTION conveyor.pqueue_trace(data jsonb) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    m conveyor.partition_messages;
    names text[];
    id bigint;
BEGIN
    IF jsonb_typeof(data) IS DISTINCT FROM 'object' THEN
        PERFORM conveyor._raise('CVV01', 'a trace is a JSON object');
    END IF;
    IF conveyor._is_uuid(data ->> 'partitionId') THEN
        SELECT x.* INTO m FROM conveyor.partition_messages x JOIN conveyor.partitions p ON p.id = x.partition_id
         WHERE p.uuid = (data ->> 'partitionId')::uuid AND x.transaction_id = data ->> 'transactionId';
    END IF;
    IF m.seq IS NULL THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(data -> 'traceNames') = 'array' THEN
        SELECT coalesce(array_agg(left(n, 256)), '{}') INTO names
          FROM jsonb_array_elements_text(data -> 'traceNames') n WHERE n <> '';
    ELSIF jsonb_typeof(data -> 'traceNames') = 'string' THEN
        names := ARRAY[left(data ->> 'traceNames', 256)];
    END IF;
    INSERT INTO conveyor.message_traces (partition_id, message_id, transaction_id, consumer_group, event_type,
                                         trace_names, data, worker_id)
    VALUES (m.partition_id, m.id, m.transaction_id, coalesce(nullif(data ->> 'consumerGroup', ''), '__QUEUE_MODE__'),
            left(coalesce(nullif(data ->> 'eventType', ''), 'info'), 64), coalesce(names, '{}'), data -> 'data',
            left(data ->> 'workerId', 256))
    RETURNING message_traces.id INTO id;
    RETURN id;
END $$;

-- Administration of single messages: removes one (from every group's view), sends one
-- to the dead letters of a group, or pushes a dead letter of it back. Each returns
-- whether it acted.
CREATE OR REPLACE FUNCTION conveyor.pqueue_message_delete(partition_uuid uuid, transaction_id text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    m conveyor.partition_messages;
    g record;
BEGIN
    SELECT x.* INTO m FROM conveyor.partition_messages x JOIN conveyor.partitions p ON p.id = x.partition_id
     WHERE p.uuid = partition_uuid AND x.transaction_id = pqueue_message_delete.transaction_id;
    IF m.seq IS NULL THEN
        RETURN false;
    END IF;
    -- every group's cursor treats it as done, so no cursor waits for it
    FOR g IN SELECT x.consumer_group FROM conveyor.partition_cursors x WHERE x.partition_id = m.partition_id FOR UPDATE LOOP
        PERFORM conveyor._partition_done(m.partition_id, g.consumer_group, m.seq);
    END LOOP;
    DELETE FROM conveyor.partition_messages x WHERE x.partition_id = m.partition_id AND x.seq = m.seq;
    RETURN true;
END $$;

CREATE OR REPLACE FUNCTION conveyor.pqueue_message_dead_letter(partition_uuid uuid, transaction_id text,
                                                    group_name text DEFAULT NULL, error text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    m conveyor.partition_messages;
    q conveyor.pqueues;
    part conveyor.partitions;
    grp text := coalesce(nullif(group_name, ''), '__QUEUE_MODE__');
BEGIN
    SELECT * INTO part FROM conveyor.partitions p WHERE p.uuid = partition_uuid;
    SELECT x.* INTO m FROM conveyor.partition_messages x
     WHERE x.partition_id = part.id AND x.transaction_id = pqueue_message_dead_letter.transaction_id;
    IF m.seq IS NULL THEN
        RETURN false;
    END IF;
    SELECT * INTO q FROM conveyor.pqueues WHERE id = part.queue_id;
    PERFORM conveyor._partition_cursor(part, grp);
    PERFORM 1 FROM conveyor.partition_cursors x WHERE x.partition_id = part.id AND x.consumer_group = grp FOR UPDATE;
    IF EXISTS (SELECT 1 FROM conveyor.partition_cursors x WHERE x.partition_id = part.id AND x.consumer_group = grp
                 AND (x.cursor >= m.seq OR m.seq = ANY (x.done))) THEN
        RETURN false;  -- already done for that group
    END IF;
    INSERT INTO conveyor.partition_dead_letters (queue_id, partition_id, seq, message_id, transaction_id, trace_id,
                                                 consumer_group, payload, is_encrypted, producer_sub, error, failures,
                                                 message_created_at)
    VALUES (q.id, part.id, m.seq, m.id, m.transaction_id, m.trace_id, grp, m.payload, m.is_encrypted, m.producer_sub,
            coalesce(error, 'moved to the dead letters by an operator'), 0, m.created_at);
    PERFORM conveyor._partition_done(part.id, grp, m.seq);
    RETURN true;
END $$;

-- Removes messages past their queue's retention, and messages every group has consumed
-- once completed retention has passed. Returns the number removed.
CREATE OR REPLACE FUNCTION conveyor.pqueue_maintain() RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    n bigint := 0;
    k bigint;
BEGIN
    DELETE FROM conveyor.partition_messages m USING conveyor.partitions p, conveyor.pqueues q
     WHERE m.partition_id = p.id AND p.queue_id = q.id AND q.retention_seconds > 0
       AND m.created_at < now() - make_interval(secs => q.retention_seconds);
    GET DIAGNOSTICS k = ROW_COUNT;
    n := n + k;
    DELETE FROM conveyor.partition_messages m USING conveyor.partitions p, conveyor.pqueues q
     WHERE m.partition_id = p.id AND p.queue_id = q.id AND q.completed_retention_seconds > 0
       AND m.created_at < now() - make_interval(secs => q.completed_retention_seconds)
       AND EXISTS (SELECT 1 FROM conveyor.consumer_groups g WHERE g.queue_id = q.id)
       AND NOT EXISTS (SELECT 1 FROM conveyor.consumer_groups g
                        LEFT JOIN conveyor.partition_cursors x ON x.partition_id = p.id AND x.consumer_group = g.name
                        WHERE g.queue_id = q.id AND coalesce(x.cursor, 0) < m.seq);
    GET DIAGNOSTICS k = ROW_COUNT;
    RETURN n + k;
END $$;

-- Claims up to batch messages of a partition for a group under the lease: returns them as
-- an array of JSON objects (empty when the partition has nothing for the group now, or
-- another worker holds it), or NULL when another pop or an ack held the cursor row, so
-- that this pop did not look at the partition, which its caller must know (see
-- pqueue_pop's scanned_xid).
-- The messages older than maxWaitTimeSeconds are found from the cursor by primary key, in
-- seq order: they are the pending messages before the first one that is not (messages
-- are numbered as they are pushed, so their times follow their numbers), and reading them
-- stops there. The messages are read once: their numbers and their answers in one
-- statement (0027 changed the function's result from a set of messages to one array).
-- json, not jsonb (0029), here and through the pop and the ack: the answers are only
-- passed on, and a jsonb object costs 2.4 times a json one to build (nine of 13 us a
-- message), then again to append to an array and to print.
CREATE OR REPLACE FUNCTION conveyor._partition_claim(q conveyor.pqueues, part conveyor.partitions, group_name text,
                                                     batch integer, lease uuid, lease_seconds integer, worker text)
RETURNS json[]
LANGUAGE plpgsql AS $$
DECLARE
    c conveyor.partition_cursors;
    ts timestamptz := clock_timestamp();
    through bigint;
    got json[];
    expired bigint[];
    deadline timestamptz;
BEGIN
    SELECT * INTO c FROM conveyor.partition_cursors x
     WHERE x.partition_id = part.id AND x.consumer_group = group_name
       FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        -- the group's first look at the partition (the row is made), or the row is held
        PERFORM conveyor._partition_cursor(part, group_name);
        SELECT * INTO c FROM conveyor.partition_cursors x
         WHERE x.partition_id = part.id AND x.consumer_group = group_name
           FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
    END IF;
    IF c.lease_id IS NOT NULL AND c.lease_expires_at > ts THEN
        RETURN '{}';  -- another worker holds it
    END IF;
    IF q.window_buffer > 0 AND part.head_at > ts - make_interval(secs => q.window_buffer) THEN
        -- the partition is still being written to: wait until it is quiet (look again later)
        UPDATE conveyor.partition_cursors x SET behind = true
         WHERE x.partition_id = part.id AND x.consumer_group = group_name AND NOT x.behind;
        RETURN '{}';
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
    SELECT max(m.seq),
           array_agg(json_build_object(
               'id', m.id, 'transactionId', m.transaction_id, 'traceId', m.trace_id, 'data', m.payload,
               'encrypted', m.is_encrypted, 'producerSub', m.producer_sub,
               'createdAt', to_char(m.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
               'seq', m.seq, 'queue', q.name, 'partition', part.name, 'partitionId', part.uuid,
               'consumerGroup', group_name, 'leaseId', lease,
               'retryCount', coalesce(r.failures, 0), 'priority', q.priority) ORDER BY m.seq)
      INTO through, got
      FROM (SELECT m.* FROM conveyor.partition_messages m
             WHERE m.partition_id = part.id AND m.seq > c.cursor AND m.seq <> ALL (c.done)
               AND (q.delayed_processing = 0 OR m.created_at <= ts - make_interval(secs => q.delayed_processing))
             ORDER BY m.seq LIMIT batch) m
      -- a lookup by key per message taken (OFFSET 0 keeps the subquery apart)
      LEFT JOIN LATERAL (SELECT r.failures FROM conveyor.partition_retries r
                          WHERE r.partition_id = m.partition_id AND r.consumer_group = group_name AND r.seq = m.seq
                         OFFSET 0) r ON true;
    IF through IS NULL THEN
        UPDATE conveyor.partition_cursors x SET behind = (q.delayed_processing > 0 AND
                                                          (SELECT p.head FROM conveyor.partitions p WHERE p.id = part.id) > x.cursor),
                                                lease_id = NULL, lease_expires_at = NULL, leased_through = NULL
         WHERE x.partition_id = part.id AND x.consumer_group = group_name AND (x.behind OR x.lease_id IS NOT NULL);
        RETURN '{}';
    END IF;
    UPDATE conveyor.partition_cursors x
       SET lease_id = lease, lease_expires_at = ts + make_interval(secs => lease_seconds), leased_through = through,
           worker_id = worker, behind = (part.head > through)
     WHERE x.partition_id = part.id AND x.consumer_group = group_name;
    RETURN got;
END $$;

-- The usual acks, settled in a few set-based statements instead of a pass of pqueue_ack's
-- loop per ack (some thirty plpgsql expressions and a lookup each, most of an ack's cost):
-- a run of completions of messages of one partition for one group, all naming the lease
-- the group holds there, each of a message that lease covers and the group has not done,
-- none twice, and no other ack of the batch naming that partition and group. That is what
-- a consumer acks after a pop; a fused call carries several such runs, one per request.
-- The cursor moves through _cursor_done, as in the loop; a run's last completion is the
-- one that can end the lease (everything the lease covers is then done).
-- Returns pqueue_ack's answers for the acks it settled (their "index" says which), having
-- written their cursors as the loop would; the loop decides the rest. Runs of different
-- cursors do not touch each other's state, so settling one before the others' acks is
-- settling them in order. (tests/core/test_partitioned.py checks the answers and cursors
-- against the loop's.)
CREATE OR REPLACE FUNCTION conveyor._ack_completions(acks jsonb, ts timestamptz) RETURNS json[]
LANGUAGE plpgsql AS $$
DECLARE
    run record;
    n integer;
    usual boolean;
    part conveyor.partitions;
    q conveyor.pqueues;
    c conveyor.partition_cursors;
    after conveyor.partition_cursors;
    seqs bigint[];
    ids uuid[];
    seq bigint;
    answers json[] := '{}';
    idxs bigint[] := '{}';  -- each answer's index
    runs integer := 0;
BEGIN
    -- Grouped by the partition's id as written, folded as a UUID's forms fold (case and
    -- hyphens), so that every ack naming a partition lands in its group; a group is a run
    -- only if all its acks write the id alike, and that one text is checked once.
    FOR run IN
        SELECT min(e.partition_named) AS partition_named, e.group_name, min(e.lease_named) AS lease_named,
               array_agg(e.i ORDER BY e.i) AS idxs, array_agg(e.txn ORDER BY e.i) AS txns
          FROM (SELECT x.i - 1 AS i, x.a ->> 'transactionId' AS txn, lower(x.a ->> 'leaseId') AS lease_named,
                       coalesce(nullif(x.a ->> 'consumerGroup', ''), '__QUEUE_MODE__') AS group_name,
                       lower(coalesce(nullif(x.a ->> 'status', ''), 'completed')) IN ('completed', 'success')
                           AND nullif(x.a ->> 'leaseId', '') IS NOT NULL AS completion,
                       x.a ->> 'partitionId' AS partition_named
                  FROM jsonb_array_elements(acks) WITH ORDINALITY x(a, i)
                 WHERE jsonb_typeof(x.a) = 'object') e
         WHERE e.partition_named IS NOT NULL
         GROUP BY lower(replace(e.partition_named, '-', '')), e.group_name
        HAVING count(*) > 1 AND bool_and(e.completion) AND count(DISTINCT e.lease_named) = 1
               AND count(DISTINCT e.partition_named) = 1 AND conveyor._is_uuid(min(e.partition_named))
         ORDER BY min(e.i)
    LOOP
        n := cardinality(run.idxs);
        SELECT * INTO part FROM conveyor.partitions p WHERE p.uuid = run.partition_named::uuid;
        CONTINUE WHEN NOT FOUND;
        SELECT * INTO c FROM conveyor.partition_cursors x
         WHERE x.partition_id = part.id AND x.consumer_group = run.group_name FOR UPDATE;
        CONTINUE WHEN NOT FOUND OR c.lease_id IS NULL OR c.lease_expires_at <= ts
                      OR c.lease_id::text <> run.lease_named;
        SELECT * INTO q FROM conveyor.pqueues x WHERE x.id = part.queue_id;
        SELECT count(m.seq) = n AND count(DISTINCT m.seq) = n
               AND bool_and(m.seq > c.cursor AND m.seq <= c.leased_through AND m.seq <> ALL (c.done)),
               array_agg(m.seq ORDER BY t.k), array_agg(m.id ORDER BY t.k)
          INTO usual, seqs, ids
          FROM unnest(run.txns) WITH ORDINALITY t(txn, k)
          -- a lookup by key per ack, not a join the planner could turn into a scan of the
          -- partition (OFFSET 0 keeps the subquery apart)
          LEFT JOIN LATERAL (SELECT m.seq, m.id, m.transaction_id FROM conveyor.partition_messages m
                              WHERE m.partition_id = part.id AND m.transaction_id = t.txn OFFSET 0) m ON true;
        CONTINUE WHEN usual IS NOT TRUE;
        after := c;  -- in memory, as the loop does, then written once
        FOREACH seq IN ARRAY seqs LOOP
            after := conveyor._cursor_done(after, seq, true);
        END LOOP;
        PERFORM conveyor._cursor_write(after, seqs);
        -- (the run's last completion is the one that can end the lease)
        answers := answers || ARRAY(
            SELECT json_build_object('index', run.idxs[k], 'transactionId', run.txns[k], 'partitionId', part.uuid,
                                     'messageId', ids[k], 'success', true, 'error', NULL, 'outcome', 'completed',
                                     'dlq', false, 'leaseReleased', k = n AND after.lease_id IS NULL,
                                     'queueName', q.name, 'partitionName', part.name)
              FROM generate_series(1, n) k ORDER BY k);
        idxs := idxs || run.idxs;
        runs := runs + 1;
    END LOOP;
    IF runs > 1 THEN  -- in the batch's order (runs may interleave)
        answers := ARRAY(SELECT a FROM unnest(answers, idxs) x(a, i) ORDER BY i);
    END IF;
    RETURN answers;
END $$;

-- 0009's pqueue_ack; the lease check changed (see the comment at the check), and the usual
-- runs of completions are settled by _ack_completions (run with this function's generic
-- plans), the rest here, an ack at a time.
CREATE OR REPLACE FUNCTION conveyor.pqueue_ack(acks jsonb, strict boolean DEFAULT false) RETURNS json
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    a jsonb;
    idx integer := 0;
    answers json[] := '{}';
    m conveyor.partition_messages;
    part conveyor.partitions;
    q conveyor.pqueues;
    c conveyor.partition_cursors;
    group_name text;
    status text;
    outcome text;
    failures integer;
    released boolean;
    lease_named text;
    live boolean;
    refusal text;
    named_partition text := '';  -- (a partition id no ack names: the first ack looks its partition up)
    ts timestamptz := clock_timestamp();
    -- Acks of a batch mostly complete messages of one partition for one group, in a row:
    -- the cursor row is read (and locked) once for such a run, changed in memory by each
    -- completion (held), and written once when the run ends (pending: the messages done
    -- since the last write), instead of a read, an update and its foreign-key check per ack.
    held conveyor.partition_cursors;
    pending bigint[] := '{}';
    settled json[];  -- the answers of the acks _ack_completions settled (handled: their indexes)
    handled integer[] := '{}';
BEGIN
    IF acks IS NULL OR jsonb_typeof(acks) <> 'array' THEN
        PERFORM conveyor._raise('CVV01', 'acks must be a JSON array');
    END IF;
    IF jsonb_array_length(acks) > 1 THEN  -- (a lone ack costs the loop less than those statements)
        settled := conveyor._ack_completions(acks, ts);
        IF cardinality(settled) = jsonb_array_length(acks) THEN
            RETURN array_to_json(settled);
        END IF;
        handled := ARRAY(SELECT (x ->> 'index')::integer FROM unnest(settled) x);
    END IF;
    FOR a IN SELECT * FROM jsonb_array_elements(acks) LOOP
        IF idx = ANY (handled) THEN
            idx := idx + 1;
            CONTINUE;
        END IF;
        IF jsonb_typeof(a) <> 'object' THEN
            PERFORM conveyor._raise('CVV01', 'each ack is a JSON object');
        END IF;
        group_name := coalesce(nullif(a ->> 'consumerGroup', ''), '__QUEUE_MODE__');
        status := lower(coalesce(nullif(a ->> 'status', ''), 'completed'));
        IF status NOT IN ('completed', 'success', 'failed', 'dlq', 'retry') THEN
            PERFORM conveyor._raise('CVV01', format('ack status must be completed, failed, dlq or retry, got %s',
                                                    left(status, 40)));
        END IF;
        m := NULL;
        IF a ->> 'partitionId' IS NOT DISTINCT FROM named_partition THEN
            NULL;  -- the partition (and its queue) of the ack before: acks of a batch mostly name one
        ELSIF conveyor._is_uuid(a ->> 'partitionId') THEN
            SELECT * INTO part FROM conveyor.partitions p WHERE p.uuid = (a ->> 'partitionId')::uuid;
            SELECT * INTO q FROM conveyor.pqueues WHERE id = part.queue_id;
            named_partition := a ->> 'partitionId';
        ELSE
            part := NULL;
            named_partition := NULL;
        END IF;
        IF part.id IS NOT NULL THEN
            SELECT * INTO m FROM conveyor.partition_messages x
             WHERE x.partition_id = part.id AND x.transaction_id = a ->> 'transactionId';
        END IF;
        IF m.seq IS NULL THEN
            IF strict THEN
                PERFORM conveyor._raise('CVK03', format('message %s of partition %s does not exist',
                                                        left(a ->> 'transactionId', 100), left(a ->> 'partitionId', 40)));
            END IF;
            answers := answers || json_build_object('index', idx, 'transactionId', a ->> 'transactionId',
                                                     'partitionId', a ->> 'partitionId', 'success', false,
                                                     'error', 'Message not found', 'dlq', false, 'leaseReleased', false);
            idx := idx + 1;
            CONTINUE;
        END IF;
        -- serialise acks of one (partition, group): the lock is the cursor row's
        IF held.partition_id = part.id AND held.consumer_group = group_name THEN
            c := held;  -- the row this run holds, as its acks have changed it
        ELSE
            IF cardinality(pending) > 0 THEN
                PERFORM conveyor._cursor_write(held, pending);
                pending := '{}';
            END IF;
            SELECT * INTO c FROM conveyor.partition_cursors x
             WHERE x.partition_id = part.id AND x.consumer_group = group_name FOR UPDATE;
            held := c;
        END IF;
        -- Fencing. An ack naming a lease acts only under that lease, still held, on a
        -- message it covers. An ack naming none cannot tell whose it is: while anyone
        -- holds a live lease on the partition for the group it is refused (the holder's
        -- ack names its lease); with no live lease it settles a message the group has not
        -- done yet, as Queen's server does.
        lease_named := lower(nullif(a ->> 'leaseId', ''));
        live := coalesce(c.lease_id IS NOT NULL AND c.lease_expires_at > ts, false);
        refusal := NULL;
        IF c.partition_id IS NULL THEN
            refusal := 'Message not delivered to this consumer group';
        ELSIF lease_named IS NOT NULL THEN
            IF NOT live OR c.lease_id::text <> lease_named OR m.seq <= c.cursor OR m.seq > c.leased_through
               OR m.seq = ANY (c.done) THEN
                refusal := 'Invalid or expired lease';
            END IF;
        ELSIF live THEN
            refusal := 'Message is leased to another consumer (an ack under a lease names its leaseId)';
        ELSIF m.seq <= c.cursor OR m.seq = ANY (c.done) THEN
            refusal := 'Message already acknowledged';
        END IF;
        IF refusal IS NOT NULL THEN
            IF strict THEN
                PERFORM conveyor._raise('CVK02', format('message %s is not acknowledged: %s', left(m.transaction_id, 100),
                    CASE WHEN refusal = 'Invalid or expired lease'
                         THEN 'it is not leased to this consumer (the lease expired, was released or is another''s)'
                         ELSE refusal END));
            END IF;
            answers := answers || json_build_object('index', idx, 'transactionId', m.transaction_id,
                                                     'partitionId', part.uuid, 'success', false,
                                                     'error', refusal, 'dlq', false,
                                                     'leaseReleased', false, 'queueName', q.name,
                                                     'partitionName', part.name);
            idx := idx + 1;
            CONTINUE;
        END IF;
        IF status IN ('completed', 'success') THEN
            held := conveyor._cursor_done(c, m.seq, true);
            pending := pending || m.seq;
            released := c.lease_id IS NOT NULL AND held.lease_id IS NULL;
            outcome := 'completed';
        ELSE
            -- the other outcomes write as they go: the run's completions first, and the
            -- next ack reads the row again
            IF cardinality(pending) > 0 THEN
                PERFORM conveyor._cursor_write(held, pending);
                pending := '{}';
            END IF;
            held := NULL;
            IF status = 'retry' THEN
                outcome := 'released';
            ELSE
                INSERT INTO conveyor.partition_retries AS r (partition_id, consumer_group, seq, failures, last_error)
                VALUES (part.id, group_name, m.seq, 1, left(a ->> 'error', 4000))
                ON CONFLICT (partition_id, consumer_group, seq)
                   DO UPDATE SET failures = r.failures + 1, last_error = excluded.last_error
                RETURNING r.failures INTO failures;
                IF status = 'dlq' OR failures > q.retry_limit THEN
                    PERFORM conveyor._partition_dead_letter(q, part.id, group_name, m.seq,
                                                            coalesce(left(a ->> 'error', 4000), 'Retries exhausted'));
                    outcome := 'dlq';
                ELSE
                    outcome := 'retry';
                END IF;
            END IF;
        END IF;
        IF outcome IN ('retry', 'released') THEN
            -- give the lease up: what is not done comes again
            UPDATE conveyor.partition_cursors x
               SET lease_id = NULL, lease_expires_at = NULL, leased_through = NULL, behind = true
             WHERE x.partition_id = part.id AND x.consumer_group = group_name;
            released := true;
        ELSIF outcome = 'dlq' THEN
            -- the lease ends when everything it covered is done (a completion ended it
            -- above, in the same UPDATE); the partition's head is read afresh, so a push
            -- that committed meanwhile is not missed
            UPDATE conveyor.partition_cursors x
               SET lease_id = NULL, lease_expires_at = NULL, leased_through = NULL,
                   behind = (SELECT p.head FROM conveyor.partitions p WHERE p.id = part.id) > x.cursor
             WHERE x.partition_id = part.id AND x.consumer_group = group_name AND x.lease_id IS NOT NULL
               AND x.cursor >= x.leased_through;
            released := FOUND;
        END IF;
        answers := answers || json_build_object('index', idx, 'transactionId', m.transaction_id,
                                                 'partitionId', part.uuid, 'messageId', m.id, 'success', true,
                                                 'error', NULL, 'outcome', outcome, 'dlq', outcome = 'dlq',
                                                 'leaseReleased', released, 'queueName', q.name,
                                                 'partitionName', part.name);
        idx := idx + 1;
    END LOOP;
    IF cardinality(pending) > 0 THEN
        PERFORM conveyor._cursor_write(held, pending);
    END IF;
    IF cardinality(handled) > 0 THEN
        answers := ARRAY(SELECT x FROM unnest(answers || settled) x ORDER BY (x ->> 'index')::integer);
    END IF;
    RETURN array_to_json(answers);
END $$;

-- Both keep the generic plans 0020 gave them (CREATE OR REPLACE resets a function's SET
-- clauses, and pqueue_transaction has a new signature): an ack planned per call on a
-- partition the statistics had not seen read every message kept before it.
ALTER FUNCTION conveyor.pqueue_ack(jsonb, boolean) SET plan_cache_mode = force_generic_plan;
-- Its lookups by key, like the pop's, never sequential whatever the statistics say (see
-- pqueue_pop): statistics of when the partitions' table was small had it read the whole
-- table, dead versions included, for a partition by its uuid and again for its head.
ALTER FUNCTION conveyor.pqueue_ack(jsonb, boolean) SET enable_seqscan = off;
ALTER FUNCTION conveyor.pqueue_ack(jsonb, boolean) SET jit = off;

CREATE OR REPLACE FUNCTION conveyor.pqueue_transaction(operations jsonb, required_leases jsonb DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    op jsonb;
    acks jsonb := '[]';
    pushes jsonb := '[]';
    held uuid[];
    missing text;
    lease uuid;
BEGIN
    IF operations IS NULL OR jsonb_typeof(operations) <> 'array' OR jsonb_array_length(operations) = 0 THEN
        PERFORM conveyor._raise('CVV01', 'operations must be a non-empty JSON array');
    END IF;
    IF required_leases IS NOT NULL AND jsonb_typeof(required_leases) <> 'null' THEN
        IF jsonb_typeof(required_leases) <> 'array'
           OR EXISTS (SELECT 1 FROM jsonb_array_elements(required_leases) l WHERE jsonb_typeof(l) <> 'string') THEN
            PERFORM conveyor._raise('CVV01', 'requiredLeases must be a JSON array of lease ids');
        END IF;
        SELECT l INTO missing FROM jsonb_array_elements_text(required_leases) l
         WHERE NOT conveyor._is_uuid(l) LIMIT 1;
        IF missing IS NULL THEN
            SELECT array_agg(DISTINCT x.lease_id) INTO held FROM (
                SELECT c.lease_id FROM conveyor.partition_cursors c
                 WHERE c.lease_id = ANY (ARRAY(SELECT l::uuid FROM jsonb_array_elements_text(required_leases) l))
                   AND c.lease_expires_at > clock_timestamp()
                 ORDER BY c.partition_id, c.consumer_group
                   FOR UPDATE) x;
            SELECT l INTO missing FROM jsonb_array_elements_text(required_leases) l
             WHERE l::uuid <> ALL (coalesce(held, '{}')) LIMIT 1;
        END IF;
        IF missing IS NOT NULL THEN
            PERFORM conveyor._raise('CVK02', format('lease %s is not held (it expired, was released or does not exist)',
                                                    left(missing, 60)));
        END IF;
    END IF;
    FOR op IN SELECT * FROM jsonb_array_elements(operations) LOOP
        CASE op ->> 'type'
            WHEN 'ack' THEN
                IF held IS NOT NULL AND nullif(op ->> 'leaseId', '') IS NULL
                   AND conveyor._is_uuid(op ->> 'partitionId') THEN
                    SELECT c.lease_id INTO lease FROM conveyor.partition_cursors c
                      JOIN conveyor.partitions p ON p.id = c.partition_id
                     WHERE p.uuid = (op ->> 'partitionId')::uuid
                       AND c.consumer_group = coalesce(nullif(op ->> 'consumerGroup', ''), '__QUEUE_MODE__')
                       AND c.lease_id = ANY (held);
                    IF FOUND THEN
                        op := op || jsonb_build_object('leaseId', lease);
                    END IF;
                END IF;
                acks := acks || conveyor.pqueue_ack(jsonb_build_array(op - 'type'), true)::jsonb;
            WHEN 'push' THEN
                IF jsonb_typeof(op -> 'items') IS DISTINCT FROM 'array' THEN
                    PERFORM conveyor._raise('CVV01', 'a push operation needs items (a JSON array)');
                END IF;
                pushes := pushes || conveyor.pqueue_push(op -> 'items');
            ELSE
                PERFORM conveyor._raise('CVV01', format('operation type must be ack or push, got %s',
                                                        coalesce(left(op ->> 'type', 40), 'none')));
        END CASE;
    END LOOP;
    RETURN jsonb_build_object('acks', acks, 'pushes', pushes);
END $$;

ALTER FUNCTION conveyor.pqueue_transaction(jsonb, jsonb) SET plan_cache_mode = force_generic_plan;

-- Creates the queues of a push that do not exist yet, within bounds: at most max_new of
-- them (NULL: any number), and none beyond max_total partitioned queues in all (NULL: no
-- bound). Beyond either, nothing is created and CVK04 is raised. Creations through here
-- are counted one at a time (an advisory lock, taken only when something is new), so
-- concurrent pushes cannot overshoot max_total together. Returns the names it created.
CREATE OR REPLACE FUNCTION conveyor.pqueue_create_missing(names text[], max_new integer DEFAULT NULL,
                                               max_total integer DEFAULT NULL) RETURNS text[]
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    fresh text[];
    existing bigint;
    created text[];
BEGIN
    PERFORM conveyor._pqueue_name_check(n) FROM unnest(names) n;
    SELECT array_agg(DISTINCT n ORDER BY n) INTO fresh FROM unnest(names) n
     WHERE NOT EXISTS (SELECT 1 FROM conveyor.pqueues q WHERE q.name = n);
    IF fresh IS NULL THEN
        RETURN '{}';
    END IF;
    IF max_new IS NOT NULL AND cardinality(fresh) > max_new THEN
        PERFORM conveyor._raise('CVK04', CASE WHEN max_new <= 0
            THEN format('queue %s does not exist, and this push may not create queues', quote_literal(left(fresh[1], 100)))
            ELSE format('this push names %s queues that do not exist; a push may create at most %s',
                        cardinality(fresh), max_new) END);
    END IF;
    IF max_total IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('conveyor.pqueue_create_missing', 7306554613));
        -- a new statement, so a new snapshot: what the last holder of the lock created counts
        SELECT array_agg(DISTINCT n ORDER BY n) INTO fresh FROM unnest(fresh) n
         WHERE NOT EXISTS (SELECT 1 FROM conveyor.pqueues q WHERE q.name = n);
        IF fresh IS NULL THEN
            RETURN '{}';
        END IF;
        SELECT count(*) INTO existing FROM conveyor.pqueues;
        IF existing + cardinality(fresh) > max_total THEN
            PERFORM conveyor._raise('CVK04', format(
                'pushes create no more queues: %s partitioned queues exist and pushes may create them up to %s '
                '(configuring a queue still creates it)', existing, max_total));
        END IF;
    END IF;
    WITH made AS (
        INSERT INTO conveyor.pqueues (name) SELECT n FROM unnest(fresh) n ORDER BY n
        ON CONFLICT (name) DO NOTHING
        RETURNING name)
    SELECT coalesce(array_agg(name ORDER BY name), '{}') INTO created FROM made;
    RETURN created;
END $$;

DO $$
BEGIN
    GRANT EXECUTE ON FUNCTION conveyor.pqueue_transaction(jsonb, jsonb),
                              conveyor.pqueue_create_missing(text[], integer, integer),
                              conveyor.pqueue_pop(jsonb), conveyor.pqueue_pop_many(jsonb, boolean),
                              conveyor.pqueue_ack(jsonb, boolean)
        TO conveyor_writer;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: roles missing, grants skipped (%)', SQLERRM;
END $$;

REVOKE ALL ON ALL ROUTINES IN SCHEMA conveyor FROM PUBLIC;
