-- The pgq dialect's functions and views (docs/dialects.md).
--
-- Current definitions, re-applied whenever a file of this folder changes (docs/architecture.md,
-- "Where each SQL function's current definition lives"). Edit a function here; tables, types,
-- indexes, data and DROPs go in a new numbered migration.

-- The stream behind a queue name, or PgQ's error for the calling function (each PgQ
-- function words "no such queue" its own way).
CREATE OR REPLACE FUNCTION pgq._queue(queue_name text, missing text) RETURNS conveyor.streams
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

CREATE OR REPLACE FUNCTION pgq._last_tick(stream bigint) RETURNS conveyor.stream_ticks
LANGUAGE sql STABLE AS $$
    SELECT * FROM conveyor.stream_ticks WHERE stream_id = stream ORDER BY tick_id DESC LIMIT 1
$$;

-- 1 when created, 0 when it existed. The stream starts with a tick, as PgQ's queue does.
CREATE OR REPLACE FUNCTION pgq.create_queue(i_queue_name text) RETURNS integer
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

CREATE OR REPLACE FUNCTION pgq.drop_queue(x_queue_name text, x_force boolean) RETURNS integer
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

CREATE OR REPLACE FUNCTION pgq.drop_queue(x_queue_name text) RETURNS integer
LANGUAGE sql STRICT SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
    SELECT pgq.drop_queue(x_queue_name, false)
$$;

-- PgQ's settable parameters map onto the stream's options of the same meaning.
-- external_ticker can only stay false: Conveyor ticks every stream itself.
CREATE OR REPLACE FUNCTION pgq.set_queue_config(x_queue_name text, x_param_name text, x_param_value text)
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

-- A plain wrapper (no SET clause, so the planner inlines it); the 7-argument form checks.
CREATE OR REPLACE FUNCTION pgq.insert_event(queue_name text, ev_type text, ev_data text) RETURNS bigint
LANGUAGE sql AS $$
    SELECT pgq.insert_event(queue_name, ev_type, ev_data, NULL, NULL, NULL, NULL)
$$;

-- The table to INSERT or COPY into directly (pgq.bulk_insert_events in Python). The
-- transaction id is taken here, before the table is named, so an insert in the same
-- transaction is safe against a rotation; ev_id gets the stream's sequence as default.
CREATE OR REPLACE FUNCTION pgq.current_event_table(x_queue_name text) RETURNS text
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

-- From the queue's latest tick on (1), or 0 when already registered; with a tick, the
-- consumer is (re)positioned there.
CREATE OR REPLACE FUNCTION pgq.register_consumer_at(x_queue_name text, x_consumer_name text, x_tick_pos bigint)
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

CREATE OR REPLACE FUNCTION pgq.register_consumer(x_queue_name text, x_consumer_id text) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
    SELECT pgq.register_consumer_at(x_queue_name, x_consumer_id, NULL)
$$;

-- 1 when unregistered (its pending retries go too), 0 when it was not registered.
CREATE OR REPLACE FUNCTION pgq.unregister_consumer(x_queue_name text, x_consumer_name text) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM conveyor.stream_consumers c JOIN conveyor.streams s ON s.id = c.stream_id
                    WHERE s.name = x_queue_name AND c.name = x_consumer_name) THEN
        RETURN 0;
    END IF;
    PERFORM conveyor.stream_unsubscribe(x_queue_name, x_consumer_name);
    RETURN 1;
END $$;

-- Opens the consumer's next batch through the engine (or returns the open one) and
-- describes it. All columns NULL when there is no new tick yet.
CREATE OR REPLACE FUNCTION pgq.next_batch_custom(
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

CREATE OR REPLACE FUNCTION pgq.next_batch_info(
    i_queue_name text, i_consumer_name text,
    OUT batch_id bigint, OUT cur_tick_id bigint, OUT prev_tick_id bigint,
    OUT cur_tick_time timestamptz, OUT prev_tick_time timestamptz,
    OUT cur_tick_event_seq bigint, OUT prev_tick_event_seq bigint)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
    SELECT * FROM pgq.next_batch_custom(i_queue_name, i_consumer_name, NULL, NULL, NULL)
$$;

-- The SELECT of a batch's events in PgQ's column order, with the engine's batch rule
-- (conveyor._batch: its tables and ticks; conveyor._between_snapshots: the snapshot
-- condition, this consumer's retries included; the stream's event_ttl). Values are
-- inlined, so the text runs with the caller's rights (get_batch_cursor's extra_where).
CREATE OR REPLACE FUNCTION pgq.batch_event_sql(x_batch_id bigint) RETURNS text
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

CREATE OR REPLACE FUNCTION pgq.batch_event_tables(x_batch_id bigint) RETURNS SETOF text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
BEGIN
    IF (pgq._batch_owner(x_batch_id)).id IS NULL THEN
        RAISE EXCEPTION 'Cannot find data for batch %', x_batch_id;
    END IF;
    RETURN QUERY SELECT unnest((conveyor._batch(x_batch_id)).tables);
END $$;

