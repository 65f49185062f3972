-- Conveyor 0001: the queue engine.
--
-- One `messages` table keyed by (queue_id, id) holds every queue's live messages; each
-- queue has its own id sequence (named from its numeric id, never from its name), so
-- message ids are per queue and a queue's "total sent" is its sequence's last value.
-- Why one table and not one per queue: see docs/architecture.md ("Storage").
--
-- Domain errors are raised with SQLSTATEs of class CV so that clients map them without
-- parsing messages:
--   CVQ01 queue does not exist        CVQ02 queue already exists with other attributes
--   CVV01 invalid parameter value     CVM01 message too large
--   CVM02 message not in flight
-- Every function that touches data is SECURITY DEFINER with a pinned search_path, and
-- EXECUTE is granted to the roles conveyor_reader < conveyor_writer < conveyor_admin.
-- Internal helpers (named _*) are granted to no one and carry no SET clause: a SET
-- makes every call save and restore the GUC state, which costs more than the helper;
-- they run inside the definers' pinned path and qualify every name anyway.

-- Functions are callable only through the role grants at the end of this file.
ALTER DEFAULT PRIVILEGES IN SCHEMA conveyor REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;

CREATE TABLE conveyor.queues (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name                 text NOT NULL UNIQUE,
    fifo                 boolean NOT NULL,
    visibility_timeout   integer NOT NULL DEFAULT 30,
    delay_seconds        integer NOT NULL DEFAULT 0,
    retention_seconds    integer NOT NULL DEFAULT 345600,
    max_message_size     integer NOT NULL DEFAULT 1048576,
    receive_wait_seconds integer NOT NULL DEFAULT 0,
    max_receive_count    integer,
    dead_letter_queue_id bigint REFERENCES conveyor.queues (id) ON DELETE SET NULL,
    content_based_deduplication boolean NOT NULL DEFAULT false,
    -- A server with long-pollers waiting on this queue keeps this in the future; sends
    -- NOTIFY only while it is, because NOTIFY serialises commits (docs/architecture.md).
    listened_until       timestamptz NOT NULL DEFAULT '-infinity',
    -- the queue's message id sequence (conveyor.message_seq_<id>), set at creation
    seq                  regclass,
    -- attributes Conveyor keeps for a wire protocol without acting on them (e.g. an SQS
    -- Policy or KMS key id), and the queue's tags
    extra_attributes     jsonb NOT NULL DEFAULT '{}',
    tags                 jsonb NOT NULL DEFAULT '{}',
    purged_at            timestamptz,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    CHECK (visibility_timeout BETWEEN 0 AND 43200),
    CHECK (delay_seconds BETWEEN 0 AND 900),
    CHECK (retention_seconds BETWEEN 60 AND 1209600),
    CHECK (max_message_size BETWEEN 1024 AND 1048576),
    CHECK (receive_wait_seconds BETWEEN 0 AND 20),
    CHECK (max_receive_count BETWEEN 1 AND 1000),
    CHECK (dead_letter_queue_id IS NULL OR max_receive_count IS NOT NULL),
    CHECK (dead_letter_queue_id IS DISTINCT FROM id)
);

CREATE TABLE conveyor.messages (
    queue_id          bigint NOT NULL,
    id                bigint NOT NULL,
    vt                timestamptz NOT NULL,
    sent_at           timestamptz NOT NULL DEFAULT now(),
    receive_count     integer NOT NULL DEFAULT 0,
    first_received_at timestamptz,
    body              text NOT NULL,
    content_type      text,
    headers           jsonb,
    group_id          text,
    dedup_id          text,
    -- set when the message reached this queue as a dead letter: where it came from
    source_queue_id   bigint,
    -- a globally unique id that stays with the message when it is dead-lettered (SQS's
    -- MessageId), who sent it, and attributes the broker itself interprets (AWSTraceHeader)
    message_uuid      uuid NOT NULL DEFAULT gen_random_uuid(),
    sender_id         text,
    system_attributes jsonb,
    PRIMARY KEY (queue_id, id)
);
-- Standard receive: oldest visible first.
CREATE INDEX messages_visible_idx ON conveyor.messages (queue_id, vt, id);
-- FIFO receive: messages of a group in id order.
CREATE INDEX messages_group_idx ON conveyor.messages (queue_id, group_id, id)
    WHERE group_id IS NOT NULL;

-- Completed and failed messages (pgmq's archive, hq's complete/fail).
CREATE TABLE conveyor.archive (
    queue_id          bigint NOT NULL,
    id                bigint NOT NULL,
    sent_at           timestamptz NOT NULL,
    receive_count     integer NOT NULL,
    first_received_at timestamptz,
    body              text NOT NULL,
    content_type      text,
    headers           jsonb,
    group_id          text,
    dedup_id          text,
    source_queue_id   bigint,
    message_uuid      uuid NOT NULL,
    sender_id         text,
    system_attributes jsonb,
    archived_at       timestamptz NOT NULL DEFAULT now(),
    outcome           text NOT NULL CHECK (outcome IN ('completed', 'failed')),
    error             text,
    PRIMARY KEY (queue_id, id)
);
CREATE INDEX archive_archived_at_idx ON conveyor.archive (queue_id, archived_at);

