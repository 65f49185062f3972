"""Partitioned queues through Queen's HTTP API, side by side in one run.

    ./bin/bench queen_bench.py [--clients 32] [--seconds 5] [--repeat 3] [--workers 1]
                               [--partitions 64] [--skip-wildcard]

Figures, medians over --repeat runs of at most --seconds each (and at most --max-calls
calls), on one database created for the run:

  push            POST /api/v1/push from --clients concurrent raw HTTP clients, 1 and 100
                  messages per request, into --partitions partitions of one queue
  pop+ack         GET /api/v1/pop/queue/q?batch=B then POST /api/v1/ack/batch of what came,
                  B = 1 and 100, --clients consumers over a preloaded queue
  sqs             the same clients through Conveyor's SQS path: SendMessage, and
                  ReceiveMessage (10) + DeleteMessageBatch (SQS's largest batch)
  pgbench         PostgreSQL's own limit on this machine for the same writes: one INSERT
                  per transaction, and 100 rows per transaction, into a plain table with a
                  primary key (pgbench, prepared statements, --clients connections)
  concurrency     push (1) and pop+ack (1) again with CONVEYOR_FUSION_CONCURRENCY=vegas
                  against the static default
  wildcard        latency of a wildcard pop (one client: push one message to a random
                  partition, pop it, ack it) on a queue of 10 partitions and one of 100,000
                  partitions whose other partitions are all caught up

Per core: the server, PostgreSQL and the clients share the machine's cores; messages/s
are divided by os.cpu_count() for the comparison with Queen's published ~104k msg/s on
32 vCPU (~3.2k per vCPU). Since the load generator takes a share of the same cores, the
"per broker CPU-s" figures divide the messages by the CPU time the server process and
PostgreSQL used meanwhile (/proc): messages per core of broker, clients elsewhere. Creates and drops database conveyor_queen_bench on
CONVEYOR_BENCH_DATABASE_URL.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import orjson
import psycopg
from psycopg import conninfo

sys.path.insert(0, str(Path(__file__).parent))
import sqs_bench as shared_db
from rawhttp import RawHttp
from sqs_bench import Child, free_port

ADMIN_DSN = os.environ.get("CONVEYOR_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
DATABASE = "conveyor_queen_bench"
CORES = os.cpu_count() or 1
AUTH = {"Authorization": "Bearer bench", "Content-Type": "application/json"}
BODY = {"order": 12345, "customer": "c-42", "items": [1, 2, 3], "note": "x" * 40}


def create_database() -> str:
    return shared_db.create_database(DATABASE, migrated=True)


def drop_database() -> None:
    shared_db.drop_database(DATABASE)


def start_server(dsn: str, workers: int, concurrency: str = "static") -> Child:
    port = free_port()
    env = {**os.environ, "DATABASE_URL": dsn, "CONVEYOR_PORT": str(port), "CONVEYOR_AUTH": "header",
           "CONVEYOR_LOG_LEVEL": "warning", "CONVEYOR_POOL_MAX": "16", "CONVEYOR_WORKERS": str(workers),
           "CONVEYOR_FUSION_CONCURRENCY": concurrency, "CONVEYOR_MAX_REQUESTS": "100000"}
    child = Child("conveyor", [sys.executable, "-m", "conveyor", "serve"], env, port, quiet=False)
    child.wait_ready("/livez")
    return child


# -- load loops --------------------------------------------------------------------------

async def _loop(clients: int, seconds: float, max_calls: int, one) -> tuple[int, float]:
    """Run ``one(client_index)`` (returns messages done) from ``clients`` tasks for at
    most ``seconds`` and ``max_calls`` calls; messages done and the elapsed time."""
    deadline = time.monotonic() + seconds
    done = 0
    calls = 0

    async def worker(i: int) -> None:
        nonlocal done, calls
        while time.monotonic() < deadline and calls < max_calls:
            calls += 1
            got = await one(i)  # not `done += await ...`: that reads `done` before the await and loses updates
            done += got

    started = time.monotonic()
    await asyncio.gather(*(worker(i) for i in range(clients)))
    return done, time.monotonic() - started


async def push_rate(port: int, queue: str, batch: int, partitions: int, clients: int, seconds: float,
                    max_calls: int) -> float:
    http = RawHttp("127.0.0.1", port)
    bodies = [orjson.dumps({"items": [{"queue": queue, "partition": f"p{(i + k) % partitions}", "payload": BODY}
                                      for k in range(batch)]}) for i in range(partitions)]
    requests = [http.request("POST", "/api/v1/push", b, AUTH) for b in bodies]

    async def one(i: int) -> int:
        status, body = await http.send(random.choice(requests))
        if status != 201:
            raise RuntimeError(f"push: {status} {body[:200]!r}")
        return batch

    done, took = await _loop(clients, seconds, max_calls, one)
    await http.close()
    return done / took


async def preload(port: int, queue: str, partitions: int, total: int) -> None:
    http = RawHttp("127.0.0.1", port)
    sent = 0
    while sent < total:
        n = min(1000, total - sent)
        body = orjson.dumps({"items": [{"queue": queue, "partition": f"p{(sent + k) % partitions}", "payload": BODY}
                                       for k in range(n)]})
        status, answer = await http.send(http.request("POST", "/api/v1/push", body, AUTH))
        if status != 201:
            raise RuntimeError(f"preload: {status} {answer[:200]!r}")
        sent += n
    await http.close()


async def pop_ack_rate(port: int, queue: str, batch: int, clients: int, seconds: float, max_calls: int) -> float:
    http = RawHttp("127.0.0.1", port)
    pop = http.request("GET", f"/api/v1/pop/queue/{queue}?batch={batch}&wait=false", b"", AUTH)

    async def one(i: int) -> int:
        status, body = await http.send(pop)
        if status == 204:
            await asyncio.sleep(0.005)
            return 0
        if status != 200:
            raise RuntimeError(f"pop: {status} {body[:200]!r}")
        messages = orjson.loads(body)["messages"]
        acks = [{"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"],
                 "status": "completed"} for m in messages]
        status, body = await http.send(http.request("POST", "/api/v1/ack/batch",
                                                    orjson.dumps({"acknowledgments": acks}), AUTH))
        if status != 200:
            raise RuntimeError(f"ack: {status} {body[:200]!r}")
        return len(messages)

    done, took = await _loop(clients, seconds, max_calls, one)
    await http.close()
    return done / took


SQS_JSON = {"Content-Type": "application/x-amz-json-1.0", "Authorization": "bench"}


async def sqs_rates(port: int, clients: int, seconds: float, max_calls: int) -> tuple[float, float]:
    http = RawHttp("127.0.0.1", port)
    name = f"sqs-{uuid.uuid4().hex[:6]}"
    create = http.request("POST", "/", orjson.dumps({"QueueName": name}),
                          {**SQS_JSON, "X-Amz-Target": "AmazonSQS.CreateQueue"})
    _, body = await http.send(create)
    url = orjson.loads(body)["QueueUrl"]
    send = http.request("POST", "/", orjson.dumps({"QueueUrl": url, "MessageBody": orjson.dumps(BODY).decode()}),
                        {**SQS_JSON, "X-Amz-Target": "AmazonSQS.SendMessage"})

    async def one_send(i: int) -> int:
        status, body = await http.send(send)
        if status != 200:
            raise RuntimeError(f"SendMessage: {status} {body[:200]!r}")
        return 1

    sent, took = await _loop(clients, seconds, max_calls, one_send)
    receive = http.request("POST", "/", orjson.dumps({"QueueUrl": url, "MaxNumberOfMessages": 10}),
                           {**SQS_JSON, "X-Amz-Target": "AmazonSQS.ReceiveMessage"})

    async def one_receive(i: int) -> int:
        _, body = await http.send(receive)
        got = orjson.loads(body).get("Messages", [])
        if not got:
            await asyncio.sleep(0.005)
            return 0
        entries = [{"Id": str(k), "ReceiptHandle": m["ReceiptHandle"]} for k, m in enumerate(got)]
        await http.send(http.request("POST", "/", orjson.dumps({"QueueUrl": url, "Entries": entries}),
                                     {**SQS_JSON, "X-Amz-Target": "AmazonSQS.DeleteMessageBatch"}))
        return len(got)

    received, took2 = await _loop(clients, seconds, max_calls, one_receive)
    await http.close()
    return sent / took, received / took2


def pgbench_rates(dsn: str, clients: int, seconds: float) -> tuple[float, float] | None:
    pgbench = shutil.which("pgbench") or next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/pgbench"))), None)
    if pgbench is None:
        return None
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_raw; CREATE TABLE bench_raw (id bigserial PRIMARY KEY, "
                     "partition text NOT NULL, payload jsonb NOT NULL, created_at timestamptz DEFAULT now())")
    payload = orjson.dumps(BODY).decode().replace("'", "''")
    rates = []
    for rows in (1, 100):
        values = ", ".join([f"('p' || :p, '{payload}')"] * rows)
        script = f"\\set p random(0, 63)\nINSERT INTO bench_raw (partition, payload) VALUES {values};\n"
        with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
            f.write(script)
        params = conninfo.conninfo_to_dict(dsn)
        out = subprocess.run([str(pgbench), "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(clients, CORES)),
                              "-T", str(max(1, int(seconds))), "-f", f.name, "-h", str(params.get("host", "127.0.0.1")),
                              "-p", str(params.get("port", 5432)), "-U", str(params.get("user", "postgres")),
                              str(params["dbname"])], capture_output=True, text=True, check=False)
        os.unlink(f.name)
        tps = next((float(line.split("=")[1].split()[0]) for line in out.stdout.splitlines()
                    if line.startswith("tps =")), None)
        if tps is None:
            raise RuntimeError(f"pgbench failed:\n{out.stdout}\n{out.stderr}")
        rates.append(tps * rows)
    return rates[0], rates[1]


async def wildcard_latency(port: int, dsn: str, partitions: int, samples: int) -> tuple[float, float]:
    """p50/p99 ms of push-one, pop (wildcard), ack-one on a queue of ``partitions``
    partitions that are all caught up."""
    queue = f"wild-{partitions}-{uuid.uuid4().hex[:6]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        for start in range(0, partitions, 10000):
            items = [{"queue": queue, "partition": f"p{k}", "payload": 1} for k in range(start, min(partitions, start + 10000))]
            conn.execute("SELECT conveyor.pqueue_push(%s::jsonb)", (orjson.dumps(items).decode(),))
        # the queue-mode group consumes everything once (one big pop per round), so all are caught up
        while True:
            got = conn.execute("SELECT conveyor.pqueue_pop(%s::jsonb)",
                               (orjson.dumps({"queue": queue, "batch": 10000, "maxPartitions": 1000,
                                              "autoAck": True}).decode(),)).fetchone()[0]
            if not got["messages"]:
                break
        # what autovacuum does within a minute of such a bulk load in production
        conn.execute("ANALYZE conveyor.partitions, conveyor.partition_cursors, conveyor.consumer_groups")
    http = RawHttp("127.0.0.1", port)
    pop = http.request("GET", f"/api/v1/pop/queue/{queue}?batch=1&wait=false", b"", AUTH)
    took = []
    for _ in range(samples):
        body = orjson.dumps({"items": [{"queue": queue, "partition": f"p{random.randrange(partitions)}", "payload": 2}]})
        await http.send(http.request("POST", "/api/v1/push", body, AUTH))
        started = time.perf_counter()
        status, answer = await http.send(pop)
        took.append(time.perf_counter() - started)
        if status != 200:
            raise RuntimeError(f"wildcard pop found nothing: {status} {answer[:200]!r}")
        m = orjson.loads(answer)["messages"][0]
        ack = {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"]}
        await http.send(http.request("POST", "/api/v1/ack", orjson.dumps(ack), AUTH))
    await http.close()
    took.sort()
    return took[len(took) // 2] * 1000, took[min(len(took) - 1, int(len(took) * 0.99))] * 1000


# -- the run -------------------------------------------------------------------------------

def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes so far (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _broker_pids(server: Child) -> list[int]:
    """The server and every PostgreSQL process: what a message costs on the broker's side."""
    found = subprocess.run(["pgrep", "-x", "postgres"], capture_output=True, text=True).stdout.split()
    return [server.proc.pid, *map(int, found)]


