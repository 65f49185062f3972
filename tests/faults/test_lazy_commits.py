"""A crash after claims that did not wait for their flush (a Queen pop's lease, a receive
from a standard queue: docs/architecture.md, "Durability of a pop" and "Durability of a
receive"): what was acknowledged after them stays acknowledged, and what was claimed
but not acknowledged is delivered again. PostgreSQL stopped with `-m immediate` (a crash:
no shutdown checkpoint; recovery replays the WAL that reached the disk)."""

from __future__ import annotations

import contextlib
import time

import httpx
import pytest

from support.server import ServerProcess

pytestmark = pytest.mark.slow
N = 20


def _crash_and_restart(cluster) -> None:
    cluster._pg_ctl("stop", "-w", "-m", "immediate", timeout=60)
    cluster.start()


def _until(fetch, want: int, seconds: float = 30.0) -> list[dict]:
    """What ``fetch`` returns, gathered until ``want`` items came or ``seconds`` passed
    (the server reconnects after the restart; leases and timeouts run out meanwhile)."""
    got: list[dict] = []
    deadline = time.monotonic() + seconds
    while len(got) < want and time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            got += fetch()
        time.sleep(0.2)
    return got


def test_a_crash_redelivers_what_was_popped_and_keeps_what_was_acked(cluster):
    server = ServerProcess(cluster.dsn).start()
    try:
        with server.client() as http:
            # leases of 2 s (the queue's leaseTime: Queen's pop takes no lease length)
            assert http.post("/api/v1/configure", json={"queue": "crash", "options": {"leaseTime": 2}}).status_code < 300
            items = [{"queue": "crash", "partition": f"p{i}", "payload": {"n": i}} for i in range(N + 1)]
            assert http.post("/api/v1/push", json={"items": items}).status_code == 201

            def pop() -> list[dict]:
                r = http.get("/api/v1/pop/queue/crash", params={"batch": 1, "wait": "false"})
                return r.json()["messages"] if r.status_code == 200 else []

            def ack(m: dict) -> None:
                r = http.post("/api/v1/ack/batch", json={"acknowledgments": [
                    {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                     "leaseId": m["leaseId"], "status": "completed"}]})
                assert r.json()[0]["success"] is True, r.text

            [first] = pop()  # registers the group: that pop flushed
            ack(first)
            popped = [m for _ in range(N) for m in pop()]
            assert len(popped) == N
            acked, left = popped[: N // 2], popped[N // 2:]
            for m in acked:
                ack(m)
            _crash_and_restart(cluster)
            again = _until(pop, len(left))
    finally:
        server.kill()
    assert sorted(m["data"]["n"] for m in again) == sorted(m["data"]["n"] for m in left)


def test_a_crash_redelivers_what_was_received_and_keeps_what_was_deleted(cluster):
    server = ServerProcess(cluster.dsn).start()
    try:
        with server.client() as http:
            assert http.post("/v1/queues", json={"name": "crash"}).status_code == 201
            assert http.post("/v1/queues/crash/messages", json=[{"message": str(i)} for i in range(N)]).status_code == 201

            def receive() -> list[dict]:
                r = http.get("/v1/queues/crash/messages", params={"max": 1, "vt": 2})
                return r.json() if r.status_code == 200 else []

            received = [m for _ in range(N) for m in receive()]
            assert len(received) == N
            deleted, left = received[: N // 2], received[N // 2:]
            for m in deleted:
                r = http.delete(f"/v1/queues/crash/messages/{m['id']}", params={"receipt": m["receipt"]})
                assert r.status_code == 204, r.text
            _crash_and_restart(cluster)
            again = _until(receive, len(left))
    finally:
        server.kill()
    assert sorted(m["id"] for m in again) == sorted(m["id"] for m in left)
