"""The failover spool end to end (issue 16, item 1): PostgreSQL stops, 10,000 messages
are sent (REST, to a FIFO queue in groups and to a standard queue, and Queen pushes to
partitions), the server is SIGKILLed half-way, both start again: every acknowledged
message is stored exactly once, in order per FIFO group and per partition. Meanwhile,
what cannot be spooled fails fast."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import stat
import struct
import subprocess
import time
import uuid
import zlib
from pathlib import Path

import httpx
import orjson
import psycopg
import pytest

from conveyor.core import partitioned, queues
from conveyor.db import pool
from support.server import ServerProcess

GROUPS = 8
PER_GROUP = 1250  # 10,000 REST sends in all
PARTITIONS = 4
PER_PARTITION = 150
KILL_AFTER = 5000

# seconds: a fsync (the spool's, the test cluster's commit) can wait tens of seconds
# behind a busy machine's disk (seen in CI beside the Spark tests); the server's own
# request deadline (30 s) answers first
CLIENT_TIMEOUT = 45


async def _send_group(c: httpx.AsyncClient, group: int, acked: list[tuple[int, int]], stop: asyncio.Event) -> None:
    """One FIFO group's messages in order, one request each (a group's next message is
    sent once the previous one was acknowledged, as a real producer of a group does)."""
    for i in range(PER_GROUP):
        if stop.is_set():
            return
        queue = "spooled.fifo" if group % 2 == 0 else "spooled-std"
        try:
            r = await c.post(f"/v1/queues/{queue}/messages",
                             json={"message": f"{group}:{i}", "group_id": f"g{group}", "dedup_id": f"{group}:{i}"}
                             if queue.endswith(".fifo") else {"message": f"{group}:{i}"})
        except httpx.HTTPError:
            return  # the server is gone
        if r.status_code not in (201, 202):
            return
        acked.append((group, i))
        if len(acked) >= KILL_AFTER:
            stop.set()


async def _push_partition(c: httpx.AsyncClient, part: int, acked: list[tuple[int, int]], stop: asyncio.Event) -> None:
    for i in range(PER_PARTITION):
        if stop.is_set():
            return
        try:
            r = await c.post("/api/v1/push", json={"items": [{"queue": "spooled-pq", "partition": f"p{part}",
                                                              "payload": {"n": i}}]})
        except httpx.HTTPError:
            return
        if r.status_code != 201:
            return
        acked.append((part, i))


async def test_writes_taken_while_postgres_is_down_survive_a_sigkill(cluster, tmp_path: Path):
    dsn = cluster.dsn
    async with pool.connect(dsn) as conn:
        from conveyor.db import migrate

        await migrate.migrate(conn)
        await queues.create(conn, "spooled.fifo")
        await queues.create(conn, "spooled-std")
        await partitioned.configure(conn, "spooled-pq", {})
    env = {"CONVEYOR_SPOOL_DIR": str(tmp_path / "spool"), "CONVEYOR_LOG_LEVEL": "warning"}
    server = ServerProcess(dsn, env=env).start()
    sent: list[tuple[int, int]] = []
    pushed: list[tuple[int, int]] = []
    async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": "t"}, timeout=CLIENT_TIMEOUT) as c:
        for queue in ("spooled.fifo", "spooled-std"):  # the server learns the queues while it can
            body = {"message": "warm", "group_id": "warm", "dedup_id": "warm"} if queue.endswith("fifo") else {
                "message": "warm"}
            assert (await c.post(f"/v1/queues/{queue}/messages", json=body)).status_code == 201
        assert (await c.post("/api/v1/push", json={"items": [{"queue": "spooled-pq", "partition": "warm",
                                                               "payload": 0}]})).status_code == 201

        await asyncio.to_thread(cluster.stop)  # the outage

        # what cannot be spooled fails at once, not after the pool's timeout
        await c.get("/v1/queues/spooled-std/messages")  # the first call finds out
        started = time.monotonic()
        refused = await c.get("/v1/queues/spooled-std/messages")
        assert refused.status_code == 503 and time.monotonic() - started < 1.0
        spooled = await c.post("/v1/queues/spooled-std/messages", json={"message": "probe"})
        assert spooled.status_code == 202 and spooled.json()["spooled"] is True
        sent.append((1, -1))  # the probe: group 1 is a standard-queue group, -1 sorts first

        stop = asyncio.Event()
        began = time.monotonic()
        await asyncio.gather(*(_send_group(c, g, sent, stop) for g in range(GROUPS)),
                             *(_push_partition(c, p, pushed, stop) for p in range(PARTITIONS)))
        took = time.monotonic() - began
    server.proc.kill()  # SIGKILL half-way: the spool is all there is
    await asyncio.to_thread(server.proc.wait, 10)
    assert len(sent) >= KILL_AFTER - GROUPS, "the load ran until the kill"
    print(f"\n{len(sent)} sends and {len(pushed)} pushes acknowledged from the spool in {took:.1f} s")

    await asyncio.to_thread(cluster.start)
    began = time.monotonic()
    restarted = ServerProcess(dsn, env=env).start(timeout=120)  # replays the leftovers before it listens
    print(f"restart with replay: {time.monotonic() - began:.1f} s")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            rows = conn.execute("SELECT q.name, m.body, m.group_id FROM conveyor.messages m JOIN conveyor.queues q "
                                "ON q.id = m.queue_id WHERE m.body <> 'warm' ORDER BY m.queue_id, m.id").fetchall()
            parts = conn.execute("SELECT p.name, m.payload FROM conveyor.partition_messages m JOIN conveyor.partitions "
                                 "p ON p.id = m.partition_id WHERE p.name <> 'warm' ORDER BY p.name, m.seq").fetchall()
        stored = collections.Counter((name, body) for name, body, _ in rows)
        for group, i in sent:
            queue = "spooled.fifo" if group % 2 == 0 else "spooled-std"
            body = "probe" if i == -1 else f"{group}:{i}"
            assert stored[(queue, body)] == 1, f"{queue} {body} stored {stored[(queue, body)]} times"
        assert sum(stored.values()) == len(sent), "nothing unacknowledged stored twice, nothing extra"
        for group in range(0, GROUPS, 2):  # FIFO groups: in the order acknowledged
            got = [int(body.split(":")[1]) for name, body, g in rows if g == f"g{group}"]
            assert got == sorted(got) and len(got) == len({i for g, i in sent if g == group})
        for part in range(PARTITIONS):
            got = [payload["n"] for name, payload in parts if name == f"p{part}"]
            assert got == [i for p, i in sorted(pushed) if p == part]
        assert not list((tmp_path / "spool").glob("slot-*/*.spool")), "the journal is empty once replayed"
    finally:
        restarted.kill()


async def test_a_live_server_replays_when_postgres_returns_keeping_order(cluster, tmp_path: Path):
    dsn = cluster.dsn
    async with pool.connect(dsn) as conn:
        from conveyor.db import migrate

        await migrate.migrate(conn)
        await queues.create(conn, "live.fifo")
    env = {"CONVEYOR_SPOOL_DIR": str(tmp_path / "spool"), "CONVEYOR_SPOOL_MAX_BYTES": "200000"}
    server = ServerProcess(dsn, env=env).start()
    try:
        async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": "t"}, timeout=CLIENT_TIMEOUT) as c:
            async def send(i: int) -> int:
                r = await c.post("/v1/queues/live.fifo/messages", json={"message": str(i), "group_id": "g",
                                                                        "dedup_id": str(i)})
                return r.status_code

            assert await send(0) == 201
            await asyncio.to_thread(cluster.stop)
            codes = [await send(i) for i in range(1, 301)]
            assert set(codes) <= {202, 503} and codes.count(202) >= 290  # the first may find the outage
            full = await c.post("/v1/queues/live.fifo/messages", json={"message": "x" * 300000, "group_id": "g",
                                                                       "dedup_id": "big"})
            assert full.status_code == 503 and "spool is full" in full.json()["error"]
            await asyncio.to_thread(cluster.start)
            later = []
            for i in range(301, 400):  # sent while the replay runs: behind the spooled ones
                later.append(await send(i))
                await asyncio.sleep(0.005)
            assert set(later) <= {201, 202}
            for _ in range(100):  # bounded: 10 s
                if (await send(400)) == 201 and not list((tmp_path / "spool").glob("slot-*/*.spool")):
                    break
                await asyncio.sleep(0.1)
            got = [m["message"] for m in (await c.get("/v1/queues/live.fifo/messages", params={"max": 1000,
                                                                                             "fifo": "true"})).json()]
        acked = [0] + [i for i, code in zip(range(1, 301), codes, strict=True) if code == 202] + list(range(301, 401))
        assert [int(x) for x in got] == sorted(set(int(x) for x in got))  # group order
        assert sorted({int(x) for x in got}) == sorted(set(acked)) and len(got) == len(set(got))
    finally:
        server.kill()


async def test_sqs_sends_spool_only_when_allowed_and_keep_their_message_id(cluster, tmp_path: Path):
    import boto3

    dsn = cluster.dsn
    async with pool.connect(dsn) as conn:
        from conveyor.db import migrate

        await migrate.migrate(conn)
        await queues.create(conn, "sqs-std")
    for allowed in (False, True):
        env = {"CONVEYOR_SPOOL_DIR": str(tmp_path / f"spool-{allowed}"), "CONVEYOR_SPOOL_SQS": str(allowed).lower()}
        server = ServerProcess(dsn, env=env).start()
        try:
            sqs = boto3.client("sqs", endpoint_url=server.url, region_name="us-east-1", aws_access_key_id="x",
                               aws_secret_access_key="y", config=__import__("botocore").config.Config(
                                   retries={"max_attempts": 1}))
            url = f"{server.url}/000000000000/sqs-std"
            await asyncio.to_thread(sqs.send_message, QueueUrl=url, MessageBody="warm")
            await asyncio.to_thread(cluster.stop)
            try:
                if allowed:
                    sent = await asyncio.to_thread(sqs.send_message, QueueUrl=url, MessageBody="while down")
                else:
                    try:
                        await asyncio.to_thread(sqs.send_message, QueueUrl=url, MessageBody="refused")
                        raise AssertionError("an SQS send was spooled without CONVEYOR_SPOOL_SQS")
                    except sqs.exceptions.ClientError as exc:
                        assert exc.response["ResponseMetadata"]["HTTPStatusCode"] == 503
            finally:
                await asyncio.to_thread(cluster.start)
            if allowed:
                for _ in range(100):  # bounded: 10 s for the replay
                    try:
                        got = await asyncio.to_thread(sqs.receive_message, QueueUrl=url, MaxNumberOfMessages=10)
                    except sqs.exceptions.ClientError:  # until the server sees the database again
                        await asyncio.sleep(0.1)
                        continue
                    ids = {m["MessageId"]: m["Body"] for m in got.get("Messages", [])}
                    if sent["MessageId"] in ids:
                        assert ids[sent["MessageId"]] == "while down"
                        break
                    await asyncio.sleep(0.1)
                else:
                    raise AssertionError("the spooled SQS message never landed under its MessageId")
        finally:
            server.kill()


async def _stored_bodies(dsn: str, queue: str) -> collections.Counter[str]:
    async with pool.connect(dsn) as conn:
        cur = await conn.execute("SELECT m.body FROM conveyor.messages m JOIN conveyor.queues q ON q.id = m.queue_id "
                                 "WHERE q.name = %s", (queue,))
        return collections.Counter(body for (body,) in await cur.fetchall())


def _journal(spool_dir: Path) -> list[Path]:
    """The segments waiting to be replayed."""
    return list(spool_dir.glob("slot-*/*.spool"))


async def _until_replayed(c: httpx.AsyncClient, spool_dir: Path, queue: str) -> None:
    """Bounded (10 s): until the server answers a send with 201 again and its journal is empty."""
    for _ in range(100):
        r = await c.post(f"/v1/queues/{queue}/messages", json={"message": "after"})
        if r.status_code == 201 and not _journal(spool_dir):
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the spool was not replayed within 10 s")


async def test_the_first_write_after_a_fast_shutdown_is_spooled_not_refused(cluster, tmp_path: Path):
    """Issue 25, item 11: ``pg_ctl stop -m fast`` terminates every backend ("terminating
    connection due to administrator command", 57P01) before the first send after it runs:
    that send never ran, so it is spooled like the 99 after it, not answered 503."""
    dsn = cluster.dsn
    async with pool.connect(dsn) as conn:
        from conveyor.db import migrate

        await migrate.migrate(conn)
        await queues.create(conn, "first-std")
    spool_dir = tmp_path / "spool"
    server = ServerProcess(dsn, env={"CONVEYOR_SPOOL_DIR": str(spool_dir)}).start()
    try:
        async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": "t"}, timeout=CLIENT_TIMEOUT) as c:
            for _ in range(5):  # the pool's connections are open and idle
                assert (await c.post("/v1/queues/first-std/messages", json={"message": "warm"})).status_code == 201
            await asyncio.to_thread(cluster.stop)  # pg_ctl stop -m fast
            codes = [(await c.post("/v1/queues/first-std/messages", json={"message": f"m{i}"})).status_code
                     for i in range(100)]
            assert codes == [202] * 100, f"answers while the database is down: {collections.Counter(codes)}"
            await asyncio.to_thread(cluster.start)
            await _until_replayed(c, spool_dir, "first-std")
        stored = await _stored_bodies(dsn, "first-std")
        assert all(stored[f"m{i}"] == 1 for i in range(100)), "every spooled send stored once"
    finally:
        server.kill()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _old_frame(body: dict) -> bytes:
    """A journal record as versions before issue 25 wrote it: length | crc32 | JSON."""
    payload = orjson.dumps(body)
    return struct.pack(">II", len(payload), zlib.crc32(payload)) + payload


async def test_a_damaged_byte_costs_one_write_and_the_segment_is_kept(cluster, tmp_path: Path):
    """Issue 25, items 9 and 12: 30 writes spooled by a real server, SIGKILLed; one byte of
    the 16th is damaged on disk, and a segment of the previous format is left beside it.
    The next server replays the other 29 and the old one, sets the damaged write aside in
    rejected.jsonl, keeps the segment as .damaged; everything it wrote is private."""
    dsn = cluster.dsn
    async with pool.connect(dsn) as conn:
        from conveyor.db import migrate

        await migrate.migrate(conn)
        await queues.create(conn, "damaged-std")
    spool_dir = tmp_path / "spool"
    env = {"CONVEYOR_SPOOL_DIR": str(spool_dir)}
    server = ServerProcess(dsn, env=env).start()
    try:
        async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": "t"}, timeout=CLIENT_TIMEOUT) as c:
            assert (await c.post("/v1/queues/damaged-std/messages", json={"message": "warm"})).status_code == 201
            await asyncio.to_thread(cluster.stop)
            await c.get("/v1/queues/damaged-std/messages")  # finds the outage
            for i in range(30):
                r = await c.post("/v1/queues/damaged-std/messages", json={"message": f"m{i}"})
                assert r.status_code == 202, r.text
    finally:
        server.kill()
    [segment] = _journal(spool_dir)
    assert (_mode(spool_dir), _mode(segment.parent), _mode(segment)) == (0o700, 0o700, 0o600)
    data = bytearray(segment.read_bytes())
    data[data.index(b'"m15"') + 1] ^= 0x20  # "m15" -> "M15": its checksum no longer matches
    segment.write_bytes(bytes(data))
    old = segment.parent / "1.spool"  # older than any segment of this version: replayed first
    old.write_bytes(_old_frame({"kind": "send", "queue": "damaged-std", "sealed": False,
                                "messages": [{"body": "from the previous version",
                                              "message_uuid": str(uuid.uuid4())}]}))

    await asyncio.to_thread(cluster.start)
    restarted = ServerProcess(dsn, env=env).start(timeout=60)  # replays the leftovers before it listens
    restarted.kill()
    stored = await _stored_bodies(dsn, "damaged-std")
    assert stored == collections.Counter(["warm", "from the previous version"]
                                         + [f"m{i}" for i in range(30) if i != 15])
    [aside] = [orjson.loads(line) for line in (segment.parent / "rejected.jsonl").read_bytes().splitlines()]
    assert aside["key"].startswith(f"slot-0/{segment.stem}/") and "damaged" in aside["reason"]
    kept = segment.parent / (segment.name + ".damaged")
    assert kept.read_bytes() == bytes(data), "the damaged segment is kept as it was found"
    assert _mode(kept) == 0o600 and _mode(segment.parent / "rejected.jsonl") == 0o600
    assert not _journal(spool_dir) and not old.exists()


def _fill(directory: Path) -> Path:
    """Fill the file system of ``directory`` to the last byte."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as out:
        for size in (1 << 16, 1 << 12, 1):
            with contextlib.suppress(OSError):
                while True:
                    out.write(b"\0" * size)
    return filler


async def test_writes_refused_on_a_full_disk_are_never_stored(cluster, tmp_path: Path):
    """Issue 25, item 10, on a real full disk (a 1 MiB tmpfs): sends refused (503) because the
    journal cannot be written are cut off it, so a later successful write does not carry
    them along (clients retry 503s: they would be stored twice), and nothing of them is
    left to be set aside as damage."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"a small tmpfs needs mount privileges: {mounted.stderr.strip()}")
    server: ServerProcess | None = None
    try:
        dsn = cluster.dsn
        async with pool.connect(dsn) as conn:
            from conveyor.db import migrate

            await migrate.migrate(conn)
            await queues.create(conn, "full-std")
        spool_dir = disk / "spool"
        server = ServerProcess(dsn, env={"CONVEYOR_SPOOL_DIR": str(spool_dir)}).start()
        async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": "t"}, timeout=CLIENT_TIMEOUT) as c:
            async def send(body: str) -> int:
                return (await c.post("/v1/queues/full-std/messages", json={"message": body})).status_code

            assert await send("warm") == 201
            await asyncio.to_thread(cluster.stop)
            assert await send("first") == 202
            filler = await asyncio.to_thread(_fill, disk)
            refused = [await send(f"refused {i} " + "x" * 5000) for i in range(3)]  # more than the page left
            assert refused == [503] * 3
            filler.unlink()
            assert await send("after the disk was freed") == 202
            await asyncio.to_thread(cluster.start)
            await _until_replayed(c, spool_dir, "full-std")
        stored = await _stored_bodies(dsn, "full-std")
        assert not [body for body in stored if body.startswith("refused")], "a write answered 503 was stored"
        assert stored["first"] == 1 and stored["after the disk was freed"] == 1
        assert not list(spool_dir.glob("slot-*/rejected.jsonl")) and not list(spool_dir.glob("slot-*/*.damaged"))
    finally:
        if server is not None:
            server.kill()
        subprocess.run(["umount", str(disk)], check=False)
