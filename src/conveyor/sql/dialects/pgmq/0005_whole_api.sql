-- Conveyor's pgmq dialect, 0005: the rest of pgmq's SQL API (as the `pgmq` wheel 1.1.4
-- carries it), so that every method of the pinned Python client has a function to call:
--
--   read / read_with_poll with `conditional`   messages whose JSON contains the given
--                                              object (pgmq's `message @> conditional`)
--   read_grouped(_with_poll), read_grouped_rr(_with_poll), read_grouped_head(_with_poll)
--                                              pgmq's FIFO reads, on the engine's message
--                                              groups (x-pgmq-group is a message's group_id)
--   enable_notify_insert, disable_notify_insert, update_notify_insert,
--   list_notify_insert_throttles, notify_queue_listeners
--                                              pgmq's NOTIFY on insert: channel
--                                              pgmq.q_<queue>.INSERT, empty payload, at most
--                                              one per throttle interval, for every insert
--                                              into the queue whichever interface sends
--   send_topic, send_batch_topic, bind_topic, unbind_topic, list_topic_bindings,
--   test_routing, validate_routing_key, validate_topic_pattern
--                                              pgmq's topic routing: bindings of patterns to
--                                              queues, a send to every queue whose pattern
--                                              matches the routing key (pgmq's own matching)
--   convert_archive_partitioned, create_fifo_index, create_fifo_indexes_all,
--   acquire_queue_lock, the pgmq.meta view    storage and locking calls, answered as far
--                                              as they mean something here (below)
--   a SQL NULL message                         read back as SQL NULL (pgmq stores it as is),
--                                              not as JSON null
--   create_partitioned with an interval under a minute
--                                              refused in pg_partman's words (P0001)
--
-- What differs from pgmq, and why, is in docs/dialects/pgmq.md; tests/dialects/test_pgmq_api.py compares every function with
-- the real pgmq's SQL.
--
-- State: the notify throttles and the topic bindings are settings only pgmq has; they are
-- kept in pgmq.notify_insert_throttle and pgmq.topic_bindings (pgmq's names and columns,
-- plus the Conveyor queue's id, whose drop removes its rows), the only tables the dialect
-- owns. Messages stay in the engine's tables.
--
-- The functions, views and their triggers and grants that this change defined are in
-- src/conveyor/sql/dialects/pgmq/functions/ as they stand now (docs/architecture.md, "Where each SQL
-- function's current definition lives"); this file keeps its tables, indexes, data and DROPs.

------------------------------------------------------------------------------------------
-- Grouped (FIFO) reads
------------------------------------------------------------------------------------------

-- pgmq's three ways of filling a batch from message groups (the x-pgmq-group header,
-- which the dialect stores as the message's group_id; messages without one form one group),
-- mapped onto the engine's grouped claims, which decide which groups a reader may take
-- (those with nothing in flight, under the engine's per-group lock):
--   sqs    read_grouped: as many messages as possible from the oldest group, then the next
--          (conveyor._claim_grouped, whose order this is);
--   head   read_grouped_head: the first message of each of up to qty groups (the engine's
--          claim of one message, repeated: each takes the oldest group still free);
--   rr     read_grouped_rr: layer by layer, the first message of every group, then the
--          second, ... (pgmq._claim_round_robin below: the engine's choice of groups, then
--          pgmq's order within them).
-- A Conveyor FIFO queue (.fifo, made through SQS or REST) is read in its own group order
-- (conveyor._claim_fifo) whichever of the three is asked for.

------------------------------------------------------------------------------------------
-- NOTIFY on insert
------------------------------------------------------------------------------------------

-- pgmq's table, with the queue's id: dropping the queue (through any interface) drops its
-- row. Unlogged, as pgmq's.
CREATE UNLOGGED TABLE pgmq.notify_insert_throttle (
    queue_name           varchar NOT NULL UNIQUE,
    throttle_interval_ms integer NOT NULL DEFAULT 0,
    last_notified_at     timestamptz NOT NULL DEFAULT to_timestamp(0),
    queue_id             bigint NOT NULL UNIQUE REFERENCES conveyor.queues (id) ON DELETE CASCADE
);

------------------------------------------------------------------------------------------
-- Topics
------------------------------------------------------------------------------------------

-- A pattern as pgmq matches it: anchored, '.' literal, '*' one or more characters other
-- than a dot, '#' any characters. (pgmq's rule, kept as is: it differs from Conveyor's
-- own topic patterns, where '#' stands for whole segments; docs/dialects/pgmq.md.)
CREATE FUNCTION pgmq._topic_regex(pattern text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT '^' || replace(replace(replace(pattern, '.', '\.'), '*', '[^.]+'), '#', '.*') || '$'
$$;

-- pgmq's bindings, with the queue's id: dropping the queue drops its bindings.
CREATE TABLE pgmq.topic_bindings (
    pattern        text NOT NULL,
    queue_name     text NOT NULL,
    bound_at       timestamptz NOT NULL DEFAULT now(),
    compiled_regex text GENERATED ALWAYS AS (pgmq._topic_regex(pattern)) STORED,
    queue_id       bigint NOT NULL REFERENCES conveyor.queues (id) ON DELETE CASCADE,
    CONSTRAINT topic_bindings_unique_pattern_queue UNIQUE (pattern, queue_name)
);
CREATE INDEX ON pgmq.topic_bindings (queue_id);

------------------------------------------------------------------------------------------
-- Plans and roles
------------------------------------------------------------------------------------------

REVOKE ALL ON pgmq.notify_insert_throttle, pgmq.topic_bindings FROM PUBLIC;
