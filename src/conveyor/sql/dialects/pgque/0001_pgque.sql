-- Conveyor dialect pgque 0001: PgQue's SQL interface (seed 001, "PgQ Universal Edition"),
-- as PgQue 0.2 and its clients (pgque-py 0.2.x) call it, over Conveyor's event streams.
--
-- A PgQue queue IS a Conveyor stream: every function here resolves the queue name to a
-- row of conveyor.streams and calls Conveyor's stream functions (conveyor.stream_*,
-- conveyor.ticker, conveyor.maint, the dead-letter and observability functions). No event,
-- tick, consumer, retry or dead letter is stored here; the schema holds only functions,
-- read-only views shaped like PgQue's tables, the pgque.message type, and the trigger that
-- announces ticks on PgQue's NOTIFY channels. A stream created through Conveyor (REST,
-- conveyor.stream_create) is a PgQue queue at once, and the reverse.
--
-- Errors keep PgQue's texts (SQLSTATE P0001, as PgQue raises them), so that its clients'
-- error mapping works: 'queue not found: <q>', 'Not subscriber to queue: <q>/<c>',
-- 'batch not found: <id>', 'msg_id <m> not found in batch <b>', ... Values Conveyor
-- refuses (names outside [A-Za-z0-9_-], option ranges) keep Conveyor's CVV01 errors.
--
-- Roles as PgQue has them: pgque_reader (consume: subscribe, receive, ack, nack, look) and
-- pgque_writer (produce: send, send_batch, send_at, dead-letter replay) are siblings;
-- pgque_admin is a member of both and runs everything else (queues, ticker, maintenance).

CREATE SCHEMA pgque;
COMMENT ON SCHEMA pgque IS 'PgQue''s SQL interface over Conveyor''s event streams (Conveyor dialect pgque)';

------------------------------------------------------------------------------------------
-- Types and views shaped like PgQue's
------------------------------------------------------------------------------------------

-- What pgque.receive returns and pgque.nack takes (PgQue's composite, field for field).
CREATE TYPE pgque.message AS (
    msg_id      bigint,
    batch_id    bigint,
    type        text,
    payload     text,
    retry_count int4,
    created_at  timestamptz,
    extra1      text,
    extra2      text,
    extra3      text,
    extra4      text
);

-- PgQue's tables, read-only over Conveyor's. Ids are Conveyor's (a stream's id is the
-- queue_id, a subscription's id the consumer's co_id: Conveyor keeps consumers per stream).
CREATE VIEW pgque.queue AS
SELECT s.id::int4 AS queue_id, s.name AS queue_name, 3 AS queue_ntables, s.cur_table::int4 AS queue_cur_table,
       s.rotation_period AS queue_rotation_period, s.switch_time AS queue_switch_time,
       s.switch_step1 AS queue_switch_step1, s.switch_step2 AS queue_switch_step2,
       false AS queue_external_ticker, false AS queue_disable_insert, s.ticker_paused AS queue_ticker_paused,
       s.ticker_max_count AS queue_ticker_max_count, s.ticker_max_lag AS queue_ticker_max_lag,
       s.ticker_idle_period AS queue_ticker_idle_period, s.max_retries AS queue_max_retries,
       'conveyor.stream_' || s.id AS queue_data_pfx, s.event_seq::text AS queue_event_seq
  FROM conveyor.streams s;

CREATE VIEW pgque.consumer AS
SELECT c.id::int4 AS co_id, c.name AS co_name FROM conveyor.stream_consumers c;

CREATE VIEW pgque.subscription AS
SELECT c.id::int4 AS sub_id, c.stream_id::int4 AS sub_queue, c.id::int4 AS sub_consumer,
       c.last_tick AS sub_last_tick, c.active_at AS sub_active, c.batch_id AS sub_batch,
       c.next_tick AS sub_next_tick, 'normal'::text AS sub_role
  FROM conveyor.stream_consumers c;

