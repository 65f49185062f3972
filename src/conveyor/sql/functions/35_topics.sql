-- Topics, subscriptions, filter policies and deliveries (core/topics.py, core/filter_policy.py, core/signing.py).
--
-- Current definitions, re-applied whenever a file of this folder changes (docs/architecture.md,
-- "Where each SQL function's current definition lives"). Edit a function here; tables, types,
-- indexes, data and DROPs go in a new numbered migration.

CREATE OR REPLACE VIEW conveyor.topic_info AS
SELECT t.name,
       t.name LIKE '%.fifo' AS fifo,
       t.attributes,
       t.tags,
       t.created_at,
       (SELECT count(*) FROM conveyor.subscriptions s WHERE s.pattern = t.name AND NOT s.wildcard)::integer
           AS subscriptions
  FROM conveyor.topics t;

CREATE OR REPLACE VIEW conveyor.delivery_info AS
SELECT d.id, d.subscription_id, d.endpoint, d.payload, d.headers, d.message_id, d.attempt,
       d.max_attempts, d.next_attempt_at, d.last_error, d.held_reason, d.created_at,
       CASE WHEN d.held_reason IS NOT NULL THEN 'held'
            WHEN d.attempt >= d.max_attempts THEN 'exhausted'
            ELSE 'pending' END AS state
  FROM conveyor.http_deliveries d;

-- SNS naming: 1-256 characters of [A-Za-z0-9_-]; FIFO topics end in ".fifo" (within the
-- 256). A topic of another region than the default carries it as a prefix. Returns fifo.
CREATE OR REPLACE FUNCTION conveyor._topic_name_check(topic_name text) RETURNS boolean
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

CREATE OR REPLACE FUNCTION conveyor._routing_key_check(routing_key text) RETURNS void
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
CREATE OR REPLACE FUNCTION conveyor._pattern_regex(pattern text) RETURNS text
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

