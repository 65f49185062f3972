"""Cooperative members of a stream consumer (migration 0023): members share their
consumer's cursor, take whole batches in turn, none twice; their retries belong to the
consumer; idle members never hold the cursor back."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest


def one(conn: psycopg.Connection[Any], query: str, *params: Any) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


@pytest.fixture
def sql(dsn: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT conveyor.stream_create('s')")
        yield conn


def send_and_tick(sql: psycopg.Connection[Any], payload: str) -> None:
    one(sql, "SELECT conveyor.stream_send('s', %s)", payload)
    one(sql, "SELECT conveyor.stream_force_tick('s')")


def positions(sql: psycopg.Connection[Any]) -> dict[str, tuple[int, int | None]]:
    return {r[0]: (r[1], r[2]) for r in sql.execute(
        "SELECT name, last_tick, batch_id FROM conveyor.stream_consumers ORDER BY name")}


def test_members_take_consecutive_ranges_and_idle_ones_wait_at_the_cursor(sql):
    assert one(sql, "SELECT conveyor.stream_coop_join('s', 'c', 'c.a')") is True
    assert one(sql, "SELECT conveyor.stream_coop_join('s', 'c', 'c.a')") is False
    one(sql, "SELECT conveyor.stream_coop_join('s', 'c', 'c.b')")
    for p in ("1", "2"):
        send_and_tick(sql, p)
    a = one(sql, "SELECT conveyor.stream_next_batch_coop('s', 'c', 'c.a')")
    b = one(sql, "SELECT conveyor.stream_next_batch_coop('s', 'c', 'c.b')")
    assert a != b
    got = [one(sql, "SELECT string_agg(payload, ',') FROM conveyor.stream_get_batch_events(%s)", x) for x in (a, b)]
    assert got == ["1", "2"]
    assert one(sql, "SELECT conveyor.stream_next_batch_coop('s', 'c', 'c.a')") == a  # its own, again
    one(sql, "SELECT conveyor.stream_finish_batch(%s)", a)
    cursor = positions(sql)["c"][0]
    assert positions(sql)["c.a"] == (cursor, None)  # finished: idle at the consumer's cursor
    assert one(sql, "SELECT conveyor.stream_next_batch_coop('s', 'c', 'c.a')") is None  # nothing after it yet
    one(sql, "SELECT conveyor.stream_finish_batch(%s)", b)
    assert {v for v in positions(sql).values()} == {(cursor, None)}


def test_a_members_retry_comes_back_through_another_member(sql):
    one(sql, "SELECT conveyor.stream_coop_join('s', 'c', 'c.a')")
    one(sql, "SELECT conveyor.stream_coop_join('s', 'c', 'c.b')")
    send_and_tick(sql, "x")
    a = one(sql, "SELECT conveyor.stream_next_batch_coop('s', 'c', 'c.a')")
    ev = one(sql, "SELECT id FROM conveyor.stream_get_batch_events(%s)", a)
    assert one(sql, "SELECT conveyor.stream_nack(%s, %s, '0 seconds')", a, ev) == "retry"
    assert one(sql, "SELECT c.name FROM conveyor.stream_retries r JOIN conveyor.stream_consumers c "
                    "ON c.id = r.consumer_id") == "c"
    one(sql, "SELECT conveyor.stream_ack(%s)", a)
    one(sql, "SELECT count(*) FROM conveyor.maint()")
    one(sql, "SELECT conveyor.stream_force_tick('s')")
    b = one(sql, "SELECT conveyor.stream_next_batch_coop('s', 'c', 'c.b')")
    assert sql.execute("SELECT payload, retry_count FROM conveyor.stream_get_batch_events(%s)", (b,)).fetchall() \
        == [("x", 1)]


def test_plain_batches_of_a_cooperative_consumer_are_refused(sql):
    one(sql, "SELECT conveyor.stream_coop_join('s', 'c', 'c.a')")
    for consumer in ("c", "c.a"):
        with pytest.raises(psycopg.Error) as refused:
            sql.execute("SELECT conveyor.stream_next_batch('s', %s)", (consumer,))
        assert refused.value.sqlstate == "CVS06"
    with pytest.raises(psycopg.Error) as refused:
        sql.execute("SELECT conveyor.stream_coop_join('s', 'c.a', 'c.a.x')")
    assert refused.value.sqlstate == "CVS06"


def test_an_idle_member_follows_the_cursor_so_it_never_holds_rotation_back(sql):
    """Rotation and tick cleanup go by every consumer row's position: member a, idle after
    its range, must move on with the consumer's cursor while b reads further, not stay at
    the end of its old range."""
    one(sql, "SELECT conveyor.stream_coop_join('s', 'c', 'c.a')")
    one(sql, "SELECT conveyor.stream_coop_join('s', 'c', 'c.b')")
    send_and_tick(sql, "1")
    a = one(sql, "SELECT conveyor.stream_next_batch_coop('s', 'c', 'c.a')")
    one(sql, "SELECT conveyor.stream_finish_batch(%s)", a)
    send_and_tick(sql, "2")
    b = one(sql, "SELECT conveyor.stream_next_batch_coop('s', 'c', 'c.b')")
    at = positions(sql)
    assert at["c.a"] == (at["c"][0], None)  # idle, at the cursor (past b's range)
    assert at["c.b"][1] == b and at["c.b"][0] < at["c"][0]  # b holds its range's start while it reads
    # the oldest position any row holds is the open batch's start: what rotation must keep
    assert one(sql, "SELECT min(last_tick) FROM conveyor.stream_consumers") == at["c.b"][0]
