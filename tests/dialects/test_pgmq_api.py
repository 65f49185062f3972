"""pgmq's whole API, side by side: every public method of the pinned client (`pgmq` 1.1.4,
in its four variants: psycopg, asyncpg, SQLAlchemy, SQLAlchemy async) and every SQL
function of the SQL its wheel carries, called against Conveyor's pgmq dialect and against
the real pgmq (that SQL, with pg_partman) in a database of its own. The answers must be
equal, except where tests/dialects/expected_differences.toml says why they are not.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from pgmq import (
    AsyncPGMQueue,
    SQLAlchemyAsyncPGMQueue,
    SQLAlchemyPGMQueue,
    SyncPGMQueue,
    async_transaction,
    sqlalchemy_async_transaction,
    sqlalchemy_transaction,
    transaction,
)
from pgmq.notify_listener import AsyncNotificationListener, SyncNotificationListener

from conftest import create_database, drop_database, unique_name
from dialects import differences, pgmq_support

VARIANTS = {
    "psycopg": (SyncPGMQueue, transaction),
    "asyncpg": (AsyncPGMQueue, async_transaction),
    "sqlalchemy": (SQLAlchemyPGMQueue, sqlalchemy_transaction),
    "sqlalchemy-async": (SQLAlchemyAsyncPGMQueue, sqlalchemy_async_transaction),
}


@pytest.fixture(scope="module")
def pgmq_template(template_db: str) -> Iterator[str]:
    name = unique_name("conveyor_pgmqapi_tpl")
    pgmq_support.install_dialect(create_database(name, template=template_db))
    yield name
    drop_database(name)


@pytest.fixture
def pair(pgmq_template: str) -> Iterator[tuple[str, str]]:
    """A database with the dialect and one with the real pgmq, both fresh."""
    ours, theirs = unique_name("conveyor_pgmqapi"), unique_name("conveyor_realpgmqapi")
    real = create_database(theirs)
    pgmq_support.install_real_pgmq(real)
    yield create_database(ours, template=pgmq_template), real
    drop_database(ours)
    drop_database(theirs)


# -- the client's methods, step by step ----------------------------------------------------

Step = tuple[str, str | Callable[[Any], Any], tuple[Any, ...], dict[str, Any]]


def steps(q: str, rollback: Callable[..., Any]) -> list[Step]:
    later = datetime.now(UTC) + timedelta(hours=1)
    past = datetime.now(UTC) - timedelta(seconds=1)
    r, p, t, n = q + "_r", q + "_p", q + "_t", q + "_n"
    return [
        # queues
        ("create", "create_queue", (q,), {}),
        ("create_again", "create_queue", (q,), {}),
        ("create_unlogged", "create_queue", (q + "_u",), {"unlogged": True}),
        ("create_partitioned_ids", "create_partitioned_queue", (p,), {}),
        ("create_partitioned_time", "create_partitioned_queue", (t, "1 day", "7 days"), {}),
        ("create_partitioned_seconds", "create_partitioned_queue", (q + "_s", "5 seconds", "10 seconds"), {}),
        ("drop_partitioned_seconds", "drop_queue", (q + "_s",), {}),
        ("list_queues", "list_queues", (), {}),
        ("validate_queue_name", "validate_queue_name", (q,), {}),
        ("validate_queue_name_too_long", "validate_queue_name", ("x" * 48,), {}),
        # sending
        ("send", "send", (q, {"n": 1}), {}),
        ("send_headers", "send", (q, {"n": 2}), {"headers": {"h": "1"}}),
        ("send_delay", "send", (q, {"n": 3}), {"delay": 3600}),
        ("send_delay_instant", "send", (q, {"n": 4}), {"delay": later}),
        ("send_tz_alias", "send", (q, {"n": 5}), {"headers": {"h": "2"}, "tz": 0}),
        ("send_null", "send", (q, None), {}),
        ("send_batch", "send_batch", (q, [{"n": 6}, {"n": 7}]), {}),
        ("send_batch_headers_delay", "send_batch", (q, [{"n": 8}, {"n": 9}]),
         {"headers": [{"a": 1}, {"a": 2}], "delay": 0}),
        ("send_batch_instant", "send_batch", (q, [{"n": 10}]), {"delay": later}),
        ("send_batch_empty", "send_batch", (q, []), {}),
        ("send_to_missing_queue", "send", (q + "_nope", {"n": 0}), {}),
        ("send_in_rolled_back_transaction", rollback, (q,), {}),
        # reading
        ("read_one", "read", (q,), {"vt": 30}),
        ("read_conditional", "read", (q,), {"vt": 30, "qty": 5, "conditional": {"n": 6}}),
        ("read_many", "read", (q,), {"vt": 30, "qty": 10}),
        ("read_with_poll_nothing", "read_with_poll", (q,), {"vt": 30, "qty": 5, "max_poll_seconds": 1,
                                                            "poll_interval_ms": 50}),
        ("read_batch_nothing", "read_batch", (q,), {"vt": 30, "batch_size": 2}),
        ("set_vt", "set_vt", (q, 1, 0), {}),
        ("set_vt_many", "set_vt", (q, [2, 5], 0), {}),
        ("set_vt_instant", "set_vt", (q, 6, past), {}),
        ("set_vt_missing", "set_vt", (q, 999, 0), {}),
        ("read_with_poll", "read_with_poll", (q,), {"vt": 0, "qty": 2, "max_poll_seconds": 1}),
        ("read_with_poll_conditional", "read_with_poll", (q,), {"vt": 30, "qty": 5, "max_poll_seconds": 1,
                                                                "conditional": {"n": 1}}),
        ("read_batch", "read_batch", (q,), {"vt": 30, "batch_size": 5}),
        ("read_missing_queue", "read", (q + "_nope",), {"vt": 30}),
        # pop, delete, archive, purge
        ("send_for_pop", "send_batch", (r, [{"p": 1}, {"p": 2}, {"p": 3}]), {}),
        ("pop", "pop", (r,), {}),
        ("pop_many", "pop", (r,), {"qty": 5}),
        ("pop_empty", "pop", (r,), {}),
        ("delete", "delete", (q, 7), {}),
        ("delete_again", "delete", (q, 7), {}),
        ("delete_batch", "delete_batch", (q, [8, 999]), {}),
        ("archive", "archive", (q, 9), {}),
        ("archive_again", "archive", (q, 9), {}),
        ("archive_batch", "archive_batch", (q, [10, 999]), {}),
        ("metrics", "metrics", (q,), {}),
        ("metrics_all", "metrics_all", (), {}),
        ("metrics_missing_queue", "metrics", (q + "_nope",), {}),
        ("purge", "purge", (q,), {}),
        ("detach_archive", "detach_archive", (q,), {}),
        # partitioned queues
        ("send_partitioned_ids", "send_batch", (p, [{"i": 1}, {"i": 2}]), {}),
        ("read_partitioned_ids", "read", (p,), {"vt": 30, "qty": 5}),
        ("send_partitioned_time", "send", (t, {"i": 1}), {}),
        ("archive_partitioned_time", "archive", (t, 1), {}),
        ("metrics_partitioned", "metrics", (t,), {}),
        ("convert_archive_partitioned", "convert_archive_partitioned", (q,), {}),
        ("convert_archive_partitioned_again", "convert_archive_partitioned", (p,), {}),
        ("convert_archive_partitioned_missing", "convert_archive_partitioned", (q + "_nope",), {}),
        # notifications
        ("enable_notify", "enable_notify", (q,), {"throttle_interval_ms": 250}),
        ("update_notify", "update_notify", (q, 0), {}),
        ("list_notify_throttles", "list_notify_throttles", (), {}),
        ("enable_notify_negative", "enable_notify", (q,), {"throttle_interval_ms": -1}),
        ("enable_notify_missing_queue", "enable_notify", (q + "_nope",), {}),
        ("update_notify_not_enabled", "update_notify", (r, 5), {}),
        ("disable_notify", "disable_notify", (q,), {}),
        ("list_notify_throttles_after", "list_notify_throttles", (), {}),
        # topics
        ("validate_routing_key", "validate_routing_key", ("logs.error",), {}),
        ("validate_routing_key_bad", "validate_routing_key", ("logs..error",), {}),
        ("validate_topic_pattern", "validate_topic_pattern", ("logs.#",), {}),
        ("validate_topic_pattern_bad", "validate_topic_pattern", ("logs.**",), {}),
        ("bind_topic_one", "bind_topic", ("logs.*", q), {}),
        ("bind_topic_many", "bind_topic", ("logs.#", r), {}),
        ("bind_topic_suffix", "bind_topic", ("#.error", r), {}),
        ("bind_topic_again", "bind_topic", ("logs.*", q), {}),
        ("bind_topic_missing_queue", "bind_topic", ("x.*", q + "_nope"), {}),
        ("list_topic_bindings", "list_topic_bindings", (), {}),
        ("list_topic_bindings_queue", "list_topic_bindings", (r,), {}),
        ("test_routing", "test_routing", ("logs.error",), {}),
        ("test_routing_none", "test_routing", ("other",), {}),
        ("send_topic", "send_topic", ("logs.error", {"t": 1}), {}),
        ("send_topic_headers_delay", "send_topic", ("logs.a.b", {"t": 2}), {"headers": {"k": "v"}, "delay": 0}),
        ("send_topic_nowhere", "send_topic", ("nothing.here", {"t": 3}), {}),
        ("send_topic_bad_key", "send_topic", ("bad key", {"t": 4}), {}),
        ("send_batch_topic", "send_batch_topic", ("logs.error", [{"b": 1}, {"b": 2}]), {}),
        ("send_batch_topic_headers", "send_batch_topic", ("x.error", [{"b": 3}]), {"headers": [{"h": 1}]}),
        ("send_batch_topic_delay", "send_batch_topic", ("logs.x", [{"b": 4}]), {"delay": 0}),
        ("send_batch_topic_instant", "send_batch_topic", ("logs.x", [{"b": 5}]), {"delay": later}),
        ("read_routed", "read", (r,), {"vt": 30, "qty": 10}),
        ("unbind_topic", "unbind_topic", ("logs.*", q), {}),
        ("unbind_topic_again", "unbind_topic", ("logs.*", q), {}),
        # FIFO
        ("create_fifo_queue", "create_queue", (n,), {}),
        ("send_grouped", "send_batch", (n, [{"g": "a1"}, {"g": "a2"}, {"g": "b1"}, {"g": "a3"}, {"g": "c1"}]),
         {"headers": [{"x-pgmq-group": "a"}, {"x-pgmq-group": "a"}, {"x-pgmq-group": "b"},
                      {"x-pgmq-group": "a"}, {"x-pgmq-group": "c"}]}),
        ("create_fifo_index", "create_fifo_index", (n,), {}),
        ("create_fifo_index_missing_queue", "create_fifo_index", (q + "_nope",), {}),
        ("create_fifo_indexes_all", "create_fifo_indexes_all", (), {}),
        ("read_grouped", "read_grouped", (n,), {"vt": 30, "qty": 2}),
        ("read_grouped_again", "read_grouped", (n,), {"vt": 30, "qty": 5}),
        ("set_vt_grouped", "set_vt", (n, [1, 2, 3, 4, 5], 0), {}),
        ("read_grouped_rr", "read_grouped_rr", (n,), {"vt": 30, "qty": 4}),
        ("read_grouped_rr_with_poll", "read_grouped_rr_with_poll", (n,), {"vt": 30, "qty": 4, "max_poll_seconds": 1}),
        ("set_vt_grouped_again", "set_vt", (n, [1, 2, 3, 4, 5], 0), {}),
        ("read_grouped_with_poll", "read_grouped_with_poll", (n,), {"vt": 30, "qty": 10, "max_poll_seconds": 1}),
        # dropping
        ("drop_queue", "drop_queue", (q,), {}),
        ("drop_queue_again", "drop_queue", (q,), {}),
        ("list_queues_after_drop", "list_queues", (), {}),
    ]


# Steps whose rows pgmq returns in no particular order (UPDATE ... RETURNING): compared as sets.
UNORDERED = ("set_vt_many", "set_vt_grouped", "set_vt_grouped_again", "read_grouped", "read_grouped_again",
             "read_grouped_with_poll")


def _sorted(step: str, result: Any) -> Any:
    if step in UNORDERED and isinstance(result, list):
        return sorted(result, key=lambda m: m["msg_id"])
    return result


def _ages(result: Any) -> Any:
    """Metrics' message ages in seconds depend on timing: only whether there is one."""
    if isinstance(result, dict) and "oldest_msg_age_sec" in result:
        return {**result, "newest_msg_age_sec": result["newest_msg_age_sec"] is not None,
                "oldest_msg_age_sec": result["oldest_msg_age_sec"] is not None}
    if isinstance(result, list):
        return [_ages(r) for r in result]
    return result


