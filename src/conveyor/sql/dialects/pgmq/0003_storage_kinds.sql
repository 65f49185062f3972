-- Conveyor's pgmq dialect, 0003: create_unlogged and create_partitioned make real kinds.
--
-- Conveyor's migration 0016 gave queues storage of their own (conveyor.queue_create's
-- "storage": unlogged, or partitioned by id or time with retention and premake). pgmq's
-- kinds now map onto them instead of being recorded in extra_attributes.pgmq:
--
--   create_unlogged(q)                      storage 'unlogged' (the archive stays logged,
--                                           as pgmq's a_ table does)
--   create_partitioned(q, interval, retention, premake)
--                                           storage 'partitioned': a whole-number interval
--                                           partitions by msg_id, any other by time
--                                           (enqueued_at; archived_at for the archive), as
--                                           pgmq's _get_partition_col decides; partitions
--                                           are made premake ahead and dropped after the
--                                           retention by conveyor.maintenance, as pg_partman
--                                           does for pgmq
--   list_queues()                           is_unlogged / is_partitioned from the storage
--   metrics().default_partition_length      the planner's row estimate of the queue's two
--                                           DEFAULT partitions, as in pgmq
--
-- Queues made by create_unlogged/create_partitioned before this migration keep the shared
-- logged storage they have (a queue's storage is chosen at creation), and so are listed
-- as what they are; their extra_attributes.pgmq record is left as it was.

-- pgmq's create*: the queue, found or made, with its views. `kind` is {"kind": "standard"},
-- {"kind": "unlogged"} or {"kind": "partitioned", "partition_interval", "retention_interval",
-- "premake"}. Every pgmq queue keeps messages for Conveyor's longest retention, 14 days;
-- a partitioned one loses whole partitions before that when its retention says so.
-- (retention_seconds is no longer used, kept for the signature.)
CREATE OR REPLACE FUNCTION pgmq._create(queue_name text, kind jsonb, retention_seconds integer DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    attrs jsonb := jsonb_build_object('retention_seconds', 1209600);
    found text;
BEGIN
    PERFORM pgmq.format_table_name(queue_name, 'q');
    PERFORM pgmq.validate_queue_name(queue_name);
    PERFORM pg_advisory_xact_lock(hashtext('pgmq.queue_' || lower(queue_name)));
    found := pgmq._find(queue_name);
    IF found IS NULL THEN
        IF kind ->> 'kind' = 'unlogged' THEN
            attrs := attrs || '{"storage": "unlogged"}';
        ELSIF kind ->> 'kind' = 'partitioned' THEN
            attrs := attrs || jsonb_build_object('storage', 'partitioned',
                                                 'partition_interval', kind -> 'partition_interval',
                                                 'partition_retention', kind -> 'retention_interval',
                                                 'partition_premake', kind -> 'premake');
        END IF;
        PERFORM conveyor.queue_create(queue_name, attrs);
        found := queue_name;
    END IF;
    PERFORM pgmq._views(found);
END $$;

-- pgmq's checks first, in pgmq's words (premake, an interval that is neither a number nor
-- an interval); then Conveyor's (a time interval of at least a minute, premake up to 100).
CREATE OR REPLACE FUNCTION pgmq.create_partitioned(queue_name text, partition_interval text DEFAULT '10000',
                                                   retention_interval text DEFAULT '100000', premake integer DEFAULT 4)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF premake < 1 THEN
        RAISE EXCEPTION 'premake must be at least 1, got %', premake;
    END IF;
    IF partition_interval IS NULL OR partition_interval !~ '^\s*\d+\s*$' THEN
        PERFORM partition_interval::interval;
    END IF;
    IF retention_interval IS NULL OR retention_interval !~ '^\s*\d+\s*$' THEN
        PERFORM retention_interval::interval;
    END IF;
    PERFORM pgmq._create(queue_name,
        jsonb_build_object('kind', 'partitioned', 'partition_interval', partition_interval,
                           'retention_interval', retention_interval, 'premake', premake));
END $$;

CREATE OR REPLACE FUNCTION pgmq.list_queues() RETURNS SETOF pgmq.queue_record
LANGUAGE sql STABLE AS $$
    SELECT q.name::varchar, q.storage = 'partitioned', q.storage = 'unlogged', q.created_at
      FROM conveyor.queues q
     ORDER BY q.created_at, q.id
$$;

-- pgmq's signal that partition upkeep is failing: rows in the DEFAULT partitions (the
-- planner's estimate, so that a large spill does not slow every scrape); NULL for a queue
-- that is not partitioned.
CREATE FUNCTION pgmq._default_partition_length(q conveyor.queues) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN q.storage = 'partitioned' THEN
               (SELECT coalesce(sum(greatest(c.reltuples, 0)), 0)::bigint FROM pg_catalog.pg_class c
                 WHERE c.oid IN (to_regclass(format('conveyor.%I', 'messages_q' || q.id || '_default')),
                                 to_regclass(format('conveyor.%I', 'archive_q' || q.id || '_default'))))
           END
$$;

CREATE OR REPLACE FUNCTION pgmq.metrics(queue_name text) RETURNS pgmq.metrics_result
LANGUAGE sql STABLE AS $$
    SELECT metrics.queue_name, m.queue_length + m.in_flight + m.delayed, m.newest_msg_age_sec,
           m.oldest_msg_age_sec, m.total_messages, m.scrape_time, m.queue_length,
           pgmq._default_partition_length(q)
      FROM conveyor.queue_metrics(pgmq._queue(metrics.queue_name)) m
      JOIN conveyor.queues q ON q.name = m.queue_name
$$;

CREATE OR REPLACE FUNCTION pgmq.metrics_all() RETURNS SETOF pgmq.metrics_result
LANGUAGE sql STABLE AS $$
    SELECT m.queue_name, m.queue_length + m.in_flight + m.delayed, m.newest_msg_age_sec,
           m.oldest_msg_age_sec, m.total_messages, m.scrape_time, m.queue_length,
           pgmq._default_partition_length(q)
      FROM conveyor.queue_metrics_all() m
      JOIN conveyor.queues q ON q.name = m.queue_name
     ORDER BY q.created_at, q.id
$$;

DROP FUNCTION pgmq._metrics(text, conveyor.queue_metrics, boolean);

REVOKE ALL ON FUNCTION pgmq._default_partition_length(conveyor.queues) FROM PUBLIC;

DO $$
BEGIN
    GRANT EXECUTE ON FUNCTION pgmq._default_partition_length(conveyor.queues) TO conveyor_reader;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: roles missing, grants skipped (%)', SQLERRM;
END $$;

-- pgmq's read plans as the engine's receive does (0002 gave it generic plans only when the
-- engine's functions had them; since migration 0016 conveyor._message_plans switches the
-- engine's reading functions between generic and per-call plans with the storage, and
-- this one with them). pgmq's send keeps generic plans, as the engine's sends do.
DO $$
DECLARE
    mode text := (SELECT substr(c, length('plan_cache_mode=') + 1)
                    FROM pg_proc p, unnest(p.proconfig) c
                   WHERE p.oid = 'conveyor.message_receive(text, integer, integer, integer, integer)'::regprocedure
                     AND c LIKE 'plan_cache_mode=%');
BEGIN
    IF mode IS NOT NULL THEN
        EXECUTE format('ALTER FUNCTION pgmq._read(text, integer, integer, integer, integer, jsonb) SET plan_cache_mode = %s',
                       mode);
    END IF;
END $$;
