"""The failover spool's journal (conveyor.server.spool): durable appends with one fsync
for many, torn tails ignored, damaged records skipped one by one and set aside, segments
of the previous format still read, failed writes cut off, private files, slots per
process, bounded size."""

from __future__ import annotations

import asyncio
import os
import resource
import stat
import struct
import uuid
import zlib
from pathlib import Path

import orjson
import pytest

from conveyor import errors
from conveyor.core import messages, queues, spooled
from conveyor.db.pool import Database
from conveyor.server.broker import ServerBroker
from conveyor.server.metrics import Metrics
from conveyor.server.spool import Spool
from conveyor.settings import Settings


async def test_appends_come_back_in_order_with_keys_that_are_never_reused(tmp_path):
    spool = Spool(tmp_path, 1 << 20)
    keys = await asyncio.gather(*(spool.append({"n": i}) for i in range(50)))  # one group commit or a few
    assert len(set(keys)) == 50 and spool.waiting == 50
    assert [r.body["n"] for r in spool.records()] == list(range(50))
    assert [r.key for r in spool.records()] == keys
    spool.seal_segment()
    later = await spool.append({"n": 50})
    assert later.split("/")[1] != keys[0].split("/")[1]  # a new segment
    spool.close()
    again = Spool(tmp_path, 1 << 20)  # a restart finds them all
    assert [r.body["n"] for r in again.records()] == list(range(51)) and again.waiting == 51
    again.close()


async def _segment_of(tmp_path: Path, count: int) -> tuple[Path, list[str]]:
    """A closed segment of ``count`` records ``{"n": i}``, and their keys."""
    spool = Spool(tmp_path, 1 << 20)
    keys = [await spool.append({"n": i}) for i in range(count)]
    [segment] = spool.segments()
    spool.close()
    return segment, keys


def _offset(key: str) -> int:
    return int(key.rsplit("/", 1)[1])


@pytest.mark.parametrize("cut", [3, 10, 20, 26])  # in the marker, the header, the payload (of 28)
async def test_a_torn_tail_is_ignored(tmp_path, cut):
    segment, _ = await _segment_of(tmp_path, 4)
    whole = segment.read_bytes()
    spool = Spool(tmp_path, 1 << 20)
    await spool.append({"n": "torn"})
    [_, second] = spool.segments()
    spool.close()
    segment.write_bytes(whole + second.read_bytes()[:cut])  # a crash mid-write, then a restart
    second.unlink()
    again = Spool(tmp_path, 1 << 20)
    assert [r.body["n"] for r in again.records()] == [0, 1, 2, 3]
    assert again.read(segment).damage == []  # never acknowledged: nothing to set aside
    segment.write_bytes(whole + bytes(100))  # a file extended without its data (zeros)
    assert again.read(segment).damage == [] and len(again.read(segment).records) == 4
    again.close()


@pytest.mark.parametrize("where", [0, 5, 9, 13, 18, -2])  # marker, length, crcs, payload, its last byte
async def test_a_damaged_byte_costs_one_record_not_the_rest_of_the_segment(tmp_path, where):
    segment, keys = await _segment_of(tmp_path, 10)
    data = bytearray(segment.read_bytes())
    at = _offset(keys[5]) + where if where >= 0 else _offset(keys[6]) + where
    data[at] ^= 0x10
    segment.write_bytes(bytes(data))
    spool = Spool(tmp_path, 1 << 20)
    assert [r.body["n"] for r in spool.records()] == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    assert [r.key for r in spool.records()] == keys[:5] + keys[6:]
    [damage] = spool.read(segment).damage
    assert damage.key == keys[5] and damage.offset == _offset(keys[5])
    assert damage.length == _offset(keys[6]) - _offset(keys[5])
    spool.close()


async def test_damage_in_the_last_record_is_not_taken_for_a_torn_tail(tmp_path):
    segment, keys = await _segment_of(tmp_path, 3)
    data = bytearray(segment.read_bytes())
    data[_offset(keys[2]) + 6] ^= 0x01  # its length: the header fails its own checksum
    segment.write_bytes(bytes(data))
    spool = Spool(tmp_path, 1 << 20)
    assert [r.body["n"] for r in spool.records()] == [0, 1]
    [damage] = spool.read(segment).damage
    assert damage.key == keys[2] and damage.offset + damage.length == len(data)
    spool.close()


