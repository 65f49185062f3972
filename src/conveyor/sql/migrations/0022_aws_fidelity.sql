-- Conveyor 0022: Amazon SQS fidelity, round 3 (issue 27).
--
-- 1. A message's attributes count against the queue's maximum message size as SQS counts
--    them (each name, DataType and value, a binary value by its decoded bytes), not as the
--    JSON text they are stored in: a message of exactly MaximumMessageSize, body and
--    attributes, is accepted, as on SQS. Headers that are not SQS attributes (REST's) count
--    their name and their value's text.
-- 2. A message moved to a dead-letter queue keeps its receive count and first receive time
--    (SQS's ApproximateReceiveCount goes on counting there).
-- 3. A message move task whose destination queue is deleted is FAILED, and stays listed with
--    the destination's name, as SQS lists it; before, the task vanished with the queue.
-- 4. A queue may be its own dead-letter queue, as SQS allows (a RedrivePolicy naming the
--    queue itself): a message over maxReceiveCount goes to the back of the queue with its
--    receive count started again, instead of being refused at SetQueueAttributes.

------------------------------------------------------------------------------------------
-- 1. Message size
------------------------------------------------------------------------------------------

CREATE FUNCTION conveyor._headers_size(headers jsonb) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN headers IS NULL OR headers = '{}'::jsonb THEN 0
        WHEN jsonb_typeof(headers) <> 'object' THEN octet_length(headers::text)
        ELSE (SELECT coalesce(sum(octet_length(h.key) + CASE
                  WHEN jsonb_typeof(h.value) = 'object' AND jsonb_typeof(h.value -> 'DataType') = 'string' THEN
                      octet_length(h.value ->> 'DataType') + CASE
                          -- base64: three bytes per four characters, padding not counted
                          WHEN h.value ? 'BinaryValue' THEN octet_length(rtrim(h.value ->> 'BinaryValue', '=')) * 3 / 4
                          ELSE coalesce(octet_length(h.value ->> 'StringValue'), 0) END
                  ELSE octet_length(h.value #>> '{}') END), 0)
                FROM jsonb_each(headers) h)
    END
$$;

-- 0010's _message_ok; only the size of the headers changes.
CREATE OR REPLACE FUNCTION conveyor._message_ok(q conveyor.queues, body text, headers jsonb, delay integer,
                                                system_attributes jsonb, dedup_id text) RETURNS boolean
LANGUAGE sql AS $$
    SELECT CASE
        WHEN body IS NULL OR octet_length(body) + conveyor._headers_size(headers)
                             > CASE WHEN conveyor._encrypted(q) THEN q.max_message_size / 3 * 4 + 64
                                    ELSE q.max_message_size END
            THEN conveyor._fail('CVM01', format(
                'message must not be null and must be at most %s bytes (body and headers) in queue %s',
                q.max_message_size, quote_literal(q.name)))
        WHEN delay < 0 OR delay > 900
            THEN conveyor._fail('CVV01', 'delay must be from 0 to 900 seconds')
        WHEN jsonb_typeof(headers) <> 'object' OR jsonb_typeof(system_attributes) <> 'object'
            THEN conveyor._fail('CVV01', 'headers and system_attributes must be JSON objects')
        WHEN dedup_id IS NOT NULL
            THEN conveyor._fail('CVV01', 'dedup_id applies to FIFO queues only')
        ELSE true END
$$;

------------------------------------------------------------------------------------------
-- 2. Dead letters keep their receive count
------------------------------------------------------------------------------------------

-- 0001's _dead_letter; the moved message keeps receive_count and first_received_at.
CREATE OR REPLACE FUNCTION conveyor._dead_letter(q conveyor.queues, ids bigint[], reason text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
    dlq conveyor.queues;
BEGIN
    IF q.dead_letter_queue_id IS NOT NULL THEN
        SELECT * INTO dlq FROM conveyor.queues WHERE id = q.dead_letter_queue_id;
    END IF;
    IF dlq.id IS NOT NULL THEN
        IF dlq.fifo THEN
            INSERT INTO conveyor.message_groups AS g (queue_id, group_id)
            SELECT DISTINCT dlq.id, m.group_id FROM conveyor.messages m
             WHERE m.queue_id = q.id AND m.id = ANY (ids) AND m.group_id IS NOT NULL
            ON CONFLICT (queue_id, group_id) DO UPDATE SET group_id = excluded.group_id;
        END IF;
        WITH moved AS (
            DELETE FROM conveyor.messages m
             WHERE m.queue_id = q.id AND m.id = ANY (ids)
            RETURNING m.*
        )
        INSERT INTO conveyor.messages (queue_id, id, vt, sent_at, receive_count, first_received_at, body,
                                       content_type, headers, group_id, dedup_id, source_queue_id, message_uuid,
                                       sender_id, system_attributes)
        -- a queue that is its own dead-letter queue starts the count again (else the
        -- message would be moved on every receive and never delivered)
        SELECT dlq.id, nextval(dlq.seq), now(), moved.sent_at,
               CASE WHEN dlq.id = q.id THEN 0 ELSE moved.receive_count END,
               CASE WHEN dlq.id = q.id THEN NULL ELSE moved.first_received_at END,
               moved.body, moved.content_type, moved.headers, moved.group_id, moved.dedup_id, q.id,
               moved.message_uuid, moved.sender_id, moved.system_attributes
          FROM moved ORDER BY moved.id;
        GET DIAGNOSTICS n = ROW_COUNT;
        PERFORM conveyor._wake(dlq, n);
    ELSE
        WITH moved AS (
            DELETE FROM conveyor.messages m
             WHERE m.queue_id = q.id AND m.id = ANY (ids)
            RETURNING m.*
        )
        INSERT INTO conveyor.archive (queue_id, id, sent_at, receive_count, first_received_at, body,
                                      content_type, headers, group_id, dedup_id, source_queue_id,
                                      message_uuid, sender_id, system_attributes, outcome, error)
        SELECT moved.queue_id, moved.id, moved.sent_at, moved.receive_count, moved.first_received_at,
               moved.body, moved.content_type, moved.headers, moved.group_id, moved.dedup_id,
               moved.source_queue_id, moved.message_uuid, moved.sender_id, moved.system_attributes,
               'failed', reason
          FROM moved;
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN n;
END $$;

------------------------------------------------------------------------------------------
-- 3. A move task outlives its destination queue, as FAILED
------------------------------------------------------------------------------------------

-- the destination's name, kept when the queue is deleted (set by the trigger below)
ALTER TABLE conveyor.move_tasks ADD COLUMN destination_name text;
ALTER TABLE conveyor.move_tasks DROP CONSTRAINT move_tasks_destination_queue_id_fkey;
ALTER TABLE conveyor.move_tasks ADD CONSTRAINT move_tasks_destination_queue_id_fkey
    FOREIGN KEY (destination_queue_id) REFERENCES conveyor.queues (id) ON DELETE SET NULL;

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
CREATE FUNCTION conveyor._move_tasks_destination_gone() RETURNS trigger
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

CREATE TRIGGER queues_move_task_destination BEFORE DELETE ON conveyor.queues
    FOR EACH ROW EXECUTE FUNCTION conveyor._move_tasks_destination_gone();

------------------------------------------------------------------------------------------
-- 4. A queue may be its own dead-letter queue
------------------------------------------------------------------------------------------

-- the table's own check (0001: dead_letter_queue_id IS DISTINCT FROM id), found by what it says
DO $$
DECLARE
    c text;
BEGIN
    FOR c IN SELECT conname FROM pg_constraint
              WHERE conrelid = 'conveyor.queues'::regclass AND contype = 'c'
                AND pg_get_constraintdef(oid) ILIKE '%dead_letter_queue_id IS DISTINCT FROM id%' LOOP
        EXECUTE format('ALTER TABLE conveyor.queues DROP CONSTRAINT %I', c);
    END LOOP;
END $$;

-- 0016's _queue_apply without the check that refused dead_letter_queue = the queue itself.
CREATE OR REPLACE FUNCTION conveyor._queue_apply(q conveyor.queues, attrs jsonb) RETURNS conveyor.queues
LANGUAGE plpgsql AS $$
DECLARE
    key text;
    dlq conveyor.queues;
BEGIN
    IF attrs IS NULL OR jsonb_typeof(attrs) <> 'object' THEN
        PERFORM conveyor._raise('CVV01', 'queue attributes must be a JSON object');
    END IF;
    FOR key IN SELECT jsonb_object_keys(attrs) LOOP
        IF key NOT IN ('visibility_timeout', 'delay_seconds', 'retention_seconds',
                       'max_message_size', 'receive_wait_seconds', 'max_receive_count',
                       'dead_letter_queue', 'content_based_deduplication', 'fifo',
                       'extra_attributes', 'storage', 'partition_interval', 'partition_retention',
                       'partition_premake') THEN
            PERFORM conveyor._raise('CVV01', format('unknown queue attribute %s', quote_literal(left(key, 100))));
        END IF;
    END LOOP;
    IF attrs ? 'fifo' AND conveyor._bool_attr(attrs, 'fifo') IS DISTINCT FROM q.fifo THEN
        PERFORM conveyor._raise('CVV01', 'a queue is FIFO exactly when its name ends in .fifo');
    END IF;
    IF attrs ? 'visibility_timeout' THEN
        q.visibility_timeout := coalesce(conveyor._int_attr(attrs, 'visibility_timeout', 0, 43200), 30);
    END IF;
    IF attrs ? 'delay_seconds' THEN
        q.delay_seconds := coalesce(conveyor._int_attr(attrs, 'delay_seconds', 0, 900), 0);
    END IF;
    IF attrs ? 'retention_seconds' THEN
        q.retention_seconds := coalesce(conveyor._int_attr(attrs, 'retention_seconds', 60, 1209600), 345600);
    END IF;
    IF attrs ? 'max_message_size' THEN
        q.max_message_size := coalesce(conveyor._int_attr(attrs, 'max_message_size', 1024, 1048576), 1048576);
    END IF;
    IF attrs ? 'receive_wait_seconds' THEN
        q.receive_wait_seconds := coalesce(conveyor._int_attr(attrs, 'receive_wait_seconds', 0, 20), 0);
    END IF;
    IF attrs ? 'max_receive_count' THEN
        q.max_receive_count := conveyor._int_attr(attrs, 'max_receive_count', 1, 1000);
    END IF;
    IF attrs ? 'content_based_deduplication' THEN
        q.content_based_deduplication := coalesce(conveyor._bool_attr(attrs, 'content_based_deduplication'), false);
        IF q.content_based_deduplication AND NOT q.fifo THEN
            PERFORM conveyor._raise('CVV01', 'content_based_deduplication applies to FIFO queues only');
        END IF;
    END IF;
    IF attrs ? 'dead_letter_queue' THEN
        IF jsonb_typeof(attrs -> 'dead_letter_queue') = 'null' THEN
            q.dead_letter_queue_id := NULL;
        ELSIF jsonb_typeof(attrs -> 'dead_letter_queue') <> 'string' THEN
            PERFORM conveyor._raise('CVV01', 'dead_letter_queue must be a queue name');
        ELSE
            dlq := conveyor._queue(attrs ->> 'dead_letter_queue');
            IF dlq.fifo <> q.fifo THEN
                PERFORM conveyor._raise('CVV01', 'the dead-letter queue of a FIFO queue must be a FIFO queue, and of a standard queue a standard queue');
            END IF;
            q.dead_letter_queue_id := dlq.id;
        END IF;
    END IF;
    IF attrs ? 'extra_attributes' THEN
        IF jsonb_typeof(attrs -> 'extra_attributes') = 'null' THEN
            q.extra_attributes := '{}';
        ELSIF jsonb_typeof(attrs -> 'extra_attributes') <> 'object' THEN
            PERFORM conveyor._raise('CVV01', 'extra_attributes must be a JSON object');
        ELSE
            -- merged key by key; a JSON null removes a key
            q.extra_attributes := jsonb_strip_nulls(coalesce(q.extra_attributes, '{}') || (attrs -> 'extra_attributes'));
        END IF;
    END IF;
    IF q.dead_letter_queue_id IS NOT NULL AND q.max_receive_count IS NULL THEN
        PERFORM conveyor._raise('CVV01', 'a dead_letter_queue needs max_receive_count');
    END IF;
    RETURN q;
END $$;
