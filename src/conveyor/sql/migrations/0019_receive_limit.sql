-- Conveyor 0019: no message is delivered more often than its queue's max_receive_count
-- (issue 25).
--
-- Until now a claim on a queue with max_receive_count picked its candidates twice: a
-- first statement locked the oldest visible messages and dead-lettered those that had
-- reached the limit, and a second picked the oldest visible messages again, without the
-- check, and delivered them. When the first pick held messages that had to leave, the
-- second reached further and delivered messages past the limit: with max_receive_count 1,
-- ids 1-4 received and expired, 5-6 fresh, a receive of 4 moved 1 and 2 to the
-- dead-letter queue and delivered 5, 6, and 3 and 4 a second time. (FIFO and grouped
-- receives checked the chosen groups in one statement and claimed in another, with a
-- snapshot of their own: narrower, but the same split.)
--
-- Now the claim locks its candidates once (FOR UPDATE SKIP LOCKED, in the claim's order)
-- and splits that same set: those that reached the limit leave (to the dead-letter queue,
-- else to the archive as failed), the others are delivered, by primary key (0017). While
-- messages left and the receive is short, it picks again after what it has taken, at
-- most ten times (a backlog of over-limit messages is moved at most that many picks
-- per receive, the rest by the next receives; none is ever delivered). Queues without
-- max_receive_count claim in one statement, as before. pop, pgmq's read and pop and SQS's
-- ReceiveRequestAttemptId run this claim; the FIFO and grouped claims split their
-- candidates the same way since migration 0020, which rewrites them (for their cost
-- under a backlog). tests/sql/test_receive_limits.py checks every path against random
-- mixes of batch sizes, expired and fresh messages.
--
-- The reason recorded for a message that leaves is also in plain English now
-- ("reached max_receive_count (1 receive)"; it said "received more than 1 times").

CREATE FUNCTION conveyor._receive_limit_reason(max_receive_count integer) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format('reached max_receive_count (%s %s)', max_receive_count,
                  CASE WHEN max_receive_count = 1 THEN 'receive' ELSE 'receives' END)
$$;

-- Claims up to qty visible messages of a standard queue, oldest visible first.
CREATE OR REPLACE FUNCTION conveyor._claim(q conveyor.queues, vt_seconds integer, qty integer)
RETURNS SETOF conveyor.messages
LANGUAGE plpgsql AS $$
DECLARE
    ts timestamptz := clock_timestamp();
    wanted integer := qty;
    taken bigint[] := '{}';
    picked bigint[];
    expired bigint[];
    n integer;
BEGIN
    IF q.max_receive_count IS NULL THEN
        RETURN QUERY
        UPDATE conveyor.messages m
           SET vt = ts + make_interval(secs => vt_seconds),
               receive_count = m.receive_count + 1,
               first_received_at = coalesce(m.first_received_at, ts)
         WHERE m.queue_id = q.id
           AND m.id = ANY (ARRAY(SELECT c.id FROM conveyor.messages c
                                  WHERE c.queue_id = q.id AND c.vt <= ts
                                  ORDER BY c.vt, c.id LIMIT qty
                                  FOR UPDATE SKIP LOCKED))
        RETURNING m.*;
        RETURN;
    END IF;
    FOR i IN 1 .. 10 LOOP  -- at most ten picks (above)
        -- the candidates, locked once: the same set is split and claimed
        SELECT array_agg(c.id) FILTER (WHERE c.receive_count < q.max_receive_count),
               array_agg(c.id) FILTER (WHERE c.receive_count >= q.max_receive_count)
          INTO picked, expired
          FROM (SELECT m.id, m.receive_count FROM conveyor.messages m
                 WHERE m.queue_id = q.id AND m.vt <= ts AND m.id <> ALL (taken)
                 ORDER BY m.vt, m.id LIMIT wanted
                 FOR UPDATE SKIP LOCKED) c;
        IF expired IS NOT NULL THEN
            PERFORM conveyor._dead_letter(q, expired, conveyor._receive_limit_reason(q.max_receive_count));
        END IF;
        IF picked IS NOT NULL THEN
            RETURN QUERY
            UPDATE conveyor.messages m
               SET vt = ts + make_interval(secs => vt_seconds),
                   receive_count = m.receive_count + 1,
                   first_received_at = coalesce(m.first_received_at, ts)
             WHERE m.queue_id = q.id AND m.id = ANY (picked)
            RETURNING m.*;
            GET DIAGNOSTICS n = ROW_COUNT;
            wanted := wanted - n;
            taken := taken || picked;  -- claimed with vt 0, they are visible again
        END IF;
        EXIT WHEN expired IS NULL OR wanted <= 0;
    END LOOP;
END $$;

REVOKE ALL ON FUNCTION conveyor._receive_limit_reason(integer) FROM PUBLIC;