async def test_damaged_segments_are_kept_and_set_aside(tmp_path):
    segment, keys = await _segment_of(tmp_path, 3)
    data = bytearray(segment.read_bytes())
    data[-3] ^= 0xFF
    segment.write_bytes(bytes(data))
    spool = Spool(tmp_path, 1 << 20)
    contents = spool.read(segment)
    kept = spool.keep_damaged(segment, contents.damage)
    assert kept.name == segment.name + ".damaged" and kept.read_bytes() == bytes(data)  # as it was found
    assert spool.segments() == [] and spool.size == 0
    [line] = (spool.slot_dir / "rejected.jsonl").read_bytes().splitlines()
    aside = orjson.loads(line)
    assert aside["key"] == keys[2] and "damaged" in aside["reason"] and aside["segment"] == kept.name
    spool.close()
    assert [r.body["n"] for r in Spool(tmp_path, 1 << 20).records()] == []  # never replayed again


def _old_frame(body: dict) -> bytes:
    """A record as versions before issue 25 wrote it: length | crc32 | JSON."""
    payload = orjson.dumps(body)
    return struct.pack(">II", len(payload), zlib.crc32(payload)) + payload


async def test_segments_of_the_previous_format_still_replay(tmp_path):
    """A server upgraded with writes still in its spool replays them: segments without the
    marker are read with the previous framing, damage in them skipped the same way."""
    Spool(tmp_path, 1 << 20).close()  # the slot directory
    frames = [_old_frame({"kind": "send", "n": i}) for i in range(5)]
    old = tmp_path / "slot-0" / "1700000000000000000.spool"
    data = bytearray(b"".join(frames))
    old.write_bytes(bytes(data))
    spool = Spool(tmp_path, 1 << 20)
    assert [r.body["n"] for r in spool.records()] == [0, 1, 2, 3, 4] and spool.waiting == 5
    offsets = [sum(len(f) for f in frames[:i]) for i in range(5)]
    assert [_offset(r.key) for r in spool.records()] == offsets  # the keys the previous version gave them
    spool.close()
    for where in (2, len(frames[2]) - 2):  # its length, its payload
        damaged = bytearray(data)
        damaged[offsets[2] + where] ^= 0x04
        old.write_bytes(bytes(damaged))
        spool = Spool(tmp_path, 1 << 20)
        assert [r.body["n"] for r in spool.records()] == [0, 1, 3, 4]
        assert [d.offset for d in spool.read(old).damage] == [offsets[2]]
        spool.close()
    old.write_bytes(bytes(data) + _old_frame({"n": "torn"})[:-3])  # its torn tail is ignored as before
    spool = Spool(tmp_path, 1 << 20)
    assert spool.waiting == 5 and spool.read(old).damage == []
    spool.close()


async def test_a_failed_write_is_cut_off_and_never_replayed(tmp_path):
    """The file size limit (RLIMIT_FSIZE) makes the kernel refuse a write half-way, as a full
    disk does: the refused write is cut off the segment, and the next one does not carry
    it along (tests/faults/test_spool.py does the same on a real full disk)."""
    spool = Spool(tmp_path, 1 << 20)
    await spool.append({"n": 0})
    [segment] = spool.segments()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (segment.stat().st_size + 100, hard))
    try:
        with pytest.raises(errors.Unavailable, match="cannot be written"):
            await spool.append({"n": "refused", "pad": "x" * 1000})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    await spool.append({"n": 2})
    spool.close()
    again = Spool(tmp_path, 1 << 20)
    assert [r.body["n"] for r in again.records()] == [0, 2] and again.read(segment).damage == []
    again.close()


async def test_the_spool_is_private_whatever_the_umask(tmp_path):
    old_umask = os.umask(0)
    try:
        spool = Spool(tmp_path / "spool", 1 << 20)
        await spool.append({"secret": "body"})
        [segment] = spool.segments()
        spool.reject(next(spool.records()), "refused")
    finally:
        os.umask(old_umask)

    def mode(p: Path) -> int:
        return stat.S_IMODE(p.stat().st_mode)

    assert mode(tmp_path / "spool") == 0o700 and mode(spool.slot_dir) == 0o700
    assert mode(segment) == 0o600 and mode(spool.slot_dir / "rejected.jsonl") == 0o600
    spool.close()
    # what an earlier version left (0755, 0644) is tightened when the slot is taken
    os.chmod(spool.slot_dir, 0o755)
    os.chmod(segment, 0o644)
    again = Spool(tmp_path / "spool", 1 << 20)
    assert mode(again.slot_dir) == 0o700 and mode(segment) == 0o600
    again.close()


