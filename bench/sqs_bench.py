"""SQS throughput: Conveyor against moto_server through boto3, and Conveyor through a raw
HTTP client against the raw PostgreSQL limit, side by side in one run.

    .venv/bin/python bench/sqs_bench.py [--seconds 3] [--repeat 3] [--clients 1 32] [--raw-clients 1 64]
                                        [--workers CORES]

Part 1, boto3 (threads, each with its own boto3 client), --clients concurrency:
  Conveyor (`conveyor serve --workers W`, SQS JSON protocol on POST /) against `moto_server`
  (moto[server], in-memory), both started here as child processes. The target is
  Conveyor >= 20x moto on every row. boto3 costs 1-2 ms of client CPU per call and the
  client shares the 2 cores with the servers, so this part also measures boto3.
Part 2, raw HTTP (bench/rawhttp.py on uvloop: keep-alive, requests built once as bytes, no botocore),
  --raw-clients coroutines: Conveyor (and, with --raw-moto, moto) against "raw PostgreSQL"
  in the same run: psycopg on a plain table at the same concurrency,
      SendMessage                 INSERT of one row per statement
      SendMessageBatch            one multi-row INSERT of 10
      Receive + DeleteMessageBatch  UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP
                                  LOCKED LIMIT 10) RETURNING, then DELETE ... = ANY(ids)
  The goal is Conveyor >= 0.5 of the raw limit.

Rows (messages/s; a batch call counts its messages):
  SendMessage (one message per call), SendMessageBatch (10 per call), ReceiveMessage
  (MaxNumberOfMessages=10, WaitTimeSeconds=0) + DeleteMessageBatch of what it got
  (counts the messages deleted).

Every row of every repeat starts on a fresh, empty queue (raw table: truncated). The
receive row's queue is filled first, through the raw client's SendMessageBatch (raw
table: one INSERT ... SELECT), with 1.3x what that row is expected to take in --seconds
(capped at --max-messages): enough not to run dry, and no deeper, since moto's cost per
call grows with the queue's depth. A row that still ran dry is flagged "drained" (its rate
is the messages over the time until it ran dry). Each cell runs at most --seconds and
--max-messages: no call starts after --seconds; the calls then in flight are waited for
(at most 20 s: moto with 64 clients needs several seconds to answer them all) and counted,
and the rate is the messages over the whole time. Each server and client is warmed up
first; the median of --repeat runs is reported. The systems compared take turns within each
repeat (Conveyor, moto, Conveyor, moto, ...), so a drift of the machine's speed weighs on both.
CPU per request of the load generator, the server and PostgreSQL (from /proc; PostgreSQL
is every process named postgres, so other users of that server count too) is printed with
each cell, to show where the time goes.

Creates (and at the end drops) database `conveyor_sqs_bench` on CONVEYOR_BENCH_DATABASE_URL
(default postgresql://postgres@127.0.0.1:5432/postgres); stops every child process it
started, also on Ctrl-C or an error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import boto3
import orjson
import psycopg
import uvloop
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from psycopg import conninfo

from conveyor.db import migrate
from rawhttp import HttpError, RawHttp

ADMIN_DSN = os.environ.get("CONVEYOR_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
DATABASE = "conveyor_sqs_bench"
REGION = "us-east-1"
BODY = "x" * 100
TARGET_RATIO = 20.0
TARGET_FRACTION = 0.5
EMPTY_RECEIVES = 3     # a client stops after this many empty receives in a row: the queue ran dry
MAX_CLIENT_ERRORS = 20  # a client stops after this many failed calls
PRELOAD_MARGIN = 1.3   # preload the receive row's queue with this times the expected rate x --seconds
GRACE = 20.0           # after a cell's deadline, wait at most this long for calls in flight
ROWS = ("send", "batch", "receive")
ROW_NAMES = {"send": "SendMessage", "batch": "SendMessageBatch (10)",
             "receive": "ReceiveMessage (10) + DeleteMessageBatch"}
# a SigV4-looking header: any Authorization is accepted by Conveyor; moto reads the region from it
AUTHORIZATION = (f"AWS4-HMAC-SHA256 Credential=test/20250101/{REGION}/sqs/aws4_request, "
                 "SignedHeaders=host;x-amz-date, Signature=0")
STOP = threading.Event()


# -- results -----------------------------------------------------------------------------------

@dataclass
class Cell:
    messages: int
    requests: int
    seconds: float
    drained: bool = False
    errors: int = 0
    cpu: dict[str, float] = field(default_factory=dict)  # seconds of CPU per process group

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0

    def cpu_per_request(self) -> str:
        if not self.requests or not self.cpu:
            return ""
        parts = [f"{k} {v / self.requests * 1e6:5.0f}" for k, v in self.cpu.items()]
        busy = sum(self.cpu.values()) / self.seconds / (os.cpu_count() or 1)
        return f"cpu us/request: {', '.join(parts)} (machine {busy:4.0%} busy)"


class ErrorLog:
    """Failed requests: a count per (system, action) and the first few, request and response."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self.samples: dict[str, list[tuple[str, str]]] = {}

    def add(self, where: str, request: str, response: str) -> None:
        with self.lock:
            self.counts[where] = self.counts.get(where, 0) + 1
            samples = self.samples.setdefault(where, [])
            if len(samples) < 3:
                limit = 4000 if where.startswith("conveyor") else 400
                samples.append((request[:limit], response[:limit]))

    def report(self) -> None:
        if not self.counts:
            print("\nerrors: none (every request of the workload succeeded)")
            return
        print("\nERRORS (count per system and action; first requests and responses verbatim):")
        for where, count in sorted(self.counts.items()):
            print(f"  {where}: {count}")
            for request, response in self.samples[where]:
                print(f"    request:  {request}")
                print(f"    response: {response}")