async def measure(server: Child, dsn: str, args: argparse.Namespace, label: str, full: bool) -> dict[str, float]:
    port = server.port
    figures: dict[str, list[float]] = {}
    for _ in range(args.repeat):
        batches = (1, 100) if full else (1,)
        for batch in batches:
            q = f"push-{uuid.uuid4().hex[:6]}"
            pids = _broker_pids(server)
            cpu, started = _cpu_seconds(pids), time.monotonic()
            rate = await push_rate(port, q, batch, args.partitions, args.clients, args.seconds, args.max_calls)
            used = _cpu_seconds(pids) - cpu
            figures.setdefault(f"{label} push {batch}", []).append(rate)
            if used > 0:  # messages per CPU-second of server + PostgreSQL: per core, with the clients elsewhere
                figures.setdefault(f"{label} push {batch} per broker CPU-s", []).append(
                    rate * (time.monotonic() - started) / used)
        for batch in batches:
            q = f"pop-{uuid.uuid4().hex[:6]}"
            await preload(port, q, args.partitions, min(args.preload, int(args.preload * batch / 100) + 20000))
            pids = _broker_pids(server)
            cpu, started = _cpu_seconds(pids), time.monotonic()
            rate = await pop_ack_rate(port, q, batch, args.clients, args.seconds, args.max_calls)
            used = _cpu_seconds(pids) - cpu
            figures.setdefault(f"{label} pop+ack {batch}", []).append(rate)
            if used > 0:
                figures.setdefault(f"{label} pop+ack {batch} per broker CPU-s", []).append(
                    rate * (time.monotonic() - started) / used)
        if full:
            send, receive = await sqs_rates(port, args.clients, args.seconds, args.max_calls)
            figures.setdefault("sqs SendMessage", []).append(send)
            figures.setdefault("sqs Receive(10)+DeleteBatch", []).append(receive)
    return {k: median(v) for k, v in figures.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-calls", type=int, default=200000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--preload", type=int, default=100000)
    parser.add_argument("--wildcard-samples", type=int, default=300)
    parser.add_argument("--skip-wildcard", action="store_true")
    args = parser.parse_args()

    dsn = create_database()
    results: dict[str, float] = {}
    try:
        raw = pgbench_rates(dsn, args.clients, args.seconds)
        if raw is not None:
            results["pgbench INSERT 1/txn"], results["pgbench INSERT 100/txn"] = raw
        for concurrency in ("static", "vegas"):
            server = start_server(dsn, args.workers, concurrency)
            try:
                results.update(asyncio.run(measure(server, dsn, args, concurrency, full=concurrency == "static")))
                if concurrency == "static" and not args.skip_wildcard:
                    for n in (10, 100_000):
                        p50, p99 = asyncio.run(wildcard_latency(server.port, dsn, n, args.wildcard_samples))
                        results[f"wildcard pop p50 ms, {n} partitions"] = p50
                        results[f"wildcard pop p99 ms, {n} partitions"] = p99
            finally:
                server.stop()
    finally:
        drop_database()

    print(f"\n{args.clients} clients, {args.seconds:g}s x {args.repeat} (medians), {CORES} cores, "
          f"{args.workers} server process(es)\n")
    print(f"{'figure':<44} {'value':>12} {'per core':>10}")
    for name, value in results.items():
        per_core = "" if "ms" in name or "CPU-s" in name else f"{value / CORES:>10,.0f}"
        unit = "" if "ms" in name else " msg/s"
        print(f"{name:<44} {value:>12,.1f}{unit} {per_core}")
    print("\nQueen's published figure: ~3,250 msg/s per vCPU (104k on 32); goal: 2x = 6,500 per core")


if __name__ == "__main__":
    main()