CREATE OR REPLACE FUNCTION pgq.get_batch_events(
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
CREATE OR REPLACE FUNCTION pgq.get_batch_cursor(
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

CREATE OR REPLACE FUNCTION pgq.get_batch_cursor(
    i_batch_id bigint, i_cursor_name text, i_quick_limit integer,
    OUT ev_id bigint, OUT ev_time timestamptz, OUT ev_txid bigint, OUT ev_retry integer,
    OUT ev_type text, OUT ev_data text, OUT ev_extra1 text, OUT ev_extra2 text,
    OUT ev_extra3 text, OUT ev_extra4 text)
RETURNS SETOF record
LANGUAGE sql STRICT AS $$
    SELECT * FROM pgq.get_batch_cursor(i_batch_id, i_cursor_name, i_quick_limit, NULL)
$$;

CREATE OR REPLACE FUNCTION pgq.get_batch_info(
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
CREATE OR REPLACE FUNCTION pgq.event_retry(x_batch_id bigint, x_event_id bigint, x_retry_time timestamptz) RETURNS integer
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

CREATE OR REPLACE FUNCTION pgq.event_retry(x_batch_id bigint, x_event_id bigint, x_retry_seconds integer) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
    SELECT pgq.event_retry(x_batch_id, x_event_id, current_timestamp + make_interval(secs => x_retry_seconds))
$$;

-- Every event of the batch back for this consumer (those not already waiting for a
-- retry); returns how many. The batch still has to be finished.
CREATE OR REPLACE FUNCTION pgq.batch_retry(i_batch_id bigint, i_retry_seconds integer) RETURNS integer
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
CREATE OR REPLACE FUNCTION pgq.finish_batch(x_batch_id bigint) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
BEGIN
    IF (pgq._batch_owner(x_batch_id)).id IS NULL THEN
        RAISE WARNING 'finish_batch: batch % not found', x_batch_id;
        RETURN 0;
    END IF;
    RETURN conveyor.stream_finish_batch(x_batch_id);
END $$;

CREATE OR REPLACE FUNCTION pgq.get_queue_info(
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

CREATE OR REPLACE FUNCTION pgq.get_queue_info(
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

CREATE OR REPLACE FUNCTION pgq.get_consumer_info(
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

CREATE OR REPLACE FUNCTION pgq.get_consumer_info(
    i_queue_name text,
    OUT queue_name text, OUT consumer_name text, OUT lag interval, OUT last_seen interval,
    OUT last_tick bigint, OUT current_batch bigint, OUT next_tick bigint, OUT pending_events bigint)
RETURNS SETOF record
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
    SELECT * FROM pgq.get_consumer_info(i_queue_name, NULL)
$$;

CREATE OR REPLACE FUNCTION pgq.get_consumer_info(
    OUT queue_name text, OUT consumer_name text, OUT lag interval, OUT last_seen interval,
    OUT last_tick bigint, OUT current_batch bigint, OUT next_tick bigint, OUT pending_events bigint)
RETURNS SETOF record
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
    SELECT * FROM pgq.get_consumer_info(NULL, NULL)
$$;

-- The PgQ API level this dialect implements.
CREATE OR REPLACE FUNCTION pgq.version() RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT '3.5'::text
$$;

-- Ticks one queue when it needs a tick (the engine's rule: ticker_max_count events, or
-- events and ticker_max_lag, or ticker_idle_period); the new tick's id, or NULL.
CREATE OR REPLACE FUNCTION pgq.ticker(i_queue_name text) RETURNS bigint
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
CREATE OR REPLACE FUNCTION pgq.ticker() RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
    SELECT conveyor.ticker()::bigint
$$;

-- PgQ's external ticker (ticks copied from another database, for cascading). Conveyor
-- queues always tick themselves, so like PgQ for a queue without an external ticker:
CREATE OR REPLACE FUNCTION pgq.ticker(i_queue_name text, i_tick_id bigint, i_orig_timestamp timestamptz, i_event_seq bigint)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
BEGIN
    RAISE EXCEPTION 'queue not found or ticker disabled: %', i_queue_name;
END $$;

-- PgQ makes the next ticker run tick; Conveyor ticks at once. Returns the tick that was
-- the latest before, as PgQ does, so "wait for a tick after this one" ends at once.
CREATE OR REPLACE FUNCTION pgq.force_tick(i_queue_name text) RETURNS bigint
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
CREATE OR REPLACE FUNCTION pgq.maint_rotate_tables_step1(i_queue_name text) RETURNS integer
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
CREATE OR REPLACE FUNCTION pgq.maint_rotate_tables_step2() RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
    UPDATE conveyor.streams SET switch_step2 = pg_current_xact_id() WHERE switch_step2 IS NULL;
    SELECT 0;
$$;

-- One round of the engine's maintenance (conveyor.maint(): due retries and delayed
-- events into their streams, old ticks dropped, rotation steps); returns the events moved,
-- so pgqd's "call again while > 0" loop ends.
CREATE OR REPLACE FUNCTION pgq.maint_retry_events() RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
    SELECT coalesce(sum(m.count), 0)::integer FROM conveyor.maint() m WHERE m.operation IN ('retries', 'delayed')
$$;

CREATE OR REPLACE FUNCTION pgq.maint_tables_to_vacuum() RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
    SELECT t FROM conveyor.maint_tables_to_vacuum() t WHERE current_setting('autovacuum') <> 'on'
$$;

CREATE OR REPLACE FUNCTION pgq.quote_fqname(i_name text) RETURNS text
LANGUAGE sql STRICT IMMUTABLE AS $$
    SELECT CASE WHEN position('.' IN i_name) > 0
                THEN quote_ident(split_part(i_name, '.', 1)) || '.'
                     || quote_ident(substring(i_name FROM position('.' IN i_name) + 1))
                ELSE 'public.' || quote_ident(i_name) END
$$;

CREATE OR REPLACE FUNCTION pgq.seq_getval(i_seq_name text) RETURNS bigint
LANGUAGE plpgsql STRICT AS $$
DECLARE
    res bigint;
BEGIN
    EXECUTE 'select last_value from ' || pgq.quote_fqname(i_seq_name) INTO res;
    RETURN res;
END $$;

-- Like setval(), but never backwards.
CREATE OR REPLACE FUNCTION pgq.seq_setval(i_seq_name text, i_new_value bigint) RETURNS bigint
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

CREATE OR REPLACE VIEW pgq.consumer AS
SELECT min(c.id)::integer AS co_id, c.name AS co_name FROM conveyor.stream_consumers c GROUP BY c.name;

CREATE OR REPLACE VIEW pgq.subscription AS
SELECT c.id::integer AS sub_id, c.stream_id::integer AS sub_queue,
       (SELECT min(x.id) FROM conveyor.stream_consumers x WHERE x.name = c.name)::integer AS sub_consumer,
       c.last_tick AS sub_last_tick, c.active_at AS sub_active, c.batch_id AS sub_batch, c.next_tick AS sub_next_tick
  FROM conveyor.stream_consumers c;

CREATE OR REPLACE VIEW pgq.tick AS
SELECT t.stream_id::integer AS tick_queue, t.tick_id, t.tick_time, t.tick_snapshot::text::txid_snapshot AS tick_snapshot,
       t.tick_event_seq
  FROM conveyor.stream_ticks t;

CREATE OR REPLACE VIEW pgq.retry_queue AS
SELECT r.retry_at AS ev_retry_after, r.stream_id::integer AS ev_queue, r.ev_id, r.ev_time, NULL::bigint AS ev_txid,
       r.consumer_id::integer AS ev_owner, r.ev_retry, r.ev_type, r.ev_data, r.ev_extra1, r.ev_extra2, r.ev_extra3,
       r.ev_extra4
  FROM conveyor.stream_retries r;

-- Each column's value as the type's output function writes it (NULL stays NULL).
CREATE OR REPLACE FUNCTION pgq._row_text(cols text[], r anyelement) RETURNS text[]
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
CREATE OR REPLACE FUNCTION pgq._row_json(cols text[], types regtype[], r anyelement) RETURNS text[]
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
CREATE OR REPLACE FUNCTION pgq._row_changed(cols text[], old_row anyelement, new_row anyelement) RETURNS boolean[]
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

-- sqltriga's SQL fragment; NULL when an UPDATE changed only ignored columns.
CREATE OR REPLACE FUNCTION pgq._sql_fragment(opc text, cols text[], skipped boolean[], is_pkey boolean[], changed boolean[],
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

CREATE OR REPLACE FUNCTION pgq.jsontriga() RETURNS trigger
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

CREATE OR REPLACE FUNCTION pgq.logutriga() RETURNS trigger
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

CREATE OR REPLACE FUNCTION pgq.sqltriga() RETURNS trigger
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

-- The statements for the streams ids[lo..hi] (sorted): a binary search on stream_id.
CREATE OR REPLACE FUNCTION pgq._insert_event_branch(ids bigint[], lo integer, hi integer) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    mid integer := (lo + hi) / 2;
    -- (the id drawn first, in an assignment: cheaper than the INSERT's RETURNING)
    insert_into constant text := 'INSERT INTO conveyor.%I (ev_id, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, '
                                 'ev_extra4) VALUES (id, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4);';
BEGIN
    IF lo > hi THEN
        RETURN '';
    END IF;
    IF lo = hi THEN
        RETURN format(E'IF stream_id = %s THEN\n    id := nextval(seq);\n    CASE cur_table\n'
                      || E'    WHEN 0 THEN %s\n    WHEN 1 THEN %s\n    ELSE %s\n    END CASE;\n    RETURN id;\nEND IF;\n',
                      ids[lo], format(insert_into, 'stream_' || ids[lo] || '_0'),
                      format(insert_into, 'stream_' || ids[lo] || '_1'), format(insert_into, 'stream_' || ids[lo] || '_2'));
    END IF;
    RETURN format(E'IF stream_id <= %s THEN\n%sELSE\n%sEND IF;\n', ids[mid], pgq._insert_event_branch(ids, lo, mid),
                  pgq._insert_event_branch(ids, mid + 1, hi));
END $$;

-- pgq.insert_event with the statements for the streams `ids`.
CREATE OR REPLACE FUNCTION pgq._insert_event_source(ids bigint[]) RETURNS text
LANGUAGE sql IMMUTABLE AS $src$
    SELECT $head$
CREATE OR REPLACE FUNCTION pgq.insert_event(queue_name text, ev_type text, ev_data text,
                                            ev_extra1 text, ev_extra2 text, ev_extra3 text, ev_extra4 text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $insert_event$
-- Written by pgq._insert_event_rewrite (dialect migration pgq/0002) for the streams there were.
DECLARE
    stream_id bigint;
    cur_table smallint;
    seq regclass;
    id bigint;
BEGIN
    IF queue_name IS NULL THEN
        RAISE EXCEPTION 'Queue name must not be NULL';
    END IF;
    PERFORM pg_current_xact_id();
    SELECT x.id, x.cur_table, x.event_seq INTO stream_id, cur_table, seq
      FROM conveyor.streams x WHERE x.name = insert_event.queue_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'No such queue';
    END IF;
$head$ || pgq._insert_event_branch(ids, 1, cardinality(ids)) || $tail$
    -- a stream created after this function was written
    PERFORM pgq._insert_event_rewrite();
    EXECUTE format('INSERT INTO conveyor.%I (ev_id, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
                    VALUES (nextval($1), $2, $3, $4, $5, $6, $7) RETURNING ev_id',
                   'stream_' || stream_id || '_' || cur_table)
    INTO id USING seq, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4;
    RETURN id;
END $insert_event$
$tail$
$src$;

-- Writes pgq.insert_event again for the streams this transaction sees, unless another
-- transaction is doing it (then returns false at once). CREATE OR REPLACE keeps its grants.
CREATE OR REPLACE FUNCTION pgq._insert_event_rewrite() RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('pgq._insert_event_rewrite')) THEN
        RETURN false;
    END IF;
    SELECT coalesce(array_agg(s.id ORDER BY s.id), '{}') INTO ids FROM conveyor.streams s;
    EXECUTE pgq._insert_event_source(ids);
    RETURN true;
END $$;

-- pgq.insert_event(text, text, text, text, text, text, text) is this function's writing
-- (0001 made the first, with the EXECUTE path only): written again for the streams there are.
SELECT pgq._insert_event_rewrite();

CREATE OR REPLACE FUNCTION pgq._batch_owner(batch bigint) RETURNS conveyor.stream_consumers
LANGUAGE plpgsql STABLE AS $$
DECLARE
    c conveyor.stream_consumers;
BEGIN
    SELECT * INTO c FROM conveyor.stream_consumers x WHERE x.batch_id = batch;
    RETURN c;
END $$;

CREATE OR REPLACE FUNCTION pgq.next_batch(i_queue_name text, i_consumer_name text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
BEGIN
    RETURN (SELECT n.batch_id FROM pgq.next_batch_custom(i_queue_name, i_consumer_name, NULL, NULL, NULL) n);
END $$;

-- Types whose value to_json(row) gives as the type's output text (a JSON number or
-- string), or as a form that casts back to the type (true/false; ISO dates and times,
-- in the session's time zone): for these, the row's JSON is the row's text. By OID (the
-- built-in types' fixed ones, so that the array is a constant): boolean, smallint,
-- integer, bigint, numeric, real, double precision, oid, text, varchar, char(n), name,
-- "char", uuid, bytea, interval, time, timetz, date, timestamp, timestamptz, inet, cidr,
-- macaddr.
CREATE OR REPLACE FUNCTION pgq._json_text_types() RETURNS oid[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT '{16,21,23,20,1700,700,701,26,25,1043,1042,19,18,2950,17,1186,1083,1266,1082,1114,1184,869,650,829}'::oid[]
$$;

-- One value of the row's JSON (json_each(to_json(row))) of a type listed above: as the
-- type's output function writes it (NULL for SQL NULL), and as PgQ's jsontriga encodes
-- it (booleans, integers and dates as JSON gives them, the rest as the JSON string of the
-- text; 'null'). SQL functions, inlined into the queries below.
CREATE OR REPLACE FUNCTION pgq._json_value_text(value json, typ regtype) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN value::text = 'null' THEN NULL
                WHEN typ = 'boolean'::regtype THEN CASE WHEN value::text = 'true' THEN 't' ELSE 'f' END
                WHEN typ = 'date'::regtype THEN (value #>> '{}')::date::text
                WHEN typ = 'timestamp'::regtype THEN (value #>> '{}')::timestamp::text
                WHEN typ = 'timestamptz'::regtype THEN (value #>> '{}')::timestamptz::text
                ELSE value #>> '{}' END
$$;

CREATE OR REPLACE FUNCTION pgq._json_value_json(value json, typ regtype) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN value::text = 'null'
                     OR typ IN ('boolean'::regtype, 'smallint'::regtype, 'integer'::regtype, 'bigint'::regtype,
                                'date'::regtype, 'timestamp'::regtype, 'timestamptz'::regtype)
                THEN value::text
                ELSE to_json(value #>> '{}')::text END
$$;

-- Each column's value as the type's output function writes it (NULL stays NULL): what
-- pgq._row_text returns, from the row's JSON where every column's type allows.
CREATE OR REPLACE FUNCTION pgq._row_values(cols text[], types regtype[], r anyelement) RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF types::oid[] <@ pgq._json_text_types() THEN
        RETURN ARRAY(SELECT pgq._json_value_text(j.value, t.typ)
                       FROM json_each(to_json(r)) WITH ORDINALITY AS j(key, value, n)
                       JOIN unnest(types) WITH ORDINALITY AS t(typ, n) ON t.n = j.n
                      ORDER BY j.n);
    END IF;
    RETURN pgq._row_text(cols, r);
END $$;

-- application/x-www-form-urlencoded as PgQ writes it (0001's rule): names and values
-- that need nothing, or only the characters dates, numbers and plain text are made of
-- (replace()), without a query; anything else as 0001 did it. PL/pgSQL: 0001's SQL
-- function was planned again at every call.
CREATE OR REPLACE FUNCTION pgq._urlencode(val text) RETURNS text
LANGUAGE plpgsql STRICT STABLE AS $$
BEGIN
    IF val !~ '[^-_.A-Za-z0-9]' THEN
        RETURN val;
    END IF;
    IF val !~ '[^-_.A-Za-z0-9 %+:,/@=&]' THEN
        RETURN replace(replace(replace(replace(replace(replace(replace(replace(replace(
                   val, '%', '%25'), '+', '%2b'), ':', '%3a'), ',', '%2c'), '/', '%2f'), '@', '%40'),
                   '=', '%3d'), '&', '%26'), ' ', '+');
    END IF;
    RETURN (SELECT replace(coalesce(string_agg(m.part[1] || regexp_replace(
                       encode(convert_to(m.part[2], getdatabaseencoding()), 'hex'), '(..)', '%\1', 'g'),
                   '' ORDER BY m.nr), ''), '%20', '+')
              FROM regexp_matches(val, '([-_.A-Za-z0-9]*)([^-_.A-Za-z0-9]*)', 'g') WITH ORDINALITY AS m(part, nr));
END $$;

-- One value of the encodings (0001's), as PL/pgSQL: its statements' plans are kept.
CREATE OR REPLACE FUNCTION pgq._encode(kind text, cols text[], skipped boolean[], vals text[]) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF kind = 'json' THEN
        RETURN (SELECT '{' || coalesce(string_agg(to_json(c)::text || ':' || v, ',' ORDER BY n), '') || '}'
                  FROM unnest(cols, skipped, vals) WITH ORDINALITY AS x(c, s, v, n)
                 WHERE NOT s);
    END IF;
    RETURN (SELECT coalesce(string_agg(pgq._urlencode(c) || coalesce('=' || pgq._urlencode(v), ''), '&' ORDER BY n), '')
              FROM unnest(cols, skipped, vals) WITH ORDINALITY AS x(c, s, v, n)
             WHERE NOT s);
END $$;

CREATE OR REPLACE FUNCTION pgq._trigger_event(kind text, op text, tg_when text, tg_level text, relid oid, tschema text,
                                   tname text, tg_args text[], old_row anyelement, new_row anyelement)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    args text[] := tg_args[:];  -- TG_ARGV starts at 0, a slice at 1
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
    ignore_names text[];
    cols text[];
    types regtype[];
    skipped boolean[];
    is_pkey boolean[];
    changed boolean[];
    old_vals text[];
    new_vals text[];
    row_vals text[];
    magic boolean;
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

    -- the table's primary key and its columns, in one look at the catalog: magic columns
    -- (_pgq_ev_*) and ignored ones are not data; keys
    ignore_names := regexp_split_to_array(ignore_arg, '[\s,]+');
    SELECT k.names, c.cols, c.types, c.skipped, c.is_pkey, c.magic INTO table_pkey, cols, types, skipped, is_pkey, magic
      FROM (SELECT coalesce(array_agg(k.attname::text), '{}') AS names
              FROM (SELECT k.attname FROM pg_index i JOIN pg_attribute k ON k.attrelid = i.indexrelid
                     WHERE i.indrelid = relid AND i.indisprimary AND k.attnum > 0 AND NOT k.attisdropped
                     ORDER BY k.attnum) k) k,
           LATERAL (SELECT array_agg(a.attname::text) AS cols,
                           array_agg(a.atttypid::regtype) AS types,
                           array_agg(a.attname LIKE '\_pgq\_ev\_%' OR a.attname::text = ANY (coalesce(ignore_names, '{}')))
                               AS skipped,
                           array_agg(a.attname NOT LIKE '\_pgq\_ev\_%'
                                     AND a.attname::text = ANY (coalesce(regexp_split_to_array(pkey_arg, '[\s,]+'), k.names)))
                               AS is_pkey,
                           coalesce(bool_or(a.attname LIKE '\_pgq\_ev\_%'), false) AS magic
                      FROM (SELECT a.attname, a.atttypid FROM pg_attribute a
                             WHERE a.attrelid = relid AND a.attnum > 0 AND NOT a.attisdropped
                             ORDER BY a.attnum) a) c;
    IF opc IN ('U', 'D') AND coalesce(pkey_arg, array_to_string(table_pkey, ',')) = '' THEN
        RAISE EXCEPTION 'Update/Delete on table without pkey';
    END IF;
    IF skip AND tg_when = 'AFTER' THEN
        RAISE EXCEPTION 'SKIP does not work in AFTER trigger.';
    END IF;
    IF deny THEN
        RAISE EXCEPTION 'Table ''%'' to queue ''%'': change not allowed (%)', tbl, qname, op;
    END IF;

    -- (an IF, not 0001's CASE: the JSON branch's subquery made every kind run a query)
    IF kind = 'json' THEN
        ev[1] := format('{"op":"%s","table":[%s,%s],"pkey":[%s]}', op, to_json(tschema), to_json(tname),
                        coalesce((SELECT string_agg(to_json(k)::text, ',' ORDER BY n)
                                    FROM unnest(coalesce(string_to_array(pkey_arg, ','), table_pkey))
                                         WITH ORDINALITY AS x(k, n)), ''));
    ELSIF kind = 'logu' THEN
        ev[1] := opc || CASE WHEN opc = 'R' THEN '' ELSE ':' || coalesce(pkey_arg, array_to_string(table_pkey, ',')) END;
    ELSE
        ev[1] := opc;
    END IF;
    IF opc = 'R' THEN
        ev[2] := CASE kind WHEN 'json' THEN '{}' ELSE '' END;
        PERFORM pgq.insert_event(qname, ev[1], ev[2], ev[3], ev[4], ev[5], ev[6]);
        RETURN skip;
    END IF;

    -- the values as text, where the SQL fragment or magic columns need them (the JSON
    -- and urlencoded data come from the row in one step, pgq._encode_row)
    IF kind = 'sql' OR magic THEN
        IF opc <> 'I' THEN
            old_vals := pgq._row_values(cols, types, old_row);
        END IF;
        IF opc <> 'D' THEN
            new_vals := pgq._row_values(cols, types, new_row);
        END IF;
        row_vals := CASE WHEN opc = 'D' THEN old_vals ELSE new_vals END;
    END IF;

    IF opc = 'U' THEN
        changed := pgq._row_changed(cols, old_row, new_row);
        IF backup THEN
            ev[4] := pgq._encode_row(CASE WHEN kind = 'json' THEN 'json' ELSE 'logu' END, cols, types, skipped, old_row);
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
        ev[2] := pgq._encode_row(kind, cols, types, skipped, CASE WHEN opc = 'D' THEN old_row ELSE new_row END);
    END IF;

    -- fields from the magic columns, then from the expressions (each loop only if any)
    IF magic THEN
        FOR i IN 1 .. cardinality(cols) LOOP
            CONTINUE WHEN cols[i] NOT LIKE '\_pgq\_ev\_%';
            IF substr(cols[i], 6) <> ALL (fields[1:6]) THEN
                RAISE EXCEPTION 'Unknown magic column: %', cols[i];
            END IF;
            ev[array_position(fields, substr(cols[i], 6))] := row_vals[i];
        END LOOP;
    END IF;
    IF num_nonnulls(VARIADIC exprs) > 0 THEN
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
    END IF;

    PERFORM pgq.insert_event(qname, ev[1], ev[2], ev[3], ev[4], ev[5], ev[6]);
    RETURN skip;
END $$;

-- The row's data as ev_data (0002's), zipped in column order.
CREATE OR REPLACE FUNCTION pgq._encode_row(kind text, cols text[], types regtype[], skipped boolean[], r anyelement)
RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT types::oid[] <@ pgq._json_text_types() THEN
        RETURN pgq._encode(kind, cols, skipped, CASE WHEN kind = 'json' THEN pgq._row_json(cols, types, r)
                                                     ELSE pgq._row_text(cols, r) END);
    END IF;
    IF kind = 'json' THEN
        RETURN (SELECT '{' || coalesce(string_agg(to_json(t.col)::text || ':' || pgq._json_value_json(t.value, t.typ), ','),
                                       '') || '}'
                  FROM ROWS FROM (json_each(to_json(r)), unnest(cols), unnest(types), unnest(skipped))
                       AS t(key, value, col, typ, skip)
                 WHERE NOT t.skip);
    END IF;
    RETURN (SELECT coalesce(string_agg(CASE WHEN t.col !~ '[^-_.A-Za-z0-9]' THEN t.col ELSE pgq._urlencode(t.col) END
                                       || coalesce('=' || CASE WHEN t.v !~ '[^-_.A-Za-z0-9]' THEN t.v
                                                               ELSE pgq._urlencode(t.v) END, ''),
                                       '&'), '')
              FROM (SELECT x.col, pgq._json_value_text(x.value, x.typ) AS v
                      FROM ROWS FROM (json_each(to_json(r)), unnest(cols), unnest(types), unnest(skipped))
                           AS x(key, value, col, typ, skip)
                     WHERE NOT x.skip
                    OFFSET 0) t);
END $$;

CREATE OR REPLACE VIEW pgq.queue AS
SELECT s.id::integer AS queue_id, s.name AS queue_name, 3 AS queue_ntables, s.cur_table::integer AS queue_cur_table,
       s.rotation_period AS queue_rotation_period,
       s.switch_step1::text::bigint AS queue_switch_step1, s.switch_step2::text::bigint AS queue_switch_step2,
       s.switch_time AS queue_switch_time, false AS queue_external_ticker, false AS queue_disable_insert,
       s.ticker_paused AS queue_ticker_paused, s.ticker_max_count AS queue_ticker_max_count,
       s.ticker_max_lag AS queue_ticker_max_lag, s.ticker_idle_period AS queue_ticker_idle_period,
       NULL::integer AS queue_per_tx_limit, 'conveyor.stream_' || s.id AS queue_data_pfx,
       s.event_seq::text AS queue_event_seq, 'conveyor.stream_tick_seq'::text AS queue_tick_seq,
       x.extra_maint AS queue_extra_maint
  FROM conveyor.streams s LEFT JOIN pgq.queue_settings x ON x.stream_id = s.id;

-- UPDATE pgq.queue: the settings a PgQ operator changes there. The engine's own columns
-- (ids, tables, rotation state, sequences) are refused, as are settings Conveyor does not
-- have (an external ticker, disabled inserts, a per-transaction limit).
CREATE OR REPLACE FUNCTION pgq._queue_update() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    changes jsonb := '{}';
BEGIN
    IF (NEW.queue_id, NEW.queue_name, NEW.queue_ntables, NEW.queue_cur_table, NEW.queue_switch_step1,
        NEW.queue_switch_step2, NEW.queue_switch_time, NEW.queue_data_pfx, NEW.queue_event_seq, NEW.queue_tick_seq)
       IS DISTINCT FROM
       (OLD.queue_id, OLD.queue_name, OLD.queue_ntables, OLD.queue_cur_table, OLD.queue_switch_step1,
        OLD.queue_switch_step2, OLD.queue_switch_time, OLD.queue_data_pfx, OLD.queue_event_seq, OLD.queue_tick_seq) THEN
        RAISE EXCEPTION USING ERRCODE = '0A000',
            MESSAGE = 'pgq.queue: only queue_rotation_period, queue_ticker_* and queue_extra_maint can be changed here',
            HINT = 'Conveyor keeps the queue''s tables, rotation state and sequences itself';
    END IF;
    IF NEW.queue_external_ticker OR NEW.queue_disable_insert OR NEW.queue_per_tx_limit IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '0A000',
            MESSAGE = 'pgq.queue: external tickers, disabled inserts and per-transaction limits are not supported by Conveyor';
    END IF;
    IF NEW.queue_rotation_period IS DISTINCT FROM OLD.queue_rotation_period THEN
        changes := changes || jsonb_build_object('rotation_period', NEW.queue_rotation_period);
    END IF;
    IF NEW.queue_ticker_max_count IS DISTINCT FROM OLD.queue_ticker_max_count THEN
        changes := changes || jsonb_build_object('ticker_max_count', NEW.queue_ticker_max_count);
    END IF;
    IF NEW.queue_ticker_max_lag IS DISTINCT FROM OLD.queue_ticker_max_lag THEN
        changes := changes || jsonb_build_object('ticker_max_lag', NEW.queue_ticker_max_lag);
    END IF;
    IF NEW.queue_ticker_idle_period IS DISTINCT FROM OLD.queue_ticker_idle_period THEN
        changes := changes || jsonb_build_object('ticker_idle_period', NEW.queue_ticker_idle_period);
    END IF;
    IF NEW.queue_ticker_paused IS DISTINCT FROM OLD.queue_ticker_paused THEN
        changes := changes || jsonb_build_object('ticker_paused', NEW.queue_ticker_paused);
    END IF;
    IF changes <> '{}' THEN
        PERFORM conveyor.stream_set_config(OLD.queue_name, changes);
    END IF;
    IF NEW.queue_extra_maint IS DISTINCT FROM OLD.queue_extra_maint THEN
        INSERT INTO pgq.queue_settings AS x (stream_id, extra_maint) VALUES (OLD.queue_id, NEW.queue_extra_maint)
        ON CONFLICT (stream_id) DO UPDATE SET extra_maint = excluded.extra_maint;
    END IF;
    RETURN NEW;
END $$;

CREATE OR REPLACE TRIGGER queue_update INSTEAD OF UPDATE ON pgq.queue FOR EACH ROW EXECUTE FUNCTION pgq._queue_update();

CREATE OR REPLACE FUNCTION pgq._queue_insert_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = '0A000',
        MESSAGE = format('pgq.queue: %s is not supported, use pgq.%s', lower(TG_OP),
                         CASE TG_OP WHEN 'INSERT' THEN 'create_queue()' ELSE 'drop_queue()' END);
END $$;

CREATE OR REPLACE TRIGGER queue_insert_delete INSTEAD OF INSERT OR DELETE ON pgq.queue
    FOR EACH ROW EXECUTE FUNCTION pgq._queue_insert_delete();

-- Every queue's events (each queue's three tables inherit from conveyor.stream_events).
CREATE OR REPLACE VIEW pgq.event_template AS
SELECT e.ev_id, e.ev_time, e.ev_txid::text::bigint AS ev_txid, e.ev_owner::integer AS ev_owner, e.ev_retry,
       e.ev_type, e.ev_data, e.ev_extra1, e.ev_extra2, e.ev_extra3, e.ev_extra4
  FROM conveyor.stream_events e;

-- An event into the consumer's retry queue, due at x_retry_after (moved back by the next
-- maintenance round, for this consumer only); a NULL ev_id takes the queue's next id.
CREATE OR REPLACE FUNCTION pgq.event_retry_raw(x_queue text, x_consumer text, x_retry_after timestamptz, x_ev_id bigint,
                                    x_ev_time timestamptz, x_ev_retry integer, x_ev_type text, x_ev_data text,
                                    x_ev_extra1 text, x_ev_extra2 text, x_ev_extra3 text, x_ev_extra4 text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
DECLARE
    s conveyor.streams;
    c conveyor.stream_consumers;
BEGIN
    SELECT * INTO s FROM conveyor.streams x WHERE x.name = x_queue;
    SELECT * INTO c FROM conveyor.stream_consumers x WHERE x.stream_id = s.id AND x.name = x_consumer;
    IF c.id IS NULL THEN
        RAISE EXCEPTION 'consumer not registered';
    END IF;
    INSERT INTO conveyor.stream_retries (stream_id, consumer_id, retry_at, ev_id, ev_time, ev_retry, ev_type, ev_data,
                                         ev_extra1, ev_extra2, ev_extra3, ev_extra4)
    VALUES (s.id, c.id, x_retry_after, coalesce(x_ev_id, nextval(s.event_seq)), x_ev_time, coalesce(x_ev_retry, 0),
            x_ev_type, x_ev_data, x_ev_extra1, x_ev_extra2, x_ev_extra3, x_ev_extra4)
    RETURNING ev_id INTO x_ev_id;
    RETURN x_ev_id;
END $$;

-- An event into the queue's current table with the given fields (insert_event with an id,
-- a time, an owner and a retry count); a NULL ev_id takes the queue's next id. As PgQ's C
-- function, every call draws from the queue's sequence, given an id or not. The owner is a
-- Conveyor consumer id (pgq.subscription.sub_id).
CREATE OR REPLACE FUNCTION pgq.insert_event_raw(queue_name text, ev_id bigint, ev_time timestamptz, ev_owner integer,
                                     ev_retry integer, ev_type text, ev_data text, ev_extra1 text, ev_extra2 text,
                                     ev_extra3 text, ev_extra4 text)
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
    SELECT * INTO s FROM conveyor.streams x WHERE x.name = insert_event_raw.queue_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'XX000', MESSAGE = 'No such queue';
    END IF;
    id := nextval(s.event_seq);
    EXECUTE format('INSERT INTO %s (ev_id, ev_time, ev_owner, ev_retry, ev_type, ev_data, ev_extra1, ev_extra2,
                                    ev_extra3, ev_extra4)
                    VALUES ($1, coalesce($2, now()), $3, $4, $5, $6, $7, $8, $9, $10)
                    RETURNING ev_id', conveyor._stream_table(s, s.cur_table))
    INTO id USING coalesce(ev_id, id), ev_time, ev_owner, ev_retry, ev_type, ev_data, ev_extra1, ev_extra2,
                  ev_extra3, ev_extra4;
    RETURN id;
END $$;

-- PgQ's choice of a batch's end tick for next_batch_custom: the latest tick when it makes
-- the batch big enough without overshooting twice, else the first tick that does.
CREATE OR REPLACE FUNCTION pgq.find_tick_helper(i_queue_id integer, i_prev_tick_id bigint, i_prev_tick_time timestamptz,
                                     i_prev_tick_seq bigint, i_min_count bigint, i_min_interval interval,
                                     OUT next_tick_id bigint, OUT next_tick_time timestamptz, OUT next_tick_seq bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
DECLARE
    t conveyor.stream_ticks;
    enough boolean := false;
    overshoots boolean := false;
BEGIN
    SELECT * INTO t FROM conveyor.stream_ticks x
     WHERE x.stream_id = i_queue_id AND x.tick_id > i_prev_tick_id ORDER BY x.tick_id DESC LIMIT 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF i_min_count IS NOT NULL THEN
        enough := t.tick_event_seq - i_prev_tick_seq >= i_min_count;
        overshoots := t.tick_event_seq - i_prev_tick_seq > i_min_count * 2;
    END IF;
    IF i_min_interval IS NOT NULL THEN
        enough := enough OR t.tick_time - i_prev_tick_time >= i_min_interval;
        overshoots := overshoots OR t.tick_time - i_prev_tick_time > i_min_interval * 2;
    END IF;
    IF overshoots THEN
        SELECT * INTO t FROM conveyor.stream_ticks x
         WHERE x.stream_id = i_queue_id AND x.tick_id > i_prev_tick_id
           AND ((i_min_count IS NOT NULL AND x.tick_event_seq - i_prev_tick_seq >= i_min_count)
                OR (i_min_interval IS NOT NULL AND x.tick_time - i_prev_tick_time >= i_min_interval))
         ORDER BY x.tick_id LIMIT 1;
        enough := true;
    END IF;
    IF enough THEN
        next_tick_id := t.tick_id;
        next_tick_time := t.tick_time;
        next_tick_seq := t.tick_event_seq;
    END IF;
END $$;

-- PgQ copies its template table's grants to a queue's tables; Conveyor grants SELECT on
-- every event table to conveyor_reader when it makes them. 1 for a queue, PgQ's error else.
CREATE OR REPLACE FUNCTION pgq.grant_perms(x_queue_name text) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
BEGIN
    PERFORM pgq._queue(x_queue_name, 'Queue not found');
    RETURN 1;
END $$;

CREATE OR REPLACE FUNCTION pgq._grant_perms_from(src_schema text, src_table text, dst_schema text, dst_table text)
RETURNS integer
LANGUAGE sql AS $$
    SELECT 1
$$;

-- PgQ sets fillfactor 100 and turns autovacuum off on a queue's tables (rotation empties
-- them with TRUNCATE); the engine's event tables need no vacuum either. 1, or 0 for no queue.
CREATE OR REPLACE FUNCTION pgq.tune_storage(i_queue_name text) RETURNS integer
LANGUAGE sql STRICT STABLE AS $$
    SELECT count(*)::integer FROM conveyor.streams WHERE name = i_queue_name
$$;

-- PgQ's schema upgrades: the dialect's schema is upgraded by conveyor db migrate.
CREATE OR REPLACE FUNCTION pgq.upgrade_schema() RETURNS integer
LANGUAGE sql AS $$
    SELECT 0
$$;

-- PgQ's list of maintenance calls for pgqd, in PgQ's order: rotation step 1 for each queue
-- due, else step 2 when one is pending; each queue's queue_extra_maint functions; the
-- tables to vacuum.
CREATE OR REPLACE FUNCTION pgq.maint_operations(OUT func_name text, OUT func_arg text) RETURNS SETOF record
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
DECLARE
    nrot integer := 0;
    ops text[];
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
    FOR func_arg, ops IN SELECT s.name, x.extra_maint FROM pgq.queue_settings x JOIN conveyor.streams s ON s.id = x.stream_id
                          WHERE x.extra_maint IS NOT NULL ORDER BY 1 LOOP
        FOR i IN array_lower(ops, 1) .. array_upper(ops, 1) LOOP
            func_name := ops[i];
            RETURN NEXT;
        END LOOP;
    END LOOP;
    func_name := 'vacuum';
    FOR func_arg IN SELECT * FROM pgq.maint_tables_to_vacuum() LOOP
        RETURN NEXT;
    END LOOP;
END $$;

DO $$
BEGIN
    GRANT SELECT ON pgq.queue, pgq.event_template, pgq.queue_settings TO conveyor_reader;
    GRANT UPDATE ON pgq.queue TO conveyor_admin;
    GRANT EXECUTE ON FUNCTION pgq.find_tick_helper(integer, bigint, timestamptz, bigint, bigint, interval),
                              pgq.tune_storage(text), pgq._queue_insert_delete()
        TO conveyor_reader;
    GRANT EXECUTE ON FUNCTION
        pgq.event_retry_raw(text, text, timestamptz, bigint, timestamptz, integer, text, text, text, text, text, text),
        pgq.insert_event_raw(text, bigint, timestamptz, integer, integer, text, text, text, text, text, text)
        TO conveyor_writer;
    GRANT EXECUTE ON FUNCTION pgq.grant_perms(text), pgq._grant_perms_from(text, text, text, text),
                              pgq.upgrade_schema(), pgq.maint_operations(), pgq._queue_update()
        TO conveyor_admin;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: roles missing, pgq grants skipped (%)', SQLERRM;
END $$;

REVOKE ALL ON ALL ROUTINES IN SCHEMA pgq FROM PUBLIC;
