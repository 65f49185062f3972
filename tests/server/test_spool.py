"""The failover spool's journal (conveyor.server.spool): durable appends with one fsync
for many, torn tails ignored, slots per process, bounded size."""

from __future__ import annotations

import asyncio
import os

import pytest

from conveyor import errors
from conveyor.server.spool import Spool


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


async def test_a_torn_tail_is_ignored(tmp_path):
    spool = Spool(tmp_path, 1 << 20)
    for i in range(3):
        await spool.append({"n": i})
    [segment] = spool.segments()
    spool.close()
    segment.write_bytes(segment.read_bytes() + b"\x00\x00\x01\x00garbage")  # a crash mid-write
    again = Spool(tmp_path, 1 << 20)
    assert [r.body["n"] for r in again.records()] == [0, 1, 2]
    again.close()


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
