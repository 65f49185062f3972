"""Conveyor beside its peers (RabbitMQ, NATS JetStream, LocalStack, the real Queen server),
alternating in one run.

    ./bin/bench peers_bench.py [--clients 8 32] [--seconds 3] [--repeat 3] [--preload 100000]
                               [--systems sqs rest queen rabbit rabbit-quorum nats localstack queen-real]
                               [--rows send1 send10 receive1 receive] [--workers N]
                               [--localstack-python PATH] [--queen-server PATH]

Systems (each a column; every one reached over loopback with a cheap client):
  sqs            Conveyor's SQS JSON protocol (bench/rawhttp.py: keep-alive, requests built once)
  rest           Conveyor's REST API, same client
  queen          Conveyor's Queen API (/api/v1/push, /pop, /ack/batch), same client; --partitions
                 partitions, as Queen's consumers lease a partition each
  rabbit         RabbitMQ (127.0.0.1:5672, guest/guest) through aio-pika: a durable classic
                 queue, persistent messages, publisher confirms (each publish waits for its confirm)
  rabbit-quorum  the same with a quorum queue
  nats           NATS JetStream (127.0.0.1:4222) through nats-py: a file-storage stream with
                 work-queue retention, every publish waits for its JetStream ack; one durable
                 pull consumer shared by the clients
  localstack     LocalStack's SQS (in memory), the sqs column's client and requests; started here
                 in host mode (no container) from --localstack-python (or
                 CONVEYOR_BENCH_LOCALSTACK_PYTHON: the python of a venv with localstack-core
                 installed, docs/benchmarks.md says how), SERVICES=sqs, listening on [::1] (its
                 default server binds every IPv4 address whatever the host it is given; its
                 ready monitor, which probes 127.0.0.1, prints a TimeoutError 15 s after the
                 start: harmless, it only runs init scripts)
  queen-real     the real Queen server (C++), the queen column's client and requests; started
                 here from --queen-server (or CONVEYOR_BENCH_QUEEN_SERVER: server/bin/queen-server
                 of a built Queen source tree, run from server/ so that it finds ../lib/schema), on
                 127.0.0.1 and a database of its own on the same PostgreSQL, with as many worker
                 threads as Conveyor has processes
localstack and queen-real are left out, with a note, when their path is not given.
Each client has its own connection (HTTP keep-alive, AMQP connection + channel, NATS connection).

Rows (messages/s; a batch counts its messages):
  send1         one message per call (SendMessage; POST /messages; push of 1; publish + confirm;
                JetStream publish + ack)
  send10        ten per call (SendMessageBatch; a REST array; push of 10; ten publishes, then their
                confirms; ten JetStream publishes, then their acks)
  receive1      one at a time, then acknowledged (ReceiveMessage(1) + DeleteMessage; GET ?max=1 +
                DELETE; pop batch=1 + ack/batch; prefetch 1 + ack; fetch(1) + ack), from a queue
                preloaded with --preload messages
  receive       ten at a time, then acknowledged at once (ReceiveMessage(10) +
                DeleteMessageBatch; GET ?max=10 + DELETE receipts; pop batch=10 + ack/batch;
                prefetch 10, ack multiple=true on the tenth; fetch(10) + ack of each), from a
                queue preloaded with --preload messages

Server CPU per message: from /proc, the broker's processes over the cell, divided by the
messages: for Conveyor its server process and its workers plus the PostgreSQL backends
connected to the bench database (pg_stat_activity; PostgreSQL's background writer,
checkpointer and WAL writer are not counted, nor are RabbitMQ's or NATS's disks); the same
for the real Queen (its process plus the backends connected to its database); for LocalStack
its process and every process under it; for RabbitMQ the beam.smp process; for NATS the
nats-server process. Less sensitive to the machine's drift and to the load generator's share
of the cores than messages/s, but it includes each server's background work, the more so the
slower the messages come: that work is read on its own before the rounds (--idle seconds of
no calls, after a warm-up that runs every row once unrecorded).

Every cell runs at most --seconds and --max-messages (calls in flight then are waited for,
at most 20 s); each row of each repeat starts on a new, empty queue (receive: preloaded)
deleted after. Within a repeat, the systems take turns row by row, in an order that rotates
from repeat to repeat, so a drift of the machine's speed weighs on all. The median of
--repeat runs is reported for each figure, and each ratio is the median of the paired runs'
ratios. Creates and drops databases conveyor_peers_bench_<pid> (and ..._<pid>_queen) on
CONVEYOR_BENCH_DATABASE_URL, named by the process so that runs side by side do not collide; starts and stops one `conveyor serve`, and LocalStack and
Queen when asked.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aio_pika
import nats
import orjson
import psycopg
import uvloop
from nats.js.api import RetentionPolicy, StorageType
from psycopg import conninfo

sys.path.insert(0, str(Path(__file__).parent))
import sqs_bench as shared
from conveyor.settings import default_workers
from rawhttp import HttpError, RawHttp
from sqs_bench import Cell, Child, Meter, free_port, pids_named, run_tasks

DATABASE = "conveyor_peers_bench"  # + "_<pid>", and "_<pid>_queen" for the real Queen's
SYSTEMS = ("sqs", "rest", "queen", "rabbit", "rabbit-quorum", "nats", "localstack", "queen-real")
CONVEYOR_SYSTEMS = ("sqs", "rest", "queen")
ROWS = ("send1", "send10", "receive1", "receive")
ROW_NAMES = {"send1": "send 1", "send10": "send 10", "receive1": "receive 1 + ack", "receive": "receive 10 + ack"}
RECEIVE_BATCH = {"receive1": 1, "receive": 10}
PUSHED = (200, 201)  # Queen's push answers 200, Conveyor's Queen API 201
WARMUP_SECONDS, WARMUP_PRELOAD = 0.5, 500
BODY = "x" * 100
AUTH = "AWS4-HMAC-SHA256 Credential=bench/20250101/us-east-1/sqs/aws4_request, SignedHeaders=host, Signature=0"
RABBIT_URL = os.environ.get("CONVEYOR_BENCH_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
NATS_URL = os.environ.get("CONVEYOR_BENCH_NATS_URL", "nats://127.0.0.1:4222")
Op = Callable[[], Awaitable[tuple[int, int]]]  # -> (messages, requests); messages 0: empty, < 0: failed


def server_us(cell: Cell) -> float:
    used = cell.cpu.get("server", 0.0) + cell.cpu.get("postgres", 0.0)
    return used / cell.messages * 1e6 if cell.messages > 0 else math.nan


# -- brokers over raw HTTP: Conveyor, LocalStack, the real Queen -------------------------------

class Backends:
    """The PostgreSQL backends connected to one database (a broker's pool)."""

    def __init__(self, dsn: str) -> None:
        self.monitor = psycopg.connect(dsn, autocommit=True)

    def pids(self) -> list[int]:
        rows = self.monitor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                                    "AND pid <> pg_backend_pid()").fetchall()
        return [r[0] for r in rows]

    def close(self) -> None:
        self.monitor.close()


