-- Queries over the partitioned queues of migration 0009.

-- name: pqueue_configure
SELECT id, name, namespace, task, lease_time, retry_limit, priority, delayed_processing, window_buffer,
       max_wait_time_seconds, retention_seconds, completed_retention_seconds, encryption_enabled,
       dlq_after_max_retries, options, created_at, updated_at
  FROM conveyor.pqueue_configure(%(name)s::text, %(options)s::jsonb, %(namespace)s::text, %(task)s::text)

-- name: pqueue_get
SELECT id, name, namespace, task, lease_time, retry_limit, priority, delayed_processing, window_buffer,
       max_wait_time_seconds, retention_seconds, completed_retention_seconds, encryption_enabled,
       dlq_after_max_retries, options, created_at, updated_at
  FROM conveyor.pqueues WHERE name = %(name)s::text

-- name: pqueue_get_many
SELECT id, name, namespace, task, lease_time, retry_limit, priority, delayed_processing, window_buffer,
       max_wait_time_seconds, retention_seconds, completed_retention_seconds, encryption_enabled,
       dlq_after_max_retries, options, created_at, updated_at
  FROM conveyor.pqueues WHERE name = ANY (%(names)s::text[])

-- name: pqueue_list
SELECT id, name, namespace, task, lease_time, retry_limit, priority, delayed_processing, window_buffer,
       max_wait_time_seconds, retention_seconds, completed_retention_seconds, encryption_enabled,
       dlq_after_max_retries, options, created_at, updated_at
  FROM conveyor.pqueues ORDER BY name

-- name: pqueue_drop
SELECT conveyor.pqueue_drop(%(name)s::text)

-- name: pqueue_listen
SELECT conveyor.pqueue_listen(%(name)s::text, %(seconds)s::integer)

-- name: pqueue_push
SELECT conveyor.pqueue_push(%(items)s::jsonb)

-- name: pqueue_pop
SELECT conveyor.pqueue_pop(%(request)s::jsonb)

-- name: pqueue_pop_many
SELECT conveyor.pqueue_pop_many(%(requests)s::jsonb, %(lazy)s::boolean)

-- name: pqueue_ack
SELECT conveyor.pqueue_ack(%(acks)s::jsonb, %(strict)s::boolean)

-- name: pqueue_renew
SELECT conveyor.pqueue_renew(%(leases)s::jsonb)

-- name: pqueue_transaction
SELECT conveyor.pqueue_transaction(%(operations)s::jsonb, %(required_leases)s::jsonb)

-- name: pqueue_create_missing
SELECT conveyor.pqueue_create_missing(%(names)s::text[], %(max_new)s::integer, %(max_total)s::integer)

-- name: pqueue_subscribe
SELECT queue_id, name, mode, start_at, created_at FROM conveyor.pqueue_subscribe(%(queue)s::text, %(group)s::text, %(mode)s::text, %(start_at)s::timestamptz)

-- name: pqueue_seek
SELECT conveyor.pqueue_seek(%(queue)s::text, %(group)s::text, %(at)s::timestamptz)

-- name: pqueue_group_delete
SELECT conveyor.pqueue_group_delete(%(group)s::text, %(queue)s::text)

-- name: pqueue_group_lag
SELECT * FROM conveyor.consumer_group_lag
 WHERE (%(queue)s::text IS NULL OR queue = %(queue)s::text)
   AND (%(group)s::text IS NULL OR consumer_group = %(group)s::text)
 ORDER BY queue, consumer_group

-- name: pqueue_dead_letter_retry
SELECT conveyor.pqueue_dead_letter_retry(%(ids)s::bigint[])

-- name: pqueue_maintain
SELECT conveyor.pqueue_maintain()

-- name: pqueue_clear
SELECT conveyor.pqueue_clear(%(queue)s::text, %(partition)s::text)

-- name: pqueue_trace
SELECT conveyor.pqueue_trace(%(data)s::jsonb)

-- name: pqueue_message_delete
SELECT conveyor.pqueue_message_delete(%(partition_id)s::uuid, %(transaction_id)s::text)

