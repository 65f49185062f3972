-- A wildcard pop's walk over the partitions pushed since its group's watermark passed, on
-- every pop, over every partition the group had drained since (issue 26: 1,271 us a pop
-- with a few hundred of 1,024 partitions drained; all of them pushed by the same
-- transactions, so one transaction id cannot mark where the walk may start). The mark is
-- now a key of the walk's order, (transaction id, partition id): a pop that finds the
-- walk's first partition with work past the mark moves the mark up to it (pqueue_pop, in
-- src/conveyor/sql/functions/45_partitioned.sql).
ALTER TABLE conveyor.consumer_groups ADD COLUMN scanned_id bigint NOT NULL DEFAULT 0;

-- The walk's order, ties of a transaction id in partition id order (the old index had them
-- in the order of the rows' places in the table). The name stays.
CREATE INDEX partitions_pushed_key_idx ON conveyor.partitions (queue_id, head_xid, id);
DROP INDEX conveyor.partitions_pushed_idx;
ALTER INDEX conveyor.partitions_pushed_key_idx RENAME TO partitions_pushed_idx;
