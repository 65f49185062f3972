"""PgQ 3's whole SQL API side by side: every function and table of PgQ 3.5 (Debian's
postgresql-15-pgq3, the real extension) called and read against Conveyor's pgq dialect
and against the real PgQ in a database of its own. The answers must be equal, except
where tests/dialects/expected_differences.toml says why they are not. (The CDC triggers
are compared event by event in test_pgq.py; skytools' consumers are driven there too.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from conftest import create_database, drop_database, unique_name
from conveyor.db import migrate, pool
from dialects import differences, pgmq_support


@pytest.fixture
def pair(template_db: str) -> Iterator[tuple[str, str]]:
    ours, theirs = unique_name("conveyor_pgqapi"), unique_name("conveyor_realpgqapi")
    dsn = create_database(ours, template=template_db)

    async def install() -> None:
        async with pool.connect(dsn) as conn:
            await migrate.migrate(conn, dialects=("pgq",))

    asyncio.run(install())
    real = create_database(theirs)
    with psycopg.connect(real, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION pgq")
    yield dsn, real
    drop_database(ours)
    drop_database(theirs)


SIGNATURES = """
SELECT p.proname || '(' || pg_get_function_arguments(p.oid) || ') -> ' || pg_get_function_result(p.oid)
  FROM pg_proc p
 WHERE p.pronamespace = 'pgq'::regnamespace AND (p.proname !~ '^_' OR p.proname = '_grant_perms_from')
 ORDER BY 1
"""

COLUMNS = """
SELECT c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
  FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
 WHERE c.relnamespace = 'pgq'::regnamespace
   AND c.relname IN ('queue', 'consumer', 'subscription', 'tick', 'retry_queue', 'event_template')
