-- The claim of a partition's messages returns them as one JSON array instead of a set of
-- rows (issue 26: the pop appended them one at a time in a plpgsql loop, and read them
-- twice). A function's result type cannot be replaced, so the old one goes; the new one is
-- in src/conveyor/sql/functions/45_partitioned.sql (docs/architecture.md, "Where each SQL
-- function's current definition lives").
DROP FUNCTION conveyor._partition_claim(conveyor.pqueues, conveyor.partitions, text, integer, uuid, integer, text);
