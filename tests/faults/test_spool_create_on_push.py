"""Queen's create-on-push bounds hold across a database outage (issue 25, item 6): while
PostgreSQL is down, a push naming a queue the server does not know is taken by the
failover spool only if its caller may create that many queues (else 503: it cannot be
checked now), and the bound on all queues is checked when the spool is replayed (a
record beyond it is set aside, as any record the database refuses)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx

from conveyor.core import partitioned
from conveyor.db import migrate, pool
from support.server import ServerProcess

ADMIN = {"Authorization": "Bearer admin-token"}
WRITER = {"Authorization": "Bearer writer-token"}

# seconds: a fsync (the spool's, the test cluster's commit) can wait tens of seconds
# behind a busy machine's disk (seen in CI beside the Spark tests); the server's own
# request deadline (30 s) answers first
CLIENT_TIMEOUT = 45


def _push(c: httpx.AsyncClient, headers: dict[str, str], *queues: str):
    return c.post("/api/v1/push", headers=headers, json={"items": [{"queue": q, "payload": q} for q in queues]})


def _counter(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


async def test_spooled_pushes_create_queues_only_within_their_bounds(cluster, tmp_path: Path):
    dsn = cluster.dsn
    async with pool.connect(dsn) as conn:
        await migrate.migrate(conn)
        await partitioned.configure(conn, "known", {})
    env = {"CONVEYOR_SPOOL_DIR": str(tmp_path / "spool"), "CONVEYOR_AUTH": "token",
           "CONVEYOR_AUTH_TOKENS": "admin-token:admin,writer-token:write", "CONVEYOR_QUEEN_CREATE_ON_PUSH": "admin",
           "CONVEYOR_QUEEN_CREATE_PER_PUSH": "1", "CONVEYOR_QUEEN_CREATE_MAX_QUEUES": "2"}
    server = ServerProcess(dsn, env=env).start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=CLIENT_TIMEOUT) as c:
            assert (await _push(c, WRITER, "known")).status_code == 201  # the server learns the queue
            await asyncio.to_thread(cluster.stop)
            await c.get("/api/v1/resources/overview", headers=ADMIN)  # the first call finds the outage
            spooled = await _push(c, WRITER, "known")
            assert spooled.status_code == 201 and spooled.json()[0]["status"] == "buffered", spooled.text
            for headers, queues in ((WRITER, ["new-a"]), (ADMIN, ["new-b", "new-c"])):
                r = await _push(c, headers, *queues)  # the writer may create none; a push, one
                assert r.status_code == 503 and "not known to this server" in r.json()["error"], r.text
            for queue in ("new-a", "new-b"):  # each within the admin's share; the bound on all is checked later
                r = await _push(c, ADMIN, queue)
                assert r.status_code == 201 and r.json()[0]["status"] == "buffered", r.text
            await asyncio.to_thread(cluster.start)
            for _ in range(100):  # bounded: 10 s
                if not list((tmp_path / "spool").glob("slot-*/*.spool")):
                    break
                await asyncio.sleep(0.1)
            metrics = (await c.get("/metrics")).text
        async with pool.connect(dsn) as conn:
            assert sorted(q.name for q in await partitioned.list_all(conn)) == ["known", "new-a"]
            rows = await (await conn.execute(
                "SELECT q.name, m.payload FROM conveyor.partition_messages m JOIN conveyor.partitions p "
                "ON p.id = m.partition_id JOIN conveyor.pqueues q ON q.id = p.queue_id ORDER BY q.name, m.seq")).fetchall()
        assert rows == [("known", "known"), ("known", "known"), ("new-a", "new-a")]
        assert _counter(metrics, "pqueue_queues_created_on_push_total") == 1
        assert _counter(metrics, "conveyor_spool_rejected_total") == 1  # new-b: past the bound, set aside
        assert "new-b" in "".join(p.read_text() for p in (tmp_path / "spool").glob("slot-*/rejected.jsonl"))
    finally:
        server.kill()
