"""Queue throughput and long-poll latency, side by side in one run.

    ./bin/bench [--seconds 3] [--repeat 3] [--clients 1 64]

Columns, each measured in this one run against the same PostgreSQL:
  rest fusion=on / rest fusion=off   HTTP through `conveyor serve` (one process each)
  sql conveyor                       the SQL API called directly by psycopg
  sql raw table                      raw INSERT / SKIP LOCKED UPDATE / DELETE on a plain
                                     table: what this machine's PostgreSQL can do at most
Rows: send, receive and delete, one message per request/statement, with 1 and 64
concurrent clients; then long-poll wake-up latency (SQL send commit -> REST receive
answer, p50/p99).

Load is bounded: every cell runs for --seconds (default 4) and at most --max-ops
operations. The load generator runs on the same machine as the server and PostgreSQL,
so on a small machine all three share the CPU; the raw column shows that ceiling.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
import psycopg
from psycopg import conninfo

from conveyor.db import migrate

ADMIN_DSN = os.environ.get("CONVEYOR_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
BODY = "x" * 100
RAW_TABLE = """
DROP TABLE IF EXISTS bench_raw;
CREATE TABLE bench_raw (id bigserial PRIMARY KEY, vt timestamptz NOT NULL DEFAULT now(),
                        receive_count int NOT NULL DEFAULT 0, body text NOT NULL);
