"""conveyor.core.streams and the SQL functions of migration 0003, op by op: what the
acceptance stories (tests/acceptance), the REST, CLI and client tests do not pin down.

Each test has its own fresh database (fixtures ``dsn`` and ``conn``: autocommit, the
``postgres`` superuser). No server runs and nothing waits for a timer: the tests tick
(``force_tick``, ``ticker``) and run ``maint`` themselves, and where behaviour depends
on time passing (TTLs, ticker thresholds, rotation periods, lag, scheduled deliveries)
they move the stored timestamps back with direct SQL instead of sleeping. Each such
UPDATE says which timestamp it moves and why.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator
from decimal import Decimal

import psycopg
import pytest

from conveyor import errors, types
from conveyor.core import streams
from conveyor.db import execute, listen, pool

S = "orders"
EVENT_TABLES = ("conveyor.streams", "conveyor.stream_ticks", "conveyor.stream_consumers",
                "conveyor.stream_retries", "conveyor.stream_delayed")


# --------------------------------------------------------------------------- helpers


async def sql(conn, query: str, *params: object) -> list[tuple]:
    """Run SQL as psql would, with database errors mapped as everywhere in Conveyor."""
    with execute.translated():
        cur = await conn.execute(query, params or None)
        return await cur.fetchall() if cur.description else []


async def send(conn, stream: str, *payloads: str, type: str = "t") -> list[int]:
    return await streams.append(conn, stream, [types.StreamEventIn(payload=p, type=type) for p in payloads])


async def stream_id(conn, stream: str) -> int:
    [(sid,)] = await sql(conn, "SELECT id FROM conveyor.streams WHERE name = %s", stream)
    return sid


async def last_tick(conn, stream: str) -> int:
    [(tick,)] = await sql(conn, "SELECT max(tick_id) FROM conveyor.stream_ticks WHERE stream_id = %s",
                          await stream_id(conn, stream))
    return tick


async def tick_count(conn, stream: str) -> int:
    [(n,)] = await sql(conn, "SELECT count(*) FROM conveyor.stream_ticks WHERE stream_id = %s",
                       await stream_id(conn, stream))
    return n


async def ticks(conn, stream: str) -> list[int]:
    rows = await sql(conn, "SELECT tick_id FROM conveyor.stream_ticks WHERE stream_id = %s ORDER BY tick_id",
                     await stream_id(conn, stream))
    return [t for (t,) in rows]


async def age_tick(conn, tick_id: int, by: str) -> None:
    """Make a tick look ``by`` older (tick_time is the only clock the ticker, batch
    selection, lag and throughput read)."""
    await sql(conn, "UPDATE conveyor.stream_ticks SET tick_time = tick_time - %s::interval WHERE tick_id = %s",
              by, tick_id)


async def drain(conn, stream: str, consumer: str) -> list[types.StreamEvent]:
    """Receive and acknowledge until nothing is left."""
    got: list[types.StreamEvent] = []
    while events := await streams.receive(conn, stream, consumer, 100000):
        got += events
        await streams.ack(conn, events[0].batch_id)
    return got


def payloads(events: list[types.StreamEvent]) -> list[str | None]:
    return [e.payload for e in events]


async def stats_of(conn, stream: str) -> types.StreamStats:
    [st] = [st for st in await streams.stats(conn) if st.stream == stream]
    return st


async def consumer_stats_of(conn, stream: str) -> dict[str, types.ConsumerStats]:
    return {c.consumer: c for c in await streams.consumer_stats(conn) if c.stream == stream}


@contextlib.asynccontextmanager
async def listening(dsn: str, *channels: str) -> AsyncIterator[asyncio.Queue]:
    """(channel, payload) notifications on conveyor_stream and ``channels``, through
    Conveyor's own LISTEN helper."""
    got: asyncio.Queue = asyncio.Queue()
    ready = asyncio.Event()

    async def on_listening() -> None:
        ready.set()

    async def run() -> None:
        async for note in listen.notifications(dsn, ["conveyor_stream", *channels], on_listening):
            got.put_nowait(note)

    task = asyncio.create_task(run())
    try:
        await asyncio.wait_for(ready.wait(), 5)
        yield got
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def nothing_arrives(queue: asyncio.Queue, seconds: float = 0.3) -> bool:
    try:
        note = await asyncio.wait_for(queue.get(), seconds)
    except TimeoutError:
        return True
    raise AssertionError(f"unexpected notification {note}")


# --------------------------------------------------------------------------- streams


async def test_create_with_defaults_and_with_every_option(conn):
    created = await streams.create(conn, S)
    assert created == types.Stream(
        name=S, rotation_period=dt.timedelta(hours=2), ticker_max_count=500,
        ticker_max_lag=dt.timedelta(seconds=3), ticker_idle_period=dt.timedelta(minutes=1),
        ticker_paused=False, max_retries=5, event_ttl=None, cur_table=0,
        switch_time=created.switch_time, created_at=created.created_at, consumers=0,
        channel=f"conveyor_stream_{await stream_id(conn, S)}")
    assert await streams.get(conn, S) == created

    options = {"rotation_period": "90 seconds", "ticker_max_count": 7, "ticker_max_lag": "250 milliseconds",
               "ticker_idle_period": 30, "max_retries": 0, "event_ttl": "1 day", "ticker_paused": True}
    custom = await streams.create(conn, "custom", options)
    assert (custom.rotation_period, custom.ticker_max_count, custom.ticker_max_lag, custom.ticker_idle_period,
            custom.max_retries, custom.event_ttl, custom.ticker_paused) == (
        dt.timedelta(seconds=90), 7, dt.timedelta(milliseconds=250), dt.timedelta(seconds=30),
        0, dt.timedelta(days=1), True), "numbers are seconds, strings any PostgreSQL interval"
    # the bounds themselves are accepted
    edge = await streams.create(conn, "edge", {"rotation_period": "1 second", "ticker_max_count": 1000000,
                                               "ticker_max_lag": 0, "ticker_idle_period": 0, "max_retries": 1000})
    assert (edge.rotation_period, edge.ticker_max_count, edge.ticker_max_lag, edge.max_retries) == (
        dt.timedelta(seconds=1), 1000000, dt.timedelta(0), 1000)
    assert [s.name for s in await streams.list_all(conn)] == ["custom", "edge", S]


BAD_OPTIONS = [
    ({"rotation_period": "0.5 seconds"}, "out of range"),
    ({"rotation_period": "soon"}, "invalid value for stream option rotation_period"),
    ({"ticker_max_count": 0}, "out of range"),
    ({"ticker_max_count": 1000001}, "out of range"),
    ({"ticker_max_count": 1.5}, "invalid value for stream option ticker_max_count"),
    ({"ticker_max_count": "many"}, "invalid value for stream option ticker_max_count"),
    ({"ticker_max_count": 2**40}, "invalid value for stream option ticker_max_count"),
    ({"ticker_max_lag": "-1 second"}, "out of range"),
    ({"ticker_max_lag": "later"}, "invalid value for stream option ticker_max_lag"),
    ({"ticker_idle_period": "-5 minutes"}, "out of range"),
    ({"max_retries": -1}, "out of range"),
    ({"max_retries": 1001}, "out of range"),
    ({"max_retries": True}, "invalid value for stream option max_retries"),
    ({"event_ttl": 0}, "out of range"),
    ({"event_ttl": "-1 hour"}, "out of range"),
    ({"ticker_paused": "maybe"}, "invalid value for stream option ticker_paused"),
    ({"colour": "red"}, "unknown stream option 'colour'"),
    ({"max_retries": 1, "colour": "red"}, "unknown stream option 'colour'"),
]


async def test_create_rejects_each_bad_option_and_creates_nothing(conn):
    for options, message in BAD_OPTIONS:
        with pytest.raises(errors.InvalidInput) as caught:
            await streams.create(conn, S, options)
        assert message in caught.value.message, (options, caught.value.message)
    assert await streams.list_all(conn) == []
    with pytest.raises(errors.StreamNotFound):
        await streams.get(conn, S)