class HttpBroker:
    """A broker reached through bench/rawhttp.py: Conveyor's three columns (one server),
    LocalStack's SQS, the real Queen's API. Its CPU: the process tree of ``server`` plus,
    with ``dsn``, the PostgreSQL backends connected to that database."""

    def __init__(self, label: str, server: Child, host: str, partitions: int, dsn: str | None = None) -> None:
        self.label, self.partitions = label, partitions
        self.http = RawHttp(host, server.port)
        self.backends = Backends(dsn) if dsn else None
        self.meter = Meter(lambda: [], tree=server.proc.pid, backends=self.backends.pids if self.backends else None)

    preload = 0

    async def call(self, request: bytes, ok: int | tuple[int, ...] = 200) -> bytes | None:
        try:
            status, body = await self.http.send(request)
        except HttpError as exc:
            print(f"  {self.label}: {exc}", flush=True)
            return None
        if status not in (ok if isinstance(ok, tuple) else (ok,)):
            if status != 204:
                print(f"  {self.label}: HTTP {status} {body[:300]!r}", flush=True)
            return None
        return body

    def req(self, method: str, path: str, body: Any, headers: dict[str, str] | None = None) -> bytes:
        payload = body if isinstance(body, bytes) else orjson.dumps(body)
        return self.http.request(method, path, payload, {"Authorization": AUTH, "Content-Type": "application/json",
                                                         **(headers or {})})

    # SQS JSON

    def sqs(self, action: str, body: Any) -> bytes:
        return self.req("POST", "/", body, {"Content-Type": "application/x-amz-json-1.0",
                                            "X-Amz-Target": f"AmazonSQS.{action}"})

    async def sqs_ops(self, row: str, clients: int) -> tuple[list[Op], Callable[[], Awaitable[None]]]:
        await self.http.close()  # idle through the other systems' cells: the server may have closed them
        name = f"peers-{uuid.uuid4().hex[:8]}"
        created = await self.call(self.sqs("CreateQueue", {"QueueName": name}))
        if created is None:
            raise RuntimeError(f"{self.label}: could not create a queue")
        url = orjson.loads(created)["QueueUrl"]
        send = self.sqs("SendMessage", {"QueueUrl": url, "MessageBody": BODY})
        batch = self.sqs("SendMessageBatch", {"QueueUrl": url, "Entries": [{"Id": str(i), "MessageBody": BODY}
                                                                           for i in range(10)]})
        receive = self.sqs("ReceiveMessage", {"QueueUrl": url, "MaxNumberOfMessages": RECEIVE_BATCH.get(row, 10),
                                              "WaitTimeSeconds": 0})

        async def send_op() -> tuple[int, int]:
            return (1 if await self.call(send) is not None else -1), 1

        async def batch_op() -> tuple[int, int]:
            body = await self.call(batch)
            return (len(orjson.loads(body).get("Successful", ())) if body else -1), 1

        async def receive_op() -> tuple[int, int]:
            body = await self.call(receive)
            if body is None:
                return -1, 1
            got = orjson.loads(body).get("Messages") or []
            if not got:
                return 0, 1
            if len(got) == 1 and row == "receive1":
                done = await self.call(self.sqs("DeleteMessage", {"QueueUrl": url,
                                                                  "ReceiptHandle": got[0]["ReceiptHandle"]}))
                return (1 if done is not None else -1), 2
            done = await self.call(self.sqs("DeleteMessageBatch", {"QueueUrl": url, "Entries": [
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)]}))
            return (len(orjson.loads(done).get("Successful", ())) if done else -1), 2

        if row in RECEIVE_BATCH:
            await fill(batch_op, self.preload)
        op = receive_op if row in RECEIVE_BATCH else {"send1": send_op, "send10": batch_op}[row]

        async def drop() -> None:
            await self.call(self.sqs("DeleteQueue", {"QueueUrl": url}))
        return [op] * clients, drop

    # REST

    async def rest_ops(self, row: str, clients: int) -> tuple[list[Op], Callable[[], Awaitable[None]]]:
        await self.http.close()  # idle through the other systems' cells: the server may have closed them
        name = f"peers-{uuid.uuid4().hex[:8]}"
        if await self.call(self.req("POST", "/v1/queues", {"name": name}), ok=201) is None:
            raise RuntimeError("REST: could not create a queue")
        path = f"/v1/queues/{name}/messages"
        send = self.req("POST", path, {"message": BODY})
        batch = self.req("POST", path, [{"message": BODY}] * 10)
        receive = self.req("GET", path + f"?max={RECEIVE_BATCH.get(row, 10)}", b"")

        async def send_op() -> tuple[int, int]:
            return (1 if await self.call(send, ok=201) is not None else -1), 1

        async def batch_op() -> tuple[int, int]:
            body = await self.call(batch, ok=201)
            return (len(orjson.loads(body)["ids"]) if body else -1), 1

        async def receive_op() -> tuple[int, int]:
            body = await self.call(receive)
            if body is None:
                return -1, 1
            got = orjson.loads(body)
            if not got:
                return 0, 1
            done = await self.call(self.req("DELETE", path, {"receipts": [m["receipt"] for m in got]}))
            deleted = orjson.loads(done)["deleted"] if done else -1
            return (len(deleted) if isinstance(deleted, list) else deleted), 2

        if row in RECEIVE_BATCH:
            await fill(batch_op, self.preload)
        op = receive_op if row in RECEIVE_BATCH else {"send1": send_op, "send10": batch_op}[row]

        async def drop() -> None:
            await self.call(self.req("DELETE", f"/v1/queues/{name}", b""), ok=204)
        return [op] * clients, drop

    # Queen's API

    async def queen_ops(self, row: str, clients: int) -> tuple[list[Op], Callable[[], Awaitable[None]]]:
        await self.http.close()  # idle through the other systems' cells: the server may have closed them
        name = f"peers-{uuid.uuid4().hex[:8]}"
        payload = {"order": 12345, "note": BODY}
        pushes = {n: [self.req("POST", "/api/v1/push", {"items": [
            {"queue": name, "partition": f"p{(p + k) % self.partitions}", "payload": payload} for k in range(n)]})
            for p in range(self.partitions)] for n in (1, 10)}
        pop = self.req("GET", f"/api/v1/pop/queue/{name}?batch={RECEIVE_BATCH.get(row, 10)}&wait=false", b"")

        def push(n: int) -> Op:
            async def op() -> tuple[int, int]:
                return (n if await self.call(random.choice(pushes[n]), ok=PUSHED) is not None else -1), 1
            return op

        async def receive_op() -> tuple[int, int]:
            body = await self.call(pop)
            if body is None:
                return 0, 1  # 204: nothing to pop
            got = orjson.loads(body)["messages"]
            if not got:
                return 0, 1
            acks = [{"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"],
                     "status": "completed"} for m in got]
            done = await self.call(self.req("POST", "/api/v1/ack/batch", {"acknowledgments": acks}))
            return (len(got) if done is not None else -1), 2

        if row in RECEIVE_BATCH:
            await fill(push(10), self.preload)
        else:  # the queue and its partitions are made by the first pushes: not part of the cell
            for request in pushes[1]:
                await self.call(request, ok=PUSHED)
        op = receive_op if row in RECEIVE_BATCH else {"send1": push(1), "send10": push(10)}[row]

        async def drop() -> None:
            await self.call(self.req("DELETE", f"/api/v1/resources/queues/{name}", b""))
        return [op] * clients, drop

    async def close(self) -> None:
        await self.http.close()
        if self.backends is not None:
            self.backends.close()


