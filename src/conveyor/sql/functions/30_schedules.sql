-- Schedules (core/schedules.py).
--
-- Current definitions, re-applied whenever a file of this folder changes (docs/architecture.md,
-- "Where each SQL function's current definition lives"). Edit a function here; tables, types,
-- indexes, data and DROPs go in a new numbered migration.

CREATE OR REPLACE FUNCTION conveyor._schedule_name_check(schedule_name text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF schedule_name IS NULL OR schedule_name !~ '^[A-Za-z0-9_-][A-Za-z0-9_.:-]{0,127}$' THEN
        PERFORM conveyor._raise('CVV01', format(
            'invalid schedule name %s: use 1 to 128 characters of A-Z, a-z, 0-9 and _ - . :, not starting with a dot',
            coalesce(quote_literal(left(schedule_name, 130)), 'NULL')));
    END IF;
END $$;

CREATE OR REPLACE FUNCTION conveyor._schedule(schedule_name text, lock boolean DEFAULT false) RETURNS conveyor.schedules
LANGUAGE plpgsql AS $$
DECLARE
    s conveyor.schedules;
BEGIN
    IF lock THEN
        SELECT * INTO s FROM conveyor.schedules WHERE name = schedule_name FOR UPDATE;
    ELSE
        SELECT * INTO s FROM conveyor.schedules WHERE name = schedule_name;
    END IF;
    IF NOT FOUND THEN
        PERFORM conveyor._raise('CVC01', format('schedule %s does not exist',
                                                coalesce(quote_literal(left(schedule_name, 130)), 'NULL')));
    END IF;
    RETURN s;
END $$;

CREATE OR REPLACE FUNCTION conveyor._schedule_text(spec jsonb, key text, max_length integer) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v jsonb := spec -> key;
BEGIN
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(v) <> 'string' OR length(v #>> '{}') > max_length THEN
        PERFORM conveyor._raise('CVV01', format('%s must be a string of at most %s characters', key, max_length));
    END IF;
    RETURN v #>> '{}';
END $$;

-- Applies a specification (a JSON object; keys absent keep their value) to a schedule
-- row, then decides its next fire time: the given next_fire_at is taken when the row is
-- new, its expression changed, or it is resumed; otherwise the stored one stays, so
-- re-applying the same configuration (an idempotent PUT) never moves a schedule.
CREATE OR REPLACE FUNCTION conveyor._schedule_apply(s conveyor.schedules, spec jsonb, is_new boolean)
RETURNS conveyor.schedules
LANGUAGE plpgsql AS $$
DECLARE
    old conveyor.schedules := s;
    key text;
    v text;
BEGIN
    IF spec IS NULL OR jsonb_typeof(spec) <> 'object' THEN
        PERFORM conveyor._raise('CVV01', 'a schedule specification must be a JSON object');
    END IF;
    FOR key IN SELECT jsonb_object_keys(spec) LOOP
        IF key NOT IN ('expression', 'cron', 'timezone', 'fire_at', 'target_kind', 'target', 'body',
                       'content_type', 'headers', 'group_id', 'status', 'catchup', 'catchup_limit',
                       'failure_threshold', 'next_fire_at') THEN
            PERFORM conveyor._raise('CVV01', format('unknown schedule field %s', quote_literal(left(key, 100))));
        END IF;
    END LOOP;

    -- the expression: a cron (with its time zone) or one instant
    IF spec ? 'cron' AND jsonb_typeof(spec -> 'cron') <> 'null'
       AND spec ? 'fire_at' AND jsonb_typeof(spec -> 'fire_at') <> 'null' THEN
        PERFORM conveyor._raise('CVV01', 'give either cron or fire_at, not both');
    END IF;
    v := conveyor._schedule_text(spec, 'cron', 200);
    IF v IS NOT NULL THEN
        IF v !~ '^\S+( \S+){4}$' THEN
            PERFORM conveyor._raise('CVV01', format(
                'cron %s must have five fields separated by single spaces (minute hour day-of-month month day-of-week)',
                quote_literal(v)));
        END IF;
        s.cron := v;
        s.fire_at := NULL;
    END IF;
    IF spec ? 'fire_at' AND jsonb_typeof(spec -> 'fire_at') <> 'null' THEN
        s.fire_at := conveyor._schedule_text(spec, 'fire_at', 100)::timestamptz;
        s.cron := NULL;
    END IF;
    IF s.cron IS NULL AND s.fire_at IS NULL THEN
        PERFORM conveyor._raise('CVV01', 'a schedule needs a cron expression or a fire_at instant');
    END IF;
    IF spec ? 'timezone' THEN
        s.timezone := coalesce(conveyor._schedule_text(spec, 'timezone', 64), 'UTC');
        BEGIN
            PERFORM now() AT TIME ZONE s.timezone;
        EXCEPTION WHEN invalid_parameter_value THEN
            PERFORM conveyor._raise('CVV01', format('unknown time zone %s', quote_literal(s.timezone)));
        END;
    END IF;
    IF spec ? 'expression' AND jsonb_typeof(spec -> 'expression') <> 'null' THEN
        IF jsonb_typeof(spec -> 'expression') <> 'object' THEN
            PERFORM conveyor._raise('CVV01', 'expression must be a JSON object (what the schedule was written as)');
        END IF;
        s.expression := spec -> 'expression';
    ELSIF spec ? 'cron' OR spec ? 'fire_at' OR spec ? 'timezone' OR s.expression IS NULL THEN
        s.expression := jsonb_strip_nulls(jsonb_build_object('cron', s.cron, 'fire_at', s.fire_at,
                                                             'timezone', nullif(s.timezone, 'UTC')));
    END IF;

    -- the target and the message
    IF spec ? 'target_kind' THEN
        s.target_kind := conveyor._schedule_text(spec, 'target_kind', 10);
        IF s.target_kind IS NULL OR s.target_kind NOT IN ('queue', 'topic') THEN
            PERFORM conveyor._raise('CVV01', 'target_kind must be queue or topic');
        END IF;
    END IF;
    IF spec ? 'target' THEN
        s.target := conveyor._schedule_text(spec, 'target', 256);
    END IF;
    IF s.target IS NULL OR s.target !~ '^[!-~]+$' OR length(s.target) > 256 THEN
        PERFORM conveyor._raise('CVV01', 'a schedule needs a target (a queue name or a topic routing key) of 1 to 256 printable ASCII characters without spaces');
    END IF;
    IF s.target_kind = 'queue' THEN
        PERFORM conveyor._name_check(s.target);
    END IF;
    IF spec ? 'body' THEN
        s.body := conveyor._schedule_text(spec, 'body', 1048576);
    END IF;
    IF s.body IS NULL OR octet_length(s.body) > 1048576 THEN
        PERFORM conveyor._raise('CVV01', 'a schedule''s message body is required and at most 1 MiB');
    END IF;
    IF spec ? 'content_type' THEN
        s.content_type := nullif(conveyor._schedule_text(spec, 'content_type', 200), '');
    END IF;
    IF s.content_type = 'application/json' THEN
        -- JSON bodies are handed out as they are stored (REST embeds them unparsed)
        BEGIN
            PERFORM s.body::jsonb;
        EXCEPTION WHEN invalid_text_representation THEN
            PERFORM conveyor._raise('CVV01', 'a body with content type application/json must be valid JSON');
        END;
    END IF;
    IF spec ? 'headers' THEN
        s.headers := CASE WHEN jsonb_typeof(spec -> 'headers') = 'null' THEN NULL ELSE spec -> 'headers' END;
        IF s.headers IS NOT NULL AND jsonb_typeof(s.headers) <> 'object' THEN
            PERFORM conveyor._raise('CVV01', 'headers must be a JSON object');
        END IF;
        IF s.headers ? '_schedule' THEN
            PERFORM conveyor._raise('CVV01', 'the header _schedule is set by the scheduler on every fired message');
        END IF;
        IF s.headers = '{}' THEN
            s.headers := NULL;
        END IF;
    END IF;
    IF spec ? 'group_id' THEN
        s.group_id := conveyor._schedule_text(spec, 'group_id', 128);
        IF s.group_id !~ '^[!-~]{1,128}$' THEN
            PERFORM conveyor._raise('CVV01', 'group_id is 1 to 128 printable ASCII characters');
        END IF;
    END IF;

    -- behaviour
    IF spec ? 'status' THEN
        s.status := conveyor._schedule_text(spec, 'status', 10);
        IF s.status IS NULL OR s.status NOT IN ('active', 'paused') THEN
            PERFORM conveyor._raise('CVV01', 'status must be active or paused');
        END IF;
    END IF;
    IF spec ? 'catchup' THEN
        s.catchup := coalesce(conveyor._bool_attr(spec, 'catchup'), false);
    END IF;
    IF spec ? 'catchup_limit' THEN
        s.catchup_limit := coalesce(conveyor._int_attr(spec, 'catchup_limit', 1, 1000), 10);
    END IF;
    IF spec ? 'failure_threshold' THEN
        s.failure_threshold := coalesce(conveyor._int_attr(spec, 'failure_threshold', 1, 1000), 5);
    END IF;

    -- the next fire time
    IF is_new OR s.cron IS DISTINCT FROM old.cron OR s.timezone IS DISTINCT FROM old.timezone
       OR s.fire_at IS DISTINCT FROM old.fire_at
       OR (old.status = 'paused' AND s.status = 'active') THEN
        s.next_fire_at := coalesce(conveyor._schedule_text(spec, 'next_fire_at', 100)::timestamptz, s.fire_at);
        IF NOT is_new AND old.status = 'paused' AND s.status = 'active' THEN
            s.consecutive_failures := 0;
        END IF;
    END IF;
    RETURN s;
END $$;

-- A new row with the defaults, before a specification is applied.
CREATE OR REPLACE FUNCTION conveyor._schedule_defaults(schedule_name text) RETURNS conveyor.schedules
LANGUAGE plpgsql AS $$
DECLARE
    s conveyor.schedules;
BEGIN
    PERFORM conveyor._schedule_name_check(schedule_name);
    s.name := schedule_name;
    s.timezone := 'UTC';
    s.target_kind := 'queue';
    s.body := '{}';
    s.status := 'active';
    s.catchup := false;
    s.catchup_limit := 10;
    s.failure_threshold := 5;
    s.consecutive_failures := 0;
    s.fire_count := 0;
    RETURN s;
END $$;

CREATE OR REPLACE FUNCTION conveyor._schedule_insert(s conveyor.schedules) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO conveyor.schedules (name, expression, cron, timezone, fire_at, target_kind, target, body,
                                    content_type, headers, group_id, status, catchup, catchup_limit,
                                    failure_threshold, next_fire_at)
    VALUES (s.name, s.expression, s.cron, s.timezone, s.fire_at, s.target_kind, s.target, s.body,
            s.content_type, s.headers, s.group_id, s.status, s.catchup, s.catchup_limit,
            s.failure_threshold, s.next_fire_at)
$$;

-- Stores a changed configuration; updated_at moves only if something did change.
CREATE OR REPLACE FUNCTION conveyor._schedule_store(s conveyor.schedules, old conveyor.schedules) RETURNS void
LANGUAGE sql AS $$
    UPDATE conveyor.schedules t
       SET expression = s.expression, cron = s.cron, timezone = s.timezone, fire_at = s.fire_at,
           target_kind = s.target_kind, target = s.target, body = s.body, content_type = s.content_type,
           headers = s.headers, group_id = s.group_id, status = s.status, catchup = s.catchup,
           catchup_limit = s.catchup_limit, failure_threshold = s.failure_threshold,
           consecutive_failures = s.consecutive_failures, next_fire_at = s.next_fire_at,
           updated_at = CASE WHEN (s.expression, s.cron, s.timezone, s.fire_at, s.target_kind, s.target, s.body,
                                   s.content_type, s.headers, s.group_id, s.status, s.catchup, s.catchup_limit,
                                   s.failure_threshold)
                                  IS DISTINCT FROM
                                  (old.expression, old.cron, old.timezone, old.fire_at, old.target_kind, old.target,
                                   old.body, old.content_type, old.headers, old.group_id, old.status, old.catchup,
                                   old.catchup_limit, old.failure_threshold)
                             THEN now() ELSE t.updated_at END
     WHERE t.id = s.id
$$;

-- Creates a schedule; CVC02 if the name is taken. `spec` keys: cron + timezone, or
-- fire_at; expression (as written); target_kind ('queue' or 'topic'), target; body,
-- content_type, headers, group_id (FIFO queues; default the schedule's name); status;
-- catchup, catchup_limit, failure_threshold; next_fire_at (NULL for a cron: computed by
-- the scheduler's next pass; a one-shot fires at fire_at).
CREATE OR REPLACE FUNCTION conveyor.schedule_create(schedule_name text, spec jsonb) RETURNS SETOF conveyor.schedules
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.schedules := conveyor._schedule_apply(conveyor._schedule_defaults(schedule_name), spec, true);
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('conveyor.schedule:' || schedule_name));
    IF EXISTS (SELECT 1 FROM conveyor.schedules t WHERE t.name = schedule_name) THEN
        PERFORM conveyor._raise('CVC02', format('schedule %s already exists', quote_literal(schedule_name)));
    END IF;
    PERFORM conveyor._schedule_insert(s);
    RETURN QUERY SELECT * FROM conveyor.schedules t WHERE t.name = schedule_name;
END $$;

-- Creates or replaces a schedule's whole configuration (keys absent take their
-- defaults, except status: left out, a schedule stays active or paused as it is). Its
-- state (failures, fire count, next fire time) survives a replacement that keeps the
-- expression. Returns true if the schedule was created.
CREATE OR REPLACE FUNCTION conveyor.schedule_upsert(schedule_name text, spec jsonb) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    fresh conveyor.schedules := conveyor._schedule_defaults(schedule_name);
    old conveyor.schedules;
    s conveyor.schedules;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('conveyor.schedule:' || schedule_name));
    SELECT * INTO old FROM conveyor.schedules t WHERE t.name = schedule_name FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM conveyor._schedule_insert(conveyor._schedule_apply(fresh, spec, true));
        RETURN true;
    END IF;
    -- the defaults, with the old row's identity and state (so _schedule_apply compares
    -- the new expression and status with the old ones)
    fresh.id := old.id;
    fresh.expression := NULL;
    fresh.cron := old.cron;
    fresh.timezone := old.timezone;
    fresh.fire_at := old.fire_at;
    fresh.status := old.status;
    fresh.consecutive_failures := old.consecutive_failures;
    fresh.next_fire_at := old.next_fire_at;
    IF NOT (spec ? 'timezone') THEN
        spec := spec || '{"timezone": null}';
    END IF;
    s := conveyor._schedule_apply(fresh, spec, false);
    PERFORM conveyor._schedule_store(s, old);
    RETURN false;
