-- Conveyor 0023: cooperative members of a stream consumer (PgQue's cooperative consumers,
-- pgque.receive_coop; PgQ's pgq_coop).
--
-- A consumer's batches are consecutive tick ranges read one at a time. A cooperative
-- consumer shares that cursor between several workers: each member takes the next range
-- as a batch of its own, concurrently with the others, and no range goes to two members.
-- Why the engine and not the dialect: a batch's events are selected for its consumer
-- (retries carry their consumer's id, conveyor._batch_query keeps those of the batch's
-- consumer), and a retry made by one member must come back to the group, through whichever
-- member reads the range it lands in; only the engine's batch query can say so.
--
--   stream_consumers.coop_of   a member's row points at its consumer (the "main" row, which
--                              keeps the cursor); members are named <consumer>.<member>
--   retries of a member's batch belong to the consumer (ev_owner = the main row's id), and
--                              every member's batch reads them
--   stream_next_batch_coop     a member's open batch, or the range after the consumer's
--                              cursor (which moves past it at once), or, with dead_interval,
--                              the batch of a member silent that long, under a new batch id
--   stream_finish_batch        a member's finished batch leaves it idle at the consumer's
--                              cursor (members never hold the cursor back while idle, so
--                              rotation and tick cleanup see only open member batches)
--   stream_next_batch_custom   refuses a consumer with members, and a member (CVS06): their
--                              batches come from stream_next_batch_coop
--
-- The functions, views and their triggers and grants that this change defined are in
-- src/conveyor/sql/functions/ as they stand now (docs/architecture.md, "Where each SQL
-- function's current definition lives"); this file keeps its tables, indexes, data and DROPs.

ALTER TABLE conveyor.stream_consumers
    ADD COLUMN coop_of bigint REFERENCES conveyor.stream_consumers (id) ON DELETE CASCADE;
CREATE INDEX stream_consumers_coop_of_idx ON conveyor.stream_consumers (coop_of) WHERE coop_of IS NOT NULL;
