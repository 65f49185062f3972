"""Roles gate the SQL API, and every SECURITY DEFINER function pins its search_path."""

from __future__ import annotations

import psycopg
import pytest

from conveyor import errors, types
from conveyor.core import messages, queues


async def test_every_security_definer_function_pins_search_path(conn):
    cur = await conn.execute("""
        SELECT p.proname, p.prosecdef, p.proconfig
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = 'conveyor'""")
    rows = await cur.fetchall()
    definers = [(name, config) for name, secdef, config in rows if secdef]
    assert len(definers) >= 20
    unpinned = [name for name, config in definers
                if not any(c.startswith("search_path=") for c in (config or []))]
    assert unpinned == []
    # and the pinned path never includes a schema an attacker could write to
    for name, config in definers:
        path = next(c for c in config if c.startswith("search_path="))
        assert "public" not in path and "$user" not in path, name


async def test_functions_are_not_executable_by_public(conn):
    cur = await conn.execute("""
        SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = 'conveyor'
           AND has_function_privilege('public', p.oid, 'EXECUTE')""")
    assert await cur.fetchall() == []


async def _as(conn, role: str) -> None:
    await conn.execute(f"SET ROLE {role}")


async def test_reader_can_look_but_not_send_or_receive(conn):
    await queues.create(conn, "jobs")
    await messages.send(conn, "jobs", types.OutgoingMessage("x"))
    await _as(conn, "conveyor_reader")
    assert [q.name for q in await queues.list_all(conn)] == ["jobs"]
    assert (await queues.metrics(conn, "jobs")).queue_length == 1
    assert len(await messages.peek(conn, "jobs")) == 1
    with pytest.raises(errors.PermissionDenied):
        await messages.send(conn, "jobs", types.OutgoingMessage("y"))
    with pytest.raises(errors.PermissionDenied):
        await messages.receive(conn, "jobs")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        await conn.execute("DELETE FROM conveyor.messages")


async def test_reader_reads_the_tables_of_every_kind_of_queue_but_not_the_secrets(conn):
    """What conveyor_reader may SELECT: messages of plain and partitioned queues (0015),
    never the signing secrets."""
    await _as(conn, "conveyor_reader")
    for table in ("conveyor.messages", "conveyor.archive", "conveyor.partition_messages", "conveyor.partitions",
                  "conveyor.stream_events", "conveyor.stream_dead_letters"):
        await conn.execute(f"SELECT count(*) FROM {table}")
    cur = await conn.execute("SELECT has_table_privilege('conveyor_reader', c.oid, 'SELECT') FROM pg_class c "
                             "WHERE c.oid = 'conveyor.secrets'::regclass")
    assert await cur.fetchone() == (False,)


async def test_writer_can_send_and_receive_but_not_drop_or_purge(conn):
    await queues.create(conn, "jobs")
    await _as(conn, "conveyor_writer")
    mid = await messages.send(conn, "jobs", types.OutgoingMessage("x"))
    [m] = await messages.receive(conn, "jobs")
    assert await messages.delete(conn, "jobs", [m.id]) == [mid]
    for call in (queues.drop(conn, "jobs"), queues.purge(conn, "jobs"), queues.create(conn, "other")):
        with pytest.raises(errors.PermissionDenied):
            await call
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        await conn.execute("INSERT INTO conveyor.queues (name, fifo) VALUES ('sneaky', false)")


async def test_admin_can_do_everything(conn):
    await _as(conn, "conveyor_admin")
    await queues.create(conn, "jobs")
    await messages.send(conn, "jobs", types.OutgoingMessage("x"))
    assert await queues.purge(conn, "jobs") == 1
    assert await queues.drop(conn, "jobs")


async def test_a_login_role_granted_writer_works(dsn, conn):
    await queues.create(conn, "jobs")
    await conn.execute("DROP ROLE IF EXISTS conveyor_test_app")
    await conn.execute("CREATE ROLE conveyor_test_app LOGIN IN ROLE conveyor_writer")
    try:
        app_dsn = psycopg.conninfo.make_conninfo(dsn, user="conveyor_test_app")
        async with await psycopg.AsyncConnection.connect(app_dsn, autocommit=True) as app:
            assert await messages.send(app, "jobs", types.OutgoingMessage("from app")) == 1
    finally:
        await conn.execute("DROP ROLE conveyor_test_app")
