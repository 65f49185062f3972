-- Conveyor 0007: acknowledgements that only the current delivery can make, the secrets
-- every server process of a database shares, and stream batches that cannot be
-- acknowledged half-read.
--
-- New SQLSTATE: CVS05 a stream batch was received only in part (see stream_ack).

------------------------------------------------------------------------------------------
-- Server secrets
------------------------------------------------------------------------------------------

-- Random keys created by the first server that needs one and shared by every process on
-- the database (receipt handles are keyed with 'receipts', so any process accepts the
-- handles any other gave out, across restarts). Not granted to conveyor_reader.
CREATE TABLE conveyor.secrets (
    name       text PRIMARY KEY CHECK (name ~ '^[a-z0-9_]{1,40}$'),
    value      bytea NOT NULL CHECK (length(value) >= 32),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The secret of that name: the stored one, or `candidate` (random bytes from the caller)
-- stored now if there was none. Concurrent first callers all get the one that won.
CREATE FUNCTION conveyor.secret_get(secret_name text, candidate bytea) RETURNS bytea
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    INSERT INTO conveyor.secrets (name, value) VALUES (secret_name, candidate)
    ON CONFLICT (name) DO NOTHING;
    RETURN (SELECT s.value FROM conveyor.secrets s WHERE s.name = secret_name);
END $$;

------------------------------------------------------------------------------------------
-- Acknowledging a delivery
------------------------------------------------------------------------------------------

-- A delivery is a message at one receive count: every receive increments the count, so a
-- consumer whose visibility timeout ran out and whose message was received again holds a
-- count that is no longer the message's. These variants take the count each consumer got
-- (receive_counts[i] for ids[i]) and act only on messages still at that count; a NULL count
-- matches any (an administrative act by id, as the two-argument forms).

CREATE FUNCTION conveyor._deliveries(ids bigint[], receive_counts integer[])
RETURNS TABLE (id bigint, receive_count integer)
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF cardinality(ids) IS DISTINCT FROM cardinality(receive_counts) THEN
        PERFORM conveyor._raise('CVV01', format('ids and receive_counts must have the same length, got %s and %s',
                                                cardinality(ids), cardinality(receive_counts)));
    END IF;
    RETURN QUERY SELECT d.id, d.rc FROM unnest(ids, receive_counts) AS d(id, rc);
END $$;

-- Deletes the messages still at the given deliveries; returns the ids deleted.
CREATE FUNCTION conveyor.message_delete(queue_name text, ids bigint[], receive_counts integer[])
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
BEGIN
    RETURN QUERY
    DELETE FROM conveyor.messages m
     USING conveyor._deliveries(ids, receive_counts) d
     WHERE m.queue_id = q.id AND m.id = d.id AND (d.receive_count IS NULL OR m.receive_count = d.receive_count)
    RETURNING m.id;
END $$;

-- Moves the messages still at the given deliveries to the archive as completed.
CREATE FUNCTION conveyor.message_archive(queue_name text, ids bigint[], receive_counts integer[])
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
    current bigint[];
BEGIN
    SELECT array_agg(m.id) INTO current
      FROM conveyor.messages m JOIN conveyor._deliveries(ids, receive_counts) d
        ON m.queue_id = q.id AND m.id = d.id AND (d.receive_count IS NULL OR m.receive_count = d.receive_count);
    RETURN QUERY SELECT * FROM conveyor.message_archive(queue_name, coalesce(current, '{}'));
END $$;

-- Fails a message still at the given delivery (see the three-argument form).
CREATE FUNCTION conveyor.message_fail(queue_name text, id bigint, reason text, receive_count integer)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
BEGIN
    PERFORM 1 FROM conveyor.messages m
     WHERE m.queue_id = q.id AND m.id = message_fail.id
       AND (message_fail.receive_count IS NULL OR m.receive_count = message_fail.receive_count)
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM conveyor._dead_letter(q, ARRAY[message_fail.id], coalesce(reason, 'failed by consumer'));
    RETURN true;
END $$;

-- Changes the visibility timeout of the messages still at the given deliveries (and, with
-- in_flight_only, still invisible); returns those changed.
CREATE FUNCTION conveyor.message_set_vt(queue_name text, ids bigint[], receive_counts integer[], vt integer,
                                        in_flight_only boolean DEFAULT false)
RETURNS SETOF conveyor.messages
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
    ts timestamptz := clock_timestamp();
BEGIN
    IF vt IS NULL OR vt < 0 OR vt > 43200 THEN
        PERFORM conveyor._raise('CVV01', format('vt must be from 0 to 43200 seconds, got %s', vt));
    END IF;
    RETURN QUERY
    UPDATE conveyor.messages m SET vt = ts + make_interval(secs => message_set_vt.vt)
      FROM conveyor._deliveries(ids, receive_counts) d
     WHERE m.queue_id = q.id AND m.id = d.id AND (d.receive_count IS NULL OR m.receive_count = d.receive_count)
       AND (NOT in_flight_only OR (m.receive_count > 0 AND m.vt > ts))
    RETURNING m.*;
END $$;

------------------------------------------------------------------------------------------
-- Stream batches received in pages
------------------------------------------------------------------------------------------

-- stream_receive hands out an open batch a page at a time (max_return events after
-- after_event) and remembers how far the consumer has read; stream_ack refuses a batch
-- that was received only in part, so a consumer that asked for fewer events than the
-- batch holds cannot finish events it never saw. (next_batch + get_batch_events, PgQ's
-- way, always sees whole batches and is not affected.)
ALTER TABLE conveyor.stream_consumers
    ADD COLUMN batch_read_through bigint,  -- the last event id stream_receive handed out
    ADD COLUMN batch_read_all boolean;     -- whether it has handed out the batch's last event

CREATE OR REPLACE FUNCTION conveyor.stream_finish_batch(batch_id bigint) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    UPDATE conveyor.stream_consumers c
       SET last_tick = c.next_tick, next_tick = NULL, batch_id = NULL, batch_started_at = NULL,
           batch_read_through = NULL, batch_read_all = NULL, active_at = now()
     WHERE c.batch_id = stream_finish_batch.batch_id;
    IF NOT FOUND THEN
        PERFORM conveyor._raise('CVS03', format('batch %s does not exist or is finished', batch_id));
    END IF;
    RETURN 1;
END $$;

DROP FUNCTION conveyor.stream_receive(text, text, integer);

-- The consumer's open (or next) batch, max_return events at a time: the first page, or
-- with after_event the events after that id. Empty batches are finished on the way.
CREATE FUNCTION conveyor.stream_receive(stream_name text, consumer_name text, max_return integer DEFAULT 1000,
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
CREATE FUNCTION conveyor.stream_batch_read_all(batch_id bigint) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT c.batch_read_all FROM conveyor.stream_consumers c WHERE c.batch_id = stream_batch_read_all.batch_id
$$;

------------------------------------------------------------------------------------------
-- Roles
------------------------------------------------------------------------------------------

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA conveyor FROM PUBLIC;

DO $$
BEGIN
    GRANT EXECUTE ON FUNCTION
        conveyor.secret_get(text, bytea),
        conveyor.message_delete(text, bigint[], integer[]),
        conveyor.message_archive(text, bigint[], integer[]),
        conveyor.message_fail(text, bigint, text, integer),
        conveyor.message_set_vt(text, bigint[], integer[], integer, boolean),
        conveyor.stream_receive(text, text, integer, bigint),
        conveyor.stream_batch_read_all(bigint)
        TO conveyor_writer;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: roles missing, grants skipped (%)', SQLERRM;
END $$;
