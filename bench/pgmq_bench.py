"""Conveyor's pgmq dialect against the real pgmq, side by side in one run.

    python bench/pgmq_bench.py [--pgmq-sql PATH] [--seconds 2] [--repeat 3]
                               [--clients 1 8] [--max-ops 20000] [--no-pgbench]
                               [--synchronous-commit on|off]

Two databases on the same PostgreSQL, created for the run and dropped after it:
  conveyor  Conveyor's schema with the pgmq dialect (conveyor.db.migrate, dialects=pgmq)
  pgmq      the real pgmq, installed from its plain SQL (--pgmq-sql: pgmq-extension/sql/
            pgmq.sql of the pgmq repository, or the copy the `pgmq` Python package ships,
            the default when that package is installed); never stored in this project

Rows, each the same SQL call on both (psycopg, one call per statement, autocommit):
  send           pgmq.send(q, msg)                      one message per call
  send_batch100  pgmq.send_batch(q, 100 messages)       messages/s, 100 per call
  read           pgmq.read(q, 300, 1)                    over a preloaded queue
  pop            pgmq.pop(q)                             over a preloaded queue
  archive        pgmq.archive(q, id)                     ids of a preloaded queue
with each --clients level of concurrent connections. Every cell runs for at most
--seconds and at most --max-ops calls; the two systems alternate cell by cell; the figure
is the median of --repeat runs, the ratio the median of the runs' paired ratios. Then, unless --no-pgbench, pgbench runs send and
read+archive scripts (prepared statements; send for --seconds, read+archive for --max-ops
transactions, all finding a message) on both, as a check on the Python driver's overhead. The load generator shares the machine with PostgreSQL.
With --synchronous-commit off (sessions' synchronous_commit, pgbench's too) a call's
figure is the functions' cost rather than the WAL flush's, which on a busy disk is most
of a one-call transaction on both sides.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import psycopg
from psycopg import conninfo

from conveyor.db import migrate, pool

ADMIN_DSN = os.environ.get("CONVEYOR_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
SYSTEMS = ("conveyor", "pgmq")
MESSAGE = json.dumps({"order": 12345, "item": "x" * 80})
OPS = ("send", "send_batch100", "read", "pop", "archive")
PRELOADED = ("read", "pop", "archive")


@dataclass
class Cell:
    messages: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0


def default_pgmq_sql() -> str | None:
    try:
        path = resources.files("pgmq") / "sql" / "pgmq.sql"
    except ModuleNotFoundError:
        return None
    return str(path) if path.is_file() else None


# -- databases ---------------------------------------------------------------------------

def fresh_database(name: str) -> str:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())
        admin.execute(f'CREATE DATABASE "{name}"'.encode())
    return conninfo.make_conninfo(ADMIN_DSN, dbname=name)


def drop_database(name: str) -> None:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


def with_commit_mode(dsn: str, synchronous_commit: str) -> str:
    """The DSN with the sessions' synchronous_commit set (pgbench gets it as PGOPTIONS)."""
    return conninfo.make_conninfo(dsn, options=f"-c synchronous_commit={synchronous_commit}")


async def install(system: str, dsn: str, pgmq_sql_text: str) -> None:
    if system == "conveyor":
        async with pool.connect(dsn) as conn:
            await migrate.migrate(conn, dialects=("pgmq",))
    else:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(pgmq_sql_text.encode())


# -- cells -------------------------------------------------------------------------------

async def run_clients(conns: list[psycopg.AsyncConnection], op: Callable[[psycopg.AsyncConnection], Awaitable[int]],
                      seconds: float, max_ops: int) -> Cell:
    budget = itertools.count()
    deadline = time.perf_counter() + seconds
    done = [0]

    async def loop(conn: psycopg.AsyncConnection) -> None:
        while time.perf_counter() < deadline and next(budget) < max_ops:
            n = await op(conn)
            if n == 0:  # a preloaded queue ran dry
                return
            done[0] += n

    start = time.perf_counter()
    await asyncio.gather(*(loop(c) for c in conns))
    return Cell(done[0], time.perf_counter() - start)


