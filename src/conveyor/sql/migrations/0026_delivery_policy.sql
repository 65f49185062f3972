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


-- The old signature and the fixed schedule go; delivery_failed's new signature,
-- delivery_defer and delivery_policies (and their grants) are in
-- src/conveyor/sql/functions/35_topics.sql (docs/architecture.md, "Where each SQL function's
-- current definition lives").
DROP FUNCTION conveyor.delivery_failed(bigint, text);
DROP FUNCTION conveyor._delivery_backoff(integer);
