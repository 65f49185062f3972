-- Conveyor 0010: SNS fidelity of the topics engine (issue 13).
--
-- 1. Filter policies compare numbers as SNS documents it: "five digits of accuracy after
--    the decimal point". Both the policy's numbers and the message's are rounded to five
--    decimal places (numeric round: half away from zero) before they are compared, so
--    0.000001 equals 0 and 1.000004 equals 1, while 1.00001 does not.
-- 2. A String.Array message attribute whose value is not a JSON array is matched as one
--    value (the JSON value it is, or else its text) instead of never matching.
-- 3. An SQS subscription may name a queue that does not exist yet, as SNS subscribes any
--    well-formed queue ARN. A subscription keeps its queue's name (queue_name); queue_id
--    links it to the queue once the queue exists: at subscribe, or when a queue of that
--    name is created (the queue_created trigger). Dropping a queue still drops its
--    subscriptions (queue_id's ON DELETE CASCADE, as before). What a publish would have
--    put in a queue not created yet waits in the outbox (http_deliveries) as a held row
--    naming the queue (queue_name, with the message for the queue in queue_message) —
--    visible to delivery_list('held') and deliveries_stats — and goes into the queue, in
--    publish order, when the queue is created (or on delivery_retry once it exists).
--    Unsubscribing drops them. The webhook worker never claims such rows.
-- 4. Encrypted queues (issue 16, conveyor.crypto): a queue whose extra_attributes say
--    "encrypted": true holds bodies the server sealed (AES-256-GCM) before sending. A
--    topic publish leaves such queues to its caller (topic_publish's `sealed` column),
--    and the size check allows for the sealed form (base64 of nonce, body and tag): the
--    protocols check the plaintext's size against the queue's limit before sealing.

------------------------------------------------------------------------------------------
-- Encrypted queues
------------------------------------------------------------------------------------------

CREATE FUNCTION conveyor._encrypted(q conveyor.queues) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(q.extra_attributes -> 'encrypted' = 'true'::jsonb, false)
$$;

CREATE OR REPLACE FUNCTION conveyor._message_ok(q conveyor.queues, body text, headers jsonb, delay integer,
                                                system_attributes jsonb, dedup_id text) RETURNS boolean
LANGUAGE sql AS $$
    SELECT CASE
        WHEN body IS NULL OR octet_length(body) + coalesce(octet_length(headers::text), 0)
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
-- Filter policies
------------------------------------------------------------------------------------------

-- A number as SNS compares it: rounded to five decimal places.
CREATE FUNCTION conveyor._fp_number(x numeric) RETURNS numeric
LANGUAGE sql IMMUTABLE AS $$
    SELECT round(x, 5)
$$;

-- A String.Array attribute's value: its JSON array; otherwise the one JSON value it is
-- (a string, number, true, false or null), or else its text as a string.
CREATE FUNCTION conveyor._fp_array_value(text_value text) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN jsonb_typeof(j) IS NULL OR jsonb_typeof(j) = 'object' THEN to_jsonb(text_value) ELSE j END
      FROM (SELECT conveyor._json_or_null(text_value) AS j) parsed
$$;

CREATE OR REPLACE FUNCTION conveyor._fp_attributes(attributes jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(jsonb_object_agg(a.key, v.value), '{}')
      FROM jsonb_each(CASE WHEN jsonb_typeof(attributes) = 'object' THEN attributes ELSE '{}' END) a,
           LATERAL (SELECT a.value ->> 'DataType' AS type, a.value ->> 'StringValue' AS text) x,
           LATERAL (SELECT CASE
               WHEN x.type LIKE '%.Array'
                   THEN conveyor._fp_array_value(x.text)
               WHEN x.type LIKE 'Number%' AND x.text ~ '^\s*[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]{1,3})?\s*$'
                   THEN to_jsonb(x.text::numeric)
               WHEN x.type LIKE 'String%' OR x.type LIKE 'Number%'
                   THEN to_jsonb(x.text)
               END AS value) v
     WHERE jsonb_typeof(a.value) = 'object' AND x.text IS NOT NULL AND v.value IS NOT NULL
$$;

CREATE OR REPLACE FUNCTION conveyor._fp_numeric(ops jsonb, x numeric) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    i integer := 0;
    n integer := jsonb_array_length(ops);
    op text;
    v numeric;
BEGIN
    x := conveyor._fp_number(x);
    WHILE i + 1 < n LOOP
        op := ops ->> i;
        v := conveyor._fp_number((ops ->> (i + 1))::numeric);
        IF NOT (CASE op WHEN '=' THEN x = v WHEN '<' THEN x < v WHEN '<=' THEN x <= v
                        WHEN '>' THEN x > v WHEN '>=' THEN x >= v ELSE false END) THEN
            RETURN false;
        END IF;
        i := i + 2;
    END LOOP;
    RETURN true;
END $$;

-- Two JSON values equal as a policy compares them: numbers to five decimal places.
-- (PL/pgSQL, not SQL: an inlined CASE would let the planner fold the numeric cast of a
-- constant string argument, and fail, before the type test has ruled it out.)
CREATE FUNCTION conveyor._fp_equal(c jsonb, e jsonb) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF jsonb_typeof(c) IS DISTINCT FROM jsonb_typeof(e) THEN
        RETURN false;
    ELSIF jsonb_typeof(c) = 'number' THEN
        RETURN conveyor._fp_number((c #>> '{}')::numeric) = conveyor._fp_number((e #>> '{}')::numeric);
    END IF;
    RETURN c = e;
END $$;

CREATE OR REPLACE FUNCTION conveyor._fp_scalar(c jsonb, e jsonb) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    te text := jsonb_typeof(e);
    s text := CASE WHEN jsonb_typeof(e) = 'string' THEN e #>> '{}' END;
    op text;
    arg jsonb;
BEGIN
    IF jsonb_typeof(c) <> 'object' THEN
        -- exact match: strings to strings, numbers to numbers (numerically), true/false/null
        RETURN conveyor._fp_equal(c, e);
    END IF;
    SELECT key, value INTO op, arg FROM jsonb_each(c) LIMIT 1;
    CASE op
    WHEN 'prefix' THEN
        RETURN s IS NOT NULL AND starts_with(s, arg #>> '{}');
    WHEN 'suffix' THEN
        RETURN s IS NOT NULL AND right(s, length(arg #>> '{}')) = arg #>> '{}';
    WHEN 'equals-ignore-case' THEN
        RETURN s IS NOT NULL AND lower(s) = lower(arg #>> '{}');
    WHEN 'numeric' THEN
        RETURN te = 'number' AND conveyor._fp_numeric(arg, (e #>> '{}')::numeric);
    WHEN 'cidr' THEN
        RETURN s IS NOT NULL AND conveyor._fp_cidr(s, arg #>> '{}');
    WHEN 'anything-but' THEN
        IF jsonb_typeof(arg) = 'object' THEN
            -- anything-but {"prefix"|"suffix"|"equals-ignore-case": value or [values]}
            RETURN s IS NOT NULL AND NOT EXISTS (
                SELECT 1 FROM jsonb_each(arg) o,
                     jsonb_array_elements(CASE WHEN jsonb_typeof(o.value) = 'array' THEN o.value
                                               ELSE jsonb_build_array(o.value) END) w
                 WHERE CASE o.key WHEN 'prefix' THEN starts_with(s, w #>> '{}')
                                  WHEN 'suffix' THEN right(s, length(w #>> '{}')) = w #>> '{}'
                                  ELSE lower(s) = lower(w #>> '{}') END);
        END IF;
        RETURN NOT EXISTS (
            SELECT 1 FROM jsonb_array_elements(CASE WHEN jsonb_typeof(arg) = 'array' THEN arg
                                                    ELSE jsonb_build_array(arg) END) w
             WHERE conveyor._fp_equal(w, e));
    ELSE
        RETURN false;
    END CASE;
END $$;

------------------------------------------------------------------------------------------
-- Subscriptions to queues that do not exist
------------------------------------------------------------------------------------------

ALTER TABLE conveyor.subscriptions ADD COLUMN queue_name text;
UPDATE conveyor.subscriptions s SET queue_name = q.name FROM conveyor.queues q WHERE q.id = s.queue_id;

ALTER TABLE conveyor.subscriptions
    DROP CONSTRAINT subscriptions_check,  -- (protocol = 'sqs') = (queue_id IS NOT NULL)
    ADD CONSTRAINT subscriptions_queue_check CHECK ((protocol = 'sqs') = (queue_name IS NOT NULL)),
    ADD CONSTRAINT subscriptions_queue_linked_check CHECK (queue_id IS NULL OR queue_name IS NOT NULL);

-- one subscription per (pattern, queue), whether the queue exists or not
DROP INDEX conveyor.subscriptions_queue_key;
CREATE UNIQUE INDEX subscriptions_queue_name_key ON conveyor.subscriptions (pattern, queue_name)
    WHERE queue_name IS NOT NULL;
-- the subscriptions a new queue links
CREATE INDEX subscriptions_waiting_idx ON conveyor.subscriptions (queue_name)
    WHERE queue_name IS NOT NULL AND queue_id IS NULL;

ALTER TABLE conveyor.http_deliveries
    ADD COLUMN queue_name text,      -- set: waiting for this SQS queue to exist (always held)
    ADD COLUMN queue_message jsonb,  -- what the queue gets (conveyor._send's message object)
    ADD CONSTRAINT http_deliveries_queue_check
        CHECK ((queue_name IS NULL) = (queue_message IS NULL)
               AND (queue_name IS NULL OR held_reason IS NOT NULL));
CREATE INDEX http_deliveries_queue_idx ON conveyor.http_deliveries (queue_name, id) WHERE queue_name IS NOT NULL;

CREATE OR REPLACE VIEW conveyor.subscription_info AS
SELECT s.id, s.uuid, s.pattern, s.protocol, s.queue_name AS queue, s.endpoint, s.raw_delivery,
       s.filter_policy, s.filter_policy_scope, s.attributes, s.confirmed, s.created_at
  FROM conveyor.subscriptions s;

-- arn:aws:sqs:<region>:<account>:<name>, the region from the name's prefix if it has one.
CREATE FUNCTION conveyor._queue_arn(queue_name text, region text, account_id text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'arn:aws:sqs:' || CASE WHEN queue_name ~ '^[a-z0-9-]{1,32}:'
                                  THEN split_part(queue_name, ':', 1) || ':' || account_id || ':'
                                       || substr(queue_name, strpos(queue_name, ':') + 1)
                                  ELSE region || ':' || account_id || ':' || queue_name END
$$;

-- Binds a pattern to a queue ('sqs') or an endpoint ('http', 'https'), as
-- subscription_create; with queue_must_exist false, an sqs subscription may name a queue
-- that does not exist (a valid queue name), which it delivers to once it does. A FIFO
-- queue (a name ending in .fifo) takes messages from FIFO routing keys only.
CREATE FUNCTION conveyor.subscription_create_v2(pattern text, protocol text, queue_name text DEFAULT NULL,
                                                endpoint text DEFAULT NULL, raw_delivery boolean DEFAULT false,
                                                filter_policy jsonb DEFAULT NULL,
                                                filter_policy_scope text DEFAULT 'MessageAttributes',
                                                attributes jsonb DEFAULT '{}', confirmed boolean DEFAULT true,
                                                queue_must_exist boolean DEFAULT true)
RETURNS SETOF conveyor.subscription_info
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    rx text := conveyor._pattern_regex(pattern);
    q conveyor.queues;
    sid bigint;
BEGIN
    IF protocol IS NULL OR protocol NOT IN ('sqs', 'http', 'https') THEN
        PERFORM conveyor._raise('CVV01', format('protocol must be sqs, http or https, got %s',
                                                coalesce(quote_literal(left(protocol, 20)), 'NULL')));
    END IF;
    IF protocol = 'sqs' THEN
        IF subscription_create_v2.queue_name IS NULL OR endpoint IS NOT NULL THEN
            PERFORM conveyor._raise('CVV01', 'an sqs subscription names a queue and no endpoint');
        END IF;
        IF coalesce(queue_must_exist, true) THEN
            q := conveyor._queue(subscription_create_v2.queue_name);
        ELSE
            PERFORM conveyor._name_check(subscription_create_v2.queue_name);
            SELECT * INTO q FROM conveyor.queues x WHERE x.name = subscription_create_v2.queue_name;
        END IF;
        IF subscription_create_v2.queue_name LIKE '%.fifo' AND pattern NOT LIKE '%.fifo' THEN
            PERFORM conveyor._raise('CVV01', format(
                'FIFO queue %s can only subscribe to a FIFO routing key (a pattern ending in .fifo)',
                quote_literal(subscription_create_v2.queue_name)));
        END IF;
    ELSIF subscription_create_v2.queue_name IS NOT NULL OR endpoint IS NULL OR length(endpoint) > 2048
          OR lower(endpoint) !~ ('^' || protocol || '://[^/?#\s@]+([/?#][^\s]*)?$')
          OR endpoint ~ '[\s\x01-\x1f\x7f]' THEN
        PERFORM conveyor._raise('CVV01', format(
            'an %s subscription needs an endpoint URL starting with %s:// (at most 2048 characters, no queue)',
            protocol, protocol));
    END IF;
    IF filter_policy IS NOT NULL AND jsonb_typeof(filter_policy) <> 'object' THEN
        PERFORM conveyor._raise('CVV01', 'a filter policy is a JSON object');
    END IF;
    IF filter_policy_scope IS NULL OR filter_policy_scope NOT IN ('MessageAttributes', 'MessageBody') THEN
        PERFORM conveyor._raise('CVV01', 'filter_policy_scope must be MessageAttributes or MessageBody');
    END IF;
    IF attributes IS NOT NULL AND jsonb_typeof(attributes) <> 'object' THEN
        PERFORM conveyor._raise('CVV01', 'attributes must be a JSON object');
    END IF;
    INSERT INTO conveyor.subscriptions AS s (pattern, regex, wildcard, protocol, queue_id, queue_name, endpoint,
                                             raw_delivery, filter_policy, filter_policy_scope, attributes, confirmed)
    VALUES (pattern, rx, pattern ~ '(^|[.:])[*#](\.|$)', protocol, q.id,
            CASE WHEN protocol = 'sqs' THEN subscription_create_v2.queue_name END,
            CASE WHEN protocol = 'sqs' THEN NULL ELSE endpoint END, coalesce(raw_delivery, false),
            filter_policy, filter_policy_scope, jsonb_strip_nulls(coalesce(attributes, '{}')),
            coalesce(confirmed, true))
    ON CONFLICT DO NOTHING
    RETURNING s.id INTO sid;
    IF sid IS NULL THEN
        SELECT s.id INTO sid FROM conveyor.subscriptions s
         WHERE s.pattern = subscription_create_v2.pattern
           AND (s.queue_name = subscription_create_v2.queue_name OR s.endpoint = subscription_create_v2.endpoint);
    END IF;
    RETURN QUERY SELECT * FROM conveyor.subscription_info i WHERE i.id = sid;
END $$;

-- The first version: the queue must exist.
CREATE OR REPLACE FUNCTION conveyor.subscription_create(pattern text, protocol text, queue_name text DEFAULT NULL,
                                                        endpoint text DEFAULT NULL, raw_delivery boolean DEFAULT false,
                                                        filter_policy jsonb DEFAULT NULL,
                                                        filter_policy_scope text DEFAULT 'MessageAttributes',
                                                        attributes jsonb DEFAULT '{}', confirmed boolean DEFAULT true)
RETURNS SETOF conveyor.subscription_info
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT * FROM conveyor.subscription_create_v2(pattern, protocol, queue_name, endpoint, raw_delivery, filter_policy,
                                                  filter_policy_scope, attributes, confirmed, true)
$$;

-- Puts the deliveries waiting for queue q (all, or those among ids) into it, in publish
-- order, and deletes them; one the queue refuses (e.g. too large for it) stays held with
-- the queue's reason. Returns how many went in.
CREATE FUNCTION conveyor._deliveries_to_queue(q conveyor.queues, ids bigint[] DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    d record;
    entry jsonb;
    n integer := 0;
BEGIN
    FOR d IN SELECT h.id, h.queue_message FROM conveyor.http_deliveries h
              WHERE h.queue_name = q.name AND (ids IS NULL OR h.id = ANY (ids))
              ORDER BY h.id
                FOR UPDATE LOOP
        entry := d.queue_message - 'content_hash' - 'dedup_id';
        IF q.fifo THEN
            -- the queue's content-based deduplication hashes the published body
            entry := entry || jsonb_build_object('dedup_id', coalesce(
                d.queue_message ->> 'dedup_id',
                CASE WHEN q.content_based_deduplication THEN d.queue_message ->> 'content_hash' END));
        END IF;
        BEGIN
            PERFORM conveyor._send(q, jsonb_build_array(jsonb_strip_nulls(entry)));
            DELETE FROM conveyor.http_deliveries h WHERE h.id = d.id;
            n := n + 1;
        EXCEPTION WHEN others THEN
            UPDATE conveyor.http_deliveries h
               SET last_error = left(SQLERRM, 4096),
                   held_reason = left(format('SQS queue %s refused the message: %s', quote_literal(q.name), SQLERRM),
                                      4096)
             WHERE h.id = d.id;
        END;
    END LOOP;
    IF n > 0 THEN
        PERFORM conveyor._wake(q, n);
    END IF;
    RETURN n;
END $$;

-- A new queue (its message sequence just set): link the subscriptions that name it and
-- deliver what waited for it.
CREATE FUNCTION conveyor._queue_created() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.seq IS NOT NULL THEN
        RETURN NULL;
    END IF;
    UPDATE conveyor.subscriptions s SET queue_id = NEW.id
     WHERE s.queue_name = NEW.name AND s.queue_id IS NULL;
    PERFORM conveyor._deliveries_to_queue(NEW, NULL);
    RETURN NULL;
END $$;

CREATE TRIGGER queue_created AFTER INSERT OR UPDATE OF seq ON conveyor.queues
    FOR EACH ROW WHEN (NEW.seq IS NOT NULL) EXECUTE FUNCTION conveyor._queue_created();

------------------------------------------------------------------------------------------
-- Publish
------------------------------------------------------------------------------------------

-- As in 0005, and: an sqs subscription whose queue does not exist yet gets a held outbox
-- row (see the top of this file); the answer also lists the message stored in each queue
-- (messages: [{"queue", "id", "message_id"}], seed 000's POST /v1/events answer; a FIFO
-- queue that dropped the publish as a duplicate gives the id it kept). Queues flagged
-- encrypted (extra_attributes.encrypted) get nothing here: their copies come back in
-- `sealed` ([{"queue", "body", "headers", "content_type", "group_id", "dedup_id",
-- "delay"}]) for the caller to seal with the server's key and send in the same
-- transaction (conveyor.crypto), so no plaintext is stored.
DROP FUNCTION conveyor.topic_publish(text, jsonb);
CREATE FUNCTION conveyor.topic_publish(routing_key text, message jsonb)
RETURNS TABLE (queues text[], endpoints integer, sequence_number text, messages jsonb, sealed jsonb)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    m jsonb := message;
    body text := message ->> 'body';
    region text := coalesce(message ->> 'region', 'us-east-1');
    account text := coalesce(message ->> 'account_id', '000000000000');
    gid text := message ->> 'group_id';
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
        INSERT INTO conveyor.messages (queue_id, id, vt, sent_at, body, content_type, headers, group_id)
        SELECT (d.q).id, nextval((d.q).seq), ts + make_interval(secs => coalesce(delay, (d.q).delay_seconds)), ts,
               d.body, d.content_type, d.headers, gid
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
               'group_id', gid, 'delay', delay,
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

    -- queues not created yet: a held outbox row each, with what the queue will get
    INSERT INTO conveyor.http_deliveries (subscription_id, endpoint, payload, headers, message_id, held_reason,
                                          queue_name, queue_message)
    SELECT x.id, conveyor._queue_arn(x.queue_name, region, account), t.body, coalesce(t.headers, '{}'),
           (m ->> 'message_id')::uuid,
           format('SQS queue %s does not exist: held until it is created', quote_literal(x.queue_name)),
           x.queue_name,
           jsonb_strip_nulls(jsonb_build_object(
               'body', t.body, 'headers', t.headers, 'content_type', t.content_type, 'group_id', gid,
               'dedup_id', did, 'delay', delay,
               'content_hash', encode(sha256(convert_to(m ->> 'body', 'UTF8')), 'hex')))
      FROM conveyor.subscriptions x
      CROSS JOIN LATERAL conveyor._delivery(m, arn, env, x, region, account) t
     WHERE x.id = ANY (ids) AND x.protocol = 'sqs' AND x.queue_id IS NULL
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

------------------------------------------------------------------------------------------
-- The outbox: rows waiting for a queue are never claimed; a retry delivers them if the
-- queue exists
------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION conveyor.delivery_claim(lim integer, lease_seconds integer)
RETURNS SETOF conveyor.delivery_info
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    IF lim IS NULL OR lim < 1 OR lim > 10000 OR lease_seconds IS NULL OR lease_seconds < 1 THEN
        PERFORM conveyor._raise('CVV01', 'claim 1 to 10000 deliveries with a lease of at least 1 second');
    END IF;
    RETURN QUERY
    WITH due AS (
        SELECT d.id FROM conveyor.http_deliveries d
         WHERE d.next_attempt_at <= now() AND d.held_reason IS NULL AND d.attempt < d.max_attempts
           AND d.queue_name IS NULL
         ORDER BY d.next_attempt_at, d.id
         LIMIT lim
           FOR UPDATE SKIP LOCKED
    ), leased AS (
        UPDATE conveyor.http_deliveries d SET next_attempt_at = now() + make_interval(secs => lease_seconds)
          FROM due WHERE d.id = due.id
        RETURNING d.*
    )
    SELECT l.id, l.subscription_id, l.endpoint, l.payload, l.headers, l.message_id, l.attempt,
           l.max_attempts, l.next_attempt_at, l.last_error, l.held_reason, l.created_at, 'pending'::text
      FROM leased l ORDER BY l.id;
END $$;

-- Held or exhausted deliveries (the given ones, or all) become due with fresh attempts;
-- those waiting for a queue that exists now go into it. Returns how many.
CREATE OR REPLACE FUNCTION conveyor.delivery_retry(ids bigint[] DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    n integer;
    delivered integer := 0;
    q conveyor.queues;
BEGIN
    FOR q IN SELECT x.* FROM conveyor.queues x
              WHERE x.name IN (SELECT h.queue_name FROM conveyor.http_deliveries h
                                WHERE h.queue_name IS NOT NULL AND (ids IS NULL OR h.id = ANY (ids)))
              ORDER BY x.id LOOP
        delivered := delivered + conveyor._deliveries_to_queue(q, ids);
    END LOOP;
    UPDATE conveyor.http_deliveries d
       SET held_reason = NULL, attempt = 0, next_attempt_at = now()
     WHERE (ids IS NULL OR d.id = ANY (ids))
       AND d.queue_name IS NULL
       AND (d.held_reason IS NOT NULL OR d.attempt >= d.max_attempts);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n + delivered;
END $$;

------------------------------------------------------------------------------------------
-- Roles
------------------------------------------------------------------------------------------

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA conveyor FROM PUBLIC;

DO $$
BEGIN
    GRANT EXECUTE ON FUNCTION conveyor.topic_publish(text, jsonb) TO conveyor_writer;
    GRANT EXECUTE ON FUNCTION
        conveyor.subscription_create_v2(text, text, text, text, boolean, jsonb, text, jsonb, boolean, boolean)
        TO conveyor_admin;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: roles missing, grants skipped (%)', SQLERRM;
END $$;
