-- Conveyor 0005: topics, subscriptions, the webhook outbox and the SNS signing key.
--
-- A subscription binds a routing-key pattern to a queue (protocol 'sqs') or to an HTTP(S)
-- endpoint. Routing keys are dot-separated segments of [A-Za-z0-9_-]; a pattern's segment
-- may also be `*` (exactly one segment) or `#` (zero or more). Either may carry a region
-- prefix ("eu-west-1:orders"), as queue names do, for SNS topics of another region than
-- the server's default. A pattern is compiled once, at subscribe, to an anchored regular
-- expression over the key with a dot before every segment (see _routing_subject), so
-- `#` can absorb its separators; patterns without wildcards match by equality (index).
--
-- topic_publish fans a message out inside the caller's transaction in one call: every
-- matching, confirmed subscription whose filter policy accepts the message gets it, a
-- queue through the queue engine's insert path (sizes, delays, FIFO groups and
-- deduplication as for any send), an endpoint as one row of the outbox
-- (http_deliveries) that the server's webhook worker delivers with retries.
--
-- Topics are SNS topic objects (attributes, tags); a topic's name is the routing key an
-- SNS Publish uses and the pattern an SNS Subscribe binds. The native events API needs no
-- topic object.
--
-- New SQLSTATEs: CVN01 topic does not exist, CVN02 subscription does not exist,
-- CVN03 delivery does not exist.