def _rollback_step(decorator: Callable[..., Any], asynchronous: bool) -> Callable[..., Any]:
    """A method of the application's, in the client's transaction decorator: sends, then
    fails; the send must be rolled back."""
    if asynchronous:
        @decorator
        async def send_then_fail(self: Any, queue: str, conn: Any = None) -> None:
            await self.send(queue, {"rolled": "back"}, conn=conn)
            raise RuntimeError("rolled back")
    else:
        @decorator
        def send_then_fail(self: Any, queue: str, conn: Any = None) -> None:
            self.send(queue, {"rolled": "back"}, conn=conn)
            raise RuntimeError("rolled back")
    return send_then_fail


async def run(variant: str, dsn: str, q: str) -> dict[str, Any]:
    cls, decorator = VARIANTS[variant]
    asynchronous = inspect.iscoroutinefunction(cls.send)
    client = cls(conn_string=dsn, init_extension=False, pool_size=2)
    if asynchronous:
        await client.init()
    rollback = _rollback_step(decorator, asynchronous)
    answers: dict[str, Any] = {}
    try:
        for step, method, args, kwargs in steps(q, rollback):
            call = functools.partial(method, client) if callable(method) else getattr(client, method)
            try:
                result = call(*args, **kwargs)
                if inspect.isawaitable(result):
                    result = await result
                answers[step] = _sorted(step, _ages(differences.plain(result)))
            except Exception as exc:  # noqa: BLE001 - errors are answers to compare
                answers[step] = differences.failure(exc)
    finally:
        closing = client.close() if hasattr(client, "close") else client.dispose()
        if inspect.isawaitable(closing):
            await closing
    return answers


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_client_method_answers_as_real_pgmq(pair: tuple[str, str], variant: str) -> None:
    ours_dsn, theirs_dsn = pair
    q = f"api_{uuid.uuid4().hex[:8]}"
    ours = asyncio.run(run(variant, ours_dsn, q))
    theirs = asyncio.run(run(variant, theirs_dsn, q))
    differences.check("pgmq", "client", ours, theirs, variant)


