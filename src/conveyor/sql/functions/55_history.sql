-- Dashboard history samples (core/history.py).
--
-- Current definitions, re-applied whenever a file of this folder changes (docs/architecture.md,
-- "Where each SQL function's current definition lives"). Edit a function here; tables, types,
-- indexes, data and DROPs go in a new numbered migration.

-- Removes samples older than `keep`; returns how many.
CREATE OR REPLACE FUNCTION conveyor.history_prune(keep interval) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    n integer;
BEGIN
    IF keep IS NULL OR keep < interval '1 minute' THEN
        PERFORM conveyor._raise('CVV01', 'history retention must be at least one minute');
    END IF;
    DELETE FROM conveyor.history_samples s WHERE s.sampled_at < now() - keep;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- Takes one sample of everything (unless one was taken less than `min_gap` ago, or
-- another process is taking one now) and prunes past `keep`. Returns the rows written.
CREATE OR REPLACE FUNCTION conveyor.history_record(keep interval, min_gap interval DEFAULT interval '0') RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    n integer;
    at timestamptz := now();
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('conveyor.history_record')) THEN
        RETURN 0;
    END IF;
    IF EXISTS (SELECT 1 FROM conveyor.history_samples s
                WHERE s.sampled_at > at - coalesce(min_gap, interval '0') OR s.sampled_at = at) THEN
        RETURN 0;
    END IF;
    INSERT INTO conveyor.history_samples
           (sampled_at, kind, name, depth, in_flight, delayed, oldest_age_sec, total, dead_letters, rate)
    SELECT at, 'queue', m.queue_name, m.queue_length, m.in_flight, m.delayed, m.oldest_msg_age_sec,
           m.total_messages, m.dead_letter_length, NULL
      FROM conveyor.queue_metrics_all() m
    UNION ALL
    SELECT at, 'stream', s.stream, s.depth, 0, s.delayed + s.pending_retries,
           extract(epoch FROM s.oldest_event_age)::integer, s.last_tick_id, s.dead_letters, s.events_per_sec
      FROM conveyor.stream_stats() s
    UNION ALL
    SELECT at, 'consumer', c.stream || '/' || c.consumer, c.pending_events, c.batch_active::integer, 0,
           extract(epoch FROM c.lag)::integer, NULL, 0, NULL
      FROM conveyor.consumer_stats() c
    UNION ALL
    SELECT at, 'pqueue', q.name,
           coalesce((SELECT sum(l.lag) FROM conveyor.consumer_group_lag l WHERE l.queue = q.name), 0),
           coalesce((SELECT sum(l.leases) FROM conveyor.consumer_group_lag l WHERE l.queue = q.name), 0),
           0,
           (SELECT extract(epoch FROM at - min(l.oldest_pending_at))::integer
              FROM conveyor.consumer_group_lag l WHERE l.queue = q.name),
           (SELECT coalesce(sum(p.head), 0) FROM conveyor.partitions p WHERE p.queue_id = q.id),
           (SELECT count(*) FROM conveyor.partition_dead_letters d WHERE d.queue_id = q.id),
           NULL
      FROM conveyor.pqueues q
    UNION ALL
    SELECT at, 'outbox', 'webhooks', d.pending, d.due, 0, extract(epoch FROM d.oldest_pending_age)::integer,
           NULL, d.held + d.exhausted, NULL
      FROM conveyor.deliveries_stats() d;
    GET DIAGNOSTICS n = ROW_COUNT;
    PERFORM conveyor.history_prune(keep);
    RETURN n;
END $$;

