"""Conveyor's pgq dialect beside the real PgQ extension, in one run on one PostgreSQL.

    ./bin/bench pgq_bench.py [--events 20000] [--seconds 5] [--repeat 3]

Two scratch databases, created and dropped here: one migrated by Conveyor with the pgq
dialect (docs/dialects/pgq.md), one with CREATE EXTENSION pgq (Debian's
postgresql-15-pgq3: C insert_event and C triggers). The same SQL runs against both:

  insert_event, 1 per transaction       SELECT pgq.insert_event(q, 'type', data) with
                                        synchronous_commit off (the function's cost, not
                                        the WAL flush's), one connection
  insert_event, 1,000 per statement     SELECT pgq.insert_event(...) FROM generate_series
  trigger insert (logutriga), 1/tx      INSERT into a table with pgq.logutriga
  minimal PL/pgSQL trigger, 1/tx        the same INSERT with a PL/pgSQL trigger that only
                                        calls pgq.insert_event with a constant event (the
                                        same function on both: a PL/pgSQL trigger's floor)
  consume, batches of 1,000 / of 10     next_batch + get_batch_events (all rows fetched)
                                        + finish_batch, each batch in its transaction,
                                        over --events events ticked every 1,000 / 10

Each cell stops at --events events or --seconds, whichever comes first; the two systems
take turns run by run, and the median of --repeat runs is shown, the ratio the median of
the runs' paired ratios. Payloads are ~100 bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable

import psycopg
from psycopg import conninfo

from conveyor.db import migrate
from queue_bench import ADMIN_DSN

PAYLOAD = "x" * 100
QUEUE = "bench"


def scratch(name: str) -> str:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    return conninfo.make_conninfo(ADMIN_DSN, dbname=name)


def drop(name: str) -> None:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def install_dialect(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await migrate.migrate(conn, dialects=("pgq",))


def fresh_queue(conn: psycopg.Connection, consumer: bool = False) -> None:
    conn.execute("SELECT pgq.drop_queue(queue_name, true) FROM pgq.get_queue_info()")
    conn.execute("SELECT pgq.create_queue(%s)", (QUEUE,))
    if consumer:
        conn.execute("SELECT pgq.register_consumer(%s, 'c')", (QUEUE,))


def tick(conn: psycopg.Connection) -> None:
    # PgQ's force_tick makes the next ticker() tick; the dialect's ticks at once
    conn.execute("SELECT pgq.force_tick(%s)", (QUEUE,))
    conn.execute("SELECT pgq.ticker(%s)", (QUEUE,))


def timed(run: Callable[[float], int], seconds: float) -> float:
    """Events per second of run(deadline), which returns how many it handled."""
    start = time.perf_counter()
    done = run(start + seconds)
    return done / (time.perf_counter() - start)


def insert_single(conn: psycopg.Connection, events: int, deadline: float) -> int:
    fresh_queue(conn)
    conn.execute("SET synchronous_commit = off")
    n = 0
    while n < events and time.perf_counter() < deadline:
        conn.execute("SELECT pgq.insert_event(%s, 'type', %s)", (QUEUE, PAYLOAD))
        n += 1
    conn.execute("RESET synchronous_commit")
    return n


def insert_statement(conn: psycopg.Connection, events: int, deadline: float) -> int:
    fresh_queue(conn)
    n = 0
    while n < events and time.perf_counter() < deadline:
        conn.execute("SELECT count(pgq.insert_event(%s, 'type', %s)) FROM generate_series(1, 1000)", (QUEUE, PAYLOAD))
        n += 1000
    return n


# The least a PL/pgSQL CDC trigger can do: append a constant event (what logutriga would
# append for the row, without reading the catalog or the row). The same function on both
# systems: the floor of a trigger written in PL/pgSQL over each one's insert_event.
MINIMAL_TRIGGER = """
CREATE OR REPLACE FUNCTION public.bench_minimal_cdc() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgq.insert_event(TG_ARGV[0], 'I:id', 'id=1&name=xxxxxxxxxxxxxxxxxxxx&qty=1&at=2026-11-26+02%3a28%3a17%2b00',
                             TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME, NULL, NULL, NULL);
    RETURN NULL;