async def fill(op: Op, count: int, concurrency: int = 16) -> None:
    """Run a send op until ``count`` messages went in (at most 120 s)."""
    deadline = time.monotonic() + 120
    sent = 0

    async def loop() -> None:
        nonlocal sent
        while sent < count and time.monotonic() < deadline:
            got, _ = await op()
            if got < 0:
                raise RuntimeError("preload: a send failed")
            sent += got

    await asyncio.gather(*(loop() for _ in range(concurrency)))


# -- RabbitMQ ----------------------------------------------------------------------------------

class Rabbit:
    def __init__(self, quorum: bool) -> None:
        self.quorum = quorum
        self.meter = Meter(lambda: pids_named("beam.smp"))
        self.conns: list[Any] = []
        self.channels: list[Any] = []
        self.preload = 0

    async def connect(self, clients: int) -> None:
        while len(self.conns) < clients:
            conn = await aio_pika.connect(RABBIT_URL)
            self.conns.append(conn)
            self.channels.append(await conn.channel(publisher_confirms=True))

    async def ops(self, row: str, clients: int) -> tuple[list[Op], Callable[[], Awaitable[None]]]:
        await self.connect(clients)
        name = f"peers-{uuid.uuid4().hex[:8]}"
        kind = "quorum" if self.quorum else "classic"
        admin = self.channels[0]
        await admin.declare_queue(name, durable=True, arguments={"x-queue-type": kind})
        body = BODY.encode()

        def publish(channel: Any) -> Awaitable[Any]:
            return channel.default_exchange.publish(
                aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), routing_key=name)

        def send(channel: Any, n: int) -> Op:
            async def op() -> tuple[int, int]:
                try:
                    if n == 1:
                        await publish(channel)
                    else:
                        await asyncio.gather(*(publish(channel) for _ in range(n)))
                except aio_pika.exceptions.AMQPError as exc:
                    print(f"  rabbitmq: {exc!r}", flush=True)
                    return -1, n
                return n, n
            return op

        consumers: list[tuple[Any, str]] = []

        batch = RECEIVE_BATCH.get(row, 10)

        async def receiver(channel: Any) -> Op:
            await channel.set_qos(prefetch_count=batch)
            queue = await channel.get_queue(name, ensure=False)
            inbox: asyncio.Queue[Any] = asyncio.Queue()
            tag = await queue.consume(inbox.put)
            consumers.append((queue, tag))

            async def op() -> tuple[int, int]:
                got = []
                try:
                    got.append(await asyncio.wait_for(inbox.get(), 0.2))
                    while len(got) < batch:
                        got.append(await asyncio.wait_for(inbox.get(), 0.05))
                except TimeoutError:
                    pass
                if not got:
                    return 0, 0
                await got[-1].ack(multiple=True)
                return len(got), 1
            return op

        if row in RECEIVE_BATCH:
            await fill(send(self.channels[0], 10), self.preload)
            ops = [await receiver(ch) for ch in self.channels[:clients]]
        else:
            ops = [send(ch, 1 if row == "send1" else 10) for ch in self.channels[:clients]]

        async def drop() -> None:
            for queue, tag in consumers:
                with contextlib.suppress(Exception):
                    await queue.cancel(tag)
            await admin.queue_delete(name)
        return ops, drop

    async def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(Exception):
                await conn.close()


