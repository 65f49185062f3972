-- Conveyor dialect pgq 0001: PgQ 3's SQL consumer API and its change-data-capture
-- triggers, as a thin layer over Conveyor's streams (migration 0003, docs/streams.md).
--
-- A PgQ queue IS a Conveyor stream: the same tables, ticks, consumers, batches and
-- retries, reachable through conveyor.stream_* and the REST API as well. Nothing here
-- stores events or positions of its own; every function below reads or calls the stream
-- engine. Signatures, result columns and error texts are PgQ 3.5's (skytools PgQ, the
-- pgq extension), so that PgQ consumers (the Python `pgq` package, pgqd's maintenance
-- calls, psql scripts) run unmodified. Where Conveyor's model differs (names, external
-- tickers, per-queue tick ids), docs/dialects/pgq.md says how.
--
-- Errors are raised as PgQ raises them: SQLSTATE P0001 with PgQ's message text.

CREATE SCHEMA pgq;
COMMENT ON SCHEMA pgq IS 'Conveyor: PgQ 3 consumer API over Conveyor streams (docs/dialects/pgq.md)';

------------------------------------------------------------------------------------------
-- Internal helpers
------------------------------------------------------------------------------------------

-- The stream behind a queue name, or PgQ's error for the calling function (each PgQ
-- function words "no such queue" its own way).
CREATE FUNCTION pgq._queue(queue_name text, missing text) RETURNS conveyor.streams
LANGUAGE plpgsql STABLE AS $$
DECLARE
    s conveyor.streams;
BEGIN
    SELECT * INTO s FROM conveyor.streams WHERE name = queue_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION '%', missing;
    END IF;
    RETURN s;
END $$;

-- The consumer holding an open batch (NULL when no consumer holds it).
CREATE FUNCTION pgq._batch_owner(batch bigint) RETURNS conveyor.stream_consumers
LANGUAGE sql STABLE AS $$
    SELECT * FROM conveyor.stream_consumers WHERE batch_id = batch
$$;

CREATE FUNCTION pgq._last_tick(stream bigint) RETURNS conveyor.stream_ticks
LANGUAGE sql STABLE AS $$
    SELECT * FROM conveyor.stream_ticks WHERE stream_id = stream ORDER BY tick_id DESC LIMIT 1
$$;

------------------------------------------------------------------------------------------
-- Queues
------------------------------------------------------------------------------------------

-- 1 when created, 0 when it existed. The stream starts with a tick, as PgQ's queue does.
CREATE FUNCTION pgq.create_queue(i_queue_name text) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
BEGIN
    IF i_queue_name IS NULL THEN
        RAISE EXCEPTION 'Invalid NULL value';
    END IF;
    IF EXISTS (SELECT 1 FROM conveyor.streams WHERE name = i_queue_name) THEN
        RETURN 0;
    END IF;
    PERFORM conveyor.stream_create(i_queue_name);
    RETURN 1;
END $$;

CREATE FUNCTION pgq.drop_queue(x_queue_name text, x_force boolean) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
DECLARE
    s conveyor.streams := pgq._queue(x_queue_name, 'No such event queue');
BEGIN
    IF NOT x_force AND EXISTS (SELECT 1 FROM conveyor.stream_consumers c WHERE c.stream_id = s.id) THEN
        RAISE EXCEPTION 'cannot drop queue, consumers still attached';
    END IF;
    PERFORM conveyor.stream_drop(x_queue_name);
    RETURN 1;
END $$;

CREATE FUNCTION pgq.drop_queue(x_queue_name text) RETURNS integer
LANGUAGE sql STRICT SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
    SELECT pgq.drop_queue(x_queue_name, false)
$$;

-- PgQ's settable parameters map onto the stream's options of the same meaning.
-- external_ticker can only stay false: Conveyor ticks every stream itself.
CREATE FUNCTION pgq.set_queue_config(x_queue_name text, x_param_name text, x_param_value text)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
DECLARE
    option text;
BEGIN
    IF x_queue_name IS NULL OR x_param_name IS NULL THEN
        RAISE EXCEPTION 'Invalid NULL value';
    END IF;
    PERFORM pgq._queue(x_queue_name, 'No such event queue');
    option := CASE x_param_name
        WHEN 'ticker_max_count' THEN 'ticker_max_count'
        WHEN 'ticker_max_lag' THEN 'ticker_max_lag'
        WHEN 'ticker_idle_period' THEN 'ticker_idle_period'
        WHEN 'ticker_paused' THEN 'ticker_paused'
        WHEN 'rotation_period' THEN 'rotation_period'
        WHEN 'external_ticker' THEN 'external_ticker' END;
    IF option IS NULL THEN
        -- PgQ's own text, "%s" and all
        RAISE EXCEPTION 'cannot change parameter "%s"', x_param_name;
    END IF;
    IF option = 'external_ticker' THEN
        IF x_param_value::boolean THEN
            RAISE EXCEPTION 'cannot change parameter "external_ticker": Conveyor ticks every queue itself';
        END IF;
        RETURN 1;
    END IF;
    PERFORM conveyor.stream_set_config(x_queue_name, jsonb_build_object(option, x_param_value));
    RETURN 1;
END $$;

------------------------------------------------------------------------------------------
-- Producers
------------------------------------------------------------------------------------------

