"""conveyor.client against a real PostgreSQL: handlers, acknowledgement, retries, dead
letters, transactional batches, crashes, graceful shutdown, LISTEN wake-ups, producers.

No server runs: the tests tick the stream (and run maintenance) themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from conveyor import errors
from conveyor.client import Consumer, Context, DeadLetter, Producer, StreamEvent, StreamEventIn, append, append_batch
from conveyor.core import streams
from conveyor.db import pool

STREAM = "orders"
NAME = "billing"


async def setup(conn, options: dict | None = None, consumer: str = NAME) -> None:
    await streams.create(conn, STREAM, options)
    await streams.subscribe(conn, STREAM, consumer)


async def send(conn, *events: tuple[str, str]) -> list[int]:
    """Append (type, payload) events and tick, so that they form a batch."""
    ids = await streams.append(conn, STREAM, [StreamEventIn(payload=p, type=t) for t, p in events])
    await streams.force_tick(conn, STREAM)
    return ids


async def retries_due(conn) -> None:
    """Move due retries back into the stream and tick, as the server would."""
    await streams.maint(conn)
    await streams.maint(conn)
    await streams.force_tick(conn, STREAM)


async def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def stop_and_wait(consumer: Consumer, task: asyncio.Task, timeout: float = 10) -> None:
    consumer.stop()
    await asyncio.wait_for(task, timeout)


# -- handlers and acknowledgement ---------------------------------------------------------


async def test_handlers_per_type_fallback_and_auto_ack(dsn, conn):
    await setup(conn)
    consumer = Consumer(dsn, STREAM, NAME)
    seen: list[tuple[str, str, str]] = []

    @consumer.handler("order.created")
    async def created(event: StreamEvent, ctx: Context) -> None:
        assert ctx.conn is None and ctx.stream == STREAM and ctx.consumer == NAME
        assert ctx.batch_id == event.batch_id
        seen.append(("created", event.type, event.payload))

    @consumer.handler("order.paid", "order.refunded")
    def money(event: StreamEvent, ctx: Context) -> None:  # sync handlers run in a worker thread
        assert threading.current_thread() is not threading.main_thread()
        seen.append(("money", event.type, event.payload))

    @consumer.handler
    async def other(event: StreamEvent, ctx: Context) -> None:
        seen.append(("fallback", event.type, event.payload))

    ids = await send(conn, ("order.created", "1"), ("order.paid", "2"), ("order.shipped", "3"),
                     ("order.refunded", "4"))
    result = await consumer.process_batch()
    assert (result.events, result.retried, result.dead_lettered) == (4, 0, 0)
    assert seen == [("created", "order.created", "1"), ("money", "order.paid", "2"),
                    ("fallback", "order.shipped", "3"), ("money", "order.refunded", "4")]

    # acknowledged: the next batch holds only what came after
    seen.clear()
    new = await send(conn, ("order.created", "5"))
    assert (await consumer.process_batch()).events == 1
    assert seen == [("created", "order.created", "5")]
    assert new[0] > max(ids)
    assert (await consumer.process_batch()).batch_id is None
    assert await streams.receive(conn, STREAM, NAME) == []


async def test_registration_rules(dsn):
    consumer = Consumer(dsn, STREAM, NAME)
    with pytest.raises(ValueError, match="no handlers"):
        await consumer.run(install_signal_handlers=False)
    consumer.handler("a")(lambda e, c: None)
    consumer.handler("*")(lambda e, c: None)
    with pytest.raises(ValueError, match="already registered"):
        consumer.handler("a")(lambda e, c: None)
    with pytest.raises(ValueError, match="already registered"):
        consumer.handler()(lambda e, c: None)


async def test_no_handler_and_no_fallback_dead_letters(dsn, conn):
    await setup(conn)
    consumer = Consumer(dsn, STREAM, NAME)
    handled = []
    consumer.handler("known")(lambda e, c: handled.append(e.payload))
    await send(conn, ("known", "a"), ("unknown", "b"))
    result = await consumer.process_batch()
    assert (result.events, result.dead_lettered) == (2, 1)
    assert handled == ["a"]
    [dead] = await streams.dead_letters(conn, STREAM)
    assert (dead.ev_type, dead.ev_data, dead.reason, dead.consumer) == ("unknown", "b", "no handler for type unknown",
                                                                        NAME)


async def test_batch_larger_than_batch_size_is_processed_whole(dsn, conn):
    await setup(conn)
    consumer = Consumer(dsn, STREAM, NAME, batch_size=2)
    handled = []
    consumer.handler()(lambda e, c: handled.append(e.payload))
    await send(conn, *[("t", str(i)) for i in range(5)])
    assert (await consumer.process_batch()).events == 5
    assert handled == ["0", "1", "2", "3", "4"]
    assert (await consumer.process_batch()).batch_id is None


# -- retries and dead letters ---------------------------------------------------------------


async def test_exception_nacks_and_the_event_comes_back_with_retry_count_1(dsn, conn):
    await setup(conn)
    consumer = Consumer(dsn, STREAM, NAME, retry_after=timedelta(0))
    attempts: list[tuple[str, int | None]] = []

    @consumer.handler()
    async def flaky(event: StreamEvent, ctx: Context) -> None:
        attempts.append((event.payload, event.retry_count))
        if event.payload == "bad" and not event.retry_count:
            raise RuntimeError("downstream is down")

    await send(conn, ("t", "good"), ("t", "bad"))
    result = await consumer.process_batch()
    assert (result.events, result.retried, result.dead_lettered) == (2, 1, 0)

    await retries_due(conn)
    result = await consumer.process_batch()
    assert result.events == 1
    assert attempts == [("good", None), ("bad", None), ("bad", 1)]
    assert await streams.dead_letters(conn, STREAM) == []
    assert (await consumer.process_batch()).batch_id is None


async def test_exhausted_retries_dead_letter_with_the_reason(dsn, conn):
    await setup(conn, {"max_retries": 1})
    consumer = Consumer(dsn, STREAM, NAME, retry_after=timedelta(0))
    error = ValueError("cannot parse 'x'")

    @consumer.handler()
    async def broken(event: StreamEvent, ctx: Context) -> None:
        raise error

    [event_id] = await send(conn, ("t", "x"))
    assert (await consumer.process_batch()).retried == 1
    await retries_due(conn)
    result = await consumer.process_batch()
    assert (result.events, result.retried, result.dead_lettered) == (1, 0, 1)
    [dead] = await streams.dead_letters(conn, STREAM)
    assert (dead.ev_id, dead.ev_retry, dead.reason) == (event_id, 1, repr(error))
    await retries_due(conn)
    assert (await consumer.process_batch()).batch_id is None


async def test_dead_letter_exception_dead_letters_at_once(dsn, conn):
    await setup(conn)
    consumer = Consumer(dsn, STREAM, NAME, retry_after=timedelta(0))

    @consumer.handler()
    async def strict(event: StreamEvent, ctx: Context) -> None:
        if event.payload == "poison":
            raise DeadLetter("payload is not JSON")

    await send(conn, ("t", "ok"), ("t", "poison"))
    result = await consumer.process_batch()
    assert (result.events, result.retried, result.dead_lettered) == (2, 0, 1)
    [dead] = await streams.dead_letters(conn, STREAM)
    assert (dead.ev_data, dead.reason, dead.ev_retry) == ("poison", "payload is not JSON", None)
    await retries_due(conn)
    assert (await consumer.process_batch()).batch_id is None


# -- transactional mode ---------------------------------------------------------------------


async def test_transactional_writes_commit_with_the_ack_and_failures_roll_back(dsn, conn):
    await setup(conn)
    await conn.execute("CREATE TABLE handled (payload text PRIMARY KEY)")
    consumer = Consumer(dsn, STREAM, NAME, transactional=True, retry_after=timedelta(0))

    @consumer.handler()
    async def record(event: StreamEvent, ctx: Context) -> None:
        assert ctx.conn is not None and ctx.conn.info.transaction_status.name == "INTRANS"
        await ctx.conn.execute("INSERT INTO handled VALUES (%s)", (event.payload,))
        if event.payload.startswith("fail"):
            raise RuntimeError("after the write")
        if event.payload.startswith("dead"):
            raise DeadLetter("no")

    await send(conn, ("t", "a"), ("t", "fail-1"), ("t", "b"), ("t", "dead-1"))
    result = await consumer.process_batch()
    assert (result.events, result.retried, result.dead_lettered) == (4, 1, 1)
    rows = await (await conn.execute("SELECT payload FROM handled ORDER BY 1")).fetchall()
    assert rows == [("a",), ("b",)], "a failed handler's writes are rolled back, the others commit"
    assert [d.ev_data for d in await streams.dead_letters(conn, STREAM)] == ["dead-1"]
    await retries_due(conn)
    again = await streams.receive(conn, STREAM, NAME)
    assert [(e.payload, e.retry_count) for e in again] == [("fail-1", 1)], "only the nacked event is back"


async def test_transactional_batch_is_redelivered_when_the_connection_dies_before_commit(dsn, conn):
    await setup(conn)
    await conn.execute("CREATE TABLE handled (payload text PRIMARY KEY)")
    consumer = Consumer(dsn, STREAM, NAME, transactional=True)
    crash = True

    @consumer.handler()
    async def record(event: StreamEvent, ctx: Context) -> None:
        await ctx.conn.execute("INSERT INTO handled VALUES (%s)", (event.payload,))
        if crash and event.payload == "2":
            await ctx.conn.close()  # as if the process died before COMMIT

    ids = await send(conn, ("t", "1"), ("t", "2"), ("t", "3"))
    with pytest.raises(errors.Unavailable):
        await consumer.process_batch()
    assert await (await conn.execute("SELECT count(*) FROM handled")).fetchone() == (0,)
    crash = False
    result = await consumer.process_batch()
    assert result.events == 3
    rows = await (await conn.execute("SELECT payload FROM handled ORDER BY 1")).fetchall()
    assert rows == [("1",), ("2",), ("3",)]
    assert len(ids) == 3


async def test_transactional_handler_that_swallows_a_database_error(dsn, conn):
    """A handler that leaves the transaction aborted cannot be undone by its savepoint:
    the batch is rolled back and run again with that event nacked."""
    await setup(conn)
    await conn.execute("CREATE TABLE handled (payload text)")
    consumer = Consumer(dsn, STREAM, NAME, transactional=True)
    calls = []

    @consumer.handler()
    async def record(event: StreamEvent, ctx: Context) -> None:
        calls.append(event.payload)
        await ctx.conn.execute("INSERT INTO handled VALUES (%s)", (event.payload,))
        if event.payload == "swallow":
            with contextlib.suppress(Exception):  # the bug under test: swallowing the error
                await ctx.conn.execute("SELECT 1/0")

    await send(conn, ("t", "a"), ("t", "swallow"), ("t", "b"))
    result = await consumer.process_batch()
    assert (result.events, result.retried) == (3, 1)
    assert calls == ["a", "swallow", "a", "b"]
    rows = await (await conn.execute("SELECT payload FROM handled ORDER BY 1")).fetchall()
    assert rows == [("a",), ("b",)]


# -- processes: crash, SIGTERM ----------------------------------------------------------------

WORKER = textwrap.dedent("""
    import asyncio, logging, sys
    from conveyor.client import Consumer

    dsn, stream, name, transactional, pause = sys.argv[1:6]
    logging.basicConfig(level=logging.INFO)
    consumer = Consumer(dsn, stream, name, poll_interval=0.2, transactional=transactional == "1")

    @consumer.handler()
    async def handle(event, ctx):
        print("start", event.id, flush=True)
        if ctx.conn is not None:
            await ctx.conn.execute("INSERT INTO handled VALUES (%s)", (event.payload,))
        await asyncio.sleep(float(pause))
        print("done", event.id, flush=True)

    consumer.run_sync()
    print("exit", flush=True)
