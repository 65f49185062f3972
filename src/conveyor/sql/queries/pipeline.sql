-- Queries of the Spark data pipeline (migration 0006, docs/pipeline.md). Reads of queues,
-- archives and dead letters select from tables conveyor_reader may read; every range is
-- [min_id, max_id) with NULL meaning open, so Spark partitions cover all rows whatever
-- the split. Each read returns the columns of its Spark schema (conveyor.spark.schemas)
-- after the leading name column, which the reader adds.

-- name: pipeline_messages_bounds
SELECT min(m.id), max(m.id), count(*)
  FROM conveyor.queues q
  JOIN conveyor.messages m ON m.queue_id = q.id
 WHERE q.name = %(queue)s::text
   AND (%(source)s::text IS NULL OR m.source_queue_id = (SELECT s.id FROM conveyor.queues s WHERE s.name = %(source)s::text))

-- name: pipeline_messages_range
SELECT m.id, m.message_uuid::text, m.sent_at, m.vt, m.receive_count, m.first_received_at, m.body, m.content_type,
       m.headers, m.group_id, m.dedup_id, m.sender_id, src.name
  FROM conveyor.queues q
  JOIN conveyor.messages m ON m.queue_id = q.id
  LEFT JOIN conveyor.queues src ON src.id = m.source_queue_id
 WHERE q.name = %(queue)s::text
   AND (%(source)s::text IS NULL OR src.name = %(source)s::text)
   AND (%(min_id)s::bigint IS NULL OR m.id >= %(min_id)s::bigint)
   AND (%(max_id)s::bigint IS NULL OR m.id < %(max_id)s::bigint)
 ORDER BY m.id

-- name: pipeline_archive_all_bounds
SELECT min(a.id), max(a.id), count(*)
  FROM conveyor.queues q
  JOIN conveyor.archive a ON a.queue_id = q.id
 WHERE q.name = %(queue)s::text

-- name: pipeline_archive_all_range
SELECT a.id, a.message_uuid::text, a.sent_at, a.archived_at, a.receive_count, a.first_received_at, a.body,
       a.content_type, a.headers, a.group_id, a.dedup_id, a.sender_id, src.name, a.outcome, a.error
  FROM conveyor.queues q
  JOIN conveyor.archive a ON a.queue_id = q.id
  LEFT JOIN conveyor.queues src ON src.id = a.source_queue_id
 WHERE q.name = %(queue)s::text
   AND (%(min_id)s::bigint IS NULL OR a.id >= %(min_id)s::bigint)
   AND (%(max_id)s::bigint IS NULL OR a.id < %(max_id)s::bigint)
 ORDER BY a.id

-- name: pipeline_archive_mark
SELECT conveyor.pipeline_archive_mark(%(queue)s::text, %(force)s::boolean)

-- name: pipeline_archive_bounds
SELECT min_id, max_id, estimated FROM conveyor.pipeline_archive_bounds(%(queue)s::text, %(from_mark)s::bigint,
                                                                       %(to_mark)s::bigint)

-- The archive rows between two marks (mark 0: the beginning); see migration 0006.
-- name: pipeline_archive_range
SELECT a.id, a.message_uuid::text, a.sent_at, a.archived_at, a.receive_count, a.first_received_at, a.body,
       a.content_type, a.headers, a.group_id, a.dedup_id, a.sender_id, src.name, a.outcome, a.error
  FROM conveyor.queues q
  JOIN conveyor.pipeline_marks m2 ON m2.queue_id = q.id AND m2.mark_id = %(to_mark)s::bigint
  LEFT JOIN conveyor.pipeline_marks m1 ON m1.queue_id = q.id AND m1.mark_id = %(from_mark)s::bigint
  JOIN conveyor.archive a ON a.queue_id = q.id
  LEFT JOIN conveyor.queues src ON src.id = a.source_queue_id
 WHERE q.name = %(queue)s::text
   AND (%(from_mark)s::bigint = 0 OR m1.mark_id IS NOT NULL)
   AND CASE WHEN a.archive_txid IS NULL THEN %(from_mark)s::bigint = 0
            ELSE a.archive_txid < pg_snapshot_xmax(m2.mark_snapshot)
                 AND pg_visible_in_snapshot(a.archive_txid, m2.mark_snapshot)
                 AND (%(from_mark)s::bigint = 0
                      OR (a.archive_txid >= pg_snapshot_xmin(m1.mark_snapshot)
                          AND NOT pg_visible_in_snapshot(a.archive_txid, m1.mark_snapshot))) END
   AND (%(min_id)s::bigint IS NULL OR a.id >= %(min_id)s::bigint)
   AND (%(max_id)s::bigint IS NULL OR a.id < %(max_id)s::bigint)
 ORDER BY a.id

