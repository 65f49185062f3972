-- Event streams (core/streams.py): batches, ticks, consumers, rotation, dead letters, stats.
--
-- Current definitions, re-applied whenever a file of this folder changes (docs/architecture.md,
-- "Where each SQL function's current definition lives"). Edit a function here; tables, types,
-- indexes, data and DROPs go in a new numbered migration.

CREATE OR REPLACE VIEW conveyor.stream_info AS
SELECT s.name, s.rotation_period, s.ticker_max_count, s.ticker_max_lag, s.ticker_idle_period,
       s.ticker_paused, s.max_retries, s.event_ttl, s.cur_table, s.switch_time, s.created_at,
       (SELECT count(*) FROM conveyor.stream_consumers c WHERE c.stream_id = s.id) AS consumers,
       'conveyor_stream_' || s.id AS channel
  FROM conveyor.streams s;

CREATE OR REPLACE FUNCTION conveyor._stream(stream_name text) RETURNS conveyor.streams
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

CREATE OR REPLACE FUNCTION conveyor._stream_table(s conveyor.streams, nr integer) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format('conveyor.%I', 'stream_' || s.id || '_' || nr)
$$;

CREATE OR REPLACE FUNCTION conveyor._consumer(s conveyor.streams, consumer_name text) RETURNS conveyor.stream_consumers
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