async def test_stream_names_are_checked(conn):
    for bad in ("", "a b", "a.b", "x" * 81, "ünï"):
        with pytest.raises(errors.InvalidInput, match="invalid stream name"):
            await streams.create(conn, bad)
    assert (await streams.create(conn, "x" * 80)).name == "x" * 80
    assert (await streams.create(conn, "A-b_9")).name == "A-b_9"


async def test_null_for_an_option_that_must_have_a_value_is_invalid_input(conn):
    """event_ttl may be null (no TTL); every other option must have a value. A JSON null
    for one of those is bad input like any other bad value, not a NOT NULL violation
    reported as an internal error."""
    await streams.create(conn, S)
    for option in ("rotation_period", "ticker_max_count", "ticker_max_lag", "ticker_idle_period",
                   "max_retries", "ticker_paused"):
        with pytest.raises(errors.InvalidInput):
            await streams.create(conn, "other", {option: None})
        with pytest.raises(errors.InvalidInput):
            await streams.configure(conn, S, {option: None})
    assert (await streams.create(conn, "ttl-less", {"event_ttl": None})).event_ttl is None


async def test_create_again_returns_the_existing_stream_unchanged(conn):
    first = await streams.create(conn, S, {"max_retries": 3, "event_ttl": "1 hour"})
    await streams.subscribe(conn, S, "c")
    again = await streams.create(conn, S, {"max_retries": 9, "rotation_period": "5 hours", "ticker_paused": True})
    assert again == types.Stream(**{**{f: getattr(first, f) for f in types.field_names(types.Stream)},
                                    "consumers": 1})
    assert await streams.get(conn, S) == again
    [(n,)] = await sql(conn, "SELECT count(*) FROM conveyor.streams")
    assert n == 1


async def test_configure_changes_only_the_given_options(conn):
    before = await streams.create(conn, S, {"event_ttl": "1 day"})
    after = await streams.configure(conn, S, {"max_retries": 2, "ticker_max_lag": "10 seconds"})
    assert (after.max_retries, after.ticker_max_lag) == (2, dt.timedelta(seconds=10))
    unchanged = ("rotation_period", "ticker_max_count", "ticker_idle_period", "ticker_paused", "event_ttl",
                 "cur_table", "switch_time", "created_at")
    assert {f: getattr(after, f) for f in unchanged} == {f: getattr(before, f) for f in unchanged}
    assert await streams.configure(conn, S, {}) == after
    assert (await streams.configure(conn, S, {"event_ttl": None})).event_ttl is None, "null clears the TTL"

    current = await streams.get(conn, S)
    for options, message in BAD_OPTIONS:
        with pytest.raises(errors.InvalidInput) as caught:
            await streams.configure(conn, S, {"max_retries": 7, **options})
        assert message in caught.value.message, options
    assert await streams.get(conn, S) == current, "a rejected change changes nothing, not even the valid part"
    with pytest.raises(errors.StreamNotFound):
        await streams.configure(conn, "nope", {"max_retries": 1})


async def test_a_paused_stream_is_not_ticked_by_the_ticker(conn):
    await streams.create(conn, S, {"ticker_max_lag": 0})
    await streams.subscribe(conn, S, "c")
    [(paused,)] = await sql(conn, "SELECT ticker_paused FROM conveyor.stream_pause(%s)", S)
    assert paused is True and (await streams.get(conn, S)).ticker_paused is True
    before = await tick_count(conn, S)
    await send(conn, S, "while paused")
    assert await streams.ticker(conn) == 0
    assert await tick_count(conn, S) == before
    assert await streams.receive(conn, S, "c") == []

    [(paused,)] = await sql(conn, "SELECT ticker_paused FROM conveyor.stream_resume(%s)", S)
    assert paused is False
    assert await streams.ticker(conn) == 1, "resumed, it is ticked for the event that waited"
    assert payloads(await drain(conn, S, "c")) == ["while paused"]

    # force_tick ticks whether or not the stream is paused
    await streams.configure(conn, S, {"ticker_paused": True})
    tick = await streams.force_tick(conn, S)
    assert tick == await last_tick(conn, S) and await tick_count(conn, S) == before + 2
    for fn in ("stream_pause", "stream_resume"):
        with pytest.raises(errors.StreamNotFound):
            await sql(conn, f"SELECT * FROM conveyor.{fn}('nope')")


