-- Conveyor's hq dialect 0002: the message_uuid indexes take the names a fresh install
-- gives them.
--
-- hq/0001 indexes conveyor.messages (message_uuid) as hq_messages_uuid_idx. Installed
-- before engine migration 0016, that index stayed on the table 0016 renamed
-- conveyor.messages_shared and attached to the new partitioned parent, whose own index
-- PostgreSQL named messages_message_uuid_idx; installed after 0016, the parent's index is
-- hq_messages_uuid_idx and the shared table's messages_shared_message_uuid_idx. The same
-- indexes under other names: a database upgraded through 0016 takes the fresh install's
-- (tests/db/test_schema_equivalence.py compares the two).
DO $$
BEGIN
    IF to_regclass('conveyor.messages_message_uuid_idx') IS NOT NULL
       AND (SELECT i.indrelid FROM pg_catalog.pg_index i
             WHERE i.indexrelid = 'conveyor.hq_messages_uuid_idx'::regclass) = 'conveyor.messages_shared'::regclass THEN
        ALTER INDEX conveyor.hq_messages_uuid_idx RENAME TO messages_shared_message_uuid_idx;
        ALTER INDEX conveyor.messages_message_uuid_idx RENAME TO hq_messages_uuid_idx;
    END IF;
END $$;
