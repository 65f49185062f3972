"""Encryption at rest and tracing: what each costs, side by side in one run.

    ./bin/bench encryption_bench.py [--clients 32] [--seconds 5] [--repeat 3] [--size 1024]

Encryption: one server with CONVEYOR_ENCRYPTION_KEY, two queues (one plain, one
encrypted), the same load on each, alternating. Tracing: a second server with
CONVEYOR_TRACING=true exporting every span (sample rate 1) to a stand-in OTLP collector
in this process, against the first server's plain queue. Medians over --repeat runs of
at most --seconds (and --max-calls calls) each:

  REST send        POST /v1/queues/{q}/messages, one --size-byte JSON message per request
  SQS send         SendMessage (JSON protocol), the same body
  REST receive     GET /v1/queues/{q}/messages?max=10 then DELETE of the receipts, over a
                   preloaded queue

Creates and drops database conveyor_encryption_bench on CONVEYOR_BENCH_DATABASE_URL.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import uuid
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).parent))
import sqs_bench as shared_db
from conveyor import crypto
from queen_bench import _loop
from rawhttp import RawHttp
from sqs_bench import Child, free_port

ADMIN_DSN = os.environ.get("CONVEYOR_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
DATABASE = "conveyor_encryption_bench"
JSON = {"Authorization": "bench", "Content-Type": "application/json"}
SQS = {"Authorization": "bench", "Content-Type": "application/x-amz-json-1.0",
       "X-Amz-Target": "AmazonSQS.SendMessage"}


def create_database() -> str:
    return shared_db.create_database(DATABASE, migrated=True)


def drop_database() -> None:
    shared_db.drop_database(DATABASE)


async def rest_send(http: RawHttp, queue: str, body: bytes, args: argparse.Namespace) -> float:
    request = http.request("POST", f"/v1/queues/{queue}/messages", body, JSON)

    async def one(_: int) -> int:
        status, answer = await http.send(request)
        if status != 201:
            raise RuntimeError(f"send: {status} {answer[:200]!r}")
        return 1

    done, took = await _loop(args.clients, args.seconds, args.max_calls, one)
    return done / took


async def sqs_send(http: RawHttp, url: str, text: str, args: argparse.Namespace) -> float:
    request = http.request("POST", "/", orjson.dumps({"QueueUrl": url, "MessageBody": text}), SQS)

    async def one(_: int) -> int:
        status, answer = await http.send(request)
        if status != 200:
            raise RuntimeError(f"SendMessage: {status} {answer[:200]!r}")
        return 1

    done, took = await _loop(args.clients, args.seconds, args.max_calls, one)
    return done / took


async def rest_receive(http: RawHttp, queue: str, args: argparse.Namespace) -> float:
    receive = http.request("GET", f"/v1/queues/{queue}/messages?max=10", b"", JSON)

    async def one(_: int) -> int:
        status, answer = await http.send(receive)
        got = orjson.loads(answer) if status == 200 else []
        if not got:
            await asyncio.sleep(0.005)
            return 0
        body = orjson.dumps({"receipts": [m["receipt"] for m in got]})
        await http.send(http.request("DELETE", f"/v1/queues/{queue}/messages", body, JSON))
        return len(got)

    done, took = await _loop(args.clients, args.seconds, args.max_calls, one)
    return done / took


async def preload(http: RawHttp, queue: str, body: bytes, total: int) -> None:
    batch = orjson.dumps([orjson.loads(body)] * 100)
    for _ in range(total // 100):
        status, answer = await http.send(http.request("POST", f"/v1/queues/{queue}/messages", batch, JSON))
        if status != 201:
            raise RuntimeError(f"preload: {status} {answer[:200]!r}")


async def collector(port: int) -> Any:
    """A stand-in OTLP/HTTP collector: takes every export and answers 200."""
    from aiohttp import web

    spans = {"exports": 0}

    async def take(request: web.Request) -> web.Response:
        await request.read()
        spans["exports"] += 1
        return web.Response(status=200, content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", take)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, spans


async def measure_tracing(port: int, args: argparse.Namespace) -> dict[str, float]:
    http = RawHttp("127.0.0.1", port)
    body = orjson.dumps({"message": "x" * args.size})
    figures: list[float] = []
    for _ in range(args.repeat):
        q = f"traced-{uuid.uuid4().hex[:6]}"
        await http.send(http.request("POST", "/v1/queues", orjson.dumps({"name": q}), JSON))
        figures.append(await rest_send(http, q, body, args))
    await http.close()
    return {"REST send, plain, traced": statistics.median(figures)}


async def measure(port: int, args: argparse.Namespace) -> dict[str, float]:
    http = RawHttp("127.0.0.1", port)
    text = "x" * args.size
    body = orjson.dumps({"message": text})
    figures: dict[str, list[float]] = {}
    for _ in range(args.repeat):
        for kind in ("plain", "encrypted"):
            q = f"{kind}-{uuid.uuid4().hex[:6]}"
            spec = {"name": q, "encrypted": kind == "encrypted"}
            await http.send(http.request("POST", "/v1/queues", orjson.dumps(spec), JSON))
            figures.setdefault(f"REST send, {kind}", []).append(await rest_send(http, q, body, args))
            url = f"http://127.0.0.1:{port}/000000000000/{q}"
            figures.setdefault(f"SQS send, {kind}", []).append(await sqs_send(http, url, text, args))
            r = f"{kind}-r-{uuid.uuid4().hex[:6]}"
            await http.send(http.request("POST", "/v1/queues", orjson.dumps({**spec, "name": r}), JSON))
            await preload(http, r, body, args.preload)
            figures.setdefault(f"REST receive+delete, {kind}", []).append(await rest_receive(http, r, args))
    await http.close()
    return {k: statistics.median(v) for k, v in figures.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-calls", type=int, default=200000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--preload", type=int, default=20000)
    args = parser.parse_args()

    dsn = create_database()
    port = free_port()
    env = {**os.environ, "DATABASE_URL": dsn, "CONVEYOR_PORT": str(port), "CONVEYOR_AUTH": "header",
           "CONVEYOR_LOG_LEVEL": "warning", "CONVEYOR_WORKERS": "1", "CONVEYOR_MAX_REQUESTS": "100000",
           "CONVEYOR_ENCRYPTION_KEY": crypto.Keyring.generate("bench")}
    server = Child("conveyor", [sys.executable, "-m", "conveyor", "serve"], env, port, quiet=False)
    try:
        server.wait_ready("/livez")
        results = asyncio.run(measure(port, args))
    finally:
        server.stop()
    otlp_port, traced_port = free_port(), free_port()
    traced = Child("conveyor", [sys.executable, "-m", "conveyor", "serve"],
                   {**env, "CONVEYOR_PORT": str(traced_port), "CONVEYOR_TRACING": "true",
                    "CONVEYOR_TRACING_ENDPOINT": f"http://127.0.0.1:{otlp_port}/v1/traces"}, traced_port, quiet=False)

    async def traced_run() -> dict[str, float]:
        runner, spans = await collector(otlp_port)
        try:
            figures = await measure_tracing(traced_port, args)
            await asyncio.sleep(6)  # the exporter's batch interval: the spans reached the collector
            figures["(OTLP exports received)"] = float(spans["exports"])
            return figures
        finally:
            await runner.cleanup()

    try:
        traced.wait_ready("/livez")
        results.update(asyncio.run(traced_run()))
    finally:
        traced.stop()
        drop_database()
    print(f"\n{args.clients} clients, {args.size}-byte bodies, {args.seconds:g}s x {args.repeat} (medians), "
          f"{os.cpu_count()} cores\n")
    print(f"{'figure':<32} {'msg/s':>10} {'against plain':>18}")
    for name, value in results.items():
        ratio = ""
        if name.endswith("encrypted"):
            ratio = f"{value / results[name.replace('encrypted', 'plain')]:>18.2f}"
        if name.endswith("traced"):
            ratio = f"{value / results['REST send, plain']:>18.2f}"
        print(f"{name:<32} {value:>10,.0f} {ratio}")


if __name__ == "__main__":
    main()