async def prepare(conn: psycopg.AsyncConnection, queue: str, preload: int) -> None:
    await conn.execute("SELECT pgmq.drop_queue(%s)", (queue,))
    await conn.execute("SELECT pgmq.create(%s)", (queue,))
    batch = [MESSAGE] * 1000
    for _ in range(0, preload, 1000):
        await conn.execute("SELECT * FROM pgmq.send_batch(%s, %s::jsonb[])", (queue, batch))


async def cell(dsn: str, op: str, clients: int, seconds: float, max_ops: int) -> Cell:
    queue = "bench"
    conns = [await psycopg.AsyncConnection.connect(dsn, autocommit=True) for _ in range(clients)]
    try:
        await prepare(conns[0], queue, max_ops if op in PRELOADED else 0)
        ids = itertools.count(1)
        batch = [MESSAGE] * 100

        async def send(c: psycopg.AsyncConnection) -> int:
            await c.execute("SELECT * FROM pgmq.send(%s, %s::jsonb)", (queue, MESSAGE))
            return 1

        async def send_batch(c: psycopg.AsyncConnection) -> int:
            cur = await c.execute("SELECT * FROM pgmq.send_batch(%s, %s::jsonb[])", (queue, batch))
            return len(await cur.fetchall())

        async def read(c: psycopg.AsyncConnection) -> int:
            cur = await c.execute("SELECT msg_id FROM pgmq.read(%s, 300, 1)", (queue,))
            return len(await cur.fetchall())

        async def pop(c: psycopg.AsyncConnection) -> int:
            cur = await c.execute("SELECT msg_id FROM pgmq.pop(%s)", (queue,))
            return len(await cur.fetchall())

        async def archive(c: psycopg.AsyncConnection) -> int:
            cur = await c.execute("SELECT pgmq.archive(%s, %s::bigint)", (queue, next(ids)))
            row = await cur.fetchone()
            return 1 if row and row[0] else 0

        ops = {"send": send, "send_batch100": send_batch, "read": read, "pop": pop, "archive": archive}
        return await run_clients(conns, ops[op], seconds, max_ops)
    finally:
        for c in conns:
            await c.close()


# -- pgbench -----------------------------------------------------------------------------

PGBENCH_SCRIPTS = {
    "send": "SELECT * FROM pgmq.send('pgb', '{\"order\": 1}'::jsonb);\n",
    "read+archive": "SELECT pgmq.archive('pgb', msg_id) FROM pgmq.read('pgb', 300, 1);\n",
}


def pgbench(dsn: str, script: str, clients: int, seconds: float, transactions: int | None) -> float:
    info = conninfo.conninfo_to_dict(dsn)
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script)
    try:
        done = subprocess.run(
            ["pgbench", "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(clients, os.cpu_count() or 1)),
             *(["-t", str(transactions)] if transactions else ["-T", str(max(1, round(seconds)))]), "-f", f.name, "-h", str(info.get("host", "127.0.0.1")),
             "-p", str(info.get("port", 5432)), "-U", str(info.get("user", "postgres")), str(info["dbname"])],
            # a fixed count of transactions (read+archive) takes what the disk allows: bounded generously
            capture_output=True, text=True, timeout=seconds + (600 if transactions else 60), check=True,
            env={**os.environ, "PGOPTIONS": str(info.get("options", ""))})
    finally:
        os.unlink(f.name)
    found = re.search(r"tps = ([\d.]+)", done.stdout)
    return float(found.group(1)) if found else 0.0


