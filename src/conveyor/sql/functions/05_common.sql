-- Helpers every concept uses: errors, names, options, secrets.
--
-- Current definitions, re-applied whenever a file of this folder changes (docs/architecture.md,
-- "Where each SQL function's current definition lives"). Edit a function here; tables, types,
-- indexes, data and DROPs go in a new numbered migration.

CREATE OR REPLACE FUNCTION conveyor._raise(code text, msg text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = code, MESSAGE = msg;
END $$;

-- The same, usable inside an expression (a CASE branch of a query).
CREATE OR REPLACE FUNCTION conveyor._fail(code text, msg text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = code, MESSAGE = msg;
END $$;

-- SQS naming: 1-80 characters of [A-Za-z0-9_-]; FIFO queues end in ".fifo". A queue of
-- another region than the server's default (SQS scopes queues per region) carries the
-- region as a prefix: "eu-west-1:jobs".
CREATE OR REPLACE FUNCTION conveyor._name_check(queue_name text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    bare text := regexp_replace(queue_name, '^[a-z0-9-]{1,32}:', '');
BEGIN
    IF queue_name IS NULL
       OR length(bare) > 80
       OR bare !~ '^[A-Za-z0-9_-]+(\.fifo)?$'
       OR bare = '.fifo' THEN
        PERFORM conveyor._raise('CVV01', format(
            'invalid queue name %s: use 1 to 80 characters of A-Z, a-z, 0-9, hyphen and underscore, with the suffix .fifo for FIFO queues (and optionally a region prefix such as eu-west-1:)',
            coalesce(quote_literal(left(queue_name, 100)), 'NULL')));
    END IF;
    RETURN queue_name LIKE '%.fifo';
END $$;

CREATE OR REPLACE FUNCTION conveyor._int_attr(attrs jsonb, key text, lo integer, hi integer) RETURNS integer
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v jsonb := attrs -> key;
    n numeric;
BEGIN
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(v) = 'number' THEN
        n := v::numeric;
    ELSIF jsonb_typeof(v) = 'string' AND (v #>> '{}') ~ '^\s*-?\d+\s*$' THEN
        n := (v #>> '{}')::numeric;
    END IF;
    IF n IS NULL OR n <> trunc(n) OR n < lo OR n > hi THEN
        PERFORM conveyor._raise('CVV01', format('%s must be an integer from %s to %s, got %s',
                                                key, lo, hi, left(v::text, 100)));
    END IF;
    RETURN n::integer;
END $$;

CREATE OR REPLACE FUNCTION conveyor._bool_attr(attrs jsonb, key text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v jsonb := attrs -> key;
BEGIN
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        RETURN NULL;
    ELSIF jsonb_typeof(v) = 'boolean' THEN
        RETURN v::boolean;
    ELSIF jsonb_typeof(v) = 'string' AND lower(v #>> '{}') IN ('true', 'false') THEN
        RETURN lower(v #>> '{}')::boolean;
    END IF;
    PERFORM conveyor._raise('CVV01', format('%s must be true or false, got %s', key, left(v::text, 100)));
END $$;

CREATE OR REPLACE FUNCTION conveyor._string_object_check(obj jsonb, what text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF obj IS NULL OR jsonb_typeof(obj) <> 'object'
       OR EXISTS (SELECT 1 FROM jsonb_each(obj) t WHERE jsonb_typeof(t.value) NOT IN ('string', 'null')) THEN
        PERFORM conveyor._raise('CVV01', what || ' must be a JSON object of strings');
    END IF;
END $$;

-- JSON text to jsonb, or NULL if it is not valid JSON.
CREATE OR REPLACE FUNCTION conveyor._json_or_null(doc text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN doc::jsonb;
EXCEPTION WHEN others THEN
    RETURN NULL;
END $$;

-- The secret of that name: the stored one, or `candidate` (random bytes from the caller)
-- stored now if there was none. Concurrent first callers all get the one that won.
CREATE OR REPLACE FUNCTION conveyor.secret_get(secret_name text, candidate bytea) RETURNS bytea
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    INSERT INTO conveyor.secrets (name, value) VALUES (secret_name, candidate)
    ON CONFLICT (name) DO NOTHING;
    RETURN (SELECT s.value FROM conveyor.secrets s WHERE s.name = secret_name);
END $$;

-- Whether text is a UUID in the forms a cast reads (so that the cast cannot fail): 32 hex
-- digits, in either case, with or without a hyphen after the 8th, 12th, 16th and 20th. One
-- definition for every check of a UUID given by a client. (A regex costs 2.5 us a text here;
-- tests of the usual forms by translate() cost as much, by ltrim() 1 us: not worth a second
-- definition of the forms.) An expression, inlined where it is used.
CREATE OR REPLACE FUNCTION conveyor._is_uuid(s text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT s ~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$'
$$;

-- Integer option: a JSON number (or numeric string) within bounds, or the default.
CREATE OR REPLACE FUNCTION conveyor._int_option(options jsonb, key text, lo integer, hi integer, dflt integer)
RETURNS integer
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v jsonb := options -> key;
    n numeric;
BEGIN
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        RETURN dflt;
    END IF;
    IF jsonb_typeof(v) = 'number' THEN
        n := v::numeric;  -- cannot fail: no subtransaction (the block below starts one)
    ELSE
        BEGIN
            n := (v #>> '{}')::numeric;
        EXCEPTION WHEN others THEN
            PERFORM conveyor._raise('CVV01', format('option %s must be a number, got %s', key, left(v::text, 100)));
        END;
    END IF;
    IF n <> trunc(n) OR n < lo OR n > hi THEN
        PERFORM conveyor._raise('CVV01', format('option %s must be a whole number from %s to %s, got %s', key, lo, hi, n));
    END IF;
    RETURN n::integer;
END $$;

CREATE OR REPLACE FUNCTION conveyor._bool_option(options jsonb, key text, dflt boolean) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v jsonb := options -> key;
BEGIN
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        RETURN dflt;
    END IF;
    IF jsonb_typeof(v) = 'boolean' THEN
        RETURN v::text::boolean;
    END IF;
    IF jsonb_typeof(v) = 'string' AND lower(v #>> '{}') IN ('true', 'false') THEN
        RETURN lower(v #>> '{}')::boolean;
    END IF;
    PERFORM conveyor._raise('CVV01', format('option %s must be true or false, got %s', key, left(v::text, 100)));
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION conveyor._encrypted(q conveyor.queues) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(q.extra_attributes -> 'encrypted' = 'true'::jsonb, false)
$$;

-- The tables of Conveyor's schema that a VACUUM should visit now: those whose dead row
-- versions reached 500 plus 5% of their live rows. A queue's claim walks, from the oldest
-- visible message on, the index entries that receives and deletes left behind, until a
-- VACUUM removes them: with a busy queue and nothing vacuuming, every receive costs more
-- than the last. Autovacuum's own bar (50 plus 20%, looked at once a minute) lets
-- thousands of such entries gather, and a database may run with autovacuum off; the
-- server vacuums by this bar itself (conveyor.server.workers.vacuum). Only tables the
-- caller may vacuum (their owner's role, or superuser); the most dead row versions first.
-- kept: {"conveyor.table": n} the dead row versions the caller's last VACUUM of a table
-- could not remove (an older transaction may still see them; conveyor.dead_rows): only
-- those beyond count, so a long transaction does not make every look vacuum again.
DROP FUNCTION IF EXISTS conveyor.tables_to_vacuum();
CREATE OR REPLACE FUNCTION conveyor.tables_to_vacuum(kept jsonb DEFAULT '{}') RETURNS SETOF text
LANGUAGE sql STABLE SET search_path = pg_catalog AS $$
    SELECT t.name
      FROM (SELECT s.schemaname || '.' || s.relname AS name, s.n_live_tup AS live, c.relowner,
                   s.n_dead_tup - coalesce((kept ->> (s.schemaname || '.' || s.relname))::bigint, 0) AS dead
              FROM pg_stat_user_tables s
              JOIN pg_class c ON c.oid = s.relid
             WHERE s.schemaname = 'conveyor') t
     WHERE t.dead >= 500 + 0.05 * t.live
       AND pg_has_role(t.relowner, 'USAGE')
     ORDER BY t.dead DESC
$$;

-- The dead row versions of the named tables now (after a VACUUM: those it had to keep).
CREATE OR REPLACE FUNCTION conveyor.dead_rows(tables text[]) RETURNS TABLE (table_name text, dead bigint)
LANGUAGE sql STABLE SET search_path = pg_catalog AS $$
    SELECT s.schemaname || '.' || s.relname, s.n_dead_tup
      FROM pg_stat_user_tables s
     WHERE s.schemaname = 'conveyor' AND s.schemaname || '.' || s.relname = ANY (tables)
$$;

DO $$
BEGIN
    GRANT EXECUTE ON FUNCTION conveyor.tables_to_vacuum(jsonb), conveyor.dead_rows(text[]) TO conveyor_admin;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: roles missing, grants skipped (%)', SQLERRM;
END $$;

REVOKE ALL ON ALL ROUTINES IN SCHEMA conveyor FROM PUBLIC;
