-- The archive pipeline's marks and stream positions (pipeline/).
--
-- Current definitions, re-applied whenever a file of this folder changes (docs/architecture.md,
-- "Where each SQL function's current definition lives"). Edit a function here; tables, types,
-- indexes, data and DROPs go in a new numbered migration.

-- The queue's latest mark, after making a new one when rows were archived since the last
-- (or always, with force). Marks older than a week are dropped, except the latest.
CREATE OR REPLACE FUNCTION conveyor.pipeline_archive_mark(queue_name text, force boolean DEFAULT false) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
    last conveyor.pipeline_marks;
    made bigint;
BEGIN
    SELECT * INTO last FROM conveyor.pipeline_marks m WHERE m.queue_id = q.id ORDER BY m.mark_id DESC LIMIT 1;
    IF last.mark_id IS NOT NULL AND NOT coalesce(force, false) AND NOT EXISTS (
        SELECT 1 FROM conveyor.archive a
         WHERE a.queue_id = q.id AND a.archive_txid >= pg_snapshot_xmin(last.mark_snapshot)
           AND NOT pg_visible_in_snapshot(a.archive_txid, last.mark_snapshot)) THEN
        RETURN last.mark_id;
    END IF;
    INSERT INTO conveyor.pipeline_marks (queue_id) VALUES (q.id) RETURNING mark_id INTO made;
    DELETE FROM conveyor.pipeline_marks m
     WHERE m.queue_id = q.id AND m.mark_time < now() - interval '7 days' AND m.mark_id < made;
    RETURN made;
END $$;

