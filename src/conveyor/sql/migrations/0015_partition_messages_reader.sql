-- Conveyor 0015: conveyor_reader may read a partitioned queue's messages.
--
-- Migration 0001 lets conveyor_reader read every table it made, queue messages included;
-- migration 0009 granted it the partitioned queues' tables one by one and left out
-- conveyor.partition_messages, so a reader could see partitions, cursors and dead letters
-- but not the messages themselves (the Spark data source's partitioned-queue read, issue
-- 18, needs them). Sealed payloads stay sealed: reading them is not opening them.

DO $$
BEGIN
    GRANT SELECT ON conveyor.partition_messages TO conveyor_reader;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: roles missing, grants skipped (%)', SQLERRM;
END $$;
