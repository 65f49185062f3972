-- Queues (core/queues.py): create, alter, drop, tags, metrics, and each queue's storage.
--
-- Current definitions, re-applied whenever a file of this folder changes (docs/architecture.md,
-- "Where each SQL function's current definition lives"). Edit a function here; tables, types,
-- indexes, data and DROPs go in a new numbered migration.

CREATE OR REPLACE FUNCTION conveyor._queue(queue_name text) RETURNS conveyor.queues
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

CREATE OR REPLACE FUNCTION conveyor.queue_get(queue_name text) RETURNS SETOF conveyor.queue_info
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    PERFORM conveyor._queue(queue_name);
    RETURN QUERY SELECT * FROM conveyor.queue_info WHERE name = queue_name;
END $$;

CREATE OR REPLACE FUNCTION conveyor.queue_list(prefix text DEFAULT NULL) RETURNS SETOF conveyor.queue_info
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT * FROM conveyor.queue_info
     WHERE prefix IS NULL OR starts_with(name, prefix)
     ORDER BY name
$$;

-- Deletes every message of the queue, in flight or not, and its deduplication window (a
-- resend after a purge is a new message, as on SQS). Returns how many messages.
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

-- Adds or changes tags (a JSON object of strings; a null value removes the key).
CREATE OR REPLACE FUNCTION conveyor.queue_tag(queue_name text, tags jsonb) RETURNS jsonb
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

CREATE OR REPLACE FUNCTION conveyor.queue_untag(queue_name text, keys text[]) RETURNS jsonb
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
CREATE OR REPLACE FUNCTION conveyor.queue_listen(queue_name text, seconds integer DEFAULT 60) RETURNS timestamptz
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

CREATE OR REPLACE FUNCTION conveyor._metrics(q conveyor.queues) RETURNS conveyor.queue_metrics
LANGUAGE sql STABLE AS $$
    SELECT q.name,
           count(*) FILTER (WHERE m.vt <= now()),
           count(*) FILTER (WHERE m.vt > now() AND m.receive_count > 0),
           count(*) FILTER (WHERE m.vt > now() AND m.receive_count = 0),
           extract(epoch FROM now() - max(m.sent_at))::integer,
           extract(epoch FROM now() - min(m.sent_at))::integer,
           -- a queue dropped since this statement's snapshot was taken has no sequence left
           -- (to_regclass looks in the catalog as it is now, not as the snapshot saw it)
           coalesce(CASE WHEN to_regclass(q.seq::text) IS NOT NULL THEN pg_sequence_last_value(q.seq) END, 0),
           (SELECT d.name FROM conveyor.queues d WHERE d.id = q.dead_letter_queue_id),
           (SELECT count(*) FROM conveyor.messages dm
             WHERE q.dead_letter_queue_id IS NOT NULL AND dm.queue_id = q.dead_letter_queue_id),
           now()
      FROM conveyor.messages m
     WHERE m.queue_id = q.id
$$;

CREATE OR REPLACE FUNCTION conveyor.queue_metrics(queue_name text) RETURNS SETOF conveyor.queue_metrics
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    -- the function in FROM: (conveyor._metrics(...)).* would call it once per column of
    -- its result, ten scans of the queue where one is needed
    SELECT m.* FROM conveyor._metrics(conveyor._queue(queue_name)) m
$$;

CREATE OR REPLACE FUNCTION conveyor.queue_metrics_all() RETURNS SETOF conveyor.queue_metrics
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT m.* FROM conveyor.queues q CROSS JOIN LATERAL conveyor._metrics(q) m ORDER BY q.name
$$;

CREATE OR REPLACE VIEW conveyor.queue_info AS
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
       q.purged_at,
       q.storage,
       q.partitioning
  FROM conveyor.queues q
  LEFT JOIN conveyor.queues d ON d.id = q.dead_letter_queue_id;