-- One thing's samples since `since`, oldest first, with the rates since the sample before
-- (NULL for the first one, and where a counter went back: a queue dropped and created).
CREATE OR REPLACE FUNCTION conveyor.history_series(kind text, name text, since timestamptz)
RETURNS TABLE (sampled_at timestamptz, depth bigint, in_flight bigint, delayed bigint, oldest_age_sec integer,
               dead_letters bigint, sent_per_sec numeric, done_per_sec numeric)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT w.sampled_at, w.depth, w.in_flight, w.delayed, w.oldest_age_sec, w.dead_letters,
           CASE WHEN w.rate IS NOT NULL THEN round(w.rate, 3)
                WHEN w.secs > 0 AND w.sent >= 0 THEN round(w.sent / w.secs, 3) END,
           CASE WHEN w.secs > 0 AND w.sent >= 0 THEN round(greatest(w.sent - w.grew, 0) / w.secs, 3) END
      FROM (SELECT s.*,
                   extract(epoch FROM s.sampled_at - lag(s.sampled_at) OVER o)::numeric AS secs,
                   (s.total - lag(s.total) OVER o)::numeric AS sent,
                   ((s.depth + s.in_flight + s.delayed)
                    - lag(s.depth + s.in_flight + s.delayed) OVER o)::numeric AS grew
              FROM conveyor.history_samples s
             WHERE s.kind = history_series.kind AND s.name = history_series.name
               AND s.sampled_at >= history_series.since - interval '1 minute'
            WINDOW o AS (ORDER BY s.sampled_at)) w
     WHERE w.sampled_at >= history_series.since
     ORDER BY w.sampled_at
$$;