# -- NATS JetStream ----------------------------------------------------------------------------

class Nats:
    def __init__(self) -> None:
        self.meter = Meter(lambda: pids_named("nats-server"))
        self.conns: list[Any] = []
        self.preload = 0

    async def connect(self, clients: int) -> None:
        while len(self.conns) < clients:
            self.conns.append(await nats.connect(NATS_URL))

    async def ops(self, row: str, clients: int) -> tuple[list[Op], Callable[[], Awaitable[None]]]:
        await self.connect(clients)
        name = f"PEERS_{uuid.uuid4().hex[:8]}"
        subject = f"peers.{name}"
        admin = self.conns[0].jetstream()
        await admin.add_stream(name=name, subjects=[subject], retention=RetentionPolicy.WORK_QUEUE,
                               storage=StorageType.FILE)
        body = BODY.encode()

        def send(js: Any, n: int) -> Op:
            async def op() -> tuple[int, int]:
                try:
                    if n == 1:
                        await js.publish(subject, body)
                    else:
                        await asyncio.gather(*(js.publish(subject, body) for _ in range(n)))
                except nats.errors.Error as exc:
                    print(f"  nats: {exc!r}", flush=True)
                    return -1, n
                return n, n
            return op

        batch = RECEIVE_BATCH.get(row, 10)

        async def receiver(js: Any) -> Op:
            sub = await js.pull_subscribe(subject, durable="workers", stream=name)

            async def op() -> tuple[int, int]:
                try:
                    got = await sub.fetch(batch, timeout=0.2)
                except (nats.errors.TimeoutError, TimeoutError):
                    return 0, 1
                for m in got:
                    await m.ack()
                return len(got), 1 + len(got)
            return op

        streams = [c.jetstream() for c in self.conns[:clients]]
        if row in RECEIVE_BATCH:
            await fill(send(streams[0], 10), self.preload)
            ops = [await receiver(js) for js in streams]
        else:
            ops = [send(js, 1 if row == "send1" else 10) for js in streams]

        async def drop() -> None:
            await admin.delete_stream(name)
        return ops, drop

    async def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(Exception):
                await conn.close()