-- FIFO: one row per message group, the lock that serialises receivers of a group.
CREATE TABLE conveyor.message_groups (
    queue_id bigint NOT NULL,
    group_id text NOT NULL,
    PRIMARY KEY (queue_id, group_id)
);

-- FIFO: deduplication ids seen in the last five minutes.
CREATE TABLE conveyor.dedup (
    queue_id     bigint NOT NULL,
    dedup_id     text NOT NULL,
    message_id   bigint NOT NULL,
    message_uuid uuid NOT NULL,
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (queue_id, dedup_id)
);

-- The public face of a queue: its configuration with the dead-letter queue by name.
CREATE VIEW conveyor.queue_info AS
SELECT q.name,
       q.fifo,
       q.visibility_timeout,
       q.delay_seconds,
       q.retention_seconds,
       q.max_message_size,
       q.receive_wait_seconds,
       q.max_receive_count,
       d.name AS dead_letter_queue,
       q.content_based_deduplication,
       q.created_at,
       q.updated_at,
       q.extra_attributes,
       q.tags,
       q.purged_at
  FROM conveyor.queues q
  LEFT JOIN conveyor.queues d ON d.id = q.dead_letter_queue_id;

-- What a send returns per message.
CREATE TYPE conveyor.sent AS (id bigint, message_uuid uuid);

CREATE TYPE conveyor.queue_metrics AS (
    queue_name         text,
    queue_length       bigint,
    in_flight          bigint,
    delayed            bigint,
    newest_msg_age_sec integer,
    oldest_msg_age_sec integer,
    total_messages     bigint,
    dead_letter_queue  text,
    dead_letter_length bigint,
    scrape_time        timestamptz
);

------------------------------------------------------------------------------------------
-- Internal helpers (not granted to anyone; called by the definer functions below).
------------------------------------------------------------------------------------------