ERRORS = ErrorLog()


# -- CPU accounting from /proc (Linux; empty elsewhere) -----------------------------------------

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_fields(pid: int | str) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _process_cpu(pid: int) -> float:
    """The process and its live descendants (the workers of ``conveyor serve --workers N``, the
    processes a peer such as LocalStack starts), each with its children that exited and were
    waited for (cutime/cstime)."""
    stats: dict[int, list[str]] = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        fields = _stat_fields(name) if name.isdigit() else None
        if fields:
            stats[int(name)] = fields
    children: dict[int, list[int]] = {}
    for child, fields in stats.items():
        children.setdefault(int(fields[1]), []).append(child)  # ppid is field 4 (index 1 here)
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        if p in stats:
            # utime, stime, cutime, cstime are fields 14-17 (index 0 here is field 3)
            total += sum(int(x) for x in stats[p][11:15])
            todo.extend(children.get(p, ()))
    return total / _TICK


def _postgres_cpu() -> float:
    """All processes named postgres (backends and the postmaster, whose cutime/cstime hold the
    backends that have exited). Other users of the same PostgreSQL are counted too."""
    total = 0
    try:
        names = os.listdir("/proc")
    except OSError:
        return 0.0
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/comm") as f:
                if f.read().strip() != "postgres":
                    continue
        except OSError:
            continue
        fields = _stat_fields(name)
        if fields:
            total += sum(int(x) for x in fields[11:15])
    return total / _TICK


class CpuMeter:
    def __init__(self, server_pid: int | None, server_name: str, postgres: bool) -> None:
        self.server_pid, self.server_name, self.postgres = server_pid, server_name, postgres
        self.enabled = os.path.exists("/proc/self/stat")

    def sample(self) -> dict[str, float]:
        if not self.enabled:
            return {}
        t = os.times()
        out = {"client": t.user + t.system}
        if self.server_pid is not None:
            out[self.server_name] = _process_cpu(self.server_pid)
        if self.postgres:
            out["postgres"] = _postgres_cpu()
        return out

    @staticmethod
    def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        return {k: after[k] - before[k] for k in before}


def _pid_cpu(pid: int) -> float:
    fields = _stat_fields(pid)
    return sum(int(x) for x in fields[11:15]) / _TICK if fields else 0.0


