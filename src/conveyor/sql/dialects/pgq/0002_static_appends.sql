-- Conveyor dialect pgq 0002: insert_event with a plan kept per event table, and CDC
-- triggers that read the row without an EXECUTE (below).
--
-- A stream's events go to its own tables (conveyor.stream_<id>_0/1/2, migration 0003),
-- so 0001's insert_event named the table in an EXECUTE: parsed, analysed and planned at
-- every event. Measured (pg_stat_user_functions, perf in a scratch database): two thirds
-- of an insert_event's server time, which left it at 0.3 of PgQ's speed for 1,000 events
-- per statement, where PgQ's C code reuses one plan per queue. PL/pgSQL keeps the plan of
-- a statement whose table is written in the function, so insert_event is now written for
-- the streams that exist: for each, an INSERT into each of its three tables, reached by a
-- binary search on the stream id, then on the current table. It is written again
-- (pgq._insert_event_rewrite) when it meets a stream it has no statements for (a stream
-- created since, by any interface): that event, and every event while another
-- transaction is rewriting it, takes 0001's EXECUTE path, so nothing waits for the
-- rewrite. A dropped stream's branch is never reached (its name no longer finds a stream)
-- and goes at the next rewrite. (One function, not a second one for the statements: a
-- PL/pgSQL call per event cost a tenth of the time.)
--
-- The insert itself is 0001's (the engine's raw append): the transaction id is taken
-- before the stream row (and so the current table) is read, ev_id from the stream's
-- sequence, ev_type as given.

-- The statements for the streams ids[lo..hi] (sorted): a binary search on stream_id.
CREATE FUNCTION pgq._insert_event_branch(ids bigint[], lo integer, hi integer) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    mid integer := (lo + hi) / 2;
    -- (the id drawn first, in an assignment: cheaper than the INSERT's RETURNING)
    insert_into constant text := 'INSERT INTO conveyor.%I (ev_id, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, '
                                 'ev_extra4) VALUES (id, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4);';
BEGIN
    IF lo > hi THEN
        RETURN '';
    END IF;
    IF lo = hi THEN
        RETURN format(E'IF stream_id = %s THEN\n    id := nextval(seq);\n    CASE cur_table\n'
                      || E'    WHEN 0 THEN %s\n    WHEN 1 THEN %s\n    ELSE %s\n    END CASE;\n    RETURN id;\nEND IF;\n',
                      ids[lo], format(insert_into, 'stream_' || ids[lo] || '_0'),
                      format(insert_into, 'stream_' || ids[lo] || '_1'), format(insert_into, 'stream_' || ids[lo] || '_2'));
    END IF;
    RETURN format(E'IF stream_id <= %s THEN\n%sELSE\n%sEND IF;\n', ids[mid], pgq._insert_event_branch(ids, lo, mid),
                  pgq._insert_event_branch(ids, mid + 1, hi));
END $$;

-- pgq.insert_event with the statements for the streams `ids`.
CREATE FUNCTION pgq._insert_event_source(ids bigint[]) RETURNS text
LANGUAGE sql IMMUTABLE AS $src$
    SELECT $head$
CREATE OR REPLACE FUNCTION pgq.insert_event(queue_name text, ev_type text, ev_data text,
                                            ev_extra1 text, ev_extra2 text, ev_extra3 text, ev_extra4 text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $insert_event$
-- Written by pgq._insert_event_rewrite (dialect migration pgq/0002) for the streams there were.
DECLARE
    stream_id bigint;
    cur_table smallint;
    seq regclass;
    id bigint;
BEGIN
    IF queue_name IS NULL THEN
        RAISE EXCEPTION 'Queue name must not be NULL';
    END IF;
    PERFORM pg_current_xact_id();
    SELECT x.id, x.cur_table, x.event_seq INTO stream_id, cur_table, seq
      FROM conveyor.streams x WHERE x.name = insert_event.queue_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'No such queue';
    END IF;
$head$ || pgq._insert_event_branch(ids, 1, cardinality(ids)) || $tail$
    -- a stream created after this function was written
    PERFORM pgq._insert_event_rewrite();
    EXECUTE format('INSERT INTO conveyor.%I (ev_id, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
                    VALUES (nextval($1), $2, $3, $4, $5, $6, $7) RETURNING ev_id',
                   'stream_' || stream_id || '_' || cur_table)
    INTO id USING seq, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4;
    RETURN id;
END $insert_event$
$tail$
$src$;

-- Writes pgq.insert_event again for the streams this transaction sees, unless another
-- transaction is doing it (then returns false at once). CREATE OR REPLACE keeps its grants.
CREATE FUNCTION pgq._insert_event_rewrite() RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('pgq._insert_event_rewrite')) THEN
        RETURN false;
    END IF;
    SELECT coalesce(array_agg(s.id ORDER BY s.id), '{}') INTO ids FROM conveyor.streams s;
    EXECUTE pgq._insert_event_source(ids);
    RETURN true;
END $$;

SELECT pgq._insert_event_rewrite();

------------------------------------------------------------------------------------------
-- Batches: 0001's SQL wrappers as PL/pgSQL (a SECURITY DEFINER SQL function, or one that
-- cannot be inlined, is planned again at every call; pg_stat_user_functions put
-- pgq.next_batch's own time at a tenth of a batch's)
------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION pgq._batch_owner(batch bigint) RETURNS conveyor.stream_consumers
LANGUAGE plpgsql STABLE AS $$
DECLARE
    c conveyor.stream_consumers;
