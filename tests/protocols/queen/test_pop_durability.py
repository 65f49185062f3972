"""A pop's durability through the server (issue 26): a pop that only leases commits
without waiting for its WAL flush; an ack waits for its own. Counted on a cluster where
nothing else runs: pg_stat_wal's wal_sync (every flush of the WAL, the WAL writer's
included) over sequential pops, then over their acks."""

from __future__ import annotations

import time

import psycopg
import pytest

from support.server import ServerProcess

pytestmark = [pytest.mark.own_cluster, pytest.mark.slow]
CALLS = 30


def _wal_syncs(dsn: str) -> int:
    time.sleep(1.5)  # each backend reports its WAL counts within a second of going idle
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()[0]


def test_pops_that_lease_do_not_wait_for_a_flush_and_acks_do(dsn):
    server = ServerProcess(dsn).start()
    try:
        with server.client() as http:
            items = [{"queue": "lazy", "partition": f"p{i}", "payload": {"n": i}} for i in range(CALLS)]
            assert http.post("/api/v1/push", json={"items": items}).status_code == 201
            first = http.get("/api/v1/pop/queue/lazy", params={"batch": 1, "wait": "false"}).json()["messages"]
            http.post("/api/v1/ack/batch", json={"acknowledgments": [
                {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"],
                 "status": "completed"} for m in first]})  # the group is registered: its pop flushed
            before = _wal_syncs(dsn)
            popped = []
            for _ in range(CALLS - 1):
                r = http.get("/api/v1/pop/queue/lazy", params={"batch": 1, "wait": "false"})
                assert r.status_code == 200, r.text
                popped += r.json()["messages"]
            after_pops = _wal_syncs(dsn)
            assert len(popped) == CALLS - 1
            for m in popped:
                r = http.post("/api/v1/ack/batch", json={"acknowledgments": [
                    {"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                     "leaseId": m["leaseId"], "status": "completed"}]})
                assert r.status_code == 200 and r.json()[0]["success"] is True, r.text
            after_acks = _wal_syncs(dsn)
    finally:
        server.kill()
    pops, acks = after_pops - before, after_acks - after_pops
    # each ack waits for a flush (some of them counted after this test's reading: seen
    # 22 of 29); the pops' are the WAL writer's, a few a second, not one a pop (34 before)
    assert acks >= CALLS / 2, (pops, acks)
    assert pops < acks / 2, (pops, acks)
