-- Conveyor 0023: cooperative members of a stream consumer (PgQue's cooperative consumers,
-- pgque.receive_coop; PgQ's pgq_coop).
--
-- A consumer's batches are consecutive tick ranges read one at a time. A cooperative
-- consumer shares that cursor between several workers: each member takes the next range
-- as a batch of its own, concurrently with the others, and no range goes to two members.
-- Why the engine and not the dialect: a batch's events are selected for its consumer
-- (retries carry their consumer's id, conveyor._batch_query keeps those of the batch's
-- consumer), and a retry made by one member must come back to the group, through whichever
-- member reads the range it lands in; only the engine's batch query can say so.
--
--   stream_consumers.coop_of   a member's row points at its consumer (the "main" row, which
--                              keeps the cursor); members are named <consumer>.<member>
--   retries of a member's batch belong to the consumer (ev_owner = the main row's id), and
--                              every member's batch reads them
--   stream_next_batch_coop     a member's open batch, or the range after the consumer's
--                              cursor (which moves past it at once), or, with dead_interval,
--                              the batch of a member silent that long, under a new batch id
--   stream_finish_batch        a member's finished batch leaves it idle at the consumer's
--                              cursor (members never hold the cursor back while idle, so
--                              rotation and tick cleanup see only open member batches)
--   stream_next_batch_custom   refuses a consumer with members, and a member (CVS06): their
--                              batches come from stream_next_batch_coop

ALTER TABLE conveyor.stream_consumers
    ADD COLUMN coop_of bigint REFERENCES conveyor.stream_consumers (id) ON DELETE CASCADE;
CREATE INDEX stream_consumers_coop_of_idx ON conveyor.stream_consumers (coop_of) WHERE coop_of IS NOT NULL;

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
CREATE FUNCTION conveyor._batch_end(s conveyor.streams, last_tick bigint, min_lag interval, min_count integer,
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

-- Makes member_name (<consumer>.<member>) a member of consumer_name, which is subscribed
-- first (from the latest tick) when it is not. True when the member is new. A consumer
-- with an open batch of its own cannot take members, nor can a member or a name in use.
CREATE FUNCTION conveyor.stream_coop_join(stream_name text, consumer_name text, member_name text) RETURNS boolean
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
CREATE FUNCTION conveyor.stream_next_batch_coop(stream_name text, consumer_name text, member_name text,
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

REVOKE ALL ON FUNCTION conveyor._batch_end(conveyor.streams, bigint, interval, integer, interval),
    conveyor.stream_coop_join(text, text, text),
    conveyor.stream_next_batch_coop(text, text, text, interval, interval, integer, interval) FROM PUBLIC;

DO $$
BEGIN
    GRANT EXECUTE ON FUNCTION conveyor.stream_coop_join(text, text, text),
                              conveyor.stream_next_batch_coop(text, text, text, interval, interval, integer, interval)
        TO conveyor_writer;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: roles missing, grants skipped (%)', SQLERRM;
END $$;
