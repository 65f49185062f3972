-- Conveyor's pgq dialect, 0004: the rest of PgQ 3.5's SQL API, and its tables as tools
-- read and operators update them.
--
--   pgq.event_template          every queue's events, with PgQ's columns (a view over the
--                               engine's event tables; CREATE TABLE ... (LIKE
--                               pgq.event_template) takes PgQ's columns from it)
--   pgq.queue                   updatable: queue_rotation_period, queue_ticker_max_count,
--                               queue_ticker_max_lag, queue_ticker_idle_period and
--                               queue_ticker_paused set the stream's options (as
--                               set_queue_config does), queue_extra_maint is kept and run by
--                               maint_operations(); other columns are the engine's
--   event_retry_raw, insert_event_raw, find_tick_helper
--                               PgQ's low-level calls, over the engine's retry queue, event
--                               tables and ticks
--   grant_perms, tune_storage, upgrade_schema, _grant_perms_from
--                               storage and permission upkeep of PgQ's own tables: the
--                               engine grants and tunes its tables itself; these answer as
--                               PgQ does for tables already in order
--   maint_operations()          PgQ's list, with each queue's queue_extra_maint functions
--
-- State: queue_extra_maint is the one PgQ setting the engine has no column for; it is kept
-- in pgq.queue_settings (a row per stream, dropped with the stream).
--
-- The functions, views and their triggers and grants that this change defined are in
-- src/conveyor/sql/dialects/pgq/functions/ as they stand now (docs/architecture.md, "Where each SQL
-- function's current definition lives"); this file keeps its tables, indexes, data and DROPs.

CREATE TABLE pgq.queue_settings (
    stream_id   bigint PRIMARY KEY REFERENCES conveyor.streams (id) ON DELETE CASCADE,
    extra_maint text[]
);

------------------------------------------------------------------------------------------
-- Roles
------------------------------------------------------------------------------------------

REVOKE ALL ON pgq.queue_settings FROM PUBLIC;
