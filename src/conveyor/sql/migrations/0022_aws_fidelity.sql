-- Conveyor 0022: Amazon SQS fidelity, round 3 (issue 27).
--
-- 1. A message's attributes count against the queue's maximum message size as SQS counts
--    them (each name, DataType and value, a binary value by its decoded bytes), not as the
--    JSON text they are stored in: a message of exactly MaximumMessageSize, body and
--    attributes, is accepted, as on SQS. Headers that are not SQS attributes (REST's) count
--    their name and their value's text.
-- 2. A message moved to a dead-letter queue keeps its receive count and first receive time
--    (SQS's ApproximateReceiveCount goes on counting there).
-- 3. A message move task whose destination queue is deleted is FAILED, and stays listed with
--    the destination's name, as SQS lists it; before, the task vanished with the queue.
-- 4. A queue may be its own dead-letter queue, as SQS allows (a RedrivePolicy naming the
--    queue itself): a message over maxReceiveCount goes to the back of the queue with its
--    receive count started again, instead of being refused at SetQueueAttributes.
-- 5. SNS (issue 27, items 9-11): an envelope states the SignatureVersion it was signed
--    with (1 or 2, the message's signature_version); a publish's system_attributes
--    (AWSTraceHeader) go to its queue copies; a FIFO topic's MessageGroupId reaches its
--    FIFO queues only (standard queues get none, as SNS delivers); filter policies on the
--    body reach dotted keys (`"a.b"` is `{"a": {"b": ...}}` too) and arrays nested in
--    arrays.
-- 6. SNS (issue 27, item 14): deleting a queue keeps its subscriptions (they wait for the
--    queue; meanwhile a subscription's RedrivePolicy dead-letter queue gets its messages);
--    delivery_send puts a message of the server's making (a SubscriptionConfirmation)
--    into an HTTP(S) subscription's outbox.
--
-- The functions, views and their triggers and grants that this change defined are in
-- src/conveyor/sql/functions/ as they stand now (docs/architecture.md, "Where each SQL
-- function's current definition lives"); this file keeps its tables, indexes, data and DROPs.

------------------------------------------------------------------------------------------
-- 3. A move task outlives its destination queue, as FAILED
------------------------------------------------------------------------------------------

-- the destination's name, kept when the queue is deleted (set by the trigger below)
ALTER TABLE conveyor.move_tasks ADD COLUMN destination_name text;
ALTER TABLE conveyor.move_tasks DROP CONSTRAINT move_tasks_destination_queue_id_fkey;
ALTER TABLE conveyor.move_tasks ADD CONSTRAINT move_tasks_destination_queue_id_fkey
    FOREIGN KEY (destination_queue_id) REFERENCES conveyor.queues (id) ON DELETE SET NULL;

------------------------------------------------------------------------------------------
-- 4. A queue may be its own dead-letter queue
------------------------------------------------------------------------------------------

-- the table's own check (0001: dead_letter_queue_id IS DISTINCT FROM id), found by what it says
DO $$
DECLARE
    c text;
BEGIN
    FOR c IN SELECT conname FROM pg_constraint
              WHERE conrelid = 'conveyor.queues'::regclass AND contype = 'c'
                AND pg_get_constraintdef(oid) ILIKE '%dead_letter_queue_id IS DISTINCT FROM id%' LOOP
        EXECUTE format('ALTER TABLE conveyor.queues DROP CONSTRAINT %I', c);
    END LOOP;
END $$;

------------------------------------------------------------------------------------------
-- 5. SNS: signature versions, system attributes, FIFO groups, filter policies
------------------------------------------------------------------------------------------

-- A queue's deletion keeps the subscriptions that deliver to it (as SNS keeps them): they
-- wait for a queue of that name, as a subscription to a queue not created yet does, and
-- what is published meanwhile goes to their dead-letter queue, or is held.
ALTER TABLE conveyor.subscriptions DROP CONSTRAINT subscriptions_queue_id_fkey;
ALTER TABLE conveyor.subscriptions ADD CONSTRAINT subscriptions_queue_id_fkey
    FOREIGN KEY (queue_id) REFERENCES conveyor.queues (id) ON DELETE SET NULL;
