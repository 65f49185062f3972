"""The server's instructions per request, counted by valgrind (callgrind), for two source
trees side by side: a repeatable figure for changes too small for a timing to see.

    ./bin/bench instructions.py --before-src /tmp/conveyor-before/src [--after-src src]
                                [--before-env K=V ...] [--after-env K=V ...]
                                [--ops sqs-send rest-send queen-push sqs-receive-delete queen-pop-ack]
                                [--requests 300] [--warmup 100]

With --before-src src and an --after-env, it measures what a setting costs (e.g.
--after-env CONVEYOR_REQUEST_TIMEOUT=0).

Timings on a shared 2-core machine move by 10% from run to run; callgrind counts the
instructions a process executes, which are the same whatever else the machine does (the
`env` notes: the same total twice, once with the other core loaded). Each tree's `conveyor
serve` (one process, --fusion off so that one request is one SQL call, the vacuum worker
off) runs under `valgrind --tool=callgrind`, about 50 times slower than native. One
client sends the requests one after another: after --warmup requests the counters are
zeroed (callgrind_control), --requests more are sent, the counters are dumped; then the
server idles for as long as those requests took, and that window's count (timers, the
event loop's polling) is taken off. Printed per operation: instructions per request, each
tree, and after/before. PostgreSQL's backends are not counted: this is the server's Python.

Needs valgrind (Debian: valgrind). Creates and drops databases conveyor_instr_bench_<pid>_{before,after} on
CONVEYOR_BENCH_DATABASE_URL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
import uvloop

sys.path.insert(0, str(Path(__file__).parent))
import sqs_bench as sb
from rawhttp import RawHttp
from server_bench import pairs

OPS = ("sqs-send", "rest-send", "queen-push", "sqs-receive-delete", "queen-pop-ack", "livez")
SQS = {"Content-Type": "application/x-amz-json-1.0",
       "Authorization": "AWS4-HMAC-SHA256 Credential=bench/20250101/us-east-1/sqs/aws4_request, "
                        "SignedHeaders=host, Signature=0"}
JSON = {"Content-Type": "application/json"}
BODY = "x" * 100
Op = Callable[[], Awaitable[None]]


def start(name: str, dsn: str, src: Path, out: Path, extra: dict[str, str]) -> sb.Child:
    port = sb.free_port()
    env = {**os.environ, "DATABASE_URL": dsn, "CONVEYOR_PORT": str(port), "CONVEYOR_AUTH": "none",
           "CONVEYOR_LOG_LEVEL": "warning", "CONVEYOR_WORKERS": "1", "CONVEYOR_FUSION": "false",
           "CONVEYOR_VACUUM_INTERVAL": "0",
           "PYTHONPATH": os.pathsep.join([str(src.resolve()), os.environ.get("PYTHONPATH", "")]), **extra}
    argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-instr=no",
            sys.executable, "-m", "conveyor", "serve"]
    child = sb.Child(name, argv, env, port, quiet=True)
    child.wait_ready("/livez", timeout=600)
    return child


def counted(pid: int, action: str, out: Path) -> int:
    """Zero (``action`` "zero") or dump ("dump") the server's counters; the dump's total."""
    before = set(out.parent.glob(out.name + "*"))
    subprocess.run(["callgrind_control", "--zero" if action == "zero" else "--dump", str(pid)],
                   check=True, capture_output=True, timeout=120)
    if action == "zero":
        return 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        new = sorted(set(out.parent.glob(out.name + "*")) - before, key=lambda p: p.stat().st_mtime)
        if new:
            time.sleep(0.5)  # let it finish writing
            text = new[-1].read_text(errors="replace")
            found = re.search(r"^(?:summary|totals):\s*(\d+)", text, re.MULTILINE)
            if found:
                return int(found.group(1))
        time.sleep(0.2)
    raise RuntimeError("callgrind wrote no dump")


async def ops(http: RawHttp, op: str) -> Op:
    """One request of ``op`` (after the queue it needs is made)."""
    q = f"instr-{uuid.uuid4().hex[:8]}"

    async def call(method: str, path: str, body: bytes, headers: dict[str, str], ok: int = 200) -> bytes:
        status, answer = await http.send(http.request(method, path, body, headers))
        if status != ok:
            raise RuntimeError(f"{op}: {method} {path}: HTTP {status}: {answer[:200]!r}")
        return answer

    def sqs(action: str, body: dict[str, object]) -> tuple[str, str, bytes, dict[str, str]]:
        return "POST", "/", orjson.dumps(body), {**SQS, "X-Amz-Target": f"AmazonSQS.{action}"}

    if op == "livez":
        return lambda: call("GET", "/livez", b"", {})
    if op.startswith("sqs"):
        url = orjson.loads(await call(*sqs("CreateQueue", {"QueueName": q})))["QueueUrl"]
        send = sqs("SendMessage", {"QueueUrl": url, "MessageBody": BODY})
        if op == "sqs-send":
            return lambda: call(*send)
        receive = sqs("ReceiveMessage", {"QueueUrl": url, "MaxNumberOfMessages": 1})

        async def receive_delete() -> None:
            await call(*send)  # one waiting: the pair below always finds it
            [m] = orjson.loads(await call(*receive))["Messages"]
            await call(*sqs("DeleteMessage", {"QueueUrl": url, "ReceiptHandle": m["ReceiptHandle"]}))
        return receive_delete
    if op == "rest-send":
        await call("POST", "/v1/queues", orjson.dumps({"name": q}), JSON, ok=201)
        body = orjson.dumps({"message": {"order": 1, "note": BODY}})
        return lambda: call("POST", f"/v1/queues/{q}/messages", body, JSON, ok=201)
    push = orjson.dumps({"items": [{"queue": q, "partition": "p0", "payload": {"note": BODY}}]})
    if op == "queen-push":
        return lambda: call("POST", "/api/v1/push", push, JSON, ok=201)

    async def pop_ack() -> None:
        await call("POST", "/api/v1/push", push, JSON, ok=201)
        got = orjson.loads(await call("GET", f"/api/v1/pop/queue/{q}?batch=1&wait=false", b"", {}))["messages"]
        acks = [{"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"],
                 "status": "completed"} for m in got]
        await call("POST", "/api/v1/ack/batch", orjson.dumps({"acknowledgments": acks}), JSON)
    return pop_ack


async def measure(server: sb.Child, out: Path, op: str, warmup: int, requests: int) -> float:
    """Instructions per ``op``, the idle window's count taken off."""
    http = RawHttp("127.0.0.1", server.port, timeout=120)
    try:
        one = await ops(http, op)
        for _ in range(warmup):
            await one()
        counted(server.proc.pid, "zero", out)
        t0 = time.monotonic()
        for _ in range(requests):
            await one()
        took = time.monotonic() - t0
        busy = counted(server.proc.pid, "dump", out)
        counted(server.proc.pid, "zero", out)
        await asyncio.sleep(took)
        idle = counted(server.proc.pid, "dump", out)
    finally:
        await http.close()
    return (busy - idle) / requests


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before-src", type=Path, required=True)
    p.add_argument("--after-src", type=Path, default=Path(__file__).resolve().parent.parent / "src")
    p.add_argument("--before-env", nargs="*", default=[], help="KEY=VALUE settings of the first server")
    p.add_argument("--after-env", nargs="*", default=[], help="KEY=VALUE settings of the second server")
    p.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS[:5]))
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--warmup", type=int, default=100)
    args = p.parse_args()
    results: dict[tuple[str, str], float] = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        for tree, src, extra in (("before", args.before_src, pairs(args.before_env)),
                                 ("after", args.after_src, pairs(args.after_env))):
            name = f"conveyor_instr_bench_{os.getpid()}_{tree}"
            dsn = sb.create_database(name, migrated=True)
            stack.callback(sb.drop_database, name)
            out = Path(tmp) / f"callgrind.{tree}"
            server = start(tree, dsn, src, out, extra)
            stack.callback(server.stop)
            for op in args.ops:
                results[op, tree] = uvloop.run(measure(server, out, op, args.warmup, args.requests))
                print(f"{op:20} {tree:6} {results[op, tree]:>12,.0f} instructions per request", flush=True)
            server.stop()
    print("\n| operation | before | after | after/before |\n|---|---:|---:|---:|")
    for op in args.ops:
        b, a = results[op, "before"], results[op, "after"]
        print(f"| {op} | {b:,.0f} | {a:,.0f} | {a / b:.3f} |")
    print(f"\ncommand: ./bin/bench instructions.py {' '.join(sys.argv[1:])}")


if __name__ == "__main__":
    main()
