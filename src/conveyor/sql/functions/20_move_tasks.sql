-- Move tasks (core/move_tasks.py): redriving a dead-letter queue's messages.
--
-- Current definitions, re-applied whenever a file of this folder changes (docs/architecture.md,
-- "Where each SQL function's current definition lives"). Edit a function here; tables, types,
-- indexes, data and DROPs go in a new numbered migration.

-- Starts moving the messages of a dead-letter queue back: to `destination`, or each to
-- the queue it was dead-lettered from. At most one task runs per source queue.
CREATE OR REPLACE FUNCTION conveyor.move_task_start(source text, destination text DEFAULT NULL,
                                         max_per_second integer DEFAULT NULL)
RETURNS SETOF conveyor.move_task_info
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.queues := conveyor._queue(source);
    d conveyor.queues;
    new_handle uuid;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM conveyor.queues q WHERE q.dead_letter_queue_id = s.id) THEN
        PERFORM conveyor._raise('CVV01', format('queue %s is not the dead-letter queue of any queue',
                                                quote_literal(source)));
    END IF;
    IF destination IS NOT NULL THEN
        d := conveyor._queue(destination);
        IF d.id = s.id THEN
            PERFORM conveyor._raise('CVV01', 'the destination of a move task cannot be its source');
        END IF;
    END IF;
    IF max_per_second IS NOT NULL AND (max_per_second < 1 OR max_per_second > 500) THEN
        PERFORM conveyor._raise('CVV01', format('max_per_second must be from 1 to 500, got %s', max_per_second));
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('conveyor.move_task:' || s.id));
    IF EXISTS (SELECT 1 FROM conveyor.move_tasks t WHERE t.source_queue_id = s.id AND t.status = 'RUNNING') THEN
        PERFORM conveyor._raise('CVV01', format('a message move task is already running on queue %s',
                                                quote_literal(source)));
    END IF;
    INSERT INTO conveyor.move_tasks (source_queue_id, destination_queue_id, max_per_second, to_move)
    VALUES (s.id, d.id, max_per_second, (SELECT count(*) FROM conveyor.messages m WHERE m.queue_id = s.id))
    RETURNING move_tasks.handle INTO new_handle;
    RETURN QUERY SELECT * FROM conveyor.move_task_info i WHERE i.handle = new_handle;
END $$;

CREATE OR REPLACE FUNCTION conveyor.move_task_cancel(handle uuid) RETURNS SETOF conveyor.move_task_info
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    t conveyor.move_tasks;
BEGIN
    SELECT * INTO t FROM conveyor.move_tasks m WHERE m.handle = move_task_cancel.handle FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM conveyor._raise('CVT01', format('message move task %s does not exist', handle));
    END IF;
    IF t.status <> 'RUNNING' THEN
        PERFORM conveyor._raise('CVV01', format('message move task %s is not running (%s)', handle, t.status));
    END IF;
    UPDATE conveyor.move_tasks m SET status = 'CANCELLED', updated_at = now() WHERE m.handle = t.handle;
    RETURN QUERY SELECT * FROM conveyor.move_task_info i WHERE i.handle = t.handle;
END $$;

CREATE OR REPLACE FUNCTION conveyor.move_task_list(source text, max_results integer DEFAULT 1)
RETURNS SETOF conveyor.move_task_info
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.queues := conveyor._queue(source);
BEGIN
    RETURN QUERY SELECT i.* FROM conveyor.move_task_info i
                  JOIN conveyor.move_tasks t ON t.handle = i.handle
                 WHERE t.source_queue_id = s.id
                 ORDER BY t.started_at DESC
                 LIMIT least(greatest(coalesce(max_results, 1), 1), 10);
END $$;

-- One round of work on every running task: moves up to its per-second budget (or
-- `max_rows`) of visible messages. Safe to call from several processes at once. Returns
-- how many messages moved in all.
CREATE OR REPLACE FUNCTION conveyor.move_task_step(max_rows integer DEFAULT 1000) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    t conveyor.move_tasks;
    n bigint;
    total bigint := 0;
    orphans bigint;
    movable boolean;
