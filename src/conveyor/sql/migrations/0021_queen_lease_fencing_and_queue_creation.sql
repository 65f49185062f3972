-- Conveyor 0021: an acknowledgement that names no lease cannot settle what another
-- consumer holds (issue 25, item 2), a transaction's acks are fenced by the leases its
-- caller says it holds (Queen's requiredLeases), and a push creates queues only within
-- the bounds its caller is given (issue 25, item 6).
--
-- Before: pqueue_ack checked the leaseId of an ack only when one was given. A worker whose
-- lease had run out could ack without one while another worker held a new lease on the
-- partition: the ack settled the message and released the other worker's lease, whose own
-- valid ack was then refused. Now an ack without a leaseId is refused while a live lease
-- is held on its (partition, group); where none is held it settles the message, as
-- Queen's server does (its clients send the leaseId whenever a pop gave them one).
-- Queen's client sends a transaction's acks without leaseIds and lists the leases beside
-- them (requiredLeases); pqueue_transaction now takes that list: every lease in it must
-- still be held, and an ack without a leaseId acts under the listed lease of its
-- partition.

-- 0009's pqueue_ack; only the lease check changes (see the comment at the check).
CREATE OR REPLACE FUNCTION conveyor.pqueue_ack(acks jsonb, strict boolean DEFAULT false) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    a jsonb;
    idx integer := 0;
    answers jsonb := '[]';
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
    ts timestamptz := clock_timestamp();
BEGIN
    IF acks IS NULL OR jsonb_typeof(acks) <> 'array' THEN
        PERFORM conveyor._raise('CVV01', 'acks must be a JSON array');
    END IF;
    FOR a IN SELECT * FROM jsonb_array_elements(acks) LOOP
        IF jsonb_typeof(a) <> 'object' THEN
            PERFORM conveyor._raise('CVV01', 'each ack is a JSON object');
        END IF;
        group_name := coalesce(nullif(a ->> 'consumerGroup', ''), '__QUEUE_MODE__');
        status := lower(coalesce(nullif(a ->> 'status', ''), 'completed'));
        IF status NOT IN ('completed', 'success', 'failed', 'dlq', 'retry') THEN
            PERFORM conveyor._raise('CVV01', format('ack status must be completed, failed, dlq or retry, got %s',
                                                    left(status, 40)));
        END IF;
        part := NULL;
        m := NULL;
        IF a ->> 'partitionId' ~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$' THEN
            SELECT * INTO part FROM conveyor.partitions p WHERE p.uuid = (a ->> 'partitionId')::uuid;
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
            answers := answers || jsonb_build_object('index', idx, 'transactionId', a ->> 'transactionId',
                                                     'partitionId', a ->> 'partitionId', 'success', false,
                                                     'error', 'Message not found', 'dlq', false, 'leaseReleased', false);
            idx := idx + 1;
            CONTINUE;
        END IF;
        SELECT * INTO q FROM conveyor.pqueues WHERE id = part.queue_id;
        -- serialise acks of one (partition, group): the lock is the cursor row's
        SELECT * INTO c FROM conveyor.partition_cursors x
         WHERE x.partition_id = part.id AND x.consumer_group = group_name FOR UPDATE;
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
            answers := answers || jsonb_build_object('index', idx, 'transactionId', m.transaction_id,
                                                     'partitionId', part.uuid, 'success', false,
                                                     'error', refusal, 'dlq', false,
                                                     'leaseReleased', false, 'queueName', q.name,
                                                     'partitionName', part.name);
            idx := idx + 1;
            CONTINUE;
        END IF;
        IF status IN ('completed', 'success') THEN
            PERFORM conveyor._partition_done(part.id, group_name, m.seq);
            outcome := 'completed';
        ELSIF status = 'retry' THEN
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
        IF outcome IN ('retry', 'released') THEN
            -- give the lease up: what is not done comes again
            UPDATE conveyor.partition_cursors x
               SET lease_id = NULL, lease_expires_at = NULL, leased_through = NULL, behind = true
             WHERE x.partition_id = part.id AND x.consumer_group = group_name;
            released := true;
        ELSE
            -- the lease ends when everything it covered is done; the partition's head is
            -- read afresh, so a push that committed meanwhile is not missed
            UPDATE conveyor.partition_cursors x
               SET lease_id = NULL, lease_expires_at = NULL, leased_through = NULL,
                   behind = (SELECT p.head FROM conveyor.partitions p WHERE p.id = part.id) > x.cursor
             WHERE x.partition_id = part.id AND x.consumer_group = group_name AND x.lease_id IS NOT NULL
               AND x.cursor >= x.leased_through;
            released := FOUND;
        END IF;
        answers := answers || jsonb_build_object('index', idx, 'transactionId', m.transaction_id,
                                                 'partitionId', part.uuid, 'messageId', m.id, 'success', true,
                                                 'error', NULL, 'outcome', outcome, 'dlq', outcome = 'dlq',
                                                 'leaseReleased', released, 'queueName', q.name,
                                                 'partitionName', part.name);
        idx := idx + 1;
    END LOOP;
    RETURN answers;
END $$;

-- 0009's pqueue_transaction with the leases its caller holds (Queen's requiredLeases: a
-- JSON array of lease ids). Each must still be held, or nothing is done (CVK02); their
-- cursor rows are locked first, so none runs out or is taken over while the transaction
-- runs. An ack without a leaseId acts under the listed lease that holds its partition for
-- its group (with none listed there, pqueue_ack decides as for any ack without one).
DROP FUNCTION conveyor.pqueue_transaction(jsonb);