# -- the notification listeners --------------------------------------------------------------

def _heard_sync(dsn: str, q: str) -> list[dict[str, Any]]:
    client = SyncPGMQueue(conn_string=dsn, init_extension=False, pool_size=2)
    heard: list[dict[str, Any]] = []
    try:
        client.create_queue(q)
        client.enable_notify(q, throttle_interval_ms=0)
        listener = SyncNotificationListener(client)
        thread = threading.Thread(target=listener.listen, args=(q, heard.append), kwargs={"timeout": 2})
        thread.start()
        time.sleep(0.5)
        client.send(q, {"a": 1})
        client.send_batch(q, [{"a": 2}, {"a": 3}])
        thread.join(5)
    finally:
        client.close()
    return heard


async def _heard_async(dsn: str, q: str) -> list[dict[str, Any]]:
    client = AsyncPGMQueue(conn_string=dsn, init_extension=False, pool_size=2)
    await client.init()
    heard: list[dict[str, Any]] = []
    listener = AsyncNotificationListener(client)
    try:
        await client.create_queue(q)
        await client.enable_notify(q, throttle_interval_ms=0)
        task = asyncio.create_task(listener.listen(q, heard.append))
        await asyncio.sleep(0.5)
        await client.send(q, {"a": 1})
        await client.send_batch(q, [{"a": 2}, {"a": 3}])
        await asyncio.sleep(1)
        listener.stop()
        task.cancel()
    finally:
        await client.close()
    return heard


