-- The failover spool (core/spooled.py).
--
-- Current definitions, re-applied whenever a file of this folder changes (docs/architecture.md,
-- "Where each SQL function's current definition lives"). Edit a function here; tables, types,
-- indexes, data and DROPs go in a new numbered migration.

-- The keys of `keys` not replayed before, now recorded as replayed (in the caller's
-- transaction: roll it back and they are not).
CREATE OR REPLACE FUNCTION conveyor.spool_claim(keys text[]) RETURNS SETOF text
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    INSERT INTO conveyor.spool_replays (key)
    SELECT k FROM unnest(keys) AS k
    ON CONFLICT (key) DO NOTHING
    RETURNING key
$$;

-- Forgets the keys of one removed segment ("<slot>/<segment>/"); how many.
CREATE OR REPLACE FUNCTION conveyor.spool_forget(prefix text) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    n integer;
BEGIN
    DELETE FROM conveyor.spool_replays WHERE starts_with(key, prefix);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

REVOKE ALL ON ALL ROUTINES IN SCHEMA conveyor FROM PUBLIC;
