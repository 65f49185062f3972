"""Event-stream throughput and latency, per core, beside PgQue's published figures.

    ./bin/bench stream_bench.py [--seconds 3] [--repeat 3] [--clients 4]

Rows, each measured in this one run against the same PostgreSQL:
  append, one event per transaction     conveyor.stream_send from --clients pgbench and
                                        psycopg connections, with synchronous_commit on
                                        (Conveyor's default: an acknowledged append
                                        survives a crash) and off (the setting PgQue's
                                        figures were taken with)
  append, batched                       conveyor.stream_send_batch: 1,000 events per
                                        transaction from --clients connections, and
                                        100,000 per transaction from one connection
  consumer read rate                    conveyor.stream_receive of a 100,000-event batch
                                        (the time to open the batch and fetch every row)
  tick -> receive latency               conveyor.stream_force_tick commits, a consumer
                                        parked on LISTEN conveyor_stream (another
                                        connection) wakes and receives it (p50/p99)
  send -> receive latency, server       an event sent by SQL reaches a consumer
                                        long-polling GET /v1/streams/{s}/consumers/{c}/
                                        batch on `conveyor serve`, whose ticker runs
                                        every CONVEYOR_STREAM_TICK_INTERVAL (0.5 s by
                                        default, and 0.05 s), sent at a random moment
                                        of the ticker's cycle (p50/p99)

Per core = rate / os.cpu_count(): the load generator, the server and PostgreSQL share
this machine's cores, as they did on PgQue's laptop (10 cores, synchronous_commit=off,
shared_buffers=4GB, wal_level=minimal; seed 001 section 2.9). Payloads are ~100 B and
~2 KiB. Every cell is bounded by --seconds and --max-events.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import os
import random
import re
import shutil
import statistics
import tempfile
import time

import aiohttp
import psycopg

from conveyor.db import listen
from queue_bench import Server, fresh_database, run_clients

CORES = os.cpu_count() or 1
SMALL = "x" * 100
LARGE = "x" * 2048
# PgQue's per-core figures, PL/pgSQL mode unless noted (seed 001, section 2.9)
PGQUE = {
    "single": 8_600,
    "batch100k": 8_100,
    "batch100k_2k": 4_900,
    "read": 240_000,
    "read_2k": 30_500,
    "batch1000_c": 41_700,
}


def per_core(rate: float) -> float:
    return rate / CORES


async def connect(dsn: str, sync_commit: bool = True) -> psycopg.AsyncConnection:
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    if not sync_commit:
        await conn.execute("SET synchronous_commit = off")
    return conn


async def fresh_stream(dsn: str, name: str, consumer: str | None = None,
                       options: str = '{"ticker_max_count": 1000000}') -> None:
    async with await connect(dsn) as conn:
        await conn.execute("SELECT conveyor.stream_drop(%s)", (name,))
        await conn.execute("SELECT FROM conveyor.stream_create(%s, %s)", (name, options))
        if consumer:
            await conn.execute("SELECT conveyor.stream_subscribe(%s, %s)", (name, consumer))


# -- append ----------------------------------------------------------------------------

async def append_rate(dsn: str, stream: str, clients: int, per_tx: int, payload: str, seconds: float,
                      max_events: int, sync_commit: bool) -> float:
    conns = [await connect(dsn, sync_commit) for _ in range(clients)]
    batch = [payload] * per_tx

    async def make(n: int):
        conn = conns[n]
        if per_tx == 1:
            async def op() -> bool:
                await conn.execute("SELECT conveyor.stream_send(%s, %s)", (stream, payload), prepare=True)
                return True
        else:
            async def op() -> bool:
                await conn.execute("SELECT count(*) FROM conveyor.stream_send_batch(%s, 'default', %s::text[])",
                                   (stream, batch), prepare=True)
                return True
        return op

    try:
        cell = await run_clients(clients, seconds, max(1, max_events // per_tx), make)
    finally:
        for c in conns:
            await c.close()
    return cell.ops * per_tx / cell.seconds


async def pgbench_rate(pgbench: str, dsn: str, stream: str, clients: int, seconds: float, sync_commit: bool) -> float:
    """The same single appends driven by pgbench (C, prepared statements): the load
    generator takes less of the shared CPU than Python does, as in PgQue's runs."""
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as script:
        script.write(f"SELECT conveyor.stream_send('{stream}', '{SMALL}');\n")
        script.flush()
        env = {**os.environ, "PGOPTIONS": f"-c synchronous_commit={'on' if sync_commit else 'off'}"}
        proc = await asyncio.create_subprocess_exec(
            pgbench, "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(clients, CORES)),
            "-T", str(max(1, round(seconds))), "-f", script.name, dsn,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env)
        out = (await proc.communicate())[0].decode()
    match = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out)
    if proc.returncode != 0 or not match:
        raise RuntimeError(f"pgbench failed:\n{out}")
    return float(match.group(1))


