"""Rows onto value types: by position when the columns are the fields in order, by name
otherwise (extra columns, e.g. from a newer schema, are ignored)."""

import json
import uuid

from conveyor import types
from conveyor.db import execute


def test_columns_in_field_order_map_by_position():
    u = uuid.uuid4()
    assert execute._row_maker(types.Sent, ("id", "message_uuid"))((7, u)) == types.Sent(7, u)


def test_other_columns_map_by_name_and_extras_are_ignored():
    u = uuid.uuid4()
    make = execute._row_maker(types.Sent, ("message_uuid", "added_later", "id"))
    assert make((u, "x", 7)) == types.Sent(id=7, message_uuid=u)


# -- named queries on libpq: placeholders, prepared statements, transactions, errors --------

import psycopg  # noqa: E402
import pytest  # noqa: E402

from conveyor import errors  # noqa: E402
from conveyor.db import pool  # noqa: E402


def test_placeholders_become_numbered_parameters_once_per_name():
    q = execute._query("queue_create")
    assert q.sql == b"SELECT * FROM conveyor.queue_create($1::text, $2::jsonb)"
    assert q.names == ("name", "attributes")
    assert b"%%" not in execute._query("message_seal_pending").sql  # a literal % is written %%


async def _prepared(conn: psycopg.AsyncConnection) -> set[str]:
    cur = await conn.execute("SELECT name FROM pg_prepared_statements WHERE name LIKE 'cv\\_%'")
    return {r[0] for r in await cur.fetchall()}


async def test_a_statement_run_again_on_a_connection_is_prepared_and_then_run_by_name(conn):
    await execute.fetch_all(conn, "queue_create", {"name": "q1", "attributes": {}})
    assert await _prepared(conn) == set()  # a statement run once is not prepared
    for n in range(3):
        found = await execute.fetch_one(conn, "queue_get", {"name": "q1"}, row=types.Queue)
        assert found is not None and found.name == "q1"
        assert len(await _prepared(conn)) == (0 if n == 0 else 1)


async def test_statements_dropped_under_the_connection_are_prepared_again(conn):
    await execute.fetch_all(conn, "queue_create", {"name": "q1", "attributes": {}})
    for _ in range(2):
        await execute.fetch_one(conn, "queue_get", {"name": "q1"})
    await conn.execute("DEALLOCATE ALL")
    found = await execute.fetch_one(conn, "queue_get", {"name": "q1"})  # run again, nothing lost
    assert found is not None and found[0] == "q1"
    await execute.fetch_one(conn, "queue_get", {"name": "q1"})
    assert len(await _prepared(conn)) == 1


async def test_a_rollback_keeps_the_statements_prepared_in_a_transaction(conn):
    """psycopg prepares a statement its cursors run five times (a health check's SELECT 1)
    and, at the next ROLLBACK, drops every prepared statement of the connection (DEALLOCATE
    ALL), Conveyor's included: a named call in a transaction after it failed (a 500). The
    connections leave preparing to Conveyor's named calls."""
    await execute.fetch_all(conn, "queue_create", {"name": "q1", "attributes": {}})
    for _ in range(2):
        await execute.fetch_one(conn, "queue_get", {"name": "q1"})
    for _ in range(6):
        await conn.execute("SELECT 1")
    with pytest.raises(ZeroDivisionError):
        async with conn.transaction():
            1 / 0  # noqa: B018
    async with conn.transaction():
        found = await execute.fetch_one(conn, "queue_get", {"name": "q1"})
    assert found is not None and found[0] == "q1"


async def test_a_callers_own_connection_gets_no_prepared_statement(dsn):
    """A connection psycopg prepares on (a caller's own, sending in its transaction) runs
    the named queries unnamed, so that its rollbacks cannot take their statements away."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as own:
        await execute.fetch_all(own, "queue_create", {"name": "q1", "attributes": {}})
        for _ in range(3):
            for _ in range(6):  # prepared by psycopg, which then deallocates all at a rollback
                await own.execute("SELECT 1")
            with pytest.raises(ZeroDivisionError):
                async with own.transaction():
                    await execute.fetch_one(own, "queue_get", {"name": "q1"})
                    1 / 0  # noqa: B018
            async with own.transaction():
                found = await execute.fetch_one(own, "queue_get", {"name": "q1"})
            assert found is not None and found[0] == "q1"
        assert await _prepared(own) == set()


async def test_a_statement_prepared_by_a_call_that_did_not_record_it_is_used(conn):
    await execute.fetch_all(conn, "queue_create", {"name": "q1", "attributes": {}})
    await execute.fetch_one(conn, "queue_get", {"name": "q1"})  # its first run: the key recorded
    [key] = [k for k in conn._conveyor_prepared.runs if k[0] == "queue_get"]
    # as a request cancelled while its prepare ran leaves it: prepared, not recorded
    await conn.execute(b"PREPARE " + execute._statement_name(key) + b" AS SELECT * FROM conveyor.queue_get($1::text)")
    for _ in range(2):
        found = await execute.fetch_one(conn, "queue_get", {"name": "q1"})
        assert found is not None and found[0] == "q1"


async def test_a_connection_that_is_not_autocommit_runs_named_queries_in_its_transaction(dsn):
    async with pool.connect(dsn, autocommit=False) as tx:
        await execute.fetch_all(tx, "queue_create", {"name": "q1", "attributes": {}})
        assert tx.pgconn.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        await tx.rollback()
        with pytest.raises(errors.QueueNotFound):
            await execute.fetch_one(tx, "queue_get", {"name": "q1"})


async def test_errors_are_translated_and_leave_the_connection_usable(conn):
    for _ in range(3):  # unnamed, then preparing, then prepared
        with pytest.raises(errors.InvalidInput, match="VisibilityTimeout"):
            await execute.fetch_all(conn, "queue_create", {"name": "q1", "attributes": {"VisibilityTimeout": "x"}})
    with pytest.raises(errors.InternalError, match="needs parameter 'attributes'"):
        await execute.fetch_all(conn, "queue_create", {"name": "q1"})
    await execute.fetch_all(conn, "queue_create", {"name": "q1", "attributes": {}})
    assert (await execute.fetch_one(conn, "queue_get", {"name": "q1"}) or ("",))[0] == "q1"


@pytest.mark.parametrize("text", [
    '{"n": 1, "f": 1.5, "s": "é", "a": [true, null, {"x": "12345"}]}',
    '{"big": 123456789012345678901234567890, "neg": -9223372036854775809}',  # past 64 bits
    '[18446744073709551615, 1e300, "0123456789012345678901"]',
    '{"deep": [[[[[[[[[[1]]]]]]]]]]}',
])
async def test_json_from_postgresql_reads_as_the_standard_library_reads_it(conn, text):
    """jsonb results are read by orjson where it reads exactly what the standard library
    does, and by the standard library where it would not (integers past 64 bits, which
    orjson turns into floats)."""
    cur = await conn.execute("SELECT %s::jsonb, %s::jsonb::text, %s::json", (text, text, text))
    got_jsonb, as_text, got_json = await cur.fetchone()
    assert repr(got_jsonb) == repr(json.loads(as_text))  # ints stay ints, in jsonb's key order
    assert repr(got_json) == repr(json.loads(text))