CREATE INDEX ON bench_raw (vt, id);
"""
RAW_SEND = "INSERT INTO bench_raw (body) VALUES (%s) RETURNING id"
RAW_RECEIVE = """
WITH c AS (SELECT id FROM bench_raw WHERE vt <= now() ORDER BY vt, id LIMIT 1 FOR UPDATE SKIP LOCKED)
UPDATE bench_raw b SET vt = now() + interval '300 seconds', receive_count = b.receive_count + 1
  FROM c WHERE b.id = c.id RETURNING b.id"""
RAW_DELETE = "DELETE FROM bench_raw WHERE id = %s RETURNING id"


@dataclass
class Cell:
    ops: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0


# -- helpers ---------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def fresh_database(name: str) -> str:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    dsn = conninfo.make_conninfo(ADMIN_DSN, dbname=name)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await migrate.migrate(conn)
    return dsn


class Server:
    def __init__(self, dsn: str, fusion: bool, **env_overrides: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "DATABASE_URL": dsn, "CONVEYOR_PORT": str(self.port), "CONVEYOR_AUTH": "none",
               "CONVEYOR_FUSION": "true" if fusion else "false", "CONVEYOR_LOG_LEVEL": "warning", "CONVEYOR_WORKERS": "1",
               "CONVEYOR_POOL_MAX": "16", **env_overrides}
        self.proc = subprocess.Popen([sys.executable, "-m", "conveyor", "serve"], env=env)

    async def wait_ready(self) -> None:
        async with aiohttp.ClientSession() as s:
            for _ in range(300):
                try:
                    async with s.get(self.url + "/livez") as r:
                        if r.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
        raise RuntimeError("server did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


async def run_clients(clients: int, seconds: float, max_ops: int,
                      make_op: Callable[[int], Awaitable[Callable[[], Awaitable[bool]]]]) -> Cell:
    """Run ``clients`` loops of one operation each until time or count runs out."""
    done = 0
    deadline = time.perf_counter() + seconds

    async def loop(n: int) -> None:
        nonlocal done
        op = await make_op(n)
        while done < max_ops and time.perf_counter() < deadline:
            if not await op():
                return  # nothing left to do (e.g. queue empty)
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(loop(n) for n in range(clients)))
    return Cell(done, time.perf_counter() - started)


# -- REST ------------------------------------------------------------------------------

async def rest_cells(url: str, queue: str, clients: int, seconds: float, max_ops: int,
                     session: aiohttp.ClientSession) -> dict[str, Cell]:
    base = f"{url}/v1/queues/{queue}"
    received: list[int] = []

    async def sender(_: int) -> Callable[[], Awaitable[bool]]:
        async def op() -> bool:
            async with session.post(base + "/messages", json={"message": BODY}) as r:
                assert r.status == 201, await r.text()
                await r.read()
            return True
        return op

    async def receiver(_: int) -> Callable[[], Awaitable[bool]]:
        async def op() -> bool:
            async with session.get(base + "/messages", params={"vt": "600"}) as r:
                got = await r.json()
            received.extend(m["id"] for m in got)
            return bool(got)
        return op

    async def deleter(_: int) -> Callable[[], Awaitable[bool]]:
        async def op() -> bool:
            if not received:
                return False
            async with session.delete(f"{base}/messages/{received.pop()}") as r:
                assert r.status == 204, await r.text()
            return True
        return op

    return {
        "send": await run_clients(clients, seconds, max_ops, sender),
        "receive": await run_clients(clients, seconds, max_ops, receiver),
        "delete": await run_clients(clients, seconds, max_ops, deleter),
    }


# -- SQL -------------------------------------------------------------------------------

async def sql_cells(dsn: str, queue: str, clients: int, seconds: float, max_ops: int,
                    raw: bool) -> dict[str, Cell]:
    conns = [await psycopg.AsyncConnection.connect(dsn, autocommit=True) for _ in range(clients)]
    received: list[int] = []
    send_sql = RAW_SEND if raw else "SELECT conveyor.message_send(%s, %s)"
    receive_sql = RAW_RECEIVE if raw else "SELECT id FROM conveyor.message_receive(%s, 600)"
    delete_sql = RAW_DELETE if raw else "SELECT conveyor.message_delete(%s, %s::bigint)"

    def statement(sql: str, params: Callable[[], tuple], keep: bool = False):
        async def make(n: int) -> Callable[[], Awaitable[bool]]:
            conn = conns[n]

            async def op() -> bool:
                p = params()
                if p is None:
                    return False
                cur = await conn.execute(sql, p, prepare=True)
                row = await cur.fetchone()
                if keep:
                    if row is None:
                        return False
                    received.append(row[0])
                return True
            return op
        return make

    def pop_id() -> int | None:
        return received.pop() if received else None

    cells = {
        "send": await run_clients(clients, seconds, max_ops,
                                  statement(send_sql, (lambda: (BODY,)) if raw else (lambda: (queue, BODY)))),
        "receive": await run_clients(clients, seconds, max_ops,
                                     statement(receive_sql, (lambda: ()) if raw else (lambda: (queue,)), keep=True)),
        "delete": await run_clients(clients, seconds, max_ops, statement(
            delete_sql, (lambda: (lambda i: None if i is None else (i,))(pop_id())) if raw else
            (lambda: (lambda i: None if i is None else (queue, i))(pop_id())))),
    }
    for c in conns:
        await c.close()
    return cells


# -- long-poll latency -----------------------------------------------------------------

async def wake_latency(url: str, dsn: str, queue: str, rounds: int) -> tuple[float, float]:
    samples = []
    async with aiohttp.ClientSession() as session, \
            await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for _ in range(rounds):
            poll = asyncio.create_task(session.get(f"{url}/v1/queues/{queue}/messages", params={"wait": "10"}))
            await asyncio.sleep(0.02)  # let the poll park
            await conn.execute("SELECT conveyor.message_send(%s, %s)", (queue, BODY))
            committed = time.perf_counter()
            async with await poll as r:
                got = await r.json()
            samples.append(time.perf_counter() - committed)
            await conn.execute("SELECT conveyor.message_delete(%s, %s::bigint)", (queue, got[0]["id"]))
    samples.sort()
    return statistics.median(samples) * 1000, samples[int(len(samples) * 0.99) - 1] * 1000


# -- main ------------------------------------------------------------------------------

def median_cells(runs: list[dict[str, Cell]]) -> dict[str, Cell]:
    """Per operation, the run with the median rate."""
    return {op: sorted((r[op] for r in runs), key=lambda c: c.rate)[len(runs) // 2] for op in runs[0]}


async def prepare_queue(dsn: str, name: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("SELECT conveyor.queue_create(%s)", (name,))


async def main(args: argparse.Namespace) -> None:
    dsn = await fresh_database("conveyor_bench")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(RAW_TABLE)
    servers = {True: Server(dsn, True), False: Server(dsn, False)}
    results: dict[str, dict[tuple[str, int], float]] = {}
    try:
        for s in servers.values():
            await s.wait_ready()
        connector = dict(limit=0, force_close=False)
        # warm up both servers alike (pool connections opened, statements prepared), so
        # that whichever column runs first is not penalised
        for fusion, server in servers.items():
            await prepare_queue(dsn, f"warmup_{fusion}")
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(**connector)) as session:
                await rest_cells(server.url, f"warmup_{fusion}", 64, 1.0, args.max_ops, session)
        for clients in args.clients:
            for fusion, server in servers.items():
                column = f"rest fusion={'on' if fusion else 'off'}"
                queue = f"rest_{'on' if fusion else 'off'}_{clients}"
                await prepare_queue(dsn, queue)
                runs = []
                for _ in range(args.repeat):
                    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(**connector)) as session:
                        runs.append(await rest_cells(server.url, queue, clients, args.seconds, args.max_ops, session))
                cells = median_cells(runs)
                for op, cell in cells.items():
                    results.setdefault(column, {})[(op, clients)] = cell.rate
                print(f"  {column:<16} clients={clients:<3} " +
                      "  ".join(f"{op} {c.rate:8.0f}/s" for op, c in cells.items()), flush=True)
            for raw in (False, True):
                column = "sql raw table" if raw else "sql conveyor"
                queue = f"sql_{clients}"
                if not raw:
                    await prepare_queue(dsn, queue)
                cells = median_cells([await sql_cells(dsn, queue, clients, args.seconds, args.max_ops, raw)
                                      for _ in range(args.repeat)])
                for op, cell in cells.items():
                    results.setdefault(column, {})[(op, clients)] = cell.rate
                print(f"  {column:<16} clients={clients:<3} " +
                      "  ".join(f"{op} {c.rate:8.0f}/s" for op, c in cells.items()), flush=True)
        latency = {}
        for fusion, server in servers.items():
            queue = f"wake_{'on' if fusion else 'off'}"
            await prepare_queue(dsn, queue)
            latency[fusion] = await wake_latency(server.url, dsn, queue, args.wake_rounds)
    finally:
        for s in servers.values():
            s.stop()

    columns = ["rest fusion=on", "rest fusion=off", "sql conveyor", "sql raw table"]
    print()
    print(f"throughput, messages/s (median of {args.repeat} runs of {args.seconds:g}s per cell; "
          "one message per request)")
    print(f"{'operation':<22}" + "".join(f"{c:>17}" for c in columns))
    for clients in args.clients:
        for op in ("send", "receive", "delete"):
            print(f"{op + f' x{clients} clients':<22}" +
                  "".join(f"{results[c].get((op, clients), 0):>17.0f}" for c in columns))
    print()
    print("long-poll wake-up, SQL send commit -> REST receive answer (ms)")
    for fusion, (p50, p99) in latency.items():
        print(f"  fusion={'on' if fusion else 'off':<4} p50 {p50:6.2f}   p99 {p99:6.2f}   ({args.wake_rounds} rounds)")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=3.0, help="duration of each cell run")
    p.add_argument("--repeat", type=int, default=3, help="runs per cell; the median is reported")
    p.add_argument("--max-ops", type=int, default=200_000, help="operations per cell at most")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 64], help="concurrency levels")
    p.add_argument("--wake-rounds", type=int, default=200, help="long-poll latency samples")
    return p.parse_args()


if __name__ == "__main__":
    import uvloop

    uvloop.install()
    asyncio.run(main(parse_args()))
