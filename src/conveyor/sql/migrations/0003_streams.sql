-- Conveyor 0003: event streams (PgQ's design, written anew in PL/pgSQL).
--
-- A stream is an append-only log kept in three rotating tables per stream
-- (conveyor.stream_<id>_0/1/2, named from the stream's numeric id). Named consumers each
-- keep a position: the last tick they finished. A tick records a snapshot; the events of
-- a batch are exactly those committed between two ticks' snapshots, so a batch is correct
-- however producers interleave their commits, and it never changes once both ticks exist.
--
-- Rotation never deletes events: every rotation_period the oldest table is TRUNCATEd and
-- becomes the current one, but only once no consumer can still need it. Two steps: step 1
-- switches the current table and records the switching transaction; step 2, in a later
-- transaction, records a transaction id after which nobody writes to the previous table.
-- A batch reads the previous table only while its first tick predates step 2, and step 1
-- waits until every consumer's position is past the last step 2, so no batch ever needs
-- more than two tables. Producers take their transaction id before reading which table is
-- current, which makes "wrote to the previous table" imply "transaction id below step 2".
--
-- New SQLSTATEs: CVS01 stream does not exist, CVS02 consumer not subscribed,
-- CVS03 batch does not exist (or is not open), CVS04 dead letter does not exist.

CREATE TABLE conveyor.streams (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name               text NOT NULL UNIQUE CHECK (name ~ '^[A-Za-z0-9_-]{1,80}$'),
    rotation_period    interval NOT NULL DEFAULT '2 hours',
    ticker_max_count   integer NOT NULL DEFAULT 500,
    ticker_max_lag     interval NOT NULL DEFAULT '3 seconds',
    ticker_idle_period interval NOT NULL DEFAULT '1 minute',
    ticker_paused      boolean NOT NULL DEFAULT false,
    max_retries        integer NOT NULL DEFAULT 5,
    event_ttl          interval,
    cur_table          smallint NOT NULL DEFAULT 0,
    switch_time        timestamptz NOT NULL DEFAULT now(),
    switch_step1       xid8 NOT NULL DEFAULT pg_current_xact_id(),
    switch_step2       xid8 DEFAULT pg_current_xact_id(),
    event_seq          regclass,
    created_at         timestamptz NOT NULL DEFAULT now(),
    CHECK (cur_table BETWEEN 0 AND 2),
    CHECK (rotation_period >= interval '1 second'),
    CHECK (ticker_max_count BETWEEN 1 AND 1000000),
    CHECK (max_retries BETWEEN 0 AND 1000)
);

-- The parent of every stream's event tables (each stream's three tables inherit from
-- their own parent conveyor.stream_<id>, which inherits from this one).
CREATE TABLE conveyor.stream_events (
    ev_id     bigint NOT NULL,
    ev_time   timestamptz NOT NULL DEFAULT now(),
    ev_txid   xid8 NOT NULL DEFAULT pg_current_xact_id(),
    ev_owner  bigint,          -- a retried event is for one consumer only
    ev_retry  integer,
    ev_type   text,
    ev_data   text,
    ev_extra1 text,
    ev_extra2 text,
    ev_extra3 text,
    ev_extra4 text
);

CREATE SEQUENCE conveyor.stream_tick_seq AS bigint;
CREATE SEQUENCE conveyor.stream_batch_seq AS bigint;

CREATE TABLE conveyor.stream_ticks (
    stream_id      bigint NOT NULL REFERENCES conveyor.streams (id) ON DELETE CASCADE,
    tick_id        bigint NOT NULL DEFAULT nextval('conveyor.stream_tick_seq'),
    tick_time      timestamptz NOT NULL DEFAULT now(),
    tick_snapshot  pg_snapshot NOT NULL DEFAULT pg_current_snapshot(),
    tick_event_seq bigint NOT NULL,
    PRIMARY KEY (stream_id, tick_id)
) WITH (fillfactor = 80);

CREATE TABLE conveyor.stream_consumers (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    stream_id        bigint NOT NULL REFERENCES conveyor.streams (id) ON DELETE CASCADE,
    name             text NOT NULL CHECK (name ~ '^[A-Za-z0-9_.:-]{1,80}$'),
    last_tick        bigint NOT NULL,
    batch_id         bigint UNIQUE,
    next_tick        bigint,
    batch_started_at timestamptz,
    active_at        timestamptz NOT NULL DEFAULT now(),
    subscribed_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (stream_id, name)
) WITH (fillfactor = 50);

CREATE TABLE conveyor.stream_retries (
    stream_id   bigint NOT NULL REFERENCES conveyor.streams (id) ON DELETE CASCADE,
    consumer_id bigint NOT NULL REFERENCES conveyor.stream_consumers (id) ON DELETE CASCADE,
    retry_at    timestamptz NOT NULL,
    ev_id       bigint NOT NULL,
    ev_time     timestamptz NOT NULL,
    ev_retry    integer NOT NULL,
    ev_type     text,
    ev_data     text,
    ev_extra1   text,
    ev_extra2   text,
    ev_extra3   text,
    ev_extra4   text
);
CREATE INDEX stream_retries_due_idx ON conveyor.stream_retries (retry_at);

CREATE TABLE conveyor.stream_delayed (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    stream_id  bigint NOT NULL REFERENCES conveyor.streams (id) ON DELETE CASCADE,
    deliver_at timestamptz NOT NULL,
    ev_type    text,
    ev_data    text,
    ev_extra1  text,
    ev_extra2  text,
    ev_extra3  text,
    ev_extra4  text
);
CREATE INDEX stream_delayed_due_idx ON conveyor.stream_delayed (deliver_at);

CREATE TABLE conveyor.stream_dead_letters (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    stream_id bigint NOT NULL REFERENCES conveyor.streams (id) ON DELETE CASCADE,
    consumer  text NOT NULL,
    dead_at   timestamptz NOT NULL DEFAULT now(),
    reason    text,
    ev_id     bigint NOT NULL,
    ev_time   timestamptz NOT NULL,
    ev_retry  integer,
    ev_type   text,
    ev_data   text,
    ev_extra1 text,
    ev_extra2 text,
    ev_extra3 text,
    ev_extra4 text
);
CREATE INDEX stream_dead_letters_time_idx ON conveyor.stream_dead_letters (stream_id, dead_at);

-- Server-less operation: the pg_cron jobs start() scheduled.
CREATE TABLE conveyor.stream_cron (
    singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    ticker_job_id bigint,
    maint_job_id  bigint,
    vacuum_job_id bigint
);
INSERT INTO conveyor.stream_cron DEFAULT VALUES;

-- What consumers receive.
CREATE TYPE conveyor.stream_event AS (
    id          bigint,
    batch_id    bigint,
    type        text,
    payload     text,
    retry_count integer,
    created_at  timestamptz,
    extra1      text,
    extra2      text,
    extra3      text,
    extra4      text
);

CREATE VIEW conveyor.stream_info AS
SELECT s.name, s.rotation_period, s.ticker_max_count, s.ticker_max_lag, s.ticker_idle_period,
       s.ticker_paused, s.max_retries, s.event_ttl, s.cur_table, s.switch_time, s.created_at,
       (SELECT count(*) FROM conveyor.stream_consumers c WHERE c.stream_id = s.id) AS consumers,
       'conveyor_stream_' || s.id AS channel
  FROM conveyor.streams s;

------------------------------------------------------------------------------------------
-- Internal helpers
------------------------------------------------------------------------------------------

CREATE FUNCTION conveyor._stream(stream_name text) RETURNS conveyor.streams
LANGUAGE plpgsql STABLE AS $$
DECLARE
    s conveyor.streams;
BEGIN
    SELECT * INTO s FROM conveyor.streams WHERE name = stream_name;
    IF NOT FOUND THEN
        PERFORM conveyor._raise('CVS01', format('stream %s does not exist',
                                                coalesce(quote_literal(left(stream_name, 100)), 'NULL')));
    END IF;
    RETURN s;
END $$;

CREATE FUNCTION conveyor._stream_table(s conveyor.streams, nr integer) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format('conveyor.%I', 'stream_' || s.id || '_' || nr)
$$;

CREATE FUNCTION conveyor._consumer(s conveyor.streams, consumer_name text) RETURNS conveyor.stream_consumers
LANGUAGE plpgsql STABLE AS $$
DECLARE
    c conveyor.stream_consumers;
BEGIN
    SELECT * INTO c FROM conveyor.stream_consumers WHERE stream_id = s.id AND name = consumer_name;
    IF NOT FOUND THEN
        PERFORM conveyor._raise('CVS02', format('consumer %s is not subscribed to stream %s',
                                                coalesce(quote_literal(left(consumer_name, 100)), 'NULL'),
                                                quote_literal(s.name)));
    END IF;
    RETURN c;
END $$;

CREATE FUNCTION conveyor._stream_options(s conveyor.streams, options jsonb) RETURNS conveyor.streams
LANGUAGE plpgsql AS $$
DECLARE
    key text;
BEGIN
    IF options IS NULL OR jsonb_typeof(options) <> 'object' THEN
        PERFORM conveyor._raise('CVV01', 'stream options must be a JSON object');
    END IF;
    FOR key IN SELECT jsonb_object_keys(options) LOOP
        BEGIN
            CASE key
            WHEN 'rotation_period' THEN s.rotation_period := (options ->> key)::interval;
            WHEN 'ticker_max_count' THEN s.ticker_max_count := (options ->> key)::integer;
            WHEN 'ticker_max_lag' THEN s.ticker_max_lag := (options ->> key)::interval;
            WHEN 'ticker_idle_period' THEN s.ticker_idle_period := (options ->> key)::interval;
            WHEN 'max_retries' THEN s.max_retries := (options ->> key)::integer;
            WHEN 'event_ttl' THEN s.event_ttl := (options ->> key)::interval;
            WHEN 'ticker_paused' THEN s.ticker_paused := (options ->> key)::boolean;
            ELSE PERFORM conveyor._raise('CVV01', format('unknown stream option %s', quote_literal(left(key, 100))));
            END CASE;
        EXCEPTION WHEN data_exception THEN
            PERFORM conveyor._raise('CVV01', format('invalid value for stream option %s: %s', key,
                                                    left(options ->> key, 100)));
        END;
    END LOOP;
    IF s.rotation_period IS NULL OR s.ticker_max_count IS NULL OR s.ticker_max_lag IS NULL
       OR s.ticker_idle_period IS NULL OR s.max_retries IS NULL OR s.ticker_paused IS NULL THEN
        PERFORM conveyor._raise('CVV01', 'only event_ttl may be null; every other stream option needs a value');
    END IF;
    IF s.rotation_period < interval '1 second' OR s.ticker_max_count NOT BETWEEN 1 AND 1000000
       OR s.max_retries NOT BETWEEN 0 AND 1000 OR s.ticker_max_lag < interval '0'
       OR s.ticker_idle_period < interval '0' OR s.event_ttl <= interval '0' THEN
        PERFORM conveyor._raise('CVV01', 'stream option out of range: rotation_period >= 1 second, '
                                || 'ticker_max_count 1-1000000, max_retries 0-1000, intervals positive');
    END IF;
    RETURN s;
END $$;

-- One event: the single-insert path (a plain VALUES insert plans in a fraction of the
-- time of the JSON path's recordset walk, and most producers append one at a time).
CREATE FUNCTION conveyor._stream_insert_one(stream_name text, type text, payload text, extra1 text,
                                            extra2 text, extra3 text, extra4 text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    s conveyor.streams;
    id bigint;
BEGIN
    PERFORM pg_current_xact_id();
    s := conveyor._stream(stream_name);
    EXECUTE format(
        'INSERT INTO %s (ev_id, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
         VALUES (nextval($1), coalesce($2, ''default''), $3, $4, $5, $6, $7) RETURNING ev_id',
        conveyor._stream_table(s, s.cur_table))
    INTO id USING s.event_seq, type, payload, extra1, extra2, extra3, extra4;
    RETURN id;
END $$;

-- Many payloads of one type, straight from an array (no JSON built or parsed).
CREATE FUNCTION conveyor._stream_insert_array(stream_name text, type text, payloads text[]) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
DECLARE
    s conveyor.streams;
BEGIN
    PERFORM pg_current_xact_id();
    s := conveyor._stream(stream_name);
    IF payloads IS NULL OR cardinality(payloads) = 0 THEN
        PERFORM conveyor._raise('CVV01', 'payloads must be a non-empty array');
    END IF;
    RETURN QUERY EXECUTE format(
        'INSERT INTO %s (ev_id, ev_type, ev_data)
         SELECT nextval($1), coalesce($2, ''default''), p FROM unnest($3) WITH ORDINALITY AS u(p, i)
          ORDER BY i
         RETURNING ev_id', conveyor._stream_table(s, s.cur_table))
    USING s.event_seq, type, payloads;
END $$;

-- Inserts events (a JSON array of {type, payload, extra1..4}) into the current table.
-- The transaction id is taken before the current table is read (see the header).
CREATE FUNCTION conveyor._stream_insert(stream_name text, events jsonb) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
DECLARE
    s conveyor.streams;
BEGIN
    PERFORM pg_current_xact_id();
    s := conveyor._stream(stream_name);
    IF events IS NULL OR jsonb_typeof(events) <> 'array' OR jsonb_array_length(events) = 0 THEN
        PERFORM conveyor._raise('CVV01', 'events must be a non-empty JSON array');
    END IF;
    RETURN QUERY EXECUTE format(
        'INSERT INTO %s (ev_id, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
         SELECT nextval($1), coalesce(x.type, ''default''), x.payload, x.extra1, x.extra2, x.extra3, x.extra4
           FROM ROWS FROM (jsonb_to_recordset($2) AS (type text, payload text, extra1 text, extra2 text,
                                                     extra3 text, extra4 text))
                WITH ORDINALITY AS x(type, payload, extra1, extra2, extra3, extra4, ord)
          ORDER BY x.ord
         RETURNING ev_id', conveyor._stream_table(s, s.cur_table))
    USING s.event_seq, events;
END $$;

-- The tables a batch must read, and the snapshot bounds of its two ticks.
CREATE FUNCTION conveyor._batch(batch_id bigint,
    OUT s conveyor.streams, OUT c conveyor.stream_consumers,
    OUT snap1 pg_snapshot, OUT snap2 pg_snapshot, OUT tables text[])
LANGUAGE plpgsql STABLE AS $$
BEGIN
    SELECT * INTO c FROM conveyor.stream_consumers x WHERE x.batch_id = _batch.batch_id;
    IF NOT FOUND THEN
        PERFORM conveyor._raise('CVS03', format('batch %s does not exist or is finished', batch_id));
    END IF;
    SELECT * INTO s FROM conveyor.streams x WHERE x.id = c.stream_id;
    SELECT t.tick_snapshot INTO snap1 FROM conveyor.stream_ticks t
     WHERE t.stream_id = s.id AND t.tick_id = c.last_tick;
    SELECT t.tick_snapshot INTO snap2 FROM conveyor.stream_ticks t
     WHERE t.stream_id = s.id AND t.tick_id = c.next_tick;
    tables := conveyor._tables_since(s, snap1);
END $$;

-- The event tables that can hold events committed after snapshot snap1: the current one,
-- and the previous one while snap1 predates the last rotation's step 2.
CREATE FUNCTION conveyor._tables_since(s conveyor.streams, snap1 pg_snapshot) RETURNS text[]
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN s.switch_step2 IS NULL OR pg_snapshot_xmin(snap1) < s.switch_step2
                THEN ARRAY[conveyor._stream_table(s, s.cur_table), conveyor._stream_table(s, (s.cur_table + 2) % 3)]
                ELSE ARRAY[conveyor._stream_table(s, s.cur_table)] END
$$;

-- The condition (SQL text, values inlined) selecting the events committed after snap1 and
-- by snap2: a transaction id from snap1's xmax on that snap2 sees, or one still in
-- progress at snap1 that snap2 sees. Events for everyone, and with a consumer's id
-- (owner) that consumer's retries too.
CREATE FUNCTION conveyor._between_snapshots(snap1 pg_snapshot, snap2 pg_snapshot, owner bigint) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format('((ev_txid >= pg_snapshot_xmax(%L::pg_snapshot) AND ev_txid < pg_snapshot_xmax(%L::pg_snapshot))
                    OR ev_txid = ANY (%L::xid8[]))
               AND pg_visible_in_snapshot(ev_txid, %L::pg_snapshot)
               AND NOT pg_visible_in_snapshot(ev_txid, %L::pg_snapshot)
               AND %s',
                  snap1, snap2, ARRAY(SELECT pg_snapshot_xip(snap1)), snap2, snap1,
                  CASE WHEN owner IS NULL THEN 'ev_owner IS NULL'
                       ELSE format('(ev_owner IS NULL OR ev_owner = %s)', owner) END)
$$;

-- The query for the events of a batch: those between its two ticks' snapshots (for
-- everyone, or this consumer's retries), not older than the stream's event_ttl. Values
-- are inlined as literals so that the same text serves RETURN QUERY and a named cursor.
CREATE FUNCTION conveyor._batch_query(batch_id bigint, only_event bigint DEFAULT NULL) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    b record := conveyor._batch(batch_id);
    tbl text;
    sql text := '';
BEGIN
    FOREACH tbl IN ARRAY b.tables LOOP
        sql := sql || CASE WHEN sql = '' THEN '' ELSE ' UNION ALL ' END || format(
            'SELECT ev_id, %s::bigint, ev_type, ev_data, ev_retry, ev_time, ev_extra1, ev_extra2, ev_extra3, ev_extra4
               FROM %s WHERE %s',
            batch_id, tbl, conveyor._between_snapshots(b.snap1, b.snap2, (b.c).id));
        IF only_event IS NOT NULL THEN
            sql := sql || format(' AND ev_id = %s', only_event);
        END IF;
        IF (b.s).event_ttl IS NOT NULL THEN
            sql := sql || format(' AND ev_time >= %L::timestamptz', now() - (b.s).event_ttl);
        END IF;
    END LOOP;
    RETURN sql || ' ORDER BY 1';
END $$;

CREATE FUNCTION conveyor._batch_events(batch_id bigint, only_event bigint DEFAULT NULL)
RETURNS SETOF conveyor.stream_event
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY EXECUTE conveyor._batch_query(batch_id, only_event);
END $$;

------------------------------------------------------------------------------------------
-- Streams
------------------------------------------------------------------------------------------

-- Creates a stream (options: rotation_period, ticker_max_count, ticker_max_lag,
-- ticker_idle_period, max_retries, event_ttl), or returns it if it exists.
CREATE FUNCTION conveyor.stream_create(stream_name text, options jsonb DEFAULT '{}')
RETURNS SETOF conveyor.stream_info
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams;
    parent text;
    nr integer;
BEGIN
    IF stream_name IS NULL OR stream_name !~ '^[A-Za-z0-9_-]{1,80}$' THEN
        PERFORM conveyor._raise('CVV01', format(
            'invalid stream name %s: use 1 to 80 characters of A-Z, a-z, 0-9, hyphen and underscore',
            coalesce(quote_literal(left(stream_name, 100)), 'NULL')));
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('conveyor.stream:' || stream_name));
    IF EXISTS (SELECT 1 FROM conveyor.streams WHERE name = stream_name) THEN
        RETURN QUERY SELECT * FROM conveyor.stream_info WHERE name = stream_name;
        RETURN;
    END IF;
    s.name := stream_name;
    s.rotation_period := '2 hours'; s.ticker_max_count := 500; s.ticker_max_lag := '3 seconds';
    s.ticker_idle_period := '1 minute'; s.max_retries := 5; s.ticker_paused := false;
    s := conveyor._stream_options(s, coalesce(options, '{}'));
    INSERT INTO conveyor.streams (name, rotation_period, ticker_max_count, ticker_max_lag,
                                  ticker_idle_period, ticker_paused, max_retries, event_ttl)
    VALUES (s.name, s.rotation_period, s.ticker_max_count, s.ticker_max_lag, s.ticker_idle_period,
            s.ticker_paused, s.max_retries, s.event_ttl)
    RETURNING * INTO s;
    parent := format('conveyor.%I', 'stream_' || s.id);
    EXECUTE format('CREATE TABLE %s () INHERITS (conveyor.stream_events)', parent);
    FOR nr IN 0 .. 2 LOOP
        EXECUTE format('CREATE TABLE %s () INHERITS (%s)', conveyor._stream_table(s, nr), parent);
        EXECUTE format('CREATE INDEX ON %s (ev_txid)', conveyor._stream_table(s, nr));
        EXECUTE format('GRANT SELECT ON %s TO conveyor_reader', conveyor._stream_table(s, nr));
    END LOOP;
    EXECUTE format('GRANT SELECT ON %s TO conveyor_reader', parent);
    EXECUTE format('CREATE SEQUENCE conveyor.%I AS bigint', 'stream_seq_' || s.id);
    UPDATE conveyor.streams SET event_seq = format('conveyor.%I', 'stream_seq_' || s.id)::regclass
     WHERE id = s.id;
    INSERT INTO conveyor.stream_ticks (stream_id, tick_event_seq) VALUES (s.id, 0);
    RETURN QUERY SELECT * FROM conveyor.stream_info WHERE name = stream_name;
END $$;

CREATE FUNCTION conveyor.stream_drop(stream_name text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams;
BEGIN
    SELECT * INTO s FROM conveyor.streams WHERE name = stream_name FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    EXECUTE format('DROP TABLE IF EXISTS conveyor.%I CASCADE', 'stream_' || s.id);
    EXECUTE format('DROP SEQUENCE IF EXISTS conveyor.%I', 'stream_seq_' || s.id);
    DELETE FROM conveyor.streams WHERE id = s.id;
    RETURN true;
END $$;

CREATE FUNCTION conveyor.stream_set_config(stream_name text, options jsonb) RETURNS SETOF conveyor.stream_info
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams := conveyor._stream(stream_name);
BEGIN
    s := conveyor._stream_options(s, options);
    UPDATE conveyor.streams
       SET rotation_period = s.rotation_period, ticker_max_count = s.ticker_max_count,
           ticker_max_lag = s.ticker_max_lag, ticker_idle_period = s.ticker_idle_period,
           ticker_paused = s.ticker_paused, max_retries = s.max_retries, event_ttl = s.event_ttl
     WHERE id = s.id;
    RETURN QUERY SELECT * FROM conveyor.stream_info WHERE name = stream_name;
END $$;

CREATE FUNCTION conveyor.stream_pause(stream_name text) RETURNS SETOF conveyor.stream_info
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT * FROM conveyor.stream_set_config(stream_name, '{"ticker_paused": true}')
$$;

CREATE FUNCTION conveyor.stream_resume(stream_name text) RETURNS SETOF conveyor.stream_info
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT * FROM conveyor.stream_set_config(stream_name, '{"ticker_paused": false}')
$$;

CREATE FUNCTION conveyor.stream_get(stream_name text) RETURNS SETOF conveyor.stream_info
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    PERFORM conveyor._stream(stream_name);
    RETURN QUERY SELECT * FROM conveyor.stream_info WHERE name = stream_name;
END $$;

CREATE FUNCTION conveyor.stream_list() RETURNS SETOF conveyor.stream_info
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT * FROM conveyor.stream_info ORDER BY name
$$;

------------------------------------------------------------------------------------------
-- Producers
------------------------------------------------------------------------------------------

-- Appends events given as a JSON array of {type, payload, extra1..4} (the server's path).
CREATE FUNCTION conveyor.stream_send_json(stream_name text, events jsonb) RETURNS SETOF bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT conveyor._stream_insert(stream_name, events)
$$;

-- Text payloads are stored as given; a jsonb payload is validated (and normalised) first.
CREATE FUNCTION conveyor.stream_send(stream_name text, payload text, type text DEFAULT 'default',
                                     extra1 text DEFAULT NULL, extra2 text DEFAULT NULL,
                                     extra3 text DEFAULT NULL, extra4 text DEFAULT NULL) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT conveyor._stream_insert_one(stream_name, type, payload, extra1, extra2, extra3, extra4)
$$;

CREATE FUNCTION conveyor.stream_send(stream_name text, payload jsonb, type text DEFAULT 'default',
                                     extra1 text DEFAULT NULL, extra2 text DEFAULT NULL,
                                     extra3 text DEFAULT NULL, extra4 text DEFAULT NULL) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT conveyor.stream_send(stream_name, payload::text, type, extra1, extra2, extra3, extra4)
$$;

-- Appends many payloads of one type in one statement; ids in input order.
CREATE FUNCTION conveyor.stream_send_batch(stream_name text, type text, payloads text[]) RETURNS SETOF bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT conveyor._stream_insert_array(stream_name, type, payloads)
$$;

CREATE FUNCTION conveyor.stream_send_batch(stream_name text, type text, payloads jsonb[]) RETURNS SETOF bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT conveyor.stream_send_batch(stream_name, type, payloads::text[])
$$;

-- Delivers at a later time: returns the id of the scheduled entry (not an event id; the
-- event gets its id when maint() moves it into the stream), or the event id if due now.
CREATE FUNCTION conveyor.stream_send_at(stream_name text, payload text, deliver_at timestamptz,
                                        type text DEFAULT 'default', extra1 text DEFAULT NULL,
                                        extra2 text DEFAULT NULL, extra3 text DEFAULT NULL,
                                        extra4 text DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams := conveyor._stream(stream_name);
    entry bigint;
BEGIN
    IF deliver_at IS NULL OR deliver_at <= now() THEN
        RETURN conveyor.stream_send(stream_name, payload, type, extra1, extra2, extra3, extra4);
    END IF;
    INSERT INTO conveyor.stream_delayed (stream_id, deliver_at, ev_type, ev_data, ev_extra1, ev_extra2,
                                         ev_extra3, ev_extra4)
    VALUES (s.id, deliver_at, coalesce(type, 'default'), payload, extra1, extra2, extra3, extra4)
    RETURNING id INTO entry;
    RETURN entry;
END $$;

-- The table producers may INSERT or COPY into directly (ev_id from nextval of the
-- stream's sequence, named in event_seq). Take a transaction id first
-- (pg_current_xact_id()) and look this up in the same transaction as the insert.
CREATE FUNCTION conveyor.stream_current_table(stream_name text, OUT table_name text, OUT event_seq regclass)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams := conveyor._stream(stream_name);
BEGIN
    table_name := conveyor._stream_table(s, s.cur_table);
    event_seq := s.event_seq;
END $$;

------------------------------------------------------------------------------------------
-- The ticker
------------------------------------------------------------------------------------------

-- Ticks every stream that needs it: when ticker_max_count events arrived, when events
-- arrived and ticker_max_lag passed, or when ticker_idle_period passed anyway. Each tick
-- is announced on the channel conveyor_stream (payload: the stream's name; servers and
-- clients listen there) and on the stream's own channel conveyor_stream_<id> (payload:
-- the tick id; stream_info.channel names it). Returns how many ticks were made.
CREATE FUNCTION conveyor.ticker() RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams;
    made integer := 0;
BEGIN
    FOR s IN SELECT * FROM conveyor.streams WHERE NOT ticker_paused ORDER BY id LOOP
        IF conveyor._tick(s, false) THEN
            made := made + 1;
        END IF;
    END LOOP;
    RETURN made;
END $$;

-- Ticks one stream now, whether or not it needs it.
CREATE FUNCTION conveyor.stream_force_tick(stream_name text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    PERFORM conveyor._tick(conveyor._stream(stream_name), true);
    RETURN (SELECT max(tick_id) FROM conveyor.stream_ticks t
             WHERE t.stream_id = (SELECT id FROM conveyor.streams WHERE name = stream_name));
END $$;

CREATE FUNCTION conveyor._tick(s conveyor.streams, force boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    last conveyor.stream_ticks;
    seq bigint := coalesce(pg_sequence_last_value(s.event_seq), 0);
    pending bigint;
    tick bigint;
BEGIN
    SELECT * INTO last FROM conveyor.stream_ticks t WHERE t.stream_id = s.id ORDER BY t.tick_id DESC LIMIT 1;
    pending := seq - coalesce(last.tick_event_seq, 0);
    IF NOT force AND last.tick_id IS NOT NULL
       AND NOT (pending >= s.ticker_max_count
                OR (pending > 0 AND now() - last.tick_time >= s.ticker_max_lag)
                OR now() - last.tick_time >= s.ticker_idle_period) THEN
        RETURN false;
    END IF;
    INSERT INTO conveyor.stream_ticks (stream_id, tick_event_seq) VALUES (s.id, seq) RETURNING tick_id INTO tick;
    PERFORM pg_notify('conveyor_stream', s.name);
    PERFORM pg_notify('conveyor_stream_' || s.id, tick::text);
    RETURN true;
END $$;

------------------------------------------------------------------------------------------
-- Consumers: low level (PgQ's batch API)
------------------------------------------------------------------------------------------

-- Subscribes a consumer from now on (events after the stream's latest tick).
CREATE FUNCTION conveyor.stream_subscribe(stream_name text, consumer_name text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams := conveyor._stream(stream_name);
BEGIN
    IF consumer_name IS NULL OR consumer_name !~ '^[A-Za-z0-9_.:-]{1,80}$' THEN
        PERFORM conveyor._raise('CVV01', format(
            'invalid consumer name %s: use 1 to 80 characters of A-Z, a-z, 0-9 and _ . : -',
            coalesce(quote_literal(left(consumer_name, 100)), 'NULL')));
    END IF;
    INSERT INTO conveyor.stream_consumers (stream_id, name, last_tick)
    SELECT s.id, consumer_name, max(t.tick_id) FROM conveyor.stream_ticks t WHERE t.stream_id = s.id
    ON CONFLICT (stream_id, name) DO NOTHING;
    RETURN FOUND;
END $$;

CREATE FUNCTION conveyor.stream_unsubscribe(stream_name text, consumer_name text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams := conveyor._stream(stream_name);
BEGIN
    DELETE FROM conveyor.stream_consumers WHERE stream_id = s.id AND name = consumer_name;
    RETURN FOUND;
END $$;

-- Opens the consumer's next batch (or returns the one still open); NULL when there is no
-- tick after the consumer's position yet. The custom variant waits for a bigger batch:
-- at least min_count events, or min_interval of time, or a tick at least min_lag old.
CREATE FUNCTION conveyor.stream_next_batch_custom(stream_name text, consumer_name text,
                                                  min_lag interval DEFAULT NULL, min_count integer DEFAULT NULL,
                                                  min_interval interval DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams := conveyor._stream(stream_name);
    c conveyor.stream_consumers := conveyor._consumer(s, consumer_name);
    last conveyor.stream_ticks;
    target conveyor.stream_ticks;
    new_batch bigint;
BEGIN
    IF c.batch_id IS NOT NULL THEN
        RETURN c.batch_id;
    END IF;
    SELECT * INTO last FROM conveyor.stream_ticks t WHERE t.stream_id = s.id AND t.tick_id = c.last_tick;
    IF min_lag IS NULL AND min_count IS NULL AND min_interval IS NULL THEN
        SELECT * INTO target FROM conveyor.stream_ticks t
         WHERE t.stream_id = s.id AND t.tick_id > c.last_tick ORDER BY t.tick_id LIMIT 1;
    ELSE
        -- the latest tick that is old enough, among those that make the batch big enough
        SELECT * INTO target FROM conveyor.stream_ticks t
         WHERE t.stream_id = s.id AND t.tick_id > c.last_tick
           AND (min_lag IS NULL OR t.tick_time <= now() - min_lag)
           AND ((min_count IS NULL AND min_interval IS NULL)
                OR (min_count IS NOT NULL AND t.tick_event_seq - last.tick_event_seq >= min_count)
                OR (min_interval IS NOT NULL AND t.tick_time - last.tick_time >= min_interval))
         ORDER BY t.tick_id DESC LIMIT 1;
    END IF;
    UPDATE conveyor.stream_consumers SET active_at = now() WHERE id = c.id;
    IF target.tick_id IS NULL THEN
        RETURN NULL;
    END IF;
    new_batch := nextval('conveyor.stream_batch_seq');
    UPDATE conveyor.stream_consumers
       SET batch_id = new_batch, next_tick = target.tick_id, batch_started_at = now()
     WHERE id = c.id;
    RETURN new_batch;
END $$;

CREATE FUNCTION conveyor.stream_next_batch(stream_name text, consumer_name text) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT conveyor.stream_next_batch_custom(stream_name, consumer_name, NULL, NULL, NULL)
$$;

CREATE FUNCTION conveyor.stream_get_batch_events(batch_id bigint) RETURNS SETOF conveyor.stream_event
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT * FROM conveyor._batch_events(batch_id)
$$;

-- For huge batches: returns the first quick_limit events and leaves the rest in a cursor
-- named cursor_name (FETCH from it in the same transaction).
CREATE FUNCTION conveyor.stream_get_batch_cursor(batch_id bigint, cursor_name text, quick_limit integer DEFAULT 1000)
RETURNS SETOF conveyor.stream_event
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    cur refcursor := cursor_name;
    ev conveyor.stream_event;
    n integer := 0;
BEGIN
    IF cursor_name IS NULL OR cursor_name !~ '^[a-z_][a-z0-9_]{0,62}$' THEN
        PERFORM conveyor._raise('CVV01', 'cursor_name must be a lower-case identifier');
    END IF;
    OPEN cur FOR EXECUTE conveyor._batch_query(batch_id);
    WHILE n < quick_limit LOOP
        FETCH cur INTO ev;
        EXIT WHEN NOT FOUND;
        RETURN NEXT ev;
        n := n + 1;
    END LOOP;
END $$;

-- The stream an open batch belongs to, or NULL when no consumer holds that batch.
CREATE FUNCTION conveyor.stream_of_batch(batch_id bigint) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT s.name FROM conveyor.stream_consumers c JOIN conveyor.streams s ON s.id = c.stream_id
     WHERE c.batch_id = stream_of_batch.batch_id
$$;

-- Finishes a batch: the consumer's position moves to the batch's second tick.
CREATE FUNCTION conveyor.stream_finish_batch(batch_id bigint) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    UPDATE conveyor.stream_consumers c
       SET last_tick = c.next_tick, next_tick = NULL, batch_id = NULL, batch_started_at = NULL,
           active_at = now()
     WHERE c.batch_id = stream_finish_batch.batch_id;
    IF NOT FOUND THEN
        PERFORM conveyor._raise('CVS03', format('batch %s does not exist or is finished', batch_id));
    END IF;
    RETURN 1;
END $$;

-- Puts one event of a batch back for this consumer only, after retry_seconds.
CREATE FUNCTION conveyor.stream_event_retry(batch_id bigint, event_id bigint, retry_seconds integer)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    b record := conveyor._batch(batch_id);
    ev conveyor.stream_event;
BEGIN
    SELECT * INTO ev FROM conveyor._batch_events(batch_id, event_id);
    IF NOT FOUND THEN
        PERFORM conveyor._raise('CVV01', format('event %s is not in batch %s', event_id, batch_id));
    END IF;
    INSERT INTO conveyor.stream_retries (stream_id, consumer_id, retry_at, ev_id, ev_time, ev_retry, ev_type,
                                         ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
    VALUES ((b.s).id, (b.c).id, now() + make_interval(secs => greatest(retry_seconds, 0)), ev.id, ev.created_at,
            coalesce(ev.retry_count, 0) + 1, ev.type, ev.payload, ev.extra1, ev.extra2, ev.extra3, ev.extra4);
    RETURN 1;
END $$;

-- Puts every event of a batch back (the batch still has to be finished).
CREATE FUNCTION conveyor.stream_batch_retry(batch_id bigint, retry_seconds integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    b record := conveyor._batch(batch_id);
    n integer;
BEGIN
    INSERT INTO conveyor.stream_retries (stream_id, consumer_id, retry_at, ev_id, ev_time, ev_retry, ev_type,
                                         ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
    SELECT (b.s).id, (b.c).id, now() + make_interval(secs => greatest(retry_seconds, 0)), e.id, e.created_at,
           coalesce(e.retry_count, 0) + 1, e.type, e.payload, e.extra1, e.extra2, e.extra3, e.extra4
      FROM conveyor._batch_events(batch_id) e;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

------------------------------------------------------------------------------------------
-- Consumers: the modern API
------------------------------------------------------------------------------------------

-- Opens the next batch and returns up to max_return of its events; batches that hold
-- nothing for this consumer are finished on the way, so an empty result means there is
-- nothing to do yet. Acknowledging a batch finishes all of it, returned or not: ask for
-- as many events as you will process.
CREATE FUNCTION conveyor.stream_receive(stream_name text, consumer_name text, max_return integer DEFAULT 1000)
RETURNS SETOF conveyor.stream_event
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    batch bigint;
BEGIN
    IF max_return IS NULL OR max_return < 1 THEN
        PERFORM conveyor._raise('CVV01', format('max_return must be at least 1, got %s', max_return));
    END IF;
    FOR i IN 1 .. 1000 LOOP
        batch := conveyor.stream_next_batch(stream_name, consumer_name);
        IF batch IS NULL THEN
            RETURN;
        END IF;
        RETURN QUERY SELECT * FROM conveyor._batch_events(batch) LIMIT max_return;
        IF FOUND THEN
            RETURN;
        END IF;
        PERFORM conveyor.stream_finish_batch(batch);
    END LOOP;
END $$;

CREATE FUNCTION conveyor.stream_ack(batch_id bigint) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT conveyor.stream_finish_batch(batch_id)
$$;

-- Fails one event of an open batch: retried for this consumer after retry_after, or,
-- once it has been retried max_retries times, moved to the dead letters with the reason.
-- Returns 'retry' or 'dead'.
CREATE FUNCTION conveyor.stream_nack(batch_id bigint, event_id bigint, retry_after interval DEFAULT '60 seconds',
                                     reason text DEFAULT NULL) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    b record := conveyor._batch(batch_id);
    ev conveyor.stream_event;
BEGIN
    SELECT * INTO ev FROM conveyor._batch_events(batch_id, event_id);
    IF NOT FOUND THEN
        PERFORM conveyor._raise('CVV01', format('event %s is not in batch %s', event_id, batch_id));
    END IF;
    IF coalesce(ev.retry_count, 0) >= (b.s).max_retries THEN
        PERFORM conveyor._dead_letter_event(b.s, (b.c).name, ev, coalesce(reason, 'max retries exceeded'));
        RETURN 'dead';
    END IF;
    PERFORM conveyor.stream_event_retry(batch_id, event_id, extract(epoch FROM retry_after)::integer);
    RETURN 'retry';
END $$;

-- Moves one event of an open batch to the dead letters at once.
CREATE FUNCTION conveyor.stream_dead_letter(batch_id bigint, event_id bigint, reason text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    b record := conveyor._batch(batch_id);
    ev conveyor.stream_event;
BEGIN
    SELECT * INTO ev FROM conveyor._batch_events(batch_id, event_id);
    IF NOT FOUND THEN
        PERFORM conveyor._raise('CVV01', format('event %s is not in batch %s', event_id, batch_id));
    END IF;
    PERFORM conveyor._dead_letter_event(b.s, (b.c).name, ev, coalesce(reason, 'dead-lettered by consumer'));
    RETURN 1;
END $$;

CREATE FUNCTION conveyor._dead_letter_event(s conveyor.streams, consumer text, ev conveyor.stream_event,
                                            reason text) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO conveyor.stream_dead_letters (stream_id, consumer, reason, ev_id, ev_time, ev_retry, ev_type,
                                              ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
    VALUES (s.id, consumer, reason, ev.id, ev.created_at, ev.retry_count, ev.type, ev.payload,
            ev.extra1, ev.extra2, ev.extra3, ev.extra4)
$$;

------------------------------------------------------------------------------------------
-- Dead letters
------------------------------------------------------------------------------------------

CREATE FUNCTION conveyor.stream_dead_letters(stream_name text, max_rows integer DEFAULT 100)
RETURNS SETOF conveyor.stream_dead_letters
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams := conveyor._stream(stream_name);
BEGIN
    RETURN QUERY SELECT * FROM conveyor.stream_dead_letters d WHERE d.stream_id = s.id
                  ORDER BY d.id LIMIT least(greatest(max_rows, 1), 10000);
END $$;

-- Sends a dead letter back into its stream as a new event (every consumer sees it
-- again); returns the new event id.
CREATE FUNCTION conveyor.stream_dead_letter_replay(dead_letter_id bigint, stream_name text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    d conveyor.stream_dead_letters;
    s conveyor.streams;
BEGIN
    DELETE FROM conveyor.stream_dead_letters x
     WHERE x.id = dead_letter_id
       AND (stream_name IS NULL OR x.stream_id = (SELECT id FROM conveyor.streams WHERE name = stream_name))
    RETURNING * INTO d;
    IF NOT FOUND THEN
        PERFORM conveyor._raise('CVS04', format('dead letter %s does not exist%s', dead_letter_id,
                                                coalesce(' in stream ' || quote_literal(stream_name), '')));
    END IF;
    SELECT * INTO s FROM conveyor.streams x WHERE x.id = d.stream_id;
    RETURN conveyor._stream_insert_one(s.name, d.ev_type, d.ev_data, d.ev_extra1, d.ev_extra2, d.ev_extra3,
                                       d.ev_extra4);
END $$;

CREATE FUNCTION conveyor.stream_dead_letter_replay_all(stream_name text) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams := conveyor._stream(stream_name);
    events jsonb;
    n integer;
BEGIN
    WITH gone AS (DELETE FROM conveyor.stream_dead_letters d WHERE d.stream_id = s.id RETURNING d.*)
    SELECT jsonb_agg(jsonb_build_object('type', ev_type, 'payload', ev_data, 'extra1', ev_extra1,
                                        'extra2', ev_extra2, 'extra3', ev_extra3, 'extra4', ev_extra4) ORDER BY id),
           count(*)
      INTO events, n FROM gone;
    IF n > 0 THEN
        PERFORM conveyor._stream_insert(stream_name, events);
    END IF;
    RETURN n;
END $$;

CREATE FUNCTION conveyor.stream_dead_letter_purge(stream_name text, older_than interval DEFAULT '30 days')
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams := conveyor._stream(stream_name);
    n integer;
BEGIN
    DELETE FROM conveyor.stream_dead_letters d WHERE d.stream_id = s.id AND d.dead_at < now() - older_than;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

------------------------------------------------------------------------------------------
-- Maintenance
------------------------------------------------------------------------------------------

-- One round of maintenance for every stream: finish a rotation begun by an earlier call
-- (step 2), begin one when due and no consumer still needs the oldest table (step 1),
-- move due retries and delayed events into the streams, drop ticks nobody needs.
-- Returns what it did. VACUUM cannot run inside a function: maint_tables_to_vacuum()
-- lists the small, hot tables for the caller to vacuum.
CREATE FUNCTION conveyor.maint() RETURNS TABLE (stream text, operation text, count bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams;
    n bigint;
BEGIN
    FOR s IN SELECT * FROM conveyor.streams ORDER BY id LOOP
        stream := s.name;
        IF s.switch_step2 IS NULL THEN
            UPDATE conveyor.streams SET switch_step2 = pg_current_xact_id() WHERE id = s.id;
            operation := 'rotation_step2'; count := 1; RETURN NEXT;
        ELSIF now() - s.switch_time >= s.rotation_period THEN
            IF conveyor._rotate_step1(s) THEN
                operation := 'rotation_step1'; count := 1; RETURN NEXT;
            ELSE
                operation := 'rotation_blocked'; count := 1; RETURN NEXT;
            END IF;
        END IF;
        n := conveyor._move_retries(s);
        IF n > 0 THEN operation := 'retries'; count := n; RETURN NEXT; END IF;
        n := conveyor._move_delayed(s);
        IF n > 0 THEN operation := 'delayed'; count := n; RETURN NEXT; END IF;
        -- ticks are kept an hour (throughput history), and longer while a consumer needs them
        DELETE FROM conveyor.stream_ticks t
         WHERE t.stream_id = s.id AND t.tick_time < now() - interval '1 hour'
           AND t.tick_id < coalesce((SELECT min(c.last_tick) FROM conveyor.stream_consumers c WHERE c.stream_id = s.id),
                                    (SELECT max(x.tick_id) FROM conveyor.stream_ticks x WHERE x.stream_id = s.id));
        GET DIAGNOSTICS n = ROW_COUNT;
        IF n > 0 THEN operation := 'old_ticks'; count := n; RETURN NEXT; END IF;
    END LOOP;
END $$;

-- Rotation step 1, unless some consumer's position predates the last step 2 (it may
-- still need the previous table, which would become too old to be read).
CREATE FUNCTION conveyor._rotate_step1(s conveyor.streams) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    next_nr integer := (s.cur_table + 1) % 3;
BEGIN
    IF EXISTS (SELECT 1 FROM conveyor.stream_consumers c
                 JOIN conveyor.stream_ticks t ON t.stream_id = c.stream_id AND t.tick_id = c.last_tick
                WHERE c.stream_id = s.id AND pg_snapshot_xmin(t.tick_snapshot) < s.switch_step2) THEN
        RETURN false;
    END IF;
    EXECUTE format('TRUNCATE %s', conveyor._stream_table(s, next_nr));
    UPDATE conveyor.streams
       SET cur_table = next_nr, switch_time = now(), switch_step1 = pg_current_xact_id(), switch_step2 = NULL
     WHERE id = s.id;
    RETURN true;
END $$;

CREATE FUNCTION conveyor._move_retries(s conveyor.streams) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    PERFORM pg_current_xact_id();
    EXECUTE format(
        'WITH due AS (DELETE FROM conveyor.stream_retries r
                       WHERE r.ctid IN (SELECT x.ctid FROM conveyor.stream_retries x
                                         WHERE x.stream_id = $1 AND x.retry_at <= now()
                                         LIMIT 10000 FOR UPDATE SKIP LOCKED)
                      RETURNING r.*)
         INSERT INTO %s (ev_id, ev_time, ev_owner, ev_retry, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
         SELECT ev_id, ev_time, consumer_id, ev_retry, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4
           FROM due ORDER BY ev_id', conveyor._stream_table(s, s.cur_table))
    USING s.id;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

CREATE FUNCTION conveyor._move_delayed(s conveyor.streams) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    PERFORM pg_current_xact_id();
    EXECUTE format(
        'WITH due AS (DELETE FROM conveyor.stream_delayed d
                       WHERE d.id IN (SELECT x.id FROM conveyor.stream_delayed x
                                       WHERE x.stream_id = $1 AND x.deliver_at <= now()
                                       ORDER BY x.deliver_at, x.id LIMIT 10000 FOR UPDATE SKIP LOCKED)
                      RETURNING d.*)
         INSERT INTO %s (ev_id, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
         SELECT nextval($2), ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4
           FROM due ORDER BY deliver_at, id', conveyor._stream_table(s, s.cur_table))
    USING s.id, s.event_seq;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

CREATE FUNCTION conveyor.maint_tables_to_vacuum() RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    VALUES ('conveyor.streams'), ('conveyor.stream_ticks'), ('conveyor.stream_consumers'),
           ('conveyor.stream_retries'), ('conveyor.stream_delayed')
$$;

------------------------------------------------------------------------------------------
-- Observability
------------------------------------------------------------------------------------------

-- Per stream: events not yet consumed by its slowest consumer, age of the oldest of
-- them, throughput over the last two ticks, rotation state, dead letters.
CREATE FUNCTION conveyor.stream_stats() RETURNS TABLE (
    stream text, depth bigint, oldest_event_age interval, consumers integer, events_per_sec numeric,
    cur_table smallint, rotation_age interval, rotation_period interval, ticker_paused boolean,
    last_tick_time timestamptz, last_tick_id bigint, dead_letters bigint, pending_retries bigint,
    delayed bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT s.name,
           coalesce(latest.tick_event_seq - oldest.tick_event_seq, 0),
           now() - oldest.tick_time,
           (SELECT count(*)::integer FROM conveyor.stream_consumers c WHERE c.stream_id = s.id),
           (SELECT CASE WHEN t2.tick_time = t1.tick_time THEN 0
                        ELSE round((t2.tick_event_seq - t1.tick_event_seq)::numeric
                                   / extract(epoch FROM t2.tick_time - t1.tick_time), 3) END
              FROM conveyor.stream_ticks t2
              JOIN LATERAL (SELECT * FROM conveyor.stream_ticks x WHERE x.stream_id = s.id AND x.tick_id < t2.tick_id
                             ORDER BY x.tick_id DESC LIMIT 1) t1 ON true
             WHERE t2.stream_id = s.id AND t2.tick_id = latest.tick_id),
           s.cur_table, now() - s.switch_time, s.rotation_period, s.ticker_paused,
           latest.tick_time, latest.tick_id,
           (SELECT count(*) FROM conveyor.stream_dead_letters d WHERE d.stream_id = s.id),
           (SELECT count(*) FROM conveyor.stream_retries r WHERE r.stream_id = s.id),
           (SELECT count(*) FROM conveyor.stream_delayed d WHERE d.stream_id = s.id)
      FROM conveyor.streams s
      LEFT JOIN LATERAL (SELECT * FROM conveyor.stream_ticks t WHERE t.stream_id = s.id
                          ORDER BY t.tick_id DESC LIMIT 1) latest ON true
      LEFT JOIN LATERAL (SELECT t.* FROM conveyor.stream_consumers c
                           JOIN conveyor.stream_ticks t ON t.stream_id = c.stream_id AND t.tick_id = c.last_tick
                          WHERE c.stream_id = s.id ORDER BY t.tick_id LIMIT 1) oldest ON true
     ORDER BY s.name
$$;

-- Per consumer: how far behind the stream's latest tick it is, in time and in events.
CREATE FUNCTION conveyor.consumer_stats() RETURNS TABLE (
    stream text, consumer text, lag interval, pending_events bigint, last_seen timestamptz,
    batch_active boolean, batch_id bigint, batch_age interval)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT s.name, c.name, now() - t.tick_time,
           greatest(coalesce((SELECT max(x.tick_event_seq) FROM conveyor.stream_ticks x WHERE x.stream_id = s.id)
                             - t.tick_event_seq, 0), 0),
           c.active_at, c.batch_id IS NOT NULL, c.batch_id, now() - c.batch_started_at
      FROM conveyor.stream_consumers c
      JOIN conveyor.streams s ON s.id = c.stream_id
      LEFT JOIN conveyor.stream_ticks t ON t.stream_id = c.stream_id AND t.tick_id = c.last_tick
     ORDER BY s.name, c.name
$$;

-- Health checks, each 'ok', 'warning' or 'critical' with a detail: the ticker keeps up,
-- consumers lag less than the rotation period, rotation is not overdue, dead letters are
-- not accumulating.
CREATE FUNCTION conveyor.stream_health() RETURNS TABLE (stream text, check_name text, status text, detail text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT s.name, 'ticker',
           CASE WHEN st.last_tick_time IS NULL OR now() - st.last_tick_time > s.ticker_idle_period * 2 + interval '30 seconds'
                THEN 'critical' ELSE 'ok' END,
           'last tick ' || coalesce(to_char(now() - st.last_tick_time, 'HH24:MI:SS') || ' ago', 'never')
      FROM conveyor.streams s JOIN conveyor.stream_stats() st ON st.stream = s.name
     WHERE NOT s.ticker_paused
    UNION ALL
    SELECT cs.stream, 'consumer_lag:' || cs.consumer,
           CASE WHEN cs.lag > s.rotation_period THEN 'critical'
                WHEN cs.lag > s.rotation_period / 2 THEN 'warning' ELSE 'ok' END,
           cs.consumer || ' is ' || to_char(cs.lag, 'HH24:MI:SS') || ' behind (' || cs.pending_events || ' events)'
      FROM conveyor.consumer_stats() cs JOIN conveyor.streams s ON s.name = cs.stream
    UNION ALL
    SELECT s.name, 'rotation',
           CASE WHEN now() - s.switch_time > s.rotation_period * 2 THEN 'warning' ELSE 'ok' END,
           CASE WHEN s.switch_step2 IS NULL THEN 'rotating (step 2 pending)'
                ELSE 'last rotation ' || to_char(now() - s.switch_time, 'HH24:MI:SS') || ' ago' END
      FROM conveyor.streams s
    UNION ALL
    SELECT s.name, 'dead_letters',
           CASE WHEN count(d.id) FILTER (WHERE d.dead_at > now() - interval '1 hour') > 1000 THEN 'critical'
                WHEN count(d.id) FILTER (WHERE d.dead_at > now() - interval '1 hour') > 0 THEN 'warning'
                ELSE 'ok' END,
           count(d.id) FILTER (WHERE d.dead_at > now() - interval '1 hour') || ' new in the last hour, '
               || count(d.id) || ' in all'
      FROM conveyor.streams s LEFT JOIN conveyor.stream_dead_letters d ON d.stream_id = s.id
     GROUP BY s.name
$$;

CREATE FUNCTION conveyor.otel_metrics() RETURNS TABLE (metric_name text, metric_type text, value numeric, labels jsonb)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT 'conveyor.stream.depth', 'gauge', st.depth::numeric, jsonb_build_object('stream', st.stream)
      FROM conveyor.stream_stats() st
    UNION ALL
    SELECT 'conveyor.stream.oldest_event_age_seconds', 'gauge',
           coalesce(extract(epoch FROM st.oldest_event_age), 0)::numeric, jsonb_build_object('stream', st.stream)
      FROM conveyor.stream_stats() st
    UNION ALL
    SELECT 'conveyor.stream.throughput', 'gauge', coalesce(st.events_per_sec, 0), jsonb_build_object('stream', st.stream)
      FROM conveyor.stream_stats() st
    UNION ALL
    SELECT 'conveyor.stream.dead_lettered', 'gauge', st.dead_letters::numeric, jsonb_build_object('stream', st.stream)
      FROM conveyor.stream_stats() st
    UNION ALL
    SELECT 'conveyor.consumer.lag_seconds', 'gauge', coalesce(extract(epoch FROM cs.lag), 0)::numeric,
           jsonb_build_object('stream', cs.stream, 'consumer', cs.consumer)
      FROM conveyor.consumer_stats() cs
    UNION ALL
    SELECT 'conveyor.consumer.pending_events', 'gauge', cs.pending_events::numeric,
           jsonb_build_object('stream', cs.stream, 'consumer', cs.consumer)
      FROM conveyor.consumer_stats() cs
$$;

-- Open batches of a stream: who holds one, for how long, about how many events.
CREATE FUNCTION conveyor.stream_in_flight(stream_name text)
RETURNS TABLE (consumer text, batch_id bigint, batch_age interval, estimated_events bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams := conveyor._stream(stream_name);
BEGIN
    RETURN QUERY
    SELECT c.name, c.batch_id, now() - c.batch_started_at, t2.tick_event_seq - t1.tick_event_seq
      FROM conveyor.stream_consumers c
      JOIN conveyor.stream_ticks t1 ON t1.stream_id = c.stream_id AND t1.tick_id = c.last_tick
      JOIN conveyor.stream_ticks t2 ON t2.stream_id = c.stream_id AND t2.tick_id = c.next_tick
     WHERE c.stream_id = s.id AND c.batch_id IS NOT NULL
     ORDER BY c.name;
END $$;

-- Consumers whose position is older than the threshold.
CREATE FUNCTION conveyor.stuck_consumers(threshold interval DEFAULT '1 hour')
RETURNS TABLE (stream text, consumer text, lag interval, last_seen timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT cs.stream, cs.consumer, cs.lag, cs.last_seen FROM conveyor.consumer_stats() cs
     WHERE cs.lag > threshold ORDER BY cs.lag DESC
$$;

-- Events per time bucket over the last `period`, from the tick history (maint keeps
-- ticks for an hour, longer while a consumer needs them).
CREATE FUNCTION conveyor.stream_throughput(stream_name text, period interval DEFAULT '1 hour',
                                           bucket interval DEFAULT '1 minute')
RETURNS TABLE (bucket_start timestamptz, events bigint, events_per_sec numeric)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams := conveyor._stream(stream_name);
    width double precision := extract(epoch FROM bucket);
BEGIN
    IF width IS NULL OR width <= 0 THEN
        PERFORM conveyor._raise('CVV01', 'bucket must be a positive interval');
    END IF;
    RETURN QUERY
    WITH deltas AS (
        SELECT t.tick_time,
               t.tick_event_seq - lag(t.tick_event_seq) OVER (ORDER BY t.tick_id) AS n
          FROM conveyor.stream_ticks t
         WHERE t.stream_id = s.id
           -- from the last tick before the period, however long ago: the first tick
           -- inside it counts the events since that one
           AND t.tick_id >= coalesce((SELECT max(p.tick_id) FROM conveyor.stream_ticks p
                                       WHERE p.stream_id = s.id AND p.tick_time < now() - period), 0)
    )
    SELECT to_timestamp(floor(extract(epoch FROM d.tick_time) / width) * width) AS b,
           sum(greatest(d.n, 0))::bigint, round(sum(greatest(d.n, 0))::numeric / width::numeric, 3)
      FROM deltas d
     WHERE d.n IS NOT NULL AND d.tick_time >= now() - period
     GROUP BY b ORDER BY b;
END $$;

------------------------------------------------------------------------------------------
-- Server-less operation: pg_cron
------------------------------------------------------------------------------------------

-- Ticks every `every_ms` for about `seconds`, committing each tick: pg_cron 1.4 (Debian
-- 12's) schedules at most once a minute, so a minute job loops inside. A procedure with
-- neither SECURITY DEFINER nor SET, because those forbid COMMIT; it calls the definer
-- functions above.
CREATE PROCEDURE conveyor.ticker_loop(seconds integer DEFAULT 55, every_ms integer DEFAULT 1000)
LANGUAGE plpgsql AS $$
DECLARE
    deadline timestamptz := clock_timestamp() + make_interval(secs => least(greatest(seconds, 1), 3600));
BEGIN
    LOOP
        PERFORM conveyor.ticker();
        COMMIT;
        EXIT WHEN clock_timestamp() >= deadline;
        PERFORM pg_sleep(least(greatest(every_ms, 10), 60000) / 1000.0);
    END LOOP;
END $$;

-- maint() twice, committing in between, so a rotation begun by the first call completes.
CREATE PROCEDURE conveyor.maint_run()
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM conveyor.maint();
    COMMIT;
    PERFORM conveyor.maint();
END $$;

CREATE FUNCTION conveyor._cron_installed() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron')
$$;

-- Schedules the ticker, maintenance and vacuum of the hot tables as pg_cron jobs (in
-- this database). Says so clearly when pg_cron is not installed.
CREATE FUNCTION conveyor.start() RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    ids bigint[];
BEGIN
    IF NOT conveyor._cron_installed() THEN
        RETURN 'pg_cron is not installed in this database: run SELECT conveyor.ticker() every second and '
               || 'CALL conveyor.maint_run() every minute from another scheduler, or let conveyor serve do it';
    END IF;
    PERFORM conveyor.stop();
    -- cron.schedule runs jobs in the database pg_cron is installed in, which is this one
    -- (pg_cron lives only in cron.database_name); unlike schedule_in_database it is
    -- granted to non-superusers, as owners on managed services are.
    EXECUTE 'SELECT ARRAY[
               cron.schedule(''conveyor_ticker'', ''* * * * *'', ''CALL conveyor.ticker_loop(55, 1000)''),
               cron.schedule(''conveyor_maint'', ''* * * * *'', ''CALL conveyor.maint_run()''),
               cron.schedule(''conveyor_vacuum'', ''*/5 * * * *'',
                   ''VACUUM conveyor.streams, conveyor.stream_ticks, conveyor.stream_consumers, conveyor.stream_retries, conveyor.stream_delayed'')]'
       INTO ids;
    UPDATE conveyor.stream_cron SET ticker_job_id = ids[1], maint_job_id = ids[2], vacuum_job_id = ids[3];
    RETURN format('scheduled pg_cron jobs %s (ticker every second within a minute job, maintenance every minute, '
                  || 'vacuum every 5 minutes)', array_to_string(ids, ', '));
END $$;

CREATE FUNCTION conveyor.stop() RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    cfg conveyor.stream_cron;
    job bigint;
    n integer := 0;
BEGIN
    IF NOT conveyor._cron_installed() THEN
        RETURN 'pg_cron is not installed: nothing to stop';
    END IF;
    SELECT * INTO cfg FROM conveyor.stream_cron;
    FOREACH job IN ARRAY ARRAY[cfg.ticker_job_id, cfg.maint_job_id, cfg.vacuum_job_id] LOOP
        IF job IS NOT NULL THEN
            EXECUTE 'SELECT count(*) FROM cron.job WHERE jobid = $1' INTO n USING job;
            IF n > 0 THEN
                EXECUTE 'SELECT cron.unschedule($1)' USING job;
            END IF;
        END IF;
    END LOOP;
    UPDATE conveyor.stream_cron SET ticker_job_id = NULL, maint_job_id = NULL, vacuum_job_id = NULL;
    RETURN 'stopped';
END $$;

-- What runs the streams: pg_cron and its jobs with their last run, or that it is absent.
CREATE FUNCTION conveyor.status() RETURNS TABLE (component text, state text, detail text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    cfg conveyor.stream_cron;
    name text;
    job bigint;
BEGIN
    IF NOT conveyor._cron_installed() THEN
        component := 'pg_cron'; state := 'absent';
        detail := 'pg_cron is not installed; the ticker and maintenance must run elsewhere (conveyor serve does)';
        RETURN NEXT;
        RETURN;
    END IF;
    component := 'pg_cron'; state := 'installed';
    detail := 'version ' || (SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'pg_cron');
    RETURN NEXT;
    SELECT * INTO cfg FROM conveyor.stream_cron;
    FOR name, job IN VALUES ('ticker', cfg.ticker_job_id), ('maint', cfg.maint_job_id), ('vacuum', cfg.vacuum_job_id) LOOP
        component := name;
        IF job IS NULL THEN
            state := 'stopped'; detail := 'not scheduled (SELECT conveyor.start())';
        ELSE
            EXECUTE 'SELECT CASE WHEN j.active THEN ''scheduled'' ELSE ''inactive'' END,
                            ''job '' || j.jobid || '' '' || j.schedule || coalesce(
                              '', last run '' || r.status
                                || coalesce('' at '' || to_char(r.start_time, ''YYYY-MM-DD HH24:MI:SS''), '''')
                                || CASE WHEN r.status = ''failed'' THEN coalesce('': '' || r.return_message, '''') ELSE '''' END,
                              '', not run yet'')
                       FROM cron.job j
                       -- the latest run by id: a run that failed to connect has no start_time
                       LEFT JOIN LATERAL (SELECT * FROM cron.job_run_details d WHERE d.jobid = j.jobid
                                           ORDER BY d.runid DESC LIMIT 1) r ON true
                      WHERE j.jobid = $1'
               INTO state, detail USING job;
            IF state IS NULL THEN
                state := 'missing'; detail := 'job ' || job || ' no longer exists in cron.job';
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
END $$;

-- Removes Conveyor from this database: stops the pg_cron jobs and drops the schema with
-- everything in it (queues, streams, messages). The roles stay (they are cluster-wide).
CREATE FUNCTION conveyor.uninstall() RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    PERFORM conveyor.stop();
    DROP SCHEMA conveyor CASCADE;
    RETURN 'conveyor uninstalled';
END $$;

------------------------------------------------------------------------------------------
-- Roles
------------------------------------------------------------------------------------------

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA conveyor FROM PUBLIC;
REVOKE ALL ON ALL PROCEDURES IN SCHEMA conveyor FROM PUBLIC;

DO $$
BEGIN
    GRANT SELECT ON conveyor.streams, conveyor.stream_events, conveyor.stream_ticks, conveyor.stream_consumers,
                    conveyor.stream_retries, conveyor.stream_delayed, conveyor.stream_dead_letters,
                    conveyor.stream_info, conveyor.stream_cron TO conveyor_reader;
    GRANT EXECUTE ON FUNCTION
        conveyor.stream_get(text), conveyor.stream_list(), conveyor.stream_stats(), conveyor.consumer_stats(),
        conveyor.stream_health(), conveyor.otel_metrics(), conveyor.stream_in_flight(text),
        conveyor.stuck_consumers(interval), conveyor.stream_throughput(text, interval, interval),
        conveyor.stream_dead_letters(text, integer), conveyor.status(), conveyor.stream_current_table(text)
        TO conveyor_reader;
    GRANT EXECUTE ON FUNCTION
        conveyor.stream_send(text, text, text, text, text, text, text),
        conveyor.stream_send(text, jsonb, text, text, text, text, text),
        conveyor.stream_send_batch(text, text, text[]), conveyor.stream_send_batch(text, text, jsonb[]),
        conveyor.stream_send_json(text, jsonb), conveyor.stream_send_at(text, text, timestamptz, text, text, text, text, text),
        conveyor.stream_subscribe(text, text), conveyor.stream_unsubscribe(text, text),
        conveyor.stream_next_batch(text, text), conveyor.stream_next_batch_custom(text, text, interval, integer, interval),
        conveyor.stream_get_batch_events(bigint), conveyor.stream_get_batch_cursor(bigint, text, integer),
        conveyor.stream_finish_batch(bigint), conveyor.stream_event_retry(bigint, bigint, integer),
        conveyor.stream_batch_retry(bigint, integer), conveyor.stream_receive(text, text, integer),
        conveyor.stream_ack(bigint), conveyor.stream_nack(bigint, bigint, interval, text),
        conveyor.stream_of_batch(bigint),
        conveyor.stream_dead_letter(bigint, bigint, text)
        TO conveyor_writer;
    GRANT EXECUTE ON FUNCTION
        conveyor.stream_create(text, jsonb), conveyor.stream_drop(text), conveyor.stream_set_config(text, jsonb),
        conveyor.stream_pause(text), conveyor.stream_resume(text), conveyor.stream_force_tick(text),
        conveyor.stream_dead_letter_replay(bigint, text), conveyor.stream_dead_letter_replay_all(text),
        conveyor.stream_dead_letter_purge(text, interval), conveyor.ticker(), conveyor.maint(),
        conveyor.maint_tables_to_vacuum(), conveyor.start(), conveyor.stop(), conveyor.uninstall()
        TO conveyor_admin;
    GRANT EXECUTE ON PROCEDURE conveyor.ticker_loop(integer, integer), conveyor.maint_run() TO conveyor_admin;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: roles missing, grants skipped (%)', SQLERRM;
END $$;