-- Appends to the stream's current table (the engine's raw append path: the transaction id
-- is taken before the current table is read). ev_type is stored as given, NULL included.
CREATE FUNCTION pgq.insert_event(queue_name text, ev_type text, ev_data text,
                                 ev_extra1 text, ev_extra2 text, ev_extra3 text, ev_extra4 text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
DECLARE
    s conveyor.streams;
    id bigint;
BEGIN
    IF queue_name IS NULL THEN
        RAISE EXCEPTION 'Queue name must not be NULL';
    END IF;
    PERFORM pg_current_xact_id();
    SELECT * INTO s FROM conveyor.streams x WHERE x.name = insert_event.queue_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'No such queue';
    END IF;
    EXECUTE format('INSERT INTO %s (ev_id, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
                    VALUES (nextval($1), $2, $3, $4, $5, $6, $7) RETURNING ev_id',
                   conveyor._stream_table(s, s.cur_table))
    INTO id USING s.event_seq, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4;
    RETURN id;
END $$;

-- A plain wrapper (no SET clause, so the planner inlines it); the 7-argument form checks.
CREATE FUNCTION pgq.insert_event(queue_name text, ev_type text, ev_data text) RETURNS bigint
LANGUAGE sql AS $$
    SELECT pgq.insert_event(queue_name, ev_type, ev_data, NULL, NULL, NULL, NULL)
$$;

-- The table to INSERT or COPY into directly (pgq.bulk_insert_events in Python). The
-- transaction id is taken here, before the table is named, so an insert in the same
-- transaction is safe against a rotation; ev_id gets the stream's sequence as default.
CREATE FUNCTION pgq.current_event_table(x_queue_name text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
DECLARE
    s conveyor.streams;
    tbl text;
BEGIN
    PERFORM pg_current_xact_id();
    s := pgq._queue(x_queue_name, 'Event queue not found');
    FOR nr IN 0 .. 2 LOOP
        tbl := conveyor._stream_table(s, nr);
        IF NOT EXISTS (SELECT 1 FROM pg_attrdef d JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
                        WHERE d.adrelid = tbl::regclass AND a.attname = 'ev_id') THEN
            EXECUTE format('ALTER TABLE %s ALTER COLUMN ev_id SET DEFAULT nextval(%L)', tbl, s.event_seq::text);
        END IF;
    END LOOP;
    RETURN 'conveyor.stream_' || s.id || '_' || s.cur_table;
END $$;

------------------------------------------------------------------------------------------
-- Consumers
------------------------------------------------------------------------------------------

-- From the queue's latest tick on (1), or 0 when already registered; with a tick, the
-- consumer is (re)positioned there.
CREATE FUNCTION pgq.register_consumer_at(x_queue_name text, x_consumer_name text, x_tick_pos bigint)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
DECLARE
    s conveyor.streams := pgq._queue(x_queue_name, 'Event queue not created yet');
    created boolean;
BEGIN
    IF x_tick_pos IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM conveyor.stream_ticks t WHERE t.stream_id = s.id AND t.tick_id = x_tick_pos) THEN
        RAISE EXCEPTION 'cannot reposition, tick not found: %', x_tick_pos;
    END IF;
    created := conveyor.stream_subscribe(x_queue_name, x_consumer_name);
    IF x_tick_pos IS NOT NULL THEN
        UPDATE conveyor.stream_consumers c
           SET last_tick = x_tick_pos, batch_id = NULL, next_tick = NULL, batch_started_at = NULL,
               batch_read_through = NULL, batch_read_all = NULL, active_at = now()
         WHERE c.stream_id = s.id AND c.name = x_consumer_name;
    END IF;
    RETURN CASE WHEN created THEN 1 ELSE 0 END;
END $$;

CREATE FUNCTION pgq.register_consumer(x_queue_name text, x_consumer_id text) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
    SELECT pgq.register_consumer_at(x_queue_name, x_consumer_id, NULL)
$$;

-- 1 when unregistered (its pending retries go too), 0 when it was not registered.
CREATE FUNCTION pgq.unregister_consumer(x_queue_name text, x_consumer_name text) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM conveyor.stream_consumers c JOIN conveyor.streams s ON s.id = c.stream_id
                    WHERE s.name = x_queue_name AND c.name = x_consumer_name) THEN
        RETURN 0;
    END IF;
    PERFORM conveyor.stream_unsubscribe(x_queue_name, x_consumer_name);
    RETURN 1;
END $$;

------------------------------------------------------------------------------------------
-- Batches
------------------------------------------------------------------------------------------

-- Opens the consumer's next batch through the engine (or returns the open one) and
-- describes it. All columns NULL when there is no new tick yet.
CREATE FUNCTION pgq.next_batch_custom(
    i_queue_name text, i_consumer_name text, i_min_lag interval, i_min_count integer, i_min_interval interval,
    OUT batch_id bigint, OUT cur_tick_id bigint, OUT prev_tick_id bigint,
    OUT cur_tick_time timestamptz, OUT prev_tick_time timestamptz,
    OUT cur_tick_event_seq bigint, OUT prev_tick_event_seq bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM conveyor.stream_consumers c JOIN conveyor.streams s ON s.id = c.stream_id
                    WHERE s.name = i_queue_name AND c.name = i_consumer_name) THEN
        RAISE EXCEPTION '%', 'Not subscriber to queue: ' || coalesce(i_queue_name, 'NULL') || '/'
                             || coalesce(i_consumer_name, 'NULL');
    END IF;
    batch_id := conveyor.stream_next_batch_custom(i_queue_name, i_consumer_name, i_min_lag, i_min_count,
                                                  i_min_interval);
    IF batch_id IS NULL THEN
        RETURN;
    END IF;
    SELECT t2.tick_id, t1.tick_id, t2.tick_time, t1.tick_time, t2.tick_event_seq, t1.tick_event_seq
      INTO cur_tick_id, prev_tick_id, cur_tick_time, prev_tick_time, cur_tick_event_seq, prev_tick_event_seq
      FROM conveyor.stream_consumers c
      JOIN conveyor.stream_ticks t1 ON t1.stream_id = c.stream_id AND t1.tick_id = c.last_tick
      JOIN conveyor.stream_ticks t2 ON t2.stream_id = c.stream_id AND t2.tick_id = c.next_tick
     WHERE c.batch_id = next_batch_custom.batch_id;
END $$;

CREATE FUNCTION pgq.next_batch_info(
    i_queue_name text, i_consumer_name text,
    OUT batch_id bigint, OUT cur_tick_id bigint, OUT prev_tick_id bigint,
    OUT cur_tick_time timestamptz, OUT prev_tick_time timestamptz,
    OUT cur_tick_event_seq bigint, OUT prev_tick_event_seq bigint)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
    SELECT * FROM pgq.next_batch_custom(i_queue_name, i_consumer_name, NULL, NULL, NULL)
$$;

CREATE FUNCTION pgq.next_batch(i_queue_name text, i_consumer_name text) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
    SELECT batch_id FROM pgq.next_batch_custom(i_queue_name, i_consumer_name, NULL, NULL, NULL)
$$;

-- The SELECT of a batch's events in PgQ's column order, with the engine's batch rule
-- (conveyor._batch: its tables and ticks; conveyor._between_snapshots: the snapshot
-- condition, this consumer's retries included; the stream's event_ttl). Values are
-- inlined, so the text runs with the caller's rights (get_batch_cursor's extra_where).
CREATE FUNCTION pgq.batch_event_sql(x_batch_id bigint) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
DECLARE
    b record;
    cond text;
    tbl text;
    sql text := '';
BEGIN
    IF (pgq._batch_owner(x_batch_id)).id IS NULL THEN
        RAISE EXCEPTION 'batch not found';
    END IF;
    b := conveyor._batch(x_batch_id);
    cond := conveyor._between_snapshots(b.snap1, b.snap2, (b.c).id);
    IF (b.s).event_ttl IS NOT NULL THEN
        cond := cond || format(' AND ev_time >= %L::timestamptz', now() - (b.s).event_ttl);
    END IF;
    FOREACH tbl IN ARRAY b.tables LOOP
        sql := sql || CASE WHEN sql = '' THEN '' ELSE ' union all ' END
            || 'select ev_id, ev_time, ev_txid::text::bigint as ev_txid, ev_retry, ev_type, ev_data,'
            || ' ev_extra1, ev_extra2, ev_extra3, ev_extra4 from ' || tbl || ' where ' || cond;
    END LOOP;
    RETURN sql || ' order by 1';
END $$;

CREATE FUNCTION pgq.batch_event_tables(x_batch_id bigint) RETURNS SETOF text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
BEGIN
    IF (pgq._batch_owner(x_batch_id)).id IS NULL THEN
        RAISE EXCEPTION 'Cannot find data for batch %', x_batch_id;
    END IF;
    RETURN QUERY SELECT unnest((conveyor._batch(x_batch_id)).tables);
END $$;

CREATE FUNCTION pgq.get_batch_events(
    x_batch_id bigint,
    OUT ev_id bigint, OUT ev_time timestamptz, OUT ev_txid bigint, OUT ev_retry integer,
    OUT ev_type text, OUT ev_data text, OUT ev_extra1 text, OUT ev_extra2 text,
    OUT ev_extra3 text, OUT ev_extra4 text)