-- A partitioned queue's partitions with their heads, read in one snapshot (no row: the
-- queue does not exist; one row with NULLs: it has no partitions yet). A head is a safe
-- offset: see conveyor.spark.offsets.
-- name: pipeline_pqueue_partitions
SELECT q.id, p.id, p.name, p.head
  FROM conveyor.pqueues q
  LEFT JOIN conveyor.partitions p ON p.queue_id = q.id
 WHERE q.name = %(queue)s::text

-- The messages of a partitioned queue in ranges (partition id, after seq, through seq],
-- in the ranges' order; sealed payloads come as stored ("<kid>:<sealed>"), the reader
-- opens them. LATERAL, so that each range is an index range of the primary key (a plain
-- join scanned the whole partition and filtered: 200,000 rows read for 50).
-- name: pipeline_pqueue_range
SELECT p.name, p.uuid::text, m.seq, m.id::text, m.transaction_id, m.trace_id::text,
       CASE WHEN m.is_encrypted THEN m.payload #>> ARRAY[]::text[] ELSE m.payload::text END, m.is_encrypted,
       m.producer_sub, m.created_at
  FROM unnest(%(partition_ids)s::bigint[], %(afters)s::bigint[], %(throughs)s::bigint[])
       WITH ORDINALITY AS r(partition_id, after_seq, through_seq, ord)
  JOIN conveyor.partitions p ON p.id = r.partition_id
 CROSS JOIN LATERAL (SELECT * FROM conveyor.partition_messages x
                      WHERE x.partition_id = r.partition_id AND x.seq > r.after_seq AND x.seq <= r.through_seq
                      ORDER BY x.seq) m
 ORDER BY r.ord, m.seq

-- name: pipeline_stream_dead_letters_bounds
SELECT min(d.id), max(d.id), count(*)
  FROM conveyor.streams s
  JOIN conveyor.stream_dead_letters d ON d.stream_id = s.id
 WHERE s.name = %(stream)s::text

-- name: pipeline_stream_dead_letters_range
SELECT d.id, d.ev_id, d.consumer, d.dead_at, d.reason, d.ev_type, d.ev_data, d.ev_time, d.ev_retry,
       nullif(jsonb_strip_nulls(jsonb_build_object('extra1', d.ev_extra1, 'extra2', d.ev_extra2,
                                                   'extra3', d.ev_extra3, 'extra4', d.ev_extra4)), jsonb_build_object())
  FROM conveyor.streams s
  JOIN conveyor.stream_dead_letters d ON d.stream_id = s.id
 WHERE s.name = %(stream)s::text
   AND (%(min_id)s::bigint IS NULL OR d.id >= %(min_id)s::bigint)
   AND (%(max_id)s::bigint IS NULL OR d.id < %(max_id)s::bigint)
 ORDER BY d.id

-- The stream's events dead-lettered by any consumer (each counted once); no row: no such stream.
-- name: pipeline_stream_dead_letter_events
SELECT (SELECT count(DISTINCT d.ev_id) FROM conveyor.stream_dead_letters d WHERE d.stream_id = s.id)
  FROM conveyor.streams s
 WHERE s.name = %(stream)s::text

-- name: pipeline_stream_position
SELECT conveyor.pipeline_stream_position(%(stream)s::text, %(consumer)s::text, %(start)s::text)

-- name: pipeline_stream_tick
SELECT conveyor.pipeline_stream_tick(%(stream)s::text, %(force)s::boolean)

-- name: pipeline_stream_next_tick
SELECT conveyor.pipeline_stream_next_tick(%(stream)s::text, %(after_tick)s::bigint, %(max_events)s::bigint,
                                          %(up_to)s::bigint)