CREATE FUNCTION conveyor.pqueue_transaction(operations jsonb, required_leases jsonb DEFAULT NULL) RETURNS jsonb
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
         WHERE l !~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$' LIMIT 1;
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
                   AND op ->> 'partitionId' ~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$' THEN
                    SELECT c.lease_id INTO lease FROM conveyor.partition_cursors c
                      JOIN conveyor.partitions p ON p.id = c.partition_id
                     WHERE p.uuid = (op ->> 'partitionId')::uuid
                       AND c.consumer_group = coalesce(nullif(op ->> 'consumerGroup', ''), '__QUEUE_MODE__')
                       AND c.lease_id = ANY (held);
                    IF FOUND THEN
                        op := op || jsonb_build_object('leaseId', lease);
                    END IF;
                END IF;
                acks := acks || conveyor.pqueue_ack(jsonb_build_array(op - 'type'), true);
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

-- Creates the queues of a push that do not exist yet, within bounds: at most max_new of
-- them (NULL: any number), and none beyond max_total partitioned queues in all (NULL: no
-- bound). Beyond either, nothing is created and CVK04 is raised. Creations through here
-- are counted one at a time (an advisory lock, taken only when something is new), so
-- concurrent pushes cannot overshoot max_total together. Returns the names it created.
CREATE FUNCTION conveyor.pqueue_create_missing(names text[], max_new integer DEFAULT NULL,
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

REVOKE ALL ON FUNCTION conveyor.pqueue_transaction(jsonb, jsonb), conveyor.pqueue_create_missing(text[], integer, integer)
    FROM PUBLIC;

DO $$
BEGIN
    GRANT EXECUTE ON FUNCTION conveyor.pqueue_transaction(jsonb, jsonb),
                              conveyor.pqueue_create_missing(text[], integer, integer)
        TO conveyor_writer;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: roles missing, grants skipped (%)', SQLERRM;
END $$;

-- Both keep the generic plans 0020 gave them (CREATE OR REPLACE resets a function's SET
-- clauses, and pqueue_transaction has a new signature): an ack planned per call on a
-- partition the statistics had not seen read every message kept before it.
ALTER FUNCTION conveyor.pqueue_ack(jsonb, boolean) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION conveyor.pqueue_transaction(jsonb, jsonb) SET plan_cache_mode = force_generic_plan;