RETURNS SETOF record
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
BEGIN
    RETURN QUERY EXECUTE pgq.batch_event_sql(x_batch_id);
END $$;

-- Declares cursor i_cursor_name over the batch's events (filtered by i_extra_where, an SQL
-- condition on the event columns) and returns its first i_quick_limit rows; FETCH the
-- rest in the same transaction. Runs with the caller's rights (the condition is the
-- caller's SQL), who needs SELECT on the event tables: conveyor_reader has it.
CREATE FUNCTION pgq.get_batch_cursor(
    i_batch_id bigint, i_cursor_name text, i_quick_limit integer, i_extra_where text,
    OUT ev_id bigint, OUT ev_time timestamptz, OUT ev_txid bigint, OUT ev_retry integer,
    OUT ev_type text, OUT ev_data text, OUT ev_extra1 text, OUT ev_extra2 text,
    OUT ev_extra3 text, OUT ev_extra4 text)
RETURNS SETOF record
LANGUAGE plpgsql AS $$
DECLARE
    cname text;
    sql text;
BEGIN
    IF i_batch_id IS NULL OR i_cursor_name IS NULL OR i_quick_limit IS NULL THEN
        RETURN;
    END IF;
    cname := quote_ident(i_cursor_name);
    sql := pgq.batch_event_sql(i_batch_id);
    IF i_extra_where IS NOT NULL THEN
        sql := 'select * from (' || left(sql, -length(' order by 1')) || ') _evs where ' || i_extra_where
               || ' order by 1';
    END IF;
    EXECUTE 'declare ' || cname || ' no scroll cursor for ' || sql;
    IF i_quick_limit <= 0 THEN
        RETURN;
    END IF;
    RETURN QUERY EXECUTE 'fetch ' || i_quick_limit || ' from ' || cname;
END $$;

CREATE FUNCTION pgq.get_batch_cursor(
    i_batch_id bigint, i_cursor_name text, i_quick_limit integer,
    OUT ev_id bigint, OUT ev_time timestamptz, OUT ev_txid bigint, OUT ev_retry integer,
    OUT ev_type text, OUT ev_data text, OUT ev_extra1 text, OUT ev_extra2 text,
    OUT ev_extra3 text, OUT ev_extra4 text)
RETURNS SETOF record
LANGUAGE sql STRICT AS $$
    SELECT * FROM pgq.get_batch_cursor(i_batch_id, i_cursor_name, i_quick_limit, NULL)
$$;

