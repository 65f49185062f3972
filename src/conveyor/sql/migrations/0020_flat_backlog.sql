-- Conveyor 0020: the hot statements cost the same whatever the backlog (issue 26 item 1).
--
-- Measured (docs/benchmarks.md, "Cost under a backlog"): with 2,000 messages waiting, 8
-- SQS clients received and deleted 4,927 messages a second; with 200,000, 251. The
-- acknowledgements that take each delivery's receive count (delete, archive, change of
-- visibility: migration 0007) joined conveyor._deliveries(ids, receive_counts), a
-- PL/pgSQL function the planner estimates at 1,000 rows, and under the generic plans of
-- migration 0014 it hashed that against a bitmap scan of every message of the queue: a
-- delete of 10 read 200,000 rows. FIFO receives, and grouped receives of standard queues,
-- read whole groups (or the whole queue) to find the groups with nothing in flight.
-- Partitioned queues' pops planned with the values of each call could read a whole
-- partition by the wrong index when the statistics predated it.
--
-- The rule now, for every statement on the hot path: its rows are found by a key, so
-- that no plan the statistics can lead to reads more than a bounded number of rows per
-- message (tests/sql/test_plans.py counts them over a backlog loaded in bulk, never
-- analyzed, and again after ANALYZE):
--   - acknowledgements look the messages up by primary key (id = ANY (ids)); the receive
--     counts are checked on the rows found (a join with unnest on the ids they hold);
--   - a FIFO or grouped receive finds each group's oldest visible message by the group
--     index (one row per group), asks whether a group has a message in flight through a
--     new partial index holding only received messages of groups (messages_received_idx),
--     and claims from the chosen groups by the group index, in id order, group by group
--     (as SQS fills a receive from one group before the next); grouped receives of
--     standard queues list their groups by a skip scan of the group index instead of
--     grouping every message of the queue. Their cost is a few probes per group holding
--     messages, not per message;
--   - a receive with an attempt id clears its queue's expired attempts through a new index
--     instead of reading every attempt of the last five minutes;
--   - partitioned queues' pops, pushes, acks, renewals and transactions keep generic plans
--     (as the queue functions have since 0014: planned once per session, on an average
--     partition), and a pop's check for messages older than maxWaitTimeSeconds reads from
--     the cursor and stops at the first younger one.
-- Streams read a batch by its tick snapshots through the event tables' ev_txid index
-- (migration 0003): their cost follows the batch, not the events waiting after it.
--
-- The functions, views and their triggers and grants that this change defined are in
-- src/conveyor/sql/functions/ as they stand now (docs/architecture.md, "Where each SQL
-- function's current definition lives"); this file keeps its tables, indexes, data and DROPs.

------------------------------------------------------------------------------------------
-- Acknowledgements by primary key
------------------------------------------------------------------------------------------

DROP FUNCTION conveyor._deliveries(bigint[], integer[]);

-- Receives with an attempt id (SQS's ReceiveRequestAttemptId, 0002) first clear their
-- queue's expired attempts, a hundred at a time: found by this index, not by reading every
-- attempt of the last five minutes (one per such receive).
CREATE INDEX receive_attempts_expiry_idx ON conveyor.receive_attempts (queue_id, expires_at);

------------------------------------------------------------------------------------------
-- FIFO and grouped receives: one probe per group
------------------------------------------------------------------------------------------

-- The received messages of groups: whether a group has a message in flight is one probe
-- here (received, and invisible until after now), where the group index would read the
-- whole group when nothing of it is in flight.
CREATE INDEX messages_received_idx ON conveyor.messages (queue_id, group_id, vt)
    WHERE receive_count > 0 AND group_id IS NOT NULL;