def pids_named(comm: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{name}/comm") as f:
                if f.read().strip() == comm:
                    found.append(int(name))
    return found


class Meter:
    """CPU seconds of a broker's processes (peers_bench.py): those ``pids()`` names, the
    process tree under ``tree``, and as "postgres" the PostgreSQL backends ``backends()``
    lists; ``sample()`` as CpuMeter's."""

    def __init__(self, pids: Callable[[], list[int]], tree: int | None = None,
                 backends: Callable[[], list[int]] | None = None) -> None:
        self.pids, self.tree, self.backends = pids, tree, backends
        self.last: dict[int, tuple[str, float]] = {}  # backend pid -> (its start time, CPU last read)

    def sample(self) -> dict[str, float]:
        t = os.times()
        out = {"client": t.user + t.system, "server": sum(_pid_cpu(p) for p in self.pids())}
        if self.tree is not None:
            out["server"] += _process_cpu(self.tree)
        if self.backends is not None:
            # every backend seen so far: one that has exited since (a pool closing an idle
            # connection) keeps the CPU last read of it, so that its past is not subtracted from
            # the cell; a pid taken by another process since (another start time) is not read
            for pid in self.backends():
                self.last.setdefault(pid, ("", 0.0))
            for pid, (started, _) in list(self.last.items()):
                fields = _stat_fields(pid)
                if fields and started in ("", fields[19]):  # field 22, starttime
                    self.last[pid] = (fields[19], sum(int(x) for x in fields[11:15]) / _TICK)
            out["postgres"] = sum(seconds for _, seconds in self.last.values())
        return out


# -- child processes ---------------------------------------------------------------------------

def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Child:
    """A server started here; in its own session so that Ctrl-C reaches only this script,
    whose ``finally`` stops it."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], port: int, quiet: bool,
                 host: str = "127.0.0.1", cwd: str | None = None) -> None:
        self.name, self.port = name, port
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        out = subprocess.DEVNULL if quiet else None
        self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=out, start_new_session=True, cwd=cwd)

    def wait_ready(self, path: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} while starting")
            try:
                with urllib.request.urlopen(self.url + path, timeout=2) as r:
                    if r.status < 500:
                        return
            except urllib.error.HTTPError as exc:
                if exc.code < 500:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not start within {timeout:g}s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start_conveyor(dsn: str, workers: int) -> Child:
    port = free_port()
    env = {**os.environ, "DATABASE_URL": dsn, "CONVEYOR_PORT": str(port), "CONVEYOR_AUTH": "none",
           "CONVEYOR_LOG_LEVEL": "warning", "CONVEYOR_POOL_MAX": "16", "CONVEYOR_WORKERS": str(workers)}
    return Child("conveyor", [sys.executable, "-m", "conveyor", "serve"], env, port, quiet=False)


def start_moto() -> Child:
    port = free_port()
    # moto_server logs every request (werkzeug); that output is discarded
    return Child("moto", [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                 dict(os.environ), port, quiet=True)


# -- database ----------------------------------------------------------------------------------

RAW_TABLE = """
DROP TABLE IF EXISTS bench_sqs_raw;
CREATE TABLE bench_sqs_raw (id bigserial PRIMARY KEY, vt timestamptz NOT NULL DEFAULT now(),
                            receive_count int NOT NULL DEFAULT 0, body text NOT NULL);
CREATE INDEX ON bench_sqs_raw (vt, id);
"""
RAW_SEND = "INSERT INTO bench_sqs_raw (body) VALUES (%s) RETURNING id"
RAW_SEND_BATCH = "INSERT INTO bench_sqs_raw (body) VALUES " + ", ".join(["(%s)"] * 10) + " RETURNING id"
RAW_RECEIVE = """
UPDATE bench_sqs_raw SET vt = now() + interval '30 seconds', receive_count = receive_count + 1
 WHERE id IN (SELECT id FROM bench_sqs_raw WHERE vt <= now() ORDER BY vt, id LIMIT 10 FOR UPDATE SKIP LOCKED)
 RETURNING id, body"""
RAW_DELETE = "DELETE FROM bench_sqs_raw WHERE id = ANY(%s)"
RAW_PRELOAD = "INSERT INTO bench_sqs_raw (body) SELECT %s FROM generate_series(1, %s)"


def create_database(name: str = DATABASE, *, migrated: bool = False) -> str:
    """A fresh database ``name`` on ADMIN_DSN (dropped first if left over), with
    Conveyor's schema if ``migrated``; its DSN. The other benches use it too."""
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    dsn = conninfo.make_conninfo(ADMIN_DSN, dbname=name)
    if migrated:
        async def apply() -> None:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                await migrate.migrate(conn)

        asyncio.run(apply())
    return dsn


# The server's own vacuum's bar (conveyor.tables_to_vacuum: 500 dead row versions plus 5%
# of the live rows), written out here so that a bench of an older tree, which has no such
# function, gets the same upkeep.
_DUE = ("SELECT format('%I.%I', schemaname, relname) FROM pg_stat_user_tables "
        "WHERE n_dead_tup >= 500 + 0.05 * n_live_tup ORDER BY n_dead_tup DESC")


@contextlib.contextmanager
def vacuuming(dsn: str, interval: float = 1.0) -> Any:
    """While the block runs, VACUUM the database's tables that pass the bar every
    ``interval`` seconds, from a connection of its own, as a running server does
    (CONVEYOR_VACUUM_INTERVAL) and autovacuum would if this machine ran it (it does not:
    docs/benchmarks.md, "Vacuum"). For benches that load PostgreSQL without a server
    (pgbench scripts): without it their figures grow with the dead rows of the runs before."""
    done = threading.Event()

    def loop() -> None:
        with psycopg.connect(dsn, autocommit=True, application_name="bench-vacuum") as conn:
            while not done.wait(interval):
                for (table,) in conn.execute(_DUE).fetchall():
                    with contextlib.suppress(psycopg.errors.UndefinedTable):
                        conn.execute(f"VACUUM (SKIP_LOCKED) {table}".encode())

    worker = threading.Thread(target=loop, daemon=True)
    worker.start()
    try:
        yield
    finally:
        done.set()
        worker.join(30)


def drop_database(name: str = DATABASE) -> None:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def prepare_database(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await migrate.migrate(conn)
        await conn.execute(RAW_TABLE)


# -- load loops --------------------------------------------------------------------------------

# An operation makes one call (or two for receive + delete) and returns (messages, requests):
# messages > 0 counted, 0 = nothing received (queue empty), < 0 = the call failed.
SyncOp = Callable[[], tuple[int, int]]
AsyncOp = Callable[[], Awaitable[tuple[int, int]]]


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.messages = self.requests = self.errors = 0
        self.drained = False

    def client_done(self, requests: int, errors: int, drained: bool) -> None:
        with self.lock:
            self.requests += requests
            self.errors += errors
            self.drained |= drained


def run_threads(ops: list[SyncOp], seconds: float, max_messages: int, meter: CpuMeter) -> Cell:
    """One thread per operation, started together, until --seconds or max_messages."""
    tally = Tally()
    barrier = threading.Barrier(len(ops) + 1)
    deadline = [0.0]

    def worker(op: SyncOp) -> None:
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return
        requests = errors = empties = 0
        drained = False
        end = deadline[0]
        while time.perf_counter() < end and tally.messages < max_messages and not STOP.is_set():
            got, req = op()
            requests += req
            if got < 0:
                errors += 1
                if errors >= MAX_CLIENT_ERRORS:
                    break
            elif got == 0:
                empties += 1
                if empties >= EMPTY_RECEIVES:
                    drained = True
                    break
            else:
                empties = 0
                with tally.lock:
                    tally.messages += got
        tally.client_done(requests, errors, drained)

    threads = [threading.Thread(target=worker, args=(op,), daemon=True) for op in ops]
    for t in threads:
        t.start()
    before = meter.sample()
    started = time.perf_counter()
    deadline[0] = started + seconds
    barrier.wait()
    for t in threads:
        t.join(max(0.0, deadline[0] + GRACE - time.perf_counter()))
    elapsed = time.perf_counter() - started
    if any(t.is_alive() for t in threads):
        print(f"  WARNING: {sum(t.is_alive() for t in threads)} calls still in flight {GRACE:g}s after the "
              "deadline; abandoned (they may slow down the next cells)", flush=True)
    return Cell(tally.messages, tally.requests, elapsed, tally.drained, tally.errors,
                CpuMeter.delta(before, meter.sample()))


async def run_tasks(ops: list[AsyncOp], seconds: float, max_messages: int, meter: CpuMeter) -> Cell:
    """One coroutine per operation until --seconds or max_messages."""
    tally = Tally()
    end = 0.0

    async def loop(op: AsyncOp) -> None:
        requests = errors = empties = 0
        drained = False
        while time.perf_counter() < end and tally.messages < max_messages:
            got, req = await op()
            requests += req
            if got < 0:
                errors += 1
                if errors >= MAX_CLIENT_ERRORS:
                    break
            elif got == 0:
                empties += 1
                if empties >= EMPTY_RECEIVES:
                    drained = True
                    break
            else:
                empties = 0
                tally.messages += got
        tally.client_done(requests, errors, drained)

    before = meter.sample()
    started = time.perf_counter()
    end = started + seconds
    tasks = [asyncio.ensure_future(loop(op)) for op in ops]
    _, pending = await asyncio.wait(tasks, timeout=seconds + GRACE)
    elapsed = time.perf_counter() - started
    if pending:
        print(f"  WARNING: {len(pending)} calls still in flight {GRACE:g}s after the deadline; cancelled "
              "(the server may still be working on them)", flush=True)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    for t in tasks:
        if not t.cancelled() and t.exception() is not None:
            raise t.exception()
    return Cell(tally.messages, tally.requests, elapsed, tally.drained, tally.errors,
                CpuMeter.delta(before, meter.sample()))


# -- boto3 -------------------------------------------------------------------------------------

def boto_client(session: boto3.session.Session, endpoint: str) -> Any:
    # every thread gets its own client (and so its own connection pool); the clients are made
    # one after the other in the main thread, so they can come from one session. No retries:
    # every failure shows.
    return session.client(
        "sqs", endpoint_url=endpoint, region_name=REGION, aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(retries={"total_max_attempts": 1, "mode": "standard"}, max_pool_connections=2,
                      connect_timeout=10, read_timeout=60))


def _client_error(system: str, action: str, params: dict[str, Any], exc: Exception) -> None:
    request = f"{action} {orjson.dumps(params).decode()}"
    if isinstance(exc, ClientError):
        meta = exc.response.get("ResponseMetadata", {})
        response = (f"HTTP {meta.get('HTTPStatusCode')} "
                    f"{orjson.dumps({k: v for k, v in exc.response.items() if k != 'ResponseMetadata'}).decode()}")
    else:
        response = repr(exc)
    ERRORS.add(f"{system} boto3 {action}", request, response)


def _batch_failures(system: str, mode: str, action: str, params: dict[str, Any], result: dict[str, Any]) -> None:
    if result.get("Failed"):
        ERRORS.add(f"{system} {mode} {action} (entries failed)", f"{action} {orjson.dumps(params).decode()}",
                   orjson.dumps(result).decode())


def boto_ops(system: str, clients: list[Any], url: str, row: str) -> list[SyncOp]:
    ops: list[SyncOp] = []
    for client in clients:
        if row == "send":
            def op(c: Any = client) -> tuple[int, int]:
                params = {"QueueUrl": url, "MessageBody": BODY}
                try:
                    c.send_message(**params)
                except (ClientError, BotoCoreError) as exc:
                    _client_error(system, "SendMessage", params, exc)
                    return -1, 1
                return 1, 1
        elif row == "batch":
            def op(c: Any = client) -> tuple[int, int]:
                params = {"QueueUrl": url, "Entries": [{"Id": str(i), "MessageBody": BODY} for i in range(10)]}
                try:
                    r = c.send_message_batch(**params)
                except (ClientError, BotoCoreError) as exc:
                    _client_error(system, "SendMessageBatch", params, exc)
                    return -1, 1
                _batch_failures(system, "boto3", "SendMessageBatch", params, r)
                return len(r.get("Successful", [])) or -1, 1
        else:
            def op(c: Any = client) -> tuple[int, int]:
                params: dict[str, Any] = {"QueueUrl": url, "MaxNumberOfMessages": 10, "WaitTimeSeconds": 0}
                try:
                    got = c.receive_message(**params).get("Messages", [])
                except (ClientError, BotoCoreError) as exc:
                    _client_error(system, "ReceiveMessage", params, exc)
                    return -1, 1
                if not got:
                    return 0, 1
                params = {"QueueUrl": url, "Entries": [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                                                       for i, m in enumerate(got)]}
                try:
                    r = c.delete_message_batch(**params)
                except (ClientError, BotoCoreError) as exc:
                    _client_error(system, "DeleteMessageBatch", params, exc)
                    return -1, 2
                _batch_failures(system, "boto3", "DeleteMessageBatch", params, r)
                return len(r.get("Successful", [])) or -1, 2
        ops.append(op)
    return ops


# -- raw HTTP (JSON protocol by hand) ----------------------------------------------------------

def _headers(action: str) -> dict[str, str]:
    return {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": f"AmazonSQS.{action}",
            "Authorization": AUTHORIZATION}


HEADERS = {a: _headers(a) for a in ("CreateQueue", "SendMessage", "SendMessageBatch", "ReceiveMessage",
                                     "DeleteMessageBatch")}


class RawSqs:
    def __init__(self, system: str, http: RawHttp) -> None:
        self.system, self.http = system, http

    def prepared(self, action: str, payload: bytes) -> tuple[str, bytes, bytes]:
        return action, payload, self.http.request("POST", "/", payload, HEADERS[action])

    async def call(self, action: str, payload: bytes, request: bytes | None = None) -> dict[str, Any] | None:
        try:
            status, body = await self.http.send(request or self.http.request("POST", "/", payload, HEADERS[action]))
        except HttpError as exc:
            ERRORS.add(f"{self.system} raw {action}", payload.decode(), str(exc))
            return None
        if status != 200:
            ERRORS.add(f"{self.system} raw {action}", payload.decode(),
                       f"HTTP {status} {body.decode('utf-8', 'replace')}")
            return None
        result = orjson.loads(body) if body else {}
        if result.get("Failed"):
            ERRORS.add(f"{self.system} raw {action} (entries failed)", payload.decode(), body.decode())
        return result

    def ops(self, url: str, row: str, clients: int) -> list[AsyncOp]:
        # the requests that never change are built once
        send = self.prepared("SendMessage", orjson.dumps({"QueueUrl": url, "MessageBody": BODY}))
        batch = self.prepared("SendMessageBatch", orjson.dumps(
            {"QueueUrl": url, "Entries": [{"Id": str(i), "MessageBody": BODY} for i in range(10)]}))
        receive = self.prepared("ReceiveMessage", orjson.dumps(
            {"QueueUrl": url, "MaxNumberOfMessages": 10, "WaitTimeSeconds": 0}))

        async def send_op() -> tuple[int, int]:
            return (1 if await self.call(*send) is not None else -1), 1

        async def batch_op() -> tuple[int, int]:
            r = await self.call(*batch)
            return (len(r.get("Successful", [])) or -1 if r is not None else -1), 1

        async def receive_op() -> tuple[int, int]:
            r = await self.call(*receive)
            if r is None:
                return -1, 1
            got = r.get("Messages") or []
            if not got:
                return 0, 1
            d = await self.call("DeleteMessageBatch", orjson.dumps(
                {"QueueUrl": url, "Entries": [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                                              for i, m in enumerate(got)]}))
            return (len(d.get("Successful", [])) or -1 if d is not None else -1), 2

        op = {"send": send_op, "batch": batch_op, "receive": receive_op}[row]
        return [op] * clients

    async def create_queue(self, name: str) -> str:
        r = await self.call("CreateQueue", orjson.dumps({"QueueName": name}))
        if r is None:
            raise RuntimeError(f"{self.system}: CreateQueue {name} failed (see the errors below)")
        return r["QueueUrl"]

    async def top_up(self, url: str, count: int, concurrency: int = 16) -> int:
        """Send ``count`` messages (in batches of 10); returns how many were sent."""
        batch = self.prepared("SendMessageBatch", orjson.dumps(
            {"QueueUrl": url, "Entries": [{"Id": str(i), "MessageBody": BODY} for i in range(10)]}))
        calls = math.ceil(count / 10)
        sent = 0
        failures = 0

        async def loop() -> None:
            nonlocal calls, sent, failures
            while calls > 0 and failures < MAX_CLIENT_ERRORS:
                calls -= 1
                r = await self.call(*batch)
                if r is None:
                    failures += 1
                else:
                    sent += len(r.get("Successful", []))

        await asyncio.gather(*(loop() for _ in range(concurrency)))
        return sent


@contextlib.asynccontextmanager
async def raw_sqs(server: Child) -> AsyncIterator[RawSqs]:
    http = RawHttp("127.0.0.1", server.port)
    try:
        yield RawSqs(server.name, http)
    finally:
        await http.close()


# -- raw PostgreSQL ----------------------------------------------------------------------------

async def pg_cell(dsn: str, row: str, clients: int, seconds: float, max_messages: int, meter: CpuMeter) -> Cell:
    conns = [await psycopg.AsyncConnection.connect(dsn, autocommit=True) for _ in range(clients)]
    batch_params = (BODY,) * 10

    def make(conn: psycopg.AsyncConnection) -> AsyncOp:
        async def send_op() -> tuple[int, int]:
            await (await conn.execute(RAW_SEND, (BODY,), prepare=True)).fetchone()
            return 1, 1

        async def batch_op() -> tuple[int, int]:
            return len(await (await conn.execute(RAW_SEND_BATCH, batch_params, prepare=True)).fetchall()), 1

        async def receive_op() -> tuple[int, int]:
            rows = await (await conn.execute(RAW_RECEIVE, prepare=True)).fetchall()
            if not rows:
                return 0, 1
            cur = await conn.execute(RAW_DELETE, ([r[0] for r in rows],), prepare=True)
            return cur.rowcount, 2

        return {"send": send_op, "batch": batch_op, "receive": receive_op}[row]

    try:
        return await run_tasks([make(c) for c in conns], seconds, max_messages, meter)
    finally:
        for c in conns:
            await c.close()


async def pg_reset(dsn: str, preload: int = 0) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        if preload:
            await conn.execute(RAW_PRELOAD, (BODY, preload))
        else:
            await conn.execute("TRUNCATE bench_sqs_raw RESTART IDENTITY")


# -- orchestration -----------------------------------------------------------------------------

def median_cell(cells: list[Cell]) -> Cell:
    return sorted(cells, key=lambda c: c.rate)[len(cells) // 2]


class Bench:
    def __init__(self, args: argparse.Namespace, runner: asyncio.Runner) -> None:
        self.args, self.runner = args, runner
        self.children: list[Child] = []
        self.results: dict[tuple[str, int, str], Cell] = {}  # (column, clients, row) -> median
        # (column, clients) -> the last receive rate measured (sizes the receive row's queue)
        self.receive_rate: dict[tuple[str, int], float] = {}
        self.boto_clients: dict[str, list[Any]] = {}
        self.queues = 0

    # helpers

    def queue_name(self, column: str) -> str:
        self.queues += 1
        return f"bench-{column.replace(' ', '-')}-{self.queues}"

    def preload_target(self, column: str, clients: int, batch_rate: float) -> int:
        """Messages to put in the receive row's queue: what the expected receive rate takes in
        --seconds, with a margin. Expected: this column's receive rate at this concurrency in the
        previous repeat, else half its batch send rate in this one (moto's receive rate depends
        on the depth, so the depth follows what was measured rather than a generous guess)."""
        expected = self.receive_rate.get((column, clients)) or batch_rate / 2
        return max(10, min(self.args.max_messages, math.ceil(expected * self.args.seconds * PRELOAD_MARGIN)))

    def record(self, column: str, clients: int, runs: list[dict[str, Cell]]) -> None:
        for row in ROWS:
            cells = [r[row] for r in runs]
            median = median_cell(cells)
            self.results[(column, clients, row)] = median
            flags = (" drained" if any(c.drained for c in cells) else "") + \
                    (f" ERRORS {sum(c.errors for c in cells)}" if any(c.errors for c in cells) else "")
            print(f"  {column:<15} x{clients:<3} {ROW_NAMES[row]:<40} {median.rate:7.0f} msg/s  "
                  f"(runs {' '.join(f'{c.rate:.0f}' for c in cells)}; {median.messages} msgs in "
                  f"{median.seconds:.1f}s){flags}  {median.cpu_per_request()}", flush=True)

    def note_receive(self, column: str, clients: int, cell: Cell) -> None:
        self.receive_rate[(column, clients)] = cell.rate

    # one repeat of the three rows. Every row starts on a fresh, empty queue; the receive row's
    # queue is filled first (SendMessageBatch through the raw client; moto's cost per message
    # grows with the queue's depth, so the depth is kept to what the row needs).

    def boto_repeat(self, column: str, server: Child, clients: int, seconds: float) -> dict[str, Cell]:
        boto = self.boto_clients[column][:clients]
        meter = CpuMeter(server.proc.pid, server.name, postgres=server.name == "conveyor")
        cells: dict[str, Cell] = {}
        for row in ROWS:
            url = boto[0].create_queue(QueueName=self.queue_name(column))["QueueUrl"]
            if row == "receive":
                self.runner.run(self.fill(server, url, self.preload_target(column, clients, cells["batch"].rate)))
            cells[row] = run_threads(boto_ops(column, boto, url, row), seconds, self.args.max_messages, meter)
        self.note_receive(column, clients, cells["receive"])
        return cells

    async def fill(self, server: Child, url: str, count: int) -> None:
        async with raw_sqs(server) as sqs:
            await sqs.top_up(url, count)

    async def raw_repeat(self, column: str, server: Child, clients: int, seconds: float) -> dict[str, Cell]:
        meter = CpuMeter(server.proc.pid, server.name, postgres=server.name == "conveyor")
        cells: dict[str, Cell] = {}
        async with raw_sqs(server) as sqs:
            for row in ROWS:
                url = await sqs.create_queue(self.queue_name(column))
                if row == "receive":
                    await sqs.top_up(url, self.preload_target(column, clients, cells["batch"].rate))
                cells[row] = await run_tasks(sqs.ops(url, row, clients), seconds, self.args.max_messages, meter)
        self.note_receive(column, clients, cells["receive"])
        return cells

    async def pg_repeat(self, dsn: str, clients: int, seconds: float) -> dict[str, Cell]:
        column = "raw postgresql"
        meter = CpuMeter(None, "", postgres=True)
        cells: dict[str, Cell] = {}
        for row in ROWS:
            await pg_reset(dsn)
            if row == "receive":
                await pg_reset(dsn, preload=self.preload_target(column, clients, cells["batch"].rate))
            cells[row] = await pg_cell(dsn, row, clients, seconds, self.args.max_messages, meter)
        self.note_receive(column, clients, cells["receive"])
        return cells

    # the run

    def run(self) -> None:
        args = self.args
        t0 = time.perf_counter()
        print(f"database {DATABASE} on {conninfo.make_conninfo(ADMIN_DSN, password=None)}; "
              f"{os.cpu_count()} cores, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
        dsn = create_database()
        self.created_database = True
        self.runner.run(prepare_database(dsn))
        conveyor = start_conveyor(dsn, args.workers)
        self.children.append(conveyor)
        moto = start_moto()
        self.children.append(moto)
        conveyor.wait_ready("/livez")
        moto.wait_ready("/moto-api/")
        servers = {"conveyor boto3": conveyor, "moto boto3": moto}
        raw_servers = {"conveyor raw": conveyor}
        if args.raw_moto:
            raw_servers["moto raw"] = moto
        print(f"conveyor serve --workers {args.workers} on {conveyor.url} (pid {conveyor.proc.pid}), "
              f"moto_server on {moto.url} (pid {moto.proc.pid})", flush=True)

        top = max(args.clients)
        for column, server in servers.items():
            session = boto3.session.Session()
            self.boto_clients[column] = [boto_client(session, server.url) for _ in range(top)]

        # warm up every server and client alike: pool connections, prepared statements, code paths
        print(f"warming up ({args.warmup:g}s per row and system)", flush=True)
        # (moto has no connections to open nor statements to prepare: a few clients load its code
        # paths, without the backlog that many clients leave in it)
        for column, server in servers.items():
            self.boto_repeat(column, server, top if server is conveyor else min(top, 4), args.warmup)
        for column, server in raw_servers.items():
            self.runner.run(self.raw_repeat(column, server, max(args.raw_clients) if server is conveyor
                                            else min(max(args.raw_clients), 4), args.warmup))
        self.runner.run(self.pg_repeat(dsn, max(args.raw_clients), args.warmup))
        self.receive_rate.clear()
        if ERRORS.counts:
            print(f"  errors during warm-up: {dict(ERRORS.counts)}", flush=True)

        # The systems take turns within each repeat (A B A B ...), so a drift in the machine's
        # speed during the run (seen here: +-25% over minutes) weighs on both sides alike.
        print(f"\npart 1: boto3, median of {args.repeat} x {args.seconds:g}s per cell", flush=True)
        for clients in args.clients:
            runs: dict[str, list[dict[str, Cell]]] = {column: [] for column in servers}
            for _ in range(args.repeat):
                for column, server in servers.items():
                    runs[column].append(self.boto_repeat(column, server, clients, args.seconds))
            for column in servers:
                self.record(column, clients, runs[column])

        print(f"\npart 2: raw HTTP (rawhttp.py + uvloop) and raw PostgreSQL (psycopg), "
              f"median of {args.repeat} x {args.seconds:g}s per cell", flush=True)
        for clients in args.raw_clients:
            runs = {column: [] for column in [*raw_servers, "raw postgresql"]}
            for _ in range(args.repeat):
                for column, server in raw_servers.items():
                    runs[column].append(self.runner.run(self.raw_repeat(column, server, clients, args.seconds)))
                runs["raw postgresql"].append(self.runner.run(self.pg_repeat(dsn, clients, args.seconds)))
            for column, column_runs in runs.items():
                self.record(column, clients, column_runs)

        self.wall = time.perf_counter() - t0

    def stop(self) -> None:
        STOP.set()
        for child in reversed(self.children):
            try:
                child.stop()
            except Exception as exc:  # noqa: BLE001 - stop the others all the same
                print(f"stopping {child.name}: {exc!r}", file=sys.stderr)
        if getattr(self, "created_database", False) and not self.args.keep_database:
            try:
                drop_database()
            except psycopg.Error as exc:
                print(f"dropping database {DATABASE}: {exc}", file=sys.stderr)

    # the report

    def rate(self, column: str, clients: int, row: str) -> float | None:
        cell = self.results.get((column, clients, row))
        return None if cell is None else cell.rate

    def report(self, command: str) -> None:
        args = self.args
        yes = lambda ok: "yes" if ok else "NO"  # noqa: E731

        def ratio(a: float | None, b: float | None) -> float | None:
            return None if a is None or not b else a / b

        def fmt(x: float | None, spec: str) -> str:
            return "n/a" if x is None else format(x, spec)

        boto_rows, raw_rows = [], []
        for clients in args.clients:
            for row in ROWS:
                c, m = self.rate("conveyor boto3", clients, row), self.rate("moto boto3", clients, row)
                r = ratio(c, m)
                boto_rows.append((ROW_NAMES[row], clients, c, m, r, r is not None and r >= TARGET_RATIO))
        for clients in args.raw_clients:
            for row in ROWS:
                c, pg = self.rate("conveyor raw", clients, row), self.rate("raw postgresql", clients, row)
                m = self.rate("moto raw", clients, row)
                f = ratio(c, pg)
                raw_rows.append((ROW_NAMES[row], clients, c, pg, f, f is not None and f >= TARGET_FRACTION,
                                 m, ratio(c, m)))

        print(f"\nmessages/s, median of {args.repeat} runs of {args.seconds:g}s per cell; 100-byte bodies")
        print("\nboto3 (one thread and one boto3 client per concurrent client)")
        print(f"{'operation':<42}{'clients':>8}{'conveyor':>11}{'moto':>9}{'ratio':>9}  >= {TARGET_RATIO:g}x")
        for name, clients, c, m, r, ok in boto_rows:
            print(f"{name:<42}{clients:>8}{fmt(c, '.0f'):>11}{fmt(m, '.0f'):>9}{fmt(r, '.1f'):>8}x  {yes(ok)}")
        print("\nraw HTTP client (rawhttp.py + uvloop, no botocore) against raw PostgreSQL (psycopg, plain table)")
        head = f"{'operation':<42}{'clients':>8}{'conveyor':>11}{'raw pg':>9}{'fraction':>10}  >= {TARGET_FRACTION:g}"
        if args.raw_moto:
            head += f"{'moto':>9}{'conveyor/moto':>15}"
        print(head)
        for name, clients, c, pg, f, ok, m, cm in raw_rows:
            line = f"{name:<42}{clients:>8}{fmt(c, '.0f'):>11}{fmt(pg, '.0f'):>9}{fmt(f, '.2f'):>10}  {yes(ok):<6}"
            if args.raw_moto:
                line += f"{fmt(m, '.0f'):>9}{fmt(cm, '.1f'):>14}x"
            print(line.rstrip())

        n_boto = sum(ok for *_, ok in boto_rows)
        n_raw = sum(r[5] for r in raw_rows)
        print(f"\nboto3 rows meeting Conveyor >= {TARGET_RATIO:g}x moto: {n_boto}/{len(boto_rows)}; "
              f"raw rows meeting >= {TARGET_FRACTION:g} of raw PostgreSQL: {n_raw}/{len(raw_rows)}")

        print("\n--- markdown (docs/benchmarks.md) ---\n")
        print(f"boto3, messages/s (median of {args.repeat} runs of {args.seconds:g} s; "
              f"target Conveyor >= {TARGET_RATIO:g}x moto):\n")
        print("| operation | clients | Conveyor | moto_server | Conveyor/moto | >= 20x |")
        print("|---|---:|---:|---:|---:|:---:|")
        for name, clients, c, m, r, ok in boto_rows:
            print(f"| {name} | {clients} | {fmt(c, '.0f')} | {fmt(m, '.0f')} | {fmt(r, '.1f')}x | {yes(ok)} |")
        print(f"\nraw HTTP client and raw PostgreSQL, messages/s (goal Conveyor >= {TARGET_FRACTION:g} of raw):\n")
        if args.raw_moto:
            print("| operation | clients | Conveyor | raw PostgreSQL | fraction | >= 0.5 | moto_server | Conveyor/moto |")
            print("|---|---:|---:|---:|---:|:---:|---:|---:|")
        else:
            print("| operation | clients | Conveyor | raw PostgreSQL | fraction | >= 0.5 |")
            print("|---|---:|---:|---:|---:|:---:|")
        for name, clients, c, pg, f, ok, m, cm in raw_rows:
            line = f"| {name} | {clients} | {fmt(c, '.0f')} | {fmt(pg, '.0f')} | {fmt(f, '.2f')} | {yes(ok)} |"
            if args.raw_moto:
                line += f" {fmt(m, '.0f')} | {fmt(cm, '.1f')}x |"
            print(line)
        print(f"\ncommand: {command}")
        print(f"wall time: {self.wall:.0f} s; load average at the end "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} (the run's own load included)")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=3.0, help="duration of each cell run (default 3)")
    p.add_argument("--repeat", type=int, default=3, help="runs per cell; the median is reported (default 3)")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 32],
                   help="boto3 concurrency levels, threads (default 1 32)")
    p.add_argument("--raw-clients", type=int, nargs="+", default=[1, 64],
                   help="raw HTTP / raw PostgreSQL concurrency levels, coroutines (default 1 64)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="conveyor serve --workers: server processes (default: the machine's cores)")
    p.add_argument("--max-messages", type=int, default=200_000,
                   help="messages per cell at most; also bounds the receive row's preload (default 200000)")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds per row and system of warm-up (default 1)")
    p.add_argument("--raw-moto", action=argparse.BooleanOptionalAction, default=False,
                   help="also drive moto_server with the raw HTTP client: Conveyor/moto without boto3's "
                        "client cost (default off: moto's calls take long at 64 clients, it adds ~2 minutes)")
    p.add_argument("--keep-database", action="store_true", help=f"do not drop database {DATABASE} at the end")
    args = p.parse_args()
    if args.seconds <= 0 or args.repeat < 1 or args.max_messages < 10 or min(args.clients + args.raw_clients) < 1:
        p.error("--seconds > 0, --repeat >= 1, --max-messages >= 10 and client counts >= 1 are needed")
    return args


def main() -> None:
    args = parse_args()
    command = shlex.join([os.path.relpath(sys.executable) if sys.executable.startswith(os.getcwd()) else
                          sys.executable, *sys.argv])

    def on_term(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started with SIGINT ignored
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        bench = Bench(args, runner)
        try:
            bench.run()
        except KeyboardInterrupt:
            print("\ninterrupted: stopping the servers", file=sys.stderr)
            raise SystemExit(130) from None
        finally:
            bench.stop()
    ERRORS.report()
    bench.report(command)


if __name__ == "__main__":
    main()