def find_pgbench() -> str:
    found = shutil.which("pgbench") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/pgbench"))), None)
    if found is None:
        raise SystemExit("pgbench not found: install PostgreSQL's client tools (Debian: postgresql-client)")
    return found


# -- consume ---------------------------------------------------------------------------

async def read_rate(dsn: str, stream: str, events: int, payload: str) -> float:
    """Fill one batch of ``events`` events, then time receiving all of it."""
    await fresh_stream(dsn, stream, "reader")
    async with await connect(dsn) as conn:
        await conn.execute("SELECT count(*) FROM conveyor.stream_send_batch(%s, 'default', %s::text[])",
                           (stream, [payload] * events))
        await conn.execute("SELECT conveyor.stream_force_tick(%s)", (stream,))
        started = time.perf_counter()
        cur = await conn.execute("SELECT * FROM conveyor.stream_receive(%s, 'reader', %s)", (stream, events))
        rows = await cur.fetchall()
        elapsed = time.perf_counter() - started
        assert len(rows) == events, (len(rows), events)
        await conn.execute("SELECT conveyor.stream_ack(%s)", (rows[0][1],))
    return events / elapsed


# -- latency ---------------------------------------------------------------------------

def percentiles(samples: list[float]) -> tuple[float, float]:
    samples = sorted(samples)
    return statistics.median(samples) * 1000, samples[max(0, int(len(samples) * 0.99) - 1)] * 1000


async def tick_latency(dsn: str, stream: str, rounds: int) -> tuple[float, float]:
    await fresh_stream(dsn, stream, "waiter")
    ticks: asyncio.Queue[str] = asyncio.Queue()
    listening = asyncio.Event()

    async def listener() -> None:
        async def ready() -> None:
            listening.set()
        async for _, payload in listen.notifications(dsn, ["conveyor_stream"], on_listening=ready):
            ticks.put_nowait(payload)

    task = asyncio.create_task(listener())
    samples = []
    try:
        await asyncio.wait_for(listening.wait(), 10)
        async with await connect(dsn) as producer, await connect(dsn) as consumer:
            for n in range(rounds):
                await producer.execute("SELECT conveyor.stream_send(%s, %s)", (stream, str(n)))
                await producer.execute("SELECT conveyor.stream_force_tick(%s)", (stream,))
                ticked = time.perf_counter()
                while await asyncio.wait_for(ticks.get(), 10) != stream:
                    pass
                cur = await consumer.execute(
                    "SELECT id, batch_id, payload FROM conveyor.stream_receive(%s, 'waiter', 10)", (stream,),
                    prepare=True)
                rows = await cur.fetchall()
                samples.append(time.perf_counter() - ticked)
                assert [r[2] for r in rows] == [str(n)], rows
                await consumer.execute("SELECT conveyor.stream_ack(%s)", (rows[0][1],))
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return percentiles(samples)


async def server_latency(dsn: str, stream: str, rounds: int, tick_interval: float) -> tuple[float, float]:
    # tick as soon as the server's ticker sees an event (ticker_max_lag 0)
    await fresh_stream(dsn, stream, "poller", '{"ticker_max_lag": "0 seconds"}')
    server = Server(dsn, fusion=True, CONVEYOR_STREAM_TICK_INTERVAL=str(tick_interval))
    samples = []
    rng = random.Random(1)
    try:
        await server.wait_ready()
        url = f"{server.url}/v1/streams/{stream}/consumers/poller/batch"
        async with aiohttp.ClientSession() as session, await connect(dsn) as producer:
            for n in range(rounds):
                poll = asyncio.create_task(session.get(url, params={"wait": "10", "max": "10"}))
                # let the poll park, and send at a random moment of the ticker's cycle
                await asyncio.sleep(0.02 + rng.uniform(0, tick_interval))
                await producer.execute("SELECT conveyor.stream_send(%s, %s)", (stream, str(n)))
                sent = time.perf_counter()
                async with await poll as r:
                    assert r.status == 200, await r.text()
                    got = await r.json()
                samples.append(time.perf_counter() - sent)
                assert [e["payload"] for e in got["events"]] == [str(n)], got
                async with session.post(f"{server.url}/v1/streams/{stream}/batches/{got['batch_id']}/ack") as r:
                    assert r.status in (200, 204), await r.text()
    finally:
        server.stop()
    return percentiles(samples)


