"""Conveyor beside its peers, RabbitMQ and NATS JetStream, alternating in one run.

    ./bin/bench peers_bench.py [--clients 8 32] [--seconds 3] [--repeat 3] [--preload 30000]
                               [--systems sqs rest queen rabbit rabbit-quorum nats] [--workers N]

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
Each client has its own connection (HTTP keep-alive, AMQP connection + channel, NATS connection).

Rows (messages/s; a batch counts its messages):
  send 1        one message per call (SendMessage; POST /messages; push of 1; publish + confirm;
                JetStream publish + ack)
  send 10       ten per call (SendMessageBatch; a REST array; push of 10; ten publishes, then their
                confirms; ten JetStream publishes, then their acks)
  receive+ack   ten at a time, then acknowledged at once (ReceiveMessage(10) +
                DeleteMessageBatch; GET ?max=10 + DELETE receipts; pop batch=10 + ack/batch;
                prefetch 10, ack multiple=true on the tenth; fetch(10) + ack of each), from a
                queue preloaded with --preload messages

Server CPU per message: from /proc, the broker's processes over the cell, divided by the
messages: for Conveyor its server process and its workers plus the PostgreSQL backends
connected to the bench database (pg_stat_activity; PostgreSQL's background writer,
checkpointer and WAL writer are not counted, nor are RabbitMQ's or NATS's disks); for
RabbitMQ the beam.smp process; for NATS the nats-server process. Less sensitive to the
machine's drift and to the load generator's share of the cores than messages/s.

Every cell runs at most --seconds and --max-messages (calls in flight then are waited for,
at most 20 s); each row of each repeat starts on a new, empty queue (receive: preloaded)
deleted after. Within a repeat, the systems take turns row by row, in an order that rotates
from repeat to repeat, so a drift of the machine's speed weighs on all. The median of
--repeat runs is reported for each figure. Creates and drops database conveyor_peers_bench
on CONVEYOR_BENCH_DATABASE_URL; starts and stops one `conveyor serve`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random
import statistics
import sys
import time
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

sys.path.insert(0, str(Path(__file__).parent))
import sqs_bench as shared
from rawhttp import HttpError, RawHttp
from sqs_bench import Cell, Child, free_port, run_tasks

DATABASE = "conveyor_peers_bench"
SYSTEMS = ("sqs", "rest", "queen", "rabbit", "rabbit-quorum", "nats")
ROWS = ("send1", "send10", "receive")
ROW_NAMES = {"send1": "send 1", "send10": "send 10", "receive": "receive 10 + ack"}
BODY = "x" * 100
AUTH = "AWS4-HMAC-SHA256 Credential=bench/20250101/us-east-1/sqs/aws4_request, SignedHeaders=host, Signature=0"
RABBIT_URL = os.environ.get("CONVEYOR_BENCH_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
NATS_URL = os.environ.get("CONVEYOR_BENCH_NATS_URL", "nats://127.0.0.1:4222")
Op = Callable[[], Awaitable[tuple[int, int]]]  # -> (messages, requests); messages 0: empty, < 0: failed


# -- CPU from /proc ----------------------------------------------------------------------------

def _cpu(pid: int) -> float:
    fields = shared._stat_fields(pid)
    return sum(int(x) for x in fields[11:15]) / shared._TICK if fields else 0.0


def pids_named(comm: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{name}/comm") as f:
                if f.read().strip() == comm:
                    found.append(int(name))
    return found


class Meter:
    """CPU seconds of a broker's processes; ``sample()`` as sqs_bench.CpuMeter's."""

    def __init__(self, pids: Callable[[], list[int]], tree: int | None = None,
                 backends: Callable[[], list[int]] | None = None) -> None:
        self.pids, self.tree, self.backends = pids, tree, backends
        self.known: set[int] = set()

    def sample(self) -> dict[str, float]:
        t = os.times()
        out = {"client": t.user + t.system, "server": sum(_cpu(p) for p in self.pids())}
        if self.tree is not None:
            out["server"] += shared._process_cpu(self.tree)
        if self.backends is not None:
            # backends alive at either end of the cell (the pools keep theirs open)
            self.known |= set(self.backends())
            out["postgres"] = sum(_cpu(p) for p in self.known)
        return out


def server_us(cell: Cell) -> float:
    used = cell.cpu.get("server", 0.0) + cell.cpu.get("postgres", 0.0)
    return used / cell.messages * 1e6 if cell.messages > 0 else math.nan


# -- Conveyor through raw HTTP -----------------------------------------------------------------

class Conveyor:
    """The three Conveyor columns against one server."""

    def __init__(self, server: Child, dsn: str, partitions: int) -> None:
        self.server, self.dsn, self.partitions = server, dsn, partitions
        self.http = RawHttp("127.0.0.1", server.port)
        self.monitor = psycopg.connect(dsn, autocommit=True)
        self.meter = Meter(lambda: [], tree=server.proc.pid, backends=self._backends)

    def _backends(self) -> list[int]:
        rows = self.monitor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                                    "AND pid <> pg_backend_pid()").fetchall()
        return [r[0] for r in rows]

    async def call(self, request: bytes, ok: int = 200) -> bytes | None:
        try:
            status, body = await self.http.send(request)
        except HttpError as exc:
            print(f"  conveyor: {exc}", flush=True)
            return None
        if status != ok:
            if status != 204:
                print(f"  conveyor: HTTP {status} {body[:300]!r}", flush=True)
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
        url = orjson.loads(await self.call(self.sqs("CreateQueue", {"QueueName": name})) or b"{}")["QueueUrl"]
        send = self.sqs("SendMessage", {"QueueUrl": url, "MessageBody": BODY})
        batch = self.sqs("SendMessageBatch", {"QueueUrl": url, "Entries": [{"Id": str(i), "MessageBody": BODY}
                                                                           for i in range(10)]})
        receive = self.sqs("ReceiveMessage", {"QueueUrl": url, "MaxNumberOfMessages": 10, "WaitTimeSeconds": 0})

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
            done = await self.call(self.sqs("DeleteMessageBatch", {"QueueUrl": url, "Entries": [
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)]}))
            return (len(orjson.loads(done).get("Successful", ())) if done else -1), 2

        if row == "receive":
            await fill(batch_op, self.preload)
        op = {"send1": send_op, "send10": batch_op, "receive": receive_op}[row]

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
        receive = self.req("GET", path + "?max=10", b"")

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

        if row == "receive":
            await fill(batch_op, self.preload)
        op = {"send1": send_op, "send10": batch_op, "receive": receive_op}[row]

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
        pop = self.req("GET", f"/api/v1/pop/queue/{name}?batch=10&wait=false", b"")

        def push(n: int) -> Op:
            async def op() -> tuple[int, int]:
                return (n if await self.call(random.choice(pushes[n]), ok=201) is not None else -1), 1
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

        if row == "receive":
            await fill(push(10), self.preload)
        else:  # the queue and its partitions are made by the first pushes: not part of the cell
            for request in pushes[1]:
                await self.call(request, ok=201)
        op = {"send1": push(1), "send10": push(10), "receive": receive_op}[row]

        async def drop() -> None:
            await self.call(self.req("DELETE", f"/api/v1/resources/queues/{name}", b""))
        return [op] * clients, drop

    preload = 0

    async def close(self) -> None:
        await self.http.close()
        self.monitor.close()


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

        async def receiver(channel: Any) -> Op:
            await channel.set_qos(prefetch_count=10)
            queue = await channel.get_queue(name, ensure=False)
            inbox: asyncio.Queue[Any] = asyncio.Queue()
            tag = await queue.consume(inbox.put)
            consumers.append((queue, tag))

            async def op() -> tuple[int, int]:
                got = []
                try:
                    got.append(await asyncio.wait_for(inbox.get(), 0.2))
                    while len(got) < 10:
                        got.append(await asyncio.wait_for(inbox.get(), 0.05))
                except TimeoutError:
                    pass
                if not got:
                    return 0, 0
                await got[-1].ack(multiple=True)
                return len(got), 1
            return op

        if row == "receive":
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

        async def receiver(js: Any) -> Op:
            sub = await js.pull_subscribe(subject, durable="workers", stream=name)

            async def op() -> tuple[int, int]:
                try:
                    got = await sub.fetch(10, timeout=0.2)
                except (nats.errors.TimeoutError, TimeoutError):
                    return 0, 1
                for m in got:
                    await m.ack()
                return len(got), 1 + len(got)
            return op

        streams = [c.jetstream() for c in self.conns[:clients]]
        if row == "receive":
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


# -- the run -----------------------------------------------------------------------------------

@contextlib.asynccontextmanager
async def systems(args: argparse.Namespace, server: Child | None, dsn: str) -> AsyncIterator[dict[str, Any]]:
    conveyor = Conveyor(server, dsn, args.partitions) if server else None
    out: dict[str, Any] = {}
    for name in args.systems:
        if name == "sqs":
            out[name] = (conveyor, conveyor.sqs_ops)
        elif name == "rest":
            out[name] = (conveyor, conveyor.rest_ops)
        elif name == "queen":
            out[name] = (conveyor, conveyor.queen_ops)
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


async def measure(args: argparse.Namespace, server: Child | None, dsn: str) -> dict[tuple[str, int, str], list[Cell]]:
    cells: dict[tuple[str, int, str], list[Cell]] = {}
    async with systems(args, server, dsn) as found:
        names = list(found)
        for clients in args.clients:
            for repeat in range(args.repeat):
                for row in ROWS:
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
    return cells


def report(args: argparse.Namespace, cells: dict[tuple[str, int, str], list[Cell]]) -> None:
    names = [n for n in args.systems if any(k[0] == n for k in cells)]
    print(f"\nmedians of {args.repeat} runs of {args.seconds:g}s; msg/s, server CPU us per message "
          f"(Conveyor: server + its PostgreSQL backends)\n")
    print("| work | clients | " + " | ".join(names) + " |")
    print("|---|---:|" + "---|" * len(names))
    for row in ROWS:
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
    if "rabbit" in names:
        print("\nserver CPU per message against RabbitMQ's durable classic queue (median of the paired runs' ratios):\n")
        print("| work | clients | " + " | ".join(n for n in names if n != "rabbit") + " |")
        print("|---|---:|" + "---|" * (len(names) - 1))
        for row in ROWS:
            for clients in args.clients:
                base = cells.get(("rabbit", clients, row), [])
                out = []
                for name in names:
                    if name == "rabbit":
                        continue
                    runs = cells.get((name, clients, row), [])
                    ratios = [server_us(a) / server_us(b) for a, b in zip(runs, base, strict=False)]
                    out.append(f"{statistics.median(ratios):.2f}x" if ratios else "")
                print(f"| {ROW_NAMES[row]} | {clients} | " + " | ".join(out) + " |")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, nargs="+", default=[8, 32])
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--max-messages", type=int, default=200_000)
    p.add_argument("--preload", type=int, default=40_000, help="messages waiting before each receive cell")
    p.add_argument("--partitions", type=int, default=64, help="Queen API: partitions of a queue")
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    p.add_argument("--workers", type=int, default=None, help="Conveyor's server processes (default: serve's)")
    args = p.parse_args()
    if args.seconds <= 0 or args.seconds > 60 or args.repeat < 1 or args.repeat > 9:
        p.error("--seconds is in (0, 60] and --repeat in 1..9")
    return args


def main() -> None:
    args = parse_args()
    command = "bench/peers_bench.py " + " ".join(sys.argv[1:])
    needs_conveyor = any(s in ("sqs", "rest", "queen") for s in args.systems)
    server = None
    dsn = shared.create_database(DATABASE, migrated=True) if needs_conveyor else ""
    try:
        if needs_conveyor:
            port = free_port()
            env = {**os.environ, "DATABASE_URL": dsn, "CONVEYOR_PORT": str(port), "CONVEYOR_LOG_LEVEL": "warning",
                   "CONVEYOR_MAX_REQUESTS": "100000"}
            env.pop("CONVEYOR_WORKERS", None)
            if args.workers:
                env["CONVEYOR_WORKERS"] = str(args.workers)
            server = Child("conveyor", [sys.executable, "-m", "conveyor", "serve"], env, port, quiet=False)
            server.wait_ready("/livez")
        print(f"{command}\n", flush=True)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            cells = runner.run(measure(args, server, dsn))
        report(args, cells)
    finally:
        if server is not None:
            server.stop()
        if needs_conveyor:
            shared.drop_database(DATABASE)


if __name__ == "__main__":
    main()