-- Checks that both marks exist (mark 0 is "the beginning") and returns the id bounds of
-- the archive rows between them, for splitting the range into Spark partitions.
CREATE OR REPLACE FUNCTION conveyor.pipeline_archive_bounds(queue_name text, from_mark bigint, to_mark bigint,
                                                 OUT min_id bigint, OUT max_id bigint, OUT estimated bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
    snap1 pg_snapshot;
    snap2 pg_snapshot;
BEGIN
    IF from_mark IS NULL OR to_mark IS NULL OR from_mark > to_mark THEN
        PERFORM conveyor._raise('CVV01', format('invalid archive mark range %s to %s', from_mark, to_mark));
    END IF;
    IF from_mark <> 0 THEN
        SELECT m.mark_snapshot INTO snap1 FROM conveyor.pipeline_marks m WHERE m.queue_id = q.id AND m.mark_id = from_mark;
        IF NOT FOUND THEN
            PERFORM conveyor._raise('CVV01', format('archive mark %s of queue %s no longer exists (marks are kept a week)',
                                                    from_mark, quote_literal(queue_name)));
        END IF;
    END IF;
    SELECT m.mark_snapshot INTO snap2 FROM conveyor.pipeline_marks m WHERE m.queue_id = q.id AND m.mark_id = to_mark;
    IF NOT FOUND AND to_mark <> 0 THEN
        PERFORM conveyor._raise('CVV01', format('archive mark %s of queue %s does not exist', to_mark,
                                                quote_literal(queue_name)));
    END IF;
    IF to_mark = 0 OR from_mark = to_mark THEN
        estimated := 0;
        RETURN;
    END IF;
    SELECT min(a.id), max(a.id), count(*) INTO min_id, max_id, estimated
      FROM conveyor.archive a
     WHERE a.queue_id = q.id
       AND CASE WHEN a.archive_txid IS NULL THEN snap1 IS NULL
                ELSE a.archive_txid < pg_snapshot_xmax(snap2) AND pg_visible_in_snapshot(a.archive_txid, snap2)
                     AND (snap1 IS NULL OR (a.archive_txid >= pg_snapshot_xmin(snap1)
                                            AND NOT pg_visible_in_snapshot(a.archive_txid, snap1))) END;
END $$;

-- The consumer's position (a tick id), subscribing it first if needed: at the stream's
-- latest tick ('latest', as stream_subscribe does) or at its oldest tick still kept
-- ('earliest'). An existing consumer keeps its position whatever `start` says.
CREATE OR REPLACE FUNCTION conveyor.pipeline_stream_position(stream_name text, consumer_name text, start text DEFAULT 'latest')
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams := conveyor._stream(stream_name);
    tick bigint;
BEGIN
    IF start IS NULL OR start NOT IN ('latest', 'earliest') THEN
        PERFORM conveyor._raise('CVV01', format('start must be latest or earliest, got %s',
                                                coalesce(quote_literal(left(start, 100)), 'NULL')));
    END IF;
    IF conveyor.stream_subscribe(stream_name, consumer_name) AND start = 'earliest' THEN
        UPDATE conveyor.stream_consumers c
           SET last_tick = (SELECT min(t.tick_id) FROM conveyor.stream_ticks t WHERE t.stream_id = s.id)
         WHERE c.stream_id = s.id AND c.name = consumer_name;
    END IF;
    SELECT c.last_tick INTO tick FROM conveyor.stream_consumers c WHERE c.stream_id = s.id AND c.name = consumer_name;
    RETURN tick;
END $$;

-- Ticks the stream when it needs a tick by its own ticker settings, or with force when
-- any event was appended since its last tick. Returns the latest tick id.
CREATE OR REPLACE FUNCTION conveyor.pipeline_stream_tick(stream_name text, force boolean DEFAULT false) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams := conveyor._stream(stream_name);
    last conveyor.stream_ticks;
BEGIN
    SELECT * INTO last FROM conveyor.stream_ticks t WHERE t.stream_id = s.id ORDER BY t.tick_id DESC LIMIT 1;
    IF coalesce(force, false) THEN
        IF coalesce(pg_sequence_last_value(s.event_seq), 0) > coalesce(last.tick_event_seq, 0) THEN
            PERFORM conveyor._tick(s, true);
        END IF;
    ELSIF NOT s.ticker_paused THEN
        PERFORM conveyor._tick(s, false);
    END IF;
    RETURN (SELECT max(t.tick_id) FROM conveyor.stream_ticks t WHERE t.stream_id = s.id);
END $$;

-- The end of the next range after `after_tick`: the latest tick up to `up_to` (when given)
-- whose range holds at most `max_events` (by the event sequence; when given), and at least
-- the next tick. `after_tick` itself when there is no later tick.
CREATE OR REPLACE FUNCTION conveyor.pipeline_stream_next_tick(stream_name text, after_tick bigint, max_events bigint DEFAULT NULL,
                                                   up_to bigint DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams := conveyor._stream(stream_name);
    base bigint;
    target bigint;
BEGIN
    SELECT t.tick_event_seq INTO base FROM conveyor.stream_ticks t WHERE t.stream_id = s.id AND t.tick_id = after_tick;
    SELECT max(t.tick_id) INTO target FROM conveyor.stream_ticks t
     WHERE t.stream_id = s.id AND t.tick_id > after_tick AND (up_to IS NULL OR t.tick_id <= up_to)
       AND (max_events IS NULL OR base IS NULL OR t.tick_event_seq - base <= max_events);
    IF target IS NULL THEN
        SELECT min(t.tick_id) INTO target FROM conveyor.stream_ticks t
         WHERE t.stream_id = s.id AND t.tick_id > after_tick AND (up_to IS NULL OR t.tick_id <= up_to);
    END IF;
    RETURN coalesce(target, after_tick);
END $$;

-- Both ends of a tick range (defaults: the oldest and the latest tick still kept), with
-- the event sequence at each (ids of the range's events lie around those values).
CREATE OR REPLACE FUNCTION conveyor.pipeline_stream_range(stream_name text, from_tick bigint DEFAULT NULL, to_tick bigint DEFAULT NULL,
                                               OUT first_tick bigint, OUT first_seq bigint,
                                               OUT last_tick bigint, OUT last_seq bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams := conveyor._stream(stream_name);
BEGIN
    SELECT t.tick_id, t.tick_event_seq INTO first_tick, first_seq FROM conveyor.stream_ticks t
     WHERE t.stream_id = s.id AND t.tick_id = coalesce(from_tick,
           (SELECT min(x.tick_id) FROM conveyor.stream_ticks x WHERE x.stream_id = s.id));
    SELECT t.tick_id, t.tick_event_seq INTO last_tick, last_seq FROM conveyor.stream_ticks t
     WHERE t.stream_id = s.id AND t.tick_id = coalesce(to_tick,
           (SELECT max(x.tick_id) FROM conveyor.stream_ticks x WHERE x.stream_id = s.id));
    IF first_tick IS NULL OR last_tick IS NULL THEN
        PERFORM conveyor._raise('CVV01', format(
            'tick %s of stream %s does not exist (ticks are kept an hour, longer while a consumer needs them)',
            CASE WHEN first_tick IS NULL THEN from_tick ELSE to_tick END, quote_literal(stream_name)));
    END IF;
    IF first_tick > last_tick THEN
        PERFORM conveyor._raise('CVV01', format('tick range %s to %s is reversed', first_tick, last_tick));
    END IF;
END $$;

-- The query for the events between two ticks (see the header), for one consumer (its
-- retries too) or for nobody (events as appended), optionally within [min_id, max_id).
-- event_ttl counts back from the second tick, so the range never changes on a replay.
CREATE OR REPLACE FUNCTION conveyor._pipeline_events_query(s conveyor.streams, owner bigint, tick1 conveyor.stream_ticks,
                                                tick2 conveyor.stream_ticks, min_id bigint, max_id bigint)
RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    tbl text;
    sql text := '';
BEGIN
    FOREACH tbl IN ARRAY conveyor._tables_since(s, tick1.tick_snapshot) LOOP
        sql := sql || CASE WHEN sql = '' THEN '' ELSE ' UNION ALL ' END || format(
            'SELECT ev_id, ev_type, ev_data, ev_time, ev_retry,
                    nullif(jsonb_strip_nulls(jsonb_build_object(''extra1'', ev_extra1, ''extra2'', ev_extra2,
                                                                ''extra3'', ev_extra3, ''extra4'', ev_extra4)), ''{}'')
               FROM %s WHERE %s',
            tbl, conveyor._between_snapshots(tick1.tick_snapshot, tick2.tick_snapshot, owner));
        IF min_id IS NOT NULL THEN
            sql := sql || format(' AND ev_id >= %s', min_id);
        END IF;
        IF max_id IS NOT NULL THEN
            sql := sql || format(' AND ev_id < %s', max_id);
        END IF;
        IF s.event_ttl IS NOT NULL THEN
            sql := sql || format(' AND ev_time >= %L::timestamptz', tick2.tick_time - s.event_ttl);
        END IF;
    END LOOP;
    RETURN sql || ' ORDER BY 1';
END $$;

-- Opens the cursor conveyor_pipeline over the events between two ticks (FETCH from it in
-- the same transaction). With a consumer, its own retries are included.
CREATE OR REPLACE FUNCTION conveyor.pipeline_stream_open(stream_name text, consumer_name text, from_tick bigint, to_tick bigint,
                                              min_id bigint DEFAULT NULL, max_id bigint DEFAULT NULL)
RETURNS refcursor
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams := conveyor._stream(stream_name);
    owner bigint;
    t1 conveyor.stream_ticks;
    t2 conveyor.stream_ticks;
    cur refcursor := 'conveyor_pipeline';
BEGIN
    IF consumer_name IS NOT NULL THEN
        owner := (conveyor._consumer(s, consumer_name)).id;
    END IF;
    SELECT * INTO t1 FROM conveyor.stream_ticks t WHERE t.stream_id = s.id AND t.tick_id = from_tick;
    SELECT * INTO t2 FROM conveyor.stream_ticks t WHERE t.stream_id = s.id AND t.tick_id = to_tick;
    IF t1.tick_id IS NULL OR t2.tick_id IS NULL THEN
        PERFORM conveyor._raise('CVV01', format(
            'tick %s of stream %s does not exist (ticks are kept an hour, longer while a consumer needs them)',
            CASE WHEN t1.tick_id IS NULL THEN from_tick ELSE to_tick END, quote_literal(stream_name)));
    END IF;
    IF from_tick > to_tick THEN
        PERFORM conveyor._raise('CVV01', format('tick range %s to %s is reversed', from_tick, to_tick));
    END IF;
    OPEN cur FOR EXECUTE conveyor._pipeline_events_query(s, owner, t1, t2, min_id, max_id);
    RETURN cur;
END $$;

-- Moves the consumer's position forward to `tick` (never back); true if it moved.
CREATE OR REPLACE FUNCTION conveyor.pipeline_stream_advance(stream_name text, consumer_name text, tick bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.streams := conveyor._stream(stream_name);
    c conveyor.stream_consumers := conveyor._consumer(s, consumer_name);
BEGIN
    IF NOT EXISTS (SELECT 1 FROM conveyor.stream_ticks t WHERE t.stream_id = s.id AND t.tick_id = tick) THEN
        PERFORM conveyor._raise('CVV01', format('tick %s of stream %s does not exist', tick, quote_literal(stream_name)));
    END IF;
    UPDATE conveyor.stream_consumers x
       SET last_tick = tick, next_tick = NULL, batch_id = NULL, batch_started_at = NULL, active_at = now()
     WHERE x.id = c.id AND x.last_tick < tick;
    RETURN FOUND;
END $$;

-- Publishes the staged rows of the given task attempts (parallel arrays: partition,
-- attempt, rows staged) into a queue or a stream, in partition and row order, and drops
-- everything staged for (writer_id, stage_id), successful or not. With a commit_key, a
-- (commit_key, batch_id) already published publishes nothing and returns -1. Returns
-- the number of rows published. Stage rows of jobs that died are dropped after a day.
CREATE OR REPLACE FUNCTION conveyor.pipeline_publish(writer_id uuid, stage_id integer, target_kind text, target_name text,
                                          partitions integer[], attempts bigint[], counts bigint[],
                                          commit_key text DEFAULT NULL, batch_id bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.queues;
    s conveyor.streams;
    chunk jsonb;
    n bigint := 0;
    missing text;
BEGIN
    IF target_kind IS NULL OR target_kind NOT IN ('queue', 'stream') THEN
        PERFORM conveyor._raise('CVV01', 'target_kind must be queue or stream');
    END IF;
    IF cardinality(partitions) IS DISTINCT FROM cardinality(attempts)
       OR cardinality(partitions) IS DISTINCT FROM cardinality(counts) THEN
        PERFORM conveyor._raise('CVV01', 'partitions, attempts and counts must have one element per task');
    END IF;
    IF commit_key IS NOT NULL THEN
        INSERT INTO conveyor.pipeline_commits (commit_key, batch_id)
        VALUES (pipeline_publish.commit_key, pipeline_publish.batch_id) ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN
            DELETE FROM conveyor.pipeline_stage st WHERE st.writer_id = pipeline_publish.writer_id
               AND st.stage_id = pipeline_publish.stage_id;
            RETURN -1;
        END IF;
    END IF;
    SELECT string_agg(format('partition %s attempt %s: %s of %s rows', t.p, t.a, coalesce(x.n, 0), t.c), '; ')
      INTO missing
      FROM unnest(partitions, attempts, counts) AS t(p, a, c)
      LEFT JOIN LATERAL (SELECT count(*) AS n FROM conveyor.pipeline_stage st
                          WHERE st.writer_id = pipeline_publish.writer_id AND st.stage_id = pipeline_publish.stage_id
                            AND st.partition_id = t.p AND st.attempt_id = t.a) x ON true
     WHERE coalesce(x.n, 0) <> t.c;
    IF missing IS NOT NULL THEN
        PERFORM conveyor._raise('CVP01', 'staged rows missing, nothing published: ' || left(missing, 500));
    END IF;

    IF target_kind = 'queue' THEN
        q := conveyor._queue(target_name);
        FOR chunk IN
            SELECT jsonb_agg(jsonb_strip_nulls(jsonb_build_object(
                       'body', x.body, 'headers', x.attributes, 'content_type', x.type, 'group_id', x.group_id,
                       'dedup_id', x.dedup_id, 'delay', x.delay)) ORDER BY x.rn)
              FROM (SELECT st.*, row_number() OVER (ORDER BY st.partition_id, st.ord) AS rn
                      FROM conveyor.pipeline_stage st
                      JOIN unnest(partitions, attempts) AS t(p, a) ON st.partition_id = t.p AND st.attempt_id = t.a
                     WHERE st.writer_id = pipeline_publish.writer_id AND st.stage_id = pipeline_publish.stage_id) x
             GROUP BY (x.rn - 1) / 10000
             ORDER BY (x.rn - 1) / 10000
        LOOP
            n := n + (SELECT count(*) FROM conveyor._send(q, chunk));
        END LOOP;
        IF n > 0 THEN
            PERFORM conveyor._wake(q, least(n, 1000000)::integer);
        END IF;
    ELSE
        -- the transaction id before the current table is read (see 0003's header)
        PERFORM pg_current_xact_id();
        s := conveyor._stream(target_name);
        EXECUTE format(
            'INSERT INTO %s (ev_id, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
             SELECT nextval($1), coalesce(st.type, ''default''), st.body, st.extra1, st.extra2, st.extra3, st.extra4
               FROM conveyor.pipeline_stage st
               JOIN unnest($4::integer[], $5::bigint[]) AS t(p, a) ON st.partition_id = t.p AND st.attempt_id = t.a
              WHERE st.writer_id = $2 AND st.stage_id = $3
              ORDER BY st.partition_id, st.ord', conveyor._stream_table(s, s.cur_table))
        USING s.event_seq, writer_id, stage_id, partitions, attempts;
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;

    DELETE FROM conveyor.pipeline_stage st
     WHERE st.writer_id = pipeline_publish.writer_id AND st.stage_id = pipeline_publish.stage_id;
    DELETE FROM conveyor.pipeline_stage st WHERE st.created_at < now() - interval '1 day';
    IF commit_key IS NOT NULL THEN
        UPDATE conveyor.pipeline_commits c SET rows = n
         WHERE c.commit_key = pipeline_publish.commit_key AND c.batch_id = pipeline_publish.batch_id;
        DELETE FROM conveyor.pipeline_commits c
         WHERE c.commit_key = pipeline_publish.commit_key AND c.committed_at < now() - interval '30 days';
    END IF;
    RETURN n;
END $$;

-- Drops what a failed job staged (Spark's abort).
CREATE OR REPLACE FUNCTION conveyor.pipeline_discard(writer_id uuid, stage_id integer DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    n bigint;
BEGIN
    DELETE FROM conveyor.pipeline_stage st
     WHERE st.writer_id = pipeline_discard.writer_id
       AND (pipeline_discard.stage_id IS NULL OR st.stage_id = pipeline_discard.stage_id);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

REVOKE ALL ON ALL ROUTINES IN SCHEMA conveyor FROM PUBLIC;
