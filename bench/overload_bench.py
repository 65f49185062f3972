"""Overload: what admission control buys, side by side in one run.

    ./bin/bench overload_bench.py [--clients 500 2000 8000] [--body-bytes 16384] [--seconds 10]
                                  [--max-requests 512] [--repeat 3]

Two Conveyor servers (one process each, on one database), hit by the same overload: more
concurrent SQS SendMessage clients (raw HTTP, bench/rawhttp.py: one keep-alive connection
each, each sending a --body-bytes message as fast as it is answered) than the server, its
database pool (16 connections) and PostgreSQL can serve, at each --clients count:

  bounded    the admission limits (CONVEYOR_MAX_REQUESTS=--max-requests, the default
             CONVEYOR_POOL_MAX_WAITING and CONVEYOR_FUSION_MAX_PENDING)
  unbounded  every limit set so high that nothing is refused (what Conveyor did before
             admission control: queue everything)

Printed per server (medians over --repeat runs; each run is at most --seconds of load and
at most --max-calls calls): answers/s by outcome (accepted, throttled, other), the
latency of accepted answers and of throttled answers (p50, p99), and the server's peak
resident memory (VmHWM from /proc) during the run. After a throttled answer a client
backs off as AWS SDKs do ("full jitter": a random pause up to 0.05 s x 2^n, n refusals in
a row, capped at 5 s); without it a refused client spins. Servers take turns within each repeat. Creates and drops database
`conveyor_overload_bench` on CONVEYOR_BENCH_DATABASE_URL.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import conninfo

sys.path.insert(0, str(Path(__file__).parent))
from conveyor.db import migrate
from rawhttp import HttpError, RawHttp
from sqs_bench import Child, free_port

ADMIN_DSN = os.environ.get("CONVEYOR_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
DATABASE = "conveyor_overload_bench"
BACKOFF_BASE, BACKOFF_CAP = 0.05, 5.0  # seconds: "full jitter" exponential backoff, as AWS SDKs retry
UNBOUNDED = {"CONVEYOR_MAX_REQUESTS": "1000000", "CONVEYOR_POOL_MAX_WAITING": "1000000",
             "CONVEYOR_FUSION_MAX_PENDING": "1000000000"}


@dataclass
class Run:
    seconds: float = 0.0
    accepted: list[float] = field(default_factory=list)
    throttled: list[float] = field(default_factory=list)
    other: int = 0
    other_kinds: dict[str, int] = field(default_factory=dict)
    peak_rss_mb: float = 0.0


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start(dsn: str, env: dict[str, str]) -> Child:
    port = free_port()
    child = Child("conveyor", [sys.executable, "-m", "conveyor", "serve"],
                  {**os.environ, "DATABASE_URL": dsn, "CONVEYOR_PORT": str(port), "CONVEYOR_AUTH": "none",
                   "CONVEYOR_LOG_LEVEL": "error", "CONVEYOR_WORKERS": "1", "CONVEYOR_POOL_MAX": "16", **env}, port, quiet=True)
    child.wait_ready("/livez")
    return child


async def load(server: Child, clients: int, seconds: float, max_calls: int, body_bytes: int) -> Run:
    run = Run()
    http = RawHttp("127.0.0.1", server.port, timeout=120)
    body = b'{"QueueUrl": "/000000000000/overload", "MessageBody": "%s"}' % (b"x" * body_bytes)
    request = http.request("POST", "/", body, {"Content-Type": "application/x-amz-json-1.0",
                                               "X-Amz-Target": "AmazonSQS.SendMessage"})
    started = time.monotonic()
    deadline, calls = started + seconds, 0

    async def client() -> None:
        nonlocal calls
        refused = 0  # in a row: the backoff doubles
        while time.monotonic() < deadline and calls < max_calls:
            calls += 1
            t0 = time.monotonic()
            try:
                status, answer = await http.send(request)
            except HttpError as exc:
                run.other += 1
                kind = f"{type(exc.__cause__ or exc).__name__}"
                run.other_kinds[kind] = run.other_kinds.get(kind, 0) + 1
                continue
            took = time.monotonic() - t0
            if status == 200:
                run.accepted.append(took)
                refused = 0
            elif b"RequestThrottled" in answer:
                run.throttled.append(took)
                refused += 1
                await asyncio.sleep(random.uniform(0, min(BACKOFF_CAP, BACKOFF_BASE * 2 ** refused)))
            else:
                run.other += 1
                kind = f"{status} {answer[:40]!r}"
                run.other_kinds[kind] = run.other_kinds.get(kind, 0) + 1

    await asyncio.gather(*(client() for _ in range(clients)))
    run.seconds = time.monotonic() - started
    await http.close()
    run.peak_rss_mb = _peak_rss_mb(server.proc.pid)
    return run


def fresh_database() -> str:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{DATABASE}"')
    dsn = conninfo.make_conninfo(ADMIN_DSN, dbname=DATABASE)

    async def prepare() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await migrate.migrate(conn)
            await conn.execute("SELECT conveyor.queue_create('overload')")

    asyncio.run(prepare())
    return dsn


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, nargs="+", default=[500, 2000, 8000])
    p.add_argument("--body-bytes", type=int, default=16384)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--max-calls", type=int, default=2_000_000)
    p.add_argument("--max-requests", type=int, default=512)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    dsn = fresh_database()
    configs = {"bounded": {"CONVEYOR_MAX_REQUESTS": str(args.max_requests)}, "unbounded": UNBOUNDED}
    runs: dict[tuple[int, str], list[Run]] = {(c, name): [] for c in args.clients for name in configs}
    try:
        for _ in range(args.repeat):
            for clients in args.clients:
                for name, env in configs.items():
                    server = start(dsn, env)  # a fresh process per run: its peak memory is this run's
                    try:
                        runs[(clients, name)].append(asyncio.run(
                            load(server, clients, args.seconds, args.max_calls, args.body_bytes)))
                    finally:
                        server.stop()
                    with psycopg.connect(dsn, autocommit=True) as c:
                        c.execute("SELECT conveyor.queue_purge('overload')")
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
    print(f"SendMessage overload: {args.body_bytes}-byte messages, {args.seconds:g} s per run, "
          f"medians of {args.repeat}; bounded: CONVEYOR_MAX_REQUESTS={args.max_requests}")
    print(f"{'clients':>7} {'server':<10} {'accepted/s':>10} {'throttled/s':>11} {'other':>6} {'acc p50 ms':>10} "
          f"{'acc p99 ms':>10} {'thr p50 ms':>10} {'thr p99 ms':>10} {'peak RSS MB':>11}")
    for (clients, name), rs in runs.items():
        def med(f, rs=rs):
            return statistics.median(f(r) for r in rs)
        print(f"{clients:>7} {name:<10} {med(lambda r: len(r.accepted) / r.seconds):>10.0f} "
              f"{med(lambda r: len(r.throttled) / r.seconds):>11.0f} {med(lambda r: r.other):>6.0f} "
              f"{med(lambda r: _pct(r.accepted, 0.5)):>10.1f} {med(lambda r: _pct(r.accepted, 0.99)):>10.1f} "
              f"{med(lambda r: _pct(r.throttled, 0.5)):>10.1f} {med(lambda r: _pct(r.throttled, 0.99)):>10.1f} "
              f"{med(lambda r: r.peak_rss_mb):>11.0f}")
    others = {k: v for rs in runs.values() for r in rs for k, v in r.other_kinds.items()}
    if others:
        print("other answers:", ", ".join(f"{k} x{v}" for k, v in sorted(others.items())))


if __name__ == "__main__":
    main()
