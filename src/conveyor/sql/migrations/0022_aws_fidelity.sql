-- Conveyor 0022: Amazon SQS fidelity, round 3 (issue 27).
--
-- 1. A message's attributes count against the queue's maximum message size as SQS counts
--    them (each name, DataType and value, a binary value by its decoded bytes), not as the
--    JSON text they are stored in: a message of exactly MaximumMessageSize, body and
--    attributes, is accepted, as on SQS. Headers that are not SQS attributes (REST's) count
--    their name and their value's text.
-- 2. A message moved to a dead-letter queue keeps its receive count and first receive time
--    (SQS's ApproximateReceiveCount goes on counting there).
-- 3. A message move task whose destination queue is deleted is FAILED, and stays listed with
--    the destination's name, as SQS lists it; before, the task vanished with the queue.
-- 4. A queue may be its own dead-letter queue, as SQS allows (a RedrivePolicy naming the
--    queue itself): a message over maxReceiveCount goes to the back of the queue with its
--    receive count started again, instead of being refused at SetQueueAttributes.
-- 5. SNS (issue 27, items 9-11): an envelope states the SignatureVersion it was signed
--    with (1 or 2, the message's signature_version); a publish's system_attributes
--    (AWSTraceHeader) go to its queue copies; a FIFO topic's MessageGroupId reaches its
--    FIFO queues only (standard queues get none, as SNS delivers); filter policies on the
--    body reach dotted keys (`"a.b"` is `{"a": {"b": ...}}` too) and arrays nested in
--    arrays.
-- 6. SNS (issue 27, item 14): deleting a queue keeps its subscriptions (they wait for the
--    queue; meanwhile a subscription's RedrivePolicy dead-letter queue gets its messages);
--    delivery_send puts a message of the server's making (a SubscriptionConfirmation)
--    into an HTTP(S) subscription's outbox.

------------------------------------------------------------------------------------------
-- 1. Message size
------------------------------------------------------------------------------------------

CREATE FUNCTION conveyor._headers_size(headers jsonb) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN headers IS NULL OR headers = '{}'::jsonb THEN 0
        WHEN jsonb_typeof(headers) <> 'object' THEN octet_length(headers::text)
        ELSE (SELECT coalesce(sum(octet_length(h.key) + CASE
                  WHEN jsonb_typeof(h.value) = 'object' AND jsonb_typeof(h.value -> 'DataType') = 'string' THEN
                      octet_length(h.value ->> 'DataType') + CASE
                          -- base64: three bytes per four characters, padding not counted
                          WHEN h.value ? 'BinaryValue' THEN octet_length(rtrim(h.value ->> 'BinaryValue', '=')) * 3 / 4
                          ELSE coalesce(octet_length(h.value ->> 'StringValue'), 0) END
                  ELSE octet_length(h.value #>> '{}') END), 0)
                FROM jsonb_each(headers) h)
    END
$$;

-- 0010's _message_ok; only the size of the headers changes.
CREATE OR REPLACE FUNCTION conveyor._message_ok(q conveyor.queues, body text, headers jsonb, delay integer,
                                                system_attributes jsonb, dedup_id text) RETURNS boolean
LANGUAGE sql AS $$
    SELECT CASE
        WHEN body IS NULL OR octet_length(body) + conveyor._headers_size(headers)
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

------------------------------------------------------------------------------------------
-- 2. Dead letters keep their receive count
------------------------------------------------------------------------------------------

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

------------------------------------------------------------------------------------------
-- 3. A move task outlives its destination queue, as FAILED
------------------------------------------------------------------------------------------

-- the destination's name, kept when the queue is deleted (set by the trigger below)
ALTER TABLE conveyor.move_tasks ADD COLUMN destination_name text;
ALTER TABLE conveyor.move_tasks DROP CONSTRAINT move_tasks_destination_queue_id_fkey;
ALTER TABLE conveyor.move_tasks ADD CONSTRAINT move_tasks_destination_queue_id_fkey
    FOREIGN KEY (destination_queue_id) REFERENCES conveyor.queues (id) ON DELETE SET NULL;

CREATE OR REPLACE VIEW conveyor.move_task_info AS
SELECT t.handle,
       s.name AS source_queue,
       coalesce(d.name, t.destination_name) AS destination_queue,
       t.max_per_second,
       t.status,
       t.moved,
       t.to_move,
       t.failure_reason,
       t.started_at
  FROM conveyor.move_tasks t
  JOIN conveyor.queues s ON s.id = t.source_queue_id
  LEFT JOIN conveyor.queues d ON d.id = t.destination_queue_id;

-- Before a queue goes: the running tasks moving into it fail (the rest of their messages
-- stay in the dead-letter queue), and every task into it keeps its name.
CREATE FUNCTION conveyor._move_tasks_destination_gone() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE conveyor.move_tasks t
       SET destination_name = OLD.name,
           status = CASE WHEN t.status = 'RUNNING' THEN 'FAILED' ELSE t.status END,
           failure_reason = CASE WHEN t.status = 'RUNNING'
                                 THEN format('the destination queue %s was deleted', quote_literal(OLD.name))
                                 ELSE t.failure_reason END,
           updated_at = now()
     WHERE t.destination_queue_id = OLD.id;
    RETURN OLD;
END $$;

CREATE TRIGGER queues_move_task_destination BEFORE DELETE ON conveyor.queues
    FOR EACH ROW EXECUTE FUNCTION conveyor._move_tasks_destination_gone();

------------------------------------------------------------------------------------------
-- 4. A queue may be its own dead-letter queue
------------------------------------------------------------------------------------------

-- the table's own check (0001: dead_letter_queue_id IS DISTINCT FROM id), found by what it says
DO $$
DECLARE
    c text;
BEGIN
    FOR c IN SELECT conname FROM pg_constraint
              WHERE conrelid = 'conveyor.queues'::regclass AND contype = 'c'
                AND pg_get_constraintdef(oid) ILIKE '%dead_letter_queue_id IS DISTINCT FROM id%' LOOP
        EXECUTE format('ALTER TABLE conveyor.queues DROP CONSTRAINT %I', c);
    END LOOP;
END $$;

-- 0016's _queue_apply without the check that refused dead_letter_queue = the queue itself.
CREATE OR REPLACE FUNCTION conveyor._queue_apply(q conveyor.queues, attrs jsonb) RETURNS conveyor.queues
LANGUAGE plpgsql AS $$
DECLARE
    key text;
    dlq conveyor.queues;
BEGIN
    IF attrs IS NULL OR jsonb_typeof(attrs) <> 'object' THEN
        PERFORM conveyor._raise('CVV01', 'queue attributes must be a JSON object');
    END IF;
    FOR key IN SELECT jsonb_object_keys(attrs) LOOP
        IF key NOT IN ('visibility_timeout', 'delay_seconds', 'retention_seconds',
                       'max_message_size', 'receive_wait_seconds', 'max_receive_count',
                       'dead_letter_queue', 'content_based_deduplication', 'fifo',
                       'extra_attributes', 'storage', 'partition_interval', 'partition_retention',
                       'partition_premake') THEN
            PERFORM conveyor._raise('CVV01', format('unknown queue attribute %s', quote_literal(left(key, 100))));
        END IF;
    END LOOP;
    IF attrs ? 'fifo' AND conveyor._bool_attr(attrs, 'fifo') IS DISTINCT FROM q.fifo THEN
        PERFORM conveyor._raise('CVV01', 'a queue is FIFO exactly when its name ends in .fifo');
    END IF;
    IF attrs ? 'visibility_timeout' THEN
        q.visibility_timeout := coalesce(conveyor._int_attr(attrs, 'visibility_timeout', 0, 43200), 30);
    END IF;
    IF attrs ? 'delay_seconds' THEN
        q.delay_seconds := coalesce(conveyor._int_attr(attrs, 'delay_seconds', 0, 900), 0);
    END IF;
    IF attrs ? 'retention_seconds' THEN
        q.retention_seconds := coalesce(conveyor._int_attr(attrs, 'retention_seconds', 60, 1209600), 345600);
    END IF;
    IF attrs ? 'max_message_size' THEN
        q.max_message_size := coalesce(conveyor._int_attr(attrs, 'max_message_size', 1024, 1048576), 1048576);
    END IF;
    IF attrs ? 'receive_wait_seconds' THEN
        q.receive_wait_seconds := coalesce(conveyor._int_attr(attrs, 'receive_wait_seconds', 0, 20), 0);
    END IF;
    IF attrs ? 'max_receive_count' THEN
        q.max_receive_count := conveyor._int_attr(attrs, 'max_receive_count', 1, 1000);
    END IF;
    IF attrs ? 'content_based_deduplication' THEN
        q.content_based_deduplication := coalesce(conveyor._bool_attr(attrs, 'content_based_deduplication'), false);
        IF q.content_based_deduplication AND NOT q.fifo THEN
            PERFORM conveyor._raise('CVV01', 'content_based_deduplication applies to FIFO queues only');
        END IF;
    END IF;
    IF attrs ? 'dead_letter_queue' THEN
        IF jsonb_typeof(attrs -> 'dead_letter_queue') = 'null' THEN
            q.dead_letter_queue_id := NULL;
        ELSIF jsonb_typeof(attrs -> 'dead_letter_queue') <> 'string' THEN
            PERFORM conveyor._raise('CVV01', 'dead_letter_queue must be a queue name');
        ELSE
            dlq := conveyor._queue(attrs ->> 'dead_letter_queue');
            IF dlq.fifo <> q.fifo THEN
                PERFORM conveyor._raise('CVV01', 'the dead-letter queue of a FIFO queue must be a FIFO queue, and of a standard queue a standard queue');
            END IF;
            q.dead_letter_queue_id := dlq.id;
        END IF;
    END IF;
    IF attrs ? 'extra_attributes' THEN
        IF jsonb_typeof(attrs -> 'extra_attributes') = 'null' THEN
            q.extra_attributes := '{}';
        ELSIF jsonb_typeof(attrs -> 'extra_attributes') <> 'object' THEN
            PERFORM conveyor._raise('CVV01', 'extra_attributes must be a JSON object');
        ELSE
            -- merged key by key; a JSON null removes a key
            q.extra_attributes := jsonb_strip_nulls(coalesce(q.extra_attributes, '{}') || (attrs -> 'extra_attributes'));
        END IF;
    END IF;
    IF q.dead_letter_queue_id IS NOT NULL AND q.max_receive_count IS NULL THEN
        PERFORM conveyor._raise('CVV01', 'a dead_letter_queue needs max_receive_count');
    END IF;
    RETURN q;
END $$;

------------------------------------------------------------------------------------------
-- 5. SNS: signature versions, system attributes, FIFO groups, filter policies
------------------------------------------------------------------------------------------

-- 0005's _envelope_parts; SignatureVersion is the message's signature_version (else 2).
CREATE OR REPLACE FUNCTION conveyor._envelope_parts(m jsonb, topic_arn text, body text, signature text) RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    WITH f(o, k, v) AS (VALUES
        (1, 'Type', to_json('Notification'::text)::text),
        (2, 'MessageId', to_json(m ->> 'message_id')::text),
        (3, 'SequenceNumber', to_json(m ->> 'sequence_number')::text),
        (4, 'TopicArn', to_json(topic_arn)::text),
        (5, 'Subject', to_json(m ->> 'subject')::text),
        (6, 'Message', to_json(body)::text),
        (7, 'Timestamp', to_json(m ->> 'timestamp')::text),
        (8, 'SignatureVersion', CASE WHEN signature IS NOT NULL
                                     THEN to_json(coalesce(m ->> 'signature_version', '2'))::text END),
        (9, 'Signature', to_json(signature)::text),
        (10, 'SigningCertURL', CASE WHEN signature IS NOT NULL THEN to_json(m ->> 'signing_cert_url')::text END),
        (11, 'UnsubscribeURL', left(to_json(m ->> 'unsubscribe_url')::text, -1)),  -- open: the ARN follows
        (12, 'MessageAttributes', conveyor._envelope_attributes(m -> 'attributes'))
    ), fields AS (
        SELECT o, to_json(k)::text || ' : ' || v AS field FROM f WHERE v IS NOT NULL
    )
    SELECT CASE WHEN m ->> 'unsubscribe_url' IS NULL
                THEN ARRAY[E'{\n  ' || (SELECT string_agg(field, E',\n  ' ORDER BY o) FROM fields) || E'\n}', NULL]
                ELSE ARRAY[E'{\n  ' || (SELECT string_agg(field, E',\n  ' ORDER BY o) FROM fields WHERE o <= 11),
                           '"' || coalesce((SELECT E',\n  ' || field FROM fields WHERE o = 12), '') || E'\n}'] END
$$;

-- The stored name of the queue a subscription's RedrivePolicy names (NULL: none), as the
-- SQS layer stores it: the queue's name in the default region, <region>:<name> elsewhere.
CREATE FUNCTION conveyor._subscription_dlq(s conveyor.subscriptions, default_region text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN split_part(t.arn, ':', 4) = default_region THEN split_part(t.arn, ':', 6)
                ELSE split_part(t.arn, ':', 4) || ':' || split_part(t.arn, ':', 6) END
      FROM (SELECT conveyor._json_or_null(s.attributes ->> 'RedrivePolicy') ->> 'deadLetterTargetArn' AS arn) t
     WHERE t.arn ~ '^arn:aws[a-z-]*:sqs:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_.-]+$'
$$;

-- A queue's deletion keeps the subscriptions that deliver to it (as SNS keeps them): they
-- wait for a queue of that name, as a subscription to a queue not created yet does, and
-- what is published meanwhile goes to their dead-letter queue, or is held.
ALTER TABLE conveyor.subscriptions DROP CONSTRAINT subscriptions_queue_id_fkey;
ALTER TABLE conveyor.subscriptions ADD CONSTRAINT subscriptions_queue_id_fkey
    FOREIGN KEY (queue_id) REFERENCES conveyor.queues (id) ON DELETE SET NULL;

-- Sends a message of the server's own making to an HTTP(S) subscription's endpoint
-- through the outbox (SNS's SubscriptionConfirmation): claimed and retried as every
-- delivery, whether or not the subscription is confirmed.
CREATE FUNCTION conveyor.delivery_send(subscription uuid, payload text, headers jsonb, message_id uuid)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.subscriptions;
    new_id bigint;
BEGIN
    SELECT * INTO s FROM conveyor.subscriptions x WHERE x.uuid = delivery_send.subscription;
    IF s.id IS NULL OR s.endpoint IS NULL THEN
        PERFORM conveyor._raise('CVV01', format('subscription %s does not exist or has no endpoint', subscription));
    END IF;
    INSERT INTO conveyor.http_deliveries (subscription_id, endpoint, payload, headers, message_id)
    VALUES (s.id, s.endpoint, payload, coalesce(headers, '{}'), message_id)
    RETURNING id INTO new_id;
    RETURN new_id;
END $$;

-- 0010's topic_publish; the changes are marked by sys_attrs (a publish's system
-- attributes, for every queue copy) and std_gid (the group standard queues get: none from
-- a FIFO topic).
CREATE OR REPLACE FUNCTION conveyor.topic_publish(routing_key text, message jsonb)
RETURNS TABLE (queues text[], endpoints integer, sequence_number text, messages jsonb, sealed jsonb)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    m jsonb := message;
    body text := message ->> 'body';
    region text := coalesce(message ->> 'region', 'us-east-1');
    account text := coalesce(message ->> 'account_id', '000000000000');
    gid text := message ->> 'group_id';
    -- a FIFO topic's group orders its FIFO queues only: standard queues do not get it
    std_gid text := CASE WHEN routing_key LIKE '%.fifo' THEN NULL ELSE message ->> 'group_id' END;
    sys_attrs jsonb := CASE WHEN jsonb_typeof(message -> 'system_attributes') = 'object'
                            THEN message -> 'system_attributes' END;
    did text := message ->> 'dedup_id';
    delay integer;
    arn text;
    seqno text;
    ids bigint[];
    attr_doc jsonb;
    body_doc jsonb;
    ts timestamptz := now();
    f record;
    n_http integer;
    stored jsonb := '[]';
    to_seal jsonb := '[]';
    one jsonb;
    subj text := conveyor._routing_subject(routing_key);
    env text[];
BEGIN
    PERFORM conveyor._routing_key_check(routing_key);
    IF m IS NULL OR jsonb_typeof(m) <> 'object' OR body IS NULL THEN
        PERFORM conveyor._raise('CVV01', 'message must be a JSON object with a body');
    END IF;
    IF m ? 'attributes' AND jsonb_typeof(m -> 'attributes') NOT IN ('object', 'null') THEN
        PERFORM conveyor._raise('CVV01', 'message attributes must be a JSON object');
    END IF;
    IF jsonb_typeof(m -> 'delay') = 'number' THEN
        delay := (m ->> 'delay')::integer;
    ELSIF m ? 'delay' AND jsonb_typeof(m -> 'delay') <> 'null' THEN
        PERFORM conveyor._raise('CVV01', 'delay must be a number of seconds');
    END IF;
    IF routing_key LIKE '%.fifo' THEN
        IF gid IS NULL THEN
            PERFORM conveyor._raise('CVV01', 'publishing to a FIFO routing key (ending in .fifo) needs a group_id');
        END IF;
        IF did IS NULL AND (SELECT t.attributes ->> 'ContentBasedDeduplication' FROM conveyor.topics t
                             WHERE t.name = routing_key) = 'true' THEN
            did := encode(sha256(convert_to(body, 'UTF8')), 'hex');
        END IF;
        seqno := lpad(nextval('conveyor.topic_sequence')::text, 20, '0');
        m := m || jsonb_build_object('sequence_number', seqno);
    END IF;
    IF m ->> 'message_id' IS NULL THEN
        m := m || jsonb_build_object('message_id', gen_random_uuid());
    END IF;
    IF m ->> 'timestamp' IS NULL THEN
        m := m || jsonb_build_object('timestamp',
                                     to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'));
    END IF;
    arn := coalesce(m ->> 'topic_arn', conveyor._topic_arn(routing_key, region, account));
    env := conveyor._envelope_parts(m, arn, body, m ->> 'signature');

    -- who matches: exact patterns by the index, wildcard patterns by their regex
    SELECT coalesce(array_agg(s.id ORDER BY s.id), '{}') INTO ids FROM (
        SELECT x.id, x.confirmed FROM conveyor.subscriptions x WHERE x.pattern = routing_key AND NOT x.wildcard
        UNION ALL
        SELECT x.id, x.confirmed FROM conveyor.subscriptions x
         WHERE x.wildcard AND subj ~ x.regex) s
     WHERE s.confirmed;
    IF EXISTS (SELECT 1 FROM conveyor.subscriptions x WHERE x.id = ANY (ids) AND x.filter_policy IS NOT NULL) THEN
        attr_doc := conveyor._fp_attributes(m -> 'attributes');
        IF EXISTS (SELECT 1 FROM conveyor.subscriptions x
                    WHERE x.id = ANY (ids) AND x.filter_policy IS NOT NULL AND x.filter_policy_scope = 'MessageBody') THEN
            body_doc := conveyor._json_or_null(body);
        END IF;
        SELECT coalesce(array_agg(x.id ORDER BY x.id), '{}') INTO ids FROM conveyor.subscriptions x
         WHERE x.id = ANY (ids)
           AND conveyor._fp_accepts(x.filter_policy, CASE WHEN x.filter_policy_scope = 'MessageBody'
                                                          THEN body_doc ELSE attr_doc END);
    END IF;

    -- Subscriptions whose queue does not exist yet are locked first: a queue created
    -- meanwhile links them (_queue_created), so either it waits for this publish and then
    -- takes the rows it held, or this publish waits for it and then delivers directly.
    PERFORM 1 FROM conveyor.subscriptions x
      WHERE x.id = ANY (ids) AND x.protocol = 'sqs' AND x.queue_id IS NULL
      ORDER BY x.id
        FOR SHARE;

    -- standard queues: one insert, each row checked as any send checks it
    WITH inserted AS (
        INSERT INTO conveyor.messages (queue_id, id, vt, sent_at, body, content_type, headers, group_id,
                                       system_attributes)
        SELECT (d.q).id, nextval((d.q).seq), ts + make_interval(secs => coalesce(delay, (d.q).delay_seconds)), ts,
               d.body, d.content_type, d.headers, std_gid, coalesce(sys_attrs, '{}')
          FROM (SELECT q, x.id AS sid, t.*
                  FROM conveyor.subscriptions x
                  JOIN conveyor.queues q ON q.id = x.queue_id
                  CROSS JOIN LATERAL conveyor._delivery(m, arn, env, x, region, account) t
                 WHERE x.id = ANY (ids) AND NOT q.fifo AND NOT conveyor._encrypted(q)) d
         WHERE conveyor._message_ok(d.q, d.body, d.headers, delay, NULL, NULL)
         ORDER BY d.sid
        RETURNING queue_id, id, message_uuid)
    SELECT coalesce(jsonb_agg(jsonb_build_object('queue', q.name, 'id', i.id, 'message_id', i.message_uuid)
                              ORDER BY q.name), '[]')
      INTO stored
      FROM inserted i JOIN conveyor.queues q ON q.id = i.queue_id;

    -- FIFO queues: through the queue engine's FIFO path (groups, deduplication)
    FOR f IN SELECT q, t.*
               FROM conveyor.subscriptions x
               JOIN conveyor.queues q ON q.id = x.queue_id
               CROSS JOIN LATERAL conveyor._delivery(m, arn, env, x, region, account) t
              WHERE x.id = ANY (ids) AND q.fifo AND NOT conveyor._encrypted(q)
              ORDER BY x.id LOOP
        SELECT jsonb_build_object('queue', (f.q).name, 'id', s.id, 'message_id', s.message_uuid) INTO one
          FROM conveyor._send(f.q, jsonb_build_array(jsonb_build_object(
            'body', f.body, 'headers', f.headers, 'content_type', f.content_type, 'group_id', gid,
            'system_attributes', sys_attrs,
            -- a queue's content-based deduplication hashes the published body, not the
            -- envelope (which differs on every publish)
            'dedup_id', coalesce(did, CASE WHEN (f.q).content_based_deduplication
                                           THEN encode(sha256(convert_to(body, 'UTF8')), 'hex') END),
            'delay', delay))) s;
        stored := stored || coalesce(jsonb_build_array(one), '[]');
    END LOOP;

    -- encrypted queues: what each gets, for the caller to seal and send
    SELECT coalesce(jsonb_agg(jsonb_strip_nulls(jsonb_build_object(
               'queue', (q).name, 'body', t.body, 'headers', t.headers, 'content_type', t.content_type,
               'group_id', CASE WHEN (q).fifo THEN gid ELSE std_gid END, 'delay', delay,
               'system_attributes', sys_attrs,
               'dedup_id', CASE WHEN (q).fifo THEN coalesce(did, CASE WHEN (q).content_based_deduplication
                                THEN encode(sha256(convert_to(m ->> 'body', 'UTF8')), 'hex') END) END))
           ORDER BY x.id), '[]')
      INTO to_seal
      FROM conveyor.subscriptions x
      JOIN conveyor.queues q ON q.id = x.queue_id
      CROSS JOIN LATERAL conveyor._delivery(m, arn, env, x, region, account) t
     WHERE x.id = ANY (ids) AND conveyor._encrypted(q);

    -- endpoints: one outbox row each
    INSERT INTO conveyor.http_deliveries (subscription_id, endpoint, payload, headers, message_id)
    SELECT x.id, x.endpoint, t.body,
           jsonb_build_object('Content-Type', 'text/plain; charset=UTF-8',
                              'x-amz-sns-message-type', 'Notification',
                              'x-amz-sns-message-id', m ->> 'message_id',
                              'x-amz-sns-topic-arn', arn,
                              'x-amz-sns-subscription-arn', t.subscription_arn)
             || CASE WHEN x.raw_delivery THEN '{"x-amz-sns-rawdelivery": "true"}'::jsonb ELSE '{}' END,
           (m ->> 'message_id')::uuid
      FROM conveyor.subscriptions x
      CROSS JOIN LATERAL conveyor._delivery(m, arn, env, x, region, account) t
     WHERE x.id = ANY (ids) AND x.protocol IN ('http', 'https')
     ORDER BY x.id;
    GET DIAGNOSTICS n_http = ROW_COUNT;

    -- queues that do not exist, of subscriptions with a dead-letter queue (RedrivePolicy)
    -- that does: the message goes there, as SNS dead-letters a delivery its queue cannot take
    FOR f IN SELECT dq, t.body, t.headers, t.content_type
               FROM conveyor.subscriptions x
               CROSS JOIN LATERAL conveyor._delivery(m, arn, env, x, region, account) t
               JOIN conveyor.queues dq ON dq.name = conveyor._subscription_dlq(x, region)
              WHERE x.id = ANY (ids) AND x.protocol = 'sqs' AND x.queue_id IS NULL
                AND NOT conveyor._encrypted(dq)
              ORDER BY x.id LOOP
        PERFORM conveyor._send(f.dq, jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
            'body', f.body, 'headers', f.headers, 'content_type', f.content_type,
            'group_id', CASE WHEN (f.dq).fifo THEN gid ELSE std_gid END, 'system_attributes', sys_attrs,
            'dedup_id', CASE WHEN (f.dq).fifo THEN coalesce(did, encode(sha256(convert_to(body, 'UTF8')), 'hex')) END))));
        PERFORM conveyor._wake(f.dq, 1);
    END LOOP;

    -- queues not created yet (or deleted, without a dead-letter queue): a held outbox row
    -- each, with what the queue will get
    INSERT INTO conveyor.http_deliveries (subscription_id, endpoint, payload, headers, message_id, held_reason,
                                          queue_name, queue_message)
    SELECT x.id, conveyor._queue_arn(x.queue_name, region, account), t.body, coalesce(t.headers, '{}'),
           (m ->> 'message_id')::uuid,
           format('SQS queue %s does not exist: held until it is created', quote_literal(x.queue_name)),
           x.queue_name,
           jsonb_strip_nulls(jsonb_build_object(
               'body', t.body, 'headers', t.headers, 'content_type', t.content_type,
               'group_id', CASE WHEN x.queue_name LIKE '%.fifo' THEN gid ELSE std_gid END,
               'dedup_id', did, 'delay', delay, 'system_attributes', sys_attrs,
               'content_hash', encode(sha256(convert_to(m ->> 'body', 'UTF8')), 'hex')))
      FROM conveyor.subscriptions x
      CROSS JOIN LATERAL conveyor._delivery(m, arn, env, x, region, account) t
     WHERE x.id = ANY (ids) AND x.protocol = 'sqs' AND x.queue_id IS NULL
       AND NOT EXISTS (SELECT 1 FROM conveyor.queues dq
                        WHERE dq.name = conveyor._subscription_dlq(x, region) AND NOT conveyor._encrypted(dq))
     ORDER BY x.id;

    PERFORM conveyor._wake(q, 1)
       FROM conveyor.queues q
      WHERE q.id IN (SELECT x.queue_id FROM conveyor.subscriptions x WHERE x.id = ANY (ids));

    RETURN QUERY
    SELECT coalesce((SELECT array_agg(q.name ORDER BY x.id)
                       FROM conveyor.subscriptions x JOIN conveyor.queues q ON q.id = x.queue_id
                      WHERE x.id = ANY (ids)), '{}'),
           n_http, seqno, stored, to_seal;
END $$;

-- Every value an array holds, arrays nested in it flattened: what "any element" means.
CREATE FUNCTION conveyor._fp_elements(v jsonb) RETURNS SETOF jsonb
LANGUAGE sql IMMUTABLE AS $$
    WITH RECURSIVE e(x) AS (
        SELECT v
        UNION ALL
        SELECT a FROM e, jsonb_array_elements(CASE WHEN jsonb_typeof(e.x) = 'array' THEN e.x ELSE '[]' END) a
    )
    SELECT x FROM e WHERE jsonb_typeof(x) IS DISTINCT FROM 'array'
$$;

-- The value a policy key reaches in a document (NULL: none). A key is looked up as it is;
-- failing that, a dotted key as a path ("a.b" reaches {"a": {"b": ...}}), and the keys
-- under it ("a" reaches {"a.b": ...} as {"b": ...}), as SNS reads payloads. Through an
-- array the key reaches what it reaches in each element (an array of those).
CREATE FUNCTION conveyor._fp_get(doc jsonb, k text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    i integer;
    found jsonb;
BEGIN
    IF jsonb_typeof(doc) = 'array' THEN
        SELECT jsonb_agg(g.v) INTO found
          FROM conveyor._fp_elements(doc) e, LATERAL (SELECT conveyor._fp_get(e, k) AS v) g
         WHERE g.v IS NOT NULL;
        RETURN found;
    END IF;
    IF jsonb_typeof(doc) IS DISTINCT FROM 'object' THEN
        RETURN NULL;
    END IF;
    IF doc ? k THEN
        RETURN doc -> k;
    END IF;
    FOR i IN SELECT p FROM generate_series(1, length(k)) p WHERE substr(k, p, 1) = '.' LOOP
        found := conveyor._fp_get(doc -> left(k, i - 1), substr(k, i + 1));
        IF found IS NOT NULL THEN
            RETURN found;
        END IF;
    END LOOP;
    SELECT jsonb_object_agg(substr(key, length(k) + 2), value) INTO found
      FROM jsonb_each(doc) WHERE starts_with(key, k || '.');
    RETURN found;
END $$;

-- 0005's _fp_values; arrays nested in arrays are flattened.
CREATE OR REPLACE FUNCTION conveyor._fp_values(conds jsonb, v jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM jsonb_array_elements(conds) c
         WHERE CASE WHEN jsonb_typeof(c) = 'object' AND c ? 'exists'
                        THEN coalesce(jsonb_typeof(v) <> 'null', false) = (c ->> 'exists')::boolean
                    WHEN v IS NULL THEN false
                    WHEN jsonb_typeof(v) = 'array'
                        THEN EXISTS (SELECT 1 FROM conveyor._fp_elements(v) e WHERE conveyor._fp_scalar(c, e))
                    ELSE conveyor._fp_scalar(c, v) END)
$$;

-- 0005's _fp_match; keys are looked up by _fp_get, and an object rule matches an array
-- (nested arrays flattened) when one of its elements does.
CREATE OR REPLACE FUNCTION conveyor._fp_match(policy jsonb, doc jsonb) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    k text;
    rule jsonb;
    v jsonb;
BEGIN
    FOR k, rule IN SELECT key, value FROM jsonb_each(policy) LOOP
        IF k = '$or' AND jsonb_typeof(rule) = 'array' THEN
            IF NOT EXISTS (SELECT 1 FROM jsonb_array_elements(rule) b WHERE conveyor._fp_match(b, doc)) THEN
                RETURN false;
            END IF;
            CONTINUE;
        END IF;
        v := conveyor._fp_get(doc, k);
        IF jsonb_typeof(rule) = 'object' THEN
            IF jsonb_typeof(v) = 'array' THEN
                IF NOT EXISTS (SELECT 1 FROM conveyor._fp_elements(v) e WHERE conveyor._fp_match(rule, e)) THEN
                    RETURN false;
                END IF;
            ELSIF NOT conveyor._fp_match(rule, v) THEN
                RETURN false;
            END IF;
        ELSIF NOT conveyor._fp_values(rule, v) THEN
            RETURN false;
        END IF;
    END LOOP;
    RETURN true;
END $$;

REVOKE ALL ON FUNCTION conveyor._headers_size(jsonb), conveyor._move_tasks_destination_gone(),
    conveyor._fp_elements(jsonb), conveyor._fp_get(jsonb, text),
    conveyor._subscription_dlq(conveyor.subscriptions, text),
    conveyor.delivery_send(uuid, text, jsonb, uuid) FROM PUBLIC;

DO $$
BEGIN
    GRANT EXECUTE ON FUNCTION conveyor.delivery_send(uuid, text, jsonb, uuid) TO conveyor_admin;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: roles missing, grants skipped (%)', SQLERRM;
END $$;
