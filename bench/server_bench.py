"""Server stack A/B: the SQS hot path through the raw HTTP client (bench/rawhttp.py), against
`conveyor serve` built from two source trees (or two settings), side by side in one run.

    .venv/bin/python bench/server_bench.py --before-src /tmp/conveyor-before/src [--after-src src]
        [--before-env K=V ...] [--after-env K=V ...] [--seconds 3] [--repeat 7] [--clients 1 16]
        [--workers 1]

Each variant is `python -m conveyor serve` with its tree's ``src`` first on PYTHONPATH (the
same .venv, so the same dependencies) and its extra environment. Rows (messages/s; --rows picks some):
SendMessage (one message per call; the call another engineer will profile) and
SendMessageBatch (10 per call), each on a fresh queue; one message per call through the
REST API, Queen's API (a push of one item) and hq's API (the plain-HTTP APIs' path:
router, edge middleware); and GET /livez (requests/s: the HTTP stack and the app's edge
without the database, the least noisy row). Within each repeat the variants take
turns (A B A B ...), so a drift of the machine's speed weighs on both; the median of
--repeat runs is reported with every run, and the after/before ratio of the medians. The
servers' CPU per request (from /proc) is printed too.

To measure a change against the commit it starts from:

    git archive BASE src | tar -x -C /tmp/conveyor-before
    .venv/bin/python bench/server_bench.py --before-src /tmp/conveyor-before/src

Creates (and at the end drops) databases `conveyor_sqs_bench_before` and `_after`, one per
server, each migrated by its server as it starts (sqs_bench's helpers), on
CONVEYOR_BENCH_DATABASE_URL; stops every server it started, also on Ctrl-C or an error.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import signal
import sys
from pathlib import Path

import uvloop

import sqs_bench as sb

ROWS = ("livez", "send", "batch", "rest", "queen", "hq")
ROW_NAMES = {**sb.ROW_NAMES, "livez": "GET /livez (no database)", "rest": "REST POST /v1/queues/{name}/messages",
             "queen": "Queen API POST /api/v1/push (1 item)", "hq": "hq POST /hq/queues/{name}/enqueue"}
BODY = b'{"order": 12345, "note": "' + b"x" * 40 + b'"}'


def start(name: str, dsn: str, src: Path, extra: dict[str, str], workers: int) -> sb.Child:
    port = sb.free_port()
    env = {**os.environ, "DATABASE_URL": dsn, "CONVEYOR_PORT": str(port), "CONVEYOR_AUTH": "none",
           "CONVEYOR_LOG_LEVEL": "warning", "CONVEYOR_POOL_MAX": "16", "CONVEYOR_WORKERS": str(workers),
           "PYTHONPATH": os.pathsep.join([str(src.resolve()), os.environ.get("PYTHONPATH", "")]), **extra}
    return sb.Child(name, [sys.executable, "-m", "conveyor", "serve"], env, port, quiet=False)


async def one_run(server: sb.Child, row: str, clients: int, seconds: float, queue: str) -> sb.Cell:
    meter = sb.CpuMeter(server.proc.pid, "server", postgres=row != "livez")
    async with sb.raw_sqs(server) as sqs:
        if row == "livez":
            return await sb.run_tasks([livez(sqs.http)] * clients, seconds, 10_000_000, meter)
        if row in ("rest", "queen", "hq"):
            return await sb.run_tasks([await http_send(sqs.http, row, queue)] * clients, seconds, 10_000_000, meter)
        url = await sqs.create_queue(queue)
        return await sb.run_tasks(sqs.ops(url, row, clients), seconds, 10_000_000, meter)


def livez(http: sb.RawHttp) -> sb.AsyncOp:
    """The HTTP stack and the app's edge alone: a request that touches no database."""
    request = http.request("GET", "/livez", b"", {})

    async def op() -> tuple[int, int]:
        status, _ = await http.send(request)
        return (1 if status == 200 else -1), 1

    return op