CREATE VIEW pgque.tick AS
SELECT t.stream_id::int4 AS tick_queue, t.tick_id, t.tick_time, t.tick_snapshot, t.tick_event_seq
  FROM conveyor.stream_ticks t;

-- dl_consumer_id is the consumer's id while it is subscribed (Conveyor keeps the consumer's
-- name with a dead letter, so the letter outlives its consumer); ev_txid is NULL as in
-- PgQue (a message does not carry its transaction id).
CREATE VIEW pgque.dead_letter AS
SELECT d.id AS dl_id, d.stream_id::int4 AS dl_queue_id, c.id::int4 AS dl_consumer_id, d.dead_at AS dl_time,
       d.reason AS dl_reason, d.ev_id, d.ev_time, NULL::xid8 AS ev_txid, d.ev_retry, d.ev_type, d.ev_data,
       d.ev_extra1, d.ev_extra2, d.ev_extra3, d.ev_extra4
  FROM conveyor.stream_dead_letters d
  LEFT JOIN conveyor.stream_consumers c ON c.stream_id = d.stream_id AND c.name = d.consumer;

CREATE VIEW pgque.delayed_events AS
SELECT d.id AS de_id, s.name AS de_queue_name, d.deliver_at AS de_deliver_at, d.ev_type AS de_type,
       d.ev_data AS de_data, d.ev_extra1 AS de_extra1, d.ev_extra2 AS de_extra2, d.ev_extra3 AS de_extra3,
       d.ev_extra4 AS de_extra4
  FROM conveyor.stream_delayed d JOIN conveyor.streams s ON s.id = d.stream_id;

CREATE VIEW pgque.retry_queue AS
SELECT r.retry_at AS ev_retry_after, r.stream_id::int4 AS ev_queue, r.ev_id, r.ev_time, NULL::xid8 AS ev_txid,
       r.consumer_id::int4 AS ev_owner, r.ev_retry, r.ev_type, r.ev_data, r.ev_extra1, r.ev_extra2,
       r.ev_extra3, r.ev_extra4
  FROM conveyor.stream_retries r;

------------------------------------------------------------------------------------------
-- Internal helpers (not granted to anyone)
------------------------------------------------------------------------------------------

-- The stream a queue name stands for, or PgQue's error for that call site.
CREATE FUNCTION pgque._queue(queue_name text, missing text) RETURNS conveyor.streams
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
CREATE FUNCTION pgque._batch_holder(batch_id bigint) RETURNS conveyor.stream_consumers
LANGUAGE sql STABLE SET search_path = pg_catalog AS $$
    SELECT c FROM conveyor.stream_consumers c WHERE c.batch_id = _batch_holder.batch_id
$$;

-- The consumer, or PgQue's next_batch error (a missing queue and a missing subscription
-- read the same there).
CREATE FUNCTION pgque._subscriber(queue_name text, consumer_name text) RETURNS conveyor.stream_consumers
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
CREATE FUNCTION pgque._notify_tick() RETURNS trigger
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

CREATE TRIGGER pgque_notify_tick AFTER INSERT ON conveyor.stream_ticks
    FOR EACH ROW EXECUTE FUNCTION pgque._notify_tick();

------------------------------------------------------------------------------------------
-- Queues (admin)
------------------------------------------------------------------------------------------

