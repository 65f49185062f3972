"""Where the server's CPU goes on a single-message request, per protocol: py-spy samples a
running `conveyor serve` (one process) under load from raw HTTP clients, and each sample is
charged to the layer of its innermost frame that belongs to one (the table below).

    ./bin/bench path_profile.py [--ops sqs-send sqs-query-send rest-send queen-push queen-pop-ack hq-send]
                                [--clients 8] [--seconds 8] [--rate 250] [--top N] [--inclusive N]

Per operation it prints the requests/s reached, the server's and its PostgreSQL backends'
CPU per request (/proc), and the server's CPU split into layers, in us per request (the
share of samples times the server's CPU per request). py-spy (pip: py-spy) samples without
stopping the process (--nonblocking), so the split is statistical: a few percent per layer.
Samples in uvloop's C code (no Python frame of their own) may include moments the process
was runnable but waiting for a core on a busy machine: read that line as an upper bound.
Creates and drops database conveyor_profile_bench on CONVEYOR_BENCH_DATABASE_URL.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import orjson
import psycopg
import uvloop

sys.path.insert(0, str(Path(__file__).parent))
import sqs_bench as shared
from peers_bench import Meter
from rawhttp import RawHttp
from sqs_bench import Child, free_port

DATABASE = "conveyor_profile_bench"
AUTH = "AWS4-HMAC-SHA256 Credential=bench/20250101/us-east-1/sqs/aws4_request, SignedHeaders=host, Signature=0"
BODY = "x" * 100
OPS = ("sqs-send", "sqs-query-send", "rest-send", "queen-push", "queen-pop-ack", "hq-send", "sqs-receive-delete",
       "sqs-receive10-delete10", "queen-pop10-ack10")
PRELOAD = 150_000  # messages waiting before sqs-receive10-delete10 and queen-pop10-ack10 (not drained in 8 s)
PARTITIONS = 64  # queen-pop10-ack10's, as peers_bench.py's

# (layer, what a frame's file path contains); the first match from the innermost frame wins
LAYERS = [
    ("tracing", ("opentelemetry/", "conveyor/tracing")),
    ("metrics", ("prometheus_client/", "conveyor/server/metrics")),
    ("auth", ("conveyor/protocols/auth", "conveyor/protocols/aws/sigv4", "conveyor/protocols/jwt")),
    ("driver (psycopg, pool)", ("psycopg/", "psycopg_pool/", "psycopg_binary/", "conveyor/db/")),
    ("fusion", ("conveyor/server/fusion",)),
    ("broker", ("conveyor/server/broker", "conveyor/server/brokers/", "conveyor/core/")),
    ("middleware (admission, deadline, body limit, connections)",
     ("conveyor/server/middleware", "conveyor/server/deadline", "conveyor/server/connections")),
    ("protocol: parse, validate, encode", ("conveyor/protocols/",)),
    ("routing (starlette)", ("starlette/",)),
    ("HTTP (uvicorn, httptools)", ("uvicorn/", "httptools/", "h11/")),
    ("event loop (asyncio, uvloop)", ("asyncio/", "uvloop/")),
]


LOOP = LAYERS[-1]
IN_LOOP = ("Runner.run (asyncio/runners.py:118)",)
IN_LOOP_NAME = "uvloop's C code: socket I/O, polling, callbacks"


def layer_of(stack: str) -> str:
    """The layer of the innermost frame that belongs to one other than the event loop's
    (asyncio's frames under a driver's await are the driver's); else the event loop's."""
    frames = stack.split(";")
    loop = False
    for frame in reversed(frames):  # innermost last
        for name, marks in LAYERS:
            if any(m in frame for m in marks):
                if (name, marks) != LOOP:
                    return name
                loop = True
    return LOOP[0] if loop else "other"


class Load:
    def __init__(self, port: int) -> None:
        self.http = RawHttp("127.0.0.1", port)

    def req(self, method: str, path: str, body: bytes, **headers: str) -> bytes:
        return self.http.request(method, path, body, {"Authorization": AUTH, "Content-Type": "application/json",
                                                      **headers})

    async def ok(self, request: bytes, *statuses: int) -> bytes:
        status, body = await self.http.send(request)
        if status not in (statuses or (200,)):
            raise RuntimeError(f"HTTP {status}: {body[:300]!r}")
        return body

    async def make(self, op: str):  # the request loop's one call
        name = f"prof-{uuid.uuid4().hex[:8]}"
        json10 = {"Content-Type": "application/x-amz-json-1.0"}
        if op.startswith("sqs"):
            body = await self.ok(self.req("POST", "/", orjson.dumps({"QueueName": name}),
                                          **json10, **{"X-Amz-Target": "AmazonSQS.CreateQueue"}))
            url = orjson.loads(body)["QueueUrl"]
            if op == "sqs-send":
                r = self.req("POST", "/", orjson.dumps({"QueueUrl": url, "MessageBody": BODY}),
                             **json10, **{"X-Amz-Target": "AmazonSQS.SendMessage"})
                return lambda: self.ok(r)
            if op == "sqs-query-send":
                form = f"Action=SendMessage&Version=2012-11-05&QueueUrl={url}&MessageBody={BODY}".encode()
                r = self.req("POST", "/", form, **{"Content-Type": "application/x-www-form-urlencoded"})
                return lambda: self.ok(r)
            if op == "sqs-receive10-delete10":
                return await self.receive10_delete10(url)
            receive = self.req("POST", "/", orjson.dumps({"QueueUrl": url, "MaxNumberOfMessages": 1}),
                               **json10, **{"X-Amz-Target": "AmazonSQS.ReceiveMessage"})
            send = self.req("POST", "/", orjson.dumps({"QueueUrl": url, "MessageBody": BODY}),
                            **json10, **{"X-Amz-Target": "AmazonSQS.SendMessage"})

            async def receive_delete() -> None:
                await self.ok(send)
                got = orjson.loads(await self.ok(receive)).get("Messages") or []
                for m in got:
                    await self.ok(self.req("POST", "/", orjson.dumps({"QueueUrl": url,
                                                                      "ReceiptHandle": m["ReceiptHandle"]}),
                                           **json10, **{"X-Amz-Target": "AmazonSQS.DeleteMessage"}))
            return receive_delete
        if op == "rest-send":
            await self.ok(self.req("POST", "/v1/queues", orjson.dumps({"name": name})), 201)
            r = self.req("POST", f"/v1/queues/{name}/messages", orjson.dumps({"message": BODY}))
            return lambda: self.ok(r, 201)
        if op == "hq-send":
            await self.ok(self.req("POST", f"/hq/queues?name={name}&max_attempts=3&visibility_timeout_seconds=30",
                                   b""), 200, 201, 204)
            r = self.req("POST", f"/hq/queues/{name}/enqueue", orjson.dumps({"note": BODY}))
            return lambda: self.ok(r, 200, 201)
        if op == "queen-pop10-ack10":
            return await self.pop10_ack10(name)
        push = self.req("POST", "/api/v1/push", orjson.dumps(
            {"items": [{"queue": name, "partition": "p0", "payload": {"note": BODY}}]}))
        if op == "queen-push":
            return lambda: self.ok(push, 201)
        pop = self.req("GET", f"/api/v1/pop/queue/{name}?batch=1&wait=false", b"")

        async def pop_ack() -> None:
            await self.ok(push, 201)
            status, body = await self.http.send(pop)
            if status == 204:
                return
            for m in orjson.loads(body)["messages"]:
                await self.ok(self.req("POST", "/api/v1/ack", orjson.dumps(
                    {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                     "leaseId": m["leaseId"], "status": "completed"})), 200)
        return pop_ack


    async def preload(self, request: bytes, *ok: int) -> None:
        """PRELOAD messages, ten a request, from 16 connections."""
        loaders = [RawHttp(self.http.host, self.http.port) for _ in range(16)]

        async def load(http: RawHttp, n: int) -> None:
            for _ in range(n):
                status, body = await http.send(request)
                if status not in ok:
                    raise RuntimeError(f"HTTP {status}: {body[:300]!r}")

        await asyncio.gather(*(load(h, PRELOAD // 10 // len(loaders)) for h in loaders))
        for h in loaders:
            await h.close()

    async def pop10_ack10(self, name: str):
        """PRELOAD messages pushed ten a request over PARTITIONS partitions first; then each
        call pops 10 from any partition and acks them in one /ack/batch (the peers bench's
        "receive 10 + ack" of the Queen API)."""
        await self.preload(self.req("POST", "/api/v1/push", orjson.dumps({"items": [
            {"queue": name, "partition": f"p{k % PARTITIONS}", "payload": {"note": BODY}} for k in range(10)]})), 201)
        pop = self.req("GET", f"/api/v1/pop/queue/{name}?batch=10&wait=false", b"")

        async def call() -> None:
            status, body = await self.http.send(pop)
            if status == 204:
                return
            acks = [{"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"],
                     "status": "completed"} for m in orjson.loads(body)["messages"]]
            if acks:
                await self.ok(self.req("POST", "/api/v1/ack/batch", orjson.dumps({"acknowledgments": acks})))
        return call

    async def receive10_delete10(self, url: str):
        """PRELOAD messages sent in batches first; then each call receives 10 and deletes
        them with one DeleteMessageBatch (the peers bench's "receive 10 + ack")."""
        json10 = {"Content-Type": "application/x-amz-json-1.0"}
        await self.preload(self.req("POST", "/", orjson.dumps({"QueueUrl": url, "Entries": [
            {"Id": str(i), "MessageBody": BODY} for i in range(10)]}),
            **json10, **{"X-Amz-Target": "AmazonSQS.SendMessageBatch"}), 200)
        receive = self.req("POST", "/", orjson.dumps({"QueueUrl": url, "MaxNumberOfMessages": 10}),
                           **json10, **{"X-Amz-Target": "AmazonSQS.ReceiveMessage"})

        async def call() -> None:
            got = orjson.loads(await self.ok(receive)).get("Messages") or []
            if got:
                await self.ok(self.req("POST", "/", orjson.dumps({"QueueUrl": url, "Entries": [
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)]}),
                    **json10, **{"X-Amz-Target": "AmazonSQS.DeleteMessageBatch"}))
        return call


async def drive(load: Load, call, clients: int, seconds: float) -> int:
    end = time.monotonic() + seconds
    done = 0

    async def loop() -> None:
        nonlocal done
        while time.monotonic() < end:
            await call()
            done += 1

    await asyncio.gather(*(loop() for _ in range(clients)))
    await load.http.close()
    return done


def profile(server: Child, dsn: str, op: str, args: argparse.Namespace, pyspy: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as monitor:
        def backends() -> list[int]:
            return [r[0] for r in monitor.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()").fetchall()]

        meter = Meter(lambda: [], tree=server.proc.pid, backends=backends)
        out = Path(tempfile.mkdtemp()) / f"{op}.txt"
        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
        load = Load(server.port)
        call = runner.run(load.make(op))  # the queue, and messages to receive: not measured
        spy = subprocess.Popen([pyspy, "record", "--pid", str(server.proc.pid), "--rate", str(args.rate),
                                "--duration", str(int(args.seconds) + 1), "--format", "raw", "--nonblocking",
                                "--output", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        before = meter.sample()
        started = time.monotonic()
        with runner:
            requests = runner.run(drive(load, call, args.clients, args.seconds))
        took = time.monotonic() - started
        after = meter.sample()
        spy.wait(60)
    server_us = (after["server"] - before["server"]) / requests * 1e6
    pg_us = (after["postgres"] - before["postgres"]) / requests * 1e6
    counts: collections.Counter[str] = collections.Counter()
    innermost: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()  # Conveyor's functions, callees included
    for line in out.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            innermost[stack.rpartition(";")[2]] += int(n)
            for frame in {f for f in stack.split(";") if "(conveyor/" in f}:
                inclusive[frame] += int(n)
            # a sample whose innermost Python frame is the loop's run is in uvloop's C code
            counts[IN_LOOP_NAME if stack.endswith(IN_LOOP) else layer_of(stack)] += int(n)
    total = sum(counts.values()) or 1
    print(f"\n{op}: {requests / took:,.0f} requests/s ({args.clients} clients); CPU per request: server "
          f"{server_us:,.0f} us, PostgreSQL backends {pg_us:,.0f} us; {total} samples", flush=True)
    for name, n in counts.most_common():
        print(f"  {name:<58} {n / total:6.1%} {n / total * server_us:7.0f} us")
    if args.top:
        print(f"  the {args.top} functions most often innermost (self time):")
        for frame, n in innermost.most_common(args.top):
            print(f"    {n / total:6.1%} {n / total * server_us:7.0f} us  {frame[:110]}")
    if args.inclusive:
        print(f"  the {args.inclusive} functions of Conveyor with the most samples, callees included:")
        for frame, n in inclusive.most_common(args.inclusive):
            print(f"    {n / total:6.1%} {n / total * server_us:7.0f} us  {frame[:110]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS[:6]))
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--top", type=int, default=0, help="also print the N functions most often innermost")
    p.add_argument("--inclusive", type=int, default=0,
                   help="also print the N functions of Conveyor on the most samples, callees included")
    args = p.parse_args()
    if not 0 < args.seconds <= 60:
        p.error("--seconds is in (0, 60]")
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    dsn = shared.create_database(DATABASE, migrated=True)
    port = free_port()
    env = {**os.environ, "DATABASE_URL": dsn, "CONVEYOR_PORT": str(port), "CONVEYOR_LOG_LEVEL": "warning",
           "CONVEYOR_WORKERS": "1", "CONVEYOR_DIALECTS": "hq"}
    server = Child("conveyor", [sys.executable, "-m", "conveyor", "serve"], env, port, quiet=False)
    try:
        server.wait_ready("/livez")
        for op in args.ops:
            profile(server, dsn, op, args, pyspy)
    finally:
        server.stop()
        shared.drop_database(DATABASE)


if __name__ == "__main__":
    main()