# -- the servers this run starts -----------------------------------------------------------------

@dataclasses.dataclass
class Started:
    child: Child
    host: str
    dsn: str | None  # its PostgreSQL backends are counted with it


def start_conveyor(args: argparse.Namespace, stack: contextlib.ExitStack) -> Started:
    name = f"{DATABASE}_{os.getpid()}"  # runs started side by side must not drop each other's
    dsn = shared.create_database(name, migrated=True)
    stack.callback(shared.drop_database, name)
    port = free_port()
    env = {**os.environ, "DATABASE_URL": dsn, "CONVEYOR_PORT": str(port), "CONVEYOR_LOG_LEVEL": "warning",
           "CONVEYOR_MAX_REQUESTS": "100000"}
    env.pop("CONVEYOR_WORKERS", None)
    if args.workers:
        env["CONVEYOR_WORKERS"] = str(args.workers)
    server = Child("conveyor", [sys.executable, "-m", "conveyor", "serve"], env, port, quiet=False)
    stack.callback(server.stop)
    server.wait_ready("/livez")
    return Started(server, "127.0.0.1", dsn)


def start_localstack(python: str, stack: contextlib.ExitStack) -> Started:
    """LocalStack in host mode: its runtime run by the python of the venv it is installed in,
    SQS only, in memory, its files in a temporary directory, nothing sent out."""
    root = tempfile.mkdtemp(prefix="peers-localstack-")
    stack.callback(shutil.rmtree, root, ignore_errors=True)
    host = "::1"  # its twisted server listens on every IPv4 address whatever GATEWAY_LISTEN's host
    port = free_port(host)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update({
        "GATEWAY_LISTEN": f"[{host}]:{port}", "SERVICES": "sqs", "EAGER_SERVICE_LOADING": "1",
        "SQS_ENDPOINT_STRATEGY": "path", "SQS_DISABLE_CLOUDWATCH_METRICS": "1", "PERSISTENCE": "0",
        "OVERRIDE_IN_DOCKER": "0", "FILESYSTEM_ROOT": root, "DNS_ADDRESS": "0", "DISABLE_EVENTS": "1",
        "SKIP_SSL_CERT_DOWNLOAD": "1", "LS_LOG": "warn",
    })
    server = Child("localstack", [python, "-m", "localstack.runtime.main"], env, port, quiet=False,
                   host=host, cwd=root)
    stack.callback(server.stop)
    server.wait_ready("/_localstack/health", timeout=180)
    deadline = time.monotonic() + 120
    while True:  # the gateway answers before the SQS provider is up
        with urllib.request.urlopen(server.url + "/_localstack/health", timeout=5) as r:
            state = orjson.loads(r.read()).get("services", {}).get("sqs")
        if state in ("running", "available"):
            return Started(server, host, None)
        if time.monotonic() > deadline or server.proc.poll() is not None:
            raise RuntimeError(f"localstack: SQS is {state!r}")
        time.sleep(0.5)