END $$"""


def trigger_insert(conn: psycopg.Connection, events: int, deadline: float, function: str = "pgq.logutriga") -> int:
    fresh_queue(conn)
    conn.execute("DROP TABLE IF EXISTS bench_rows")
    conn.execute("CREATE TABLE bench_rows (id bigserial PRIMARY KEY, name text, qty int, at timestamptz DEFAULT now())")
    conn.execute("CREATE TRIGGER cdc AFTER INSERT OR UPDATE OR DELETE ON bench_rows FOR EACH ROW "
                 f"EXECUTE PROCEDURE {function}('{QUEUE}')")
    conn.execute("SET synchronous_commit = off")
    n = 0
    while n < events and time.perf_counter() < deadline:
        conn.execute("INSERT INTO bench_rows (name, qty) VALUES (%s, %s)", (PAYLOAD[:20], n))
        n += 1
    conn.execute("RESET synchronous_commit")
    return n


def fill(conn: psycopg.Connection, events: int, per_batch: int) -> None:
    fresh_queue(conn, consumer=True)
    for _ in range(events // per_batch):
        with conn.transaction():
            conn.execute("SELECT count(pgq.insert_event(%s, 'type', %s)) FROM generate_series(1, %s)",
                         (QUEUE, PAYLOAD, per_batch))
        tick(conn)


def consume(conn: psycopg.Connection, deadline: float) -> int:
    n = 0
    while time.perf_counter() < deadline:
        with conn.transaction():
            batch = conn.execute("SELECT pgq.next_batch(%s, 'c')", (QUEUE,)).fetchone()
            if batch is None or batch[0] is None:
                break
            n += len(conn.execute("SELECT * FROM pgq.get_batch_events(%s)", (batch[0],)).fetchall())
            conn.execute("SELECT pgq.finish_batch(%s)", (batch[0],))
    return n


def measure_once(dsn: str, args: argparse.Namespace, rates: dict[str, list[float]]) -> None:
    """One run of every scenario on one database, appended to rates."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rates.setdefault("insert_event, 1 per transaction", []).append(
            timed(lambda d: insert_single(conn, args.events, d), args.seconds))
        rates.setdefault("insert_event, 1,000 per statement", []).append(
            timed(lambda d: insert_statement(conn, args.events * 5, d), args.seconds))
        rates.setdefault("logutriga row insert, 1 per transaction", []).append(
            timed(lambda d: trigger_insert(conn, args.events, d), args.seconds))
        conn.execute(MINIMAL_TRIGGER)
        rates.setdefault("minimal PL/pgSQL trigger row insert, 1/tx", []).append(
            timed(lambda d: trigger_insert(conn, args.events, d, "public.bench_minimal_cdc"), args.seconds))
        for size in (1000, 10):
            fill(conn, args.events if size == 1000 else args.events // 10, size)
            rates.setdefault(f"next_batch+get_batch_events+finish, {size:,}/batch", []).append(
                timed(lambda d: consume(conn, d), args.seconds))


def main(args: argparse.Namespace) -> None:
    ours_db, real_db = "conveyor_pgq_bench", "conveyor_pgq_bench_real"
    try:
        ours = scratch(ours_db)
        asyncio.run(install_dialect(ours))
        real = scratch(real_db)
        with psycopg.connect(real, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pgq")
            version = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'pgq'").fetchone()
        print(f"measuring Conveyor's pgq dialect and PgQ {version[0] if version else '?'} (C) in turn, "
              f"{args.events:,} events or {args.seconds:g} s per cell, median of {args.repeat}", flush=True)
        runs: dict[str, dict[str, list[float]]] = {"dialect": {}, "pgq": {}}
        for _ in range(args.repeat):  # the two alternate, so a busy moment of the machine hits both
            measure_once(ours, args, runs["dialect"])
            measure_once(real, args, runs["pgq"])
    finally:
        drop(ours_db)
        drop(real_db)
    print()
    print("(ratio: the median of each run's ratio, the two runs of a pair having been made one after the other)")
    print(f"{'scenario (events/s)':<52}{'Conveyor pgq':>14}{'PgQ (C ext)':>14}{'ratio':>8}")
    for label, mine in runs["dialect"].items():
        real = runs["pgq"][label]
        ratio = statistics.median(a / b for a, b in zip(mine, real, strict=True) if b)
        print(f"{label:<52}{statistics.median(mine):>14,.0f}{statistics.median(real):>14,.0f}{ratio:>8.2f}")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=20_000, help="events per cell at most (x5 for the statement row)")
    p.add_argument("--seconds", type=float, default=5.0, help="time per cell at most")
    p.add_argument("--repeat", type=int, default=3, help="runs per cell; the median is reported")
    return p.parse_args()


if __name__ == "__main__":
    main(parse_args())