def test_the_notification_listeners_hear_what_they_hear_from_pgmq(pair: tuple[str, str]) -> None:
    ours_dsn, theirs_dsn = pair
    q = f"ntf_{uuid.uuid4().hex[:8]}"
    ours, theirs = _heard_sync(ours_dsn, q), _heard_sync(theirs_dsn, q)
    assert ours == theirs == [{"event": "insert", "payload_empty": True}] * 2
    ours, theirs = asyncio.run(_heard_async(ours_dsn, q + "a")), asyncio.run(_heard_async(theirs_dsn, q + "a"))
    assert ours == theirs and len(ours) == 2


def test_inserts_through_any_interface_notify_and_throttle(pair: tuple[str, str]) -> None:
    """Conveyor's own send (SQS's, REST's path) notifies pgmq's channel too, at most once
    per throttle interval, and only for the queues that asked."""
    dsn = pair[0]
    with psycopg.connect(dsn, autocommit=True) as sql, psycopg.connect(dsn, autocommit=True) as listener:
        sql.execute("SELECT pgmq.create('loud'), pgmq.create('quiet')")
        listener.execute('LISTEN "pgmq.q_loud.INSERT"')
        listener.execute('LISTEN "pgmq.q_quiet.INSERT"')
        sql.execute("SELECT pgmq.enable_notify_insert('loud', 60000)")
        sql.execute("SELECT conveyor.message_send('loud', 'from conveyor')")
        sql.execute("SELECT conveyor.message_send('loud', 'throttled')")
        sql.execute("SELECT conveyor.message_send('quiet', 'not asked')")
        assert [n.channel for n in listener.notifies(timeout=0.5)] == ["pgmq.q_loud.INSERT"]
        sql.execute("SELECT pgmq.drop_queue('loud')")
        assert sql.execute("SELECT count(*) FROM pgmq.list_notify_insert_throttles()").fetchone() == (0,)


