"""What the server's commits wait for (issue 26): a Queen pop that only leases and a
receive from a standard queue commit without waiting for their WAL flush; the acks and
deletes after them wait for their own (docs/architecture.md, "Durability of a pop",
"Durability of a receive"). Counted on a cluster where nothing else runs:
pg_stat_wal's wal_sync (every flush of the WAL, the WAL writer's included) over
sequential claims, then over their acknowledgements, the WAL writer slowed down."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import httpx
import psycopg
import pytest

from support.server import ServerProcess

pytestmark = [pytest.mark.own_cluster, pytest.mark.slow]
CALLS = 30


def _wal_syncs(dsn: str) -> int:
    time.sleep(1.5)  # each backend reports its WAL counts within a second of going idle
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()[0]


def _wal_writer_delay(dsn: str, delay: str | None) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET wal_writer_delay = '{delay}'" if delay else "ALTER SYSTEM RESET wal_writer_delay")
        conn.execute("SELECT pg_reload_conf()")


@pytest.fixture
def http(dsn) -> Iterator[httpx.Client]:
    # the WAL writer flushes what asynchronous commits left every wal_writer_delay (200 ms):
    # at 10 s, a busy machine's slower calls do not blur the count
    _wal_writer_delay(dsn, "10s")
    server = ServerProcess(dsn).start()
    try:
        with server.client() as client:
            yield client
    finally:
        server.kill()
        _wal_writer_delay(dsn, None)


def _flushes(dsn: str, claim: Callable[[], dict], settle: Callable[[dict], None]) -> tuple[int, int]:
    """WAL flushes over CALLS - 1 claims one after the other, then over their settling."""
    before = _wal_syncs(dsn)
    claimed = [claim() for _ in range(CALLS - 1)]
    after_claims = _wal_syncs(dsn)
    for one in claimed:
        settle(one)
    claims, settles = after_claims - before, _wal_syncs(dsn) - after_claims
    # each settling waits for a flush (some of them counted after the last reading: seen 22
    # of 29); the claims wait for none (seen 1-5, the server's own background work; 34 for
    # 29 pops, 30 for 29 receives, before)
    assert settles >= CALLS / 2, (claims, settles)
    assert claims <= settles / 3, (claims, settles)
    return claims, settles


def test_pops_that_lease_do_not_wait_for_a_flush_and_acks_do(dsn, http):
    items = [{"queue": "lazy", "partition": f"p{i}", "payload": {"n": i}} for i in range(CALLS)]
    assert http.post("/api/v1/push", json={"items": items}).status_code == 201

    def pop() -> dict:
        r = http.get("/api/v1/pop/queue/lazy", params={"batch": 1, "wait": "false"})
        assert r.status_code == 200, r.text
        [message] = r.json()["messages"]
        return message

    def ack(m: dict) -> None:
        r = http.post("/api/v1/ack/batch", json={"acknowledgments": [
            {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"],
             "status": "completed"}]})
        assert r.status_code == 200 and r.json()[0]["success"] is True, r.text

    ack(pop())  # the group is registered: that pop flushed
    _flushes(dsn, pop, ack)


def test_receives_do_not_wait_for_a_flush_and_deletes_do(dsn, http):
    assert http.post("/v1/queues", json={"name": "lazy"}).status_code == 201
    r = http.post("/v1/queues/lazy/messages", json=[{"message": str(i)} for i in range(CALLS)])
    assert r.status_code == 201, r.text

    def receive() -> dict:
        r = http.get("/v1/queues/lazy/messages", params={"max": 1})
        assert r.status_code == 200, r.text
        [message] = r.json()
        return message

    def delete(m: dict) -> None:
        r = http.delete(f"/v1/queues/lazy/messages/{m['id']}", params={"receipt": m["receipt"]})
        assert r.status_code == 204, r.text

    _flushes(dsn, receive, delete)
