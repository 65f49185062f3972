-- The Queen API's pop and ack build their answers as json instead of jsonb (issue 26): the
-- server only passes them on, and a jsonb object cost 2.4 times a json one to build, then
-- again to append to an array and to print (13 us of a claimed message's, 9.5 of an
-- acknowledged one's). A function's result type cannot be replaced, so the old ones go;
-- the new ones, and their grants, are in src/conveyor/sql/functions/45_partitioned.sql
-- (docs/architecture.md, "Where each SQL function's current definition lives").
-- (IF EXISTS: on a new database the functions files have not made them yet.)
DROP FUNCTION IF EXISTS conveyor.pqueue_pop_many(jsonb);
DROP FUNCTION IF EXISTS conveyor.pqueue_pop(jsonb);
DROP FUNCTION IF EXISTS conveyor._partition_claim(conveyor.pqueues, conveyor.partitions, text, integer, uuid, integer, text);
DROP FUNCTION IF EXISTS conveyor.pqueue_ack(jsonb, boolean);
DROP FUNCTION IF EXISTS conveyor._ack_completions(jsonb, timestamptz);