BEGIN
    FOR t IN SELECT * FROM conveyor.move_tasks m WHERE m.status = 'RUNNING' FOR UPDATE SKIP LOCKED LOOP
        WITH picked AS (
            SELECT m.queue_id, m.id FROM conveyor.messages m
             WHERE m.queue_id = t.source_queue_id AND m.vt <= now()
               AND EXISTS (SELECT 1 FROM conveyor.queues q
                            WHERE q.id = coalesce(t.destination_queue_id, m.source_queue_id))
             ORDER BY m.id
             LIMIT least(coalesce(t.max_per_second, max_rows), max_rows)
             FOR UPDATE SKIP LOCKED
        ), moved AS (
            DELETE FROM conveyor.messages m USING picked
             WHERE m.queue_id = picked.queue_id AND m.id = picked.id
            RETURNING m.*
        ), target AS (
            SELECT moved.*, q AS dest
              FROM moved
              JOIN conveyor.queues q ON q.id = coalesce(t.destination_queue_id, moved.source_queue_id)
        ), groups AS (
            INSERT INTO conveyor.message_groups AS g (queue_id, group_id)
            SELECT DISTINCT (target.dest).id, target.group_id FROM target
             WHERE (target.dest).fifo AND target.group_id IS NOT NULL
            ON CONFLICT (queue_id, group_id) DO UPDATE SET group_id = excluded.group_id
        )
        INSERT INTO conveyor.messages (queue_id, id, vt, sent_at, body, content_type, headers, group_id,
                                       dedup_id, message_uuid, sender_id, system_attributes)
        SELECT (target.dest).id, nextval((target.dest).seq), now(), now(), target.body, target.content_type,
               target.headers, target.group_id, target.dedup_id, target.message_uuid, target.sender_id,
               target.system_attributes
          FROM target ORDER BY target.id;
        GET DIAGNOSTICS n = ROW_COUNT;
        total := total + n;
        -- one message left to move keeps the task running: found, not counted (a count
        -- read the whole dead-letter queue every second of a task over a large one)
        PERFORM FROM conveyor.messages m
           JOIN conveyor.queues q ON q.id = coalesce(t.destination_queue_id, m.source_queue_id)
          WHERE m.queue_id = t.source_queue_id
          ORDER BY m.vt, m.id LIMIT 1;  -- in the index's order: read from the start, not scanned
        movable := FOUND;
        orphans := 0;
        IF NOT movable THEN  -- the task ends: what is left has no queue to go back to
            SELECT count(*) INTO orphans FROM conveyor.messages m WHERE m.queue_id = t.source_queue_id;
        END IF;
        UPDATE conveyor.move_tasks m
           SET moved = m.moved + n,
               updated_at = now(),
               status = CASE WHEN movable THEN 'RUNNING'
                             WHEN orphans > 0 THEN 'FAILED'
                             ELSE 'COMPLETED' END,
               failure_reason = CASE WHEN NOT movable AND orphans > 0 THEN format(
                   '%s messages have no queue to go back to (sent to the dead-letter queue directly, or their queue was deleted)',
                   orphans) END
         WHERE m.handle = t.handle;
    END LOOP;
    RETURN total;
END $$;

-- generic plans, as the queue functions' (migration 0014), and no bitmap scans: planned
-- with each call's values, a dead-letter queue the statistics have not seen is expected
-- to hold a few rows, and a bitmap scan of all of it (sorted, or to find one row) looks as
-- cheap as the index read in order, which stops at the rows it needs
ALTER FUNCTION conveyor.move_task_step(integer) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION conveyor.move_task_step(integer) SET enable_bitmapscan = off;

CREATE OR REPLACE VIEW conveyor.move_task_info AS
SELECT t.handle,
       s.name AS source_queue,
       coalesce(d.name, t.destination_name) AS destination_queue,
       t.max_per_second,
       t.status,
       t.moved,
       t.to_move,
       t.failure_reason,
       t.started_at
  FROM conveyor.move_tasks t
  JOIN conveyor.queues s ON s.id = t.source_queue_id
  LEFT JOIN conveyor.queues d ON d.id = t.destination_queue_id;

-- Before a queue goes: the running tasks moving into it fail (the rest of their messages
-- stay in the dead-letter queue), and every task into it keeps its name.
CREATE OR REPLACE FUNCTION conveyor._move_tasks_destination_gone() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE conveyor.move_tasks t
       SET destination_name = OLD.name,
           status = CASE WHEN t.status = 'RUNNING' THEN 'FAILED' ELSE t.status END,
           failure_reason = CASE WHEN t.status = 'RUNNING'
                                 THEN format('the destination queue %s was deleted', quote_literal(OLD.name))
                                 ELSE t.failure_reason END,
           updated_at = now()
     WHERE t.destination_queue_id = OLD.id;
    RETURN OLD;
END $$;

CREATE OR REPLACE TRIGGER queues_move_task_destination BEFORE DELETE ON conveyor.queues
    FOR EACH ROW EXECUTE FUNCTION conveyor._move_tasks_destination_gone();

REVOKE ALL ON ALL ROUTINES IN SCHEMA conveyor FROM PUBLIC;