def start_queen(binary: str, workers: int, stack: contextlib.ExitStack) -> Started:
    """The real Queen server on a database of its own (it creates its schema at start), run
    from its source tree's server/ directory, where it looks for ../lib/schema."""
    name = f"{DATABASE}_{os.getpid()}_queen"
    dsn = shared.create_database(name)
    stack.callback(shared.drop_database, name)
    pg = conninfo.conninfo_to_dict(dsn)
    port = free_port()
    env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(port), "NUM_WORKERS": str(workers),
           "PG_HOST": str(pg.get("host") or "127.0.0.1"), "PG_PORT": str(pg.get("port") or 5432),
           "PG_USER": str(pg.get("user") or "postgres"), "PG_PASSWORD": str(pg.get("password") or "postgres"),
           "PG_DB": name, "LOG_LEVEL": "warn", "QUEEN_SYNC_ENABLED": "false",
           # within PostgreSQL's 100 connections beside Conveyor's pools: 8 per worker for the
           # request path (Conveyor's processes hold up to 16 each), 10 for the rest
           "SIDECAR_POOL_SIZE": str(8 * workers), "DB_POOL_SIZE": "10"}
    path = Path(binary).resolve()
    server = Child("queen", [str(path)], env, port, quiet=False, cwd=str(path.parent.parent))
    stack.callback(server.stop)
    server.wait_ready("/health", timeout=180)
    return Started(server, "127.0.0.1", dsn)


# -- the run -----------------------------------------------------------------------------------

@contextlib.asynccontextmanager
async def systems(args: argparse.Namespace, started: dict[str, Started]) -> AsyncIterator[dict[str, Any]]:
    brokers = {label: HttpBroker(label, s.child, s.host, args.partitions, s.dsn) for label, s in started.items()}
    out: dict[str, Any] = {}
    for name in args.systems:
        if name == "sqs":
            out[name] = (brokers["conveyor"], brokers["conveyor"].sqs_ops)
        elif name == "rest":
            out[name] = (brokers["conveyor"], brokers["conveyor"].rest_ops)
        elif name == "queen":
            out[name] = (brokers["conveyor"], brokers["conveyor"].queen_ops)
        elif name == "localstack":
            out[name] = (brokers["localstack"], brokers["localstack"].sqs_ops)
        elif name == "queen-real":
            out[name] = (brokers["queen-real"], brokers["queen-real"].queen_ops)
        elif name == "rabbit":
            rabbit = Rabbit(quorum=False)
            out[name] = (rabbit, rabbit.ops)
        elif name == "rabbit-quorum":
            quorum = Rabbit(quorum=True)
            out[name] = (quorum, quorum.ops)
        elif name == "nats":
            js = Nats()
            out[name] = (js, js.ops)
    for system, _ in out.values():
        system.preload = args.preload
    try:
        yield out
    finally:
        for system in {id(s): s for s, _ in out.values()}.values():
            await system.close()
        for broker in brokers.values():
            if not any(broker is s for s, _ in out.values()):
                await broker.close()