async def http_send(http: sb.RawHttp, api: str, queue: str) -> sb.AsyncOp:
    """One message per call through a plain-HTTP API, on a queue made first."""
    json = {"Content-Type": "application/json"}
    if api == "rest":
        status, _ = await http.send(http.request("POST", "/v1/queues", b'{"name": "%s"}' % queue.encode(), json))
        request, ok = http.request("POST", f"/v1/queues/{queue}/messages", b'{"message": %s}' % BODY, json), 201
    elif api == "queen":
        request = http.request("POST", "/api/v1/push", b'{"items": [{"queue": "%s", "partition": "p0", "payload": %s}]}'
                               % (queue.encode(), BODY), json)
        status, ok = 201, 201
    else:
        status, _ = await http.send(http.request(
            "POST", f"/hq/queues?name={queue}&max_attempts=3&visibility_timeout_seconds=30", b"", {}))
        request, ok = http.request("POST", f"/hq/queues/{queue}/enqueue", BODY, json), 200
    if status >= 300 and status != 409:
        raise RuntimeError(f"{api}: could not make queue {queue}: HTTP {status}")

    async def op() -> tuple[int, int]:
        status, _ = await http.send(request)
        return (1 if status == ok else -1), 1

    return op


def pairs(values: list[str]) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, value = v.partition("=")
        if not sep:
            raise SystemExit(f"expected KEY=VALUE, got {v!r}")
        out[key] = value
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before-src", type=Path, required=True, help="the src directory of the tree to compare against")
    p.add_argument("--after-src", type=Path, default=Path(__file__).resolve().parent.parent / "src",
                   help="the src directory measured (default: this checkout's)")
    p.add_argument("--before-env", nargs="*", default=[], help="KEY=VALUE settings of the first server")
    p.add_argument("--after-env", nargs="*", default=[], help="KEY=VALUE settings of the second server")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--clients", type=int, nargs="+", default=[1, 16])
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    args = p.parse_args()
    command = shlex.join(["python", *sys.argv])
    signal.signal(signal.SIGTERM, lambda signum, _frame: (_ for _ in ()).throw(SystemExit(128 + signum)))
    # a database per server, migrated by that server as it starts: two trees may have
    # different migrations, and a server refuses a database another build migrated
    dsns = {name: sb.create_database(f"{sb.DATABASE}_{name}") for name in ("before", "after")}
    servers: list[sb.Child] = []
    queues = 0
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            servers = [start("before", dsns["before"], args.before_src, pairs(args.before_env), args.workers),
                       start("after", dsns["after"], args.after_src, pairs(args.after_env), args.workers)]
            for s in servers:
                s.wait_ready("/livez")

            def run(server: sb.Child, row: str, clients: int, seconds: float) -> sb.Cell:
                nonlocal queues
                queues += 1
                return runner.run(one_run(server, row, clients, seconds, f"ab-{server.name}-{queues}"))

            for s in servers:
                for row in args.rows:
                    run(s, row, max(args.clients), args.warmup)
            results = {}
            for clients in args.clients:
                for row in args.rows:
                    cells: dict[str, list[sb.Cell]] = {s.name: [] for s in servers}
                    for i in range(args.repeat):
                        for s in (servers if i % 2 == 0 else servers[::-1]):
                            cells[s.name].append(run(s, row, clients, args.seconds))
                    medians = {n: sb.median_cell(c) for n, c in cells.items()}
                    results[(row, clients)] = medians
                    for n, c in cells.items():
                        print(f"{row:<6} x{clients:<3} {n:<7} median {medians[n].rate:7.0f} msg/s  runs "
                              f"{' '.join(f'{x.rate:.0f}' for x in c)}  {medians[n].cpu_per_request()}", flush=True)
    finally:
        for s in servers:
            s.stop()
        for name in dsns:
            sb.drop_database(f"{sb.DATABASE}_{name}")
    print("\n| operation | clients | before | after | after/before | server + PostgreSQL CPU us/request before | after | after/before |"
          "\n|---|---:|---:|---:|---:|---:|---:|---:|")
    for (row, clients), m in results.items():
        b, a = m["before"].rate, m["after"].rate
        cb, ca = (sum(v for k, v in m[n].cpu.items() if k != "client") / m[n].requests * 1e6 if m[n].requests else 0.0
                  for n in ("before", "after"))
        print(f"| {ROW_NAMES[row]} | {clients} | {b:.0f} | {a:.0f} | {a / b:.3f} | {cb:.0f} | {ca:.0f} | "
              f"{ca / cb if cb else 0:.3f} |")
    print(f"\ncommand: {command}")


if __name__ == "__main__":
    main()
