"""The server's own Python layers per request, in process: no network, no database.

    ./bin/bench app_bench.py [--before-src DIR] [--requests 20000] [--repeat 7]

Builds the server's ASGI app (``create_app``, default settings, ``CONVEYOR_AUTH=header``
as the peers bench runs it) with the broker's send and Queen push answered at once by a
stub, and calls it directly with one request at a time: the edge layer, routing, the
protocol's parsing, validation and rendering, and nothing else. Rows: REST send (POST
/v1/queues/{name}/messages), Queen push of one item (POST /api/v1/push), hq enqueue
(POST /hq/queues/{name}/enqueue), and an unknown path (404: the router's slow path).

With --before-src, each round runs this tree and the tree at DIR (its ``src``) in two
fresh processes, alternating (A B B A ...), and prints both with the after/before ratio:
CPU microseconds per request (``time.process_time``), medians of --repeat rounds. The
figures are free of the machine's network and database noise, not of its load; compare
within a run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROWS = ("rest", "queen", "hq", "404")
ROW_NAMES = {"rest": "REST POST /v1/queues/{name}/messages", "queen": "Queen POST /api/v1/push (1 item)",
             "hq": "hq POST /hq/queues/{name}/enqueue", "404": "GET /v1/nothing/here (404)"}
BODY = b'{"order": 12345, "note": "' + b"x" * 40 + b'"}'


def requests() -> dict[str, tuple[str, str, bytes]]:
    return {
        "rest": ("POST", "/v1/queues/jobs/messages", b'{"message": %s}' % BODY),
        "queen": ("POST", "/api/v1/push", b'{"items": [{"queue": "jobs", "partition": "p0", "payload": %s}]}' % BODY),
        "hq": ("POST", "/hq/queues/jobs/enqueue", BODY),
        "404": ("GET", "/v1/nothing/here", b""),
    }


def measure(count: int) -> dict[str, float]:
    """CPU us per request of each row, in this process (imports the conveyor on sys.path)."""
    from conveyor import types
    from conveyor.server.app import create_app
    from conveyor.settings import Settings

    app = create_app(Settings(auth_mode="header"), "postgresql://127.0.0.1:1/unused")  # no lifespan: never opened
    broker = app.state.broker

    async def send(queue: str, batch: Any, *, spool: bool = False) -> list[Any]:
        return [types.Sent(i + 1, uuid.UUID(int=i + 1)) for i in range(len(batch))]

    async def pq_push(items: Any, *, creatable: int) -> list[dict[str, Any]]:
        return [{"status": "queued", "transactionId": str(uuid.UUID(int=1)), "partitionId": str(uuid.UUID(int=2))}
                for _ in items]

    broker.send = send
    broker.pq_push = pq_push
    broker.spools = lambda protocol: False

    async def one(method: str, path: str, body: bytes) -> int:
        headers = [(b"host", b"127.0.0.1"), (b"authorization", b"bench"), (b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode())]
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
                 "headers": headers, "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000), "state": {}}
        status = 0
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                await asyncio.sleep(3600)
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def reply(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]

        await app(scope, receive, reply)
        return status

    async def run() -> dict[str, float]:
        out = {}
        for row, (method, path, body) in requests().items():
            expected = await one(method, path, body)
            if expected >= 500 or (row != "404" and expected >= 300):
                raise RuntimeError(f"{row}: HTTP {expected}")
            started = time.process_time()
            for _ in range(count):
                await one(method, path, body)
            out[row] = (time.process_time() - started) / count * 1e6
        return out

    import uvloop
    return uvloop.run(run())


def child(src: Path, count: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src.resolve()), os.environ.get("PYTHONPATH", "")]),
           "CONVEYOR_LOG_LEVEL": "warning"}
    out = subprocess.run([sys.executable, __file__, "--child", "--requests", str(count)], env=env, check=True,
                         capture_output=True, text=True).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before-src", type=Path, help="the src directory of the tree to compare against")
    p.add_argument("--after-src", type=Path, default=Path(__file__).resolve().parent.parent / "src")
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(args.requests)))
        return
    trees = {"after": args.after_src} if args.before_src is None else {"before": args.before_src,
                                                                        "after": args.after_src}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for i in range(args.repeat):
        order = list(trees.items()) if i % 2 == 0 else list(trees.items())[::-1]
        for name, src in order:
            runs[name].append(child(src, args.requests))
            print(f"round {i + 1} {name:<6} " + "  ".join(f"{r} {runs[name][-1][r]:5.1f}" for r in ROWS), flush=True)
    medians = {name: {r: statistics.median(x[r] for x in rs) for r in ROWS} for name, rs in runs.items()}
    names = list(trees)
    print(f"\nCPU us per request, in process, medians of {args.repeat} rounds of {args.requests:,} requests "
          f"(load average {os.getloadavg()[0]:.1f})\n")
    print("| request | " + " | ".join(names) + (" | after/before |" if len(names) == 2 else " |"))
    print("|---|" + "---:|" * (len(names) + (1 if len(names) == 2 else 0)))
    for r in ROWS:
        cells = " | ".join(f"{medians[n][r]:.1f}" for n in names)
        ratio = f" | {medians['after'][r] / medians['before'][r]:.3f}" if len(names) == 2 else ""
        print(f"| {ROW_NAMES[r]} | {cells}{ratio} |")
    print(f"\ncommand: ./bin/bench app_bench.py {' '.join(sys.argv[1:])}")


if __name__ == "__main__":
    main()