CREATE OR REPLACE FUNCTION conveyor._routing_subject(routing_key text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT regexp_replace(routing_key, '^([a-z0-9-]{1,32}:)?', '\1.')
$$;

-- arn:aws:sns:<region>:<account>:<name>, the region from the name's prefix if it has one.
CREATE OR REPLACE FUNCTION conveyor._topic_arn(topic_name text, region text, account_id text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN topic_name ~ '^[a-z0-9-]{1,32}:'
                THEN 'arn:aws:sns:' || split_part(topic_name, ':', 1) || ':' || account_id || ':'
                     || substr(topic_name, strpos(topic_name, ':') + 1)
                ELSE 'arn:aws:sns:' || region || ':' || account_id || ':' || topic_name END
$$;

CREATE OR REPLACE FUNCTION conveyor._topic(topic_name text) RETURNS conveyor.topics
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
CREATE OR REPLACE FUNCTION conveyor._subscription_id(ref text) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT s.id FROM conveyor.subscriptions s
     WHERE s.id = CASE WHEN ref ~ '^[0-9]{1,18}$' THEN ref::bigint END
        OR s.uuid = CASE WHEN conveyor._is_uuid(ref)
                         THEN ref::uuid END
$$;

CREATE OR REPLACE FUNCTION conveyor._subscription(ref text) RETURNS bigint
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

CREATE OR REPLACE FUNCTION conveyor._fp_cidr(address text, block text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF address !~ '^[0-9A-Fa-f:.]{2,45}$' THEN
        RETURN false;
    END IF;
    RETURN address::inet <<= block::inet;
EXCEPTION WHEN others THEN
    RETURN false;
END $$;

-- A policy against the whole document: as _fp_match, except that an empty document
-- (no attributes, or {} as the body) matches only the empty policy (SNS: "exists": false
-- needs at least one attribute present), and a document that is not a JSON object none.
CREATE OR REPLACE FUNCTION conveyor._fp_accepts(policy jsonb, doc jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN policy IS NULL OR policy = '{}' THEN true
                WHEN jsonb_typeof(doc) IS DISTINCT FROM 'object' OR doc = '{}' THEN false
                ELSE conveyor._fp_match(policy, doc) END
$$;

-- Whether a subscription's filter policy accepts a message: scope 'MessageAttributes'
-- matches the SNS-typed attributes, 'MessageBody' the body parsed as JSON (a body that
-- is not a JSON object never matches). A NULL policy accepts everything.
CREATE OR REPLACE FUNCTION conveyor._filter_policy_matches(policy jsonb, scope text, attributes jsonb, body text)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT conveyor._fp_accepts(policy, CASE WHEN scope = 'MessageBody' THEN conveyor._json_or_null(body)
                                             ELSE conveyor._fp_attributes(attributes) END)
$$;

-- The same, callable by readers (e.g. to try a policy against a message from psql).
CREATE OR REPLACE FUNCTION conveyor.filter_policy_matches(policy jsonb, scope text, attributes jsonb, body text)
RETURNS boolean
LANGUAGE sql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT conveyor._filter_policy_matches(policy, scope, attributes, body)
$$;

-- The envelope's MessageAttributes: {"name": {"Type": ..., "Value": ...}} (NULL if none).
CREATE OR REPLACE FUNCTION conveyor._envelope_attributes(attributes jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT '{' || string_agg(to_json(a.key)::text || ' : ' || json_build_object(
                   'Type', a.value ->> 'DataType',
                   'Value', coalesce(a.value ->> 'StringValue', a.value ->> 'BinaryValue'))::text,
                   ', ' ORDER BY a.key) || '}'
      FROM jsonb_each(CASE WHEN jsonb_typeof(attributes) = 'object' THEN attributes ELSE '{}' END) a
     WHERE jsonb_typeof(a.value) = 'object'
$$;

-- Creates a topic, or returns the existing one: given attributes must equal the stored
-- ones (as SNS's CreateTopic demands); given tags are added.
CREATE OR REPLACE FUNCTION conveyor.topic_create(topic_name text, attributes jsonb DEFAULT '{}', tags jsonb DEFAULT '{}')
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
CREATE OR REPLACE FUNCTION conveyor.topic_delete(topic_name text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    DELETE FROM conveyor.topics WHERE name = topic_name;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    DELETE FROM conveyor.subscriptions WHERE pattern = topic_name;
    RETURN true;
END $$;

CREATE OR REPLACE FUNCTION conveyor.topic_get(topic_name text) RETURNS SETOF conveyor.topic_info
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    PERFORM conveyor._topic(topic_name);
    RETURN QUERY SELECT * FROM conveyor.topic_info WHERE name = topic_name;
END $$;

CREATE OR REPLACE FUNCTION conveyor.topic_list(prefix text DEFAULT NULL, after text DEFAULT NULL, lim integer DEFAULT NULL)
RETURNS SETOF conveyor.topic_info
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT * FROM conveyor.topic_info
     WHERE (prefix IS NULL OR starts_with(name, prefix))
       AND (after IS NULL OR name > after)
     ORDER BY name
     LIMIT lim
$$;

-- Merges attributes in (a null value removes one).
CREATE OR REPLACE FUNCTION conveyor.topic_set_attributes(topic_name text, attributes jsonb)
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

CREATE OR REPLACE FUNCTION conveyor.topic_tag(topic_name text, tags jsonb) RETURNS jsonb
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

CREATE OR REPLACE FUNCTION conveyor.topic_untag(topic_name text, keys text[]) RETURNS jsonb
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
CREATE OR REPLACE FUNCTION conveyor.topic_pattern_matches(pattern text, routing_key text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    PERFORM conveyor._routing_key_check(routing_key);
    RETURN conveyor._routing_subject(routing_key) ~ conveyor._pattern_regex(pattern);
END $$;

CREATE OR REPLACE FUNCTION conveyor.subscription_delete(ref text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    DELETE FROM conveyor.subscriptions WHERE id = conveyor._subscription_id(ref);
    RETURN FOUND;
END $$;

CREATE OR REPLACE FUNCTION conveyor.subscription_get(ref text) RETURNS SETOF conveyor.subscription_info
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    RETURN QUERY SELECT * FROM conveyor.subscription_info WHERE id = conveyor._subscription(ref);
END $$;

-- Changes a subscription: the keys present in `changes` among raw_delivery,
-- filter_policy (null removes it), filter_policy_scope, confirmed, and attributes
-- (merged; a null value removes one).
CREATE OR REPLACE FUNCTION conveyor.subscription_set_attributes(ref text, changes jsonb)
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
CREATE OR REPLACE FUNCTION conveyor.subscription_list(pattern text DEFAULT NULL, queue_name text DEFAULT NULL,
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

-- What one subscription receives of a published message: the body (raw, or the
-- envelope with this subscription's UnsubscribeURL), headers and content type for a
-- queue, and the subscription's ARN.
CREATE OR REPLACE FUNCTION conveyor._delivery(m jsonb, topic_arn text, envelope text[], s conveyor.subscriptions,
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

-- Delivered: the rows go.
CREATE OR REPLACE FUNCTION conveyor.delivery_succeeded(ids bigint[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    n integer;
BEGIN
    DELETE FROM conveyor.http_deliveries WHERE id = ANY (ids);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

CREATE OR REPLACE FUNCTION conveyor._delivery_exists(delivery_id bigint) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM conveyor.http_deliveries WHERE id = delivery_id) THEN
        PERFORM conveyor._raise('CVN03', format('delivery %s does not exist', coalesce(delivery_id::text, 'NULL')));
    END IF;
END $$;

-- An attempt failed: count it; the next one after retry_in seconds, out of attempts in all
-- (the first try included), both from the subscription's delivery policy (the server's
-- webhook worker, core/delivery_policy.py). The last attempt leaves the row exhausted, unless its
-- subscription's RedrivePolicy names a queue that exists (in default_region unless the ARN
-- says another, as the SQS layer stores names): then the body goes there, as SNS
-- dead-letters an HTTP(S) delivery whose policy is used up, and the row goes. A FIFO or
-- encrypted dead-letter queue keeps the row exhausted (no group to give it; sealing is the
-- server's).
CREATE OR REPLACE FUNCTION conveyor.delivery_failed(delivery_id bigint, error text, retry_in double precision,
                                                    attempts integer, default_region text DEFAULT NULL)
RETURNS SETOF conveyor.delivery_info
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    d conveyor.http_deliveries;
    dq conveyor.queues;
BEGIN
    IF retry_in IS NULL OR retry_in < 0 OR retry_in > 3600 OR attempts IS NULL OR attempts < 1 OR attempts > 101 THEN
        PERFORM conveyor._raise('CVV01', 'retry within 0 to 3600 seconds, out of 1 to 101 attempts');
    END IF;
    UPDATE conveyor.http_deliveries x
       SET attempt = x.attempt + 1,
           max_attempts = attempts,
           last_error = left(coalesce(error, 'failed'), 4096),
           next_attempt_at = now() + make_interval(secs => retry_in)
     WHERE x.id = delivery_id
    RETURNING x.* INTO d;
    PERFORM conveyor._delivery_exists(delivery_id);
    RETURN QUERY SELECT * FROM conveyor.delivery_info WHERE id = delivery_id;
    IF d.attempt >= d.max_attempts AND d.queue_name IS NULL THEN
        SELECT q.* INTO dq
          FROM conveyor.subscriptions s
          JOIN conveyor.queues q ON q.name = conveyor._subscription_dlq(s, default_region)
         WHERE s.id = d.subscription_id AND NOT q.fifo AND NOT conveyor._encrypted(q);
        IF FOUND THEN
            PERFORM conveyor._send(dq, jsonb_build_array(jsonb_build_object(
                'body', d.payload, 'content_type', 'text/plain')));
            PERFORM conveyor._wake(dq, 1);
            DELETE FROM conveyor.http_deliveries x WHERE x.id = delivery_id;
        END IF;
    END IF;
END $$;

-- Never to be attempted as it stands (e.g. its host is not allowed): kept with the reason.
CREATE OR REPLACE FUNCTION conveyor.delivery_hold(delivery_id bigint, reason text)
RETURNS SETOF conveyor.delivery_info
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    UPDATE conveyor.http_deliveries d SET held_reason = left(coalesce(reason, 'held'), 4096)
     WHERE d.id = delivery_id;
    PERFORM conveyor._delivery_exists(delivery_id);
    RETURN QUERY SELECT * FROM conveyor.delivery_info WHERE id = delivery_id;
END $$;

CREATE OR REPLACE FUNCTION conveyor.delivery_list(state text DEFAULT NULL, subscription text DEFAULT NULL,
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

CREATE OR REPLACE FUNCTION conveyor.deliveries_stats(
    OUT pending bigint, OUT due bigint, OUT held bigint, OUT exhausted bigint, OUT oldest_pending_age interval)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT count(*) FILTER (WHERE held_reason IS NULL AND attempt < max_attempts),
           count(*) FILTER (WHERE held_reason IS NULL AND attempt < max_attempts AND next_attempt_at <= now()),
           count(*) FILTER (WHERE held_reason IS NOT NULL),
           count(*) FILTER (WHERE held_reason IS NULL AND attempt >= max_attempts),
           now() - min(created_at) FILTER (WHERE held_reason IS NULL AND attempt < max_attempts)
      FROM conveyor.http_deliveries
$$;

CREATE OR REPLACE FUNCTION conveyor.signing_key_get(OUT private_key text, OUT certificate text)
RETURNS SETOF record
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT k.private_key, k.certificate FROM conveyor.signing_keys k WHERE k.id = 1
$$;

-- Stores a key unless one is stored already; returns the stored one either way, so
-- processes racing to create it all end with the same key.
CREATE OR REPLACE FUNCTION conveyor.signing_key_create(new_private_key text, new_certificate text,
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

CREATE OR REPLACE FUNCTION conveyor.signing_certificate() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT certificate FROM conveyor.signing_keys WHERE id = 1
$$;

-- A number as SNS compares it: rounded to five decimal places.
CREATE OR REPLACE FUNCTION conveyor._fp_number(x numeric) RETURNS numeric
LANGUAGE sql IMMUTABLE AS $$
    SELECT round(x, 5)
$$;

-- A String.Array attribute's value: its JSON array; otherwise the one JSON value it is
-- (a string, number, true, false or null), or else its text as a string.
CREATE OR REPLACE FUNCTION conveyor._fp_array_value(text_value text) RETURNS jsonb
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
CREATE OR REPLACE FUNCTION conveyor._fp_equal(c jsonb, e jsonb) RETURNS boolean
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

CREATE OR REPLACE VIEW conveyor.subscription_info AS
SELECT s.id, s.uuid, s.pattern, s.protocol, s.queue_name AS queue, s.endpoint, s.raw_delivery,
       s.filter_policy, s.filter_policy_scope, s.attributes, s.confirmed, s.created_at
  FROM conveyor.subscriptions s;

-- arn:aws:sqs:<region>:<account>:<name>, the region from the name's prefix if it has one.
CREATE OR REPLACE FUNCTION conveyor._queue_arn(queue_name text, region text, account_id text) RETURNS text
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
CREATE OR REPLACE FUNCTION conveyor.subscription_create_v2(pattern text, protocol text, queue_name text DEFAULT NULL,
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
CREATE OR REPLACE FUNCTION conveyor._deliveries_to_queue(q conveyor.queues, ids bigint[] DEFAULT NULL) RETURNS integer
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
CREATE OR REPLACE FUNCTION conveyor._queue_created() RETURNS trigger
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
CREATE OR REPLACE FUNCTION conveyor._subscription_dlq(s conveyor.subscriptions, default_region text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN split_part(t.arn, ':', 4) = default_region THEN split_part(t.arn, ':', 6)
                ELSE split_part(t.arn, ':', 4) || ':' || split_part(t.arn, ':', 6) END
      FROM (SELECT conveyor._json_or_null(s.attributes ->> 'RedrivePolicy') ->> 'deadLetterTargetArn' AS arn) t
     WHERE t.arn ~ '^arn:aws[a-z-]*:sqs:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_.-]+$'
$$;

-- Sends a message of the server's own making to an HTTP(S) subscription's endpoint
-- through the outbox (SNS's SubscriptionConfirmation): claimed and retried as every
-- delivery, whether or not the subscription is confirmed.
CREATE OR REPLACE FUNCTION conveyor.delivery_send(subscription uuid, payload text, headers jsonb, message_id uuid)
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
CREATE OR REPLACE FUNCTION conveyor._fp_elements(v jsonb) RETURNS SETOF jsonb
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
CREATE OR REPLACE FUNCTION conveyor._fp_get(doc jsonb, k text) RETURNS jsonb
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

DO $$
BEGIN
    GRANT EXECUTE ON FUNCTION conveyor.delivery_send(uuid, text, jsonb, uuid) TO conveyor_admin;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: roles missing, grants skipped (%)', SQLERRM;
END $$;

-- Claimed rows not attempted (their subscription's throttle): due again after the given
-- seconds, no attempt counted. Returns how many.
CREATE OR REPLACE FUNCTION conveyor.delivery_defer(ids bigint[], seconds double precision) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    n integer;
BEGIN
    IF seconds IS NULL OR seconds < 0 OR seconds > 3600 THEN
        PERFORM conveyor._raise('CVV01', 'defer by 0 to 3600 seconds');
    END IF;
    UPDATE conveyor.http_deliveries d SET next_attempt_at = now() + make_interval(secs => seconds)
     WHERE d.id = ANY (ids) AND d.held_reason IS NULL;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- The DeliveryPolicy texts (as stored) of the subscriptions and topics of claimed rows.
CREATE OR REPLACE FUNCTION conveyor.delivery_policies(subscription_ids bigint[], topic_names text[])
RETURNS TABLE (subscription_id bigint, topic text, subscription_policy text, topic_policy text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT s.id, x.topic, s.attributes ->> 'DeliveryPolicy', t.attributes ->> 'DeliveryPolicy'
      FROM unnest(subscription_ids, topic_names) AS x(subscription_id, topic)
      JOIN conveyor.subscriptions s ON s.id = x.subscription_id
      LEFT JOIN conveyor.topics t ON t.name = x.topic
$$;

DO $$
BEGIN
    GRANT EXECUTE ON FUNCTION conveyor.delivery_policies(bigint[], text[]),
        conveyor.delivery_failed(bigint, text, double precision, integer, text),
        conveyor.delivery_defer(bigint[], double precision) TO conveyor_writer;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: roles missing, grants skipped (%)', SQLERRM;
END $$;

REVOKE ALL ON ALL ROUTINES IN SCHEMA conveyor FROM PUBLIC;