CREATE TABLE conveyor.topics (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       text NOT NULL UNIQUE,
    -- SNS topic attributes as given (DisplayName, Policy, DeliveryPolicy, KmsMasterKeyId,
    -- FifoTopic, ContentBasedDeduplication, ...): strings, kept for GetTopicAttributes
    attributes jsonb NOT NULL DEFAULT '{}',
    tags       jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE conveyor.subscriptions (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    uuid                uuid NOT NULL UNIQUE DEFAULT gen_random_uuid(),
    pattern             text NOT NULL,
    regex               text NOT NULL,      -- the compiled pattern (_pattern_regex)
    wildcard            boolean NOT NULL,   -- the pattern has a * or # segment
    protocol            text NOT NULL CHECK (protocol IN ('sqs', 'http', 'https')),
    queue_id            bigint REFERENCES conveyor.queues (id) ON DELETE CASCADE,
    endpoint            text,
    raw_delivery        boolean NOT NULL DEFAULT false,
    filter_policy       jsonb CHECK (jsonb_typeof(filter_policy) = 'object'),
    filter_policy_scope text NOT NULL DEFAULT 'MessageAttributes'
                        CHECK (filter_policy_scope IN ('MessageAttributes', 'MessageBody')),
    -- other SNS subscription attributes (DeliveryPolicy, RedrivePolicy, ...) as given
    attributes          jsonb NOT NULL DEFAULT '{}',
    confirmed           boolean NOT NULL DEFAULT true,
    created_at          timestamptz NOT NULL DEFAULT now(),
    CHECK ((protocol = 'sqs') = (queue_id IS NOT NULL)),
    CHECK ((protocol = 'sqs') = (endpoint IS NULL))
);
-- Subscribing twice returns the first subscription: one per (pattern, target).
CREATE UNIQUE INDEX subscriptions_queue_key ON conveyor.subscriptions (pattern, queue_id)
    WHERE queue_id IS NOT NULL;
CREATE UNIQUE INDEX subscriptions_endpoint_key ON conveyor.subscriptions (pattern, endpoint)
    WHERE endpoint IS NOT NULL;
-- A publish: exact patterns by equality, wildcard patterns by a scan of only those.
CREATE INDEX subscriptions_pattern_idx ON conveyor.subscriptions (pattern) WHERE NOT wildcard;
CREATE INDEX subscriptions_wildcard_idx ON conveyor.subscriptions (id) WHERE wildcard;
CREATE INDEX subscriptions_queue_idx ON conveyor.subscriptions (queue_id) WHERE queue_id IS NOT NULL;

-- The webhook outbox: one row per (message, HTTP subscription) until delivered.
CREATE TABLE conveyor.http_deliveries (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subscription_id bigint NOT NULL REFERENCES conveyor.subscriptions (id) ON DELETE CASCADE,
    endpoint        text NOT NULL,
    payload         text NOT NULL,            -- the exact body to POST (raw or the envelope)
    headers         jsonb NOT NULL DEFAULT '{}',
    message_id      uuid NOT NULL,
    attempt         integer NOT NULL DEFAULT 0,   -- attempts made so far
    -- the first try and four retries, after 10 s, 30 s, 60 s and 300 s (_delivery_backoff)
    max_attempts    integer NOT NULL DEFAULT 5 CHECK (max_attempts BETWEEN 1 AND 100),
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text,
    held_reason     text,                      -- set: never attempted (e.g. a disallowed host)
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX http_deliveries_due_idx ON conveyor.http_deliveries (next_attempt_at, id)
    WHERE held_reason IS NULL AND attempt < max_attempts;
CREATE INDEX http_deliveries_subscription_idx ON conveyor.http_deliveries (subscription_id);

-- The SNS signing key: one row, created by the first server that needs it. Readable only
-- by its owner and the definer functions (signing_key_get is granted to admin only).
CREATE TABLE conveyor.signing_keys (
    id          smallint PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    private_key text NOT NULL,
    certificate text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- FIFO routing keys number their messages (SNS's SequenceNumber).
CREATE SEQUENCE conveyor.topic_sequence AS bigint;

CREATE VIEW conveyor.topic_info AS
SELECT t.name,
       t.name LIKE '%.fifo' AS fifo,
       t.attributes,
       t.tags,
       t.created_at,
       (SELECT count(*) FROM conveyor.subscriptions s WHERE s.pattern = t.name AND NOT s.wildcard)::integer
           AS subscriptions
  FROM conveyor.topics t;

CREATE VIEW conveyor.subscription_info AS
SELECT s.id, s.uuid, s.pattern, s.protocol, q.name AS queue, s.endpoint, s.raw_delivery,
       s.filter_policy, s.filter_policy_scope, s.attributes, s.confirmed, s.created_at
  FROM conveyor.subscriptions s
  LEFT JOIN conveyor.queues q ON q.id = s.queue_id;

CREATE VIEW conveyor.delivery_info AS
SELECT d.id, d.subscription_id, d.endpoint, d.payload, d.headers, d.message_id, d.attempt,
       d.max_attempts, d.next_attempt_at, d.last_error, d.held_reason, d.created_at,
       CASE WHEN d.held_reason IS NOT NULL THEN 'held'
            WHEN d.attempt >= d.max_attempts THEN 'exhausted'
            ELSE 'pending' END AS state
  FROM conveyor.http_deliveries d;

------------------------------------------------------------------------------------------
-- Names, routing keys, patterns (internal helpers)
------------------------------------------------------------------------------------------

-- SNS naming: 1-256 characters of [A-Za-z0-9_-]; FIFO topics end in ".fifo" (within the
-- 256). A topic of another region than the default carries it as a prefix. Returns fifo.
CREATE FUNCTION conveyor._topic_name_check(topic_name text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    bare text := regexp_replace(topic_name, '^[a-z0-9-]{1,32}:', '');
BEGIN
    -- (PostgreSQL caps a regex repetition count at 255, hence length() for the 256)
    IF topic_name IS NULL OR length(bare) > 256 OR bare !~ '^[A-Za-z0-9_-]+(\.fifo)?$' THEN
        PERFORM conveyor._raise('CVV01', format(
            'invalid topic name %s: use 1 to 256 characters of A-Z, a-z, 0-9, hyphen and underscore, with the suffix .fifo for FIFO topics (and optionally a region prefix such as eu-west-1:)',
            coalesce(quote_literal(left(topic_name, 100)), 'NULL')));
    END IF;
    RETURN bare LIKE '%.fifo';
END $$;

CREATE FUNCTION conveyor._routing_key_check(routing_key text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    bare text := regexp_replace(routing_key, '^[a-z0-9-]{1,32}:', '');
BEGIN
    IF routing_key IS NULL OR length(bare) > 256
       OR bare !~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$' THEN
        PERFORM conveyor._raise('CVV01', format(
            'invalid routing key %s: use 1 to 256 characters of dot-separated segments of A-Z, a-z, 0-9, hyphen and underscore (and optionally a region prefix such as eu-west-1:)',
            coalesce(quote_literal(left(routing_key, 100)), 'NULL')));
    END IF;
END $$;

-- The anchored regular expression a pattern compiles to, matched against
-- _routing_subject(key): the key with a dot before its first segment, so that every
-- segment is "\.<segment>" and `#` is "(?:\.<segment>)*", zero or more of them.
-- Segments hold only [A-Za-z0-9_-] (checked first), so none needs escaping.
CREATE FUNCTION conveyor._pattern_regex(pattern text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    region text := substring(pattern FROM '^([a-z0-9-]{1,32}):');
    bare text := regexp_replace(pattern, '^[a-z0-9-]{1,32}:', '');
    body text := '';
    seg text;
BEGIN
    IF pattern IS NULL OR length(bare) > 256
       OR bare !~ '^([A-Za-z0-9_-]+|\*|#)(\.([A-Za-z0-9_-]+|\*|#))*$' THEN
        PERFORM conveyor._raise('CVV01', format(
            'invalid routing-key pattern %s: use 1 to 256 characters of dot-separated segments, each of A-Z, a-z, 0-9, hyphen and underscore, or * (exactly one segment) or # (zero or more segments)',
            coalesce(quote_literal(left(pattern, 100)), 'NULL')));
    END IF;
    FOREACH seg IN ARRAY string_to_array(bare, '.') LOOP
        body := body || CASE seg WHEN '*' THEN '\.[A-Za-z0-9_-]+'
                                 WHEN '#' THEN '(?:\.[A-Za-z0-9_-]+)*'
                                 ELSE '\.' || seg END;
    END LOOP;
    RETURN '^' || coalesce(region || ':', '') || body || '$';
END $$;

CREATE FUNCTION conveyor._routing_subject(routing_key text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT regexp_replace(routing_key, '^([a-z0-9-]{1,32}:)?', '\1.')
$$;

-- arn:aws:sns:<region>:<account>:<name>, the region from the name's prefix if it has one.
CREATE FUNCTION conveyor._topic_arn(topic_name text, region text, account_id text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN topic_name ~ '^[a-z0-9-]{1,32}:'
                THEN 'arn:aws:sns:' || split_part(topic_name, ':', 1) || ':' || account_id || ':'
                     || substr(topic_name, strpos(topic_name, ':') + 1)
                ELSE 'arn:aws:sns:' || region || ':' || account_id || ':' || topic_name END
$$;

CREATE FUNCTION conveyor._topic(topic_name text) RETURNS conveyor.topics
LANGUAGE plpgsql STABLE AS $$
DECLARE
    t conveyor.topics;
BEGIN
    SELECT * INTO t FROM conveyor.topics WHERE name = topic_name;
    IF NOT FOUND THEN
        PERFORM conveyor._raise('CVN01', format('topic %s does not exist',
                                                coalesce(quote_literal(left(topic_name, 100)), 'NULL')));
    END IF;
    RETURN t;
END $$;

-- A subscription by id (digits) or uuid; NULL if there is none.
CREATE FUNCTION conveyor._subscription_id(ref text) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT s.id FROM conveyor.subscriptions s
     WHERE s.id = CASE WHEN ref ~ '^[0-9]{1,18}$' THEN ref::bigint END
        OR s.uuid = CASE WHEN ref ~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$'
                         THEN ref::uuid END
$$;

CREATE FUNCTION conveyor._subscription(ref text) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    sid bigint := conveyor._subscription_id(ref);
BEGIN
    IF sid IS NULL THEN
        PERFORM conveyor._raise('CVN02', format('subscription %s does not exist',
                                                coalesce(quote_literal(left(ref, 100)), 'NULL')));
    END IF;
    RETURN sid;
END $$;

CREATE FUNCTION conveyor._string_object_check(obj jsonb, what text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF obj IS NULL OR jsonb_typeof(obj) <> 'object'
       OR EXISTS (SELECT 1 FROM jsonb_each(obj) t WHERE jsonb_typeof(t.value) NOT IN ('string', 'null')) THEN
        PERFORM conveyor._raise('CVV01', what || ' must be a JSON object of strings');
    END IF;
END $$;

------------------------------------------------------------------------------------------
-- Filter policies (SNS semantics; validated in Python before they are stored)
------------------------------------------------------------------------------------------

-- JSON text to jsonb, or NULL if it is not valid JSON.
CREATE FUNCTION conveyor._json_or_null(doc text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN doc::jsonb;
EXCEPTION WHEN others THEN
    RETURN NULL;
END $$;

-- SNS-typed message attributes as the JSON document an attribute policy is matched
-- against: String -> a string, Number -> a number, String.Array (any *.Array) -> its
-- array; Binary attributes are not compared (SNS ignores them), so they are left out.
CREATE FUNCTION conveyor._fp_attributes(attributes jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(jsonb_object_agg(a.key, v.value), '{}')
      FROM jsonb_each(CASE WHEN jsonb_typeof(attributes) = 'object' THEN attributes ELSE '{}' END) a,
           LATERAL (SELECT a.value ->> 'DataType' AS type, a.value ->> 'StringValue' AS text) x,
           LATERAL (SELECT CASE
               WHEN x.type LIKE '%.Array' AND x.text ~ '^\s*\['
                   THEN coalesce(conveyor._json_or_null(x.text), to_jsonb(x.text))
               WHEN x.type LIKE 'Number%' AND x.text ~ '^\s*[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]{1,3})?\s*$'
                   THEN to_jsonb(x.text::numeric)
               WHEN x.type LIKE 'String%' OR x.type LIKE 'Number%'
                   THEN to_jsonb(x.text)
               END AS value) v
     WHERE jsonb_typeof(a.value) = 'object' AND x.text IS NOT NULL AND v.value IS NOT NULL
$$;

CREATE FUNCTION conveyor._fp_cidr(address text, block text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF address !~ '^[0-9A-Fa-f:.]{2,45}$' THEN
        RETURN false;
    END IF;
    RETURN address::inet <<= block::inet;
EXCEPTION WHEN others THEN
    RETURN false;
END $$;

-- {"numeric": [op, value, (op, value)]}: every comparison holds.
CREATE FUNCTION conveyor._fp_numeric(ops jsonb, x numeric) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    i integer := 0;
    n integer := jsonb_array_length(ops);
    op text;
    v numeric;
BEGIN
    WHILE i + 1 < n LOOP
        op := ops ->> i;
        v := (ops ->> (i + 1))::numeric;
        IF NOT (CASE op WHEN '=' THEN x = v WHEN '<' THEN x < v WHEN '<=' THEN x <= v
                        WHEN '>' THEN x > v WHEN '>=' THEN x >= v ELSE false END) THEN
            RETURN false;
        END IF;
        i := i + 2;
    END LOOP;
    RETURN true;
END $$;

-- One policy value against one scalar value of the message.
CREATE FUNCTION conveyor._fp_scalar(c jsonb, e jsonb) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    te text := jsonb_typeof(e);
    s text := CASE WHEN jsonb_typeof(e) = 'string' THEN e #>> '{}' END;
    op text;
    arg jsonb;
BEGIN
    IF jsonb_typeof(c) <> 'object' THEN
        -- exact match: strings to strings, numbers to numbers (numerically), true/false/null
        RETURN jsonb_typeof(c) = te AND c = e;
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
        RETURN te = 'number' AND conveyor._fp_numeric(arg, e::numeric);
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
             WHERE jsonb_typeof(w) = te AND w = e);
    ELSE
        RETURN false;
    END CASE;
END $$;

-- One key's list of policy values against the message's value (NULL: the key is absent).
-- An array value (String.Array, a JSON array in the body) matches if any element does.
-- A key exists when it has a value other than null.
CREATE FUNCTION conveyor._fp_values(conds jsonb, v jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM jsonb_array_elements(conds) c
         WHERE CASE WHEN jsonb_typeof(c) = 'object' AND c ? 'exists'
                        THEN coalesce(jsonb_typeof(v) <> 'null', false) = (c ->> 'exists')::boolean
                    WHEN v IS NULL THEN false
                    WHEN jsonb_typeof(v) = 'array'
                        THEN EXISTS (SELECT 1 FROM jsonb_array_elements(v) e WHERE conveyor._fp_scalar(c, e))
                    ELSE conveyor._fp_scalar(c, v) END)
$$;

-- A policy against a document (the attributes, or the parsed body): every key must
-- match (AND), one of a key's values must match (OR), "$or" takes any of its policies,
-- and nested objects descend into the document (an array of objects: any element).
CREATE FUNCTION conveyor._fp_match(policy jsonb, doc jsonb) RETURNS boolean
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
        v := CASE WHEN jsonb_typeof(doc) = 'object' THEN doc -> k END;
        IF jsonb_typeof(rule) = 'object' THEN
            IF jsonb_typeof(v) = 'array' THEN
                IF NOT EXISTS (SELECT 1 FROM jsonb_array_elements(v) e WHERE conveyor._fp_match(rule, e)) THEN
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

-- A policy against the whole document: as _fp_match, except that an empty document
-- (no attributes, or {} as the body) matches only the empty policy (SNS: "exists": false
-- needs at least one attribute present), and a document that is not a JSON object none.
CREATE FUNCTION conveyor._fp_accepts(policy jsonb, doc jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN policy IS NULL OR policy = '{}' THEN true
                WHEN jsonb_typeof(doc) IS DISTINCT FROM 'object' OR doc = '{}' THEN false
                ELSE conveyor._fp_match(policy, doc) END
$$;

-- Whether a subscription's filter policy accepts a message: scope 'MessageAttributes'
-- matches the SNS-typed attributes, 'MessageBody' the body parsed as JSON (a body that
-- is not a JSON object never matches). A NULL policy accepts everything.
CREATE FUNCTION conveyor._filter_policy_matches(policy jsonb, scope text, attributes jsonb, body text)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT conveyor._fp_accepts(policy, CASE WHEN scope = 'MessageBody' THEN conveyor._json_or_null(body)
                                             ELSE conveyor._fp_attributes(attributes) END)
$$;

-- The same, callable by readers (e.g. to try a policy against a message from psql).
CREATE FUNCTION conveyor.filter_policy_matches(policy jsonb, scope text, attributes jsonb, body text)
RETURNS boolean
LANGUAGE sql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT conveyor._filter_policy_matches(policy, scope, attributes, body)
$$;

------------------------------------------------------------------------------------------
-- Envelopes
------------------------------------------------------------------------------------------

-- The envelope's MessageAttributes: {"name": {"Type": ..., "Value": ...}} (NULL if none).
CREATE FUNCTION conveyor._envelope_attributes(attributes jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT '{' || string_agg(to_json(a.key)::text || ' : ' || json_build_object(
                   'Type', a.value ->> 'DataType',
                   'Value', coalesce(a.value ->> 'StringValue', a.value ->> 'BinaryValue'))::text,
                   ', ' ORDER BY a.key) || '}'
      FROM jsonb_each(CASE WHEN jsonb_typeof(attributes) = 'object' THEN attributes ELSE '{}' END) a
     WHERE jsonb_typeof(a.value) = 'object'
$$;

-- The SNS Notification envelope, fields in SNS's order, in two parts that go around the
-- subscription's ARN at the end of UnsubscribeURL: built once per publish, every
-- subscription's envelope is head || ARN || tail. Absent fields are left out (an
-- unsigned message, e.g. published from psql, has no Signature or SigningCertURL); with
-- no unsubscribe_url there is no UnsubscribeURL and the tail is NULL. ARNs hold only
-- characters JSON and URLs take as they are, except '#', written %23.
CREATE FUNCTION conveyor._envelope_parts(m jsonb, topic_arn text, body text, signature text) RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    WITH f(o, k, v) AS (VALUES
        (1, 'Type', to_json('Notification'::text)::text),
        (2, 'MessageId', to_json(m ->> 'message_id')::text),
        (3, 'SequenceNumber', to_json(m ->> 'sequence_number')::text),
        (4, 'TopicArn', to_json(topic_arn)::text),
        (5, 'Subject', to_json(m ->> 'subject')::text),
        (6, 'Message', to_json(body)::text),
        (7, 'Timestamp', to_json(m ->> 'timestamp')::text),
        (8, 'SignatureVersion', CASE WHEN signature IS NOT NULL THEN '"2"' END),
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

------------------------------------------------------------------------------------------
-- Topics
------------------------------------------------------------------------------------------

-- Creates a topic, or returns the existing one: given attributes must equal the stored
-- ones (as SNS's CreateTopic demands); given tags are added.
CREATE FUNCTION conveyor.topic_create(topic_name text, attributes jsonb DEFAULT '{}', tags jsonb DEFAULT '{}')
RETURNS SETOF conveyor.topic_info
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    t conveyor.topics;
BEGIN
    PERFORM conveyor._topic_name_check(topic_name);
    attributes := jsonb_strip_nulls(coalesce(attributes, '{}'));
    tags := coalesce(tags, '{}');
    IF jsonb_typeof(attributes) <> 'object' THEN
        PERFORM conveyor._raise('CVV01', 'attributes must be a JSON object');
    END IF;
    PERFORM conveyor._string_object_check(tags, 'tags');
    INSERT INTO conveyor.topics AS x (name, attributes, tags)
    VALUES (topic_name, attributes, jsonb_strip_nulls(tags))
    ON CONFLICT (name) DO NOTHING
    RETURNING * INTO t;
    IF t.id IS NULL THEN
        SELECT * INTO t FROM conveyor.topics x WHERE x.name = topic_name FOR UPDATE;
        IF NOT t.attributes @> attributes THEN
            PERFORM conveyor._raise('CVV01', 'Invalid parameter: Attributes Reason: Topic already exists with different attributes');
        END IF;
        IF tags <> '{}' THEN
            UPDATE conveyor.topics x SET tags = jsonb_strip_nulls(x.tags || topic_create.tags) WHERE x.id = t.id;
        END IF;
    END IF;
    RETURN QUERY SELECT * FROM conveyor.topic_info i WHERE i.name = topic_name;
END $$;

-- Deletes a topic and the subscriptions bound to its name; false if there was none.
CREATE FUNCTION conveyor.topic_delete(topic_name text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    DELETE FROM conveyor.topics WHERE name = topic_name;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    DELETE FROM conveyor.subscriptions WHERE pattern = topic_name;
    RETURN true;
END $$;

CREATE FUNCTION conveyor.topic_get(topic_name text) RETURNS SETOF conveyor.topic_info
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    PERFORM conveyor._topic(topic_name);
    RETURN QUERY SELECT * FROM conveyor.topic_info WHERE name = topic_name;
END $$;

CREATE FUNCTION conveyor.topic_list(prefix text DEFAULT NULL, after text DEFAULT NULL, lim integer DEFAULT NULL)
RETURNS SETOF conveyor.topic_info
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT * FROM conveyor.topic_info
     WHERE (prefix IS NULL OR starts_with(name, prefix))
       AND (after IS NULL OR name > after)
     ORDER BY name
     LIMIT lim
$$;

-- Merges attributes in (a null value removes one).
CREATE FUNCTION conveyor.topic_set_attributes(topic_name text, attributes jsonb)
RETURNS SETOF conveyor.topic_info
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    t conveyor.topics := conveyor._topic(topic_name);
BEGIN
    IF attributes IS NULL OR jsonb_typeof(attributes) <> 'object' THEN
        PERFORM conveyor._raise('CVV01', 'attributes must be a JSON object');
    END IF;
    UPDATE conveyor.topics x SET attributes = jsonb_strip_nulls(x.attributes || topic_set_attributes.attributes)
     WHERE x.id = t.id;
    RETURN QUERY SELECT * FROM conveyor.topic_info WHERE name = topic_name;
END $$;

CREATE FUNCTION conveyor.topic_tag(topic_name text, tags jsonb) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    t conveyor.topics := conveyor._topic(topic_name);
    result jsonb;
BEGIN
    PERFORM conveyor._string_object_check(tags, 'tags');
    UPDATE conveyor.topics x SET tags = jsonb_strip_nulls(x.tags || topic_tag.tags)
     WHERE x.id = t.id RETURNING x.tags INTO result;
    RETURN result;
END $$;

CREATE FUNCTION conveyor.topic_untag(topic_name text, keys text[]) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    t conveyor.topics := conveyor._topic(topic_name);
    result jsonb;
BEGIN
    UPDATE conveyor.topics x SET tags = x.tags - coalesce(keys, '{}')
     WHERE x.id = t.id RETURNING x.tags INTO result;
    RETURN result;
END $$;

-- Whether a pattern matches a routing key (both checked), e.g. to try patterns from psql.
CREATE FUNCTION conveyor.topic_pattern_matches(pattern text, routing_key text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    PERFORM conveyor._routing_key_check(routing_key);
    RETURN conveyor._routing_subject(routing_key) ~ conveyor._pattern_regex(pattern);
END $$;

------------------------------------------------------------------------------------------
-- Subscriptions
------------------------------------------------------------------------------------------

-- Binds a pattern to a queue ('sqs') or an endpoint ('http', 'https'). Subscribing the
-- same (pattern, queue) or (pattern, endpoint) again returns the first subscription. A
-- FIFO queue takes messages from FIFO routing keys only (patterns ending in ".fifo"),
-- since only those carry the group id a FIFO queue needs.
CREATE FUNCTION conveyor.subscription_create(pattern text, protocol text, queue_name text DEFAULT NULL,
                                             endpoint text DEFAULT NULL, raw_delivery boolean DEFAULT false,
                                             filter_policy jsonb DEFAULT NULL,
                                             filter_policy_scope text DEFAULT 'MessageAttributes',
                                             attributes jsonb DEFAULT '{}', confirmed boolean DEFAULT true)
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
        IF queue_name IS NULL OR endpoint IS NOT NULL THEN
            PERFORM conveyor._raise('CVV01', 'an sqs subscription names a queue and no endpoint');
        END IF;
        q := conveyor._queue(queue_name);
        IF q.fifo AND pattern NOT LIKE '%.fifo' THEN
            PERFORM conveyor._raise('CVV01', format(
                'FIFO queue %s can only subscribe to a FIFO routing key (a pattern ending in .fifo)',
                quote_literal(q.name)));
        END IF;
    ELSIF queue_name IS NOT NULL OR endpoint IS NULL OR length(endpoint) > 2048
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
    INSERT INTO conveyor.subscriptions AS s (pattern, regex, wildcard, protocol, queue_id, endpoint, raw_delivery,
                                             filter_policy, filter_policy_scope, attributes, confirmed)
    VALUES (pattern, rx, pattern ~ '(^|[.:])[*#](\.|$)', protocol, q.id,
            CASE WHEN protocol = 'sqs' THEN NULL ELSE endpoint END, coalesce(raw_delivery, false),
            filter_policy, filter_policy_scope, jsonb_strip_nulls(coalesce(attributes, '{}')),
            coalesce(confirmed, true))
    ON CONFLICT DO NOTHING
    RETURNING s.id INTO sid;
    IF sid IS NULL THEN
        SELECT s.id INTO sid FROM conveyor.subscriptions s
         WHERE s.pattern = subscription_create.pattern
           AND (s.queue_id = q.id OR s.endpoint = subscription_create.endpoint);
    END IF;
    RETURN QUERY SELECT * FROM conveyor.subscription_info i WHERE i.id = sid;
END $$;

CREATE FUNCTION conveyor.subscription_delete(ref text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    DELETE FROM conveyor.subscriptions WHERE id = conveyor._subscription_id(ref);
    RETURN FOUND;
END $$;

CREATE FUNCTION conveyor.subscription_get(ref text) RETURNS SETOF conveyor.subscription_info
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    RETURN QUERY SELECT * FROM conveyor.subscription_info WHERE id = conveyor._subscription(ref);
END $$;

-- Changes a subscription: the keys present in `changes` among raw_delivery,
-- filter_policy (null removes it), filter_policy_scope, confirmed, and attributes
-- (merged; a null value removes one).
CREATE FUNCTION conveyor.subscription_set_attributes(ref text, changes jsonb)
RETURNS SETOF conveyor.subscription_info
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    sid bigint := conveyor._subscription(ref);
    bad text;
BEGIN
    IF changes IS NULL OR jsonb_typeof(changes) <> 'object' THEN
        PERFORM conveyor._raise('CVV01', 'changes must be a JSON object');
    END IF;
    SELECT k INTO bad FROM jsonb_object_keys(changes) k
     WHERE k NOT IN ('raw_delivery', 'filter_policy', 'filter_policy_scope', 'confirmed', 'attributes') LIMIT 1;
    IF bad IS NOT NULL THEN
        PERFORM conveyor._raise('CVV01', format('unknown subscription setting %s', quote_literal(bad)));
    END IF;
    IF jsonb_typeof(changes -> 'raw_delivery') NOT IN ('boolean')
       OR jsonb_typeof(changes -> 'confirmed') NOT IN ('boolean')
       OR jsonb_typeof(changes -> 'filter_policy') NOT IN ('object', 'null')
       OR jsonb_typeof(changes -> 'attributes') NOT IN ('object')
       OR (changes ? 'filter_policy_scope'
           AND coalesce(changes ->> 'filter_policy_scope', '') NOT IN ('MessageAttributes', 'MessageBody')) THEN
        PERFORM conveyor._raise('CVV01', 'invalid subscription settings: raw_delivery and confirmed are booleans, filter_policy an object or null, filter_policy_scope MessageAttributes or MessageBody, attributes an object');
    END IF;
    UPDATE conveyor.subscriptions s SET
        raw_delivery = coalesce((changes ->> 'raw_delivery')::boolean, s.raw_delivery),
        confirmed = coalesce((changes ->> 'confirmed')::boolean, s.confirmed),
        filter_policy = CASE WHEN changes ? 'filter_policy'
                             THEN nullif(changes -> 'filter_policy', 'null'::jsonb) ELSE s.filter_policy END,
        filter_policy_scope = coalesce(changes ->> 'filter_policy_scope', s.filter_policy_scope),
        attributes = jsonb_strip_nulls(s.attributes || coalesce(changes -> 'attributes', '{}'))
     WHERE s.id = sid;
    RETURN QUERY SELECT * FROM conveyor.subscription_info WHERE id = sid;
END $$;

-- Subscriptions in id order: all, of one pattern (exactly), or delivering to one queue.
CREATE FUNCTION conveyor.subscription_list(pattern text DEFAULT NULL, queue_name text DEFAULT NULL,
                                           after_id bigint DEFAULT 0, lim integer DEFAULT NULL)
RETURNS SETOF conveyor.subscription_info
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    qid bigint;
BEGIN
    IF queue_name IS NOT NULL THEN
        qid := (conveyor._queue(queue_name)).id;
    END IF;
    RETURN QUERY
    SELECT i.* FROM conveyor.subscription_info i JOIN conveyor.subscriptions s ON s.id = i.id
     WHERE (subscription_list.pattern IS NULL OR s.pattern = subscription_list.pattern)
       AND (qid IS NULL OR s.queue_id = qid)
       AND s.id > coalesce(after_id, 0)
     ORDER BY s.id
     LIMIT lim;
END $$;

------------------------------------------------------------------------------------------
-- Publish
------------------------------------------------------------------------------------------

-- Fans `message` out to every confirmed subscription whose pattern matches the routing
-- key and whose filter policy accepts it, inside the caller's transaction. `message`:
--   body (required), subject, attributes (SNS-typed: {"n": {"DataType", "StringValue" |
--   "BinaryValue"}}), content_type, group_id, dedup_id, delay, message_id, timestamp,
--   topic_arn, region, account_id, signature, signing_cert_url, unsubscribe_url (the
--   URL up to the subscription ARN), bodies / signatures (per protocol: sqs, http, https).
-- Raw subscriptions get the body (attributes as a queue message's headers); the others
-- the SNS envelope. A FIFO routing key (ending in .fifo) needs a group_id; its dedup_id
-- defaults to the body's SHA-256 when the topic has ContentBasedDeduplication "true".
-- Returns the queues delivered to (one entry per subscription), how many webhook
-- deliveries were queued, and the FIFO sequence number.
CREATE FUNCTION conveyor.topic_publish(routing_key text, message jsonb)
RETURNS TABLE (queues text[], endpoints integer, sequence_number text)
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

    -- standard queues: one insert, each row checked as any send checks it
    INSERT INTO conveyor.messages (queue_id, id, vt, sent_at, body, content_type, headers, group_id)
    SELECT (d.q).id, nextval((d.q).seq), ts + make_interval(secs => coalesce(delay, (d.q).delay_seconds)), ts,
           d.body, d.content_type, d.headers, gid
      FROM (SELECT q, x.id AS sid, t.*
              FROM conveyor.subscriptions x
              JOIN conveyor.queues q ON q.id = x.queue_id
              CROSS JOIN LATERAL conveyor._delivery(m, arn, env, x, region, account) t
             WHERE x.id = ANY (ids) AND NOT q.fifo) d
     WHERE conveyor._message_ok(d.q, d.body, d.headers, delay, NULL, NULL)
     ORDER BY d.sid;

    -- FIFO queues: through the queue engine's FIFO path (groups, deduplication)
    FOR f IN SELECT q, t.*
               FROM conveyor.subscriptions x
               JOIN conveyor.queues q ON q.id = x.queue_id
               CROSS JOIN LATERAL conveyor._delivery(m, arn, env, x, region, account) t
              WHERE x.id = ANY (ids) AND q.fifo
              ORDER BY x.id LOOP
        PERFORM conveyor._send(f.q, jsonb_build_array(jsonb_build_object(
            'body', f.body, 'headers', f.headers, 'content_type', f.content_type, 'group_id', gid,
            -- a queue's content-based deduplication hashes the published body, not the
            -- envelope (which differs on every publish)
            'dedup_id', coalesce(did, CASE WHEN (f.q).content_based_deduplication
                                           THEN encode(sha256(convert_to(body, 'UTF8')), 'hex') END),
            'delay', delay)));
    END LOOP;

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

    PERFORM conveyor._wake(q, 1)
       FROM conveyor.queues q
      WHERE q.id IN (SELECT x.queue_id FROM conveyor.subscriptions x WHERE x.id = ANY (ids));

    RETURN QUERY
    SELECT coalesce((SELECT array_agg(q.name ORDER BY x.id)
                       FROM conveyor.subscriptions x JOIN conveyor.queues q ON q.id = x.queue_id
                      WHERE x.id = ANY (ids)), '{}'),
           n_http, seqno;
END $$;

-- What one subscription receives of a published message: the body (raw, or the
-- envelope with this subscription's UnsubscribeURL), headers and content type for a
-- queue, and the subscription's ARN.
CREATE FUNCTION conveyor._delivery(m jsonb, topic_arn text, envelope text[], s conveyor.subscriptions,
                                   region text, account text,
                                   OUT body text, OUT headers jsonb, OUT content_type text,
                                   OUT subscription_arn text)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    own boolean := (m -> 'bodies') ? s.protocol;  -- a message of its own for this protocol
BEGIN
    subscription_arn := conveyor._topic_arn(s.pattern, region, account) || ':' || s.uuid;
    IF s.raw_delivery THEN
        body := CASE WHEN own THEN m -> 'bodies' ->> s.protocol ELSE m ->> 'body' END;
        headers := CASE WHEN jsonb_typeof(m -> 'attributes') = 'object' AND m -> 'attributes' <> '{}'
                        THEN m -> 'attributes' END;
        content_type := m ->> 'content_type';
    ELSE
        IF own THEN
            envelope := conveyor._envelope_parts(m, topic_arn, m -> 'bodies' ->> s.protocol,
                                                 m -> 'signatures' ->> s.protocol);
        END IF;
        body := envelope[1] || coalesce(replace(subscription_arn, '#', '%23') || envelope[2], '');
        content_type := 'application/json';
    END IF;
END $$;

------------------------------------------------------------------------------------------
-- The webhook outbox
------------------------------------------------------------------------------------------

-- Seconds to wait after the n-th failed attempt: 10, 30, 60, then 300.
CREATE FUNCTION conveyor._delivery_backoff(attempt integer) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
    SELECT (ARRAY[10, 30, 60, 300])[least(greatest(attempt, 1), 4)]
$$;

-- Claims due deliveries (not held, attempts left) with SKIP LOCKED and leases them:
-- next_attempt_at moves lease_seconds ahead, so a worker that dies gives them back.
CREATE FUNCTION conveyor.delivery_claim(lim integer, lease_seconds integer)
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

-- Delivered: the rows go.
CREATE FUNCTION conveyor.delivery_succeeded(ids bigint[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    n integer;
BEGIN
    DELETE FROM conveyor.http_deliveries WHERE id = ANY (ids);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

CREATE FUNCTION conveyor._delivery_exists(delivery_id bigint) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM conveyor.http_deliveries WHERE id = delivery_id) THEN
        PERFORM conveyor._raise('CVN03', format('delivery %s does not exist', coalesce(delivery_id::text, 'NULL')));
    END IF;
END $$;

-- A failed attempt: counted, retried after the backoff; the last one leaves the row
-- exhausted, kept with its error for inspection.
CREATE FUNCTION conveyor.delivery_failed(delivery_id bigint, error text)
RETURNS SETOF conveyor.delivery_info
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    UPDATE conveyor.http_deliveries d
       SET attempt = d.attempt + 1,
           last_error = left(coalesce(error, 'failed'), 4096),
           next_attempt_at = now() + make_interval(secs => conveyor._delivery_backoff(d.attempt + 1))
     WHERE d.id = delivery_id;
    PERFORM conveyor._delivery_exists(delivery_id);
    RETURN QUERY SELECT * FROM conveyor.delivery_info WHERE id = delivery_id;
END $$;

-- Never to be attempted as it stands (e.g. its host is not allowed): kept with the reason.
CREATE FUNCTION conveyor.delivery_hold(delivery_id bigint, reason text)
RETURNS SETOF conveyor.delivery_info
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    UPDATE conveyor.http_deliveries d SET held_reason = left(coalesce(reason, 'held'), 4096)
     WHERE d.id = delivery_id;
    PERFORM conveyor._delivery_exists(delivery_id);
    RETURN QUERY SELECT * FROM conveyor.delivery_info WHERE id = delivery_id;
END $$;

-- Held or exhausted deliveries (the given ones, or all) become due with fresh attempts.
CREATE FUNCTION conveyor.delivery_retry(ids bigint[] DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    n integer;
BEGIN
    UPDATE conveyor.http_deliveries d
       SET held_reason = NULL, attempt = 0, next_attempt_at = now()
     WHERE (ids IS NULL OR d.id = ANY (ids))
       AND (d.held_reason IS NOT NULL OR d.attempt >= d.max_attempts);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

CREATE FUNCTION conveyor.delivery_list(state text DEFAULT NULL, subscription text DEFAULT NULL,
                                       lim integer DEFAULT 100)
RETURNS SETOF conveyor.delivery_info
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    sid bigint;
BEGIN
    IF state IS NOT NULL AND state NOT IN ('pending', 'held', 'exhausted') THEN
        PERFORM conveyor._raise('CVV01', 'delivery state must be pending, held or exhausted');
    END IF;
    IF subscription IS NOT NULL THEN
        sid := conveyor._subscription(subscription);
    END IF;
    RETURN QUERY
    SELECT * FROM conveyor.delivery_info i
     WHERE (delivery_list.state IS NULL OR i.state = delivery_list.state)
       AND (sid IS NULL OR i.subscription_id = sid)
     ORDER BY i.id
     LIMIT lim;
END $$;

CREATE FUNCTION conveyor.deliveries_stats(
    OUT pending bigint, OUT due bigint, OUT held bigint, OUT exhausted bigint, OUT oldest_pending_age interval)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT count(*) FILTER (WHERE held_reason IS NULL AND attempt < max_attempts),
           count(*) FILTER (WHERE held_reason IS NULL AND attempt < max_attempts AND next_attempt_at <= now()),
           count(*) FILTER (WHERE held_reason IS NOT NULL),
           count(*) FILTER (WHERE held_reason IS NULL AND attempt >= max_attempts),
           now() - min(created_at) FILTER (WHERE held_reason IS NULL AND attempt < max_attempts)
      FROM conveyor.http_deliveries
$$;

------------------------------------------------------------------------------------------
-- The signing key
------------------------------------------------------------------------------------------

CREATE FUNCTION conveyor.signing_key_get(OUT private_key text, OUT certificate text)
RETURNS SETOF record
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT k.private_key, k.certificate FROM conveyor.signing_keys k WHERE k.id = 1
$$;

-- Stores a key unless one is stored already; returns the stored one either way, so
-- processes racing to create it all end with the same key.
CREATE FUNCTION conveyor.signing_key_create(new_private_key text, new_certificate text,
                                            OUT private_key text, OUT certificate text)
RETURNS SETOF record
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    IF new_private_key IS NULL OR new_certificate IS NULL THEN
        PERFORM conveyor._raise('CVV01', 'a signing key needs a private key and a certificate');
    END IF;
    INSERT INTO conveyor.signing_keys (id, private_key, certificate)
    VALUES (1, new_private_key, new_certificate)
    ON CONFLICT (id) DO NOTHING;
    RETURN QUERY SELECT k.private_key, k.certificate FROM conveyor.signing_keys k WHERE k.id = 1;
END $$;

CREATE FUNCTION conveyor.signing_certificate() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT certificate FROM conveyor.signing_keys WHERE id = 1
$$;

------------------------------------------------------------------------------------------
-- Roles: reader lists, writer publishes and runs the outbox, admin creates and subscribes
------------------------------------------------------------------------------------------

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA conveyor FROM PUBLIC;
REVOKE ALL ON conveyor.signing_keys FROM PUBLIC;

DO $$
BEGIN
    GRANT SELECT ON conveyor.topics, conveyor.subscriptions, conveyor.http_deliveries,
                    conveyor.topic_info, conveyor.subscription_info, conveyor.delivery_info TO conveyor_reader;
    GRANT EXECUTE ON FUNCTION
        conveyor.topic_get(text), conveyor.topic_list(text, text, integer),
        conveyor.subscription_get(text), conveyor.subscription_list(text, text, bigint, integer),
        conveyor.delivery_list(text, text, integer), conveyor.deliveries_stats(),
        conveyor.signing_certificate(), conveyor.topic_pattern_matches(text, text),
        conveyor.filter_policy_matches(jsonb, text, jsonb, text)
        TO conveyor_reader;
    GRANT EXECUTE ON FUNCTION
        conveyor.topic_publish(text, jsonb),
        conveyor.delivery_claim(integer, integer), conveyor.delivery_succeeded(bigint[]),
        conveyor.delivery_failed(bigint, text), conveyor.delivery_hold(bigint, text)
        TO conveyor_writer;
    GRANT EXECUTE ON FUNCTION
        conveyor.topic_create(text, jsonb, jsonb), conveyor.topic_delete(text),
        conveyor.topic_set_attributes(text, jsonb), conveyor.topic_tag(text, jsonb),
        conveyor.topic_untag(text, text[]),
        conveyor.subscription_create(text, text, text, text, boolean, jsonb, text, jsonb, boolean),
        conveyor.subscription_delete(text), conveyor.subscription_set_attributes(text, jsonb),
        conveyor.delivery_retry(bigint[]),
        conveyor.signing_key_get(), conveyor.signing_key_create(text, text)
        TO conveyor_admin;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: roles missing, grants skipped (%)', SQLERRM;
END $$;