CREATE FUNCTION pgq.get_batch_info(
    x_batch_id bigint,
    OUT queue_name text, OUT consumer_name text, OUT batch_start timestamptz, OUT batch_end timestamptz,
    OUT prev_tick_id bigint, OUT tick_id bigint, OUT lag interval, OUT seq_start bigint, OUT seq_end bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
    SELECT s.name, c.name, prev.tick_time, cur.tick_time, c.last_tick, c.next_tick,
           current_timestamp - cur.tick_time, prev.tick_event_seq, cur.tick_event_seq
      FROM conveyor.stream_consumers c
      JOIN conveyor.streams s ON s.id = c.stream_id
      JOIN conveyor.stream_ticks prev ON prev.stream_id = c.stream_id AND prev.tick_id = c.last_tick
      JOIN conveyor.stream_ticks cur ON cur.stream_id = c.stream_id AND cur.tick_id = c.next_tick
     WHERE c.batch_id = x_batch_id
    UNION ALL
    SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
    LIMIT 1
$$;

-- Puts one event of the batch back for this consumer, due at x_retry_time (the engine's
-- retry, retried with ev_retry one higher). 0 when the event is already waiting for a
-- retry by this consumer, as PgQ answers.
CREATE FUNCTION pgq.event_retry(x_batch_id bigint, x_event_id bigint, x_retry_time timestamptz) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
DECLARE
    c conveyor.stream_consumers := pgq._batch_owner(x_batch_id);
BEGIN
    IF c.id IS NULL THEN
        RAISE EXCEPTION 'batch not found';
    END IF;
    IF EXISTS (SELECT 1 FROM conveyor.stream_retries r WHERE r.consumer_id = c.id AND r.ev_id = x_event_id) THEN
        RETURN 0;
    END IF;
    BEGIN
        PERFORM conveyor.stream_event_retry(x_batch_id, x_event_id, 0);
    EXCEPTION WHEN SQLSTATE 'CVV01' THEN
        RAISE EXCEPTION 'event not found';
    END;
    UPDATE conveyor.stream_retries r SET retry_at = x_retry_time
     WHERE r.consumer_id = c.id AND r.ev_id = x_event_id;
    RETURN 1;
END $$;

CREATE FUNCTION pgq.event_retry(x_batch_id bigint, x_event_id bigint, x_retry_seconds integer) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
    SELECT pgq.event_retry(x_batch_id, x_event_id, current_timestamp + make_interval(secs => x_retry_seconds))
$$;

-- Every event of the batch back for this consumer (those not already waiting for a
-- retry); returns how many. The batch still has to be finished.
CREATE FUNCTION pgq.batch_retry(i_batch_id bigint, i_retry_seconds integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
DECLARE
    c conveyor.stream_consumers := pgq._batch_owner(i_batch_id);
    n integer;
BEGIN
    IF c.id IS NULL THEN
        RAISE EXCEPTION 'batch_retry: batch % not found', i_batch_id;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM conveyor.stream_retries r WHERE r.consumer_id = c.id) THEN
        RETURN conveyor.stream_batch_retry(i_batch_id, i_retry_seconds);
    END IF;
    -- some already wait for a retry: the engine's batch retry, minus those
    INSERT INTO conveyor.stream_retries (stream_id, consumer_id, retry_at, ev_id, ev_time, ev_retry, ev_type,
                                         ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
    SELECT c.stream_id, c.id, current_timestamp + make_interval(secs => greatest(i_retry_seconds, 0)), e.id,
           e.created_at, coalesce(e.retry_count, 0) + 1, e.type, e.payload, e.extra1, e.extra2, e.extra3, e.extra4
      FROM conveyor._batch_events(i_batch_id) e
     WHERE NOT EXISTS (SELECT 1 FROM conveyor.stream_retries r WHERE r.consumer_id = c.id AND r.ev_id = e.id);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- 1, or a warning and 0 when the batch is not open.
CREATE FUNCTION pgq.finish_batch(x_batch_id bigint) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
BEGIN
    IF (pgq._batch_owner(x_batch_id)).id IS NULL THEN
        RAISE WARNING 'finish_batch: batch % not found', x_batch_id;
        RETURN 0;
    END IF;
    RETURN conveyor.stream_finish_batch(x_batch_id);
END $$;

------------------------------------------------------------------------------------------
-- Information
------------------------------------------------------------------------------------------

CREATE FUNCTION pgq.get_queue_info(
    i_queue_name text,
    OUT queue_name text, OUT queue_ntables integer, OUT queue_cur_table integer,
    OUT queue_rotation_period interval, OUT queue_switch_time timestamptz,
    OUT queue_external_ticker boolean, OUT queue_ticker_paused boolean,
    OUT queue_ticker_max_count integer, OUT queue_ticker_max_lag interval,
    OUT queue_ticker_idle_period interval, OUT ticker_lag interval, OUT ev_per_sec double precision,
    OUT ev_new bigint, OUT last_tick_id bigint)
RETURNS SETOF record
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
    SELECT s.name, 3, s.cur_table::integer, s.rotation_period, s.switch_time, false, s.ticker_paused,
           s.ticker_max_count, s.ticker_max_lag, s.ticker_idle_period,
           current_timestamp - top.tick_time,
           -- over the last 20 ticks, as PgQ measures it
           CASE WHEN old.tick_time < top.tick_time
                THEN (top.tick_event_seq - old.tick_event_seq) / extract(epoch FROM top.tick_time - old.tick_time)
           END::double precision,
           coalesce(pg_sequence_last_value(s.event_seq), 0) - top.tick_event_seq,
           top.tick_id
      FROM conveyor.streams s
      LEFT JOIN LATERAL (SELECT * FROM conveyor.stream_ticks t WHERE t.stream_id = s.id
                          ORDER BY t.tick_id DESC LIMIT 1) top ON true
      LEFT JOIN LATERAL (SELECT * FROM (SELECT * FROM conveyor.stream_ticks t WHERE t.stream_id = s.id
                                         ORDER BY t.tick_id DESC LIMIT 21) x
                          ORDER BY x.tick_id LIMIT 1) old ON true
     WHERE i_queue_name IS NULL OR s.name = i_queue_name
     ORDER BY s.name
$$;

CREATE FUNCTION pgq.get_queue_info(
    OUT queue_name text, OUT queue_ntables integer, OUT queue_cur_table integer,
    OUT queue_rotation_period interval, OUT queue_switch_time timestamptz,
    OUT queue_external_ticker boolean, OUT queue_ticker_paused boolean,
    OUT queue_ticker_max_count integer, OUT queue_ticker_max_lag interval,
    OUT queue_ticker_idle_period interval, OUT ticker_lag interval, OUT ev_per_sec double precision,
    OUT ev_new bigint, OUT last_tick_id bigint)
RETURNS SETOF record
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
    SELECT * FROM pgq.get_queue_info(NULL)
$$;

CREATE FUNCTION pgq.get_consumer_info(
    i_queue_name text, i_consumer_name text,
    OUT queue_name text, OUT consumer_name text, OUT lag interval, OUT last_seen interval,
    OUT last_tick bigint, OUT current_batch bigint, OUT next_tick bigint, OUT pending_events bigint)
RETURNS SETOF record
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
    SELECT s.name, c.name, current_timestamp - t.tick_time, current_timestamp - c.active_at,
           c.last_tick, c.batch_id, c.next_tick,
           (pgq._last_tick(s.id)).tick_event_seq - t.tick_event_seq
      FROM conveyor.stream_consumers c
      JOIN conveyor.streams s ON s.id = c.stream_id
      LEFT JOIN conveyor.stream_ticks t ON t.stream_id = c.stream_id AND t.tick_id = c.last_tick
     WHERE (i_queue_name IS NULL OR s.name = i_queue_name)
       AND (i_consumer_name IS NULL OR c.name = i_consumer_name)
     ORDER BY 1, 2
$$;

CREATE FUNCTION pgq.get_consumer_info(
    i_queue_name text,
    OUT queue_name text, OUT consumer_name text, OUT lag interval, OUT last_seen interval,
    OUT last_tick bigint, OUT current_batch bigint, OUT next_tick bigint, OUT pending_events bigint)
RETURNS SETOF record
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
    SELECT * FROM pgq.get_consumer_info(i_queue_name, NULL)
$$;

CREATE FUNCTION pgq.get_consumer_info(
    OUT queue_name text, OUT consumer_name text, OUT lag interval, OUT last_seen interval,
    OUT last_tick bigint, OUT current_batch bigint, OUT next_tick bigint, OUT pending_events bigint)
RETURNS SETOF record
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
    SELECT * FROM pgq.get_consumer_info(NULL, NULL)
$$;

-- The PgQ API level this dialect implements.
CREATE FUNCTION pgq.version() RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT '3.5'::text
$$;

------------------------------------------------------------------------------------------
-- Ticker and maintenance: the engine's ticker and maintenance under PgQ's names, so that
-- pgqd (or cron running psql) can drive a database that has no Conveyor server.
------------------------------------------------------------------------------------------

-- Ticks one queue when it needs a tick (the engine's rule: ticker_max_count events, or
-- events and ticker_max_lag, or ticker_idle_period); the new tick's id, or NULL.
CREATE FUNCTION pgq.ticker(i_queue_name text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
DECLARE
    s conveyor.streams := pgq._queue(i_queue_name, 'no such queue');
BEGIN
    IF s.ticker_paused THEN
        RAISE EXCEPTION 'Ticker has been paused for this queue';
    END IF;
    IF conveyor._tick(s, false) THEN
        RETURN (pgq._last_tick(s.id)).tick_id;
    END IF;
    RETURN NULL;
END $$;

-- Every unpaused queue; how many were ticked.
CREATE FUNCTION pgq.ticker() RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
    SELECT conveyor.ticker()::bigint
$$;

-- PgQ's external ticker (ticks copied from another database, for cascading). Conveyor
-- queues always tick themselves, so like PgQ for a queue without an external ticker:
CREATE FUNCTION pgq.ticker(i_queue_name text, i_tick_id bigint, i_orig_timestamp timestamptz, i_event_seq bigint)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
BEGIN
    RAISE EXCEPTION 'queue not found or ticker disabled: %', i_queue_name;
END $$;

-- PgQ makes the next ticker run tick; Conveyor ticks at once. Returns the tick that was
-- the latest before, as PgQ does, so "wait for a tick after this one" ends at once.
CREATE FUNCTION pgq.force_tick(i_queue_name text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
DECLARE
    s conveyor.streams;
    before bigint;
BEGIN
    SELECT * INTO s FROM conveyor.streams WHERE name = i_queue_name;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    before := (pgq._last_tick(s.id)).tick_id;
    IF NOT s.ticker_paused THEN
        PERFORM conveyor._tick(s, true);
    END IF;
    RETURN before;
END $$;

-- Rotation step 1 for one queue when due (the engine's step 1, which waits for consumers
-- past the last step 2). Always 0, as PgQ.
CREATE FUNCTION pgq.maint_rotate_tables_step1(i_queue_name text) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
DECLARE
    s conveyor.streams;
BEGIN
    SELECT * INTO s FROM conveyor.streams
     WHERE name = i_queue_name AND switch_step2 IS NOT NULL AND switch_time + rotation_period < current_timestamp
       FOR UPDATE;
    IF FOUND THEN
        PERFORM conveyor._rotate_step1(s);
    END IF;
    RETURN 0;
END $$;

-- Rotation step 2 (in its own transaction after step 1): records the transaction after
-- which nobody writes to the previous table, exactly as the engine's maint() does.
CREATE FUNCTION pgq.maint_rotate_tables_step2() RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
    UPDATE conveyor.streams SET switch_step2 = pg_current_xact_id() WHERE switch_step2 IS NULL;
    SELECT 0;
$$;

-- One round of the engine's maintenance (conveyor.maint(): due retries and delayed
-- events into their streams, old ticks dropped, rotation steps); returns the events moved,
-- so pgqd's "call again while > 0" loop ends.
CREATE FUNCTION pgq.maint_retry_events() RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
    SELECT coalesce(sum(m.count), 0)::integer FROM conveyor.maint() m WHERE m.operation IN ('retries', 'delayed')
$$;

CREATE FUNCTION pgq.maint_tables_to_vacuum() RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
    SELECT t FROM conveyor.maint_tables_to_vacuum() t WHERE current_setting('autovacuum') <> 'on'
$$;

-- What pgqd calls for maintenance, in PgQ's order: step 1 for each queue due, else step 2
-- when one is pending, then the tables to vacuum.
CREATE FUNCTION pgq.maint_operations(OUT func_name text, OUT func_arg text) RETURNS SETOF record
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
DECLARE
    nrot integer := 0;
BEGIN
    func_name := 'pgq.maint_rotate_tables_step1';
    FOR func_arg IN SELECT name FROM conveyor.streams
                     WHERE switch_step2 IS NOT NULL AND switch_time + rotation_period < current_timestamp
                     ORDER BY 1 LOOP
        nrot := nrot + 1;
        RETURN NEXT;
    END LOOP;
    IF nrot = 0 THEN
        SELECT count(*) INTO nrot FROM conveyor.streams WHERE switch_step2 IS NULL;
    END IF;
    IF nrot > 0 THEN
        func_name := 'pgq.maint_rotate_tables_step2';
        func_arg := NULL;
        RETURN NEXT;
    END IF;
    func_name := 'vacuum';
    FOR func_arg IN SELECT * FROM pgq.maint_tables_to_vacuum() LOOP
        RETURN NEXT;
    END LOOP;
END $$;

------------------------------------------------------------------------------------------
-- PgQ's small utilities
------------------------------------------------------------------------------------------

CREATE FUNCTION pgq.quote_fqname(i_name text) RETURNS text
LANGUAGE sql STRICT IMMUTABLE AS $$
    SELECT CASE WHEN position('.' IN i_name) > 0
                THEN quote_ident(split_part(i_name, '.', 1)) || '.'
                     || quote_ident(substring(i_name FROM position('.' IN i_name) + 1))
                ELSE 'public.' || quote_ident(i_name) END
$$;

CREATE FUNCTION pgq.seq_getval(i_seq_name text) RETURNS bigint
LANGUAGE plpgsql STRICT AS $$
DECLARE
    res bigint;
BEGIN
    EXECUTE 'select last_value from ' || pgq.quote_fqname(i_seq_name) INTO res;
    RETURN res;
END $$;

-- Like setval(), but never backwards.
CREATE FUNCTION pgq.seq_setval(i_seq_name text, i_new_value bigint) RETURNS bigint
LANGUAGE plpgsql STRICT AS $$
DECLARE
    res bigint := pgq.seq_getval(i_seq_name);
BEGIN
    IF res < i_new_value THEN
        PERFORM setval(pgq.quote_fqname(i_seq_name), i_new_value);
        RETURN i_new_value;
    END IF;
    RETURN res;
END $$;

------------------------------------------------------------------------------------------
-- PgQ's tables, as read-only views of the engine's (monitoring scripts, pgq.PGQStatus,
-- the migration guide's checks). Ids are the engine's; a consumer's co_id is the lowest
-- id it has across streams (Conveyor keeps consumers per stream).
------------------------------------------------------------------------------------------

CREATE VIEW pgq.queue AS
SELECT s.id::integer AS queue_id, s.name AS queue_name, 3 AS queue_ntables, s.cur_table::integer AS queue_cur_table,
       s.rotation_period AS queue_rotation_period,
       s.switch_step1::text::bigint AS queue_switch_step1, s.switch_step2::text::bigint AS queue_switch_step2,
       s.switch_time AS queue_switch_time, false AS queue_external_ticker, false AS queue_disable_insert,
       s.ticker_paused AS queue_ticker_paused, s.ticker_max_count AS queue_ticker_max_count,
       s.ticker_max_lag AS queue_ticker_max_lag, s.ticker_idle_period AS queue_ticker_idle_period,
       NULL::integer AS queue_per_tx_limit, 'conveyor.stream_' || s.id AS queue_data_pfx,
       s.event_seq::text AS queue_event_seq, 'conveyor.stream_tick_seq'::text AS queue_tick_seq,
       NULL::text[] AS queue_extra_maint
  FROM conveyor.streams s;

CREATE VIEW pgq.consumer AS
SELECT min(c.id)::integer AS co_id, c.name AS co_name FROM conveyor.stream_consumers c GROUP BY c.name;

CREATE VIEW pgq.subscription AS
SELECT c.id::integer AS sub_id, c.stream_id::integer AS sub_queue,
       (SELECT min(x.id) FROM conveyor.stream_consumers x WHERE x.name = c.name)::integer AS sub_consumer,
       c.last_tick AS sub_last_tick, c.active_at AS sub_active, c.batch_id AS sub_batch, c.next_tick AS sub_next_tick
  FROM conveyor.stream_consumers c;

CREATE VIEW pgq.tick AS
SELECT t.stream_id::integer AS tick_queue, t.tick_id, t.tick_time, t.tick_snapshot::text::txid_snapshot AS tick_snapshot,
       t.tick_event_seq
  FROM conveyor.stream_ticks t;

CREATE VIEW pgq.retry_queue AS
SELECT r.retry_at AS ev_retry_after, r.stream_id::integer AS ev_queue, r.ev_id, r.ev_time, NULL::bigint AS ev_txid,
       r.consumer_id::integer AS ev_owner, r.ev_retry, r.ev_type, r.ev_data, r.ev_extra1, r.ev_extra2, r.ev_extra3,
       r.ev_extra4
  FROM conveyor.stream_retries r;

------------------------------------------------------------------------------------------
-- Change-data-capture triggers: pgq.jsontriga(), pgq.logutriga(), pgq.sqltriga()
--
-- A row trigger on any table appends each INSERT/UPDATE/DELETE (and a statement trigger
-- each TRUNCATE) to a queue with pgq.insert_event, inside the changing transaction: a
-- rolled-back change appends nothing. Arguments, event formats and error texts are those
-- of PgQ's C triggers (triggers/*.c), written here in PL/pgSQL:
--
--   arg 1           the queue
--   SKIP            BEFORE trigger only: record the change but do not apply it
--   ignore=c1,c2    leave these columns out; an UPDATE changing only them is not recorded
--   pkey=c1,c2      the key columns, instead of the table's primary key
--   backup          UPDATE: the old row in ev_extra2 (JSON for jsontriga, else urlencoded)
--   deny            refuse every change
--   ev_type=EXPR, ev_data=EXPR, ev_extra1..4=EXPR   SQL over the row's columns, overriding
--   when=EXPR       record only when EXPR (boolean) is true
--   columns _pgq_ev_type, _pgq_ev_data, _pgq_ev_extra1..4 set the fields and are not data
--
--   jsontriga: ev_type {"op":"INSERT","table":["schema","table"],"pkey":["id"]},
--              ev_data {"col":value,...} (numbers, booleans, ISO dates; else strings)
--   logutriga: ev_type I:pkeys / U:pkeys / D:pkeys / R, ev_data col=val&... urlencoded
--   sqltriga:  ev_type I / U / D / R, ev_data an SQL fragment: (cols) values (...),
--              col='v' where key='k', key='k'
--   all:       ev_extra1 schema.table
------------------------------------------------------------------------------------------

-- application/x-www-form-urlencoded as PgQ writes it: A-Z a-z 0-9 _ . - kept, space as
-- +, every other byte (of the database encoding) as %xx in lower-case hex.
CREATE FUNCTION pgq._urlencode(val text) RETURNS text
LANGUAGE sql STRICT STABLE AS $$
    SELECT replace(coalesce(string_agg(m.part[1] || regexp_replace(
                       encode(convert_to(m.part[2], getdatabaseencoding()), 'hex'), '(..)', '%\1', 'g'),
                   '' ORDER BY m.nr), ''), '%20', '+')
      FROM regexp_matches(val, '([-_.A-Za-z0-9]*)([^-_.A-Za-z0-9]*)', 'g') WITH ORDINALITY AS m(part, nr)
$$;

-- Each column's value as the type's output function writes it (NULL stays NULL).
CREATE FUNCTION pgq._row_text(cols text[], r anyelement) RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    vals text[];
BEGIN
    EXECUTE 'SELECT ARRAY[' || (SELECT string_agg(format('CASE WHEN num_nulls(r.%1$I) = 1 THEN NULL ELSE format(%2$L, r.%1$I) END',
                                                         c, '%s'), ',' ORDER BY n)
                                   FROM unnest(cols) WITH ORDINALITY AS x(c, n))
            || ']::text[] FROM (SELECT $1.*) r'
    INTO vals USING r;
    RETURN vals;
END $$;

-- Each column's value as PgQ's jsontriga encodes it.
CREATE FUNCTION pgq._row_json(cols text[], types regtype[], r anyelement) RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    vals text[];
BEGIN
    EXECUTE 'SELECT ARRAY[' || (SELECT string_agg(
                'coalesce(' || CASE
                    WHEN t = 'boolean'::regtype THEN format('CASE WHEN r.%1$I THEN ''true'' WHEN NOT r.%1$I THEN ''false'' END', c)
                    WHEN t IN ('smallint'::regtype, 'integer'::regtype, 'bigint'::regtype) THEN format('r.%I::text', c)
                    WHEN t IN ('timestamp'::regtype, 'timestamptz'::regtype, 'date'::regtype) THEN format('to_json(r.%I)::text', c)
                    ELSE format('CASE WHEN num_nulls(r.%1$I) = 0 THEN to_json(format(%2$L, r.%1$I))::text END', c, '%s')
                END || ', ''null'')', ',' ORDER BY n)
                                   FROM unnest(cols, types) WITH ORDINALITY AS x(c, t, n))
            || ']::text[] FROM (SELECT $1.*) r'
    INTO vals USING r;
    RETURN vals;
END $$;

-- Which columns differ between two rows (binary image comparison: no equality operator
-- needed, and a NULL equals a NULL).
CREATE FUNCTION pgq._row_changed(cols text[], old_row anyelement, new_row anyelement) RETURNS boolean[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    changed boolean[];
BEGIN
    EXECUTE 'SELECT ARRAY[' || (SELECT string_agg(format('ROW(o.%1$I)::record *<> ROW(n.%1$I)::record', c), ',' ORDER BY nr)
                                   FROM unnest(cols) WITH ORDINALITY AS x(c, nr))
            || ']::boolean[] FROM (SELECT $1.*) o, (SELECT $2.*) n'
    INTO changed USING old_row, new_row;
    RETURN changed;
END $$;

-- One value of the encodings: urlencoded pairs, or a JSON object.
CREATE FUNCTION pgq._encode(kind text, cols text[], skipped boolean[], vals text[]) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN kind = 'json'
                THEN '{' || coalesce(string_agg(to_json(c)::text || ':' || v, ',' ORDER BY n), '') || '}'
                ELSE coalesce(string_agg(pgq._urlencode(c) || coalesce('=' || pgq._urlencode(v), ''), '&' ORDER BY n), '')
           END
      FROM unnest(cols, skipped, vals) WITH ORDINALITY AS x(c, s, v, n)
     WHERE NOT s
$$;

-- sqltriga's SQL fragment; NULL when an UPDATE changed only ignored columns.
CREATE FUNCTION pgq._sql_fragment(opc text, cols text[], skipped boolean[], is_pkey boolean[], changed boolean[],
                                  old_vals text[], new_vals text[]) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    sets text[] := '{}';
    keys text[] := '{}';
    ignored integer := 0;
BEGIN
    IF opc = 'I' THEN
        RETURN '(' || coalesce((SELECT string_agg(quote_ident(c), ',' ORDER BY n)
                                  FROM unnest(cols, skipped) WITH ORDINALITY AS x(c, s, n) WHERE NOT s), '')
               || ') values ('
               || coalesce((SELECT string_agg(coalesce(quote_literal(v), 'null'), ',' ORDER BY n)
                              FROM unnest(skipped, new_vals) WITH ORDINALITY AS x(s, v, n) WHERE NOT s), '')
               || ')';
    END IF;
    FOR i IN 1 .. cardinality(cols) LOOP
        IF is_pkey[i] THEN
            IF old_vals[i] IS NULL THEN
                RAISE EXCEPTION 'logtriga: Unexpected NULL key value';
            END IF;
            keys := keys || (quote_ident(cols[i]) || '=' || quote_literal(old_vals[i]));
        END IF;
        IF opc = 'U' AND changed[i] THEN
            IF is_pkey[i] THEN
                RAISE EXCEPTION 'primary key update not allowed';
            ELSIF skipped[i] THEN
                ignored := ignored + 1;
            ELSE
                sets := sets || (quote_ident(cols[i]) || '=' || coalesce(quote_literal(new_vals[i]), 'NULL'));
            END IF;
        END IF;
    END LOOP;
    IF opc = 'D' THEN
        RETURN array_to_string(keys, ' and ');
    END IF;
    IF cardinality(sets) = 0 THEN
        IF ignored > 0 THEN
            RETURN NULL;
        END IF;
        sets := keys[1:1];  -- a no-op update: the first key set to itself
    END IF;
    RETURN array_to_string(sets, ',') || ' where ' || array_to_string(keys, ' and ');
END $$;

-- The body of the three triggers: checks the call, parses the arguments, builds the event
-- and inserts it. Returns whether SKIP was given (the trigger then returns NULL).
CREATE FUNCTION pgq._trigger_event(kind text, op text, tg_when text, tg_level text, relid oid, tschema text,
                                   tname text, tg_args text[], old_row anyelement, new_row anyelement)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    args text[] := ARRAY(SELECT unnest(tg_args));
    tbl text := tschema || '.' || tname;
    opc text := CASE op WHEN 'INSERT' THEN 'I' WHEN 'UPDATE' THEN 'U' WHEN 'DELETE' THEN 'D' ELSE 'R' END;
    fields constant text[] := ARRAY['ev_type', 'ev_data', 'ev_extra1', 'ev_extra2', 'ev_extra3', 'ev_extra4', 'when'];
    exprs text[] := ARRAY[NULL, NULL, NULL, NULL, NULL, NULL, NULL];
    ev text[] := ARRAY['', '', tbl, NULL, NULL, NULL];  -- type, data, extra1..4
    qname text;
    skip boolean := false;
    backup boolean := false;
    deny boolean := false;
    ignore_arg text;
    pkey_arg text;
    name text;
    table_pkey text[];
    key_names text[];
    ignore_names text[];
    cols text[];
    types regtype[];
    skipped boolean[];
    is_pkey boolean[];
    changed boolean[];
    old_vals text[];
    new_vals text[];
    row_vals text[];
    ignored integer := 0;
    wanted boolean;
    typ oid;
    is_null boolean;
    val text;
BEGIN
    IF current_setting('session_replication_role') = 'local' THEN
        RETURN false;
    END IF;
    IF opc = 'R' AND tg_level <> 'STATEMENT' THEN
        RAISE EXCEPTION 'pgq tRuncate trigger must be fired FOR EACH STATEMENT';
    ELSIF opc <> 'R' AND tg_level <> 'ROW' THEN
        RAISE EXCEPTION 'pgq Ins/Upd/Del trigger must be fired FOR EACH ROW';
    END IF;
    IF coalesce(cardinality(args), 0) < 1 THEN
        RAISE EXCEPTION 'pgq trigger must have destination queue as argument';
    END IF;
    qname := args[1];
    FOR i IN 2 .. cardinality(args) LOOP
        IF args[i] = 'SKIP' THEN
            skip := true;
        ELSIF args[i] LIKE 'ignore=%' THEN
            ignore_arg := substr(args[i], 8);
        ELSIF args[i] LIKE 'pkey=%' THEN
            pkey_arg := substr(args[i], 6);
        ELSIF args[i] = 'backup' THEN
            backup := true;
        ELSIF args[i] = 'deny' THEN
            deny := true;
        ELSIF split_part(args[i], '=', 1) = ANY (fields) AND position('=' IN args[i]) > 0 THEN
            IF opc = 'R' THEN
                RAISE EXCEPTION 'Custom expressions do not make sense for truncater trigger';
            END IF;
            name := split_part(args[i], '=', 1);
            exprs[array_position(fields, name)] := substr(args[i], length(name) + 2);
        ELSE
            RAISE EXCEPTION 'bad param to pgq trigger';
        END IF;
    END LOOP;
    IF opc = 'R' AND ignore_arg IS NOT NULL THEN
        RAISE EXCEPTION 'Column ignore does not make sense for truncate trigger';
    ELSIF opc = 'R' AND pkey_arg IS NOT NULL THEN
        RAISE EXCEPTION 'Custom pkey_list does not make sense for truncate trigger';
    ELSIF opc = 'R' AND backup THEN
        RAISE EXCEPTION 'Backup does not make sense for truncate trigger';
    END IF;

    SELECT coalesce(array_agg(k.attname::text ORDER BY k.attnum), '{}') INTO table_pkey
      FROM pg_index i JOIN pg_attribute k ON k.attrelid = i.indexrelid
     WHERE i.indrelid = relid AND i.indisprimary AND k.attnum > 0 AND NOT k.attisdropped;
    IF opc IN ('U', 'D') AND coalesce(pkey_arg, array_to_string(table_pkey, ',')) = '' THEN
        RAISE EXCEPTION 'Update/Delete on table without pkey';
    END IF;
    IF skip AND tg_when = 'AFTER' THEN
        RAISE EXCEPTION 'SKIP does not work in AFTER trigger.';
    END IF;
    IF deny THEN
        RAISE EXCEPTION 'Table ''%'' to queue ''%'': change not allowed (%)', tbl, qname, op;
    END IF;

    ev[1] := CASE kind
        WHEN 'json' THEN format('{"op":"%s","table":[%s,%s],"pkey":[%s]}', op, to_json(tschema), to_json(tname),
                                coalesce((SELECT string_agg(to_json(k)::text, ',' ORDER BY n)
                                            FROM unnest(coalesce(string_to_array(pkey_arg, ','), table_pkey))
                                                 WITH ORDINALITY AS x(k, n)), ''))
        WHEN 'logu' THEN opc || CASE WHEN opc = 'R' THEN '' ELSE ':' || coalesce(pkey_arg, array_to_string(table_pkey, ',')) END
        ELSE opc END;
    IF opc = 'R' THEN
        ev[2] := CASE kind WHEN 'json' THEN '{}' ELSE '' END;
        PERFORM pgq.insert_event(qname, ev[1], ev[2], ev[3], ev[4], ev[5], ev[6]);
        RETURN skip;
    END IF;

    -- the columns: magic ones (_pgq_ev_*) and ignored ones are not data; keys
    SELECT array_agg(a.attname::text ORDER BY a.attnum), array_agg(a.atttypid::regtype ORDER BY a.attnum)
      INTO cols, types
      FROM pg_attribute a WHERE a.attrelid = relid AND a.attnum > 0 AND NOT a.attisdropped;
    ignore_names := regexp_split_to_array(ignore_arg, '[\s,]+');
    key_names := coalesce(regexp_split_to_array(pkey_arg, '[\s,]+'), table_pkey);
    SELECT array_agg(c LIKE '\_pgq\_ev\_%' OR c = ANY (coalesce(ignore_names, '{}')) ORDER BY n),
           array_agg(c NOT LIKE '\_pgq\_ev\_%' AND c = ANY (key_names) ORDER BY n)
      INTO skipped, is_pkey FROM unnest(cols) WITH ORDINALITY AS x(c, n);
    IF opc <> 'I' THEN
        old_vals := pgq._row_text(cols, old_row);
    END IF;
    IF opc <> 'D' THEN
        new_vals := pgq._row_text(cols, new_row);
    END IF;
    row_vals := CASE WHEN opc = 'D' THEN old_vals ELSE new_vals END;

    IF opc = 'U' THEN
        changed := pgq._row_changed(cols, old_row, new_row);
        IF backup THEN
            ev[4] := CASE WHEN kind = 'json' THEN pgq._encode(kind, cols, skipped, pgq._row_json(cols, types, old_row))
                          ELSE pgq._encode('logu', cols, skipped, old_vals) END;
        END IF;
    END IF;

    IF kind = 'sql' THEN
        ev[2] := pgq._sql_fragment(opc, cols, skipped, is_pkey, changed, old_vals, new_vals);
        IF ev[2] IS NULL THEN
            RETURN skip;  -- only ignored columns changed
        END IF;
    ELSE
        IF opc = 'U' THEN
            -- keys must not change; with ignore=, a change of ignored columns only is none
            wanted := NULL;
            FOR i IN 1 .. cardinality(cols) LOOP
                CONTINUE WHEN (NOT is_pkey[i] AND ignore_arg IS NULL) OR NOT changed[i];
                IF is_pkey[i] THEN
                    RAISE EXCEPTION 'primary key update not allowed';
                ELSIF skipped[i] THEN
                    ignored := ignored + 1;
                ELSE
                    wanted := true;
                    EXIT;
                END IF;
            END LOOP;
            IF NOT coalesce(wanted, ignored = 0) THEN
                RETURN skip;
            END IF;
        END IF;
        ev[2] := pgq._encode(kind, cols, skipped,
                             CASE WHEN kind = 'json' THEN pgq._row_json(cols, types, CASE WHEN opc = 'D' THEN old_row ELSE new_row END)
                                  ELSE row_vals END);
    END IF;

    -- fields from the magic columns, then from the expressions
    FOR i IN 1 .. cardinality(cols) LOOP
        CONTINUE WHEN cols[i] NOT LIKE '\_pgq\_ev\_%';
        IF substr(cols[i], 6) <> ALL (fields[1:6]) THEN
            RAISE EXCEPTION 'Unknown magic column: %', cols[i];
        END IF;
        ev[array_position(fields, substr(cols[i], 6))] := row_vals[i];
    END LOOP;
    FOR f IN 1 .. 7 LOOP
        CONTINUE WHEN exprs[f] IS NULL;
        EXECUTE 'SELECT pg_typeof(v)::oid, num_nulls(v) = 1, format(''%s'', v) FROM (SELECT (' || exprs[f]
                || ') AS v FROM (SELECT $1.*) r) x'
           INTO typ, is_null, val USING CASE WHEN opc = 'D' THEN old_row ELSE new_row END;
        IF f < 7 THEN
            ev[f] := CASE WHEN is_null THEN NULL ELSE val END;
        ELSIF typ <> 'boolean'::regtype THEN
            RAISE EXCEPTION 'when= query result must be boolean, got=%', typ;
        ELSIF is_null THEN
            RAISE EXCEPTION 'when= should not be NULL';
        ELSIF val = 'f' THEN
            RETURN skip;
        END IF;
    END LOOP;

    PERFORM pgq.insert_event(qname, ev[1], ev[2], ev[3], ev[4], ev[5], ev[6]);
    RETURN skip;
END $$;

CREATE FUNCTION pgq.jsontriga() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    skip boolean;
BEGIN
    IF TG_LEVEL = 'ROW' THEN
        skip := pgq._trigger_event('json', TG_OP, TG_WHEN, TG_LEVEL, TG_RELID, TG_TABLE_SCHEMA, TG_TABLE_NAME,
                                   TG_ARGV, OLD, NEW);
    ELSE
        skip := pgq._trigger_event('json', TG_OP, TG_WHEN, TG_LEVEL, TG_RELID, TG_TABLE_SCHEMA, TG_TABLE_NAME,
                                   TG_ARGV, NULL::text, NULL::text);
    END IF;
    IF skip OR TG_WHEN = 'AFTER' OR TG_LEVEL = 'STATEMENT' THEN
        RETURN NULL;
    END IF;
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END $$;

CREATE FUNCTION pgq.logutriga() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    skip boolean;
BEGIN
    IF TG_LEVEL = 'ROW' THEN
        skip := pgq._trigger_event('logu', TG_OP, TG_WHEN, TG_LEVEL, TG_RELID, TG_TABLE_SCHEMA, TG_TABLE_NAME,
                                   TG_ARGV, OLD, NEW);
    ELSE
        skip := pgq._trigger_event('logu', TG_OP, TG_WHEN, TG_LEVEL, TG_RELID, TG_TABLE_SCHEMA, TG_TABLE_NAME,
                                   TG_ARGV, NULL::text, NULL::text);
    END IF;
    IF skip OR TG_WHEN = 'AFTER' OR TG_LEVEL = 'STATEMENT' THEN
        RETURN NULL;
    END IF;
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END $$;

CREATE FUNCTION pgq.sqltriga() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    skip boolean;
BEGIN
    IF TG_LEVEL = 'ROW' THEN
        skip := pgq._trigger_event('sql', TG_OP, TG_WHEN, TG_LEVEL, TG_RELID, TG_TABLE_SCHEMA, TG_TABLE_NAME,
                                   TG_ARGV, OLD, NEW);
    ELSE
        skip := pgq._trigger_event('sql', TG_OP, TG_WHEN, TG_LEVEL, TG_RELID, TG_TABLE_SCHEMA, TG_TABLE_NAME,
                                   TG_ARGV, NULL::text, NULL::text);
    END IF;
    IF skip OR TG_WHEN = 'AFTER' OR TG_LEVEL = 'STATEMENT' THEN
        RETURN NULL;
    END IF;
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END $$;

------------------------------------------------------------------------------------------
-- Roles: Conveyor's (PgQ's pgq_reader/pgq_writer/pgq_admin are not created; grant the
-- conveyor_* role of the same rank). Consuming is writing, as for streams.
------------------------------------------------------------------------------------------

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgq FROM PUBLIC;

DO $$
BEGIN
    GRANT USAGE ON SCHEMA pgq TO conveyor_reader;
    GRANT SELECT ON pgq.queue, pgq.consumer, pgq.subscription, pgq.tick, pgq.retry_queue TO conveyor_reader;
    GRANT EXECUTE ON FUNCTION
        pgq.get_queue_info(), pgq.get_queue_info(text), pgq.get_consumer_info(), pgq.get_consumer_info(text),
        pgq.get_consumer_info(text, text), pgq.get_batch_info(bigint), pgq.version(), pgq.quote_fqname(text),
        pgq.seq_getval(text)
        TO conveyor_reader;
    GRANT EXECUTE ON FUNCTION
        pgq.insert_event(text, text, text), pgq.insert_event(text, text, text, text, text, text, text),
        pgq.current_event_table(text), pgq.register_consumer(text, text),
        pgq.register_consumer_at(text, text, bigint), pgq.unregister_consumer(text, text),
        pgq.next_batch(text, text), pgq.next_batch_info(text, text),
        pgq.next_batch_custom(text, text, interval, integer, interval), pgq.batch_event_sql(bigint),
        pgq.batch_event_tables(bigint), pgq.get_batch_events(bigint),
        pgq.get_batch_cursor(bigint, text, integer, text), pgq.get_batch_cursor(bigint, text, integer),
        pgq.event_retry(bigint, bigint, timestamptz), pgq.event_retry(bigint, bigint, integer),
        pgq.batch_retry(bigint, integer), pgq.finish_batch(bigint), pgq.force_tick(text),
        pgq.jsontriga(), pgq.logutriga(), pgq.sqltriga(), pgq._urlencode(text),
        pgq._trigger_event(text, text, text, text, oid, text, text, text[], anyelement, anyelement),
        pgq._row_text(text[], anyelement), pgq._row_json(text[], regtype[], anyelement),
        pgq._row_changed(text[], anyelement, anyelement), pgq._encode(text, text[], boolean[], text[]),
        pgq._sql_fragment(text, text[], boolean[], boolean[], boolean[], text[], text[])
        TO conveyor_writer;
    GRANT EXECUTE ON FUNCTION
        pgq.create_queue(text), pgq.drop_queue(text), pgq.drop_queue(text, boolean),
        pgq.set_queue_config(text, text, text), pgq.ticker(), pgq.ticker(text),
        pgq.ticker(text, bigint, timestamptz, bigint), pgq.maint_operations(), pgq.maint_retry_events(),
        pgq.maint_rotate_tables_step1(text), pgq.maint_rotate_tables_step2(), pgq.maint_tables_to_vacuum(),
        pgq.seq_setval(text, bigint)
        TO conveyor_admin;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: roles missing, grants skipped (%)', SQLERRM;
END $$;