async def measure(args: argparse.Namespace, started: dict[str, Started]
                  ) -> tuple[dict[tuple[str, int, str], list[Cell]], dict[str, float]]:
    cells: dict[tuple[str, int, str], list[Cell]] = {}
    idle: dict[str, float] = {}  # a server's CPU seconds per second with no calls, by its first column
    async with systems(args, started) as found:
        names = list(found)
        # every row once, not recorded: a server's first calls pay for what it loads lazily
        # (LocalStack's first SendMessage costs it about a second of CPU)
        for name in names:
            system, make = found[name]
            system.preload = WARMUP_PRELOAD
            for row in args.rows:
                ops, drop = await make(row, min(args.clients))
                try:
                    await run_tasks(ops, WARMUP_SECONDS, args.max_messages, system.meter)
                finally:
                    await drop()
            system.preload = args.preload
        print("  (warmed up: every system's rows once)", flush=True)
        # each server's background work, which weighs in its CPU per message the more the
        # slower the messages come (columns of one server: measured once)
        for name in names:
            system = found[name][0]
            if args.idle > 0 and not any(system is found[n][0] for n in idle):
                before = system.meter.sample()
                await asyncio.sleep(args.idle)
                after = system.meter.sample()
                idle[name] = sum(after.get(k, 0.0) - before.get(k, 0.0) for k in ("server", "postgres")) / args.idle
        if idle:
            print("  server CPU with no calls: " + ", ".join(f"{n} {v * 1e3:.1f} ms/s" for n, v in idle.items()),
                  flush=True)
        for clients in args.clients:
            for repeat in range(args.repeat):
                for row in args.rows:
                    order = names[repeat % len(names):] + names[:repeat % len(names)]
                    for name in order:
                        system, make = found[name]
                        ops, drop = await make(row, clients)
                        try:
                            cell = await run_tasks(ops, args.seconds, args.max_messages, system.meter)
                        finally:
                            await drop()
                        cells.setdefault((name, clients, row), []).append(cell)
                        print(f"  x{clients:<3} #{repeat + 1} {ROW_NAMES[row]:<17} {name:<14} {cell.rate:8.0f} msg/s "
                              f"{server_us(cell):7.0f} us server CPU/msg"
                              + (f" (PostgreSQL {cell.cpu['postgres'] / cell.messages * 1e6:.0f})"
                                 if "postgres" in cell.cpu and cell.messages > 0 else "")
                              + f"{' drained' if cell.drained else ''}{f' ERRORS {cell.errors}' if cell.errors else ''}",
                              flush=True)
    return cells, idle


def paired_ratio(cells: dict[tuple[str, int, str], list[Cell]], a: str, b: str, clients: int, row: str) -> str:
    """The median over the repeats of a's server CPU per message over b's, each repeat's pair
    measured in the same round."""
    ratios = [server_us(x) / server_us(y) for x, y in zip(cells.get((a, clients, row), []),
                                                         cells.get((b, clients, row), []), strict=False)]
    ratios = [r for r in ratios if not math.isnan(r)]
    return f"{statistics.median(ratios):.2f}x" if ratios else ""


