-- Conveyor's pgq dialect, 0004: the rest of PgQ 3.5's SQL API, and its tables as tools
-- read and operators update them.
--
--   pgq.event_template          every queue's events, with PgQ's columns (a view over the
--                               engine's event tables; CREATE TABLE ... (LIKE
--                               pgq.event_template) takes PgQ's columns from it)
--   pgq.queue                   updatable: queue_rotation_period, queue_ticker_max_count,
--                               queue_ticker_max_lag, queue_ticker_idle_period and
--                               queue_ticker_paused set the stream's options (as
--                               set_queue_config does), queue_extra_maint is kept and run by
--                               maint_operations(); other columns are the engine's
--   event_retry_raw, insert_event_raw, find_tick_helper
--                               PgQ's low-level calls, over the engine's retry queue, event
--                               tables and ticks
--   grant_perms, tune_storage, upgrade_schema, _grant_perms_from
--                               storage and permission upkeep of PgQ's own tables: the
--                               engine grants and tunes its tables itself; these answer as
--                               PgQ does for tables already in order
--   maint_operations()          PgQ's list, with each queue's queue_extra_maint functions
--
-- State: queue_extra_maint is the one PgQ setting the engine has no column for; it is kept
-- in pgq.queue_settings (a row per stream, dropped with the stream).

CREATE TABLE pgq.queue_settings (
    stream_id   bigint PRIMARY KEY REFERENCES conveyor.streams (id) ON DELETE CASCADE,
    extra_maint text[]
);

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
CREATE FUNCTION pgq._queue_update() RETURNS trigger
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

CREATE FUNCTION pgq._queue_insert_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = '0A000',
        MESSAGE = format('pgq.queue: %s is not supported, use pgq.%s', lower(TG_OP),
                         CASE TG_OP WHEN 'INSERT' THEN 'create_queue()' ELSE 'drop_queue()' END);
END $$;

CREATE TRIGGER queue_update INSTEAD OF UPDATE ON pgq.queue FOR EACH ROW EXECUTE FUNCTION pgq._queue_update();
CREATE TRIGGER queue_insert_delete INSTEAD OF INSERT OR DELETE ON pgq.queue
    FOR EACH ROW EXECUTE FUNCTION pgq._queue_insert_delete();

-- Every queue's events (each queue's three tables inherit from conveyor.stream_events).
CREATE VIEW pgq.event_template AS
SELECT e.ev_id, e.ev_time, e.ev_txid::text::bigint AS ev_txid, e.ev_owner::integer AS ev_owner, e.ev_retry,
       e.ev_type, e.ev_data, e.ev_extra1, e.ev_extra2, e.ev_extra3, e.ev_extra4
  FROM conveyor.stream_events e;

------------------------------------------------------------------------------------------
-- Low-level calls
------------------------------------------------------------------------------------------

-- An event into the consumer's retry queue, due at x_retry_after (moved back by the next
-- maintenance round, for this consumer only); a NULL ev_id takes the queue's next id.
CREATE FUNCTION pgq.event_retry_raw(x_queue text, x_consumer text, x_retry_after timestamptz, x_ev_id bigint,
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
CREATE FUNCTION pgq.insert_event_raw(queue_name text, ev_id bigint, ev_time timestamptz, ev_owner integer,
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
CREATE FUNCTION pgq.find_tick_helper(i_queue_id integer, i_prev_tick_id bigint, i_prev_tick_time timestamptz,
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

------------------------------------------------------------------------------------------
-- Upkeep of PgQ's own tables: the engine's are kept by the engine
------------------------------------------------------------------------------------------

-- PgQ copies its template table's grants to a queue's tables; Conveyor grants SELECT on
-- every event table to conveyor_reader when it makes them. 1 for a queue, PgQ's error else.
CREATE FUNCTION pgq.grant_perms(x_queue_name text) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
BEGIN
    PERFORM pgq._queue(x_queue_name, 'Queue not found');
    RETURN 1;
END $$;

CREATE FUNCTION pgq._grant_perms_from(src_schema text, src_table text, dst_schema text, dst_table text)
RETURNS integer
LANGUAGE sql AS $$
    SELECT 1
$$;

-- PgQ sets fillfactor 100 and turns autovacuum off on a queue's tables (rotation empties
-- them with TRUNCATE); the engine's event tables need no vacuum either. 1, or 0 for no queue.
CREATE FUNCTION pgq.tune_storage(i_queue_name text) RETURNS integer
LANGUAGE sql STRICT STABLE AS $$
    SELECT count(*)::integer FROM conveyor.streams WHERE name = i_queue_name
$$;

-- PgQ's schema upgrades: the dialect's schema is upgraded by conveyor db migrate.
CREATE FUNCTION pgq.upgrade_schema() RETURNS integer
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

------------------------------------------------------------------------------------------
-- Roles
------------------------------------------------------------------------------------------

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgq FROM PUBLIC;
REVOKE ALL ON pgq.queue_settings FROM PUBLIC;

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