CREATE FUNCTION conveyor._raise(code text, msg text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = code, MESSAGE = msg;
END $$;

-- The same, usable inside an expression (a CASE branch of a query).
CREATE FUNCTION conveyor._fail(code text, msg text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = code, MESSAGE = msg;
END $$;

-- SQS naming: 1-80 characters of [A-Za-z0-9_-]; FIFO queues end in ".fifo". A queue of
-- another region than the server's default (SQS scopes queues per region) carries the
-- region as a prefix: "eu-west-1:jobs".
CREATE FUNCTION conveyor._name_check(queue_name text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    bare text := regexp_replace(queue_name, '^[a-z0-9-]{1,32}:', '');
BEGIN
    IF queue_name IS NULL
       OR length(bare) > 80
       OR bare !~ '^[A-Za-z0-9_-]+(\.fifo)?$'
       OR bare = '.fifo' THEN
        PERFORM conveyor._raise('CVV01', format(
            'invalid queue name %s: use 1 to 80 characters of A-Z, a-z, 0-9, hyphen and underscore, with the suffix .fifo for FIFO queues (and optionally a region prefix such as eu-west-1:)',
            coalesce(quote_literal(left(queue_name, 100)), 'NULL')));
    END IF;
    RETURN queue_name LIKE '%.fifo';
END $$;

CREATE FUNCTION conveyor._queue(queue_name text) RETURNS conveyor.queues
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q conveyor.queues;
BEGIN
    SELECT * INTO q FROM conveyor.queues WHERE name = queue_name;
    IF NOT FOUND THEN
        PERFORM conveyor._raise('CVQ01', format('queue %s does not exist',
                                                coalesce(quote_literal(left(queue_name, 100)), 'NULL')));
    END IF;
    RETURN q;
END $$;

CREATE FUNCTION conveyor._int_attr(attrs jsonb, key text, lo integer, hi integer) RETURNS integer
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v jsonb := attrs -> key;
    n numeric;
BEGIN
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(v) = 'number' THEN
        n := v::numeric;
    ELSIF jsonb_typeof(v) = 'string' AND (v #>> '{}') ~ '^\s*-?\d+\s*$' THEN
        n := (v #>> '{}')::numeric;
    END IF;
    IF n IS NULL OR n <> trunc(n) OR n < lo OR n > hi THEN
        PERFORM conveyor._raise('CVV01', format('%s must be an integer from %s to %s, got %s',
                                                key, lo, hi, left(v::text, 100)));
    END IF;
    RETURN n::integer;
END $$;

CREATE FUNCTION conveyor._bool_attr(attrs jsonb, key text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v jsonb := attrs -> key;
BEGIN
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        RETURN NULL;
    ELSIF jsonb_typeof(v) = 'boolean' THEN
        RETURN v::boolean;
    ELSIF jsonb_typeof(v) = 'string' AND lower(v #>> '{}') IN ('true', 'false') THEN
        RETURN lower(v #>> '{}')::boolean;
    END IF;
    PERFORM conveyor._raise('CVV01', format('%s must be true or false, got %s', key, left(v::text, 100)));
END $$;

-- Applies an attribute object to a queue row; keys absent keep their value, a JSON null
-- resets a key to its default (or clears the redrive policy).
CREATE FUNCTION conveyor._queue_apply(q conveyor.queues, attrs jsonb) RETURNS conveyor.queues
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
                       'extra_attributes') THEN
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
            IF dlq.id = q.id THEN
                PERFORM conveyor._raise('CVV01', 'a queue cannot be its own dead-letter queue');
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
-- Queues
------------------------------------------------------------------------------------------

-- Creates a queue, or returns the existing one when every attribute given matches it
-- (SQS CreateQueue semantics). A different value raises CVQ02.
CREATE FUNCTION conveyor.queue_create(queue_name text, attributes jsonb DEFAULT '{}')
RETURNS SETOF conveyor.queue_info
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    is_fifo boolean := conveyor._name_check(queue_name);
    q conveyor.queues;
    existing conveyor.queues;
BEGIN
    -- serialise creators of the same name so that "create or match" is race-free
    PERFORM pg_advisory_xact_lock(hashtext('conveyor.queue:' || queue_name));
    SELECT * INTO existing FROM conveyor.queues WHERE name = queue_name;
    q.id := coalesce(existing.id, 0);
    q.name := queue_name;
    q.fifo := is_fifo;
    q.visibility_timeout := 30;
    q.delay_seconds := 0;
    q.retention_seconds := 345600;
    q.max_message_size := 1048576;
    q.receive_wait_seconds := 0;
    q.content_based_deduplication := false;
    q.extra_attributes := '{}';
    q := conveyor._queue_apply(q, coalesce(attributes, '{}'));
    IF existing.id IS NOT NULL THEN
        IF (SELECT bool_or(
                CASE k
                WHEN 'visibility_timeout' THEN q.visibility_timeout <> existing.visibility_timeout
                WHEN 'delay_seconds' THEN q.delay_seconds <> existing.delay_seconds
                WHEN 'retention_seconds' THEN q.retention_seconds <> existing.retention_seconds
                WHEN 'max_message_size' THEN q.max_message_size <> existing.max_message_size
                WHEN 'receive_wait_seconds' THEN q.receive_wait_seconds <> existing.receive_wait_seconds
                WHEN 'max_receive_count' THEN q.max_receive_count IS DISTINCT FROM existing.max_receive_count
                WHEN 'dead_letter_queue' THEN q.dead_letter_queue_id IS DISTINCT FROM existing.dead_letter_queue_id
                WHEN 'content_based_deduplication' THEN q.content_based_deduplication <> existing.content_based_deduplication
                WHEN 'extra_attributes' THEN NOT existing.extra_attributes @> jsonb_strip_nulls(attributes -> 'extra_attributes')
                ELSE false END)
            FROM jsonb_object_keys(coalesce(attributes, '{}')) AS k) THEN
            PERFORM conveyor._raise('CVQ02', format('queue %s already exists with different attributes', quote_literal(queue_name)));
        END IF;
        RETURN QUERY SELECT * FROM conveyor.queue_info WHERE name = queue_name;
        RETURN;
    END IF;
    INSERT INTO conveyor.queues (name, fifo, visibility_timeout, delay_seconds, retention_seconds,
                                 max_message_size, receive_wait_seconds, max_receive_count,
                                 dead_letter_queue_id, content_based_deduplication, extra_attributes)
    VALUES (q.name, q.fifo, q.visibility_timeout, q.delay_seconds, q.retention_seconds,
            q.max_message_size, q.receive_wait_seconds, q.max_receive_count,
            q.dead_letter_queue_id, q.content_based_deduplication, q.extra_attributes)
    RETURNING id INTO q.id;
    EXECUTE format('CREATE SEQUENCE conveyor.%I AS bigint', 'message_seq_' || q.id);
    UPDATE conveyor.queues SET seq = format('conveyor.%I', 'message_seq_' || q.id)::regclass WHERE id = q.id;
    RETURN QUERY SELECT * FROM conveyor.queue_info WHERE name = queue_name;
END $$;

-- Changes attributes of an existing queue (keys absent keep their value).
CREATE FUNCTION conveyor.queue_alter(queue_name text, attributes jsonb)
RETURNS SETOF conveyor.queue_info
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
BEGIN
    q := conveyor._queue_apply(q, attributes);
    UPDATE conveyor.queues
       SET visibility_timeout = q.visibility_timeout,
           delay_seconds = q.delay_seconds,
           retention_seconds = q.retention_seconds,
           max_message_size = q.max_message_size,
           receive_wait_seconds = q.receive_wait_seconds,
           max_receive_count = q.max_receive_count,
           dead_letter_queue_id = q.dead_letter_queue_id,
           content_based_deduplication = q.content_based_deduplication,
           extra_attributes = q.extra_attributes,
           updated_at = now()
     WHERE id = q.id;
    RETURN QUERY SELECT * FROM conveyor.queue_info WHERE name = queue_name;
END $$;

-- Drops a queue with its messages and archive. Returns false if it did not exist.
CREATE FUNCTION conveyor.queue_drop(queue_name text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    qid bigint;
BEGIN
    DELETE FROM conveyor.queues WHERE name = queue_name RETURNING id INTO qid;
    IF qid IS NULL THEN
        RETURN false;
    END IF;
    DELETE FROM conveyor.messages WHERE queue_id = qid;
    DELETE FROM conveyor.archive WHERE queue_id = qid;
    DELETE FROM conveyor.message_groups WHERE queue_id = qid;
    DELETE FROM conveyor.dedup WHERE queue_id = qid;
    EXECUTE format('DROP SEQUENCE IF EXISTS conveyor.%I', 'message_seq_' || qid);
    -- queues that dead-lettered into it lose their target but keep max_receive_count
    RETURN true;
END $$;

CREATE FUNCTION conveyor.queue_get(queue_name text) RETURNS SETOF conveyor.queue_info
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    PERFORM conveyor._queue(queue_name);
    RETURN QUERY SELECT * FROM conveyor.queue_info WHERE name = queue_name;
END $$;

CREATE FUNCTION conveyor.queue_list(prefix text DEFAULT NULL) RETURNS SETOF conveyor.queue_info
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT * FROM conveyor.queue_info
     WHERE prefix IS NULL OR starts_with(name, prefix)
     ORDER BY name
$$;

-- Deletes every message of the queue, in flight or not. Returns how many.
CREATE FUNCTION conveyor.queue_purge(queue_name text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
    n bigint;
BEGIN
    DELETE FROM conveyor.messages WHERE queue_id = q.id;
    GET DIAGNOSTICS n = ROW_COUNT;
    DELETE FROM conveyor.message_groups WHERE queue_id = q.id;
    UPDATE conveyor.queues SET purged_at = now() WHERE id = q.id;
    RETURN n;
END $$;

-- Adds or changes tags (a JSON object of strings; a null value removes the key).
CREATE FUNCTION conveyor.queue_tag(queue_name text, tags jsonb) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
    result jsonb;
BEGIN
    IF tags IS NULL OR jsonb_typeof(tags) <> 'object'
       OR EXISTS (SELECT 1 FROM jsonb_each(tags) t WHERE jsonb_typeof(t.value) NOT IN ('string', 'null')) THEN
        PERFORM conveyor._raise('CVV01', 'tags must be a JSON object of strings');
    END IF;
    UPDATE conveyor.queues SET tags = jsonb_strip_nulls(queues.tags || queue_tag.tags), updated_at = now()
     WHERE id = q.id RETURNING queues.tags INTO result;
    RETURN result;
END $$;

CREATE FUNCTION conveyor.queue_untag(queue_name text, keys text[]) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
    result jsonb;
BEGIN
    UPDATE conveyor.queues SET tags = queues.tags - coalesce(keys, '{}'), updated_at = now()
     WHERE id = q.id RETURNING queues.tags INTO result;
    RETURN result;
END $$;

-- Marks the queue as having long-pollers for the next `seconds`, so that sends NOTIFY.
CREATE FUNCTION conveyor.queue_listen(queue_name text, seconds integer DEFAULT 60) RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    new_until timestamptz;
BEGIN
    UPDATE conveyor.queues
       SET listened_until = greatest(listened_until, now() + make_interval(secs => least(greatest(seconds, 1), 3600)))
     WHERE name = queue_name
    RETURNING listened_until INTO new_until;
    IF new_until IS NULL THEN
        PERFORM conveyor._queue(queue_name);
    END IF;
    RETURN new_until;
END $$;

CREATE FUNCTION conveyor._metrics(q conveyor.queues) RETURNS conveyor.queue_metrics
LANGUAGE sql STABLE AS $$
    SELECT q.name,
           count(*) FILTER (WHERE m.vt <= now()),
           count(*) FILTER (WHERE m.vt > now() AND m.receive_count > 0),
           count(*) FILTER (WHERE m.vt > now() AND m.receive_count = 0),
           extract(epoch FROM now() - max(m.sent_at))::integer,
           extract(epoch FROM now() - min(m.sent_at))::integer,
           coalesce(pg_sequence_last_value(q.seq), 0),
           (SELECT d.name FROM conveyor.queues d WHERE d.id = q.dead_letter_queue_id),
           (SELECT count(*) FROM conveyor.messages dm
             WHERE q.dead_letter_queue_id IS NOT NULL AND dm.queue_id = q.dead_letter_queue_id),
           now()
      FROM conveyor.messages m
     WHERE m.queue_id = q.id
$$;

CREATE FUNCTION conveyor.queue_metrics(queue_name text) RETURNS SETOF conveyor.queue_metrics
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT (conveyor._metrics(conveyor._queue(queue_name))).*
$$;

CREATE FUNCTION conveyor.queue_metrics_all() RETURNS SETOF conveyor.queue_metrics
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT (conveyor._metrics(q)).* FROM conveyor.queues q ORDER BY q.name
$$;

------------------------------------------------------------------------------------------
-- Sending
------------------------------------------------------------------------------------------

-- The one insert path. `messages` is a JSON array of objects with the keys body
-- (required), headers, delay, content_type, group_id, dedup_id, message_uuid, sender_id
-- and system_attributes; returns (id, message_uuid) per message, in input order.
-- Standard queues insert in one statement that checks each row as it goes (a second
-- pass over the batch to check it first cost a third of the throughput); FIFO queues go
-- message by message because deduplication must see earlier messages of the same batch.
-- A FIFO duplicate within the deduplication window returns the first message's id and
-- uuid and stores nothing. Either every message is stored or none.
CREATE FUNCTION conveyor._send(q conveyor.queues, messages jsonb) RETURNS SETOF conveyor.sent
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
    m record;
    mid bigint;
    muid uuid;
    did text;
    ts timestamptz := now();
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
        SELECT q.id, nextval(q.seq), ts + make_interval(secs => coalesce(x.delay, q.delay_seconds)), ts,
               x.body, x.content_type, x.headers, x.group_id, coalesce(x.message_uuid, gen_random_uuid()),
               x.sender_id, x.system_attributes
          FROM ROWS FROM (jsonb_to_recordset(messages)
                          AS (body text, headers jsonb, delay integer, content_type text, group_id text,
                              dedup_id text, message_uuid uuid, sender_id text, system_attributes jsonb))
               WITH ORDINALITY AS x(body, headers, delay, content_type, group_id, dedup_id, message_uuid,
                                    sender_id, system_attributes, ord)
         WHERE conveyor._message_ok(q, x.body, x.headers, x.delay, x.system_attributes, x.dedup_id)
         ORDER BY x.ord
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
        mid := nextval(q.seq);
        muid := coalesce(m.message_uuid, gen_random_uuid());
        INSERT INTO conveyor.dedup AS d (queue_id, dedup_id, message_id, message_uuid, expires_at)
        VALUES (q.id, did, mid, muid, ts + interval '5 minutes')
        ON CONFLICT (queue_id, dedup_id) DO UPDATE
           SET message_id = excluded.message_id, message_uuid = excluded.message_uuid,
               expires_at = excluded.expires_at
         WHERE d.expires_at <= ts
        RETURNING d.message_id INTO mid;
        IF mid IS NULL THEN
            -- a duplicate within the window: accepted, not stored again, answered as the first
            RETURN QUERY SELECT d.message_id, d.message_uuid
                           FROM conveyor.dedup d WHERE d.queue_id = q.id AND d.dedup_id = did;
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

-- The checks every message passes; true, or an error naming what is wrong. A SQL
-- function so that the insert's WHERE clause inlines it.
CREATE FUNCTION conveyor._message_ok(q conveyor.queues, body text, headers jsonb, delay integer,
                                     system_attributes jsonb, dedup_id text) RETURNS boolean
LANGUAGE sql AS $$
    SELECT CASE
        WHEN body IS NULL OR octet_length(body) + coalesce(octet_length(headers::text), 0) > q.max_message_size
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

CREATE FUNCTION conveyor._wake(q conveyor.queues, n integer) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF q.listened_until > now() THEN
        PERFORM pg_notify('conveyor_queue', n || ' ' || q.name);
    END IF;
END $$;

-- Sends a batch given as a JSON array of message objects (see _send); the server's path.
CREATE FUNCTION conveyor.message_send_json(queue_name text, messages jsonb)
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

-- Sends a batch given as parallel arrays (handy from psql); ids in input order.
CREATE FUNCTION conveyor.message_send_batch(queue_name text, bodies text[],
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

CREATE FUNCTION conveyor.message_send(queue_name text, body text, headers jsonb DEFAULT NULL,
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

------------------------------------------------------------------------------------------
-- Receiving
------------------------------------------------------------------------------------------

-- Moves claimed messages that are past max_receive_count: to the dead-letter queue when
-- there is one, else to the archive as failed (hq's max_attempts).
CREATE FUNCTION conveyor._dead_letter(q conveyor.queues, ids bigint[], reason text) RETURNS integer
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
        INSERT INTO conveyor.messages (queue_id, id, vt, sent_at, body, content_type, headers,
                                       group_id, dedup_id, source_queue_id, message_uuid, sender_id,
                                       system_attributes)
        SELECT dlq.id, nextval(dlq.seq), now(), moved.sent_at, moved.body,
               moved.content_type, moved.headers, moved.group_id, moved.dedup_id, q.id,
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

-- Claims up to qty visible messages of a standard queue, oldest visible first.
CREATE FUNCTION conveyor._claim(q conveyor.queues, vt_seconds integer, qty integer)
RETURNS SETOF conveyor.messages
LANGUAGE plpgsql AS $$
DECLARE
    ts timestamptz := clock_timestamp();
    expired bigint[];
BEGIN
    IF q.max_receive_count IS NOT NULL THEN
        -- claim first, then split: the over-limit ones leave, the rest are delivered
        SELECT array_agg(id) FILTER (WHERE receive_count >= q.max_receive_count)
          INTO expired
          FROM (SELECT m.id, m.receive_count FROM conveyor.messages m
                 WHERE m.queue_id = q.id AND m.vt <= ts
                 ORDER BY m.vt, m.id LIMIT qty
                 FOR UPDATE SKIP LOCKED) c;
        IF expired IS NOT NULL THEN
            PERFORM conveyor._dead_letter(q, expired, format('received more than %s times', q.max_receive_count));
        END IF;
    END IF;
    RETURN QUERY
    WITH c AS (
        SELECT m.id FROM conveyor.messages m
         WHERE m.queue_id = q.id AND m.vt <= ts
         ORDER BY m.vt, m.id LIMIT qty
         FOR UPDATE SKIP LOCKED
    )
    UPDATE conveyor.messages m
       SET vt = ts + make_interval(secs => vt_seconds),
           receive_count = m.receive_count + 1,
           first_received_at = coalesce(m.first_received_at, ts)
      FROM c
     WHERE m.queue_id = q.id AND m.id = c.id
    RETURNING m.*;
END $$;

-- Claims up to qty messages of a FIFO queue: only from groups with nothing in flight,
-- in id order within each group. Two statements on purpose: the first locks the group
-- rows (so concurrent receivers skip them), the second sees, with a snapshot taken
-- after the locks were granted, whether a just-committed receiver left messages of the
-- group in flight.
CREATE FUNCTION conveyor._claim_fifo(q conveyor.queues, vt_seconds integer, qty integer)
RETURNS SETOF conveyor.messages
LANGUAGE plpgsql AS $$
DECLARE
    ts timestamptz := clock_timestamp();
    groups text[];
    expired bigint[];
BEGIN
    SELECT array_agg(g.group_id) INTO groups FROM (
        SELECT g.group_id FROM conveyor.message_groups g
         WHERE g.queue_id = q.id
           AND EXISTS (SELECT 1 FROM conveyor.messages m
                        WHERE m.queue_id = q.id AND m.group_id = g.group_id AND m.vt <= ts)
           AND NOT EXISTS (SELECT 1 FROM conveyor.messages m
                            WHERE m.queue_id = q.id AND m.group_id = g.group_id
                              AND m.vt > ts AND m.receive_count > 0)
         ORDER BY (SELECT min(m.id) FROM conveyor.messages m
                    WHERE m.queue_id = q.id AND m.group_id = g.group_id)
         LIMIT qty
         FOR UPDATE SKIP LOCKED) g;
    IF groups IS NULL THEN
        RETURN;
    END IF;
    ts := clock_timestamp();
    SELECT array_agg(g) INTO groups FROM unnest(groups) g
     WHERE NOT EXISTS (SELECT 1 FROM conveyor.messages m
                        WHERE m.queue_id = q.id AND m.group_id = g
                          AND m.vt > ts AND m.receive_count > 0);
    IF groups IS NULL THEN
        RETURN;
    END IF;
    IF q.max_receive_count IS NOT NULL THEN
        SELECT array_agg(m.id) INTO expired FROM conveyor.messages m
         WHERE m.queue_id = q.id AND m.group_id = ANY (groups) AND m.vt <= ts
           AND m.receive_count >= q.max_receive_count;
        IF expired IS NOT NULL THEN
            PERFORM conveyor._dead_letter(q, expired, format('received more than %s times', q.max_receive_count));
        END IF;
    END IF;
    RETURN QUERY
    WITH c AS (
        SELECT m.id FROM conveyor.messages m
         WHERE m.queue_id = q.id AND m.group_id = ANY (groups) AND m.vt <= ts
         ORDER BY m.id LIMIT qty
         FOR UPDATE SKIP LOCKED
    )
    UPDATE conveyor.messages m
       SET vt = ts + make_interval(secs => vt_seconds),
           receive_count = m.receive_count + 1,
           first_received_at = coalesce(m.first_received_at, ts)
      FROM c
     WHERE m.queue_id = q.id AND m.id = c.id
    RETURNING m.*;
END $$;

-- Receives up to qty messages and hides them for vt seconds (the queue's visibility
-- timeout when NULL). With wait_seconds > 0, polls inside this call until a message
-- arrives or the time is up (for SQL users; the server long-polls without holding a
-- connection, see docs/architecture.md).
CREATE FUNCTION conveyor.message_receive(queue_name text, vt integer DEFAULT NULL, qty integer DEFAULT 1,
                                         wait_seconds integer DEFAULT 0, poll_interval_ms integer DEFAULT 100)
RETURNS SETOF conveyor.messages
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
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
            RETURN QUERY SELECT * FROM conveyor._claim(q, vt_seconds, qty);
        END IF;
        IF FOUND OR clock_timestamp() >= deadline THEN
            RETURN;
        END IF;
        PERFORM pg_sleep(least(greatest(poll_interval_ms, 10), 10000) / 1000.0);
    END LOOP;
END $$;

-- Reads and deletes in one step (at-most-once delivery).
CREATE FUNCTION conveyor.message_pop(queue_name text, qty integer DEFAULT 1)
RETURNS SETOF conveyor.messages
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
    claimed bigint[];
BEGIN
    IF qty IS NULL OR qty < 1 OR qty > 1000 THEN
        PERFORM conveyor._raise('CVV01', format('qty must be from 1 to 1000, got %s', qty));
    END IF;
    IF q.fifo THEN
        SELECT array_agg(c.id) INTO claimed FROM conveyor._claim_fifo(q, 0, qty) c;
    ELSE
        SELECT array_agg(c.id) INTO claimed FROM conveyor._claim(q, 0, qty) c;
    END IF;
    RETURN QUERY
    DELETE FROM conveyor.messages m WHERE m.queue_id = q.id AND m.id = ANY (claimed) RETURNING m.*;
END $$;

-- Looks at messages without claiming them, in id order, whatever their visibility.
CREATE FUNCTION conveyor.message_peek(queue_name text, qty integer DEFAULT 10, after_id bigint DEFAULT 0)
RETURNS SETOF conveyor.messages
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
BEGIN
    RETURN QUERY SELECT * FROM conveyor.messages m
                  WHERE m.queue_id = q.id AND m.id > coalesce(after_id, 0)
                  ORDER BY m.id LIMIT least(greatest(qty, 1), 10000);
END $$;

------------------------------------------------------------------------------------------
-- Acknowledging
------------------------------------------------------------------------------------------

-- Deletes messages; returns the ids that existed.
CREATE FUNCTION conveyor.message_delete(queue_name text, ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
BEGIN
    RETURN QUERY DELETE FROM conveyor.messages m WHERE m.queue_id = q.id AND m.id = ANY (ids) RETURNING m.id;
END $$;

CREATE FUNCTION conveyor.message_delete(queue_name text, id bigint) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT EXISTS (SELECT 1 FROM conveyor.message_delete(queue_name, ARRAY[id]))
$$;

-- Moves messages to the archive as completed; returns the ids that existed.
CREATE FUNCTION conveyor.message_archive(queue_name text, ids bigint[]) RETURNS SETOF bigint
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

CREATE FUNCTION conveyor.message_archive(queue_name text, id bigint) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT EXISTS (SELECT 1 FROM conveyor.message_archive(queue_name, ARRAY[id]))
$$;

-- Fails a message on purpose (hq): to the dead-letter queue if the queue has one, else
-- to the archive as failed with the reason. Returns false if the message did not exist.
CREATE FUNCTION conveyor.message_fail(queue_name text, id bigint, reason text DEFAULT NULL) RETURNS boolean
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

-- Changes the visibility timeout of messages to now + vt seconds (pgmq's set_vt).
-- With in_flight_only, only messages currently received and invisible change (SQS's
-- ChangeMessageVisibility); others are left alone and not returned.
CREATE FUNCTION conveyor.message_set_vt(queue_name text, ids bigint[], vt integer, in_flight_only boolean DEFAULT false)
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

CREATE FUNCTION conveyor.message_set_vt(queue_name text, id bigint, vt integer, in_flight_only boolean DEFAULT false)
RETURNS SETOF conveyor.messages
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT * FROM conveyor.message_set_vt(queue_name, ARRAY[id], vt, in_flight_only)
$$;

------------------------------------------------------------------------------------------
-- Maintenance
------------------------------------------------------------------------------------------

-- Retention clean-up: messages and archive rows older than their queue's retention
-- period, expired deduplication ids, FIFO groups with no messages left. Bounded work per
-- call (`max_rows` per task) so it never holds long locks; call it until it returns 0s.
CREATE FUNCTION conveyor.maintenance(max_rows integer DEFAULT 10000)
RETURNS TABLE (task text, removed bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    n bigint;
BEGIN
    DELETE FROM conveyor.messages m
     USING (SELECT x.queue_id, x.id FROM conveyor.messages x
              JOIN conveyor.queues q ON q.id = x.queue_id
             WHERE x.sent_at < now() - make_interval(secs => q.retention_seconds)
             LIMIT max_rows FOR UPDATE OF x SKIP LOCKED) old
     WHERE m.queue_id = old.queue_id AND m.id = old.id;
    GET DIAGNOSTICS n = ROW_COUNT;
    task := 'expired_messages'; removed := n; RETURN NEXT;

    DELETE FROM conveyor.archive a
     USING (SELECT x.queue_id, x.id FROM conveyor.archive x
              JOIN conveyor.queues q ON q.id = x.queue_id
             WHERE x.archived_at < now() - make_interval(secs => q.retention_seconds)
             LIMIT max_rows) old
     WHERE a.queue_id = old.queue_id AND a.id = old.id;
    GET DIAGNOSTICS n = ROW_COUNT;
    task := 'expired_archive'; removed := n; RETURN NEXT;

    DELETE FROM conveyor.dedup d
     USING (SELECT x.queue_id, x.dedup_id FROM conveyor.dedup x WHERE x.expires_at <= now() LIMIT max_rows) old
     WHERE d.queue_id = old.queue_id AND d.dedup_id = old.dedup_id;
    GET DIAGNOSTICS n = ROW_COUNT;
    task := 'expired_dedup_ids'; removed := n; RETURN NEXT;

    DELETE FROM conveyor.message_groups g
     USING (SELECT x.queue_id, x.group_id FROM conveyor.message_groups x
             WHERE NOT EXISTS (SELECT 1 FROM conveyor.messages m
                                WHERE m.queue_id = x.queue_id AND m.group_id = x.group_id)
             LIMIT max_rows FOR UPDATE SKIP LOCKED) old
     WHERE g.queue_id = old.queue_id AND g.group_id = old.group_id;
    GET DIAGNOSTICS n = ROW_COUNT;
    task := 'empty_groups'; removed := n; RETURN NEXT;
END $$;

------------------------------------------------------------------------------------------
-- Roles: reader (look) < writer (send, receive, acknowledge) < admin (create, drop, purge)
------------------------------------------------------------------------------------------

DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['conveyor_reader', 'conveyor_writer', 'conveyor_admin'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) THEN
            EXECUTE format('CREATE ROLE %I NOLOGIN', r);
        END IF;
    END LOOP;
    GRANT conveyor_reader TO conveyor_writer;
    GRANT conveyor_writer TO conveyor_admin;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE WARNING 'conveyor: cannot create roles (%); create conveyor_reader, conveyor_writer and conveyor_admin as a superuser and re-run the grants', SQLERRM;
END $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA conveyor FROM PUBLIC;

DO $$
BEGIN
    GRANT USAGE ON SCHEMA conveyor TO conveyor_reader;
    GRANT SELECT ON ALL TABLES IN SCHEMA conveyor TO conveyor_reader;
    GRANT EXECUTE ON FUNCTION
        conveyor.queue_get(text), conveyor.queue_list(text),
        conveyor.queue_metrics(text), conveyor.queue_metrics_all(),
        conveyor.message_peek(text, integer, bigint)
        TO conveyor_reader;
    GRANT EXECUTE ON FUNCTION
        conveyor.message_send(text, text, jsonb, integer, text, text, text),
        conveyor.message_send_json(text, jsonb),
        conveyor.message_send_batch(text, text[], jsonb[], integer[], text[], text[], text[]),
        conveyor.message_receive(text, integer, integer, integer, integer),
        conveyor.message_pop(text, integer),
        conveyor.message_delete(text, bigint[]), conveyor.message_delete(text, bigint),
        conveyor.message_archive(text, bigint[]), conveyor.message_archive(text, bigint),
        conveyor.message_fail(text, bigint, text),
        conveyor.message_set_vt(text, bigint[], integer, boolean),
        conveyor.message_set_vt(text, bigint, integer, boolean),
        conveyor.queue_listen(text, integer)
        TO conveyor_writer;
    GRANT EXECUTE ON FUNCTION
        conveyor.queue_create(text, jsonb), conveyor.queue_alter(text, jsonb),
        conveyor.queue_drop(text), conveyor.queue_purge(text),
        conveyor.queue_tag(text, jsonb), conveyor.queue_untag(text, text[]),
        conveyor.maintenance(integer)
        TO conveyor_admin;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: roles missing, grants skipped (%)', SQLERRM;
END $$;