-- name: pqueue_message_dead_letter
SELECT conveyor.pqueue_message_dead_letter(%(partition_id)s::uuid, %(transaction_id)s::text, %(group)s::text,
                                           %(error)s::text)

-- Reads for the Queen admin API and the dashboard: one JSON document each.

-- name: pqueue_message_get
SELECT jsonb_build_object(
           'id', m.id, 'transactionId', m.transaction_id, 'partitionId', p.uuid, 'queue', q.name,
           'partition', p.name, 'queuePath', q.name || '/' || p.name, 'namespace', q.namespace, 'task', q.task,
           'payload', m.payload, 'isEncrypted', m.is_encrypted, 'traceId', m.trace_id, 'producerSub', m.producer_sub,
           'createdAt', to_char(m.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'), 'seq', m.seq,
           'status', CASE WHEN EXISTS (SELECT 1 FROM conveyor.partition_dead_letters d
                                        WHERE d.partition_id = m.partition_id AND d.seq = m.seq) THEN 'dead_letter'
                          WHEN EXISTS (SELECT 1 FROM conveyor.partition_cursors x
                                        WHERE x.partition_id = m.partition_id AND x.lease_id IS NOT NULL
                                          AND x.lease_expires_at > now() AND m.seq > x.cursor
                                          AND m.seq <= x.leased_through AND m.seq <> ALL (x.done)) THEN 'processing'
                          WHEN NOT EXISTS (SELECT 1 FROM conveyor.partition_cursors x WHERE x.partition_id = m.partition_id)
                            THEN 'pending'
                          WHEN NOT EXISTS (SELECT 1 FROM conveyor.partition_cursors x
                                            WHERE x.partition_id = m.partition_id AND x.cursor < m.seq
                                              AND m.seq <> ALL (x.done)) THEN 'completed'
                          ELSE 'pending' END,
           'errorMessage', (SELECT d.error FROM conveyor.partition_dead_letters d
                             WHERE d.partition_id = m.partition_id AND d.seq = m.seq ORDER BY d.id DESC LIMIT 1),
           'retryCount', coalesce((SELECT max(r.failures) FROM conveyor.partition_retries r
                                    WHERE r.partition_id = m.partition_id AND r.seq = m.seq), 0),
           'queueConfig', jsonb_build_object('leaseTime', q.lease_time, 'retryLimit', q.retry_limit,
                                             'priority', q.priority),
           'consumerGroups', coalesce((SELECT jsonb_agg(jsonb_build_object(
                   'name', x.consumer_group, 'consumed', x.cursor >= m.seq OR m.seq = ANY (x.done),
                   'leaseExpiresAt', x.lease_expires_at) ORDER BY x.consumer_group)
               FROM conveyor.partition_cursors x WHERE x.partition_id = m.partition_id), '[]'))
  FROM conveyor.partition_messages m
  JOIN conveyor.partitions p ON p.id = m.partition_id
  JOIN conveyor.pqueues q ON q.id = p.queue_id
 WHERE p.uuid = %(partition_id)s::uuid AND m.transaction_id = %(transaction_id)s::text

-- name: pqueue_message_list
SELECT jsonb_build_object(
           'messages', coalesce(jsonb_agg(jsonb_build_object(
               'id', r.id, 'transactionId', r.transaction_id, 'partitionId', r.uuid, 'queue', r.queue,
               'partition', r.partition, 'queuePath', r.queue || '/' || r.partition, 'traceId', r.trace_id,
               'producerSub', r.producer_sub, 'seq', r.seq,
               'createdAt', to_char(r.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'))
               ORDER BY r.created_at DESC, r.seq DESC), '[]'),
           'pagination', jsonb_build_object('limit', %(limit)s::integer, 'offset', %(offset)s::integer))
  FROM (SELECT m.*, p.uuid, p.name AS partition, q.name AS queue
          FROM conveyor.partition_messages m
          JOIN conveyor.partitions p ON p.id = m.partition_id
          JOIN conveyor.pqueues q ON q.id = p.queue_id
         WHERE (%(queue)s::text IS NULL OR q.name = %(queue)s::text)
           AND (%(partition)s::text IS NULL OR p.name = %(partition)s::text)
         ORDER BY m.created_at DESC, m.seq DESC
         LIMIT %(limit)s::integer OFFSET %(offset)s::integer) r

-- name: pqueue_dead_letter_list
SELECT jsonb_build_object(
           'messages', coalesce((SELECT jsonb_agg(x.doc ORDER BY x.failed_at DESC, x.id DESC) FROM (
               SELECT d.id, d.failed_at, jsonb_build_object(
                   'id', d.message_id, 'dlqId', d.id, 'transactionId', d.transaction_id, 'partitionId', p.uuid,
                   'queue', q.name, 'partition', p.name, 'consumerGroup', nullif(d.consumer_group, '__QUEUE_MODE__'),
                   'errorMessage', d.error, 'retryCount', d.failures, 'data', d.payload, 'encrypted', d.is_encrypted,
                   'producerSub', d.producer_sub, 'traceId', d.trace_id,
                   'createdAt', to_char(d.message_created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
                   'failedAt', to_char(d.failed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')) AS doc
                 FROM conveyor.partition_dead_letters d
                 JOIN conveyor.partitions p ON p.id = d.partition_id
                 JOIN conveyor.pqueues q ON q.id = d.queue_id
                WHERE (%(queue)s::text IS NULL OR q.name = %(queue)s::text)
                  AND (%(group)s::text IS NULL OR d.consumer_group = %(group)s::text)
                  AND (%(from)s::timestamptz IS NULL OR d.failed_at >= %(from)s::timestamptz)
                  AND (%(to)s::timestamptz IS NULL OR d.failed_at < %(to)s::timestamptz)
                ORDER BY d.failed_at DESC, d.id DESC
                LIMIT %(limit)s::integer OFFSET %(offset)s::integer) x), '[]'),
           'total', (SELECT count(*) FROM conveyor.partition_dead_letters d JOIN conveyor.pqueues q ON q.id = d.queue_id
                      WHERE (%(queue)s::text IS NULL OR q.name = %(queue)s::text)
                        AND (%(group)s::text IS NULL OR d.consumer_group = %(group)s::text)
                        AND (%(from)s::timestamptz IS NULL OR d.failed_at >= %(from)s::timestamptz)
                        AND (%(to)s::timestamptz IS NULL OR d.failed_at < %(to)s::timestamptz)),
           'pagination', jsonb_build_object('limit', %(limit)s::integer, 'offset', %(offset)s::integer))

-- name: pqueue_dead_letter_ids
SELECT d.id FROM conveyor.partition_dead_letters d JOIN conveyor.partitions p ON p.id = d.partition_id
 WHERE p.uuid = %(partition_id)s::uuid AND d.transaction_id = %(transaction_id)s::text

-- name: pqueue_trace_list
SELECT jsonb_build_object('traces', coalesce(jsonb_agg(jsonb_build_object(
           'id', t.id, 'transactionId', t.transaction_id, 'partitionId', p.uuid, 'messageId', t.message_id,
           'consumerGroup', t.consumer_group, 'eventType', t.event_type, 'traceNames', t.trace_names, 'data', t.data,
           'workerId', t.worker_id, 'queue', q.name, 'partition', p.name,
           'createdAt', to_char(t.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'))
           ORDER BY t.created_at, t.id), '[]'))
  FROM conveyor.message_traces t
  JOIN conveyor.partitions p ON p.id = t.partition_id
  JOIN conveyor.pqueues q ON q.id = p.queue_id
 WHERE p.uuid = %(partition_id)s::uuid AND t.transaction_id = %(transaction_id)s::text

-- name: pqueue_trace_by_name
SELECT jsonb_build_object(
           'traces', coalesce((SELECT jsonb_agg(x.doc ORDER BY x.created_at, x.id) FROM (
               SELECT t.id, t.created_at, jsonb_build_object(
                   'id', t.id, 'transactionId', t.transaction_id, 'partitionId', p.uuid, 'messageId', t.message_id,
                   'consumerGroup', t.consumer_group, 'eventType', t.event_type, 'traceNames', t.trace_names,
                   'data', t.data, 'queue', q.name, 'partition', p.name,
                   'createdAt', to_char(t.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')) AS doc
                 FROM conveyor.message_traces t
                 JOIN conveyor.partitions p ON p.id = t.partition_id
                 JOIN conveyor.pqueues q ON q.id = p.queue_id
                WHERE t.trace_names @> ARRAY[%(name)s::text]
                ORDER BY t.created_at, t.id LIMIT %(limit)s::integer OFFSET %(offset)s::integer) x), '[]'),
           'total', (SELECT count(*) FROM conveyor.message_traces t WHERE t.trace_names @> ARRAY[%(name)s::text]),
           'pagination', jsonb_build_object('limit', %(limit)s::integer, 'offset', %(offset)s::integer))

-- name: pqueue_trace_names
SELECT jsonb_build_object(
           'names', coalesce((SELECT jsonb_agg(jsonb_build_object('name', n.name, 'count', n.count,
                                                                  'lastSeen', n.last_seen) ORDER BY n.last_seen DESC)
                               FROM (SELECT u.name, count(*) AS count, max(t.created_at) AS last_seen
                                       FROM conveyor.message_traces t, unnest(t.trace_names) AS u(name)
                                      GROUP BY u.name ORDER BY max(t.created_at) DESC
                                      LIMIT %(limit)s::integer OFFSET %(offset)s::integer) n), '[]'),
           'total', (SELECT count(DISTINCT u.name) FROM conveyor.message_traces t, unnest(t.trace_names) AS u(name)),
           'pagination', jsonb_build_object('limit', %(limit)s::integer, 'offset', %(offset)s::integer))

-- name: pqueue_queue_summaries
SELECT coalesce(jsonb_agg(jsonb_build_object(
           'id', q.id, 'name', q.name, 'namespace', q.namespace, 'task', q.task, 'priority', q.priority,
           'partitions', (SELECT count(*) FROM conveyor.partitions p WHERE p.queue_id = q.id),
           'messages', jsonb_build_object(
               'total', (SELECT count(*) FROM conveyor.partition_messages m JOIN conveyor.partitions p
                                                ON p.id = m.partition_id WHERE p.queue_id = q.id),
               'pending', coalesce((SELECT sum(greatest(p.head - coalesce(x.cursor, 0), 0)
                                               - coalesce(cardinality(x.done), 0))
                                      FROM conveyor.partitions p
                                      LEFT JOIN conveyor.partition_cursors x
                                        ON x.partition_id = p.id AND x.consumer_group = '__QUEUE_MODE__'
                                     WHERE p.queue_id = q.id), 0),
               'processing', coalesce((SELECT sum(x.leased_through - x.cursor - cardinality(x.done))
                                         FROM conveyor.partition_cursors x
                                        WHERE x.queue_id = q.id AND x.lease_id IS NOT NULL
                                          AND x.lease_expires_at > now()), 0),
               'deadLetter', (SELECT count(*) FROM conveyor.partition_dead_letters d WHERE d.queue_id = q.id)),
           'consumerGroups', (SELECT count(*) FROM conveyor.consumer_groups g WHERE g.queue_id = q.id),
           'config', jsonb_build_object('leaseTime', q.lease_time, 'retryLimit', q.retry_limit, 'priority', q.priority,
                                        'delayedProcessing', q.delayed_processing, 'windowBuffer', q.window_buffer,
                                        'maxWaitTimeSeconds', q.max_wait_time_seconds,
                                        'retentionSeconds', q.retention_seconds,
                                        'completedRetentionSeconds', q.completed_retention_seconds,
                                        'encryptionEnabled', q.encryption_enabled,
                                        'dlqAfterMaxRetries', q.dlq_after_max_retries) || q.options,
           'createdAt', to_char(q.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
           'updatedAt', to_char(q.updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'))
           ORDER BY q.priority DESC, q.name), '[]')
  FROM conveyor.pqueues q
 WHERE (%(name)s::text IS NULL OR q.name = %(name)s::text)
   AND (%(namespace)s::text IS NULL OR q.namespace = %(namespace)s::text)
   AND (%(task)s::text IS NULL OR q.task = %(task)s::text)

-- name: pqueue_partition_list
SELECT coalesce(jsonb_agg(jsonb_build_object(
           'id', p.uuid, 'name', p.name, 'queue', q.name, 'head', p.head,
           'messages', (SELECT count(*) FROM conveyor.partition_messages m WHERE m.partition_id = p.id),
           'lastMessageAt', to_char(p.head_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
           'consumers', coalesce((SELECT jsonb_agg(jsonb_build_object(
                   'consumerGroup', x.consumer_group, 'cursor', x.cursor,
                   'pending', greatest(p.head - x.cursor, 0) - cardinality(x.done),
                   'leaseActive', x.lease_id IS NOT NULL AND x.lease_expires_at > now(),
                   'lastConsumedAt', x.last_consumed_at) ORDER BY x.consumer_group)
               FROM conveyor.partition_cursors x WHERE x.partition_id = p.id), '[]'),
           'createdAt', to_char(p.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'))
           ORDER BY q.name, p.name), '[]')
  FROM (SELECT p.* FROM conveyor.partitions p JOIN conveyor.pqueues q ON q.id = p.queue_id
         WHERE (%(queue)s::text IS NULL OR q.name = %(queue)s::text)
         ORDER BY q.name, p.name LIMIT %(limit)s::integer OFFSET %(offset)s::integer) p
  JOIN conveyor.pqueues q ON q.id = p.queue_id

-- name: pqueue_depth
SELECT jsonb_build_object(
           'queue', q.name, 'group', %(group)s::text,
           'pending', coalesce(sum(d.pending), 0), 'partitionsPending', count(*) FILTER (WHERE d.pending > 0),
           'conflation', false, 'effectivePending', coalesce(sum(d.pending), 0),
           'partitions', coalesce(jsonb_agg(jsonb_build_object('partition', d.name, 'pending', d.pending)
                                            ORDER BY d.name) FILTER (WHERE d.pending > 0), '[]'))
  FROM conveyor.pqueues q
  LEFT JOIN LATERAL (
      SELECT p.name, greatest(p.head - coalesce(x.cursor, 0), 0) - coalesce(cardinality(x.done), 0) AS pending
        FROM conveyor.partitions p
        LEFT JOIN conveyor.partition_cursors x
          ON x.partition_id = p.id AND x.consumer_group = coalesce(%(group)s::text, '__QUEUE_MODE__')
       WHERE p.queue_id = q.id) d ON true
 WHERE q.name = %(queue)s::text
 GROUP BY q.name

-- name: pqueue_overview
SELECT jsonb_build_object(
           'queues', (SELECT count(*) FROM conveyor.pqueues),
           'partitions', (SELECT count(*) FROM conveyor.partitions),
           'namespaces', (SELECT count(DISTINCT namespace) FROM conveyor.pqueues WHERE namespace IS NOT NULL),
           'tasks', (SELECT count(DISTINCT task) FROM conveyor.pqueues WHERE task IS NOT NULL),
           'messages', jsonb_build_object(
               'total', (SELECT count(*) FROM conveyor.partition_messages),
               'deadLetter', (SELECT count(*) FROM conveyor.partition_dead_letters)),
           'consumerGroups', (SELECT count(*) FROM conveyor.consumer_groups WHERE name <> '__QUEUE_MODE__'),
           'leasesActive', (SELECT count(*) FROM conveyor.partition_cursors
                             WHERE lease_id IS NOT NULL AND lease_expires_at > now()),
           'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'))

-- name: pqueue_namespaces
SELECT coalesce(jsonb_agg(jsonb_build_object('namespace', n.namespace, 'queues', n.queues, 'partitions', n.partitions)
                          ORDER BY n.namespace), '[]')
  FROM (SELECT q.namespace, count(DISTINCT q.id) AS queues, count(p.id) AS partitions
          FROM conveyor.pqueues q LEFT JOIN conveyor.partitions p ON p.queue_id = q.id
         WHERE q.namespace IS NOT NULL GROUP BY q.namespace) n

-- name: pqueue_tasks
SELECT coalesce(jsonb_agg(jsonb_build_object('task', n.task, 'queues', n.queues, 'partitions', n.partitions)
                          ORDER BY n.task), '[]')
  FROM (SELECT q.task, count(DISTINCT q.id) AS queues, count(p.id) AS partitions
          FROM conveyor.pqueues q LEFT JOIN conveyor.partitions p ON p.queue_id = q.id
         WHERE q.task IS NOT NULL GROUP BY q.task) n

-- name: pqueue_throughput
SELECT coalesce(jsonb_agg(jsonb_build_object(
           'timestamp', to_char(b.minute AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
           'pushed', b.pushed, 'deadLettered', b.dead) ORDER BY b.minute), '[]')
  FROM (SELECT m.minute, sum(m.pushed) AS pushed, sum(m.dead) AS dead FROM (
            SELECT date_trunc('minute', x.created_at) AS minute, count(*) AS pushed, 0 AS dead
              FROM conveyor.partition_messages x JOIN conveyor.partitions p ON p.id = x.partition_id
              JOIN conveyor.pqueues q ON q.id = p.queue_id
             WHERE x.created_at >= %(from)s::timestamptz AND x.created_at < %(to)s::timestamptz
               AND (%(queue)s::text IS NULL OR q.name = %(queue)s::text)
             GROUP BY 1
            UNION ALL
            SELECT date_trunc('minute', d.failed_at), 0, count(*)
              FROM conveyor.partition_dead_letters d JOIN conveyor.pqueues q ON q.id = d.queue_id
             WHERE d.failed_at >= %(from)s::timestamptz AND d.failed_at < %(to)s::timestamptz
               AND (%(queue)s::text IS NULL OR q.name = %(queue)s::text)
             GROUP BY 1) m GROUP BY m.minute) b

-- name: pqueue_lagging
SELECT coalesce(jsonb_agg(jsonb_build_object(
           'consumerGroup', l.consumer_group, 'queue', l.queue, 'lag', l.lag,
           'partitionsBehind', l.partitions_behind,
           'oldestPendingAt', l.oldest_pending_at,
           'lagSeconds', floor(extract(epoch FROM now() - l.oldest_pending_at)))
           ORDER BY l.oldest_pending_at), '[]')
  FROM conveyor.consumer_group_lag l
 WHERE l.oldest_pending_at IS NOT NULL
   AND l.oldest_pending_at <= now() - make_interval(secs => %(min_lag_seconds)s::integer)

-- name: pqueue_postgres_stats
SELECT jsonb_build_object(
           'database', current_database(), 'version', current_setting('server_version'),
           'connections', (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()),
           'sizeBytes', pg_database_size(current_database()),
           'transactions', jsonb_build_object('committed', d.xact_commit, 'rolledBack', d.xact_rollback),
           'tuples', jsonb_build_object('inserted', d.tup_inserted, 'updated', d.tup_updated,
                                        'deleted', d.tup_deleted),
           'cacheHitRatio', round(d.blks_hit::numeric / nullif(d.blks_hit + d.blks_read, 0), 4),
           'tables', (SELECT jsonb_object_agg(s.relname, jsonb_build_object(
                                 'liveTuples', s.n_live_tup, 'deadTuples', s.n_dead_tup,
                                 'sizeBytes', pg_total_relation_size(s.relid)))
                        FROM pg_stat_user_tables s
                       WHERE s.schemaname = 'conveyor'
                         AND s.relname IN ('partitions', 'partition_messages', 'partition_cursors',
                                           'partition_dead_letters', 'message_traces')))
  FROM pg_stat_database d WHERE d.datname = current_database()