"""


def test_every_pgq_function_and_table_is_there_with_pgqs_signature(pair: tuple[str, str]) -> None:
    with psycopg.connect(pair[0]) as ours, psycopg.connect(pair[1]) as theirs:
        mine = {r[0] for r in ours.execute(SIGNATURES)} | {r[0] for r in ours.execute(COLUMNS)}
        real = {r[0] for r in theirs.execute(SIGNATURES)} | {r[0] for r in theirs.execute(COLUMNS)}
    differences.check("pgq", "catalog", {sig: sig in mine for sig in real}, dict.fromkeys(real, True))


# Each step in one session, in order, on both databases: (step, SQL). Ids that Conveyor
# numbers its own way (ticks, batches, consumers) are compared where PgQ's are the same.
STEPS = [
    ("version", "SELECT pgq.version()"),
    ("upgrade_schema", "SELECT pgq.upgrade_schema()"),
    ("create_queue", "SELECT pgq.create_queue('orders')"),
    ("create_queue_again", "SELECT pgq.create_queue('orders')"),
    ("create_queue_null", "SELECT pgq.create_queue(NULL)"),
    ("set_queue_config", "SELECT pgq.set_queue_config('orders', 'ticker_max_count', '5')"),
    ("set_queue_config_bad", "SELECT pgq.set_queue_config('orders', 'nonsense', '5')"),
    ("queue_table", "SELECT queue_name, queue_ntables, queue_cur_table, queue_rotation_period, queue_external_ticker,"
                    " queue_disable_insert, queue_ticker_paused, queue_ticker_max_count, queue_ticker_max_lag,"
                    " queue_ticker_idle_period, queue_per_tx_limit, queue_extra_maint FROM pgq.queue"),
    ("queue_update", "UPDATE pgq.queue SET queue_rotation_period = '1 hour', queue_ticker_max_lag = '2 seconds',"
                     " queue_ticker_idle_period = '30 seconds', queue_extra_maint = ARRAY['pgq.maint_retry_events']"
                     " WHERE queue_name = 'orders' RETURNING queue_name"),
    ("queue_updated", "SELECT queue_rotation_period, queue_ticker_max_lag, queue_ticker_idle_period,"
                      " queue_extra_maint FROM pgq.queue"),
    ("maint_operations", "SELECT * FROM pgq.maint_operations() WHERE func_name <> 'vacuum'"),
    ("queue_update_back", "UPDATE pgq.queue SET queue_extra_maint = NULL RETURNING queue_extra_maint"),
    ("register_consumer", "SELECT pgq.register_consumer('orders', 'billing')"),
    ("register_consumer_again", "SELECT pgq.register_consumer('orders', 'billing')"),
    ("register_consumer_no_queue", "SELECT pgq.register_consumer('nope', 'billing')"),
    ("register_consumer_at_no_tick", "SELECT pgq.register_consumer_at('orders', 'x', 999999)"),
    ("register_second", "SELECT pgq.register_consumer('orders', 'audit')"),
    ("consumer_table", "SELECT co_name FROM pgq.consumer ORDER BY 1"),
    ("subscription_table", "SELECT c.co_name, s.sub_batch, s.sub_next_tick FROM pgq.subscription s"
                           " JOIN pgq.consumer c ON c.co_id = s.sub_consumer ORDER BY 1"),
    ("insert_event", "SELECT pgq.insert_event('orders', 'created', 'id=1')"),
    ("insert_event_extras", "SELECT pgq.insert_event('orders', 'paid', 'id=1', 'x1', 'x2', 'x3', 'x4')"),
    ("insert_event_no_queue", "SELECT pgq.insert_event('nope', 't', 'd')"),
    ("insert_event_raw", "SELECT pgq.insert_event_raw('orders', 100, now(), NULL, NULL, 'raw', 'r', NULL, NULL,"
                         " NULL, NULL)"),
    ("insert_event_raw_next_id", "SELECT pgq.insert_event_raw('orders', NULL, NULL, NULL, NULL, 'raw', 'r2', NULL,"
                                 " NULL, NULL, NULL)"),
    ("current_event_table", "SELECT pgq.current_event_table('orders')"),
    ("current_event_table_no_queue", "SELECT pgq.current_event_table('nope')"),
    ("event_template", "SELECT ev_id, ev_retry, ev_type, ev_data, ev_extra1, ev_extra4, ev_owner"
                       " FROM pgq.event_template ORDER BY ev_id"),
    ("force_tick", "SELECT pgq.force_tick('orders') IS NOT NULL"),
    ("ticker", "SELECT pgq.ticker() >= 0"),
    ("tick_table", "SELECT count(*) >= 2 FROM pgq.tick"),
    ("next_batch_info", "SELECT batch_id IS NOT NULL, cur_tick_event_seq - prev_tick_event_seq >= 4"
                        " FROM pgq.next_batch_info('orders', 'billing')"),
    ("next_batch_same", "SELECT pgq.next_batch('orders', 'billing') = (SELECT sub_batch FROM pgq.subscription s"
                        " JOIN pgq.consumer c ON c.co_id = s.sub_consumer WHERE c.co_name = 'billing')"),
    ("next_batch_no_consumer", "SELECT pgq.next_batch('orders', 'ghost')"),
    ("get_batch_events", "SELECT ev_id, ev_retry, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4"
                         " FROM pgq.get_batch_events((SELECT pgq.next_batch('orders', 'billing')))"),
    ("get_batch_cursor", "SELECT ev_id, ev_type FROM pgq.get_batch_cursor((SELECT pgq.next_batch('orders',"
                         " 'billing')), 'c1', 2)"),
    ("get_batch_cursor_where", "SELECT ev_id FROM pgq.get_batch_cursor((SELECT pgq.next_batch('orders',"
                               " 'billing')), 'c2', 10, 'ev_type = ''paid''')"),
    # one or two tables (the previous one while a batch may still need it): both sides
    # name every table that holds the batch's events, each one that can be selected from
    ("batch_event_tables", "SELECT count(*) BETWEEN 1 AND 2 FROM pgq.batch_event_tables((SELECT pgq.next_batch('orders',"
                           " 'billing')))"),
    ("batch_event_tables_selectable",
     "SELECT count(*) BETWEEN 1 AND 2 FROM pgq.batch_event_tables((SELECT pgq.next_batch('orders', 'billing'))) t,"
     " LATERAL (SELECT * FROM query_to_xml('SELECT 1 FROM ' || t || ' LIMIT 1', false, false, '')) x"),
    ("batch_event_sql", "SELECT count(*) FROM (SELECT pgq.batch_event_sql((SELECT pgq.next_batch('orders',"
                        " 'billing')))) x"),
    ("get_batch_info", "SELECT queue_name, consumer_name, lag IS NOT NULL, seq_start IS NOT NULL"
                       " FROM pgq.get_batch_info((SELECT pgq.next_batch('orders', 'billing')))"),
    ("event_retry", "SELECT pgq.event_retry((SELECT pgq.next_batch('orders', 'billing')), 1, 0)"),
    ("event_retry_time", "SELECT pgq.event_retry((SELECT pgq.next_batch('orders', 'billing')), 2, now())"),
    ("batch_retry", "SELECT pgq.batch_retry((SELECT pgq.next_batch('orders', 'billing')), 0)"),
    ("retry_queue_table", "SELECT ev_id, ev_retry, ev_type FROM pgq.retry_queue ORDER BY ev_id"),
    ("event_retry_raw", "SELECT pgq.event_retry_raw('orders', 'audit', now(), 555, now(), 2, 'rr', 'd', NULL, NULL,"
                        " NULL, NULL)"),
    ("event_retry_raw_no_consumer", "SELECT pgq.event_retry_raw('orders', 'ghost', now(), 1, now(), 0, 't', 'd',"
                                    " NULL, NULL, NULL, NULL)"),
    ("finish_batch", "SELECT pgq.finish_batch((SELECT pgq.next_batch('orders', 'billing')))"),
    ("finish_batch_unknown", "SELECT pgq.finish_batch(424242)"),
    ("maint_retry_events", "SELECT pgq.maint_retry_events() >= 0"),
    ("retry_queue_after", "SELECT count(*) FROM pgq.retry_queue"),
    ("get_queue_info", "SELECT queue_name, queue_ntables, queue_external_ticker, queue_ticker_max_count,"
                       " queue_ticker_max_lag, queue_ticker_idle_period FROM pgq.get_queue_info()"),
    ("get_queue_info_one", "SELECT queue_name FROM pgq.get_queue_info('orders')"),
    ("get_consumer_info", "SELECT queue_name, consumer_name, current_batch FROM pgq.get_consumer_info() ORDER BY 2"),
    ("get_consumer_info_queue", "SELECT consumer_name FROM pgq.get_consumer_info('orders') ORDER BY 1"),
    ("get_consumer_info_one", "SELECT consumer_name, pending_events >= 0 FROM pgq.get_consumer_info('orders',"
                              " 'audit')"),
    ("next_batch_custom", "SELECT batch_id IS NULL FROM pgq.next_batch_custom('orders', 'audit', '1 hour', NULL,"
                          " NULL)"),
    ("find_tick_helper", "SELECT next_tick_id IS NOT NULL FROM pgq.find_tick_helper((SELECT queue_id FROM pgq.queue),"
                         " (SELECT min(tick_id) FROM pgq.tick), now() - interval '1 hour', 0, 1, NULL)"),
    ("find_tick_helper_none", "SELECT next_tick_id FROM pgq.find_tick_helper((SELECT queue_id FROM pgq.queue),"
                              " (SELECT max(tick_id) FROM pgq.tick), now(), 0, 1, NULL)"),
    ("ticker_one", "SELECT pgq.ticker('orders') IS NOT NULL"),
    ("ticker_external", "SELECT pgq.ticker('orders', 1, now(), 1)"),
    ("maint_rotate_tables_step1", "SELECT pgq.maint_rotate_tables_step1('orders')"),
    ("maint_rotate_tables_step2", "SELECT pgq.maint_rotate_tables_step2()"),
    ("maint_tables_to_vacuum", "SELECT count(*) FROM pgq.maint_tables_to_vacuum()"),
    ("grant_perms", "SELECT pgq.grant_perms('orders')"),
    ("grant_perms_no_queue", "SELECT pgq.grant_perms('nope')"),
    ("tune_storage", "SELECT pgq.tune_storage('orders')"),
    ("tune_storage_no_queue", "SELECT pgq.tune_storage('nope')"),
    ("quote_fqname", "SELECT pgq.quote_fqname('Public.Some Table'), pgq.quote_fqname('t')"),
    ("seq_setval", "CREATE SEQUENCE public.s1; SELECT pgq.seq_setval('public.s1', 10)"),
    ("seq_getval", "SELECT pgq.seq_getval('public.s1')"),
    ("unregister_consumer", "SELECT pgq.unregister_consumer('orders', 'audit')"),
    ("unregister_consumer_again", "SELECT pgq.unregister_consumer('orders', 'audit')"),
    ("drop_queue_attached", "SELECT pgq.drop_queue('orders')"),
    ("drop_queue_force", "SELECT pgq.drop_queue('orders', true)"),
    ("drop_queue_missing", "SELECT pgq.drop_queue('orders')"),
    ("queue_insert", "INSERT INTO pgq.queue (queue_name) VALUES ('x')"),
]


def test_pgqs_functions_answer_as_real_pgq(pair: tuple[str, str]) -> None:
    answers: list[dict[str, Any]] = []
    for dsn in pair:
        with psycopg.connect(dsn, autocommit=True) as conn:
            answers.append({step: pgmq_support.outcome(conn, query) for step, query in STEPS})
    differences.check("pgq", "sql", answers[0], answers[1])