async def test_a_slot_that_is_not_a_directory_of_ours_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "slot-0").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(RuntimeError, match="not a directory of this user"):
        Spool(tmp_path, 1 << 20)


async def test_each_process_takes_a_slot_of_its_own(tmp_path):
    first, second = Spool(tmp_path, 1 << 20), Spool(tmp_path, 1 << 20)
    assert first.slot != second.slot
    await first.append({"who": "first"})
    first.close()
    third = Spool(tmp_path, 1 << 20)  # the first's slot is free again: its records are taken over
    assert third.slot == first.slot and [r.body for r in third.records()] == [{"who": "first"}]
    second.close()
    third.close()


async def test_full_is_a_clear_refusal(tmp_path):
    spool = Spool(tmp_path, 200)
    await spool.append({"x": "a" * 50})
    with pytest.raises(errors.Unavailable, match="spool is full"):
        await spool.append({"x": "b" * 200})
    assert spool.waiting == 1
    [segment] = spool.segments()
    spool.remove(segment)
    assert spool.size == 0 and not os.listdir(spool.slot_dir)
    spool.close()


# -- the replay (brokers.failover.Failover.replay_spool) against the real database -----------


@pytest.mark.parametrize("crash_in", ["remove", "forget"])
async def test_a_replay_cut_after_a_segment_is_stored_stores_nothing_twice(dsn, tmp_path, monkeypatch, crash_in):
    """The process dies after a segment's records are stored, around removing it and
    forgetting its keys (a crash injected at either step): the next replay stores none of
    them again. Forgetting the keys first would have let a crash before the removal replay
    the whole segment again."""
    db = Database(dsn, min_size=1, max_size=2)
    await db.open(wait=True)
    try:
        async with db.connection() as conn:
            await queues.create(conn, "replayed")
        spool = Spool(tmp_path, 1 << 20)
        for i in range(3):
            await spool.append({"kind": "send", "queue": "replayed", "sealed": False,
                                "messages": [{"body": f"m{i}", "message_uuid": str(uuid.uuid4())}]})
        spool.seal_segment()
        broker = ServerBroker(Settings(), db, Metrics())
        broker.failover.spool = spool

        def crash(*_args: object) -> None:
            raise RuntimeError("the process dies here")

        with monkeypatch.context() as patched:
            patched.setattr(spooled if crash_in == "forget" else spool, crash_in, crash)
            with pytest.raises(RuntimeError, match="dies here"):
                await broker.failover.replay_spool()
        spool.close()
        broker.failover.spool = Spool(tmp_path, 1 << 20)  # the restart
        await broker.failover.replay_spool()
        broker.failover.spool.close()
        async with db.connection() as conn:
            bodies = [m.body for m in await messages.receive(conn, "replayed", qty=10)]
        assert sorted(bodies) == ["m0", "m1", "m2"]
    finally:
        await db.close()


async def test_a_record_that_reads_but_makes_no_sense_is_set_aside(dsn, tmp_path):
    """A well-framed record whose JSON lacks its fields (written by a bug, or planted): set
    aside like a record the database refuses, and the records after it still replay (before,
    the replay failed on it again and again)."""
    db = Database(dsn, min_size=1, max_size=2)
    await db.open(wait=True)
    try:
        async with db.connection() as conn:
            await queues.create(conn, "replayed")
        spool = Spool(tmp_path, 1 << 20)
        await spool.append({"kind": "send", "queue": "replayed"})  # no messages, no sealed flag
        await spool.append({"kind": "send", "queue": "replayed", "sealed": False,
                            "messages": [{"body": "after", "message_uuid": "not a uuid"}]})
        await spool.append({"kind": "send", "queue": "replayed", "sealed": False,
                            "messages": [{"body": "kept", "message_uuid": str(uuid.uuid4())}]})
        spool.seal_segment()
        broker = ServerBroker(Settings(), db, Metrics())
        broker.failover.spool = spool
        assert await broker.failover.replay_spool() == 3
        assert spool.waiting == 0
        rejected = (spool.slot_dir / "rejected.jsonl").read_text().splitlines()
        assert len(rejected) == 2 and all("malformed" in line for line in rejected)
        spool.close()
        async with db.connection() as conn:
            assert [m.body for m in await messages.receive(conn, "replayed", qty=10)] == ["kept"]
    finally:
        await db.close()