-- A partition interval or retention as text: a whole number is ids, anything else must
-- be a PostgreSQL interval. NULL for JSON null.
CREATE OR REPLACE FUNCTION conveyor._storage_text(attrs jsonb, key text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v jsonb := attrs -> key;
BEGIN
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        RETURN NULL;
    ELSIF jsonb_typeof(v) IN ('number', 'string') THEN
        RETURN btrim(v #>> '{}');
    END IF;
    PERFORM conveyor._raise('CVV01', format('%s must be a number of ids or an interval such as ''1 day'', got %s',
                                            key, left(v::text, 100)));
END $$;

CREATE OR REPLACE FUNCTION conveyor._storage_interval(value text, key text) RETURNS interval
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN value::interval;
EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow
          OR invalid_parameter_value OR numeric_value_out_of_range THEN
    PERFORM conveyor._raise('CVV01', format('%s must be a number of ids or an interval such as ''1 day'', got %s',
                                            key, quote_literal(left(value, 100))));
    RETURN NULL;
END $$;

-- The storage attributes of queue_create: storage, and for partitioned queues
-- partition_interval (default 10000 ids), partition_retention (default none: partitions
-- are kept, rows still expire after retention_seconds) and partition_premake (default 4).
CREATE OR REPLACE FUNCTION conveyor._storage_apply(q conveyor.queues, attrs jsonb) RETURNS conveyor.queues
LANGUAGE plpgsql AS $$
DECLARE
    kind text := coalesce(attrs ->> 'storage', 'logged');
    every text := coalesce(conveyor._storage_text(attrs, 'partition_interval'), '10000');
    keep text := conveyor._storage_text(attrs, 'partition_retention');
    premake integer := coalesce(conveyor._int_attr(attrs, 'partition_premake', 1, 100), 4);
    step interval;
BEGIN
    IF attrs ? 'storage' AND jsonb_typeof(attrs -> 'storage') NOT IN ('string', 'null')
       OR kind NOT IN ('logged', 'unlogged', 'partitioned') THEN
        PERFORM conveyor._raise('CVV01', format('storage must be logged, unlogged or partitioned, got %s',
                                                left((attrs -> 'storage')::text, 100)));
    END IF;
    q.storage := kind;
    q.partitioning := NULL;
    IF kind <> 'partitioned' THEN
        IF attrs ?| ARRAY['partition_interval', 'partition_retention', 'partition_premake'] THEN
            PERFORM conveyor._raise('CVV01', 'partition_interval, partition_retention and partition_premake apply to partitioned queues only (storage: partitioned)');
        END IF;
        RETURN q;
    END IF;
    IF every ~ '^\d+$' THEN
        IF every::numeric < 1 OR every::numeric > 1000000000000
           OR keep IS NOT NULL AND (keep !~ '^\d+$' OR keep::numeric > 1000000000000000000) THEN
            PERFORM conveyor._raise('CVV01', 'a partition_interval in ids is a whole number from 1 to 10^12, and its partition_retention a whole number of ids (up to 10^18)');
        END IF;
        q.partitioning := jsonb_build_object('by', 'id', 'interval', every::bigint,
                                             'retention', keep::numeric::bigint, 'premake', premake);
        RETURN q;
    END IF;
    step := conveyor._storage_interval(every, 'partition_interval');
    IF step < interval '1 minute' OR step > interval '100 years'
       OR (extract(month FROM step) <> 0 OR extract(year FROM step) <> 0)
          AND step <> justify_interval(date_trunc('month', step)) THEN
        PERFORM conveyor._raise('CVV01', format('a partition_interval in time is from 1 minute to 100 years, and in whole months when it has months, got %s',
                                                quote_literal(every)));
    END IF;
    -- a retention given as a plain number is seconds, as pg_partman reads pgmq's default '100000'
    IF keep IS NOT NULL AND (conveyor._storage_interval(keep, 'partition_retention') <= interval '0'
                             OR conveyor._storage_interval(keep, 'partition_retention') > interval '1000 years') THEN
        PERFORM conveyor._raise('CVV01', 'partition_retention must be positive (and at most 1000 years)');
    END IF;
    q.partitioning := jsonb_build_object('by', 'time', 'interval', step::text,
                                         'retention', conveyor._storage_interval(keep, 'partition_retention')::text,
                                         'premake', premake);
    RETURN q;
END $$;

-- The column a partitioned queue's table is partitioned by.
CREATE OR REPLACE FUNCTION conveyor._storage_column(q conveyor.queues, rel text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN q.partitioning ->> 'by' = 'id' THEN 'id'
                WHEN rel = 'archive' THEN 'archived_at' ELSE 'sent_at' END
$$;

CREATE OR REPLACE FUNCTION conveyor._storage_grant(name text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT SELECT ON conveyor.%I TO conveyor_reader', name);
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: role conveyor_reader missing, % not granted (%)', name, SQLERRM;
END $$;

-- A new, empty table shaped like `rel` (messages or archive): unlogged, or partitioned
-- by `by` with its DEFAULT partition; with its key, (queue_id, id), unique unless the
-- table is partitioned by time (a unique index must hold the partition column; ids are
-- unique by their sequence anyway).
CREATE OR REPLACE FUNCTION conveyor._storage_table(rel text, name text, unlogged boolean, by text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('CREATE %s TABLE conveyor.%I (LIKE conveyor.%I INCLUDING DEFAULTS INCLUDING STORAGE INCLUDING COMPRESSION)%s',
                   CASE WHEN unlogged THEN 'UNLOGGED' ELSE '' END, name, rel,
                   CASE WHEN by IS NOT NULL THEN format(' PARTITION BY RANGE (%I)', by) ELSE '' END);
    IF by IS NULL OR by = 'id' THEN
        EXECUTE format('ALTER TABLE conveyor.%I ADD PRIMARY KEY (queue_id, id)', name);
    ELSE
        EXECUTE format('CREATE INDEX ON conveyor.%I (queue_id, id)', name);
    END IF;
    PERFORM conveyor._storage_grant(name);
    IF by IS NOT NULL THEN
        EXECUTE format('CREATE TABLE conveyor.%I PARTITION OF conveyor.%I DEFAULT', name || '_default', name);
        PERFORM conveyor._storage_grant(name || '_default');
    END IF;
END $$;

-- The partitions a partitioned queue's table (messages or archive) should have now: the
-- one holding the newest message id (or now) and `premake` after it, and those between
-- its newest partition and that one if maintenance fell behind (at most 100); aligned on
-- the interval (ids from 0; time from 2000-01-01 UTC, whole months from January 2000).
CREATE OR REPLACE FUNCTION conveyor._storage_ranges(q conveyor.queues, rel text)
RETURNS TABLE (lo text, hi text, suffix text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    p jsonb := q.partitioning;
    own regclass := to_regclass(format('conveyor.%I', rel || '_q' || q.id));
    first integer := 0;
    n bigint;
    base bigint;
    top bigint;
    step interval;
    months integer;
    at timestamptz;
    last timestamptz;
BEGIN
    IF p ->> 'by' = 'id' THEN
        n := (p ->> 'interval')::bigint;
        base := coalesce(CASE WHEN q.seq IS NOT NULL THEN pg_sequence_last_value(q.seq) END, 0) / n * n;
        SELECT max(s.hi::bigint) INTO top FROM conveyor._storage_children(own) s WHERE NOT s.is_default;
        WHILE first > -100 AND base + (first - 1) * n >= coalesce(top, base) LOOP
            first := first - 1;
        END LOOP;
        RETURN QUERY SELECT (base + k * n)::text, (base + (k + 1) * n)::text, '_p' || (base + k * n)
                       FROM generate_series(first, (p ->> 'premake')::integer) k;
        RETURN;
    END IF;
    step := (p ->> 'interval')::interval;
    months := extract(year FROM step)::integer * 12 + extract(month FROM step)::integer;
    IF months > 0 THEN
        at := make_timestamptz(2000, 1, 1, 0, 0, 0, 'UTC') + make_interval(months =>
                  ((extract(year FROM now() AT TIME ZONE 'UTC')::integer - 2000) * 12
                   + extract(month FROM now() AT TIME ZONE 'UTC')::integer - 1) / months * months);
    ELSE
        at := date_bin(step, now(), make_timestamptz(2000, 1, 1, 0, 0, 0, 'UTC'));
    END IF;
    SELECT max(s.hi::timestamptz) INTO last FROM conveyor._storage_children(own) s WHERE NOT s.is_default;
    WHILE first > -100 AND at + (first - 1) * step >= coalesce(last, at) LOOP
        first := first - 1;
    END LOOP;
    RETURN QUERY SELECT to_char((at + k * step) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS+00'),
                        to_char((at + (k + 1) * step) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS+00'),
                        '_p' || to_char((at + k * step) AT TIME ZONE 'UTC', 'YYYYMMDD_HH24MISS')
                   FROM generate_series(first, (p ->> 'premake')::integer) k;
END $$;

-- Whether a partition ending at `hi` is past a partitioned queue's partition_retention:
-- ids below the newest id minus the retention, or time before now minus the retention.
CREATE OR REPLACE FUNCTION conveyor._storage_expired(q conveyor.queues, hi text, newest bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN jsonb_typeof(q.partitioning -> 'retention') IS DISTINCT FROM 'null'
                     AND q.partitioning ? 'retention' THEN
               CASE WHEN q.partitioning ->> 'by' = 'id'
                    THEN hi::bigint <= newest - (q.partitioning ->> 'retention')::bigint
                    ELSE hi::timestamptz <= now() - (q.partitioning ->> 'retention')::interval END
           ELSE false END
$$;

-- Adds the partition [lo, hi) to a partitioned queue's table if it is missing; rows that
-- went to the DEFAULT partition meanwhile (maintenance was late) move into it. Returns
-- whether it was created.
CREATE OR REPLACE FUNCTION conveyor._storage_partition(q conveyor.queues, rel text, lo text, hi text, suffix text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    parent text := rel || '_q' || q.id;
    name text := parent || suffix;
    col text := conveyor._storage_column(q, rel);
BEGIN
    IF to_regclass(format('conveyor.%I', name)) IS NOT NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE conveyor.%I (LIKE conveyor.%I INCLUDING DEFAULTS INCLUDING STORAGE INCLUDING COMPRESSION)',
                   name, parent);
    EXECUTE format('WITH moved AS (DELETE FROM conveyor.%I WHERE %I >= %L AND %I < %L RETURNING *) '
                   'INSERT INTO conveyor.%I SELECT * FROM moved', parent || '_default', col, lo, col, hi, name);
    EXECUTE format('ALTER TABLE conveyor.%I ATTACH PARTITION conveyor.%I FOR VALUES FROM (%L) TO (%L)',
                   parent, name, lo, hi);
    PERFORM conveyor._storage_grant(name);
    RETURN true;
END $$;

-- Creates a queue's storage of its own (storage unlogged or partitioned) and attaches it.
CREATE OR REPLACE FUNCTION conveyor._storage_create(q conveyor.queues) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    rel text;
    r record;
BEGIN
    FOREACH rel IN ARRAY ARRAY['messages', 'archive'] LOOP
        IF q.storage = 'unlogged' THEN
            -- the archive stays logged, as pgmq's a_ table of an unlogged queue does
            PERFORM conveyor._storage_table(rel, rel || '_q' || q.id, rel = 'messages', NULL);
        ELSE
            PERFORM conveyor._storage_table(rel, rel || '_q' || q.id, false, conveyor._storage_column(q, rel));
            FOR r IN SELECT * FROM conveyor._storage_ranges(q, rel) LOOP
                PERFORM conveyor._storage_partition(q, rel, r.lo, r.hi, r.suffix);
            END LOOP;
        END IF;
        EXECUTE format('ALTER TABLE conveyor.%I ATTACH PARTITION conveyor.%I FOR VALUES FROM (%s) TO (%s)',
                       rel, rel || '_q' || q.id, q.id, q.id + 1);
    END LOOP;
    PERFORM conveyor._message_plans();
END $$;

-- The partitions of a table: name, bounds as text (NULL for DEFAULT), estimated rows.
CREATE OR REPLACE FUNCTION conveyor._storage_children(parent regclass)
RETURNS TABLE (child regclass, lo text, hi text, is_default boolean, est_rows bigint, unlogged boolean)
LANGUAGE sql STABLE AS $$
    SELECT c.oid::regclass,
           btrim(b[1], ''''), btrim(b[2], ''''),
           pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT',
           greatest(c.reltuples, 0)::bigint,
           c.relpersistence = 'u'
      FROM pg_catalog.pg_inherits h
      JOIN pg_catalog.pg_class c ON c.oid = h.inhrelid
      LEFT JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid),
                                     '^FOR VALUES FROM \((.*)\) TO \((.*)\)$') b ON true
     WHERE h.inhparent = parent
$$;

-- As in 0001, and: the storage attributes (see _storage_apply), compared like the others
-- when the queue exists; a queue with storage of its own takes its id from
-- queue_storage_ids and gets its tables before its sequence is set (the queue_created
-- trigger may deliver held messages into it at that moment).
CREATE OR REPLACE FUNCTION conveyor.queue_create(queue_name text, attributes jsonb DEFAULT '{}')
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
    q := conveyor._storage_apply(q, coalesce(attributes, '{}'));
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
                WHEN 'storage' THEN q.storage <> existing.storage
                WHEN 'partition_interval' THEN q.partitioning -> 'interval' IS DISTINCT FROM existing.partitioning -> 'interval'
                WHEN 'partition_retention' THEN q.partitioning -> 'retention' IS DISTINCT FROM existing.partitioning -> 'retention'
                WHEN 'partition_premake' THEN q.partitioning -> 'premake' IS DISTINCT FROM existing.partitioning -> 'premake'
                ELSE false END)
            FROM jsonb_object_keys(coalesce(attributes, '{}')) AS k) THEN
            PERFORM conveyor._raise('CVQ02', format('queue %s already exists with different attributes', quote_literal(queue_name)));
        END IF;
        RETURN QUERY SELECT * FROM conveyor.queue_info WHERE name = queue_name;
        RETURN;
    END IF;
    q.id := CASE WHEN q.storage = 'logged' THEN nextval(pg_get_serial_sequence('conveyor.queues', 'id'))
                 ELSE nextval('conveyor.queue_storage_ids') END;
    INSERT INTO conveyor.queues (id, name, fifo, visibility_timeout, delay_seconds, retention_seconds,
                                 max_message_size, receive_wait_seconds, max_receive_count,
                                 dead_letter_queue_id, content_based_deduplication, extra_attributes,
                                 storage, partitioning)
    OVERRIDING SYSTEM VALUE
    VALUES (q.id, q.name, q.fifo, q.visibility_timeout, q.delay_seconds, q.retention_seconds,
            q.max_message_size, q.receive_wait_seconds, q.max_receive_count,
            q.dead_letter_queue_id, q.content_based_deduplication, q.extra_attributes,
            q.storage, q.partitioning);
    IF q.storage <> 'logged' THEN
        PERFORM conveyor._storage_create(q);
    END IF;
    EXECUTE format('CREATE SEQUENCE conveyor.%I AS bigint', 'message_seq_' || q.id);
    UPDATE conveyor.queues SET seq = format('conveyor.%I', 'message_seq_' || q.id)::regclass WHERE id = q.id;
    RETURN QUERY SELECT * FROM conveyor.queue_info WHERE name = queue_name;
END $$;

-- As in 0001, and: a queue's storage is chosen once, when it is created.
CREATE OR REPLACE FUNCTION conveyor.queue_alter(queue_name text, attributes jsonb)
RETURNS SETOF conveyor.queue_info
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
BEGIN
    IF jsonb_typeof(attributes) = 'object'
       AND attributes ?| ARRAY['storage', 'partition_interval', 'partition_retention', 'partition_premake'] THEN
        PERFORM conveyor._raise('CVV01', 'a queue''s storage (storage, partition_*) is chosen when it is created and cannot be changed');
    END IF;
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

-- As in 0001, and: the rows a queue keeps in tables of its own are not deleted one by one;
-- those tables are dropped by the next conveyor.maintenance (dropping a partition locks
-- conveyor.messages ACCESS EXCLUSIVE, which maintenance does under a short lock_timeout).
CREATE OR REPLACE FUNCTION conveyor.queue_drop(queue_name text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    dropped conveyor.queues;
BEGIN
    DELETE FROM conveyor.queues WHERE name = queue_name RETURNING * INTO dropped;
    IF dropped.id IS NULL THEN
        RETURN false;
    END IF;
    IF dropped.storage = 'logged' THEN
        DELETE FROM conveyor.messages WHERE queue_id = dropped.id;
        DELETE FROM conveyor.archive WHERE queue_id = dropped.id;
    END IF;
    DELETE FROM conveyor.message_groups WHERE queue_id = dropped.id;
    DELETE FROM conveyor.dedup WHERE queue_id = dropped.id;
    EXECUTE format('DROP SEQUENCE IF EXISTS conveyor.%I', 'message_seq_' || dropped.id);
    -- queues that dead-lettered into it lose their target but keep max_receive_count
    RETURN true;
END $$;

-- Where a queue's messages and archive are: one row per table (the shared tables for a
-- logged queue, tables of its own for the others), with its partition bounds (text; NULL for a DEFAULT partition) and the
-- planner's estimate of its rows.
CREATE OR REPLACE FUNCTION conveyor.queue_storage(queue_name text)
RETURNS TABLE (table_name text, holds text, unlogged boolean, range_from text, range_to text,
               is_default boolean, est_rows bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
    rel text;
    own regclass;
BEGIN
    FOREACH rel IN ARRAY ARRAY['messages', 'archive'] LOOP
        own := to_regclass(format('conveyor.%I', rel || '_q' || q.id));
        IF own IS NULL THEN
            RETURN QUERY SELECT rel || '_shared', rel, false, NULL::text, NULL::text, false,
                                greatest((SELECT c.reltuples FROM pg_catalog.pg_class c
                                           WHERE c.oid = format('conveyor.%I', rel || '_shared')::regclass), 0)::bigint;
        ELSIF (SELECT c.relkind FROM pg_catalog.pg_class c WHERE c.oid = own) <> 'p' THEN
            RETURN QUERY SELECT own::text, rel, c.relpersistence = 'u', NULL::text, NULL::text, false,
                                greatest(c.reltuples, 0)::bigint
                           FROM pg_catalog.pg_class c WHERE c.oid = own;
        ELSE
            RETURN QUERY SELECT s.child::text, rel, s.unlogged, s.lo, s.hi, s.is_default, s.est_rows
                           FROM conveyor._storage_children(own) s
                          ORDER BY s.is_default, s.child::text;
        END IF;
    END LOOP;
END $$;

-- Partition upkeep, one process at a time (the others skip it): partitions ahead of
-- every partitioned queue, expired partitions dropped whole (their messages, in flight or
-- not, are gone, as in pgmq), and the tables of dropped queues. Each change waits at most
-- `lock_timeout` for its locks and is otherwise left for the next run: adding a partition
-- locks the queue's DEFAULT partition, dropping one its queue's table, dropping a queue's
-- table conveyor.messages itself, each ACCESS EXCLUSIVE until the caller commits.
CREATE OR REPLACE FUNCTION conveyor._storage_maintain(lock_timeout text DEFAULT '200ms')
RETURNS TABLE (task text, removed bigint)
LANGUAGE plpgsql AS $$
DECLARE
    old_timeout text := current_setting('lock_timeout');
    q conveyor.queues;
    rel text;
    r record;
    created bigint := 0;
    expired bigint := 0;
    orphaned bigint := 0;
    newest bigint;
BEGIN
    IF NOT pg_try_advisory_xact_lock(7306554614) THEN  -- "conveyor storage" (not the ticker's 7306554612)
        RETURN;
    END IF;
    PERFORM set_config('lock_timeout', lock_timeout, true);
    FOR q IN SELECT * FROM conveyor.queues WHERE storage = 'partitioned' ORDER BY id LOOP
        newest := coalesce(pg_sequence_last_value(q.seq), 0);
        FOREACH rel IN ARRAY ARRAY['messages', 'archive'] LOOP
            CONTINUE WHEN to_regclass(format('conveyor.%I', rel || '_q' || q.id)) IS NULL;
            FOR r IN SELECT * FROM conveyor._storage_ranges(q, rel) x
                      WHERE NOT conveyor._storage_expired(q, x.hi, newest) LOOP
                BEGIN
                    IF conveyor._storage_partition(q, rel, r.lo, r.hi, r.suffix) THEN
                        created := created + 1;
                    END IF;
                EXCEPTION WHEN lock_not_available THEN
                    NULL;  -- busy: next run
                END;
            END LOOP;
            FOR r IN SELECT s.child FROM conveyor._storage_children(format('conveyor.%I', rel || '_q' || q.id)::regclass) s
                      WHERE NOT s.is_default AND conveyor._storage_expired(q, s.hi, newest) LOOP
                BEGIN
                    EXECUTE format('DROP TABLE %s', r.child);
                    expired := expired + 1;
                EXCEPTION WHEN lock_not_available THEN
                    NULL;
                END;
            END LOOP;
        END LOOP;
    END LOOP;
    FOREACH rel IN ARRAY ARRAY['messages', 'archive'] LOOP
        FOR r IN SELECT s.child FROM conveyor._storage_children(format('conveyor.%I', rel)::regclass) s
                  WHERE s.lo <> 'MINVALUE'
                    AND NOT EXISTS (SELECT 1 FROM conveyor.queues x WHERE x.id = s.lo::bigint) LOOP
            BEGIN
                EXECUTE format('DROP TABLE %s', r.child);
                orphaned := orphaned + 1;
            EXCEPTION WHEN lock_not_available THEN
                NULL;
            END;
        END LOOP;
    END LOOP;
    PERFORM set_config('lock_timeout', old_timeout, true);
    IF orphaned > 0 THEN
        PERFORM conveyor._message_plans();
    END IF;
    task := 'partitions_created'; removed := created; RETURN NEXT;
    task := 'expired_partitions'; removed := expired; RETURN NEXT;
    task := 'dropped_queue_tables'; removed := orphaned; RETURN NEXT;
END $$;

-- As in 0001, then the partition upkeep (last, so that the locks it takes are held only
-- until the caller commits). Rows of partitioned queues also expire one by one after
-- their queue's retention_seconds, like every queue's.
CREATE OR REPLACE FUNCTION conveyor.maintenance(max_rows integer DEFAULT 10000)
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

    RETURN QUERY SELECT * FROM conveyor._storage_maintain();
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

REVOKE ALL ON ALL ROUTINES IN SCHEMA conveyor FROM PUBLIC;