def pgbench_rows(dsns: dict[str, str], clients: list[int], seconds: float,
                 max_ops: int) -> dict[tuple[str, int], dict[str, float]]:
    rows: dict[tuple[str, int], dict[str, float]] = {}
    for name, script in PGBENCH_SCRIPTS.items():
        for n in clients:
            for system, dsn in dsns.items():
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute("SELECT pgmq.drop_queue('pgb')")
                    conn.execute("SELECT pgmq.create('pgb')")
                    # read+archive drains the queue: a fixed count of transactions, all of
                    # them finding a message
                    drains = name == "read+archive"
                    for _ in range(max_ops // 1000 if drains else 0):
                        conn.execute("SELECT * FROM pgmq.send_batch('pgb', %s::jsonb[])", (['{"order": 1}'] * 1000,))
                count = max_ops // n if drains else None
                rows.setdefault((name, n), {})[system] = pgbench(dsn, script, n, seconds, count)
    return rows


# -- main --------------------------------------------------------------------------------

async def main(args: argparse.Namespace, pgmq_sql_text: str) -> None:
    names = {s: f"conveyor_pgmq_bench_{s}" for s in SYSTEMS}
    dsns = {s: with_commit_mode(fresh_database(n), args.synchronous_commit) for s, n in names.items()}
    try:
        for system, dsn in dsns.items():
            await install(system, dsn, pgmq_sql_text)
        runs: dict[tuple[str, int, str], list[float]] = {}
        for op, clients, _ in itertools.product(OPS, args.clients, range(args.repeat)):
            for system in SYSTEMS:
                result = await cell(dsns[system], op, clients, args.seconds, args.max_ops)
                runs.setdefault((op, clients, system), []).append(result.rate)
            print(f"  {op:<14} clients={clients:<3} " +
                  "  ".join(f"{s} {runs[(op, clients, s)][-1]:>9.0f}/s" for s in SYSTEMS), flush=True)
        bench_rows = pgbench_rows(dsns, args.clients, args.seconds, args.max_ops) if args.pgbench and shutil.which("pgbench") else {}
    finally:
        for name in names.values():
            drop_database(name)
    print()
    print(f"messages/s, median of {args.repeat} runs of at most {args.seconds:g}s / {args.max_ops} calls "
          f"(psycopg, one call per statement, synchronous_commit {args.synchronous_commit}; pgmq SQL: {args.pgmq_sql})")
    print("(ratio: the median of each run's ratio, the two runs of a pair having been made one after the other)")
    print(f"{'operation':<26}{'conveyor dialect':>18}{'real pgmq':>12}{'ratio':>8}")
    for op, clients in itertools.product(OPS, args.clients):
        mine, real = (runs[(op, clients, s)] for s in SYSTEMS)
        ratio = statistics.median(a / b for a, b in zip(mine, real, strict=True) if b)
        print(f"{op + f' x{clients} clients':<26}{statistics.median(mine):>18.0f}{statistics.median(real):>12.0f}"
              f"{ratio:>8.2f}")
    if bench_rows:
        print()
        print("pgbench, transactions/s (prepared statements, one call per transaction)")
        for (name, clients), cells in bench_rows.items():
            ours, theirs = cells["conveyor"], cells["pgmq"]
            print(f"{name + f' x{clients} clients':<26}{ours:>18.0f}{theirs:>12.0f}"
                  f"{ours / theirs if theirs else 0:>8.2f}")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pgmq-sql", default=default_pgmq_sql(), help="pgmq's plain SQL install file")
    p.add_argument("--seconds", type=float, default=2.0, help="duration of each cell run at most")
    p.add_argument("--repeat", type=int, default=3, help="runs per cell; the median is reported")
    p.add_argument("--max-ops", type=int, default=20_000, help="calls per cell at most (and messages preloaded)")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8], help="concurrency levels")
    p.add_argument("--no-pgbench", dest="pgbench", action="store_false", help="skip the pgbench rows")
    p.add_argument("--synchronous-commit", choices=("on", "off"), default="on",
                   help="the sessions' synchronous_commit (off: the functions' cost, not the WAL flush's)")
    return p.parse_args()


if __name__ == "__main__":
    arguments = parse_args()
    if not arguments.pgmq_sql or not Path(arguments.pgmq_sql).is_file():
        raise SystemExit("--pgmq-sql PATH: pgmq's plain SQL install (pgmq-extension/sql/pgmq.sql)")
    asyncio.run(main(arguments, Path(arguments.pgmq_sql).read_text("utf-8")))