-- The latest rates of every thing of a kind (the dashboard's tables), over the samples
-- of the last `span`: (counter growth) / (time between the first and last sample).
CREATE OR REPLACE FUNCTION conveyor.history_rates(kind text, span interval DEFAULT interval '1 minute')
RETURNS TABLE (name text, sent_per_sec numeric, done_per_sec numeric, sampled_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT e.name,
           CASE WHEN e.rate IS NOT NULL THEN round(e.rate, 3)
                WHEN e.secs > 0 AND e.sent >= 0 THEN round(e.sent / e.secs, 3) END,
           CASE WHEN e.secs > 0 AND e.sent >= 0 THEN round(greatest(e.sent - e.grew, 0) / e.secs, 3) END,
           e.last_at
      FROM (SELECT s.name,
                   (array_agg(s.rate ORDER BY s.sampled_at DESC))[1] AS rate,
                   max(s.sampled_at) AS last_at,
                   extract(epoch FROM max(s.sampled_at) - min(s.sampled_at))::numeric AS secs,
                   ((array_agg(s.total ORDER BY s.sampled_at DESC))[1]
                    - (array_agg(s.total ORDER BY s.sampled_at))[1])::numeric AS sent,
                   ((array_agg(s.depth + s.in_flight + s.delayed ORDER BY s.sampled_at DESC))[1]
                    - (array_agg(s.depth + s.in_flight + s.delayed ORDER BY s.sampled_at))[1])::numeric AS grew
              FROM conveyor.history_samples s
             WHERE s.kind = history_rates.kind
               AND s.sampled_at >= (SELECT max(x.sampled_at) FROM conveyor.history_samples x
                                     WHERE x.kind = history_rates.kind) - span
             GROUP BY s.name) e
     ORDER BY e.name
$$;

-- Every queue's depth, in flight and delayed of the latest sample, if it is younger than
-- max_age (no rows otherwise): the depth scrape's gauges in a worker that also takes the
-- samples, so that one count of every queue serves both (a count reads the whole queue).
CREATE OR REPLACE FUNCTION conveyor.history_latest_queues(max_age interval)
RETURNS TABLE (queue_name text, queue_length bigint, in_flight bigint, delayed bigint, sampled_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT s.name, s.depth, s.in_flight, s.delayed, s.sampled_at
      FROM conveyor.history_samples s
     WHERE s.kind = 'queue'
       AND s.sampled_at = (SELECT max(x.sampled_at) FROM conveyor.history_samples x WHERE x.kind = 'queue')
       AND s.sampled_at > now() - max_age
       -- a queue dropped since (when the last one goes, no later sample says so)
       AND EXISTS (SELECT 1 FROM conveyor.queues q WHERE q.name = s.name)
     ORDER BY s.name
$$;

DO $$
BEGIN  -- a read of the history, as history_series (migration 0012's grants)
    GRANT EXECUTE ON FUNCTION conveyor.history_latest_queues(interval) TO conveyor_reader;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: roles missing, grants skipped (%)', SQLERRM;
END $$;

REVOKE ALL ON ALL ROUTINES IN SCHEMA conveyor FROM PUBLIC;

-- Where a queue message is and has been: the message (queue, id) live or archived, and
-- every copy of it by UUID (dead-lettered, redriven), oldest first. NULL if not found.
CREATE OR REPLACE FUNCTION conveyor.history_message(queue_name text, message_id bigint) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    q conveyor.queues := conveyor._queue(queue_name);
    found_uuid uuid;
    -- the queue, its dead-letter queue and the queues it is the dead-letter queue of: where
    -- a message moves by redrive (a UUID has no index outside the hq dialect, so the
    -- search stays within these queues' rows)
    related bigint[] := ARRAY(SELECT x.id FROM conveyor.queues x
                               WHERE x.id = q.id OR x.id = q.dead_letter_queue_id OR x.dead_letter_queue_id = q.id);
BEGIN
    SELECT m.message_uuid INTO found_uuid FROM conveyor.messages m WHERE m.queue_id = q.id AND m.id = message_id;
    IF found_uuid IS NULL THEN
        SELECT a.message_uuid INTO found_uuid FROM conveyor.archive a WHERE a.queue_id = q.id AND a.id = message_id;
    END IF;
    IF found_uuid IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN jsonb_build_object(
        'message_uuid', found_uuid,
        'queue', q.name,
        'id', message_id,
        'copies', (SELECT coalesce(jsonb_agg(c ORDER BY c->>'sent_at', c->>'queue'), '[]') FROM (
            SELECT jsonb_build_object(
                       'queue', x.name, 'id', m.id,
                       'state', CASE WHEN m.vt <= now() THEN 'visible'
                                     WHEN m.receive_count > 0 THEN 'in_flight' ELSE 'delayed' END,
                       'sent_at', m.sent_at, 'visible_at', m.vt, 'receive_count', m.receive_count,
                       'first_received_at', m.first_received_at, 'archived_at', NULL, 'error', NULL,
                       'dead_lettered_from', (SELECT s.name FROM conveyor.queues s WHERE s.id = m.source_queue_id),
                       'group_id', m.group_id, 'dedup_id', m.dedup_id, 'sender_id', m.sender_id,
                       'headers', m.headers, 'system_attributes', m.system_attributes,
                       'body', left(m.body, 4096)) AS c
              FROM conveyor.messages m JOIN conveyor.queues x ON x.id = m.queue_id
             WHERE m.message_uuid = found_uuid AND x.id = ANY (related)
            UNION ALL
            SELECT jsonb_build_object(
                       'queue', x.name, 'id', a.id, 'state', a.outcome,
                       'sent_at', a.sent_at, 'visible_at', NULL, 'receive_count', a.receive_count,
                       'first_received_at', a.first_received_at, 'archived_at', a.archived_at, 'error', a.error,
                       'dead_lettered_from', (SELECT s.name FROM conveyor.queues s WHERE s.id = a.source_queue_id),
                       'group_id', a.group_id, 'dedup_id', a.dedup_id, 'sender_id', a.sender_id,
                       'headers', a.headers, 'system_attributes', a.system_attributes,
                       'body', left(a.body, 4096))
              FROM conveyor.archive a JOIN conveyor.queues x ON x.id = a.queue_id
             WHERE a.message_uuid = found_uuid AND x.id = ANY (related)) copies(c)));
END $$;

REVOKE ALL ON ALL ROUTINES IN SCHEMA conveyor FROM PUBLIC;
