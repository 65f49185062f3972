-- The pgque dialect's functions and views (docs/dialects.md).
--
-- Current definitions, re-applied whenever a file of this folder changes (docs/architecture.md,
-- "Where each SQL function's current definition lives"). Edit a function here; tables, types,
-- indexes, data and DROPs go in a new numbered migration.

-- PgQue's tables, read-only over Conveyor's. Ids are Conveyor's (a stream's id is the
-- queue_id, a subscription's id the consumer's co_id: Conveyor keeps consumers per stream).
CREATE OR REPLACE VIEW pgque.queue AS
SELECT s.id::int4 AS queue_id, s.name AS queue_name, 3 AS queue_ntables, s.cur_table::int4 AS queue_cur_table,
       s.rotation_period AS queue_rotation_period, s.switch_time AS queue_switch_time,
       s.switch_step1 AS queue_switch_step1, s.switch_step2 AS queue_switch_step2,
       false AS queue_external_ticker, false AS queue_disable_insert, s.ticker_paused AS queue_ticker_paused,
       s.ticker_max_count AS queue_ticker_max_count, s.ticker_max_lag AS queue_ticker_max_lag,
       s.ticker_idle_period AS queue_ticker_idle_period, s.max_retries AS queue_max_retries,
       'conveyor.stream_' || s.id AS queue_data_pfx, s.event_seq::text AS queue_event_seq
  FROM conveyor.streams s;

CREATE OR REPLACE VIEW pgque.consumer AS
SELECT c.id::int4 AS co_id, c.name AS co_name FROM conveyor.stream_consumers c;

CREATE OR REPLACE VIEW pgque.tick AS
SELECT t.stream_id::int4 AS tick_queue, t.tick_id, t.tick_time, t.tick_snapshot, t.tick_event_seq
  FROM conveyor.stream_ticks t;

-- dl_consumer_id is the consumer's id while it is subscribed (Conveyor keeps the consumer's
-- name with a dead letter, so the letter outlives its consumer); ev_txid is NULL as in
-- PgQue (a message does not carry its transaction id).
CREATE OR REPLACE VIEW pgque.dead_letter AS
SELECT d.id AS dl_id, d.stream_id::int4 AS dl_queue_id, c.id::int4 AS dl_consumer_id, d.dead_at AS dl_time,
       d.reason AS dl_reason, d.ev_id, d.ev_time, NULL::xid8 AS ev_txid, d.ev_retry, d.ev_type, d.ev_data,
       d.ev_extra1, d.ev_extra2, d.ev_extra3, d.ev_extra4
  FROM conveyor.stream_dead_letters d
  LEFT JOIN conveyor.stream_consumers c ON c.stream_id = d.stream_id AND c.name = d.consumer;

CREATE OR REPLACE VIEW pgque.delayed_events AS
SELECT d.id AS de_id, s.name AS de_queue_name, d.deliver_at AS de_deliver_at, d.ev_type AS de_type,
       d.ev_data AS de_data, d.ev_extra1 AS de_extra1, d.ev_extra2 AS de_extra2, d.ev_extra3 AS de_extra3,
       d.ev_extra4 AS de_extra4
  FROM conveyor.stream_delayed d JOIN conveyor.streams s ON s.id = d.stream_id;

CREATE OR REPLACE VIEW pgque.retry_queue AS
SELECT r.retry_at AS ev_retry_after, r.stream_id::int4 AS ev_queue, r.ev_id, r.ev_time, NULL::xid8 AS ev_txid,
       r.consumer_id::int4 AS ev_owner, r.ev_retry, r.ev_type, r.ev_data, r.ev_extra1, r.ev_extra2,
       r.ev_extra3, r.ev_extra4
  FROM conveyor.stream_retries r;

-- The stream a queue name stands for, or PgQue's error for that call site.
CREATE OR REPLACE FUNCTION pgque._queue(queue_name text, missing text) RETURNS conveyor.streams
LANGUAGE plpgsql STABLE SET search_path = pg_catalog AS $$
DECLARE
    s conveyor.streams;
BEGIN
    SELECT * INTO s FROM conveyor.streams x WHERE x.name = _queue.queue_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION '%', missing;
    END IF;
    RETURN s;
END $$;

-- The consumer that holds an open batch (NULL row when none does).
CREATE OR REPLACE FUNCTION pgque._batch_holder(batch_id bigint) RETURNS conveyor.stream_consumers
LANGUAGE sql STABLE SET search_path = pg_catalog AS $$
    SELECT c FROM conveyor.stream_consumers c WHERE c.batch_id = _batch_holder.batch_id
$$;

-- The consumer, or PgQue's next_batch error (a missing queue and a missing subscription
-- read the same there).
CREATE OR REPLACE FUNCTION pgque._subscriber(queue_name text, consumer_name text) RETURNS conveyor.stream_consumers
LANGUAGE plpgsql STABLE SET search_path = pg_catalog AS $$
DECLARE
    c conveyor.stream_consumers;
BEGIN
    SELECT x.* INTO c FROM conveyor.stream_consumers x JOIN conveyor.streams s ON s.id = x.stream_id
     WHERE s.name = queue_name AND x.name = consumer_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'Not subscriber to queue: %/%', coalesce(queue_name, 'NULL'), coalesce(consumer_name, 'NULL');
    END IF;
    RETURN c;
END $$;

-- Announces every tick of every stream on PgQue's channel pgque_<queue> (payload: the tick
-- id), whoever ticks (pgque.ticker, conveyor.ticker, conveyor serve, pg_cron). Names longer
-- than 57 bytes do not fit a 63-byte channel name: PgQue refuses to create such queues,
-- and Conveyor's streams with longer names are announced on Conveyor's channels only.
CREATE OR REPLACE FUNCTION pgque._notify_tick() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
DECLARE
    queue_name text;
BEGIN
    SELECT s.name INTO queue_name FROM conveyor.streams s WHERE s.id = NEW.stream_id;
    IF queue_name IS NOT NULL AND octet_length(queue_name) <= 57 THEN
        PERFORM pg_notify('pgque_' || queue_name, NEW.tick_id::text);
    END IF;
    RETURN NULL;
END $$;