-- name: pipeline_stream_range
SELECT first_tick, first_seq, last_tick, last_seq
  FROM conveyor.pipeline_stream_range(%(stream)s::text, %(from_tick)s::bigint, %(to_tick)s::bigint)

-- Opens the cursor conveyor_pipeline: fetch with pipeline_stream_fetch in the same transaction.
-- name: pipeline_stream_open
SELECT conveyor.pipeline_stream_open(%(stream)s::text, %(consumer)s::text, %(from_tick)s::bigint,
                                     %(to_tick)s::bigint, %(min_id)s::bigint, %(max_id)s::bigint)

-- name: pipeline_stream_fetch
FETCH FORWARD 5000 FROM conveyor_pipeline

-- name: pipeline_stream_advance
SELECT conveyor.pipeline_stream_advance(%(stream)s::text, %(consumer)s::text, %(tick)s::bigint)

-- name: pipeline_stage_copy
COPY conveyor.pipeline_stage (writer_id, stage_id, partition_id, attempt_id, ord, body, type, attributes,
                              group_id, dedup_id, delay, extra1, extra2, extra3, extra4) FROM STDIN

-- name: pipeline_publish
SELECT conveyor.pipeline_publish(%(writer_id)s::uuid, %(stage_id)s::integer, %(target_kind)s::text,
                                 %(target)s::text, %(partitions)s::integer[], %(attempts)s::bigint[],
                                 %(counts)s::bigint[], %(commit_key)s::text, %(batch_id)s::bigint)

-- name: pipeline_discard
SELECT conveyor.pipeline_discard(%(writer_id)s::uuid, %(stage_id)s::integer)

-- The names a pattern is matched against (spark.sources).
-- name: pipeline_queue_names
SELECT name FROM conveyor.queues ORDER BY name

-- name: pipeline_stream_names
SELECT name FROM conveyor.streams ORDER BY name

-- name: pipeline_pqueue_names
SELECT name FROM conveyor.pqueues ORDER BY name

-- startingTimestamp of a stream: its last tick at or before the time (NULL: none that old).
-- name: pipeline_stream_tick_at
SELECT max(t.tick_id)
  FROM conveyor.streams s
  JOIN conveyor.stream_ticks t ON t.stream_id = s.id
 WHERE s.name = %(stream)s::text AND t.tick_time <= to_timestamp(%(at_ms)s::bigint / 1000.0)

-- The stream's oldest tick still kept (failOnDataLoss: older ones were rotated away).
-- name: pipeline_stream_oldest_tick
SELECT min(t.tick_id)
  FROM conveyor.streams s
  JOIN conveyor.stream_ticks t ON t.stream_id = s.id
 WHERE s.name = %(stream)s::text

-- The mark itself if it is still kept, else the queue's oldest mark (failOnDataLoss).
-- name: pipeline_archive_oldest_mark
SELECT coalesce(max(m.mark_id) FILTER (WHERE m.mark_id = %(mark)s::bigint), min(m.mark_id))
  FROM conveyor.queues q
  JOIN conveyor.pipeline_marks m ON m.queue_id = q.id
 WHERE q.name = %(queue)s::text

-- startingTimestamp / startingOffsetsByTimestamp of a partitioned queue: per partition, the
-- position before its first message created at or after the time (its head if none is).
-- name: pipeline_pqueue_positions_at
SELECT r.partition_id,
       coalesce((SELECT min(m.seq) - 1 FROM conveyor.partition_messages m
                  WHERE m.partition_id = r.partition_id AND m.created_at >= to_timestamp(r.at_ms / 1000.0)), p.head)
  FROM unnest(%(partition_ids)s::bigint[], %(ats)s::bigint[]) AS r(partition_id, at_ms)
  JOIN conveyor.partitions p ON p.id = r.partition_id

-- failOnDataLoss of a partitioned queue: per range (partition, after], the first message
-- still kept after it (NULL: none). Retention and clears remove a partition's oldest first.
-- name: pipeline_pqueue_first_kept
SELECT r.partition_id,
       (SELECT min(m.seq) FROM conveyor.partition_messages m
         WHERE m.partition_id = r.partition_id AND m.seq > r.after_seq)
  FROM unnest(%(partition_ids)s::bigint[], %(afters)s::bigint[]) AS r(partition_id, after_seq)