CREATE OR REPLACE FUNCTION conveyor._stream_options(s conveyor.streams, options jsonb) RETURNS conveyor.streams
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
CREATE OR REPLACE FUNCTION conveyor._stream_insert_one(stream_name text, type text, payload text, extra1 text,
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
CREATE OR REPLACE FUNCTION conveyor._stream_insert_array(stream_name text, type text, payloads text[]) RETURNS SETOF bigint
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

-- The tables a batch must read, and the snapshot bounds of its two ticks.
CREATE OR REPLACE FUNCTION conveyor._batch(batch_id bigint,
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
CREATE OR REPLACE FUNCTION conveyor._tables_since(s conveyor.streams, snap1 pg_snapshot) RETURNS text[]
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN s.switch_step2 IS NULL OR pg_snapshot_xmin(snap1) < s.switch_step2
                THEN ARRAY[conveyor._stream_table(s, s.cur_table), conveyor._stream_table(s, (s.cur_table + 2) % 3)]
                ELSE ARRAY[conveyor._stream_table(s, s.cur_table)] END
$$;

-- The condition (SQL text, values inlined) selecting the events committed after snap1 and
-- by snap2: a transaction id from snap1's xmax on that snap2 sees, or one still in
-- progress at snap1 that snap2 sees. Events for everyone, and with a consumer's id
-- (owner) that consumer's retries too.
CREATE OR REPLACE FUNCTION conveyor._between_snapshots(snap1 pg_snapshot, snap2 pg_snapshot, owner bigint) RETURNS text
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

CREATE OR REPLACE FUNCTION conveyor._batch_events(batch_id bigint, only_event bigint DEFAULT NULL)
RETURNS SETOF conveyor.stream_event
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY EXECUTE conveyor._batch_query(batch_id, only_event);
END $$;

-- Creates a stream (options: rotation_period, ticker_max_count, ticker_max_lag,
-- ticker_idle_period, max_retries, event_ttl), or returns it if it exists.
CREATE OR REPLACE FUNCTION conveyor.stream_create(stream_name text, options jsonb DEFAULT '{}')
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

CREATE OR REPLACE FUNCTION conveyor.stream_drop(stream_name text) RETURNS boolean
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

CREATE OR REPLACE FUNCTION conveyor.stream_set_config(stream_name text, options jsonb) RETURNS SETOF conveyor.stream_info
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

CREATE OR REPLACE FUNCTION conveyor.stream_pause(stream_name text) RETURNS SETOF conveyor.stream_info
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT * FROM conveyor.stream_set_config(stream_name, '{"ticker_paused": true}')
$$;

CREATE OR REPLACE FUNCTION conveyor.stream_resume(stream_name text) RETURNS SETOF conveyor.stream_info
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT * FROM conveyor.stream_set_config(stream_name, '{"ticker_paused": false}')
$$;

CREATE OR REPLACE FUNCTION conveyor.stream_get(stream_name text) RETURNS SETOF conveyor.stream_info
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    PERFORM conveyor._stream(stream_name);
    RETURN QUERY SELECT * FROM conveyor.stream_info WHERE name = stream_name;
END $$;

CREATE OR REPLACE FUNCTION conveyor.stream_list() RETURNS SETOF conveyor.stream_info
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT * FROM conveyor.stream_info ORDER BY name
$$;

-- Appends events given as a JSON array of {type, payload, extra1..4} (the server's path).
CREATE OR REPLACE FUNCTION conveyor.stream_send_json(stream_name text, events jsonb) RETURNS SETOF bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT conveyor._stream_insert(stream_name, events)
$$;

-- Text payloads are stored as given; a jsonb payload is validated (and normalised) first.
CREATE OR REPLACE FUNCTION conveyor.stream_send(stream_name text, payload text, type text DEFAULT 'default',
                                     extra1 text DEFAULT NULL, extra2 text DEFAULT NULL,
                                     extra3 text DEFAULT NULL, extra4 text DEFAULT NULL) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT conveyor._stream_insert_one(stream_name, type, payload, extra1, extra2, extra3, extra4)
$$;

CREATE OR REPLACE FUNCTION conveyor.stream_send(stream_name text, payload jsonb, type text DEFAULT 'default',
                                     extra1 text DEFAULT NULL, extra2 text DEFAULT NULL,
                                     extra3 text DEFAULT NULL, extra4 text DEFAULT NULL) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT conveyor.stream_send(stream_name, payload::text, type, extra1, extra2, extra3, extra4)
$$;

-- Appends many payloads of one type in one statement; ids in input order.
CREATE OR REPLACE FUNCTION conveyor.stream_send_batch(stream_name text, type text, payloads text[]) RETURNS SETOF bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT conveyor._stream_insert_array(stream_name, type, payloads)
$$;

CREATE OR REPLACE FUNCTION conveyor.stream_send_batch(stream_name text, type text, payloads jsonb[]) RETURNS SETOF bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT conveyor.stream_send_batch(stream_name, type, payloads::text[])
$$;

-- The table producers may INSERT or COPY into directly (ev_id from nextval of the
-- stream's sequence, named in event_seq). Take a transaction id first
-- (pg_current_xact_id()) and look this up in the same transaction as the insert.
CREATE OR REPLACE FUNCTION conveyor.stream_current_table(stream_name text, OUT table_name text, OUT event_seq regclass)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams := conveyor._stream(stream_name);
BEGIN
    table_name := conveyor._stream_table(s, s.cur_table);
    event_seq := s.event_seq;
END $$;

-- Ticks every stream that needs it: when ticker_max_count events arrived, when events
-- arrived and ticker_max_lag passed, or when ticker_idle_period passed anyway. Each tick
-- is announced on the channel conveyor_stream (payload: the stream's name; servers and
-- clients listen there) and on the stream's own channel conveyor_stream_<id> (payload:
-- the tick id; stream_info.channel names it). Returns how many ticks were made.
CREATE OR REPLACE FUNCTION conveyor.ticker() RETURNS integer
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
CREATE OR REPLACE FUNCTION conveyor.stream_force_tick(stream_name text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    PERFORM conveyor._tick(conveyor._stream(stream_name), true);
    RETURN (SELECT max(tick_id) FROM conveyor.stream_ticks t
             WHERE t.stream_id = (SELECT id FROM conveyor.streams WHERE name = stream_name));
END $$;

-- Whether an event that tick t did not see has committed since, though the sequence had
-- given its id before t (its transaction was still in progress then). The sequence alone
-- would call the stream idle and leave such an event waiting for the idle period's tick,
-- up to a minute. A transaction t's snapshot does not see has an id in its in-progress
-- list or from its xmax on; with no event id newer than t's (the caller's case), the
-- events of such transactions are exactly these. A tick made while no other transaction
-- held an id (its snapshot's xmin is the ticker's own transaction id, the row's xmin)
-- hid nothing, and is not searched: an idle database pays nothing.
CREATE OR REPLACE FUNCTION conveyor._committed_after_tick(s conveyor.streams, t conveyor.stream_ticks) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    tbl text;
    found_one boolean;
BEGIN
    IF EXISTS (SELECT 1 FROM conveyor.stream_ticks x WHERE x.stream_id = t.stream_id AND x.tick_id = t.tick_id
                  AND x.xmin = pg_snapshot_xmin(t.tick_snapshot)::xid) THEN
        RETURN false;
    END IF;
    FOREACH tbl IN ARRAY conveyor._tables_since(s, t.tick_snapshot) LOOP
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s WHERE ev_txid >= pg_snapshot_xmax($1) OR ev_txid = ANY ($2))', tbl)
           INTO found_one USING t.tick_snapshot, ARRAY(SELECT pg_snapshot_xip(t.tick_snapshot));
        IF found_one THEN
            RETURN true;
        END IF;
    END LOOP;
    RETURN false;
END $$;

CREATE OR REPLACE FUNCTION conveyor._tick(s conveyor.streams, force boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    last conveyor.stream_ticks;
    seq bigint := coalesce(pg_sequence_last_value(s.event_seq), 0);
    pending bigint;
    tick bigint;
BEGIN
    SELECT * INTO last FROM conveyor.stream_ticks t WHERE t.stream_id = s.id ORDER BY t.tick_id DESC LIMIT 1;
    pending := seq - coalesce(last.tick_event_seq, 0);
    IF pending = 0 AND NOT force AND last.tick_id IS NOT NULL
       AND now() - last.tick_time >= s.ticker_max_lag AND now() - last.tick_time < s.ticker_idle_period
       AND conveyor._committed_after_tick(s, last) THEN
        pending := 1;
    END IF;
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

-- Subscribes a consumer from now on (events after the stream's latest tick).
CREATE OR REPLACE FUNCTION conveyor.stream_subscribe(stream_name text, consumer_name text) RETURNS boolean
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

CREATE OR REPLACE FUNCTION conveyor.stream_unsubscribe(stream_name text, consumer_name text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams := conveyor._stream(stream_name);
BEGIN
    DELETE FROM conveyor.stream_consumers WHERE stream_id = s.id AND name = consumer_name;
    RETURN FOUND;
END $$;

CREATE OR REPLACE FUNCTION conveyor.stream_next_batch(stream_name text, consumer_name text) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT conveyor.stream_next_batch_custom(stream_name, consumer_name, NULL, NULL, NULL)
$$;

CREATE OR REPLACE FUNCTION conveyor.stream_get_batch_events(batch_id bigint) RETURNS SETOF conveyor.stream_event
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT * FROM conveyor._batch_events(batch_id)
$$;

-- For huge batches: returns the first quick_limit events and leaves the rest in a cursor
-- named cursor_name (FETCH from it in the same transaction).
CREATE OR REPLACE FUNCTION conveyor.stream_get_batch_cursor(batch_id bigint, cursor_name text, quick_limit integer DEFAULT 1000)
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
CREATE OR REPLACE FUNCTION conveyor.stream_of_batch(batch_id bigint) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT s.name FROM conveyor.stream_consumers c JOIN conveyor.streams s ON s.id = c.stream_id
     WHERE c.batch_id = stream_of_batch.batch_id
$$;

-- Fails one event of an open batch: retried for this consumer after retry_after, or,
-- once it has been retried max_retries times, moved to the dead letters with the reason.
-- Returns 'retry' or 'dead'.
CREATE OR REPLACE FUNCTION conveyor.stream_nack(batch_id bigint, event_id bigint, retry_after interval DEFAULT '60 seconds',
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
CREATE OR REPLACE FUNCTION conveyor.stream_dead_letter(batch_id bigint, event_id bigint, reason text DEFAULT NULL)
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

CREATE OR REPLACE FUNCTION conveyor.stream_dead_letters(stream_name text, max_rows integer DEFAULT 100)
RETURNS SETOF conveyor.stream_dead_letters
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams := conveyor._stream(stream_name);
BEGIN
    RETURN QUERY SELECT * FROM conveyor.stream_dead_letters d WHERE d.stream_id = s.id
                  ORDER BY d.id LIMIT least(greatest(max_rows, 1), 10000);
END $$;

CREATE OR REPLACE FUNCTION conveyor.stream_dead_letter_purge(stream_name text, older_than interval DEFAULT '30 days')
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

-- One round of maintenance for every stream: finish a rotation begun by an earlier call
-- (step 2), begin one when due and no consumer still needs the oldest table (step 1),
-- move due retries and delayed events into the streams, drop ticks nobody needs.
-- Returns what it did. VACUUM cannot run inside a function: maint_tables_to_vacuum()
-- lists the small, hot tables for the caller to vacuum.
CREATE OR REPLACE FUNCTION conveyor.maint() RETURNS TABLE (stream text, operation text, count bigint)
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
CREATE OR REPLACE FUNCTION conveyor._rotate_step1(s conveyor.streams) RETURNS boolean
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

CREATE OR REPLACE FUNCTION conveyor.maint_tables_to_vacuum() RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    VALUES ('conveyor.streams'), ('conveyor.stream_ticks'), ('conveyor.stream_consumers'),
           ('conveyor.stream_retries'), ('conveyor.stream_delayed')
$$;

-- Per stream: events not yet consumed by its slowest consumer, age of the oldest of
-- them, throughput over the last two ticks, rotation state, dead letters.
CREATE OR REPLACE FUNCTION conveyor.stream_stats() RETURNS TABLE (
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
CREATE OR REPLACE FUNCTION conveyor.consumer_stats() RETURNS TABLE (
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
CREATE OR REPLACE FUNCTION conveyor.stream_health() RETURNS TABLE (stream text, check_name text, status text, detail text)
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

CREATE OR REPLACE FUNCTION conveyor.otel_metrics() RETURNS TABLE (metric_name text, metric_type text, value numeric, labels jsonb)
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
CREATE OR REPLACE FUNCTION conveyor.stream_in_flight(stream_name text)
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
CREATE OR REPLACE FUNCTION conveyor.stuck_consumers(threshold interval DEFAULT '1 hour')
RETURNS TABLE (stream text, consumer text, lag interval, last_seen timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT cs.stream, cs.consumer, cs.lag, cs.last_seen FROM conveyor.consumer_stats() cs
     WHERE cs.lag > threshold ORDER BY cs.lag DESC
$$;

-- Events per time bucket over the last `period`, from the tick history (maint keeps
-- ticks for an hour, longer while a consumer needs them).
CREATE OR REPLACE FUNCTION conveyor.stream_throughput(stream_name text, period interval DEFAULT '1 hour',
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

-- Ticks every `every_ms` for about `seconds`, committing each tick: pg_cron 1.4 (Debian
-- 12's) schedules at most once a minute, so a minute job loops inside. A procedure with
-- neither SECURITY DEFINER nor SET, because those forbid COMMIT; it calls the definer
-- functions above.
CREATE OR REPLACE PROCEDURE conveyor.ticker_loop(seconds integer DEFAULT 55, every_ms integer DEFAULT 1000)
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
CREATE OR REPLACE PROCEDURE conveyor.maint_run()
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM conveyor.maint();
    COMMIT;
    PERFORM conveyor.maint();
END $$;

CREATE OR REPLACE FUNCTION conveyor._cron_installed() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron')
$$;

-- Schedules the ticker, maintenance and vacuum of the hot tables as pg_cron jobs (in
-- this database). Says so clearly when pg_cron is not installed.
CREATE OR REPLACE FUNCTION conveyor.start() RETURNS text
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

CREATE OR REPLACE FUNCTION conveyor.stop() RETURNS text
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
CREATE OR REPLACE FUNCTION conveyor.status() RETURNS TABLE (component text, state text, detail text)
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
CREATE OR REPLACE FUNCTION conveyor.uninstall() RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    PERFORM conveyor.stop();
    DROP SCHEMA conveyor CASCADE;
    RETURN 'conveyor uninstalled';
END $$;

-- The consumer's open (or next) batch, max_return events at a time: the first page, or
-- with after_event the events after that id. Empty batches are finished on the way.
CREATE OR REPLACE FUNCTION conveyor.stream_receive(stream_name text, consumer_name text, max_return integer DEFAULT 1000,
                                        after_event bigint DEFAULT NULL)
RETURNS SETOF conveyor.stream_event
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    batch bigint;
    page conveyor.stream_event[];
    more boolean;
BEGIN
    IF max_return IS NULL OR max_return < 1 THEN
        PERFORM conveyor._raise('CVV01', format('max_return must be at least 1, got %s', max_return));
    END IF;
    FOR i IN 1 .. 1000 LOOP
        batch := conveyor.stream_next_batch(stream_name, consumer_name);
        IF batch IS NULL THEN
            RETURN;
        END IF;
        SELECT array_agg(e ORDER BY e.id) INTO page
          FROM (SELECT * FROM conveyor._batch_events(batch) e
                 WHERE after_event IS NULL OR e.id > after_event
                 ORDER BY e.id LIMIT max_return::bigint + 1) e;
        IF page IS NULL AND after_event IS NULL THEN
            PERFORM conveyor.stream_finish_batch(batch);  -- an empty batch: on to the next one
            CONTINUE;
        END IF;
        more := coalesce(cardinality(page), 0) > max_return;
        page := page[1:max_return];
        UPDATE conveyor.stream_consumers c
           SET batch_read_through = greatest(c.batch_read_through, page[cardinality(page)].id),
               batch_read_all = coalesce(c.batch_read_all, false) OR NOT more
         WHERE c.batch_id = batch;
        RETURN QUERY SELECT * FROM unnest(page);
        RETURN;
    END LOOP;
END $$;

-- Finishes a batch received with stream_receive; refused (CVS05) while some of its events
-- were never handed out. stream_finish_batch finishes any batch, read or not.
CREATE OR REPLACE FUNCTION conveyor.stream_ack(batch_id bigint) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    c conveyor.stream_consumers;
BEGIN
    SELECT * INTO c FROM conveyor.stream_consumers x WHERE x.batch_id = stream_ack.batch_id FOR UPDATE;
    IF FOUND AND c.batch_read_all IS FALSE THEN
        PERFORM conveyor._raise('CVS05', format(
            'batch %s was received only in part (through event %s): receive the rest (after_event %s) '
            'before acknowledging it, or finish it unread with stream_finish_batch', batch_id,
            c.batch_read_through, c.batch_read_through));
    END IF;
    RETURN conveyor.stream_finish_batch(batch_id);
END $$;

-- Whether a batch has been handed out whole by stream_receive (NULL: not read that way).
CREATE OR REPLACE FUNCTION conveyor.stream_batch_read_all(batch_id bigint) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT c.batch_read_all FROM conveyor.stream_consumers c WHERE c.batch_id = stream_batch_read_all.batch_id
$$;

-- The JSON path: {type, payload, extra1..4, traceparent} per event.
CREATE OR REPLACE FUNCTION conveyor._stream_insert(stream_name text, events jsonb) RETURNS SETOF bigint
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
        'INSERT INTO %s (ev_id, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4, ev_traceparent)
         SELECT nextval($1), coalesce(x.type, ''default''), x.payload, x.extra1, x.extra2, x.extra3, x.extra4,
                x.traceparent
           FROM ROWS FROM (jsonb_to_recordset($2) AS (type text, payload text, extra1 text, extra2 text,
                                                     extra3 text, extra4 text, traceparent text))
                WITH ORDINALITY AS x(type, payload, extra1, extra2, extra3, extra4, traceparent, ord)
          ORDER BY x.ord
         RETURNING ev_id', conveyor._stream_table(s, s.cur_table))
    USING s.event_seq, events;
END $$;

-- Delivers at a later time: returns the id of the scheduled entry (not an event id; the
-- event gets its id when maint() moves it into the stream), or the event id if due now.
CREATE OR REPLACE FUNCTION conveyor.stream_send_at(stream_name text, payload text, deliver_at timestamptz,
                                        type text DEFAULT 'default', extra1 text DEFAULT NULL,
                                        extra2 text DEFAULT NULL, extra3 text DEFAULT NULL,
                                        extra4 text DEFAULT NULL, traceparent text DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams := conveyor._stream(stream_name);
    entry bigint;
BEGIN
    IF deliver_at IS NULL OR deliver_at <= now() THEN
        SELECT conveyor._stream_insert(stream_name, jsonb_build_array(jsonb_build_object(
                   'type', type, 'payload', payload, 'extra1', extra1, 'extra2', extra2, 'extra3', extra3,
                   'extra4', extra4, 'traceparent', traceparent)))
          INTO entry;
        RETURN entry;
    END IF;
    INSERT INTO conveyor.stream_delayed (stream_id, deliver_at, ev_type, ev_data, ev_extra1, ev_extra2,
                                         ev_extra3, ev_extra4, ev_traceparent)
    VALUES (s.id, deliver_at, coalesce(type, 'default'), payload, extra1, extra2, extra3, extra4, traceparent)
    RETURNING id INTO entry;
    RETURN entry;
END $$;

CREATE OR REPLACE FUNCTION conveyor._dead_letter_event(s conveyor.streams, consumer text, ev conveyor.stream_event,
                                                       reason text) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO conveyor.stream_dead_letters (stream_id, consumer, reason, ev_id, ev_time, ev_retry, ev_type,
                                              ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4, ev_traceparent)
    VALUES (s.id, consumer, reason, ev.id, ev.created_at, ev.retry_count, ev.type, ev.payload,
            ev.extra1, ev.extra2, ev.extra3, ev.extra4, ev.traceparent)
$$;

-- A dead letter goes back as a new event with its payload, extras and trace.
CREATE OR REPLACE FUNCTION conveyor.stream_dead_letter_replay(dead_letter_id bigint, stream_name text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    d conveyor.stream_dead_letters;
    s conveyor.streams;
    event_id bigint;
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
    SELECT conveyor._stream_insert(s.name, jsonb_build_array(jsonb_build_object(
               'type', d.ev_type, 'payload', d.ev_data, 'extra1', d.ev_extra1, 'extra2', d.ev_extra2,
               'extra3', d.ev_extra3, 'extra4', d.ev_extra4, 'traceparent', d.ev_traceparent)))
      INTO event_id;
    RETURN event_id;
END $$;

CREATE OR REPLACE FUNCTION conveyor.stream_dead_letter_replay_all(stream_name text) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams := conveyor._stream(stream_name);
    events jsonb;
    n integer;
BEGIN
    WITH gone AS (DELETE FROM conveyor.stream_dead_letters d WHERE d.stream_id = s.id RETURNING d.*)
    SELECT jsonb_agg(jsonb_build_object('type', ev_type, 'payload', ev_data, 'extra1', ev_extra1,
                                        'extra2', ev_extra2, 'extra3', ev_extra3, 'extra4', ev_extra4,
                                        'traceparent', ev_traceparent) ORDER BY id),
           count(*)
      INTO events, n FROM gone;
    IF n > 0 THEN
        PERFORM conveyor._stream_insert(stream_name, events);
    END IF;
    RETURN n;
END $$;

CREATE OR REPLACE FUNCTION conveyor._move_retries(s conveyor.streams) RETURNS bigint
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
         INSERT INTO %s (ev_id, ev_time, ev_owner, ev_retry, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3,
                         ev_extra4, ev_traceparent)
         SELECT ev_id, ev_time, consumer_id, ev_retry, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4,
                ev_traceparent
           FROM due ORDER BY ev_id', conveyor._stream_table(s, s.cur_table))
    USING s.id;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

CREATE OR REPLACE FUNCTION conveyor._move_delayed(s conveyor.streams) RETURNS bigint
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
         INSERT INTO %s (ev_id, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4, ev_traceparent)
         SELECT nextval($2), ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4, ev_traceparent
           FROM due ORDER BY deliver_at, id', conveyor._stream_table(s, s.cur_table))
    USING s.id, s.event_seq;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- 0013's batch query: retries of the batch's consumer, or of the consumer it is a member of.
CREATE OR REPLACE FUNCTION conveyor._batch_query(batch_id bigint, only_event bigint DEFAULT NULL) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    b record := conveyor._batch(batch_id);
    tbl text;
    sql text := '';
BEGIN
    FOREACH tbl IN ARRAY b.tables LOOP
        sql := sql || CASE WHEN sql = '' THEN '' ELSE ' UNION ALL ' END || format(
            'SELECT ev_id, %s::bigint, ev_type, ev_data, ev_retry, ev_time, ev_extra1, ev_extra2, ev_extra3, ev_extra4,
                    ev_traceparent
               FROM %s WHERE %s',
            batch_id, tbl, conveyor._between_snapshots(b.snap1, b.snap2, coalesce((b.c).coop_of, (b.c).id)));
        IF only_event IS NOT NULL THEN
            sql := sql || format(' AND ev_id = %s', only_event);
        END IF;
        IF (b.s).event_ttl IS NOT NULL THEN
            sql := sql || format(' AND ev_time >= %L::timestamptz', now() - (b.s).event_ttl);
        END IF;
    END LOOP;
    RETURN sql || ' ORDER BY 1';
END $$;

-- 0013's retries, owned by the consumer a member belongs to.
CREATE OR REPLACE FUNCTION conveyor.stream_event_retry(batch_id bigint, event_id bigint, retry_seconds integer)
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
                                         ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4, ev_traceparent)
    VALUES ((b.s).id, coalesce((b.c).coop_of, (b.c).id), now() + make_interval(secs => greatest(retry_seconds, 0)),
            ev.id, ev.created_at, coalesce(ev.retry_count, 0) + 1, ev.type, ev.payload, ev.extra1, ev.extra2,
            ev.extra3, ev.extra4, ev.traceparent);
    RETURN 1;
END $$;

CREATE OR REPLACE FUNCTION conveyor.stream_batch_retry(batch_id bigint, retry_seconds integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    b record := conveyor._batch(batch_id);
    n integer;
BEGIN
    INSERT INTO conveyor.stream_retries (stream_id, consumer_id, retry_at, ev_id, ev_time, ev_retry, ev_type,
                                         ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4, ev_traceparent)
    SELECT (b.s).id, coalesce((b.c).coop_of, (b.c).id), now() + make_interval(secs => greatest(retry_seconds, 0)),
           e.id, e.created_at, coalesce(e.retry_count, 0) + 1, e.type, e.payload, e.extra1, e.extra2, e.extra3,
           e.extra4, e.traceparent
      FROM conveyor._batch_events(batch_id) e;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- 0007's finish; a member goes back to idle at its consumer's cursor.
CREATE OR REPLACE FUNCTION conveyor.stream_finish_batch(batch_id bigint) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    UPDATE conveyor.stream_consumers c
       SET last_tick = CASE WHEN c.coop_of IS NULL THEN c.next_tick
                            ELSE (SELECT m.last_tick FROM conveyor.stream_consumers m WHERE m.id = c.coop_of) END,
           next_tick = NULL, batch_id = NULL, batch_started_at = NULL,
           batch_read_through = NULL, batch_read_all = NULL, active_at = now()
     WHERE c.batch_id = stream_finish_batch.batch_id;
    IF NOT FOUND THEN
        PERFORM conveyor._raise('CVS03', format('batch %s does not exist or is finished', batch_id));
    END IF;
    RETURN 1;
END $$;

-- The tick that ends a batch starting at `last` (0003's rule): the next one, or with
-- min_lag / min_count / min_interval the latest that is old enough among those that make
-- the batch big enough.
CREATE OR REPLACE FUNCTION conveyor._batch_end(s conveyor.streams, last_tick bigint, min_lag interval, min_count integer,
                                    min_interval interval) RETURNS conveyor.stream_ticks
LANGUAGE plpgsql STABLE AS $$
DECLARE
    last conveyor.stream_ticks;
    target conveyor.stream_ticks;
BEGIN
    SELECT * INTO last FROM conveyor.stream_ticks t WHERE t.stream_id = s.id AND t.tick_id = last_tick;
    IF min_lag IS NULL AND min_count IS NULL AND min_interval IS NULL THEN
        SELECT * INTO target FROM conveyor.stream_ticks t
         WHERE t.stream_id = s.id AND t.tick_id > last_tick ORDER BY t.tick_id LIMIT 1;
    ELSE
        SELECT * INTO target FROM conveyor.stream_ticks t
         WHERE t.stream_id = s.id AND t.tick_id > last_tick
           AND (min_lag IS NULL OR t.tick_time <= now() - min_lag)
           AND ((min_count IS NULL AND min_interval IS NULL)
                OR (min_count IS NOT NULL AND t.tick_event_seq - last.tick_event_seq >= min_count)
                OR (min_interval IS NOT NULL AND t.tick_time - last.tick_time >= min_interval))
         ORDER BY t.tick_id DESC LIMIT 1;
    END IF;
    RETURN target;
END $$;

-- 0003's next batch, refused for a consumer with members and for a member.
CREATE OR REPLACE FUNCTION conveyor.stream_next_batch_custom(stream_name text, consumer_name text,
                                                             min_lag interval DEFAULT NULL, min_count integer DEFAULT NULL,
                                                             min_interval interval DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams := conveyor._stream(stream_name);
    c conveyor.stream_consumers := conveyor._consumer(s, consumer_name);
    target conveyor.stream_ticks;
    new_batch bigint;
BEGIN
    IF c.batch_id IS NOT NULL THEN
        RETURN c.batch_id;
    END IF;
    IF c.coop_of IS NOT NULL OR EXISTS (SELECT 1 FROM conveyor.stream_consumers m WHERE m.coop_of = c.id) THEN
        PERFORM conveyor._raise('CVS06', format(
            'consumer %s of stream %s is cooperative: its batches are taken by its members (stream_next_batch_coop)',
            quote_literal(c.name), quote_literal(s.name)));
    END IF;
    target := conveyor._batch_end(s, c.last_tick, min_lag, min_count, min_interval);
    IF target.tick_id IS NULL THEN
        RETURN NULL;  -- nothing new: a read, as PgQ's next_batch (an idle consumer's polls write nothing)
    END IF;
    new_batch := nextval('conveyor.stream_batch_seq');
    -- the consumer is active when it takes a batch and when it finishes one (PgQ's sub_active).
    -- Only while it has none: a concurrent call for the same consumer that took one first
    -- (its UPDATE holds the row until it commits) wins, and this call returns that batch,
    -- as it would had it come a moment later. (PgQ's next_batch overwrites it: the two
    -- callers would read one range under two batch ids, the first of them void.)
    UPDATE conveyor.stream_consumers
       SET batch_id = new_batch, next_tick = target.tick_id, batch_started_at = now(), active_at = now()
     WHERE id = c.id AND batch_id IS NULL;
    IF NOT FOUND THEN
        SELECT batch_id INTO new_batch FROM conveyor.stream_consumers WHERE id = c.id;
    END IF;
    RETURN new_batch;
END $$;

-- Makes member_name (<consumer>.<member>) a member of consumer_name, which is subscribed
-- first (from the latest tick) when it is not. True when the member is new. A consumer
-- with an open batch of its own cannot take members, nor can a member or a name in use.
CREATE OR REPLACE FUNCTION conveyor.stream_coop_join(stream_name text, consumer_name text, member_name text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams := conveyor._stream(stream_name);
    main conveyor.stream_consumers;
    member conveyor.stream_consumers;
BEGIN
    PERFORM conveyor.stream_subscribe(stream_name, consumer_name);
    SELECT * INTO main FROM conveyor.stream_consumers c WHERE c.stream_id = s.id AND c.name = consumer_name FOR UPDATE;
    IF main.coop_of IS NOT NULL OR main.batch_id IS NOT NULL THEN
        PERFORM conveyor._raise('CVS06', format('consumer %s of stream %s %s', quote_literal(main.name), quote_literal(s.name),
            CASE WHEN main.coop_of IS NOT NULL THEN 'is a member itself' ELSE 'has an open batch: finish it first' END));
    END IF;
    SELECT * INTO member FROM conveyor.stream_consumers c WHERE c.stream_id = s.id AND c.name = member_name FOR UPDATE;
    IF FOUND THEN
        IF member.coop_of IS DISTINCT FROM main.id THEN
            PERFORM conveyor._raise('CVS06', format('consumer %s of stream %s is not a member of %s',
                                                    quote_literal(member.name), quote_literal(s.name),
                                                    quote_literal(main.name)));
        END IF;
        UPDATE conveyor.stream_consumers SET active_at = now() WHERE id = member.id;
        RETURN false;
    END IF;
    IF member_name IS NULL OR member_name !~ '^[A-Za-z0-9_.:-]{1,80}$' THEN
        PERFORM conveyor._raise('CVV01', format(
            'invalid consumer name %s: use 1 to 80 characters of A-Z, a-z, 0-9 and _ . : -',
            coalesce(quote_literal(left(member_name, 100)), 'NULL')));
    END IF;
    INSERT INTO conveyor.stream_consumers (stream_id, name, last_tick, coop_of)
    VALUES (s.id, member_name, main.last_tick, main.id);
    RETURN true;
END $$;

-- A member's batch: the one it holds; else, with dead_interval, the batch of a member
-- silent (active_at) for longer, under a new id (the old one is void); else the range
-- after its consumer's cursor, which moves past it at once (NULL: no tick after it yet).
-- The consumer's row is locked meanwhile, so members take ranges one at a time.
CREATE OR REPLACE FUNCTION conveyor.stream_next_batch_coop(stream_name text, consumer_name text, member_name text,
                                                dead_interval interval DEFAULT NULL, min_lag interval DEFAULT NULL,
                                                min_count integer DEFAULT NULL, min_interval interval DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams := conveyor._stream(stream_name);
    main conveyor.stream_consumers;
    member conveyor.stream_consumers;
    victim conveyor.stream_consumers;
    target conveyor.stream_ticks;
    new_batch bigint;
BEGIN
    SELECT * INTO main FROM conveyor.stream_consumers c WHERE c.stream_id = s.id AND c.name = consumer_name FOR UPDATE;
    SELECT * INTO member FROM conveyor.stream_consumers c
     WHERE c.stream_id = s.id AND c.name = member_name AND c.coop_of = main.id FOR UPDATE;
    IF member.id IS NULL THEN
        PERFORM conveyor._raise('CVS02', format('consumer %s is not a member of consumer %s of stream %s',
                                                coalesce(quote_literal(left(member_name, 100)), 'NULL'),
                                                coalesce(quote_literal(left(consumer_name, 100)), 'NULL'),
                                                quote_literal(s.name)));
    END IF;
    IF member.batch_id IS NOT NULL THEN
        UPDATE conveyor.stream_consumers SET active_at = now() WHERE id = member.id;
        RETURN member.batch_id;
    END IF;
    IF dead_interval IS NOT NULL THEN
        SELECT * INTO victim FROM conveyor.stream_consumers c
         WHERE c.coop_of = main.id AND c.id <> member.id AND c.batch_id IS NOT NULL
           AND c.active_at < now() - dead_interval
         ORDER BY c.active_at, c.id
         LIMIT 1 FOR UPDATE SKIP LOCKED;
        IF FOUND THEN
            new_batch := nextval('conveyor.stream_batch_seq');
            UPDATE conveyor.stream_consumers
               SET batch_id = NULL, next_tick = NULL, batch_started_at = NULL, batch_read_through = NULL,
                   batch_read_all = NULL, last_tick = main.last_tick
             WHERE id = victim.id;
            UPDATE conveyor.stream_consumers
               SET last_tick = victim.last_tick, next_tick = victim.next_tick, batch_id = new_batch,
                   batch_started_at = now(), active_at = now()
             WHERE id = member.id;
            RETURN new_batch;
        END IF;
    END IF;
    target := conveyor._batch_end(s, main.last_tick, min_lag, min_count, min_interval);
    IF target.tick_id IS NULL THEN
        RETURN NULL;
    END IF;
    new_batch := nextval('conveyor.stream_batch_seq');
    UPDATE conveyor.stream_consumers
       SET last_tick = main.last_tick, next_tick = target.tick_id, batch_id = new_batch,
           batch_started_at = now(), active_at = now()
     WHERE id = member.id;
    -- the cursor moves on; idle members stay at it
    UPDATE conveyor.stream_consumers c SET last_tick = target.tick_id
     WHERE c.id = main.id OR (c.coop_of = main.id AND c.batch_id IS NULL);
    UPDATE conveyor.stream_consumers SET active_at = now() WHERE id = main.id;
    RETURN new_batch;
END $$;

DO $$
BEGIN
    GRANT EXECUTE ON FUNCTION conveyor.stream_coop_join(text, text, text),
                              conveyor.stream_next_batch_coop(text, text, text, interval, interval, integer, interval)
        TO conveyor_writer;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: roles missing, grants skipped (%)', SQLERRM;
END $$;

REVOKE ALL ON ALL ROUTINES IN SCHEMA conveyor FROM PUBLIC;