-- 1 when created, 0 when it existed (PgQue's answer), with Conveyor's defaults, which are
-- PgQ's: 2 hours rotation, ticks after 500 events or 3 seconds, 1 minute idle, 5 retries.
CREATE OR REPLACE FUNCTION pgque.create_queue(i_queue_name text) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    IF i_queue_name IS NULL THEN
        RAISE EXCEPTION 'Invalid NULL value';
    END IF;
    IF octet_length(i_queue_name) > 57 THEN
        RAISE EXCEPTION 'queue name too long: % bytes (max 57). '
            'pg_notify channel ''pgque_<queue_name>'' must fit in 63 bytes.', octet_length(i_queue_name);
    END IF;
    IF EXISTS (SELECT 1 FROM conveyor.streams s WHERE s.name = i_queue_name) THEN
        RETURN 0;
    END IF;
    PERFORM conveyor.stream_create(i_queue_name, '{}'::jsonb);
    RETURN 1;
END $$;

-- The options object of PgQue's config API: each key through set_queue_config.
CREATE OR REPLACE FUNCTION pgque.create_queue(i_queue text, i_options jsonb) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    created integer := pgque.create_queue(i_queue);
    opt record;
BEGIN
    IF i_options IS NOT NULL AND jsonb_typeof(i_options) <> 'object' THEN
        RAISE EXCEPTION 'create_queue: options must be a JSON object';
    END IF;
    FOR opt IN SELECT key, value #>> '{}' AS value FROM jsonb_each(coalesce(i_options, '{}')) LOOP
        PERFORM pgque.set_queue_config(i_queue, opt.key, opt.value);
    END LOOP;
    RETURN created;
END $$;

-- Drops the queue with its events, ticks and dead letters; refused while consumers are
-- subscribed unless forced.
CREATE OR REPLACE FUNCTION pgque.drop_queue(x_queue_name text, x_force boolean) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    s conveyor.streams := pgque._queue(x_queue_name, 'No such event queue');
BEGIN
    IF NOT coalesce(x_force, false) AND EXISTS (SELECT 1 FROM conveyor.stream_consumers c WHERE c.stream_id = s.id) THEN
        RAISE EXCEPTION 'cannot drop queue, consumers still attached';
    END IF;
    PERFORM conveyor.stream_drop(x_queue_name);
    RETURN 1;
END $$;

CREATE OR REPLACE FUNCTION pgque.drop_queue(x_queue_name text) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.drop_queue(x_queue_name, false)
$$;

-- One parameter (PgQue's names without the queue_ prefix) through conveyor.stream_set_config;
-- NULL restores the default. external_ticker can only be false: Conveyor makes its own ticks.
CREATE OR REPLACE FUNCTION pgque.set_queue_config(x_queue_name text, x_param_name text, x_param_value text) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    defaults CONSTANT jsonb := '{"ticker_max_count": "500", "ticker_max_lag": "3 seconds",
        "ticker_idle_period": "1 minute", "ticker_paused": "false", "rotation_period": "2 hours",
        "max_retries": "5", "external_ticker": "false"}';
    value text;
BEGIN
    IF x_queue_name IS NULL OR x_param_name IS NULL THEN
        RAISE EXCEPTION 'Invalid NULL value';
    END IF;
    PERFORM pgque._queue(x_queue_name, 'No such event queue');
    IF NOT defaults ? x_param_name THEN
        RAISE EXCEPTION 'cannot change parameter "%s"', x_param_name;
    END IF;
    value := coalesce(x_param_value, defaults ->> x_param_name);
    CASE x_param_name
    WHEN 'max_retries' THEN
        IF value::int8 < 0 THEN
            RAISE EXCEPTION 'set_queue_config: max_retries must be >= 0, got %', value::int8;
        END IF;
    WHEN 'ticker_max_count' THEN
        IF value::int8 <= 0 THEN
            RAISE EXCEPTION 'set_queue_config: ticker_max_count must be > 0, got %', value::int8;
        END IF;
    WHEN 'ticker_max_lag', 'ticker_idle_period', 'rotation_period' THEN
        IF value::interval <= interval '0' THEN
            RAISE EXCEPTION 'set_queue_config: % must be > 0, got %', x_param_name, value::interval;
        END IF;
    WHEN 'external_ticker' THEN
        IF value::boolean THEN
            RAISE EXCEPTION 'set_queue_config: external_ticker is not supported: Conveyor ticks its streams itself';
        END IF;
        RETURN 1;
    ELSE
        PERFORM value::boolean;  -- ticker_paused
    END CASE;
    PERFORM conveyor.stream_set_config(x_queue_name, jsonb_build_object(x_param_name, value));
    RETURN 1;
END $$;

CREATE OR REPLACE FUNCTION pgque.pause_queue(i_queue text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.set_queue_config(i_queue, 'ticker_paused', 'true');
$$;

CREATE OR REPLACE FUNCTION pgque.resume_queue(i_queue text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.set_queue_config(i_queue, 'ticker_paused', 'false');
$$;

CREATE OR REPLACE FUNCTION pgque.insert_event(queue_name text, ev_type text, ev_data text,
                                   ev_extra1 text, ev_extra2 text, ev_extra3 text, ev_extra4 text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    PERFORM pgque._queue(queue_name, format('queue not found: %s', queue_name));
    RETURN conveyor.stream_send(queue_name, ev_data, ev_type, ev_extra1, ev_extra2, ev_extra3, ev_extra4);
END $$;

CREATE OR REPLACE FUNCTION pgque.insert_event(queue_name text, ev_type text, ev_data text) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.insert_event(queue_name, ev_type, ev_data, NULL, NULL, NULL, NULL)
$$;

-- text payloads are stored as given; jsonb payloads are validated and stored as JSON text.
CREATE OR REPLACE FUNCTION pgque.send(queue_name text, type_name text, payload text) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.insert_event(queue_name, type_name, payload, NULL, NULL, NULL, NULL)
$$;

CREATE OR REPLACE FUNCTION pgque.send(queue_name text, type_name text, payload jsonb) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.insert_event(queue_name, type_name, payload::text, NULL, NULL, NULL, NULL)
$$;

CREATE OR REPLACE FUNCTION pgque.send(queue_name text, payload text) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.insert_event(queue_name, 'default', payload, NULL, NULL, NULL, NULL)
$$;

CREATE OR REPLACE FUNCTION pgque.send(queue_name text, payload jsonb) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.insert_event(queue_name, 'default', payload::text, NULL, NULL, NULL, NULL)
$$;

-- One statement (conveyor.stream_send_batch); ids in input order. An empty array answers
-- '{}' without looking the queue up, a NULL array is refused, NULL elements are stored as
-- NULL payloads: PgQue's rules.
CREATE OR REPLACE FUNCTION pgque.send_batch(queue_name text, type_name text, payloads text[]) RETURNS bigint[]
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    IF payloads IS NULL THEN
        RAISE EXCEPTION 'payloads must not be null';
    END IF;
    IF cardinality(payloads) = 0 THEN
        RETURN '{}';
    END IF;
    PERFORM pgque._queue(queue_name, format('queue not found: %s', queue_name));
    RETURN ARRAY(SELECT conveyor.stream_send_batch(queue_name, coalesce(type_name, 'default'), payloads));
END $$;

CREATE OR REPLACE FUNCTION pgque.send_batch(queue_name text, type_name text, payloads jsonb[]) RETURNS bigint[]
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.send_batch(queue_name, type_name, payloads::text[])
$$;

CREATE OR REPLACE FUNCTION pgque.send_batch(queue_name text, payloads text[]) RETURNS bigint[]
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.send_batch(queue_name, 'default', payloads)
$$;

CREATE OR REPLACE FUNCTION pgque.send_batch(queue_name text, payloads jsonb[]) RETURNS bigint[]
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.send_batch(queue_name, 'default', payloads::text[])
$$;

-- Delayed delivery (conveyor.stream_send_at): the scheduled entry's id, not an event id
-- (maint() appends the event when due), or the event id when deliver_at is not in the future.
CREATE OR REPLACE FUNCTION pgque.send_at(i_queue text, i_type text, i_payload text, i_deliver_at timestamptz) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    PERFORM pgque._queue(i_queue, format('queue not found: %s', i_queue));
    IF i_deliver_at IS NULL THEN
        RAISE EXCEPTION 'send_at: deliver_at must not be null';
    END IF;
    RETURN conveyor.stream_send_at(i_queue, i_payload, i_deliver_at, coalesce(i_type, 'default'));
END $$;

CREATE OR REPLACE FUNCTION pgque.send_at(i_queue text, i_type text, i_payload jsonb, i_deliver_at timestamptz) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.send_at(i_queue, i_type, i_payload::text, i_deliver_at)
$$;

-- 1 for a new subscription, 0 when it existed; from the queue's latest tick on.
CREATE OR REPLACE FUNCTION pgque.register_consumer_at(x_queue_name text, x_consumer_name text, x_tick_pos bigint)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    s conveyor.streams := pgque._queue(x_queue_name, 'Event queue not created yet');
    created boolean;
BEGIN
    IF x_tick_pos IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM conveyor.stream_ticks t WHERE t.stream_id = s.id AND t.tick_id = x_tick_pos) THEN
        RAISE EXCEPTION 'cannot reposition, tick not found: %', x_tick_pos;
    END IF;
    created := conveyor.stream_subscribe(x_queue_name, x_consumer_name);
    IF x_tick_pos IS NOT NULL THEN
        -- PgQue's repositioning: the consumer's position moves, an open batch is dropped
        UPDATE conveyor.stream_consumers c
           SET last_tick = x_tick_pos, batch_id = NULL, next_tick = NULL, batch_started_at = NULL,
               batch_read_through = NULL, batch_read_all = NULL, active_at = now()
         WHERE c.stream_id = s.id AND c.name = x_consumer_name;
    END IF;
    RETURN CASE WHEN created THEN 1 ELSE 0 END;
END $$;

CREATE OR REPLACE FUNCTION pgque.register_consumer(x_queue_name text, x_consumer_id text) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.register_consumer_at(x_queue_name, x_consumer_id, NULL)
$$;

CREATE OR REPLACE FUNCTION pgque.subscribe(queue text, consumer text) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.register_consumer_at(queue, consumer, NULL)
$$;

CREATE OR REPLACE FUNCTION pgque.unsubscribe(queue text, consumer text) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.unregister_consumer(queue, consumer)
$$;

-- Finishes the batch: 1, or 0 with a warning when no consumer holds it (PgQue's answer to
-- a stale or double ack).
CREATE OR REPLACE FUNCTION pgque.ack(i_batch_id bigint) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    IF (pgque._batch_holder(i_batch_id)).id IS NULL THEN
        RAISE WARNING 'finish_batch: batch % not found', i_batch_id;
        RETURN 0;
    END IF;
    RETURN conveyor.stream_ack(i_batch_id);
END $$;

CREATE OR REPLACE FUNCTION pgque.next_batch_info(i_queue_name text, i_consumer_name text,
    OUT batch_id int8, OUT cur_tick_id int8, OUT prev_tick_id int8, OUT cur_tick_time timestamptz,
    OUT prev_tick_time timestamptz, OUT cur_tick_event_seq int8, OUT prev_tick_event_seq int8)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT * FROM pgque.next_batch_custom(i_queue_name, i_consumer_name, NULL, NULL, NULL)
$$;

CREATE OR REPLACE FUNCTION pgque.next_batch(i_queue_name text, i_consumer_name text) RETURNS int8
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT batch_id FROM pgque.next_batch_custom(i_queue_name, i_consumer_name, NULL, NULL, NULL)
$$;

-- ev_txid is NULL: Conveyor's batch rows do not carry it.
CREATE OR REPLACE FUNCTION pgque.get_batch_events(x_batch_id bigint,
    OUT ev_id bigint, OUT ev_time timestamptz, OUT ev_txid bigint, OUT ev_retry int4, OUT ev_type text,
    OUT ev_data text, OUT ev_extra1 text, OUT ev_extra2 text, OUT ev_extra3 text, OUT ev_extra4 text)
RETURNS SETOF record
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    IF (pgque._batch_holder(x_batch_id)).id IS NULL THEN
        RAISE EXCEPTION 'batch not found';
    END IF;
    RETURN QUERY SELECT e.id, e.created_at, NULL::bigint, e.retry_count, e.type, e.payload,
                        e.extra1, e.extra2, e.extra3, e.extra4
                   FROM conveyor.stream_get_batch_events(x_batch_id) e;
END $$;

-- Finishes any open batch, read or not (PgQ's primitive; ack() is the modern name).
CREATE OR REPLACE FUNCTION pgque.finish_batch(x_batch_id bigint) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    IF (pgque._batch_holder(x_batch_id)).id IS NULL THEN
        RAISE WARNING 'finish_batch: batch % not found', x_batch_id;
        RETURN 0;
    END IF;
    RETURN conveyor.stream_finish_batch(x_batch_id);
END $$;

CREATE OR REPLACE FUNCTION pgque.event_retry(x_batch_id bigint, x_event_id bigint, x_retry_time timestamptz) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.event_retry(x_batch_id, x_event_id,
                             ceil(greatest(extract(epoch FROM x_retry_time - now()), 0))::integer)
$$;

-- Every event of the batch back for retry (those not already waiting); the count.
CREATE OR REPLACE FUNCTION pgque.batch_retry(i_batch_id bigint, i_retry_seconds integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    c conveyor.stream_consumers := pgque._batch_holder(i_batch_id);
    ev bigint;
    n integer := 0;
BEGIN
    IF c.id IS NULL THEN
        RAISE EXCEPTION 'batch_retry: batch % not found', i_batch_id;
    END IF;
    FOR ev IN SELECT e.id FROM conveyor.stream_get_batch_events(i_batch_id) e LOOP
        n := n + pgque.event_retry(i_batch_id, ev, i_retry_seconds);
    END LOOP;
    RETURN n;
END $$;

-- PgQue's hook for nack(): the event is read from the batch (the caller's fields are not
-- trusted, as in nack), once per consumer and event.
CREATE OR REPLACE FUNCTION pgque.event_dead(i_batch_id bigint, i_event_id bigint, i_reason text, i_ev_time timestamptz,
    i_ev_txid xid8, i_ev_retry int4, i_ev_type text, i_ev_data text, i_ev_extra1 text DEFAULT NULL,
    i_ev_extra2 text DEFAULT NULL, i_ev_extra3 text DEFAULT NULL, i_ev_extra4 text DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    c conveyor.stream_consumers := pgque._batch_holder(i_batch_id);
BEGIN
    IF c.id IS NULL THEN
        RAISE EXCEPTION 'batch not found: %', i_batch_id;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM conveyor.stream_dead_letters d
                    WHERE d.stream_id = c.stream_id AND d.consumer = c.name AND d.ev_id = i_event_id) THEN
        PERFORM conveyor.stream_dead_letter(i_batch_id, i_event_id, i_reason);
    END IF;
    RETURN 1;
END $$;

-- The queue's dead letters, newest first (none for an unknown queue, as in PgQue).
CREATE OR REPLACE FUNCTION pgque.dlq_inspect(i_queue_name text, i_limit_count integer DEFAULT 100)
RETURNS SETOF pgque.dead_letter
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT d.* FROM pgque.dead_letter d JOIN conveyor.streams s ON s.id = d.dl_queue_id
     WHERE s.name = i_queue_name
     ORDER BY d.dl_time DESC, d.dl_id DESC
     LIMIT i_limit_count
$$;

-- Appends the dead letter to its queue again as a new event (every consumer sees it), and
-- removes it from the dead letters; the new event id.
CREATE OR REPLACE FUNCTION pgque.dlq_replay(i_dead_letter_id bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM conveyor.stream_dead_letters d WHERE d.id = i_dead_letter_id) THEN
        RAISE EXCEPTION 'dead letter entry not found: %', i_dead_letter_id;
    END IF;
    RETURN conveyor.stream_dead_letter_replay(i_dead_letter_id, NULL);
END $$;

-- All of a queue's dead letters in one statement: replayed, failed (always 0: the replay
-- is all or nothing), first_error.
CREATE OR REPLACE FUNCTION pgque.dlq_replay_all(i_queue_name text, OUT replayed bigint, OUT failed bigint, OUT first_error text)
RETURNS record
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    replayed := 0; failed := 0; first_error := NULL;
    IF EXISTS (SELECT 1 FROM conveyor.streams s WHERE s.name = i_queue_name) THEN
        replayed := conveyor.stream_dead_letter_replay_all(i_queue_name);
    END IF;
END $$;

CREATE OR REPLACE FUNCTION pgque.dlq_purge(i_queue_name text, i_older_than interval DEFAULT '30 days') RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM conveyor.streams s WHERE s.name = i_queue_name) THEN
        RETURN 0;
    END IF;
    RETURN conveyor.stream_dead_letter_purge(i_queue_name, i_older_than);
END $$;

-- Ticks every queue that needs it (conveyor.ticker): how many were ticked.
CREATE OR REPLACE FUNCTION pgque.ticker() RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT conveyor.ticker()::bigint
$$;

-- Ticks one queue if it needs it (Conveyor's rule: ticker_max_count events, or events and
-- ticker_max_lag, or ticker_idle_period): the new tick id, or NULL.
CREATE OR REPLACE FUNCTION pgque.ticker(i_queue_name text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    s conveyor.streams := pgque._queue(i_queue_name, 'no such queue');
BEGIN
    IF s.ticker_paused THEN
        RAISE EXCEPTION 'Ticker has been paused for this queue';
    END IF;
    IF NOT conveyor._tick(s, false) THEN
        RETURN NULL;
    END IF;
    RETURN (SELECT max(t.tick_id) FROM conveyor.stream_ticks t WHERE t.stream_id = s.id);
END $$;

-- Makes the next ticker pass tick this queue, as PgQue does: the queue's event sequence
-- jumps past ticker_max_count. No tick is made here; the current last tick id is returned.
CREATE OR REPLACE FUNCTION pgque.force_next_tick(i_queue_name text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    s conveyor.streams := pgque._queue(i_queue_name, format('queue not found: %s', i_queue_name));
BEGIN
    IF s.ticker_paused THEN
        RAISE EXCEPTION 'queue % is paused (queue_ticker_paused = true)', i_queue_name;
    END IF;
    PERFORM setval(s.event_seq, nextval(s.event_seq) + s.ticker_max_count * 2 + 1000);
    RETURN (SELECT max(t.tick_id) FROM conveyor.stream_ticks t WHERE t.stream_id = s.id);
END $$;

CREATE OR REPLACE FUNCTION pgque.force_tick(i_queue_name text) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.force_next_tick(i_queue_name)
$$;

-- One round of Conveyor's maintenance (conveyor.maint: rotation steps 1 and 2, due retries,
-- due delayed events, old ticks): the number of operations done.
CREATE OR REPLACE FUNCTION pgque.maint() RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT coalesce(sum(m.count), 0)::integer FROM conveyor.maint() m
$$;

-- Due retries back into their queues (also done by maint()): how many.
CREATE OR REPLACE FUNCTION pgque.maint_retry_events() RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT coalesce(sum(conveyor._move_retries(s)), 0)::integer FROM conveyor.streams s
$$;

-- Due delayed events into their queues (also done by maint()): how many.
CREATE OR REPLACE FUNCTION pgque.maint_deliver_delayed() RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT coalesce(sum(conveyor._move_delayed(s)), 0)::integer FROM conveyor.streams s
$$;

-- The hot tables to VACUUM (maintenance cannot vacuum inside a function).
CREATE OR REPLACE FUNCTION pgque.maint_tables_to_vacuum() RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT conveyor.maint_tables_to_vacuum()
$$;

-- Server-less operation through Conveyor's pg_cron jobs (conveyor.start / stop).
CREATE OR REPLACE FUNCTION pgque.start() RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_cron') THEN
        RAISE EXCEPTION 'pg_cron extension is not installed. '
            'PgQue itself works without pg_cron, but pgque.start() schedules cron jobs. '
            'Install pg_cron first, or run pgque.ticker() and pgque.maint() manually.';
    END IF;
    PERFORM conveyor.start();
END $$;

CREATE OR REPLACE FUNCTION pgque.stop() RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT conveyor.stop();
$$;

CREATE OR REPLACE FUNCTION pgque.version() RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog AS $$
    SELECT '0.2.0'::text
$$;

CREATE OR REPLACE FUNCTION pgque.status() RETURNS TABLE (component text, status text, detail text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT 'postgresql', 'info', version()
    UNION ALL
    SELECT 'pgque', 'info', pgque.version() || ' (Conveyor dialect over conveyor.stream_*)'
    UNION ALL
    SELECT 'scheduler:' || s.component, s.state, s.detail FROM conveyor.status() s
    UNION ALL
    SELECT 'queues', 'info', count(*)::text FROM conveyor.streams
    UNION ALL
    SELECT 'consumers', 'info', count(*)::text FROM conveyor.stream_consumers
$$;

CREATE OR REPLACE FUNCTION pgque.get_queue_info(i_queue_name text,
    OUT queue_name text, OUT queue_ntables integer, OUT queue_cur_table integer,
    OUT queue_rotation_period interval, OUT queue_switch_time timestamptz, OUT queue_external_ticker boolean,
    OUT queue_ticker_paused boolean, OUT queue_ticker_max_count integer, OUT queue_ticker_max_lag interval,
    OUT queue_ticker_idle_period interval, OUT ticker_lag interval, OUT ev_per_sec float8, OUT ev_new bigint,
    OUT last_tick_id bigint)
RETURNS SETOF record
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT s.name, 3, s.cur_table::integer, s.rotation_period, s.switch_time, false, s.ticker_paused,
           s.ticker_max_count, s.ticker_max_lag, s.ticker_idle_period,
           now() - top.tick_time,
           CASE WHEN old.tick_time < top.tick_time
                THEN (top.tick_event_seq - old.tick_event_seq) / extract(epoch FROM top.tick_time - old.tick_time)
           END::float8,
           coalesce(pg_sequence_last_value(s.event_seq), 0) - top.tick_event_seq,
           top.tick_id
      FROM conveyor.streams s
      LEFT JOIN LATERAL (SELECT * FROM conveyor.stream_ticks t WHERE t.stream_id = s.id
                          ORDER BY t.tick_id DESC LIMIT 1) top ON true
      LEFT JOIN LATERAL (SELECT * FROM conveyor.stream_ticks t WHERE t.stream_id = s.id AND t.tick_id >= top.tick_id - 20
                          ORDER BY t.tick_id LIMIT 1) old ON true
     WHERE i_queue_name IS NULL OR s.name = i_queue_name
     ORDER BY s.name
$$;

CREATE OR REPLACE FUNCTION pgque.get_queue_info(
    OUT queue_name text, OUT queue_ntables integer, OUT queue_cur_table integer,
    OUT queue_rotation_period interval, OUT queue_switch_time timestamptz, OUT queue_external_ticker boolean,
    OUT queue_ticker_paused boolean, OUT queue_ticker_max_count integer, OUT queue_ticker_max_lag interval,
    OUT queue_ticker_idle_period interval, OUT ticker_lag interval, OUT ev_per_sec float8, OUT ev_new bigint,
    OUT last_tick_id bigint)
RETURNS SETOF record
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT * FROM pgque.get_queue_info(NULL::text)
$$;

CREATE OR REPLACE FUNCTION pgque.get_consumer_info(i_queue_name text, i_consumer_name text,
    OUT queue_name text, OUT consumer_name text, OUT lag interval, OUT last_seen interval, OUT last_tick bigint,
    OUT current_batch bigint, OUT next_tick bigint, OUT pending_events bigint)
RETURNS SETOF record
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT s.name, c.name, now() - t.tick_time, now() - c.active_at, c.last_tick, c.batch_id, c.next_tick,
           (SELECT max(x.tick_event_seq) FROM conveyor.stream_ticks x WHERE x.stream_id = s.id) - t.tick_event_seq
      FROM conveyor.stream_consumers c
      JOIN conveyor.streams s ON s.id = c.stream_id
      LEFT JOIN conveyor.stream_ticks t ON t.stream_id = c.stream_id AND t.tick_id = c.last_tick
     WHERE (i_queue_name IS NULL OR s.name = i_queue_name)
       AND (i_consumer_name IS NULL OR c.name = i_consumer_name)
     ORDER BY 1, 2
$$;

CREATE OR REPLACE FUNCTION pgque.get_consumer_info(i_queue_name text,
    OUT queue_name text, OUT consumer_name text, OUT lag interval, OUT last_seen interval, OUT last_tick bigint,
    OUT current_batch bigint, OUT next_tick bigint, OUT pending_events bigint)
RETURNS SETOF record
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT * FROM pgque.get_consumer_info(i_queue_name, NULL)
$$;

CREATE OR REPLACE FUNCTION pgque.get_consumer_info(
    OUT queue_name text, OUT consumer_name text, OUT lag interval, OUT last_seen interval, OUT last_tick bigint,
    OUT current_batch bigint, OUT next_tick bigint, OUT pending_events bigint)
RETURNS SETOF record
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT * FROM pgque.get_consumer_info(NULL, NULL)
$$;

CREATE OR REPLACE FUNCTION pgque.get_batch_info(x_batch_id bigint,
    OUT queue_name text, OUT consumer_name text, OUT batch_start timestamptz, OUT batch_end timestamptz,
    OUT prev_tick_id bigint, OUT tick_id bigint, OUT lag interval, OUT seq_start bigint, OUT seq_end bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT s.name, c.name, prev.tick_time, cur.tick_time, c.last_tick, c.next_tick, now() - cur.tick_time,
           prev.tick_event_seq, cur.tick_event_seq
      FROM conveyor.stream_consumers c
      JOIN conveyor.streams s ON s.id = c.stream_id
      JOIN conveyor.stream_ticks prev ON prev.stream_id = c.stream_id AND prev.tick_id = c.last_tick
      JOIN conveyor.stream_ticks cur ON cur.stream_id = c.stream_id AND cur.tick_id = c.next_tick
     WHERE c.batch_id = x_batch_id
$$;

CREATE OR REPLACE FUNCTION pgque.queue_stats() RETURNS TABLE (
    queue_name text, queue_id int4, depth bigint, oldest_msg_age interval, consumers int4, events_per_sec numeric,
    cur_table int4, rotation_age interval, rotation_period interval, ticker_paused boolean,
    last_tick_time timestamptz, last_tick_id bigint, dlq_count bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT st.stream, s.id::int4, st.depth, st.oldest_event_age, st.consumers, st.events_per_sec,
           st.cur_table::int4, st.rotation_age, st.rotation_period, st.ticker_paused, st.last_tick_time,
           st.last_tick_id, st.dead_letters
      FROM conveyor.stream_stats() st JOIN conveyor.streams s ON s.name = st.stream
     ORDER BY st.stream
$$;

CREATE OR REPLACE FUNCTION pgque.consumer_stats() RETURNS TABLE (
    queue_name text, consumer_name text, lag interval, pending_events bigint, last_batch_start timestamptz,
    batch_active boolean, batch_id bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT cs.stream, cs.consumer, cs.lag, cs.pending_events, cs.last_seen, cs.batch_active, cs.batch_id
      FROM conveyor.consumer_stats() cs
$$;

-- Conveyor's health checks under PgQue's check names (ticker_running, consumer_lag:<name>,
-- rotation_health, dlq_health).
CREATE OR REPLACE FUNCTION pgque.queue_health() RETURNS TABLE (queue_name text, check_name text, status text, detail text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT h.stream,
           CASE h.check_name WHEN 'ticker' THEN 'ticker_running' WHEN 'rotation' THEN 'rotation_health'
                             WHEN 'dead_letters' THEN 'dlq_health' ELSE h.check_name END,
           h.status, h.detail
      FROM conveyor.stream_health() h
$$;

CREATE OR REPLACE FUNCTION pgque.otel_metrics() RETURNS TABLE (metric_name text, metric_type text, value numeric, labels jsonb)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT 'pgque.queue.depth', 'gauge', qs.depth::numeric, jsonb_build_object('queue', qs.queue_name)
      FROM pgque.queue_stats() qs
    UNION ALL
    SELECT 'pgque.queue.oldest_message_age_seconds', 'gauge',
           coalesce(extract(epoch FROM qs.oldest_msg_age), 0)::numeric, jsonb_build_object('queue', qs.queue_name)
      FROM pgque.queue_stats() qs
    UNION ALL
    SELECT 'pgque.consumer.lag_seconds', 'gauge', coalesce(extract(epoch FROM cs.lag), 0)::numeric,
           jsonb_build_object('queue', cs.queue_name, 'consumer', cs.consumer_name)
      FROM pgque.consumer_stats() cs
    UNION ALL
    SELECT 'pgque.consumer.pending_events', 'gauge', cs.pending_events::numeric,
           jsonb_build_object('queue', cs.queue_name, 'consumer', cs.consumer_name)
      FROM pgque.consumer_stats() cs
    UNION ALL
    SELECT 'pgque.message.dead_lettered', 'gauge', qs.dlq_count::numeric, jsonb_build_object('queue', qs.queue_name)
      FROM pgque.queue_stats() qs
    UNION ALL
    SELECT 'pgque.queue.throughput', 'gauge', coalesce(qs.events_per_sec, 0), jsonb_build_object('queue', qs.queue_name)
      FROM pgque.queue_stats() qs
$$;

CREATE OR REPLACE FUNCTION pgque.stuck_consumers(i_threshold interval DEFAULT '1 hour')
RETURNS TABLE (queue_name text, consumer_name text, lag interval, last_active timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT sc.stream, sc.consumer, sc.lag, sc.last_seen FROM conveyor.stuck_consumers(i_threshold) sc
$$;

CREATE OR REPLACE FUNCTION pgque.in_flight(i_queue_name text)
RETURNS TABLE (consumer_name text, batch_id bigint, batch_age interval, estimated_events bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    PERFORM pgque._queue(i_queue_name, format('queue not found: %s', i_queue_name));
    RETURN QUERY SELECT f.consumer, f.batch_id, f.batch_age, f.estimated_events
                   FROM conveyor.stream_in_flight(i_queue_name) f;
END $$;

CREATE OR REPLACE FUNCTION pgque.throughput(i_queue_name text, i_period interval, i_bucket_size interval)
RETURNS TABLE (bucket_start timestamptz, events bigint, events_per_sec numeric)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    PERFORM pgque._queue(i_queue_name, format('queue not found: %s', i_queue_name));
    RETURN QUERY SELECT t.bucket_start, t.events, t.events_per_sec
                   FROM conveyor.stream_throughput(i_queue_name, i_period, i_bucket_size) t;
END $$;

-- Retries (by when they are due) and dead letters (by when they died) per bucket.
CREATE OR REPLACE FUNCTION pgque.error_rate(i_queue_name text, i_period interval, i_bucket_size interval)
RETURNS TABLE (bucket_start timestamptz, retries bigint, dead_letters bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    s conveyor.streams := pgque._queue(i_queue_name, format('queue not found: %s', i_queue_name));
BEGIN
    IF i_bucket_size IS NULL OR i_bucket_size <= interval '0' THEN
        RAISE EXCEPTION 'error_rate: bucket_size must be a positive interval';
    END IF;
    RETURN QUERY
    SELECT b.bucket,
           (SELECT count(*) FROM conveyor.stream_retries r
             WHERE r.stream_id = s.id AND r.retry_at >= b.bucket AND r.retry_at < b.bucket + i_bucket_size),
           (SELECT count(*) FROM conveyor.stream_dead_letters d
             WHERE d.stream_id = s.id AND d.dead_at >= b.bucket AND d.dead_at < b.bucket + i_bucket_size)
      FROM generate_series(date_trunc('minute', now() - i_period), date_trunc('minute', now()), i_bucket_size)
           AS b(bucket)
     ORDER BY b.bucket;
END $$;

-- PgQue's role names in pgque.subscription; a member shares its main's sub_id.
CREATE OR REPLACE VIEW pgque.subscription AS
SELECT coalesce(c.coop_of, c.id)::int4 AS sub_id, c.stream_id::int4 AS sub_queue, c.id::int4 AS sub_consumer,
       c.last_tick AS sub_last_tick, c.active_at AS sub_active, c.batch_id AS sub_batch,
       c.next_tick AS sub_next_tick,
       CASE WHEN c.coop_of IS NOT NULL THEN 'coop_member'
            WHEN EXISTS (SELECT 1 FROM conveyor.stream_consumers m WHERE m.coop_of = c.id) THEN 'coop_main'
            ELSE 'normal' END AS sub_role
  FROM conveyor.stream_consumers c;

CREATE OR REPLACE FUNCTION pgque._validate_coop_names(i_queue text, i_consumer text, i_subconsumer text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog AS $$
BEGIN
    IF i_queue IS NULL OR i_queue = '' THEN
        RAISE EXCEPTION 'queue name must not be empty';
    ELSIF i_consumer IS NULL OR i_consumer = '' THEN
        RAISE EXCEPTION 'consumer name must not be empty';
    ELSIF i_subconsumer IS NULL OR i_subconsumer = '' THEN
        RAISE EXCEPTION 'subconsumer name must not be empty';
    ELSIF strpos(i_consumer, '.') > 0 THEN
        RAISE EXCEPTION 'cooperative consumer name must not contain dot: %', i_consumer;
    ELSIF strpos(i_subconsumer, '.') > 0 THEN
        RAISE EXCEPTION 'cooperative subconsumer name must not contain dot: %', i_subconsumer;
    END IF;
END $$;

-- PgQue's refusal of the plain batch calls for a cooperative main or member.
CREATE OR REPLACE FUNCTION pgque._plain_consumer(c conveyor.stream_consumers, i_queue text) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog AS $$
BEGIN
    IF c.coop_of IS NOT NULL THEN
        RAISE EXCEPTION 'consumer % on queue % is a cooperative subconsumer; use receive_coop / next_batch (cooperative form) instead of the legacy 5-arg next_batch_custom',
            c.name, i_queue;
    ELSIF EXISTS (SELECT 1 FROM conveyor.stream_consumers m WHERE m.coop_of = c.id) THEN
        RAISE EXCEPTION 'consumer % on queue % is a cooperative main consumer; use cooperative receive/next_batch with a subconsumer',
            c.name, i_queue;
    END IF;
END $$;

CREATE OR REPLACE FUNCTION pgque.register_subconsumer(i_queue text, i_consumer text, i_subconsumer text,
                                           i_convert_normal boolean DEFAULT false) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    s conveyor.streams;
    main conveyor.stream_consumers;
    member conveyor.stream_consumers;
    member_name text := i_consumer || '.' || i_subconsumer;
BEGIN
    PERFORM pgque._validate_coop_names(i_queue, i_consumer, i_subconsumer);
    s := pgque._queue(i_queue, 'Event queue not created yet');
    SELECT * INTO main FROM conveyor.stream_consumers c WHERE c.stream_id = s.id AND c.name = i_consumer FOR UPDATE;
    IF main.coop_of IS NOT NULL THEN
        RAISE EXCEPTION 'consumer % on queue % is not a cooperative main consumer', i_consumer, i_queue;
    END IF;
    IF main.id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM conveyor.stream_consumers m WHERE m.coop_of = main.id) THEN
        IF NOT coalesce(i_convert_normal, false) THEN
            RAISE EXCEPTION 'consumer % on queue % is already a normal consumer; explicit conversion is required',
                i_consumer, i_queue;
        END IF;
        IF main.batch_id IS NOT NULL THEN
            RAISE EXCEPTION 'cannot convert active normal consumer % on queue % to cooperative main', i_consumer, i_queue;
        END IF;
    END IF;
    SELECT * INTO member FROM conveyor.stream_consumers c WHERE c.stream_id = s.id AND c.name = member_name;
    IF member.id IS NOT NULL AND member.coop_of IS DISTINCT FROM main.id THEN
        RAISE EXCEPTION 'consumer name % on queue % is already registered incompatibly', member_name, i_queue;
    END IF;
    RETURN CASE WHEN conveyor.stream_coop_join(i_queue, i_consumer, member_name) OR main.id IS NULL THEN 1 ELSE 0 END;
END $$;

CREATE OR REPLACE FUNCTION pgque.subscribe_subconsumer(i_queue text, i_consumer text, i_subconsumer text,
                                            i_convert_normal boolean DEFAULT false) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.register_subconsumer(i_queue, i_consumer, i_subconsumer, i_convert_normal)
$$;

CREATE OR REPLACE FUNCTION pgque.touch_subconsumer(i_queue text, i_consumer text, i_subconsumer text) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    n integer;
BEGIN
    PERFORM pgque._validate_coop_names(i_queue, i_consumer, i_subconsumer);
    UPDATE conveyor.stream_consumers c SET active_at = clock_timestamp()
      FROM conveyor.streams s
     WHERE s.name = i_queue AND c.stream_id = s.id AND c.name = i_consumer || '.' || i_subconsumer
       AND c.coop_of IS NOT NULL;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- 1 when the member was removed, 0 when there was none. Its open batch: refused, or
-- (batch_handling 1) every event of it through nack's rule, then the batch finished.
CREATE OR REPLACE FUNCTION pgque.unregister_subconsumer(i_queue text, i_consumer text, i_subconsumer text,
                                             i_batch_handling integer DEFAULT 0) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    member conveyor.stream_consumers;
    ev bigint;
BEGIN
    PERFORM pgque._validate_coop_names(i_queue, i_consumer, i_subconsumer);
    IF i_batch_handling IS NULL OR i_batch_handling NOT IN (0, 1) THEN
        RAISE EXCEPTION 'unsupported batch_handling value: %', i_batch_handling;
    END IF;
    SELECT c.* INTO member
      FROM conveyor.stream_consumers c
      JOIN conveyor.streams s ON s.id = c.stream_id
      JOIN conveyor.stream_consumers main ON main.id = c.coop_of AND main.name = i_consumer
     WHERE s.name = i_queue AND c.name = i_consumer || '.' || i_subconsumer
       FOR UPDATE OF c;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    IF member.batch_id IS NOT NULL THEN
        IF i_batch_handling = 0 THEN
            RAISE EXCEPTION 'cannot unregister active cooperative subconsumer %/%/% without batch_handling = 1',
                i_queue, i_consumer, i_subconsumer;
        END IF;
        FOR ev IN SELECT e.id FROM conveyor.stream_get_batch_events(member.batch_id) e LOOP
            PERFORM conveyor.stream_nack(member.batch_id, ev, interval '60 seconds', 'subconsumer unregistered');
        END LOOP;
        PERFORM conveyor.stream_finish_batch(member.batch_id);
    END IF;
    PERFORM conveyor.stream_unsubscribe(i_queue, member.name);
    RETURN 1;
END $$;

CREATE OR REPLACE FUNCTION pgque.unsubscribe_subconsumer(i_queue text, i_consumer text, i_subconsumer text,
                                              i_batch_handling integer DEFAULT 0) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.unregister_subconsumer(i_queue, i_consumer, i_subconsumer, i_batch_handling)
$$;

-- The member's batch (registered on the way, as PgQue does): its open one, a silent
-- member's (dead_interval), or the next range after the main's cursor.
CREATE OR REPLACE FUNCTION pgque.next_batch_custom(i_queue text, i_consumer text, i_subconsumer text, i_min_lag interval,
                                        i_min_count int4, i_min_interval interval, i_dead_interval interval DEFAULT NULL,
                                        OUT batch_id bigint, OUT prev_tick_id bigint, OUT next_tick_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    PERFORM pgque.register_subconsumer(i_queue, i_consumer, i_subconsumer);
    batch_id := conveyor.stream_next_batch_coop(i_queue, i_consumer, i_consumer || '.' || i_subconsumer,
                                                i_dead_interval, i_min_lag, i_min_count, i_min_interval);
    IF batch_id IS NOT NULL THEN
        SELECT c.last_tick, c.next_tick INTO prev_tick_id, next_tick_id
          FROM conveyor.stream_consumers c WHERE c.batch_id = next_batch_custom.batch_id;
    END IF;
END $$;

CREATE OR REPLACE FUNCTION pgque.next_batch(i_queue text, i_consumer text, i_subconsumer text,
                                 i_dead_interval interval DEFAULT NULL) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT batch_id FROM pgque.next_batch_custom(i_queue, i_consumer, i_subconsumer, NULL, NULL, NULL, i_dead_interval)
$$;

-- The member's batch whole (batches with nothing for the group are finished on the way, as
-- pgque.receive does), or SQLSTATE 54000 when it holds more than i_max_return: the
-- statement fails, so the batch is not allocated and the cursor does not move (a batch the
-- member already held stays its own); retry with a larger ceiling. NULL: no ceiling.
CREATE OR REPLACE FUNCTION pgque.receive_coop(i_queue text, i_consumer text, i_subconsumer text, i_max_return integer DEFAULT 100,
                                   i_dead_interval interval DEFAULT NULL)
RETURNS SETOF pgque.message
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    batch bigint;
    page conveyor.stream_event[];
BEGIN
    IF i_max_return < 1 THEN
        RAISE EXCEPTION 'pgque.receive_coop: max_return must be >= 1, got %', i_max_return;
    END IF;
    FOR i IN 1 .. 1000 LOOP
        batch := pgque.next_batch(i_queue, i_consumer, i_subconsumer, i_dead_interval);
        IF batch IS NULL THEN
            RETURN;
        END IF;
        SELECT array_agg(e ORDER BY e.id) INTO page
          FROM (SELECT * FROM conveyor.stream_get_batch_events(batch) x
                 ORDER BY x.id LIMIT CASE WHEN i_max_return < 2147483647 THEN i_max_return + 1 END) e;
        IF page IS NULL THEN
            PERFORM conveyor.stream_finish_batch(batch);
            CONTINUE;
        END IF;
        IF cardinality(page) > i_max_return THEN
            RAISE EXCEPTION USING ERRCODE = 'program_limit_exceeded',
                MESSAGE = format('pgque.receive_coop: batch exceeds max_return of %s', i_max_return),
                DETAIL = format('batch %s holds more than %s events', batch, i_max_return),
                HINT = 'Retry with a larger resource-safe max_return to receive the complete batch. Do not acknowledge after this error.';
        END IF;
        RETURN QUERY SELECT e.id, e.batch_id, e.type, e.payload, e.retry_count, e.created_at,
                            e.extra1, e.extra2, e.extra3, e.extra4
                       FROM unnest(page) e ORDER BY e.id;
        RETURN;
    END LOOP;
END $$;

-- 0001's receive, refused for a cooperative main or member (PgQue's words), with PgQue's
-- overflow hint.
CREATE OR REPLACE FUNCTION pgque.receive(i_queue text, i_consumer text, i_max_return integer DEFAULT 100)
RETURNS SETOF pgque.message
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    page conveyor.stream_event[];
BEGIN
    IF i_max_return IS NULL OR i_max_return < 1 THEN
        RAISE EXCEPTION 'pgque.receive: max_return must be >= 1, got %', coalesce(i_max_return::text, 'NULL');
    END IF;
    PERFORM pgque._plain_consumer(pgque._subscriber(i_queue, i_consumer), i_queue);
    -- one event more than the ceiling tells whether the batch is bigger (a batch of 2^31
    -- events does not happen: the ceiling itself is then the answer)
    SELECT array_agg(e ORDER BY e.id) INTO page
      FROM conveyor.stream_receive(i_queue, i_consumer, CASE WHEN i_max_return < 2147483647 THEN i_max_return + 1
                                                             ELSE i_max_return END) e;
    IF page IS NULL THEN
        RETURN;
    END IF;
    IF cardinality(page) > i_max_return OR NOT coalesce(conveyor.stream_batch_read_all((page[1]).batch_id), true) THEN
        RAISE EXCEPTION USING ERRCODE = 'program_limit_exceeded',
            MESSAGE = format('pgque.receive: batch exceeds max_return of %s', i_max_return),
            DETAIL = format('batch %s holds more than %s events', (page[1]).batch_id, i_max_return),
            HINT = 'Retry with a larger resource-safe max_return to receive the complete batch. Do not acknowledge after this error.';
    END IF;
    RETURN QUERY SELECT e.id, e.batch_id, e.type, e.payload, e.retry_count, e.created_at,
                        e.extra1, e.extra2, e.extra3, e.extra4
                   FROM unnest(page) e ORDER BY e.id;
END $$;

CREATE OR REPLACE FUNCTION pgque.next_batch_custom(i_queue_name text, i_consumer_name text, i_min_lag interval,
    i_min_count int4, i_min_interval interval,
    OUT batch_id int8, OUT cur_tick_id int8, OUT prev_tick_id int8, OUT cur_tick_time timestamptz,
    OUT prev_tick_time timestamptz, OUT cur_tick_event_seq int8, OUT prev_tick_event_seq int8)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    c conveyor.stream_consumers := pgque._subscriber(i_queue_name, i_consumer_name);
BEGIN
    PERFORM pgque._plain_consumer(c, i_queue_name);
    batch_id := conveyor.stream_next_batch_custom(i_queue_name, i_consumer_name, i_min_lag, i_min_count,
                                                  i_min_interval);
    IF batch_id IS NULL THEN
        RETURN;
    END IF;
    SELECT x.* INTO c FROM conveyor.stream_consumers x WHERE x.id = c.id;
    SELECT t.tick_id, t.tick_time, t.tick_event_seq INTO prev_tick_id, prev_tick_time, prev_tick_event_seq
      FROM conveyor.stream_ticks t WHERE t.stream_id = c.stream_id AND t.tick_id = c.last_tick;
    SELECT t.tick_id, t.tick_time, t.tick_event_seq INTO cur_tick_id, cur_tick_time, cur_tick_event_seq
      FROM conveyor.stream_ticks t WHERE t.stream_id = c.stream_id AND t.tick_id = c.next_tick;
END $$;

-- 0001's unregister, refusing a main with members and a member holding a batch (PgQue's
-- words); a member is otherwise removed as any consumer is.
CREATE OR REPLACE FUNCTION pgque.unregister_consumer(x_queue_name text, x_consumer_name text) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    c conveyor.stream_consumers;
BEGIN
    SELECT x.* INTO c FROM conveyor.stream_consumers x JOIN conveyor.streams s ON s.id = x.stream_id
     WHERE s.name = x_queue_name AND x.name = x_consumer_name;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    IF c.coop_of IS NOT NULL AND c.batch_id IS NOT NULL THEN
        RAISE EXCEPTION 'cannot unregister active cooperative subconsumer without forced batch handling';
    END IF;
    IF EXISTS (SELECT 1 FROM conveyor.stream_consumers m WHERE m.coop_of = c.id) THEN
        RAISE EXCEPTION 'cannot unregister cooperative main consumer with registered subconsumers';
    END IF;
    RETURN CASE WHEN conveyor.stream_unsubscribe(x_queue_name, x_consumer_name) THEN 1 ELSE 0 END;
END $$;

-- 0001's nack and event_retry: a member's retries belong to its main (the engine's rule),
-- so "already waiting" is asked of the main's.
CREATE OR REPLACE FUNCTION pgque.nack(i_batch_id bigint, i_msg pgque.message, i_retry_after interval DEFAULT '60 seconds',
                                      i_reason text DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    c conveyor.stream_consumers := pgque._batch_holder(i_batch_id);
BEGIN
    IF c.id IS NULL THEN
        RAISE EXCEPTION 'batch not found: %', i_batch_id;
    END IF;
    IF i_msg.msg_id IS NULL
       OR NOT EXISTS (SELECT 1 FROM conveyor.stream_get_batch_events(i_batch_id) e WHERE e.id = i_msg.msg_id) THEN
        RAISE EXCEPTION 'msg_id % not found in batch %', coalesce(i_msg.msg_id::text, 'NULL'), i_batch_id;
    END IF;
    IF EXISTS (SELECT 1 FROM conveyor.stream_retries r
                WHERE r.consumer_id = coalesce(c.coop_of, c.id) AND r.ev_id = i_msg.msg_id)
       OR EXISTS (SELECT 1 FROM conveyor.stream_dead_letters d
                   WHERE d.stream_id = c.stream_id AND d.consumer = c.name AND d.ev_id = i_msg.msg_id) THEN
        RETURN 1;
    END IF;
    PERFORM conveyor.stream_nack(i_batch_id, i_msg.msg_id, coalesce(i_retry_after, interval '60 seconds'), i_reason);
    RETURN 1;
END $$;

CREATE OR REPLACE FUNCTION pgque.event_retry(x_batch_id bigint, x_event_id bigint, x_retry_seconds integer)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    c conveyor.stream_consumers := pgque._batch_holder(x_batch_id);
BEGIN
    IF c.id IS NULL THEN
        RAISE EXCEPTION 'batch not found';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM conveyor.stream_get_batch_events(x_batch_id) e WHERE e.id = x_event_id) THEN
        RAISE EXCEPTION 'event not found';
    END IF;
    IF EXISTS (SELECT 1 FROM conveyor.stream_retries r
                WHERE r.consumer_id = coalesce(c.coop_of, c.id) AND r.ev_id = x_event_id) THEN
        RETURN 0;
    END IF;
    RETURN conveyor.stream_event_retry(x_batch_id, x_event_id, greatest(coalesce(x_retry_seconds, 0), 0));
END $$;

DO $$
BEGIN
    GRANT SELECT ON pgque.subscription TO pgque_reader, pgque_admin;
    GRANT EXECUTE ON FUNCTION
        pgque.register_subconsumer(text, text, text, boolean), pgque.subscribe_subconsumer(text, text, text, boolean),
        pgque.unregister_subconsumer(text, text, text, integer),
        pgque.unsubscribe_subconsumer(text, text, text, integer),
        pgque.touch_subconsumer(text, text, text), pgque.next_batch(text, text, text, interval),
        pgque.next_batch_custom(text, text, text, interval, int4, interval, interval),
        pgque.receive_coop(text, text, text, integer, interval)
        TO pgque_reader, pgque_admin;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor pgque dialect: roles missing, grants skipped (%)', SQLERRM;
END $$;

REVOKE ALL ON ALL ROUTINES IN SCHEMA pgque FROM PUBLIC;
