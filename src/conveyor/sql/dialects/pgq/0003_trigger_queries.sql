-- Conveyor dialect pgq 0003: fewer executor steps per CDC trigger row.
--
-- Measured by the backend's CPU time (perf stat -e task-clock) over 3,000 single-row
-- INSERTs with pgq.logutriga on a four-column table, in a scratch database: 107 µs a row
-- with 0002, where the table's catalog query was 26 µs, the row's encoding 41 µs and
-- insert_event 25 µs; PgQ's C trigger is 17 µs in all. Here:
--   - the catalog query reads pg_attribute (and the primary key's columns) in attnum
--     order from their indexes once and aggregates them as read, where each of its six
--     ordered aggregates sorted the rows again (about 7 µs a row);
--   - the row's encoding zips the row's JSON with the column arrays (ROWS FROM, in
--     column order) instead of joining them on their ordinality and sorting the result,
--     and urlencodes only what needs it (a column name or value of [-_.A-Za-z0-9] is
--     its own encoding: no PL/pgSQL call; about 10 µs a row);
--   - the loops over magic columns and custom expressions run only when the table has
--     one or the trigger was given one.
-- Events are 0002's byte for byte (tests/dialects/test_pgq.py compares them with PgQ's
-- C triggers); docs/benchmarks.md has the end-to-end figures.

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
      FROM (SELECT coalesce(array_agg(k.attname::text), '{}') AS names
              FROM (SELECT k.attname FROM pg_index i JOIN pg_attribute k ON k.attrelid = i.indexrelid
                     WHERE i.indrelid = relid AND i.indisprimary AND k.attnum > 0 AND NOT k.attisdropped
                     ORDER BY k.attnum) k) k,
           LATERAL (SELECT array_agg(a.attname::text) AS cols,
                           array_agg(a.atttypid::regtype) AS types,
                           array_agg(a.attname LIKE '\_pgq\_ev\_%' OR a.attname::text = ANY (coalesce(ignore_names, '{}')))
                               AS skipped,
                           array_agg(a.attname NOT LIKE '\_pgq\_ev\_%'
                                     AND a.attname::text = ANY (coalesce(regexp_split_to_array(pkey_arg, '[\s,]+'), k.names)))
                               AS is_pkey,
                           coalesce(bool_or(a.attname LIKE '\_pgq\_ev\_%'), false) AS magic
                      FROM (SELECT a.attname, a.atttypid FROM pg_attribute a
                             WHERE a.attrelid = relid AND a.attnum > 0 AND NOT a.attisdropped
                             ORDER BY a.attnum) a) c;
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

    -- fields from the magic columns, then from the expressions (each loop only if any)
    IF magic THEN
        FOR i IN 1 .. cardinality(cols) LOOP
            CONTINUE WHEN cols[i] NOT LIKE '\_pgq\_ev\_%';
            IF substr(cols[i], 6) <> ALL (fields[1:6]) THEN
                RAISE EXCEPTION 'Unknown magic column: %', cols[i];
            END IF;
            ev[array_position(fields, substr(cols[i], 6))] := row_vals[i];
        END LOOP;
    END IF;
    IF num_nonnulls(VARIADIC exprs) > 0 THEN
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
    END IF;

    PERFORM pgq.insert_event(qname, ev[1], ev[2], ev[3], ev[4], ev[5], ev[6]);
    RETURN skip;
END $$;

-- The row's data as ev_data (0002's), zipped in column order.
CREATE OR REPLACE FUNCTION pgq._encode_row(kind text, cols text[], types regtype[], skipped boolean[], r anyelement)
RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT types::oid[] <@ pgq._json_text_types() THEN
        RETURN pgq._encode(kind, cols, skipped, CASE WHEN kind = 'json' THEN pgq._row_json(cols, types, r)
                                                     ELSE pgq._row_text(cols, r) END);
    END IF;
    IF kind = 'json' THEN
        RETURN (SELECT '{' || coalesce(string_agg(to_json(t.col)::text || ':' || pgq._json_value_json(t.value, t.typ), ','),
                                       '') || '}'
                  FROM ROWS FROM (json_each(to_json(r)), unnest(cols), unnest(types), unnest(skipped))
                       AS t(key, value, col, typ, skip)
                 WHERE NOT t.skip);
    END IF;
    RETURN (SELECT coalesce(string_agg(CASE WHEN t.col !~ '[^-_.A-Za-z0-9]' THEN t.col ELSE pgq._urlencode(t.col) END
                                       || coalesce('=' || CASE WHEN t.v !~ '[^-_.A-Za-z0-9]' THEN t.v
                                                               ELSE pgq._urlencode(t.v) END, ''),
                                       '&'), '')
              FROM (SELECT x.col, pgq._json_value_text(x.value, x.typ) AS v
                      FROM ROWS FROM (json_each(to_json(r)), unnest(cols), unnest(types), unnest(skipped))
                           AS x(key, value, col, typ, skip)
                     WHERE NOT x.skip
                    OFFSET 0) t);
END $$;
