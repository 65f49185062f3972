-- Conveyor 0018: a send draws one random value per statement for its MessageIds, not one
-- per message.
--
-- Every message carries a UUID (SQS's MessageId, hq's message id), which the column
-- default drew with gen_random_uuid(): about 1 µs a message in PostgreSQL 15 with
-- OpenSSL 3 (a call into the provider's random source per UUID, perf shows it in
-- libcrypto and strcmp), a quarter of the server time of a batched send into a queue
-- (docs/benchmarks.md, "Dialects against the real peers"). Here a send draws one UUID
-- per call, the seed, and each message's UUID is the seed's first 80 bits (version and
-- variant kept) followed by its 48-bit id XORed with the seed's last 48: 0.3 µs a message.
-- The ids of one queue's statement are distinct, so are its UUIDs; two statements share
-- none unless their seeds agree in 74 random bits. A UUID given by the caller (the
-- failover spool's, a dead letter's) is kept as before, and the column default stays for
-- every other insert (a topic's fan-out, a few rows per publish).

CREATE FUNCTION conveyor._message_uuid(seed text, id bigint) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (left(seed, 24)
            || lpad(to_hex((id # ('x' || right(seed, 12))::bit(48)::bigint) & 281474976710655), 12, '0'))::uuid
$$;

REVOKE ALL ON FUNCTION conveyor._message_uuid(text, bigint) FROM PUBLIC;

-- 0001's conveyor._send with the statement's seed; nothing else changes. The standard
-- insert draws its ids in a subquery ordered by input position (volatile expressions
-- are evaluated after the sort), so that the UUID can be made from the id.
CREATE OR REPLACE FUNCTION conveyor._send(q conveyor.queues, messages jsonb) RETURNS SETOF conveyor.sent
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
    m record;
    mid bigint;
    muid uuid;
    did text;
    ts timestamptz := now();
    seed text := gen_random_uuid()::text;
BEGIN
    IF messages IS NULL OR jsonb_typeof(messages) <> 'array' THEN
        PERFORM conveyor._raise('CVV01', 'messages must be a JSON array of message objects');
    END IF;
    n := jsonb_array_length(messages);
    IF n = 0 THEN
        PERFORM conveyor._raise('CVV01', 'no messages to send');
    END IF;
    IF n > 10000 THEN
        PERFORM conveyor._raise('CVV01', format('a batch holds at most 10000 messages, got %s', n));
    END IF;

    IF NOT q.fifo THEN
        -- a group id on a standard queue is kept (SQS fair queues) but orders nothing;
        -- ids are drawn in input order
        RETURN QUERY
        INSERT INTO conveyor.messages AS t (queue_id, id, vt, sent_at, body, content_type, headers,
                                            group_id, message_uuid, sender_id, system_attributes)
        SELECT q.id, s.id, ts + make_interval(secs => coalesce(s.delay, q.delay_seconds)), ts,
               s.body, s.content_type, s.headers, s.group_id,
               coalesce(s.message_uuid, conveyor._message_uuid(seed, s.id)), s.sender_id, s.system_attributes
          FROM (SELECT nextval(q.seq) AS id, x.*
                  FROM ROWS FROM (jsonb_to_recordset(messages)
                                  AS (body text, headers jsonb, delay integer, content_type text, group_id text,
                                      dedup_id text, message_uuid uuid, sender_id text, system_attributes jsonb))
                       WITH ORDINALITY AS x(body, headers, delay, content_type, group_id, dedup_id, message_uuid,
                                            sender_id, system_attributes, ord)
                 WHERE conveyor._message_ok(q, x.body, x.headers, x.delay, x.system_attributes, x.dedup_id)
                 ORDER BY x.ord) s
        RETURNING t.id, t.message_uuid;
        RETURN;
    END IF;

    FOR m IN SELECT * FROM ROWS FROM (jsonb_to_recordset(messages)
                                      AS (body text, headers jsonb, delay integer, content_type text,
                                          group_id text, dedup_id text, message_uuid uuid, sender_id text,
                                          system_attributes jsonb))
                           WITH ORDINALITY AS x(body, headers, delay, content_type, group_id, dedup_id,
                                                message_uuid, sender_id, system_attributes, ord)
             ORDER BY x.ord LOOP
        PERFORM conveyor._message_ok(q, m.body, m.headers, m.delay, m.system_attributes, NULL);
        IF m.group_id IS NULL OR m.group_id !~ '^[!-~]{1,128}$' THEN
            PERFORM conveyor._raise('CVV01', 'a FIFO message needs a group_id of 1 to 128 printable ASCII characters');
        END IF;
        IF m.delay IS NOT NULL AND m.delay <> 0 THEN
            PERFORM conveyor._raise('CVV01', 'FIFO queues take no per-message delay; set the queue''s delay_seconds instead');
        END IF;
        did := coalesce(m.dedup_id,
                        CASE WHEN q.content_based_deduplication THEN encode(sha256(convert_to(m.body, 'UTF8')), 'hex') END);
        IF did IS NULL THEN
            PERFORM conveyor._raise('CVV01', 'a FIFO message needs a dedup_id unless the queue has content_based_deduplication');
        END IF;
        IF did !~ '^[!-~]{1,128}$' THEN
            PERFORM conveyor._raise('CVV01', 'a dedup_id is 1 to 128 printable ASCII characters');
        END IF;
        mid := nextval(q.seq);
        muid := coalesce(m.message_uuid, conveyor._message_uuid(seed, mid));
        INSERT INTO conveyor.dedup AS d (queue_id, dedup_id, message_id, message_uuid, expires_at)
        VALUES (q.id, did, mid, muid, ts + interval '5 minutes')
        ON CONFLICT (queue_id, dedup_id) DO UPDATE
           SET message_id = excluded.message_id, message_uuid = excluded.message_uuid,
               expires_at = excluded.expires_at
         WHERE d.expires_at <= ts
        RETURNING d.message_id INTO mid;
        IF mid IS NULL THEN
            -- a duplicate within the window: accepted, not stored again, answered as the first
            RETURN QUERY SELECT d.message_id, d.message_uuid
                           FROM conveyor.dedup d WHERE d.queue_id = q.id AND d.dedup_id = did;
            CONTINUE;
        END IF;
        -- DO UPDATE, not DO NOTHING: it locks the group row, so a concurrent clean-up
        -- cannot delete the group between this insert and the message's
        INSERT INTO conveyor.message_groups AS g (queue_id, group_id) VALUES (q.id, m.group_id)
        ON CONFLICT (queue_id, group_id) DO UPDATE SET group_id = excluded.group_id;
        INSERT INTO conveyor.messages (queue_id, id, vt, sent_at, body, content_type, headers, group_id,
                                       dedup_id, message_uuid, sender_id, system_attributes)
        VALUES (q.id, mid, ts + make_interval(secs => q.delay_seconds), ts, m.body, m.content_type,
                m.headers, m.group_id, did, muid, m.sender_id, m.system_attributes);
        RETURN NEXT ROW(mid, muid)::conveyor.sent;
    END LOOP;
END $$;