async def test_drop_removes_everything_and_is_false_for_an_unknown_stream(conn):
    await streams.create(conn, S)
    sid = await stream_id(conn, S)
    await streams.subscribe(conn, S, "c")
    await send(conn, S, "x")
    await streams.force_tick(conn, S)
    await streams.append_at(conn, S, types.StreamEventIn(payload="later"),
                            dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    [(relations,)] = await sql(conn, "SELECT count(*) FROM pg_class WHERE relname LIKE %s", f"stream\\_{sid}\\_%")
    assert relations >= 3

    assert await streams.drop(conn, S) is True
    assert await sql(conn, "SELECT relname FROM pg_class WHERE relname ~ %s", f"^stream_(seq_)?{sid}(_|$)") == []
    for table in ("stream_ticks", "stream_consumers", "stream_delayed"):
        assert await sql(conn, f"SELECT count(*) FROM conveyor.{table}") == [(0,)], table
    with pytest.raises(errors.StreamNotFound):
        await streams.get(conn, S)
    assert await streams.drop(conn, S) is False
    assert await streams.drop(conn, "never-was") is False


async def test_get_and_list(conn):
    with pytest.raises(errors.StreamNotFound, match="stream 'nope' does not exist"):
        await streams.get(conn, "nope")
    assert await streams.list_all(conn) == []
    for name in ("b", "a", "c"):
        await streams.create(conn, name)
    assert [s.name for s in await streams.list_all(conn)] == ["a", "b", "c"]


# --------------------------------------------------------------------------- event_ttl


async def make_old(conn, stream: str, pattern: str, by: str = "2 hours") -> None:
    """Events get ev_time = now() from the database at insert; an event older than the
    TTL otherwise takes the TTL to appear. Moves ev_time back in the stream's tables
    (through their parent conveyor.stream_<id>; the superuser may write there)."""
    sid = await stream_id(conn, stream)
    await sql(conn, f"UPDATE conveyor.stream_{sid} SET ev_time = ev_time - %s::interval WHERE ev_data LIKE %s",
              by, pattern)


async def test_event_ttl_hides_old_events_from_receive_batch_events_and_cursor(dsn, conn):
    await streams.create(conn, S, {"event_ttl": "1 hour"})
    await streams.subscribe(conn, S, "c")
    await send(conn, S, "old-1", "fresh-1", "old-2", "fresh-2")
    await make_old(conn, S, "old-%")
    await streams.force_tick(conn, S)

    received = await streams.receive(conn, S, "c")
    assert payloads(received) == ["fresh-1", "fresh-2"]
    batch = received[0].batch_id
    assert payloads(await streams.batch_events(conn, batch)) == ["fresh-1", "fresh-2"]
    async with pool.connect(dsn, autocommit=False) as tx:
        quick = await sql(tx, "SELECT payload FROM conveyor.stream_get_batch_cursor(%s, 'ttl_rest', 1)", batch)
        rest = await sql(tx, "FETCH ALL FROM ttl_rest")
        await tx.rollback()
    assert [p for (p,) in quick] + [r[3] for r in rest] == ["fresh-1", "fresh-2"], \
        "the cursor applies the TTL as the other readers do"

    # the TTL is applied when reading: without it, the old events are there again
    await streams.configure(conn, S, {"event_ttl": None})
    assert payloads(await streams.batch_events(conn, batch)) == ["old-1", "fresh-1", "old-2", "fresh-2"]


async def test_receive_skips_a_batch_of_only_expired_events(conn):
    await streams.create(conn, S, {"event_ttl": "10 minutes"})
    await streams.subscribe(conn, S, "c")
    await send(conn, S, "stale-1", "stale-2")
    await make_old(conn, S, "stale-%", "11 minutes")
    await streams.force_tick(conn, S)
    stale_end = await last_tick(conn, S)
    await send(conn, S, "new")
    await streams.force_tick(conn, S)
    received = await streams.receive(conn, S, "c")
    assert payloads(received) == ["new"]
    [(position,)] = await sql(conn, "SELECT last_tick FROM conveyor.stream_consumers")
    assert position == stale_end, "the batch of expired events was finished on the way"


# --------------------------------------------------------------------------- batch cursor


async def test_batch_cursor_returns_quick_limit_events_and_leaves_the_rest_in_the_cursor(dsn, conn):
    await streams.create(conn, S)
    await streams.subscribe(conn, S, "c")
    ids = await send(conn, S, *[f"e{i}" for i in range(10)])
    await streams.force_tick(conn, S)
    batch = await streams.next_batch(conn, S, "c")
    async with pool.connect(dsn, autocommit=False) as tx:
        quick = await sql(tx, "SELECT id, batch_id, type, payload FROM conveyor.stream_get_batch_cursor(%s, %s, 3)",
                          batch, "big_batch")
        assert quick == [(ids[i], batch, "t", f"e{i}") for i in range(3)]
        more = await sql(tx, "FETCH 4 FROM big_batch")
        rest = await sql(tx, "FETCH ALL FROM big_batch")
        assert [r[0] for r in more] == ids[3:7] and [r[0] for r in rest] == ids[7:]
        assert {r[1] for r in more + rest} == {batch} and [r[3] for r in rest] == ["e7", "e8", "e9"]
        await tx.commit()
        with pytest.raises(psycopg.errors.InvalidCursorName):
            await tx.execute("FETCH ALL FROM big_batch")  # gone with its transaction
        await tx.rollback()

        # quick_limit defaults to 1000: all of this batch, nothing left over
        everything = await sql(tx, "SELECT id FROM conveyor.stream_get_batch_cursor(%s, 'whole')", batch)
        assert [i for (i,) in everything] == ids and await sql(tx, "FETCH ALL FROM whole") == []
        await tx.rollback()

        for bad in ("Upper", "1st", "a-b", "a b", "x" * 64, "", None):
            with pytest.raises(errors.InvalidInput, match="cursor_name"):
                await sql(tx, "SELECT * FROM conveyor.stream_get_batch_cursor(%s, %s, 3)", batch, bad)
            await tx.rollback()
        with pytest.raises(errors.BatchNotFound):
            await sql(tx, "SELECT * FROM conveyor.stream_get_batch_cursor(987654321, 'cur', 3)")
        await tx.rollback()


# --------------------------------------------------------------------------- batches


async def test_next_batch_takes_one_tick_at_a_time_and_returns_the_open_batch_again(conn):
    await streams.create(conn, S)
    await streams.subscribe(conn, S, "c")
    assert await streams.next_batch(conn, S, "c") is None, "no tick after the consumer's position yet"
    await send(conn, S, "a1", "a2")
    await streams.force_tick(conn, S)
    await send(conn, S, "b")
    await streams.force_tick(conn, S)

    first = await streams.next_batch(conn, S, "c")
    assert first is not None and await streams.next_batch(conn, S, "c") == first
    events = await streams.batch_events(conn, first)
    assert payloads(events) == ["a1", "a2"] and {e.batch_id for e in events} == {first}
    assert await streams.stream_of_batch(conn, first) == S
    await streams.ack(conn, first)
    assert await streams.stream_of_batch(conn, first) is None
    for finished in (streams.ack(conn, first), streams.batch_events(conn, first)):
        with pytest.raises(errors.BatchNotFound, match=f"batch {first} does not exist or is finished"):
            await finished

    second = await streams.next_batch(conn, S, "c")
    assert second not in (None, first)
    assert payloads(await streams.batch_events(conn, second)) == ["b"]
    await streams.ack(conn, second)
    assert await streams.next_batch(conn, S, "c") is None


async def test_two_next_batch_calls_at_once_share_one_batch(conn, dsn):
    """Two readers of one consumer (without the cooperative API) ask for its next batch at
    the same moment: the second waits on the first's row and gets the same batch. (PgQ's
    next_batch overwrites the first batch id with a second over the same range: both
    callers would read the events, and the first to finish would void the other's.)"""
    await streams.create(conn, S)
    await streams.subscribe(conn, S, "c")
    await send(conn, S, "x")
    await streams.force_tick(conn, S)
    async with pool.connect(dsn) as first, pool.connect(dsn) as second:
        async with first.transaction():
            taken = await streams.next_batch(first, S, "c")
            [(pid,)] = await sql(second, "SELECT pg_backend_pid()")
            waiting = asyncio.create_task(streams.next_batch(second, S, "c"))
            for _ in range(500):  # until the second call waits on the consumer's row
                [(blocked,)] = await sql(conn, "SELECT cardinality(pg_blocking_pids(%s)) > 0", pid)
                if blocked or waiting.done():
                    break
                await asyncio.sleep(0.01)
            assert blocked, "the second call did not wait for the first"
        assert taken is not None and await waiting == taken
    assert payloads(await streams.batch_events(conn, taken)) == ["x"]
    await streams.ack(conn, taken)
    assert await streams.next_batch(conn, S, "c") is None


async def test_finish_batch_moves_the_position_to_the_batch_end(conn):
    await streams.create(conn, S)
    await streams.subscribe(conn, S, "c")
    await send(conn, S, "x")
    end = await streams.force_tick(conn, S)
    batch = await streams.next_batch(conn, S, "c")
    [(position, next_tick)] = await sql(conn, "SELECT last_tick, next_tick FROM conveyor.stream_consumers")
    assert position < end == next_tick
    assert await sql(conn, "SELECT conveyor.stream_finish_batch(%s)", batch) == [(1,)]
    assert await sql(conn, "SELECT last_tick, next_tick, batch_id FROM conveyor.stream_consumers") == [
        (end, None, None)]
    with pytest.raises(errors.BatchNotFound):
        await sql(conn, "SELECT conveyor.stream_finish_batch(%s)", batch)


async def _three_ticks(conn) -> list[int]:
    """Ticks after the consumer's position T0: T1 (1 event), T2 (2 more), T3 (3 more);
    returns [T0, T1, T2, T3]."""
    await streams.create(conn, S)
    await streams.subscribe(conn, S, "c")
    for n, name in ((1, "one"), (2, "two"), (3, "three")):
        await send(conn, S, *[f"{name}-{i}" for i in range(n)])
        await streams.force_tick(conn, S)
    return await ticks(conn, S)


async def test_next_batch_min_count_takes_the_latest_tick_with_enough_events(conn):
    await _three_ticks(conn)
    assert await streams.next_batch(conn, S, "c", min_count=7) is None, "6 events in all"
    batch = await streams.next_batch(conn, S, "c", min_count=2)
    assert len(await streams.batch_events(conn, batch)) == 6, "up to the latest tick, not the first big enough"
    await streams.ack(conn, batch)
    await send(conn, S, "lone")
    await streams.force_tick(conn, S)
    assert await streams.next_batch(conn, S, "c", min_count=2) is None, "counted from the consumer's position"
    assert payloads(await streams.batch_events(conn, await streams.next_batch(conn, S, "c"))) == ["lone"]


async def test_next_batch_min_interval_needs_that_much_time_between_the_ticks(conn):
    t0, t1, _t2, _t3 = await _three_ticks(conn)
    assert await streams.next_batch(conn, S, "c", min_interval=dt.timedelta(minutes=1)) is None
    # the consumer's position 20 minutes ago, T1 10 minutes ago, T2 and T3 now
    await age_tick(conn, t0, "20 minutes")
    await age_tick(conn, t1, "10 minutes")
    assert await streams.next_batch(conn, S, "c", min_interval=dt.timedelta(minutes=25)) is None
    batch = await streams.next_batch(conn, S, "c", min_interval=dt.timedelta(minutes=15))
    assert len(await streams.batch_events(conn, batch)) == 6


async def test_next_batch_min_lag_takes_only_ticks_that_old(conn):
    t0, t1, t2, _t3 = await _three_ticks(conn)
    assert await streams.next_batch(conn, S, "c", min_lag=dt.timedelta(minutes=1)) is None
    await age_tick(conn, t0, "20 minutes")
    await age_tick(conn, t1, "10 minutes")
    await age_tick(conn, t2, "1 minute")
    assert await streams.next_batch(conn, S, "c", min_lag=dt.timedelta(minutes=15)) is None
    # min_lag filters, min_count / min_interval choose among what is left
    assert await streams.next_batch(conn, S, "c", min_lag=dt.timedelta(minutes=5), min_count=2) is None
    assert await streams.next_batch(conn, S, "c", min_lag=dt.timedelta(minutes=5),
                                    min_interval=dt.timedelta(minutes=15)) is None, "T1 is 10 minutes after T0"
    batch = await streams.next_batch(conn, S, "c", min_lag=dt.timedelta(minutes=5))
    assert payloads(await streams.batch_events(conn, batch)) == ["one-0"], "the latest tick 5 minutes old: T1"
    await streams.ack(conn, batch)
    batch = await streams.next_batch(conn, S, "c", min_lag=dt.timedelta(seconds=30), min_count=2)
    assert payloads(await streams.batch_events(conn, batch)) == ["two-0", "two-1"], "T2; T3 is too recent"


async def test_batch_retry_brings_every_event_back_for_that_consumer_only(conn):
    await streams.create(conn, S)
    for consumer in ("a", "b"):
        await streams.subscribe(conn, S, consumer)
    await send(conn, S, "e1", "e2", "e3")
    await streams.force_tick(conn, S)
    first_a = await streams.receive(conn, S, "a")
    first_b = await streams.receive(conn, S, "b")
    assert payloads(first_a) == payloads(first_b) == ["e1", "e2", "e3"]
    assert all(e.retry_count is None for e in first_a)

    assert await streams.batch_retry(conn, first_a[0].batch_id, 0) == 3
    assert (await stats_of(conn, S)).pending_retries == 3
    assert await streams.stream_of_batch(conn, first_a[0].batch_id) == S, "the batch stays open until finished"
    await streams.ack(conn, first_a[0].batch_id)
    await streams.ack(conn, first_b[0].batch_id)
    assert (S, "retries", 3) in await streams.maint(conn)
    assert (await stats_of(conn, S)).pending_retries == 0
    await streams.force_tick(conn, S)

    again = await streams.receive(conn, S, "a")
    assert [(e.id, e.payload, e.type, e.created_at) for e in again] == [
        (e.id, e.payload, e.type, e.created_at) for e in first_a], "the same events: same ids, same times"
    assert [e.retry_count for e in again] == [1, 1, 1]
    assert again[0].batch_id != first_a[0].batch_id
    assert await streams.receive(conn, S, "b") == [], "b does not see a's retries"
    assert (await consumer_stats_of(conn, S))["b"].batch_active is False, "b's empty batch was finished"

    assert await streams.batch_retry(conn, again[0].batch_id, 0) == 3
    await streams.ack(conn, again[0].batch_id)
    await streams.maint(conn)
    await streams.force_tick(conn, S)
    assert [e.retry_count for e in await drain(conn, S, "a")] == [2, 2, 2]
    assert await streams.receive(conn, S, "b") == []


async def test_event_retry_puts_one_event_back_after_retry_seconds(conn):
    await streams.create(conn, S)
    for consumer in ("a", "b"):
        await streams.subscribe(conn, S, consumer)
    ids = await send(conn, S, "ok", "flaky")
    await streams.force_tick(conn, S)
    batch = (await streams.receive(conn, S, "a"))[0].batch_id
    await streams.event_retry(conn, batch, ids[1], 3600)
    with pytest.raises(errors.InvalidInput, match=f"event {ids[1] + 100} is not in batch {batch}"):
        await streams.event_retry(conn, batch, ids[1] + 100, 0)
    await streams.ack(conn, batch)
    assert payloads(await drain(conn, S, "b")) == ["ok", "flaky"]

    assert not [op for _, op, _ in await streams.maint(conn) if op == "retries"], "not due for an hour"
    await streams.force_tick(conn, S)
    assert await streams.receive(conn, S, "a") == []
    assert (await stats_of(conn, S)).pending_retries == 1
    # due now rather than in an hour
    await sql(conn, "UPDATE conveyor.stream_retries SET retry_at = now() - interval '1 second'")
    assert (S, "retries", 1) in await streams.maint(conn)
    await streams.force_tick(conn, S)
    [back] = await drain(conn, S, "a")
    assert (back.id, back.payload, back.retry_count) == (ids[1], "flaky", 1)
    assert await streams.receive(conn, S, "b") == []


# --------------------------------------------------------------------------- scheduled events


async def test_append_at_a_future_time_stays_out_until_due(conn):
    await streams.create(conn, S)
    await streams.subscribe(conn, S, "c")
    event = types.StreamEventIn(payload="later", type="remind", extra1="x1", extra4="x4")
    entry = await streams.append_at(conn, S, event, dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    assert await sql(conn, "SELECT ev_type, ev_data FROM conveyor.stream_delayed WHERE id = %s", entry) == [
        ("remind", "later")], "the id of the scheduled entry"
    assert (await stats_of(conn, S)).delayed == 1
    assert not [op for _, op, _ in await streams.maint(conn) if op == "delayed"]
    await streams.force_tick(conn, S)
    assert await streams.receive(conn, S, "c") == []

    # due now rather than in an hour
    await sql(conn, "UPDATE conveyor.stream_delayed SET deliver_at = now() - interval '1 second' WHERE id = %s", entry)
    assert (S, "delayed", 1) in await streams.maint(conn)
    assert (await stats_of(conn, S)).delayed == 0
    await streams.force_tick(conn, S)
    [got] = await drain(conn, S, "c")
    assert (got.type, got.payload, got.extra1, got.extra2, got.extra3, got.extra4, got.retry_count) == (
        "remind", "later", "x1", None, None, "x4", None)


async def test_append_at_a_past_time_appends_now_and_returns_the_event_id(conn):
    await streams.create(conn, S)
    await streams.subscribe(conn, S, "c")
    event_id = await streams.append_at(conn, S, types.StreamEventIn(payload="now", extra2="e2"),
                                       dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1))
    assert (await stats_of(conn, S)).delayed == 0
    await streams.force_tick(conn, S)
    [got] = await drain(conn, S, "c")
    assert (got.id, got.type, got.payload, got.extra2) == (event_id, "default", "now", "e2")
    with pytest.raises(errors.StreamNotFound):
        await streams.append_at(conn, "nope", types.StreamEventIn(payload="x"), dt.datetime.now(dt.UTC))


async def test_scheduled_events_enter_the_stream_in_due_order(conn):
    await streams.create(conn, S)
    await streams.subscribe(conn, S, "c")
    now = dt.datetime.now(dt.UTC)
    await streams.append_at(conn, S, types.StreamEventIn(payload="second"), now + dt.timedelta(hours=2))
    await streams.append_at(conn, S, types.StreamEventIn(payload="first"), now + dt.timedelta(hours=1))
    # both due, keeping their order
    await sql(conn, "UPDATE conveyor.stream_delayed SET deliver_at = deliver_at - interval '3 hours'")
    assert (S, "delayed", 2) in await streams.maint(conn)
    await streams.force_tick(conn, S)
    got = await drain(conn, S, "c")
    assert payloads(got) == ["first", "second"] and got[0].id < got[1].id


# --------------------------------------------------------------------------- the ticker


async def test_ticker_ticks_once_ticker_max_count_events_arrived(conn):
    await streams.create(conn, S, {"ticker_max_count": 3, "ticker_max_lag": "1 hour", "ticker_idle_period": "1 hour"})
    assert await streams.ticker(conn) == 0, "the stream was ticked when created"
    await send(conn, S, "1", "2")
    assert await streams.ticker(conn) == 0
    await send(conn, S, "3")
    before = await last_tick(conn, S)
    assert await streams.ticker(conn) == 1
    assert await last_tick(conn, S) > before
    assert await streams.ticker(conn) == 0, "nothing new since"


async def test_ticker_ticks_after_ticker_max_lag_only_when_events_wait(conn):
    await streams.create(conn, S, {"ticker_max_count": 1000, "ticker_max_lag": "1 minute",
                                   "ticker_idle_period": "1 day"})
    await send(conn, S, "x")
    assert await streams.ticker(conn) == 0, "the last tick is younger than ticker_max_lag"
    await age_tick(conn, await last_tick(conn, S), "2 minutes")
    assert await streams.ticker(conn) == 1
    await age_tick(conn, await last_tick(conn, S), "2 minutes")
    assert await streams.ticker(conn) == 0, "no event waits: ticker_max_lag alone does not tick"

    await streams.configure(conn, S, {"ticker_max_lag": 0})
    assert await streams.ticker(conn) == 0
    await send(conn, S, "y")
    assert await streams.ticker(conn) == 1, "ticker_max_lag 0: every event is ticked at the next call"


async def test_an_event_committed_after_the_tick_that_counted_it_is_ticked_without_waiting_for_idle(dsn, conn):
    """A tick while an append's transaction is still open counts the event's id (the
    sequence gave it) but cannot see the event. Once it commits, the next ticker call
    after ticker_max_lag ticks it, rather than leaving it for the idle period's tick."""
    await streams.create(conn, S, {"ticker_max_lag": 0, "ticker_idle_period": "1 hour"})
    await streams.subscribe(conn, S, "c")
    async with pool.connect(dsn) as producer:
        async with producer.transaction():
            await send(producer, S, "late")
            assert await streams.ticker(conn) == 1, "the sequence moved: a tick"
        assert await streams.receive(conn, S, "c") == [], "the tick did not see the open transaction"
    assert await streams.ticker(conn) == 1, "the event committed after that tick: another"
    [got] = await streams.receive(conn, S, "c")
    assert got.payload == "late"
    await streams.ack(conn, got.batch_id)
    assert await streams.ticker(conn) == 0, "nothing waits any more"


async def test_ticker_ticks_an_idle_stream_every_ticker_idle_period(conn):
    await streams.create(conn, S, {"ticker_max_lag": "1 hour", "ticker_idle_period": "10 minutes"})
    assert await streams.ticker(conn) == 0
    await age_tick(conn, await last_tick(conn, S), "9 minutes")
    assert await streams.ticker(conn) == 0
    await age_tick(conn, await last_tick(conn, S), "2 minutes")
    assert await streams.ticker(conn) == 1, "no events, but 11 minutes since the last tick"
    assert await streams.ticker(conn) == 0


async def test_force_tick_always_ticks_and_returns_the_new_tick(conn):
    await streams.create(conn, S, {"ticker_max_lag": "1 hour", "ticker_idle_period": "1 hour"})
    first = await streams.force_tick(conn, S)
    second = await streams.force_tick(conn, S)
    assert first < second == await last_tick(conn, S) == (await stats_of(conn, S)).last_tick_id
    assert await tick_count(conn, S) == 3
    with pytest.raises(errors.StreamNotFound):
        await streams.force_tick(conn, "nope")


async def test_ticker_ticks_notify_conveyor_stream_and_the_stream_channel(dsn, conn):
    alpha = await streams.create(conn, "alpha", {"ticker_max_lag": 0})
    beta = await streams.create(conn, "beta", {"ticker_max_lag": "1 hour", "ticker_idle_period": "1 hour"})
    async with listening(dsn, alpha.channel, beta.channel) as notes:
        tick = await streams.force_tick(conn, "beta")
        assert {await asyncio.wait_for(notes.get(), 5) for _ in range(2)} == {
            ("conveyor_stream", "beta"), (beta.channel, str(tick))}
        assert await streams.ticker(conn) == 0
        assert await nothing_arrives(notes), "no tick, no notification"
        await send(conn, "alpha", "x")
        await send(conn, "beta", "x")
        assert await streams.ticker(conn) == 1
        assert {await asyncio.wait_for(notes.get(), 5) for _ in range(2)} == {
            ("conveyor_stream", "alpha"), (alpha.channel, str(await last_tick(conn, "alpha")))}
        assert await nothing_arrives(notes), "only the stream that was ticked"
        async with pool.connect(dsn, autocommit=False) as tx:
            await streams.force_tick(tx, "beta")
            await tx.rollback()
        assert await nothing_arrives(notes), "a tick rolled back is not announced"


# --------------------------------------------------------------------------- rotation


@pytest.mark.own_cluster  # rotation waits for transactions older than the switch, anywhere on the server
async def test_rotation_switches_tables_and_loses_nothing_for_a_lagging_consumer(conn):
    await streams.create(conn, S, {"rotation_period": "1 second"})
    sid = await stream_id(conn, S)
    for consumer in ("fast", "slow"):
        await streams.subscribe(conn, S, consumer)

    async def rotate() -> list[str]:
        """One maint() round with the rotation due (switch_time an hour back: no waiting
        for rotation_period)."""
        await sql(conn, "UPDATE conveyor.streams SET switch_time = now() - interval '1 hour' WHERE id = %s", sid)
        return [op for _, op, _ in await streams.maint(conn)]

    async def maint() -> list[str]:
        return [op for _, op, _ in await streams.maint(conn)]

    async def tables() -> dict[str, str]:
        rows = await sql(conn, f"SELECT ev_data, 'conveyor.' || c.relname FROM conveyor.stream_{sid} e "
                               "JOIN pg_class c ON c.oid = e.tableoid")  # qualified whatever the search_path
        return dict(rows)

    async def cur_table() -> int:
        return (await streams.get(conn, S)).cur_table

    assert await maint() == [], "not due yet"
    await send(conn, S, "e1")
    assert "rotation_step1" in await rotate()
    assert await cur_table() == 1
    assert (await streams.get(conn, S)).switch_time > dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    await send(conn, S, "e2")
    assert await maint() == ["rotation_step2"]
    [(detail,)] = await sql(conn, "SELECT detail FROM conveyor.stream_health() WHERE check_name = 'rotation'")
    assert detail.startswith("last rotation "), "step 2 done"
    await streams.force_tick(conn, S)
    assert await tables() == {"e1": f"conveyor.stream_{sid}_0", "e2": f"conveyor.stream_{sid}_1"}

    # a batch reads the previous table as well as the current one
    assert payloads(await drain(conn, S, "fast")) == ["e1", "e2"]
    # slow still needs the previous table: its position predates the last step 2
    assert "rotation_blocked" in await rotate()
    assert await cur_table() == 1
    await send(conn, S, "e3")
    await streams.force_tick(conn, S)
    assert payloads(await drain(conn, S, "fast")) == ["e3"]

    [first] = [await streams.receive(conn, S, "slow")]
    assert payloads(first) == ["e1", "e2"] and len({e.batch_id for e in first}) == 1
    await streams.ack(conn, first[0].batch_id)
    # slow's position is now past the last step 2: rotation goes on, to table 2
    assert "rotation_step1" in await rotate()
    assert await cur_table() == 2
    await send(conn, S, "e4")
    assert await maint() == ["rotation_step2"]
    await streams.force_tick(conn, S)
    assert "rotation_blocked" in await rotate(), "both positions predate the new step 2"
    assert payloads(await drain(conn, S, "slow")) == ["e3", "e4"], "e3 from the previous table, e4 the current"
    assert payloads(await drain(conn, S, "fast")) == ["e4"]

    # the third rotation truncates table 0, whose events everyone has
    assert "rotation_step1" in await rotate()
    assert await cur_table() == 0
    assert await tables() == {"e2": f"conveyor.stream_{sid}_1", "e3": f"conveyor.stream_{sid}_1",
                              "e4": f"conveyor.stream_{sid}_2"}
    assert await maint() == ["rotation_step2"]
    await send(conn, S, "e5")
    await streams.force_tick(conn, S)
    assert payloads(await drain(conn, S, "slow")) == payloads(await drain(conn, S, "fast")) == ["e5"]


@pytest.mark.own_cluster  # rotation waits for transactions older than the switch, anywhere on the server
async def test_rotation_step_2_pending_shows_in_health(conn):
    await streams.create(conn, S, {"rotation_period": "1 second"})
    await sql(conn, "UPDATE conveyor.streams SET switch_time = now() - interval '1 hour'")  # rotation due
    assert (S, "rotation_step1", 1) in await streams.maint(conn)
    [(status, detail)] = await sql(conn, "SELECT status, detail FROM conveyor.stream_health() "
                                         "WHERE check_name = 'rotation'")
    assert (status, detail) == ("ok", "rotating (step 2 pending)")


async def test_tables_to_vacuum_lists_the_hot_tables_and_each_can_be_vacuumed(conn):
    await streams.create(conn, S)
    listed = [t for (t,) in await sql(conn, "SELECT * FROM conveyor.maint_tables_to_vacuum()")]
    assert listed == list(EVENT_TABLES)
    for table in listed:
        assert await pool.vacuum(conn, table)
    [(vacuumed,)] = await sql(conn, "SELECT count(*) FROM pg_stat_user_tables WHERE schemaname = 'conveyor' "
                                    "AND relname = ANY(%s) AND last_vacuum IS NOT NULL",
                              [t.split(".")[1] for t in listed])
    assert vacuumed == len(listed)


# --------------------------------------------------------------------------- observability


async def test_stats_depth_rate_and_counts_are_typed_numbers(conn):
    await streams.create(conn, S)
    await streams.create(conn, "lonely")
    await streams.subscribe(conn, S, "c")
    st = await stats_of(conn, S)
    assert (st.depth, st.consumers, st.events_per_sec, st.dead_letters, st.pending_retries, st.delayed) == (
        0, 1, None, 0, 0, 0), "one tick only: no rate yet"

    t0 = await last_tick(conn, S)
    await send(conn, S, *[str(i) for i in range(20)])
    t1 = await streams.force_tick(conn, S)
    # the previous tick exactly 10 seconds before the latest: 20 events / 10 s
    await sql(conn, "UPDATE conveyor.stream_ticks SET tick_time = (SELECT tick_time FROM conveyor.stream_ticks "
                    "WHERE tick_id = %s) - interval '10 seconds' WHERE tick_id = %s", t1, t0)
    await send(conn, S, "not ticked yet")
    st = await stats_of(conn, S)
    assert st.depth == 20 and type(st.depth) is int, "events up to the latest tick"
    assert st.events_per_sec == Decimal("2.000") and isinstance(st.events_per_sec, Decimal)
    assert st.last_tick_id == t1 and isinstance(st.last_tick_time, dt.datetime)
    assert dt.timedelta(seconds=10) <= st.oldest_event_age < dt.timedelta(minutes=1)
    assert (st.cur_table, st.rotation_period, st.ticker_paused) == (0, dt.timedelta(hours=2), False)
    assert dt.timedelta(0) <= st.rotation_age < dt.timedelta(minutes=1)

    await streams.append_at(conn, S, types.StreamEventIn(payload="later"),
                            dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    events = await streams.receive(conn, S, "c")
    await streams.dead_letter(conn, events[0].batch_id, events[0].id, "bad")
    await streams.event_retry(conn, events[0].batch_id, events[1].id, 3600)
    await streams.ack(conn, events[0].batch_id)
    st = await stats_of(conn, S)
    assert (st.depth, st.dead_letters, st.pending_retries, st.delayed) == (0, 1, 1, 1)

    lonely = await stats_of(conn, "lonely")
    assert (lonely.depth, lonely.consumers, lonely.oldest_event_age) == (0, 0, None), "no consumer, no depth"


async def test_consumer_stats_lag_pending_and_the_open_batch(conn):
    await streams.create(conn, S)
    for consumer in ("a", "b"):
        await streams.subscribe(conn, S, consumer)
    t0 = await last_tick(conn, S)
    await send(conn, S, "1", "2", "3", "4")
    await streams.force_tick(conn, S)
    batch = (await streams.receive(conn, S, "a"))[0].batch_id

    cs = await consumer_stats_of(conn, S)
    assert (cs["a"].batch_active, cs["a"].batch_id, cs["a"].pending_events) == (True, batch, 4), \
        "pending until acknowledged"
    assert dt.timedelta(0) <= cs["a"].batch_age < dt.timedelta(minutes=1)
    assert (cs["b"].batch_active, cs["b"].batch_id, cs["b"].batch_age, cs["b"].pending_events) == (
        False, None, None, 4)

    await streams.ack(conn, batch)
    await age_tick(conn, t0, "90 minutes")  # b's position is an hour and a half old
    cs = await consumer_stats_of(conn, S)
    assert (cs["a"].pending_events, cs["a"].batch_active) == (0, False)
    assert cs["a"].lag < dt.timedelta(minutes=1)
    assert dt.timedelta(minutes=90) <= cs["b"].lag < dt.timedelta(minutes=91)
    assert cs["a"].last_seen > cs["b"].last_seen, "receiving and acknowledging count as activity"


async def test_a_poll_with_nothing_new_is_a_read(conn):
    """An idle consumer polls: as PgQ's next_batch, a call that makes no batch writes
    nothing (it took a transaction id, a WAL record and a flush at commit for active_at);
    the consumer is active when it takes a batch and when it finishes one."""
    await streams.create(conn, S)
    await streams.subscribe(conn, S, "idle")
    await sql(conn, "SELECT conveyor.stream_send(%s, 'x')", S)
    await sql(conn, "SELECT conveyor.stream_force_tick(%s)", S)
    [(before,)] = await sql(conn, "SELECT active_at FROM conveyor.stream_consumers WHERE name = 'idle'")
    got = await streams.receive(conn, S, "idle")
    await streams.ack(conn, got[0].batch_id)
    [(after,)] = await sql(conn, "SELECT active_at FROM conveyor.stream_consumers WHERE name = 'idle'")
    assert after > before
    for call in ("SELECT count(*) FROM conveyor.stream_receive(%s, 'idle')",
                 "SELECT conveyor.stream_next_batch(%s, 'idle')"):
        async with conn.transaction(force_rollback=True):
            await sql(conn, call, S)
            [(xid,)] = await sql(conn, "SELECT pg_current_xact_id_if_assigned()")
        assert xid is None, call
    [(still,)] = await sql(conn, "SELECT active_at FROM conveyor.stream_consumers WHERE name = 'idle'")
    assert still == after


async def test_health_reports_each_check_as_ok_warning_or_critical(conn):
    for name in ("fine", "late", "paused", "lagging", "overdue", "dead", "flood"):
        await streams.create(conn, name)
        await streams.subscribe(conn, name, "w")
    await streams.configure(conn, "paused", {"ticker_paused": True})
    # lagging: the consumer's position 90 minutes old (> rotation_period / 2 of 2 hours),
    # aged below with "late"
    position = await last_tick(conn, "lagging")
    await streams.force_tick(conn, "lagging")
    # overdue: the last rotation 5 hours ago (> 2 × rotation_period)
    await sql(conn, "UPDATE conveyor.streams SET switch_time = now() - interval '5 hours' WHERE name = 'overdue'")
    # dead: one dead letter now and one from two hours ago; flood: 1001 in the last hour
    for name, n in (("dead", 2), ("flood", 1001)):
        await send(conn, name, *[str(i) for i in range(n)])
        await streams.force_tick(conn, name)
        batch = await streams.next_batch(conn, name, "w")
        await sql(conn, "SELECT count(conveyor.stream_dead_letter(%s, id)) FROM conveyor.stream_get_batch_events(%s)",
                  batch, batch)
        await streams.ack(conn, batch)
    await sql(conn, "UPDATE conveyor.stream_dead_letters SET dead_at = dead_at - interval '2 hours' "
                    "WHERE id = (SELECT min(id) FROM conveyor.stream_dead_letters)")
    # late: no tick for 10 minutes (> 2 × ticker_idle_period + 30 s); set last (with the
    # lagging position), from now(), so the time the steps above take does not show in the
    # reported ages
    await sql(conn, "UPDATE conveyor.stream_ticks SET tick_time = now() - interval '10 minutes' "
                    "WHERE stream_id = (SELECT id FROM conveyor.streams WHERE name = 'late')")
    await sql(conn, "UPDATE conveyor.stream_ticks SET tick_time = now() - interval '90 minutes' WHERE tick_id = %s",
              position)

    health = {(s, check): (status, detail) for s, check, status, detail in await streams.health(conn)}
    status = {key: st for key, (st, _) in health.items()}
    assert {check for s, check in health if s == "fine"} == {"ticker", "consumer_lag:w", "rotation", "dead_letters"}
    assert {v for (s, _), v in status.items() if s == "fine"} == {"ok"}
    assert status["late", "ticker"] == "critical" and health["late", "ticker"][1] == "last tick 00:10:00 ago"
    assert ("paused", "ticker") not in status, "a paused stream's ticker is not checked"
    assert status["lagging", "consumer_lag:w"] == "warning"
    assert health["lagging", "consumer_lag:w"][1] == "w is 01:30:00 behind (0 events)"
    assert status["overdue", "rotation"] == "warning" and status["fine", "rotation"] == "ok"
    assert health["dead", "dead_letters"] == ("warning", "1 new in the last hour, 2 in all")
    assert health["flood", "dead_letters"] == ("critical", "1001 new in the last hour, 1001 in all")
    await sql(conn, "UPDATE conveyor.stream_dead_letters SET dead_at = dead_at - interval '2 hours'")
    assert ("dead", "dead_letters", "ok", "0 new in the last hour, 2 in all") in await streams.health(conn)


async def test_otel_metrics_names_types_values_and_labels(conn):
    await streams.create(conn, S)
    await streams.create(conn, "lonely")
    await streams.subscribe(conn, S, "c")
    await send(conn, S, "1", "2", "3")
    await streams.force_tick(conn, S)
    rows = await sql(conn, "SELECT metric_name, metric_type, value, labels FROM conveyor.otel_metrics()")
    assert {t for _, t, _, _ in rows} == {"gauge"}
    assert all(isinstance(v, Decimal) for _, _, v, _ in rows)
    per_stream = ("conveyor.stream.depth", "conveyor.stream.oldest_event_age_seconds",
                  "conveyor.stream.throughput", "conveyor.stream.dead_lettered")
    per_consumer = ("conveyor.consumer.lag_seconds", "conveyor.consumer.pending_events")
    assert sorted((m, tuple(sorted(labels.items()))) for m, _, _, labels in rows) == sorted(
        [(m, (("stream", s),)) for m in per_stream for s in (S, "lonely")]
        + [(m, (("consumer", "c"), ("stream", S))) for m in per_consumer])
    value = {(m, labels["stream"]): v for m, _, v, labels in rows}
    assert value["conveyor.stream.depth", S] == 3 and value["conveyor.consumer.pending_events", S] == 3
    assert value["conveyor.stream.dead_lettered", S] == 0
    assert value["conveyor.stream.oldest_event_age_seconds", "lonely"] == 0, "no consumer: 0, not null"
    assert value["conveyor.stream.throughput", S] > 0
    assert 0 <= value["conveyor.consumer.lag_seconds", S] < 60


async def test_stream_in_flight_lists_open_batches(conn):
    await streams.create(conn, S)
    for consumer in ("b", "a", "idle"):
        await streams.subscribe(conn, S, consumer)
    await send(conn, S, *"12345")
    await streams.force_tick(conn, S)
    assert await sql(conn, "SELECT * FROM conveyor.stream_in_flight(%s)", S) == []
    batch_b = await streams.next_batch(conn, S, "b")
    batch_a = await streams.next_batch(conn, S, "a")
    rows = await sql(conn, "SELECT * FROM conveyor.stream_in_flight(%s)", S)
    assert [(c, b, n) for c, b, _, n in rows] == [("a", batch_a, 5), ("b", batch_b, 5)]
    assert all(dt.timedelta(0) <= age < dt.timedelta(minutes=1) for _, _, age, _ in rows)
    await streams.ack(conn, batch_a)
    assert [c for c, *_ in await sql(conn, "SELECT * FROM conveyor.stream_in_flight(%s)", S)] == ["b"]
    with pytest.raises(errors.StreamNotFound):
        await sql(conn, "SELECT * FROM conveyor.stream_in_flight('nope')")


async def test_stuck_consumers_are_those_lagging_past_the_threshold(conn):
    for name in ("s1", "s2"):
        await streams.create(conn, name)
        for consumer in ("old", "new"):
            await streams.subscribe(conn, name, consumer)
    await age_tick(conn, await last_tick(conn, "s1"), "3 hours")
    await age_tick(conn, await last_tick(conn, "s2"), "2 hours")
    for name in ("s1", "s2"):
        await streams.force_tick(conn, name)
        await drain(conn, name, "new")
    stuck = await sql(conn, "SELECT stream, consumer, lag, last_seen FROM conveyor.stuck_consumers()")
    assert [(s, c) for s, c, _, _ in stuck] == [("s1", "old"), ("s2", "old")], "default 1 hour, worst first"
    assert stuck[0][2] > dt.timedelta(hours=3) and isinstance(stuck[0][3], dt.datetime)
    assert [s for s, *_ in await sql(conn, "SELECT * FROM conveyor.stuck_consumers('150 minutes')")] == ["s1"]
    assert await sql(conn, "SELECT * FROM conveyor.stuck_consumers('1 day')") == []


async def test_stream_throughput_buckets_events_by_tick_time(conn):
    await streams.create(conn, S)
    t0 = await last_tick(conn, S)
    await send(conn, S, *"123456")
    t1 = await streams.force_tick(conn, S)
    await send(conn, S, *"1234")
    t2 = await streams.force_tick(conn, S)
    [(now,)] = await sql(conn, "SELECT now()")
    minute = now.replace(second=0, microsecond=0)
    # T0 half an hour ago, T1 10 and T2 7 minutes ago (5 seconds into their minutes)
    for tick, at in ((t0, now - dt.timedelta(minutes=30)), (t1, minute - dt.timedelta(minutes=10, seconds=-5)),
                     (t2, minute - dt.timedelta(minutes=7, seconds=-5))):
        await sql(conn, "UPDATE conveyor.stream_ticks SET tick_time = %s WHERE tick_id = %s", at, tick)
    rows = await sql(conn, "SELECT * FROM conveyor.stream_throughput(%s)", S)
    assert rows == [(minute - dt.timedelta(minutes=10), 6, Decimal("0.100")),
                    (minute - dt.timedelta(minutes=7), 4, Decimal("0.067"))]
    rows = await sql(conn, "SELECT * FROM conveyor.stream_throughput(%s, '1 hour', '1 hour')", S)
    assert sum(n for _, n, _ in rows) == 10
    with pytest.raises(errors.InvalidInput, match="bucket must be a positive interval"):
        await sql(conn, "SELECT * FROM conveyor.stream_throughput(%s, '1 hour', '0 seconds')", S)
    with pytest.raises(errors.StreamNotFound):
        await sql(conn, "SELECT * FROM conveyor.stream_throughput('nope')")


async def test_stream_throughput_counts_the_first_tick_inside_the_period(conn):
    """A quiet stream ticks less often than once a bucket (here every 15 minutes: an
    event now and then, ticker_idle_period 30 minutes). The 4 events of the tick 5
    minutes ago belong to the last 15 minutes, however long before it the previous
    tick was."""
    await streams.create(conn, S, {"ticker_idle_period": "30 minutes"})
    t0 = await last_tick(conn, S)
    await send(conn, S, *"123")
    t1 = await streams.force_tick(conn, S)
    await send(conn, S, *"4567")
    t2 = await streams.force_tick(conn, S)
    [(now,)] = await sql(conn, "SELECT now()")
    minute = now.replace(second=0, microsecond=0)
    # T0 35, T1 20 and T2 5 minutes ago (5 seconds into their minutes)
    for tick, back in ((t0, 35), (t1, 20), (t2, 5)):
        await sql(conn, "UPDATE conveyor.stream_ticks SET tick_time = %s WHERE tick_id = %s",
                  minute - dt.timedelta(minutes=back, seconds=-5), tick)
    assert await sql(conn, "SELECT * FROM conveyor.stream_throughput(%s, '15 minutes', '1 minute')", S) == [
        (minute - dt.timedelta(minutes=5), 4, Decimal("0.067"))]
    assert [n for _, n, _ in await sql(conn, "SELECT * FROM conveyor.stream_throughput(%s)", S)] == [3, 4]


# --------------------------------------------------------------------------- errors


async def test_unknown_consumer_is_consumer_not_found(conn):
    await streams.create(conn, S)
    with pytest.raises(errors.ConsumerNotFound, match="consumer 'ghost' is not subscribed to stream 'orders'"):
        await streams.receive(conn, S, "ghost")
    with pytest.raises(errors.ConsumerNotFound):
        await streams.next_batch(conn, S, "ghost", min_count=1)
    assert await streams.unsubscribe(conn, S, "ghost") is False
    assert await streams.subscribe(conn, S, "c") is True
    assert await streams.subscribe(conn, S, "c") is False, "already subscribed"
    assert await streams.unsubscribe(conn, S, "c") is True
    with pytest.raises(errors.ConsumerNotFound):
        await streams.receive(conn, S, "c")
    for bad in ("", "a b", "a/b", "x" * 81):
        with pytest.raises(errors.InvalidInput, match="invalid consumer name"):
            await streams.subscribe(conn, S, bad)
    for op in (streams.subscribe, streams.unsubscribe, streams.receive):
        with pytest.raises(errors.StreamNotFound):
            await op(conn, "nope", "c")


async def test_unknown_or_finished_batch_is_batch_not_found(conn):
    await streams.create(conn, S)
    await streams.subscribe(conn, S, "c")
    [event_id] = await send(conn, S, "x")
    await streams.force_tick(conn, S)
    finished = (await streams.receive(conn, S, "c"))[0].batch_id
    await streams.ack(conn, finished)
    for batch in (987654321, finished):
        for op in (streams.ack(conn, batch), streams.batch_events(conn, batch),
                   streams.event_retry(conn, batch, event_id, 0), streams.batch_retry(conn, batch, 0),
                   streams.nack(conn, batch, event_id), streams.dead_letter(conn, batch, event_id)):
            with pytest.raises(errors.BatchNotFound):
                await op
        assert await streams.stream_of_batch(conn, batch) is None
    assert await sql(conn, "SELECT count(*) FROM conveyor.stream_retries") == [(0,)]
    assert await streams.dead_letters(conn, S) == []


async def test_replaying_a_dead_letter_checks_it_exists_in_that_stream(conn):
    for name in ("a", "b"):
        await streams.create(conn, name)
        await streams.subscribe(conn, name, "c")
    [original] = await streams.append(conn, "a", [types.StreamEventIn(payload="p", type="ty", extra3="x3")])
    await streams.force_tick(conn, "a")
    batch = await streams.next_batch(conn, "a", "c")
    await streams.dead_letter(conn, batch, original, "broken")
    await streams.ack(conn, batch)
    [dead] = await streams.dead_letters(conn, "a")
    assert (dead.ev_id, dead.consumer, dead.reason, dead.ev_type, dead.ev_data, dead.ev_extra3) == (
        original, "c", "broken", "ty", "p", "x3")

    for dead_id, stream in ((dead.id, "b"), (dead.id, "nope"), (dead.id + 1000, None), (dead.id + 1000, "a")):
        with pytest.raises(errors.DeadLetterNotFound, match=f"dead letter {dead_id} does not exist"):
            await streams.replay_dead_letter(conn, dead_id, stream)
    assert await streams.dead_letters(conn, "a") == [dead], "still there"

    replayed = await streams.replay_dead_letter(conn, dead.id, "a")
    assert replayed > original
    assert await streams.dead_letters(conn, "a") == []
    with pytest.raises(errors.DeadLetterNotFound):
        await streams.replay_dead_letter(conn, dead.id)
    await streams.force_tick(conn, "a")
    [back] = await drain(conn, "a", "c")
    assert (back.id, back.type, back.payload, back.extra3, back.retry_count) == (replayed, "ty", "p", "x3", None)
    assert await streams.receive(conn, "b", "c") == []


async def test_replay_all_and_purge_dead_letters(conn):
    await streams.create(conn, S)
    await streams.subscribe(conn, S, "c")
    await send(conn, S, "d1", "d2", "d3")
    await streams.force_tick(conn, S)
    events = await streams.receive(conn, S, "c")
    for e in events:
        await streams.dead_letter(conn, e.batch_id, e.id)
    await streams.ack(conn, events[0].batch_id)
    assert [d.reason for d in await streams.dead_letters(conn, S, 2)] == ["dead-lettered by consumer"] * 2
    assert await streams.purge_dead_letters(conn, S, dt.timedelta(hours=1)) == 0
    assert await streams.replay_dead_letters(conn, S) == 3
    assert await streams.replay_dead_letters(conn, S) == 0
    await streams.force_tick(conn, S)
    assert payloads(await drain(conn, S, "c")) == ["d1", "d2", "d3"]
    await sql(conn, "INSERT INTO conveyor.stream_dead_letters (stream_id, consumer, ev_id, ev_time, dead_at) "
                    "VALUES (%s, 'c', 1, now(), now() - interval '2 hours')", await stream_id(conn, S))
    assert await streams.purge_dead_letters(conn, S, dt.timedelta(hours=1)) == 1
    with pytest.raises(errors.StreamNotFound):
        await streams.replay_dead_letters(conn, "nope")


TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def test_the_trace_stays_with_an_event_through_retries_dead_letters_replays_and_delays(conn):
    """Migration 0013: the traceparent an event is appended with reaches every consumer,
    and every place the engine moves the event to keeps it."""
    await streams.create(conn, S, {"max_retries": 1})
    await streams.subscribe(conn, S, "c")
    [traced, plain] = await streams.append(conn, S, [types.StreamEventIn(payload="t", traceparent=TRACE),
                                                     types.StreamEventIn(payload="p")])
    await streams.force_tick(conn, S)
    first = await streams.receive(conn, S, "c")
    assert [(e.id, e.traceparent) for e in first] == [(traced, TRACE), (plain, None)]
    batch = first[0].batch_id
    assert await streams.nack(conn, batch, traced, dt.timedelta(0)) == "retry"
    await streams.ack(conn, batch)
    await streams.maint(conn)
    await streams.force_tick(conn, S)
    [retried] = await streams.receive(conn, S, "c")
    assert (retried.id, retried.retry_count, retried.traceparent) == (traced, 1, TRACE)
    assert await streams.nack(conn, retried.batch_id, traced, dt.timedelta(0), "still bad") == "dead"
    await streams.ack(conn, retried.batch_id)
    [dead] = await streams.dead_letters(conn, S)
    assert (dead.ev_id, dead.ev_traceparent) == (traced, TRACE)

    replayed = await streams.replay_dead_letter(conn, dead.id, S)
    entry = await streams.append_at(conn, S, types.StreamEventIn(payload="later", traceparent=TRACE),
                                    dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    now_id = await streams.append_at(conn, S, types.StreamEventIn(payload="now", traceparent=TRACE),
                                     dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1))
    await sql(conn, "UPDATE conveyor.stream_delayed SET deliver_at = now() - interval '1 second' WHERE id = %s", entry)
    assert (S, "delayed", 1) in await streams.maint(conn)
    await streams.force_tick(conn, S)
    got = await drain(conn, S, "c")
    assert [(e.payload, e.traceparent) for e in got] == [("t", TRACE), ("now", TRACE), ("later", TRACE)]
    assert got[0].id == replayed and got[1].id == now_id

    await streams.append(conn, S, [types.StreamEventIn(payload="again", traceparent=TRACE)])
    await streams.force_tick(conn, S)
    [again] = await streams.receive(conn, S, "c")
    assert await streams.batch_retry(conn, again.batch_id, 0) == 1
    await streams.ack(conn, again.batch_id)
    await streams.maint(conn)
    await streams.force_tick(conn, S)
    [back] = await streams.receive(conn, S, "c")
    assert (back.payload, back.traceparent) == ("again", TRACE)
    await streams.dead_letter(conn, back.batch_id, back.id)
    await streams.ack(conn, back.batch_id)
    assert await streams.replay_dead_letters(conn, S) == 1
    await streams.force_tick(conn, S)
    assert [(e.payload, e.traceparent) for e in await drain(conn, S, "c")] == [("again", TRACE)]


async def test_bad_append_and_receive_arguments(conn):
    await streams.create(conn, S)
    await streams.subscribe(conn, S, "c")
    with pytest.raises(errors.StreamNotFound):
        await send(conn, "nope", "x")
    with pytest.raises(errors.InvalidInput, match="events must be a non-empty JSON array"):
        await streams.append(conn, S, [])
    with pytest.raises(errors.InvalidInput, match="max_return must be at least 1"):
        await streams.receive(conn, S, "c", 0)
    ids = await streams.append(conn, S, [types.StreamEventIn(payload=p) for p in "abc"])
    assert ids == sorted(ids) and len(set(ids)) == 3, "ids in input order"
