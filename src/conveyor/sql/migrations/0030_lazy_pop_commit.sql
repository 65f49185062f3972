-- A fused pop's lease need not reach the disk before its answer (issue 26): the server's
-- pqueue_pop_many takes a second argument, lazy, under which a pop that only leases
-- commits without waiting for its WAL flush (docs/architecture.md, "Durability of a
-- pop"). The old one-argument function goes, or a call with one argument would match
-- both; the new one, and its grant, are in src/conveyor/sql/functions/45_partitioned.sql.
-- (IF EXISTS: on a new database the functions files have not made it yet.)
DROP FUNCTION IF EXISTS conveyor.pqueue_pop_many(jsonb);
