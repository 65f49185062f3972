-- Re-sealing for key rotation and for queues that turned encryption on
-- (conveyor.core.sealing): rows sealed with another key than the active one, and rows of
-- encrypted queues stored in clear; a page at a time, locked, skipping rows others hold.

-- name: message_seal_pending
SELECT m.queue_id, m.id, m.body, m.content_type
  FROM conveyor.messages m JOIN conveyor.queues q ON q.id = m.queue_id
 WHERE CASE WHEN m.content_type LIKE 'application/vnd.conveyor.sealed;%%'
            THEN substring(m.content_type FROM '^application/vnd\.conveyor\.sealed; kid=([^;]*);') IS DISTINCT FROM %(kid)s::text
            ELSE conveyor._encrypted(q) END
 ORDER BY m.queue_id, m.id
 LIMIT %(limit)s::integer
   FOR UPDATE OF m SKIP LOCKED

-- name: message_seal_update
UPDATE conveyor.messages m SET body = x.body, content_type = x.content_type
  FROM jsonb_to_recordset(%(rows)s::jsonb) AS x(queue_id bigint, id bigint, body text, content_type text)
 WHERE m.queue_id = x.queue_id AND m.id = x.id
RETURNING m.id

-- name: message_seal_archive_pending
SELECT a.queue_id, a.id, a.body, a.content_type
  FROM conveyor.archive a JOIN conveyor.queues q ON q.id = a.queue_id
 WHERE CASE WHEN a.content_type LIKE 'application/vnd.conveyor.sealed;%%'
            THEN substring(a.content_type FROM '^application/vnd\.conveyor\.sealed; kid=([^;]*);') IS DISTINCT FROM %(kid)s::text
            ELSE conveyor._encrypted(q) END
 ORDER BY a.queue_id, a.id
 LIMIT %(limit)s::integer
   FOR UPDATE OF a SKIP LOCKED

-- name: message_seal_archive_update
UPDATE conveyor.archive a SET body = x.body, content_type = x.content_type
  FROM jsonb_to_recordset(%(rows)s::jsonb) AS x(queue_id bigint, id bigint, body text, content_type text)
 WHERE a.queue_id = x.queue_id AND a.id = x.id
RETURNING a.id

-- name: pqueue_seal_pending
SELECT m.partition_id, m.seq, m.payload, m.is_encrypted
  FROM conveyor.partition_messages m
  JOIN conveyor.partitions p ON p.id = m.partition_id
  JOIN conveyor.pqueues q ON q.id = p.queue_id
 WHERE CASE WHEN m.is_encrypted THEN split_part(m.payload #>> ARRAY[]::text[], ':', 1) <> %(kid)s::text
            ELSE q.encryption_enabled END
 ORDER BY m.partition_id, m.seq
 LIMIT %(limit)s::integer
   FOR UPDATE OF m SKIP LOCKED

-- name: pqueue_seal_update
UPDATE conveyor.partition_messages m SET payload = x.payload, is_encrypted = true
  FROM jsonb_to_recordset(%(rows)s::jsonb) AS x(partition_id bigint, seq bigint, payload jsonb)
 WHERE m.partition_id = x.partition_id AND m.seq = x.seq
RETURNING m.seq

-- name: pqueue_seal_dead_letter_pending
SELECT d.id, d.payload, d.is_encrypted
  FROM conveyor.partition_dead_letters d JOIN conveyor.pqueues q ON q.id = d.queue_id
 WHERE CASE WHEN d.is_encrypted THEN split_part(d.payload #>> ARRAY[]::text[], ':', 1) <> %(kid)s::text
            ELSE q.encryption_enabled END
 ORDER BY d.id
 LIMIT %(limit)s::integer
   FOR UPDATE OF d SKIP LOCKED

-- name: pqueue_seal_dead_letter_update
UPDATE conveyor.partition_dead_letters d SET payload = x.payload, is_encrypted = true
  FROM jsonb_to_recordset(%(rows)s::jsonb) AS x(id bigint, payload jsonb)
 WHERE d.id = x.id
RETURNING d.id