BEGIN
    SELECT * INTO c FROM conveyor.stream_consumers x WHERE x.batch_id = batch;
    RETURN c;
END $$;

CREATE OR REPLACE FUNCTION pgq.next_batch(i_queue_name text, i_consumer_name text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgq AS $$
BEGIN
    RETURN (SELECT n.batch_id FROM pgq.next_batch_custom(i_queue_name, i_consumer_name, NULL, NULL, NULL) n);
END $$;

------------------------------------------------------------------------------------------
-- CDC triggers: the row's values without an EXECUTE per row
--
-- 0001's triggers were 50 times the server time of PgQ's C triggers per row (measured
-- with pg_stat_user_functions: a logutriga INSERT on a four-column table spent it in
-- pgq._urlencode and pgq._encode, SQL functions planned again at every call, in the
-- EXECUTE that reads the row's values, in three catalog queries and in insert_event's
-- EXECUTE). Now: one catalog query; the values from to_json(row) for the column types
-- whose text and JSON forms are known (below), the EXECUTE only for other types (arrays,
-- json, domains, composites...); urlencoding with replace() for the common characters;
-- the encoders PL/pgSQL. The events are 0001's, byte for byte: tests/dialects/test_pgq.py
-- compares them with PgQ's C triggers.
------------------------------------------------------------------------------------------

-- Types whose value to_json(row) gives as the type's output text (a JSON number or
-- string), or as a form that casts back to the type (true/false; ISO dates and times,
-- in the session's time zone): for these, the row's JSON is the row's text. By OID (the
-- built-in types' fixed ones, so that the array is a constant): boolean, smallint,
-- integer, bigint, numeric, real, double precision, oid, text, varchar, char(n), name,
-- "char", uuid, bytea, interval, time, timetz, date, timestamp, timestamptz, inet, cidr,
-- macaddr.
CREATE FUNCTION pgq._json_text_types() RETURNS oid[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT '{16,21,23,20,1700,700,701,26,25,1043,1042,19,18,2950,17,1186,1083,1266,1082,1114,1184,869,650,829}'::oid[]
$$;

-- One value of the row's JSON (json_each(to_json(row))) of a type listed above: as the
-- type's output function writes it (NULL for SQL NULL), and as PgQ's jsontriga encodes
-- it (booleans, integers and dates as JSON gives them, the rest as the JSON string of the
-- text; 'null'). SQL functions, inlined into the queries below.
CREATE FUNCTION pgq._json_value_text(value json, typ regtype) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN value::text = 'null' THEN NULL
                WHEN typ = 'boolean'::regtype THEN CASE WHEN value::text = 'true' THEN 't' ELSE 'f' END
                WHEN typ = 'date'::regtype THEN (value #>> '{}')::date::text
                WHEN typ = 'timestamp'::regtype THEN (value #>> '{}')::timestamp::text
                WHEN typ = 'timestamptz'::regtype THEN (value #>> '{}')::timestamptz::text
                ELSE value #>> '{}' END
$$;

CREATE FUNCTION pgq._json_value_json(value json, typ regtype) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN value::text = 'null'
                     OR typ IN ('boolean'::regtype, 'smallint'::regtype, 'integer'::regtype, 'bigint'::regtype,
                                'date'::regtype, 'timestamp'::regtype, 'timestamptz'::regtype)
                THEN value::text
                ELSE to_json(value #>> '{}')::text END
$$;

-- Each column's value as the type's output function writes it (NULL stays NULL): what
-- pgq._row_text returns, from the row's JSON where every column's type allows.
CREATE FUNCTION pgq._row_values(cols text[], types regtype[], r anyelement) RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF types::oid[] <@ pgq._json_text_types() THEN
        RETURN ARRAY(SELECT pgq._json_value_text(j.value, t.typ)
                       FROM json_each(to_json(r)) WITH ORDINALITY AS j(key, value, n)
                       JOIN unnest(types) WITH ORDINALITY AS t(typ, n) ON t.n = j.n
                      ORDER BY j.n);
    END IF;
    RETURN pgq._row_text(cols, r);
END $$;

-- The row's data as ev_data (kind 'json': jsontriga's object, else logutriga's urlencoded
-- pairs), skipping the skipped columns: pgq._encode of the row's values, in one query
-- from the row's JSON where every column's type allows.
CREATE FUNCTION pgq._encode_row(kind text, cols text[], types regtype[], skipped boolean[], r anyelement)
RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT types::oid[] <@ pgq._json_text_types() THEN
        RETURN pgq._encode(kind, cols, skipped, CASE WHEN kind = 'json' THEN pgq._row_json(cols, types, r)
                                                     ELSE pgq._row_text(cols, r) END);
    END IF;
    IF kind = 'json' THEN
        RETURN (SELECT '{' || coalesce(string_agg(to_json(t.col)::text || ':' || pgq._json_value_json(j.value, t.typ), ','
                                                  ORDER BY j.n), '') || '}'
                  FROM json_each(to_json(r)) WITH ORDINALITY AS j(key, value, n)
                  JOIN unnest(cols, types, skipped) WITH ORDINALITY AS t(col, typ, skip, n) ON t.n = j.n
                 WHERE NOT t.skip);
    END IF;
    RETURN (SELECT coalesce(string_agg(pgq._urlencode(t.col)
                                       || coalesce('=' || pgq._urlencode(pgq._json_value_text(j.value, t.typ)), ''),
                                       '&' ORDER BY j.n), '')
              FROM json_each(to_json(r)) WITH ORDINALITY AS j(key, value, n)
              JOIN unnest(cols, types, skipped) WITH ORDINALITY AS t(col, typ, skip, n) ON t.n = j.n
             WHERE NOT t.skip);
END $$;

-- application/x-www-form-urlencoded as PgQ writes it (0001's rule): names and values
-- that need nothing, or only the characters dates, numbers and plain text are made of
-- (replace()), without a query; anything else as 0001 did it. PL/pgSQL: 0001's SQL
-- function was planned again at every call.
CREATE OR REPLACE FUNCTION pgq._urlencode(val text) RETURNS text
LANGUAGE plpgsql STRICT STABLE AS $$
BEGIN
    IF val !~ '[^-_.A-Za-z0-9]' THEN
        RETURN val;
    END IF;
    IF val !~ '[^-_.A-Za-z0-9 %+:,/@=&]' THEN
        RETURN replace(replace(replace(replace(replace(replace(replace(replace(replace(
                   val, '%', '%25'), '+', '%2b'), ':', '%3a'), ',', '%2c'), '/', '%2f'), '@', '%40'),
                   '=', '%3d'), '&', '%26'), ' ', '+');
    END IF;
    RETURN (SELECT replace(coalesce(string_agg(m.part[1] || regexp_replace(
                       encode(convert_to(m.part[2], getdatabaseencoding()), 'hex'), '(..)', '%\1', 'g'),
                   '' ORDER BY m.nr), ''), '%20', '+')
              FROM regexp_matches(val, '([-_.A-Za-z0-9]*)([^-_.A-Za-z0-9]*)', 'g') WITH ORDINALITY AS m(part, nr));
END $$;

-- One value of the encodings (0001's), as PL/pgSQL: its statements' plans are kept.
CREATE OR REPLACE FUNCTION pgq._encode(kind text, cols text[], skipped boolean[], vals text[]) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF kind = 'json' THEN
        RETURN (SELECT '{' || coalesce(string_agg(to_json(c)::text || ':' || v, ',' ORDER BY n), '') || '}'
                  FROM unnest(cols, skipped, vals) WITH ORDINALITY AS x(c, s, v, n)
                 WHERE NOT s);
    END IF;
    RETURN (SELECT coalesce(string_agg(pgq._urlencode(c) || coalesce('=' || pgq._urlencode(v), ''), '&' ORDER BY n), '')
              FROM unnest(cols, skipped, vals) WITH ORDINALITY AS x(c, s, v, n)
             WHERE NOT s);
END $$;

-- The body of the three triggers (0001's), with the above.
CREATE OR REPLACE FUNCTION pgq._trigger_event(kind text, op text, tg_when text, tg_level text, relid oid, tschema text,
                                   tname text, tg_args text[], old_row anyelement, new_row anyelement)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    args text[] := tg_args[:];  -- TG_ARGV starts at 0, a slice at 1
    tbl text := tschema || '.' || tname;
    opc text := CASE op WHEN 'INSERT' THEN 'I' WHEN 'UPDATE' THEN 'U' WHEN 'DELETE' THEN 'D' ELSE 'R' END;
    fields constant text[] := ARRAY['ev_type', 'ev_data', 'ev_extra1', 'ev_extra2', 'ev_extra3', 'ev_extra4', 'when'];
    exprs text[] := ARRAY[NULL, NULL, NULL, NULL, NULL, NULL, NULL];
    ev text[] := ARRAY['', '', tbl, NULL, NULL, NULL];  -- type, data, extra1..4
    qname text;
    skip boolean := false;
    backup boolean := false;
    deny boolean := false;
    ignore_arg text;
    pkey_arg text;
    name text;
    table_pkey text[];
    ignore_names text[];
    cols text[];
    types regtype[];
    skipped boolean[];
    is_pkey boolean[];
    changed boolean[];
    old_vals text[];
    new_vals text[];
    row_vals text[];
    magic boolean;
    ignored integer := 0;
    wanted boolean;
    typ oid;
    is_null boolean;
    val text;
BEGIN
    IF current_setting('session_replication_role') = 'local' THEN
        RETURN false;
    END IF;
    IF opc = 'R' AND tg_level <> 'STATEMENT' THEN
        RAISE EXCEPTION 'pgq tRuncate trigger must be fired FOR EACH STATEMENT';
    ELSIF opc <> 'R' AND tg_level <> 'ROW' THEN
        RAISE EXCEPTION 'pgq Ins/Upd/Del trigger must be fired FOR EACH ROW';
    END IF;
    IF coalesce(cardinality(args), 0) < 1 THEN
        RAISE EXCEPTION 'pgq trigger must have destination queue as argument';
    END IF;
    qname := args[1];
    FOR i IN 2 .. cardinality(args) LOOP
        IF args[i] = 'SKIP' THEN
            skip := true;
        ELSIF args[i] LIKE 'ignore=%' THEN
            ignore_arg := substr(args[i], 8);
        ELSIF args[i] LIKE 'pkey=%' THEN
            pkey_arg := substr(args[i], 6);
        ELSIF args[i] = 'backup' THEN
            backup := true;
        ELSIF args[i] = 'deny' THEN
            deny := true;
        ELSIF split_part(args[i], '=', 1) = ANY (fields) AND position('=' IN args[i]) > 0 THEN
            IF opc = 'R' THEN
                RAISE EXCEPTION 'Custom expressions do not make sense for truncater trigger';
            END IF;
            name := split_part(args[i], '=', 1);
            exprs[array_position(fields, name)] := substr(args[i], length(name) + 2);
        ELSE
            RAISE EXCEPTION 'bad param to pgq trigger';
        END IF;
    END LOOP;
    IF opc = 'R' AND ignore_arg IS NOT NULL THEN
        RAISE EXCEPTION 'Column ignore does not make sense for truncate trigger';
    ELSIF opc = 'R' AND pkey_arg IS NOT NULL THEN
        RAISE EXCEPTION 'Custom pkey_list does not make sense for truncate trigger';
    ELSIF opc = 'R' AND backup THEN
        RAISE EXCEPTION 'Backup does not make sense for truncate trigger';
    END IF;

    -- the table's primary key and its columns, in one look at the catalog: magic columns
    -- (_pgq_ev_*) and ignored ones are not data; keys
    ignore_names := regexp_split_to_array(ignore_arg, '[\s,]+');
    SELECT k.names, c.cols, c.types, c.skipped, c.is_pkey, c.magic INTO table_pkey, cols, types, skipped, is_pkey, magic
      FROM (SELECT coalesce(array_agg(k.attname::text ORDER BY k.attnum), '{}') AS names
              FROM pg_index i JOIN pg_attribute k ON k.attrelid = i.indexrelid
             WHERE i.indrelid = relid AND i.indisprimary AND k.attnum > 0 AND NOT k.attisdropped) k,
           LATERAL (SELECT array_agg(a.attname::text ORDER BY a.attnum) AS cols,
                           array_agg(a.atttypid::regtype ORDER BY a.attnum) AS types,
                           array_agg(a.attname LIKE '\_pgq\_ev\_%' OR a.attname::text = ANY (coalesce(ignore_names, '{}'))
                                     ORDER BY a.attnum) AS skipped,
                           array_agg(a.attname NOT LIKE '\_pgq\_ev\_%'
                                     AND a.attname::text = ANY (coalesce(regexp_split_to_array(pkey_arg, '[\s,]+'), k.names))
                                     ORDER BY a.attnum) AS is_pkey,
                           coalesce(bool_or(a.attname LIKE '\_pgq\_ev\_%'), false) AS magic
                      FROM pg_attribute a WHERE a.attrelid = relid AND a.attnum > 0 AND NOT a.attisdropped) c;
    IF opc IN ('U', 'D') AND coalesce(pkey_arg, array_to_string(table_pkey, ',')) = '' THEN
        RAISE EXCEPTION 'Update/Delete on table without pkey';
    END IF;
    IF skip AND tg_when = 'AFTER' THEN
        RAISE EXCEPTION 'SKIP does not work in AFTER trigger.';
    END IF;
    IF deny THEN
        RAISE EXCEPTION 'Table ''%'' to queue ''%'': change not allowed (%)', tbl, qname, op;
    END IF;

    -- (an IF, not 0001's CASE: the JSON branch's subquery made every kind run a query)
    IF kind = 'json' THEN
        ev[1] := format('{"op":"%s","table":[%s,%s],"pkey":[%s]}', op, to_json(tschema), to_json(tname),
                        coalesce((SELECT string_agg(to_json(k)::text, ',' ORDER BY n)
                                    FROM unnest(coalesce(string_to_array(pkey_arg, ','), table_pkey))
                                         WITH ORDINALITY AS x(k, n)), ''));
    ELSIF kind = 'logu' THEN
        ev[1] := opc || CASE WHEN opc = 'R' THEN '' ELSE ':' || coalesce(pkey_arg, array_to_string(table_pkey, ',')) END;
    ELSE
        ev[1] := opc;
    END IF;
    IF opc = 'R' THEN
        ev[2] := CASE kind WHEN 'json' THEN '{}' ELSE '' END;
        PERFORM pgq.insert_event(qname, ev[1], ev[2], ev[3], ev[4], ev[5], ev[6]);
        RETURN skip;
    END IF;

    -- the values as text, where the SQL fragment or magic columns need them (the JSON
    -- and urlencoded data come from the row in one step, pgq._encode_row)
    IF kind = 'sql' OR magic THEN
        IF opc <> 'I' THEN
            old_vals := pgq._row_values(cols, types, old_row);
        END IF;
        IF opc <> 'D' THEN
            new_vals := pgq._row_values(cols, types, new_row);
        END IF;
        row_vals := CASE WHEN opc = 'D' THEN old_vals ELSE new_vals END;
    END IF;

    IF opc = 'U' THEN
        changed := pgq._row_changed(cols, old_row, new_row);
        IF backup THEN
            ev[4] := pgq._encode_row(CASE WHEN kind = 'json' THEN 'json' ELSE 'logu' END, cols, types, skipped, old_row);
        END IF;
    END IF;

    IF kind = 'sql' THEN
        ev[2] := pgq._sql_fragment(opc, cols, skipped, is_pkey, changed, old_vals, new_vals);
        IF ev[2] IS NULL THEN
            RETURN skip;  -- only ignored columns changed
        END IF;
    ELSE
        IF opc = 'U' THEN
            -- keys must not change; with ignore=, a change of ignored columns only is none
            wanted := NULL;
            FOR i IN 1 .. cardinality(cols) LOOP
                CONTINUE WHEN (NOT is_pkey[i] AND ignore_arg IS NULL) OR NOT changed[i];
                IF is_pkey[i] THEN
                    RAISE EXCEPTION 'primary key update not allowed';
                ELSIF skipped[i] THEN
                    ignored := ignored + 1;
                ELSE
                    wanted := true;
                    EXIT;
                END IF;
            END LOOP;
            IF NOT coalesce(wanted, ignored = 0) THEN
                RETURN skip;
            END IF;
        END IF;
        ev[2] := pgq._encode_row(kind, cols, types, skipped, CASE WHEN opc = 'D' THEN old_row ELSE new_row END);
    END IF;

    -- fields from the magic columns, then from the expressions
    FOR i IN 1 .. cardinality(cols) LOOP
        CONTINUE WHEN cols[i] NOT LIKE '\_pgq\_ev\_%';
        IF substr(cols[i], 6) <> ALL (fields[1:6]) THEN
            RAISE EXCEPTION 'Unknown magic column: %', cols[i];
        END IF;
        ev[array_position(fields, substr(cols[i], 6))] := row_vals[i];
    END LOOP;
    FOR f IN 1 .. 7 LOOP
        CONTINUE WHEN exprs[f] IS NULL;
        EXECUTE 'SELECT pg_typeof(v)::oid, num_nulls(v) = 1, format(''%s'', v) FROM (SELECT (' || exprs[f]
                || ') AS v FROM (SELECT $1.*) r) x'
           INTO typ, is_null, val USING CASE WHEN opc = 'D' THEN old_row ELSE new_row END;
        IF f < 7 THEN
            ev[f] := CASE WHEN is_null THEN NULL ELSE val END;
        ELSIF typ <> 'boolean'::regtype THEN
            RAISE EXCEPTION 'when= query result must be boolean, got=%', typ;
        ELSIF is_null THEN
            RAISE EXCEPTION 'when= should not be NULL';
        ELSIF val = 'f' THEN
            RETURN skip;
        END IF;
    END LOOP;

    PERFORM pgq.insert_event(qname, ev[1], ev[2], ev[3], ev[4], ev[5], ev[6]);
    RETURN skip;
END $$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgq FROM PUBLIC;

DO $$
BEGIN
    GRANT EXECUTE ON FUNCTION pgq._json_text_types(), pgq._row_values(text[], regtype[], anyelement),
        pgq._json_value_text(json, regtype), pgq._json_value_json(json, regtype),
        pgq._encode_row(text, text[], regtype[], boolean[], anyelement) TO conveyor_writer;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: roles missing, grants skipped (%)', SQLERRM;
END $$;