# -- every SQL function of pgmq's ------------------------------------------------------------

SIGNATURES = """
SELECT p.proname || '(' || pg_get_function_arguments(p.oid) || ') -> ' || pg_get_function_result(p.oid)
  FROM pg_proc p WHERE p.pronamespace = 'pgmq'::regnamespace AND p.proname !~ '^_' ORDER BY 1
"""


def test_every_pgmq_function_is_there_with_pgmqs_signature(pair: tuple[str, str]) -> None:
    ours_dsn, theirs_dsn = pair
    with psycopg.connect(ours_dsn) as ours, psycopg.connect(theirs_dsn) as theirs:
        mine = {r[0] for r in ours.execute(SIGNATURES)}
        real = {r[0] for r in theirs.execute(SIGNATURES)}
    answers = {sig: sig in mine for sig in real}
    differences.check("pgmq", "catalog", answers, dict.fromkeys(real, True))


# pgmq's functions that the client does not call, and the tables it reads
SQL_STEPS = [
    ("create_non_partitioned", "SELECT pgmq.create_non_partitioned(%s)", ("{q}",)),
    ("acquire_queue_lock", "SELECT pgmq.acquire_queue_lock(%s)", ("{q}",)),
    ("format_table_name", "SELECT pgmq.format_table_name(%s, 'a')", ("MixedCase",)),
    ("format_table_name_invalid", "SELECT pgmq.format_table_name(%s, 'q')", ("x;y",)),
    ("send_int_delay_untyped", "SELECT * FROM pgmq.send(%s, '{\"s\": 1}'::jsonb, 0)", ("{q}",)),
    ("send_sql_null", "SELECT * FROM pgmq.send(%s, NULL::jsonb)", ("{q}",)),
    ("read_sql_null", "SELECT msg_id, message IS NULL FROM pgmq.read(%s, 30, 5)", ("{q}",)),
    ("meta", "SELECT queue_name, is_partitioned, is_unlogged FROM pgmq.meta WHERE queue_name = %s", ("{q}",)),
    ("q_table", "SELECT msg_id, read_ct, message IS NULL FROM pgmq.q_{q}", ()),
    ("a_table", "SELECT count(*) FROM pgmq.a_{q}", ()),
    ("read_grouped_head", "SELECT count(*) FROM pgmq.read_grouped_head(%s, 30, 5)", ("{q}",)),
    ("read_grouped_head_with_poll", "SELECT count(*) FROM pgmq.read_grouped_head_with_poll(%s, 30, 5, 1, 50)",
     ("{q}",)),
    ("notify_throttle_table", "SELECT count(*) FROM pgmq.notify_insert_throttle", ()),
    ("topic_bindings_table", "SELECT count(*) FROM pgmq.topic_bindings", ()),
    ("send_batch_topic_empty", "SELECT * FROM pgmq.send_batch_topic('a.b', ARRAY[]::jsonb[])", ()),
    ("send_topic_null", "SELECT pgmq.send_topic('a.b', NULL::jsonb)", ()),
    ("send_topic_negative_delay", "SELECT pgmq.send_topic('a.b', '1'::jsonb, -1)", ()),
    ("unbind_topic_null", "SELECT pgmq.unbind_topic(NULL, 'x')", ()),
    ("drop_queue_partitioned_flag", "SELECT pgmq.drop_queue(%s, false)", ("{q}",)),
]


def test_pgmqs_other_functions_answer_as_real_pgmq(pair: tuple[str, str]) -> None:
    q = f"sql_{uuid.uuid4().hex[:8]}"
    answers: list[dict[str, Any]] = []
    for dsn in pair:
        with psycopg.connect(dsn, autocommit=True) as conn:
            answers.append({step: pgmq_support.outcome(conn, query.replace("{q}", q),
                                                       tuple(p.replace("{q}", q) for p in params))
                            for step, query, params in SQL_STEPS})
    differences.check("pgmq", "sql", answers[0], answers[1])