-- 1 when created, 0 when it existed (PgQue's answer), with Conveyor's defaults, which are
-- PgQ's: 2 hours rotation, ticks after 500 events or 3 seconds, 1 minute idle, 5 retries.
CREATE FUNCTION pgque.create_queue(i_queue_name text) RETURNS integer
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
CREATE FUNCTION pgque.create_queue(i_queue text, i_options jsonb) RETURNS integer
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
CREATE FUNCTION pgque.drop_queue(x_queue_name text, x_force boolean) RETURNS integer
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

CREATE FUNCTION pgque.drop_queue(x_queue_name text) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.drop_queue(x_queue_name, false)
$$;

-- One parameter (PgQue's names without the queue_ prefix) through conveyor.stream_set_config;
-- NULL restores the default. external_ticker can only be false: Conveyor makes its own ticks.
CREATE FUNCTION pgque.set_queue_config(x_queue_name text, x_param_name text, x_param_value text) RETURNS integer
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

CREATE FUNCTION pgque.pause_queue(i_queue text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.set_queue_config(i_queue, 'ticker_paused', 'true');
$$;

CREATE FUNCTION pgque.resume_queue(i_queue text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.set_queue_config(i_queue, 'ticker_paused', 'false');
$$;

------------------------------------------------------------------------------------------
-- Producers (writer)
------------------------------------------------------------------------------------------

CREATE FUNCTION pgque.insert_event(queue_name text, ev_type text, ev_data text,
                                   ev_extra1 text, ev_extra2 text, ev_extra3 text, ev_extra4 text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    PERFORM pgque._queue(queue_name, format('queue not found: %s', queue_name));
    RETURN conveyor.stream_send(queue_name, ev_data, ev_type, ev_extra1, ev_extra2, ev_extra3, ev_extra4);
END $$;

CREATE FUNCTION pgque.insert_event(queue_name text, ev_type text, ev_data text) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.insert_event(queue_name, ev_type, ev_data, NULL, NULL, NULL, NULL)
$$;

-- text payloads are stored as given; jsonb payloads are validated and stored as JSON text.
CREATE FUNCTION pgque.send(queue_name text, type_name text, payload text) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.insert_event(queue_name, type_name, payload, NULL, NULL, NULL, NULL)
$$;

CREATE FUNCTION pgque.send(queue_name text, type_name text, payload jsonb) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.insert_event(queue_name, type_name, payload::text, NULL, NULL, NULL, NULL)
$$;

CREATE FUNCTION pgque.send(queue_name text, payload text) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.insert_event(queue_name, 'default', payload, NULL, NULL, NULL, NULL)
$$;

CREATE FUNCTION pgque.send(queue_name text, payload jsonb) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.insert_event(queue_name, 'default', payload::text, NULL, NULL, NULL, NULL)
$$;

-- One statement (conveyor.stream_send_batch); ids in input order. An empty array answers
-- '{}' without looking the queue up, a NULL array is refused, NULL elements are stored as
-- NULL payloads: PgQue's rules.
CREATE FUNCTION pgque.send_batch(queue_name text, type_name text, payloads text[]) RETURNS bigint[]
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

CREATE FUNCTION pgque.send_batch(queue_name text, type_name text, payloads jsonb[]) RETURNS bigint[]
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.send_batch(queue_name, type_name, payloads::text[])
$$;

CREATE FUNCTION pgque.send_batch(queue_name text, payloads text[]) RETURNS bigint[]
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.send_batch(queue_name, 'default', payloads)
$$;

CREATE FUNCTION pgque.send_batch(queue_name text, payloads jsonb[]) RETURNS bigint[]
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.send_batch(queue_name, 'default', payloads::text[])
$$;

-- Delayed delivery (conveyor.stream_send_at): the scheduled entry's id, not an event id
-- (maint() appends the event when due), or the event id when deliver_at is not in the future.
CREATE FUNCTION pgque.send_at(i_queue text, i_type text, i_payload text, i_deliver_at timestamptz) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    PERFORM pgque._queue(i_queue, format('queue not found: %s', i_queue));
    IF i_deliver_at IS NULL THEN
        RAISE EXCEPTION 'send_at: deliver_at must not be null';
    END IF;
    RETURN conveyor.stream_send_at(i_queue, i_payload, i_deliver_at, coalesce(i_type, 'default'));
END $$;

CREATE FUNCTION pgque.send_at(i_queue text, i_type text, i_payload jsonb, i_deliver_at timestamptz) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.send_at(i_queue, i_type, i_payload::text, i_deliver_at)
$$;

------------------------------------------------------------------------------------------
-- Consumers (reader): registration
------------------------------------------------------------------------------------------

-- 1 for a new subscription, 0 when it existed; from the queue's latest tick on.
CREATE FUNCTION pgque.register_consumer_at(x_queue_name text, x_consumer_name text, x_tick_pos bigint)
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

CREATE FUNCTION pgque.register_consumer(x_queue_name text, x_consumer_id text) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.register_consumer_at(x_queue_name, x_consumer_id, NULL)
$$;

-- The number of subscriptions removed (0 or 1), with the consumer's pending retries.
CREATE FUNCTION pgque.unregister_consumer(x_queue_name text, x_consumer_name text) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM conveyor.streams s WHERE s.name = x_queue_name) THEN
        RETURN 0;
    END IF;
    RETURN CASE WHEN conveyor.stream_unsubscribe(x_queue_name, x_consumer_name) THEN 1 ELSE 0 END;
END $$;

CREATE FUNCTION pgque.subscribe(queue text, consumer text) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.register_consumer_at(queue, consumer, NULL)
$$;

CREATE FUNCTION pgque.unsubscribe(queue text, consumer text) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.unregister_consumer(queue, consumer)
$$;

------------------------------------------------------------------------------------------
-- Consumers (reader): the modern API
------------------------------------------------------------------------------------------

-- The consumer's next batch, whole, or nothing yet (conveyor.stream_receive; batches with
-- nothing for this consumer are finished on the way). max_return is a ceiling for the whole
-- batch, as pgque-py 0.2.2 documents it: a batch holding more raises SQLSTATE 54000 and
-- returns nothing, so that ack() never finishes events the caller did not see. Receiving
-- again before ack() returns the same batch.
CREATE FUNCTION pgque.receive(i_queue text, i_consumer text, i_max_return integer DEFAULT 100)
RETURNS SETOF pgque.message
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    page conveyor.stream_event[];
BEGIN
    IF i_max_return IS NULL OR i_max_return < 1 THEN
        RAISE EXCEPTION 'pgque.receive: max_return must be >= 1, got %', coalesce(i_max_return::text, 'NULL');
    END IF;
    PERFORM pgque._subscriber(i_queue, i_consumer);
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
            HINT = 'Roll back and receive again with a larger max_return; never ack a batch whose receive failed.';
    END IF;
    RETURN QUERY SELECT e.id, e.batch_id, e.type, e.payload, e.retry_count, e.created_at,
                        e.extra1, e.extra2, e.extra3, e.extra4
                   FROM unnest(page) e ORDER BY e.id;
END $$;

-- Finishes the batch: 1, or 0 with a warning when no consumer holds it (PgQue's answer to
-- a stale or double ack).
CREATE FUNCTION pgque.ack(i_batch_id bigint) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    IF (pgque._batch_holder(i_batch_id)).id IS NULL THEN
        RAISE WARNING 'finish_batch: batch % not found', i_batch_id;
        RETURN 0;
    END IF;
    RETURN conveyor.stream_ack(i_batch_id);
END $$;

-- One message failed: retried for this consumer after i_retry_after, or once it was retried
-- max_retries times, moved to the dead letters with the reason (conveyor.stream_nack). Only
-- msg_id is taken from i_msg; the event itself is read from the batch. Idempotent within a
-- batch: a message already put back or dead-lettered is not put back twice. Ack the batch
-- afterwards.
CREATE FUNCTION pgque.nack(i_batch_id bigint, i_msg pgque.message, i_retry_after interval DEFAULT '60 seconds',
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
    IF EXISTS (SELECT 1 FROM conveyor.stream_retries r WHERE r.consumer_id = c.id AND r.ev_id = i_msg.msg_id)
       OR EXISTS (SELECT 1 FROM conveyor.stream_dead_letters d
                   WHERE d.stream_id = c.stream_id AND d.consumer = c.name AND d.ev_id = i_msg.msg_id) THEN
        RETURN 1;
    END IF;
    PERFORM conveyor.stream_nack(i_batch_id, i_msg.msg_id, coalesce(i_retry_after, interval '60 seconds'), i_reason);
    RETURN 1;
END $$;

------------------------------------------------------------------------------------------
-- Consumers (reader): PgQ's batch primitives
------------------------------------------------------------------------------------------

CREATE FUNCTION pgque.next_batch_custom(i_queue_name text, i_consumer_name text, i_min_lag interval,
    i_min_count int4, i_min_interval interval,
    OUT batch_id int8, OUT cur_tick_id int8, OUT prev_tick_id int8, OUT cur_tick_time timestamptz,
    OUT prev_tick_time timestamptz, OUT cur_tick_event_seq int8, OUT prev_tick_event_seq int8)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    c conveyor.stream_consumers := pgque._subscriber(i_queue_name, i_consumer_name);
BEGIN
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

CREATE FUNCTION pgque.next_batch_info(i_queue_name text, i_consumer_name text,
    OUT batch_id int8, OUT cur_tick_id int8, OUT prev_tick_id int8, OUT cur_tick_time timestamptz,
    OUT prev_tick_time timestamptz, OUT cur_tick_event_seq int8, OUT prev_tick_event_seq int8)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT * FROM pgque.next_batch_custom(i_queue_name, i_consumer_name, NULL, NULL, NULL)
$$;

CREATE FUNCTION pgque.next_batch(i_queue_name text, i_consumer_name text) RETURNS int8
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT batch_id FROM pgque.next_batch_custom(i_queue_name, i_consumer_name, NULL, NULL, NULL)
$$;

-- ev_txid is NULL: Conveyor's batch rows do not carry it.
CREATE FUNCTION pgque.get_batch_events(x_batch_id bigint,
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
CREATE FUNCTION pgque.finish_batch(x_batch_id bigint) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    IF (pgque._batch_holder(x_batch_id)).id IS NULL THEN
        RAISE WARNING 'finish_batch: batch % not found', x_batch_id;
        RETURN 0;
    END IF;
    RETURN conveyor.stream_finish_batch(x_batch_id);
END $$;

-- 1, or 0 when the event is already waiting for its retry.
CREATE FUNCTION pgque.event_retry(x_batch_id bigint, x_event_id bigint, x_retry_seconds integer) RETURNS integer
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
    IF EXISTS (SELECT 1 FROM conveyor.stream_retries r WHERE r.consumer_id = c.id AND r.ev_id = x_event_id) THEN
        RETURN 0;
    END IF;
    RETURN conveyor.stream_event_retry(x_batch_id, x_event_id, greatest(coalesce(x_retry_seconds, 0), 0));
END $$;

CREATE FUNCTION pgque.event_retry(x_batch_id bigint, x_event_id bigint, x_retry_time timestamptz) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.event_retry(x_batch_id, x_event_id,
                             ceil(greatest(extract(epoch FROM x_retry_time - now()), 0))::integer)
$$;

-- Every event of the batch back for retry (those not already waiting); the count.
CREATE FUNCTION pgque.batch_retry(i_batch_id bigint, i_retry_seconds integer) RETURNS integer
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

------------------------------------------------------------------------------------------
-- Dead letters
------------------------------------------------------------------------------------------

-- PgQue's hook for nack(): the event is read from the batch (the caller's fields are not
-- trusted, as in nack), once per consumer and event.
CREATE FUNCTION pgque.event_dead(i_batch_id bigint, i_event_id bigint, i_reason text, i_ev_time timestamptz,
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
CREATE FUNCTION pgque.dlq_inspect(i_queue_name text, i_limit_count integer DEFAULT 100)
RETURNS SETOF pgque.dead_letter
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT d.* FROM pgque.dead_letter d JOIN conveyor.streams s ON s.id = d.dl_queue_id
     WHERE s.name = i_queue_name
     ORDER BY d.dl_time DESC, d.dl_id DESC
     LIMIT i_limit_count
$$;

-- Appends the dead letter to its queue again as a new event (every consumer sees it), and
-- removes it from the dead letters; the new event id.
CREATE FUNCTION pgque.dlq_replay(i_dead_letter_id bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM conveyor.stream_dead_letters d WHERE d.id = i_dead_letter_id) THEN
        RAISE EXCEPTION 'dead letter entry not found: %', i_dead_letter_id;
    END IF;
    RETURN conveyor.stream_dead_letter_replay(i_dead_letter_id, NULL);
END $$;

-- All of a queue's dead letters in one statement: replayed, failed (always 0: the replay
-- is all or nothing), first_error.
CREATE FUNCTION pgque.dlq_replay_all(i_queue_name text, OUT replayed bigint, OUT failed bigint, OUT first_error text)
RETURNS record
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    replayed := 0; failed := 0; first_error := NULL;
    IF EXISTS (SELECT 1 FROM conveyor.streams s WHERE s.name = i_queue_name) THEN
        replayed := conveyor.stream_dead_letter_replay_all(i_queue_name);
    END IF;
END $$;

CREATE FUNCTION pgque.dlq_purge(i_queue_name text, i_older_than interval DEFAULT '30 days') RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM conveyor.streams s WHERE s.name = i_queue_name) THEN
        RETURN 0;
    END IF;
    RETURN conveyor.stream_dead_letter_purge(i_queue_name, i_older_than);
END $$;

------------------------------------------------------------------------------------------
-- Ticker and maintenance (admin)
------------------------------------------------------------------------------------------

-- Ticks every queue that needs it (conveyor.ticker): how many were ticked.
CREATE FUNCTION pgque.ticker() RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT conveyor.ticker()::bigint
$$;

-- Ticks one queue if it needs it (Conveyor's rule: ticker_max_count events, or events and
-- ticker_max_lag, or ticker_idle_period): the new tick id, or NULL.
CREATE FUNCTION pgque.ticker(i_queue_name text) RETURNS bigint
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
CREATE FUNCTION pgque.force_next_tick(i_queue_name text) RETURNS bigint
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

CREATE FUNCTION pgque.force_tick(i_queue_name text) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT pgque.force_next_tick(i_queue_name)
$$;

-- One round of Conveyor's maintenance (conveyor.maint: rotation steps 1 and 2, due retries,
-- due delayed events, old ticks): the number of operations done.
CREATE FUNCTION pgque.maint() RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT coalesce(sum(m.count), 0)::integer FROM conveyor.maint() m
$$;

-- Due retries back into their queues (also done by maint()): how many.
CREATE FUNCTION pgque.maint_retry_events() RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT coalesce(sum(conveyor._move_retries(s)), 0)::integer FROM conveyor.streams s
$$;

-- Due delayed events into their queues (also done by maint()): how many.
CREATE FUNCTION pgque.maint_deliver_delayed() RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT coalesce(sum(conveyor._move_delayed(s)), 0)::integer FROM conveyor.streams s
$$;

-- The hot tables to VACUUM (maintenance cannot vacuum inside a function).
CREATE FUNCTION pgque.maint_tables_to_vacuum() RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT conveyor.maint_tables_to_vacuum()
$$;

-- Server-less operation through Conveyor's pg_cron jobs (conveyor.start / stop).
CREATE FUNCTION pgque.start() RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_cron') THEN
        RAISE EXCEPTION 'pg_cron extension is not installed. '
            'PgQue itself works without pg_cron, but pgque.start() schedules cron jobs. '
            'Install pg_cron first, or run pgque.ticker() and pgque.maint() manually.';
    END IF;
    PERFORM conveyor.start();
END $$;

CREATE FUNCTION pgque.stop() RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT conveyor.stop();
$$;

CREATE FUNCTION pgque.version() RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog AS $$
    SELECT '0.2.0'::text
$$;

CREATE FUNCTION pgque.status() RETURNS TABLE (component text, status text, detail text)
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

------------------------------------------------------------------------------------------
-- Observability (reader)
------------------------------------------------------------------------------------------

CREATE FUNCTION pgque.get_queue_info(i_queue_name text,
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

CREATE FUNCTION pgque.get_queue_info(
    OUT queue_name text, OUT queue_ntables integer, OUT queue_cur_table integer,
    OUT queue_rotation_period interval, OUT queue_switch_time timestamptz, OUT queue_external_ticker boolean,
    OUT queue_ticker_paused boolean, OUT queue_ticker_max_count integer, OUT queue_ticker_max_lag interval,
    OUT queue_ticker_idle_period interval, OUT ticker_lag interval, OUT ev_per_sec float8, OUT ev_new bigint,
    OUT last_tick_id bigint)
RETURNS SETOF record
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT * FROM pgque.get_queue_info(NULL::text)
$$;

CREATE FUNCTION pgque.get_consumer_info(i_queue_name text, i_consumer_name text,
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

CREATE FUNCTION pgque.get_consumer_info(i_queue_name text,
    OUT queue_name text, OUT consumer_name text, OUT lag interval, OUT last_seen interval, OUT last_tick bigint,
    OUT current_batch bigint, OUT next_tick bigint, OUT pending_events bigint)
RETURNS SETOF record
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT * FROM pgque.get_consumer_info(i_queue_name, NULL)
$$;

CREATE FUNCTION pgque.get_consumer_info(
    OUT queue_name text, OUT consumer_name text, OUT lag interval, OUT last_seen interval, OUT last_tick bigint,
    OUT current_batch bigint, OUT next_tick bigint, OUT pending_events bigint)
RETURNS SETOF record
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT * FROM pgque.get_consumer_info(NULL, NULL)
$$;

CREATE FUNCTION pgque.get_batch_info(x_batch_id bigint,
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

CREATE FUNCTION pgque.queue_stats() RETURNS TABLE (
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

CREATE FUNCTION pgque.consumer_stats() RETURNS TABLE (
    queue_name text, consumer_name text, lag interval, pending_events bigint, last_batch_start timestamptz,
    batch_active boolean, batch_id bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT cs.stream, cs.consumer, cs.lag, cs.pending_events, cs.last_seen, cs.batch_active, cs.batch_id
      FROM conveyor.consumer_stats() cs
$$;

-- Conveyor's health checks under PgQue's check names (ticker_running, consumer_lag:<name>,
-- rotation_health, dlq_health).
CREATE FUNCTION pgque.queue_health() RETURNS TABLE (queue_name text, check_name text, status text, detail text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT h.stream,
           CASE h.check_name WHEN 'ticker' THEN 'ticker_running' WHEN 'rotation' THEN 'rotation_health'
                             WHEN 'dead_letters' THEN 'dlq_health' ELSE h.check_name END,
           h.status, h.detail
      FROM conveyor.stream_health() h
$$;

CREATE FUNCTION pgque.otel_metrics() RETURNS TABLE (metric_name text, metric_type text, value numeric, labels jsonb)
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

CREATE FUNCTION pgque.stuck_consumers(i_threshold interval DEFAULT '1 hour')
RETURNS TABLE (queue_name text, consumer_name text, lag interval, last_active timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
    SELECT sc.stream, sc.consumer, sc.lag, sc.last_seen FROM conveyor.stuck_consumers(i_threshold) sc
$$;

CREATE FUNCTION pgque.in_flight(i_queue_name text)
RETURNS TABLE (consumer_name text, batch_id bigint, batch_age interval, estimated_events bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    PERFORM pgque._queue(i_queue_name, format('queue not found: %s', i_queue_name));
    RETURN QUERY SELECT f.consumer, f.batch_id, f.batch_age, f.estimated_events
                   FROM conveyor.stream_in_flight(i_queue_name) f;
END $$;

CREATE FUNCTION pgque.throughput(i_queue_name text, i_period interval, i_bucket_size interval)
RETURNS TABLE (bucket_start timestamptz, events bigint, events_per_sec numeric)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    PERFORM pgque._queue(i_queue_name, format('queue not found: %s', i_queue_name));
    RETURN QUERY SELECT t.bucket_start, t.events, t.events_per_sec
                   FROM conveyor.stream_throughput(i_queue_name, i_period, i_bucket_size) t;
END $$;

-- Retries (by when they are due) and dead letters (by when they died) per bucket.
CREATE FUNCTION pgque.error_rate(i_queue_name text, i_period interval, i_bucket_size interval)
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

------------------------------------------------------------------------------------------
-- Roles: PgQue's three, created when missing (they are cluster-wide: another database's
-- install may have made them), reader and writer siblings, admin a member of both.
------------------------------------------------------------------------------------------

DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['pgque_reader', 'pgque_writer', 'pgque_admin'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION WHEN duplicate_object THEN
                NULL;  -- created meanwhile by an install in another database
            END;
        END IF;
    END LOOP;
    IF NOT pg_has_role('pgque_admin', 'pgque_reader', 'member') THEN
        GRANT pgque_reader TO pgque_admin;
    END IF;
    IF NOT pg_has_role('pgque_admin', 'pgque_writer', 'member') THEN
        GRANT pgque_writer TO pgque_admin;
    END IF;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE WARNING 'conveyor pgque dialect: cannot create roles (%); create pgque_reader, pgque_writer and '
                  'pgque_admin as a superuser and grant them as docs/dialects/pgque.md says', SQLERRM;
END $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgque FROM PUBLIC;

DO $$
BEGIN
    GRANT USAGE ON SCHEMA pgque TO pgque_reader, pgque_writer, pgque_admin;
    GRANT SELECT ON pgque.queue, pgque.consumer, pgque.subscription, pgque.tick, pgque.dead_letter,
                    pgque.delayed_events, pgque.retry_queue TO pgque_reader, pgque_admin;
    GRANT EXECUTE ON FUNCTION
        pgque.subscribe(text, text), pgque.unsubscribe(text, text),
        pgque.register_consumer(text, text), pgque.register_consumer_at(text, text, bigint),
        pgque.unregister_consumer(text, text),
        pgque.receive(text, text, integer), pgque.ack(bigint),
        pgque.nack(bigint, pgque.message, interval, text),
        pgque.next_batch(text, text), pgque.next_batch_info(text, text),
        pgque.next_batch_custom(text, text, interval, int4, interval),
        pgque.get_batch_events(bigint), pgque.finish_batch(bigint),
        pgque.event_retry(bigint, bigint, integer), pgque.event_retry(bigint, bigint, timestamptz),
        pgque.dlq_inspect(text, integer), pgque.version(),
        pgque.get_queue_info(), pgque.get_queue_info(text),
        pgque.get_consumer_info(), pgque.get_consumer_info(text), pgque.get_consumer_info(text, text),
        pgque.get_batch_info(bigint),
        pgque.queue_stats(), pgque.consumer_stats(), pgque.queue_health(), pgque.otel_metrics(),
        pgque.stuck_consumers(interval), pgque.in_flight(text), pgque.throughput(text, interval, interval),
        pgque.error_rate(text, interval, interval)
        TO pgque_reader;
    GRANT EXECUTE ON FUNCTION
        pgque.insert_event(text, text, text), pgque.insert_event(text, text, text, text, text, text, text),
        pgque.send(text, text), pgque.send(text, jsonb), pgque.send(text, text, text), pgque.send(text, text, jsonb),
        pgque.send_batch(text, text[]), pgque.send_batch(text, jsonb[]),
        pgque.send_batch(text, text, text[]), pgque.send_batch(text, text, jsonb[]),
        pgque.send_at(text, text, text, timestamptz), pgque.send_at(text, text, jsonb, timestamptz),
        pgque.dlq_replay(bigint), pgque.dlq_replay_all(text)
        TO pgque_writer;
    GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgque TO pgque_admin;
    -- the internal helpers stay with the owner
    REVOKE EXECUTE ON FUNCTION pgque._queue(text, text), pgque._batch_holder(bigint),
        pgque._subscriber(text, text), pgque._notify_tick() FROM pgque_admin;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor pgque dialect: roles missing, grants skipped (%)', SQLERRM;
END $$;