def report(args: argparse.Namespace, cells: dict[tuple[str, int, str], list[Cell]], idle: dict[str, float]) -> None:
    names = [n for n in args.systems if any(k[0] == n for k in cells)]
    print(f"\nmedians of {args.repeat} runs of {args.seconds:g}s; msg/s, server CPU us per message "
          f"(Conveyor and Queen: server + its PostgreSQL backends)\n")
    print("| work | clients | " + " | ".join(names) + " |")
    print("|---|---:|" + "---|" * len(names))
    for row in args.rows:
        for clients in args.clients:
            out = []
            for name in names:
                runs = cells.get((name, clients, row), [])
                if not runs:
                    out.append("")
                    continue
                rate = statistics.median(c.rate for c in runs)
                us = statistics.median(server_us(c) for c in runs)
                out.append(f"{rate:,.0f} / {us:,.0f}")
            print(f"| {ROW_NAMES[row]} | {clients} | " + " | ".join(out) + " |")
    if idle:
        print("\nserver CPU with no calls (background work; columns of one server: under the first), "
              "ms per second: " + ", ".join(f"{n} {v * 1e3:.1f}" for n, v in idle.items()))
    with_pg = [n for n in names if any("postgres" in c.cpu for c in cells.get((n, args.clients[0], args.rows[0]), []))]
    if with_pg:
        print("\nof which the server's process / its PostgreSQL backends, us per message (medians):\n")
        print("| work | clients | " + " | ".join(with_pg) + " |")
        print("|---|---:|" + "---|" * len(with_pg))
        for row in args.rows:
            for clients in args.clients:
                out = []
                for name in with_pg:
                    runs = [c for c in cells.get((name, clients, row), []) if c.messages > 0]
                    out.append(f"{statistics.median(c.cpu['server'] / c.messages * 1e6 for c in runs):,.0f} / "
                               f"{statistics.median(c.cpu['postgres'] / c.messages * 1e6 for c in runs):,.0f}"
                               if runs else "")
                print(f"| {ROW_NAMES[row]} | {clients} | " + " | ".join(out) + " |")
    pairs = []
    if "rabbit" in names:
        pairs += [(n, "rabbit") for n in names if n != "rabbit"]
    if "localstack" in names and "sqs" in names:
        pairs.append(("localstack", "sqs"))
    if "queen-real" in names and "queen" in names:
        pairs.append(("queen", "queen-real"))
    if pairs:
        print("\nserver CPU per message, a over b (median of the paired runs' ratios): against RabbitMQ's "
              "durable classic queue; LocalStack over Conveyor's SQS (target: at least 5x); Conveyor's Queen "
              "API over the real Queen (target: at most 1x)\n")
        print("| work | clients | " + " | ".join(f"{a} / {b}" for a, b in pairs) + " |")
        print("|---|---:|" + "---:|" * len(pairs))
        for row in args.rows:
            for clients in args.clients:
                print(f"| {ROW_NAMES[row]} | {clients} | "
                      + " | ".join(paired_ratio(cells, a, b, clients, row) for a, b in pairs) + " |")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, nargs="+", default=[8, 32])
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--max-messages", type=int, default=200_000)
    p.add_argument("--preload", type=int, default=100_000, help="messages waiting before each receive cell")
    p.add_argument("--partitions", type=int, default=64, help="Queen API: partitions of a queue")
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    p.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    p.add_argument("--idle", type=float, default=5.0,
                   help="seconds of no calls over which each server's background CPU is read (0: not read)")
    p.add_argument("--workers", type=int, default=None,
                   help="Conveyor's server processes, and the real Queen's worker threads (default: serve's)")
    p.add_argument("--localstack-python", default=os.environ.get("CONVEYOR_BENCH_LOCALSTACK_PYTHON"),
                   help="python of a venv with localstack-core (default: $CONVEYOR_BENCH_LOCALSTACK_PYTHON)")
    p.add_argument("--queen-server", default=os.environ.get("CONVEYOR_BENCH_QUEEN_SERVER"),
                   help="Queen's server/bin/queen-server (default: $CONVEYOR_BENCH_QUEEN_SERVER)")
    args = p.parse_args()
    if args.seconds <= 0 or args.seconds > 60 or args.repeat < 1 or args.repeat > 9:
        p.error("--seconds is in (0, 60] and --repeat in 1..9")
    for name, path, flag in (("localstack", args.localstack_python, "--localstack-python"),
                             ("queen-real", args.queen_server, "--queen-server")):
        if name in args.systems and not (path and os.access(path, os.X_OK)):
            print(f"{name}: left out ({flag} not given or not executable: {path!r}; docs/benchmarks.md says "
                  "how to install it)", flush=True)
            args.systems.remove(name)
    return args


def main() -> None:
    args = parse_args()
    command = "bench/peers_bench.py " + " ".join(sys.argv[1:])
    with contextlib.ExitStack() as stack:
        started: dict[str, Started] = {}
        if any(s in CONVEYOR_SYSTEMS for s in args.systems):
            started["conveyor"] = start_conveyor(args, stack)
        if "localstack" in args.systems:
            started["localstack"] = start_localstack(args.localstack_python, stack)
        if "queen-real" in args.systems:
            started["queen-real"] = start_queen(args.queen_server, args.workers or default_workers(), stack)
        print(f"{command}\n", flush=True)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            cells, idle = runner.run(measure(args, started))
        report(args, cells, idle)


if __name__ == "__main__":
    main()
