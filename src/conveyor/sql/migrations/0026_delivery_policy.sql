-- SNS delivery policies for HTTP(S) subscriptions (issue 27, item 14). The retry schedule
-- was one fixed table in SQL (_delivery_backoff: 10 s, 30 s, 60 s, 300 s, five attempts);
-- now each delivery follows its subscription's effective DeliveryPolicy, which the server's
-- webhook worker reads (delivery_policies) and applies (core/delivery_policy.py): the delay
-- before the next attempt and the number of attempts are the worker's to say, and rows a
-- subscription's throttle holds back are deferred without counting an attempt.

-- numRetries goes up to 100: the first try and 100 retries.
ALTER TABLE conveyor.http_deliveries DROP CONSTRAINT http_deliveries_max_attempts_check;
ALTER TABLE conveyor.http_deliveries ADD CONSTRAINT http_deliveries_max_attempts_check
    CHECK (max_attempts BETWEEN 1 AND 101);
ALTER TABLE conveyor.http_deliveries ALTER COLUMN max_attempts SET DEFAULT 4;  -- SNS: the first try and 3 retries

-- The DeliveryPolicy texts (as stored) of the subscriptions and topics of claimed rows.
CREATE FUNCTION conveyor.delivery_policies(subscription_ids bigint[], topic_names text[])
RETURNS TABLE (subscription_id bigint, topic text, subscription_policy text, topic_policy text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
    SELECT s.id, x.topic, s.attributes ->> 'DeliveryPolicy', t.attributes ->> 'DeliveryPolicy'
      FROM unnest(subscription_ids, topic_names) AS x(subscription_id, topic)
      JOIN conveyor.subscriptions s ON s.id = x.subscription_id
      LEFT JOIN conveyor.topics t ON t.name = x.topic
$$;

-- An attempt failed: count it; the next one after retry_in seconds, out of attempts in all
-- (the first try included). The last attempt leaves the row exhausted, unless its
-- subscription's RedrivePolicy names a queue that exists (in default_region unless the ARN
-- says another, as the SQS layer stores names): then the body goes there, as SNS
-- dead-letters an HTTP(S) delivery whose policy is used up, and the row goes. A FIFO or
-- encrypted dead-letter queue keeps the row exhausted (no group to give it; sealing is the
-- server's).
DROP FUNCTION conveyor.delivery_failed(bigint, text);
DROP FUNCTION conveyor._delivery_backoff(integer);
CREATE FUNCTION conveyor.delivery_failed(delivery_id bigint, error text, retry_in double precision,
                                         attempts integer, default_region text DEFAULT NULL)
RETURNS SETOF conveyor.delivery_info
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    d conveyor.http_deliveries;
    dq conveyor.queues;
BEGIN
    IF retry_in IS NULL OR retry_in < 0 OR retry_in > 3600 OR attempts IS NULL OR attempts < 1 OR attempts > 101 THEN
        PERFORM conveyor._raise('CVV01', 'retry within 0 to 3600 seconds, out of 1 to 101 attempts');
    END IF;
    UPDATE conveyor.http_deliveries x
       SET attempt = x.attempt + 1,
           max_attempts = attempts,
           last_error = left(coalesce(error, 'failed'), 4096),
           next_attempt_at = now() + make_interval(secs => retry_in)
     WHERE x.id = delivery_id
    RETURNING x.* INTO d;
    PERFORM conveyor._delivery_exists(delivery_id);
    RETURN QUERY SELECT * FROM conveyor.delivery_info WHERE id = delivery_id;
    IF d.attempt >= d.max_attempts AND d.queue_name IS NULL THEN
        SELECT q.* INTO dq
          FROM conveyor.subscriptions s
          JOIN conveyor.queues q ON q.name = conveyor._subscription_dlq(s, default_region)
         WHERE s.id = d.subscription_id AND NOT q.fifo AND NOT conveyor._encrypted(q);
        IF FOUND THEN
            PERFORM conveyor._send(dq, jsonb_build_array(jsonb_build_object(
                'body', d.payload, 'content_type', 'text/plain')));
            PERFORM conveyor._wake(dq, 1);
            DELETE FROM conveyor.http_deliveries x WHERE x.id = delivery_id;
        END IF;
    END IF;
END $$;

-- Claimed rows not attempted (their subscription's throttle): due again after the given
-- seconds, no attempt counted. Returns how many.
CREATE FUNCTION conveyor.delivery_defer(ids bigint[], seconds double precision) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, conveyor AS $$
DECLARE
    n integer;
BEGIN
    IF seconds IS NULL OR seconds < 0 OR seconds > 3600 THEN
        PERFORM conveyor._raise('CVV01', 'defer by 0 to 3600 seconds');
    END IF;
    UPDATE conveyor.http_deliveries d SET next_attempt_at = now() + make_interval(secs => seconds)
     WHERE d.id = ANY (ids) AND d.held_reason IS NULL;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

REVOKE ALL ON FUNCTION conveyor.delivery_policies(bigint[], text[]),
    conveyor.delivery_failed(bigint, text, double precision, integer, text),
    conveyor.delivery_defer(bigint[], double precision) FROM PUBLIC;

DO $$
BEGIN
    GRANT EXECUTE ON FUNCTION conveyor.delivery_policies(bigint[], text[]),
        conveyor.delivery_failed(bigint, text, double precision, integer, text),
        conveyor.delivery_defer(bigint[], double precision) TO conveyor_writer;
EXCEPTION WHEN undefined_object THEN
    RAISE WARNING 'conveyor: roles missing, grants skipped (%)', SQLERRM;
END $$;