# -- main ------------------------------------------------------------------------------

async def main(args: argparse.Namespace) -> None:
    dsn = await fresh_database("conveyor_stream_bench")
    rows: list[tuple[str, float, int | None]] = []

    async def measure(label: str, pgque_key: str | None, run) -> None:
        rates = [await run() for _ in range(args.repeat)]
        rate = statistics.median(rates)
        rows.append((label, rate, PGQUE.get(pgque_key) if pgque_key else None))
        print(f"  {label:<48} {rate:>10.0f} ev/s   {per_core(rate):>9.0f} /core", flush=True)

    pgbench = find_pgbench()
    c = args.clients
    await fresh_stream(dsn, "append")
    await measure(f"append 1/tx x{c} pgbench clients, sync commit on", None, lambda: pgbench_rate(
        pgbench, dsn, "append", c, args.seconds, True))
    await measure(f"append 1/tx x{c} pgbench clients, sync commit off", "single", lambda: pgbench_rate(
        pgbench, dsn, "append", c, args.seconds, False))
    await measure(f"append 1/tx x{c} psycopg clients, sync commit on", None, lambda: append_rate(
        dsn, "append", c, 1, SMALL, args.seconds, args.max_events, True))
    await measure(f"append 1/tx x{c} psycopg clients, sync commit off", None, lambda: append_rate(
        dsn, "append", c, 1, SMALL, args.seconds, args.max_events, False))
    await measure(f"append 1000/tx x{c} clients, sync off (vs PgQue C)", "batch1000_c", lambda: append_rate(
        dsn, "append", c, 1000, SMALL, args.seconds, args.max_events, False))
    await measure("append 100k/tx x1 client, ~100 B", "batch100k", lambda: append_rate(
        dsn, "append", 1, 100_000, SMALL, args.seconds, args.max_events, True))
    await measure("append 100k/tx x1 client, ~2 KiB", "batch100k_2k", lambda: append_rate(
        dsn, "append", 1, 100_000, LARGE, args.seconds, args.max_events, True))
    await measure("consumer read, 100k batch, ~100 B", "read", lambda: read_rate(dsn, "read", 100_000, SMALL))
    await measure("consumer read, 100k batch, ~2 KiB", "read_2k", lambda: read_rate(dsn, "read", 100_000, LARGE))
    tick = await tick_latency(dsn, "tick", args.latency_rounds)
    served = {interval: await server_latency(dsn, f"served{n}", args.latency_rounds // 4, interval)
              for n, interval in enumerate(args.tick_intervals)}

    print()
    print(f"per core of this machine ({CORES} cores; load generator, server and PostgreSQL share them), "
          f"median of {args.repeat} runs; PgQue's per-core figures from seed 001 section 2.9")
    print(f"{'scenario':<50}{'ev/s':>11}{'per core':>11}{'PgQue/core':>12}{'ratio':>8}")
    for label, rate, pgque in rows:
        theirs = f"{pgque:>12,}" if pgque else f"{'-':>12}"
        ratio = f"{per_core(rate) / pgque:>8.2f}" if pgque else f"{'-':>8}"
        print(f"{label:<50}{rate:>11,.0f}{per_core(rate):>11,.0f}{theirs}{ratio}")
    print()
    print("latency (ms)                                           p50      p99")
    print(f"{'tick commit -> LISTEN consumer has the event':<50}{tick[0]:>9.2f}{tick[1]:>9.2f}"
          f"   ({args.latency_rounds} rounds)")
    for interval, (p50, p99) in served.items():
        print(f"{f'SQL send commit -> REST long-poll, tick every {interval:g}s':<50}{p50:>9.2f}{p99:>9.2f}"
              f"   ({args.latency_rounds // 4} rounds; includes waiting for the next tick)")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=3.0, help="duration of each append cell")
    p.add_argument("--repeat", type=int, default=3, help="runs per cell; the median is reported")
    p.add_argument("--clients", type=int, default=4, help="connections for the multi-client rows")
    p.add_argument("--max-events", type=int, default=2_000_000, help="events per append cell at most")
    p.add_argument("--latency-rounds", type=int, default=200, help="tick-latency samples")
    p.add_argument("--tick-intervals", type=float, nargs="+", default=[0.5, 0.05],
                   help="CONVEYOR_STREAM_TICK_INTERVAL values for the server latency rows")
    return p.parse_args()


if __name__ == "__main__":
    import uvloop

    uvloop.install()
    asyncio.run(main(parse_args()))