""")


class Worker:
    """A consumer in a subprocess, its stdout read line by line with deadlines."""

    def __init__(self, tmp_path: Path, dsn: str, transactional: bool, pause: float) -> None:
        script = tmp_path / "worker.py"
        script.write_text(WORKER)
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, str(script), dsn, STREAM, NAME, "1" if transactional else "0", str(pause)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def wait_for(self, prefix: str, timeout: float = 10) -> str:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([self.proc.stdout], [], [], max(remaining, 0))
            if not ready:
                raise AssertionError(f"no {prefix!r} from the worker within {timeout} s: {self.lines}")
            line = self.proc.stdout.readline().decode()
            if not line:
                raise AssertionError(f"worker exited ({self.proc.wait(5)}): {self.proc.stderr.read().decode()}")
            self.lines.append(line.strip())
            if line.startswith(prefix):
                return line.strip()

    def finish(self, timeout: float = 10) -> int:
        """The exit code, after reading the rest of stdout."""
        out, _ = self.proc.communicate(timeout=timeout)
        self.lines += out.decode().splitlines()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(5)
        self.proc.stdout.close()
        self.proc.stderr.close()


@pytest.mark.parametrize("transactional", [False, True], ids=["autocommit", "transactional"])
async def test_killed_consumer_batch_is_redelivered(dsn, conn, tmp_path, transactional):
    await setup(conn)
    await conn.execute("CREATE TABLE handled (payload text PRIMARY KEY)")
    ids = await send(conn, ("t", "1"), ("t", "2"), ("t", "3"))
    worker = Worker(tmp_path, dsn, transactional, pause=30)
    try:
        assert worker.wait_for("start") == f"start {ids[0]}"
        worker.proc.send_signal(signal.SIGKILL)
        assert worker.proc.wait(5) == -signal.SIGKILL
    finally:
        worker.kill()

    assert await (await conn.execute("SELECT count(*) FROM handled")).fetchone() == (0,)
    consumer = Consumer(dsn, STREAM, NAME, transactional=transactional)
    seen = []
    consumer.handler()(lambda e, c: seen.append(e.id))
    # the dead session may take a moment to release its locks (transactional mode)
    result = await asyncio.wait_for(consumer.process_batch(), 10)
    assert seen == ids and result.events == 3


async def test_sigterm_finishes_the_batch_and_exits_0(dsn, conn, tmp_path):
    await setup(conn)
    ids = await send(conn, ("t", "1"), ("t", "2"), ("t", "3"))
    worker = Worker(tmp_path, dsn, transactional=False, pause=0.3)
    try:
        worker.wait_for("start")
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.finish(timeout=10) == 0
    finally:
        worker.kill()
    assert [line for line in worker.lines if line.startswith("done")] == [f"done {i}" for i in ids]
    assert worker.lines[-1] == "exit"
    assert await streams.receive(conn, STREAM, NAME) == [], "the batch was acknowledged"


# -- the running loop -----------------------------------------------------------------------


async def test_listen_wakes_the_consumer_long_before_the_poll_interval(dsn, conn):
    await setup(conn)
    consumer = Consumer(dsn, STREAM, NAME, poll_interval=30)
    got = asyncio.Event()
    received_at: list[float] = []

    @consumer.handler()
    async def handle(event: StreamEvent, ctx: Context) -> None:
        received_at.append(time.monotonic())
        got.set()

    task = asyncio.create_task(consumer.run(install_signal_handlers=False))
    try:
        await wait_until(lambda: consumer.listening, 5, "LISTEN")
        await asyncio.sleep(0.1)  # let the catch-up look after LISTEN go by
        await streams.append(conn, STREAM, [StreamEventIn(payload="x")])
        ticked = time.monotonic()
        await streams.force_tick(conn, STREAM)
        await asyncio.wait_for(got.wait(), 5)
        assert received_at[0] - ticked < 1.0
    finally:
        await stop_and_wait(consumer, task)


async def test_reconnects_after_losing_its_connections(dsn, conn):
    await setup(conn)
    consumer = Consumer(dsn, STREAM, NAME, poll_interval=30)
    seen: list[str] = []
    consumer.handler()(lambda e, c: seen.append(e.payload))
    task = asyncio.create_task(consumer.run(install_signal_handlers=False))
    try:
        await wait_until(lambda: consumer.listening, 5, "LISTEN")
        await conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        await send(conn, ("t", "after"))
        await wait_until(lambda: seen == ["after"], 10, "the event after reconnecting")
        assert not task.done()
    finally:
        await stop_and_wait(consumer, task)


async def test_stop_from_a_handler_finishes_the_batch(dsn, conn):
    await setup(conn)
    consumer = Consumer(dsn, STREAM, NAME, poll_interval=0.2)
    seen: list[str] = []

    @consumer.handler()
    async def handle(event: StreamEvent, ctx: Context) -> None:
        seen.append(event.payload)
        consumer.stop()

    await send(conn, ("t", "1"), ("t", "2"))
    await asyncio.wait_for(consumer.run(install_signal_handlers=False), 10)
    assert seen == ["1", "2"]
    assert await streams.receive(conn, STREAM, NAME) == []


async def test_unsubscribed_consumer_without_subscribe_raises(dsn, conn):
    await streams.create(conn, STREAM)
    consumer = Consumer(dsn, STREAM, "nobody", subscribe=False)
    consumer.handler()(lambda e, c: None)
    with pytest.raises(errors.ConsumerNotFound):
        await asyncio.wait_for(consumer.run(install_signal_handlers=False), 10)


# -- producing ------------------------------------------------------------------------------


async def test_producer_and_transactional_append(dsn, conn):
    await setup(conn)
    async with Producer(dsn) as producer:
        one = await producer.append(STREAM, {"order": 1}, type="order.created", extra1="eu")
        more = await producer.append_batch(STREAM, ["plain", StreamEventIn(payload="p", type="x")], type="bulk")
        assert await producer.append_batch(STREAM, []) == []
    async with pool.connect(dsn) as own:
        async with own.transaction(force_rollback=True):
            await append(own, STREAM, "rolled back")
        async with own.transaction():
            committed = await append_batch(own, STREAM, ["kept"])
    await streams.force_tick(conn, STREAM)
    events = await streams.receive(conn, STREAM, NAME)
    assert [(e.id, e.type, e.payload, e.extra1) for e in events] == [
        (one, "order.created", '{"order":1}', "eu"), (more[0], "bulk", "plain", None),
        (more[1], "x", "p", None), (committed[0], "default", "kept", None)]


def test_run_sync_twice_and_stop_before_run(dsn):
    """Each run gets fresh loop-bound state; stop() before run() makes it return at once."""

    async def prepare() -> None:
        async with pool.connect(dsn) as c:
            await setup(c)
            await send(c, ("t", "1"))

    asyncio.run(prepare())
    consumer = Consumer(dsn, STREAM, NAME, poll_interval=0.1)
    seen: list[str] = []

    @consumer.handler()
    def handle(event: StreamEvent, ctx: Context) -> None:
        seen.append(event.payload)
        consumer.stop()  # from the worker thread

    consumer.run_sync(install_signal_handlers=False)
    consumer.stop()
    started = time.monotonic()
    consumer.run_sync(install_signal_handlers=False)
    assert seen == ["1"] and time.monotonic() - started < 5
