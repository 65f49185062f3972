-- Conveyor 0013: stream events carry the trace they were appended under (issue 16).
--
-- A queue message keeps its sender's W3C traceparent with its system attributes; a
-- stream event had nowhere to keep one (ev_extra1..4 belong to the producer, as in PgQ).
-- Every table an event passes through gets `ev_traceparent`: the stream's event tables
-- (added on conveyor.stream_events, so every stream's inherited tables get it), the
-- retries, the delayed events and the dead letters; consumers read it as
-- `conveyor.stream_event.traceparent`. It follows the event wherever the engine moves it:
-- a retry, a delayed event coming due, a dead letter and its replay keep it, so the
-- consumer that finally handles an event continues its producer's trace.
--
-- Producers give it per event in the JSON path (`stream_send_json`, key "traceparent":
-- the server stamps the request's trace there, the Python client the caller's current
-- span) or to `stream_send_at` (new last argument). The column is nullable without a
-- default: adding it rewrites nothing.

ALTER TABLE conveyor.stream_events ADD COLUMN ev_traceparent text;
ALTER TABLE conveyor.stream_retries ADD COLUMN ev_traceparent text;
ALTER TABLE conveyor.stream_delayed ADD COLUMN ev_traceparent text;
ALTER TABLE conveyor.stream_dead_letters ADD COLUMN ev_traceparent text;
ALTER TYPE conveyor.stream_event ADD ATTRIBUTE traceparent text;

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

DROP FUNCTION conveyor.stream_send_at(text, text, timestamptz, text, text, text, text, text);

-- Delivers at a later time: returns the id of the scheduled entry (not an event id; the
-- event gets its id when maint() moves it into the stream), or the event id if due now.
CREATE FUNCTION conveyor.stream_send_at(stream_name text, payload text, deliver_at timestamptz,
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
    VALUES ((b.s).id, (b.c).id, now() + make_interval(secs => greatest(retry_seconds, 0)), ev.id, ev.created_at,
            coalesce(ev.retry_count, 0) + 1, ev.type, ev.payload, ev.extra1, ev.extra2, ev.extra3, ev.extra4,
            ev.traceparent);
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
    SELECT (b.s).id, (b.c).id, now() + make_interval(secs => greatest(retry_seconds, 0)), e.id, e.created_at,
           coalesce(e.retry_count, 0) + 1, e.type, e.payload, e.extra1, e.extra2, e.extra3, e.extra4, e.traceparent
      FROM conveyor._batch_events(batch_id) e;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
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

REVOKE ALL ON FUNCTION conveyor.stream_send_at(text, text, timestamptz, text, text, text, text, text, text) FROM PUBLIC;

DO $$
BEGIN
    GRANT EXECUTE ON FUNCTION conveyor.stream_send_at(text, text, timestamptz, text, text, text, text, text, text)
        TO conveyor_writer;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: roles missing, grants skipped (%)', SQLERRM;
END $$;
