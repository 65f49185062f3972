-- Conveyor 0011: the failover spool's replay ledger (conveyor.server.spool).
--
-- A server that accepted writes while PostgreSQL was unreachable replays them from its
-- local journal once the database is back. Each journal record has a key that is never
-- reused (slot / segment / offset); the replay inserts the keys of a page of records and
-- stores the messages of the keys it could insert, in one transaction, so a replay cut
-- short by a crash and started again stores nothing twice. Keys are forgotten once the
-- server has removed their segment from disk.

CREATE TABLE conveyor.spool_replays (
    key         text PRIMARY KEY,
    replayed_at timestamptz NOT NULL DEFAULT now()
);

-- The keys of `keys` not replayed before, now recorded as replayed (in the caller's
-- transaction: roll it back and they are not).
CREATE FUNCTION conveyor.spool_claim(keys text[]) RETURNS SETOF text
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    INSERT INTO conveyor.spool_replays (key)
    SELECT k FROM unnest(keys) AS k
    ON CONFLICT (key) DO NOTHING
    RETURNING key
$$;

-- Forgets the keys of one removed segment ("<slot>/<segment>/"); how many.
CREATE FUNCTION conveyor.spool_forget(prefix text) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    n integer;
BEGIN
    DELETE FROM conveyor.spool_replays WHERE starts_with(key, prefix);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

REVOKE ALL ON FUNCTION conveyor.spool_claim(text[]), conveyor.spool_forget(text) FROM PUBLIC;

DO $$
BEGIN
    GRANT EXECUTE ON FUNCTION conveyor.spool_claim(text[]), conveyor.spool_forget(text) TO conveyor_writer;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: roles missing, grants skipped (%)', SQLERRM;
END $$;