END $$;

-- Changes some fields of a schedule (keys absent keep their value).
CREATE OR REPLACE FUNCTION conveyor.schedule_alter(schedule_name text, spec jsonb) RETURNS SETOF conveyor.schedules
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    old conveyor.schedules := conveyor._schedule(schedule_name, true);
BEGIN
    PERFORM conveyor._schedule_store(conveyor._schedule_apply(old, spec, false), old);
    RETURN QUERY SELECT * FROM conveyor.schedules t WHERE t.name = schedule_name;
END $$;

CREATE OR REPLACE FUNCTION conveyor.schedule_pause(schedule_name text) RETURNS SETOF conveyor.schedules
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT * FROM conveyor.schedule_alter(schedule_name, '{"status": "paused"}')
$$;

-- Resumes a paused schedule from `next_fire_at` (NULL: a cron's next time is computed by
-- the scheduler's next pass; a one-shot fires at its fire_at, at once if that is past).
-- Missed fires of the pause are not caught up. Its failure count starts again at 0.
CREATE OR REPLACE FUNCTION conveyor.schedule_resume(schedule_name text, next_fire_at timestamptz DEFAULT NULL)
RETURNS SETOF conveyor.schedules
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT * FROM conveyor.schedule_alter(schedule_name, jsonb_build_object('status', 'active',
                                                                            'next_fire_at', next_fire_at))
$$;

-- Deletes a schedule. Returns false if it did not exist.
CREATE OR REPLACE FUNCTION conveyor.schedule_drop(schedule_name text) RETURNS boolean
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    WITH gone AS (DELETE FROM conveyor.schedules t WHERE t.name = schedule_name RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM gone)
$$;

CREATE OR REPLACE FUNCTION conveyor.schedule_get(schedule_name text) RETURNS SETOF conveyor.schedules
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
BEGIN
    RETURN NEXT conveyor._schedule(schedule_name);
END $$;

-- Schedules by name, filtered by status, target kind and name prefix (NULL: any), at
-- most max_rows of them.
CREATE OR REPLACE FUNCTION conveyor.schedule_list(status text DEFAULT NULL, target_kind text DEFAULT NULL,
                                       name_prefix text DEFAULT NULL, max_rows integer DEFAULT 1000)
RETURNS SETOF conveyor.schedules
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT * FROM conveyor.schedules t
     WHERE (schedule_list.status IS NULL OR t.status = schedule_list.status)
       AND (schedule_list.target_kind IS NULL OR t.target_kind = schedule_list.target_kind)
       AND (name_prefix IS NULL OR starts_with(t.name, name_prefix))
     ORDER BY t.name
     LIMIT greatest(coalesce(max_rows, 1000), 0)
$$;

-- Locks and returns up to max_rows active schedules due at `at`, oldest due first, those
-- without a next fire time before them; rows another scheduler holds are skipped.
CREATE OR REPLACE FUNCTION conveyor.schedule_claim(at timestamptz, max_rows integer DEFAULT 32)
RETURNS SETOF conveyor.schedules
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    n bigint;
BEGIN
    IF at IS NULL OR max_rows IS NULL OR max_rows < 1 OR max_rows > 10000 THEN
        PERFORM conveyor._raise('CVV01', 'schedule_claim needs an instant and max_rows from 1 to 10000');
    END IF;
    RETURN QUERY
    SELECT * FROM conveyor.schedules t
     WHERE t.status = 'active' AND t.next_fire_at IS NULL
     ORDER BY t.id LIMIT max_rows
       FOR UPDATE SKIP LOCKED;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n < max_rows THEN
        RETURN QUERY
        SELECT * FROM conveyor.schedules t
         WHERE t.status = 'active' AND t.next_fire_at <= at
         ORDER BY t.next_fire_at LIMIT max_rows - n
           FOR UPDATE SKIP LOCKED;
    END IF;
END $$;

-- Records a successful step: `fired` holds the intended times fired (may be empty when
-- only the first next_fire_at was computed). A one-shot that fired is deleted. Returns
-- 'advanced' or 'deleted'.
CREATE OR REPLACE FUNCTION conveyor.schedule_advance(schedule_name text, fired timestamptz[], next_fire_at timestamptz)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.schedules := conveyor._schedule(schedule_name, true);
    n integer := coalesce(cardinality(fired), 0);
BEGIN
    IF s.fire_at IS NOT NULL AND n > 0 THEN
        DELETE FROM conveyor.schedules t WHERE t.id = s.id;
        RETURN 'deleted';
    END IF;
    UPDATE conveyor.schedules t
       SET next_fire_at = schedule_advance.next_fire_at,
           fire_count = t.fire_count + n,
           last_fired_at = CASE WHEN n > 0 THEN (SELECT max(f) FROM unnest(fired) f) ELSE t.last_fired_at END,
           consecutive_failures = CASE WHEN n > 0 THEN 0 ELSE t.consecutive_failures END
     WHERE t.id = s.id;
    RETURN 'advanced';
END $$;

-- Records a failed step at `at`: one more consecutive failure, the error kept, the next
-- try at next_fire_at; at failure_threshold the schedule is paused. Returns the status.
CREATE OR REPLACE FUNCTION conveyor.schedule_failed(schedule_name text, error text, next_fire_at timestamptz,
                                         at timestamptz)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    s conveyor.schedules := conveyor._schedule(schedule_name, true);
    new_status text;
BEGIN
    UPDATE conveyor.schedules t
       SET consecutive_failures = t.consecutive_failures + 1,
           last_error = left(coalesce(error, 'unknown error'), 2000),
           last_error_at = at,
           next_fire_at = schedule_failed.next_fire_at,
           status = CASE WHEN t.consecutive_failures + 1 >= t.failure_threshold THEN 'paused' ELSE t.status END
     WHERE t.id = s.id
    RETURNING t.status INTO new_status;
    RETURN new_status;
END $$;

REVOKE ALL ON ALL ROUTINES IN SCHEMA conveyor FROM PUBLIC;
