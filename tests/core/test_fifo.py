"""FIFO queues: per-group order, group blocking, deduplication."""

from __future__ import annotations

import pytest

from conveyor import errors, types
from conveyor.core import messages, queues

M = types.OutgoingMessage


def fifo(body: str, group: str, dedup: str | None = None) -> types.OutgoingMessage:
    return M(body, group_id=group, dedup_id=dedup or body)


async def test_group_is_served_only_when_nothing_of_it_is_in_flight(conn):
    await queues.create(conn, "q.fifo")
    await messages.send_batch(conn, "q.fifo", [fifo("a1", "a"), fifo("b1", "b"), fifo("a2", "a"), fifo("b2", "b")])
    first = await messages.receive(conn, "q.fifo", qty=1, vt=60)
    assert [m.body for m in first] == ["a1"]
    second = await messages.receive(conn, "q.fifo", qty=10, vt=60)
    assert [m.body for m in second] == ["b1", "b2"]  # group a is blocked by a1
    assert await messages.receive(conn, "q.fifo", qty=10) == []
    await messages.delete(conn, "q.fifo", [first[0].id])
    assert [m.body for m in await messages.receive(conn, "q.fifo", qty=10)] == ["a2"]


async def test_order_within_group_survives_visibility_expiry(conn):
    await queues.create(conn, "q.fifo")
    await messages.send_batch(conn, "q.fifo", [fifo(f"m{i}", "g") for i in range(3)])
    got = await messages.receive(conn, "q.fifo", qty=2, vt=0)  # received, visible again at once
    assert [m.body for m in got] == ["m0", "m1"]
    again = await messages.receive(conn, "q.fifo", qty=10, vt=60)
    assert [m.body for m in again] == ["m0", "m1", "m2"]


async def test_deduplication_within_five_minutes(conn):
    await queues.create(conn, "q.fifo")
    first = await messages.send(conn, "q.fifo", fifo("x", "g", "d1"))
    dup = await messages.send(conn, "q.fifo", fifo("other body", "g", "d1"))
    assert dup == first
    ids = [s.id for s in await messages.send_batch(conn, "q.fifo", [fifo("y", "g", "d2"), fifo("y again", "g", "d2")])]
    assert ids[0] == ids[1]
    assert [m.body for m in await messages.peek(conn, "q.fifo")] == ["x", "y"]
    await conn.execute("UPDATE conveyor.dedup SET expires_at = now() - interval '1 second'")
    assert await messages.send(conn, "q.fifo", fifo("x", "g", "d1")) != first


async def test_content_based_deduplication(conn):
    await queues.create(conn, "cbd.fifo", {"content_based_deduplication": True})
    a = await messages.send(conn, "cbd.fifo", M("same", group_id="g"))
    b = await messages.send(conn, "cbd.fifo", M("same", group_id="h"))
    c = await messages.send(conn, "cbd.fifo", M("different", group_id="g"))
    assert a == b != c
    await queues.create(conn, "plain.fifo")
    with pytest.raises(errors.InvalidInput, match="dedup_id"):
        await messages.send(conn, "plain.fifo", M("x", group_id="g"))


@pytest.mark.parametrize("msg, fragment", [
    (M("x", dedup_id="d"), "group_id"),
    (M("x", group_id="", dedup_id="d"), "group_id"),
    (M("x", group_id="g" * 129, dedup_id="d"), "group_id"),
    (M("x", group_id="g", dedup_id="d", delay=5), "delay"),
    (M("x", group_id="g", dedup_id="bad id"), "dedup_id"),
])
async def test_fifo_validation(conn, msg, fragment):
    await queues.create(conn, "q.fifo")
    with pytest.raises(errors.InvalidInput, match=fragment):
        await messages.send(conn, "q.fifo", msg)


async def test_fifo_dead_letter_unblocks_the_group(conn):
    await queues.create(conn, "dlq.fifo")
    await queues.create(conn, "q.fifo", {"max_receive_count": 1, "dead_letter_queue": "dlq.fifo"})
    await messages.send_batch(conn, "q.fifo", [fifo("poison", "g"), fifo("next", "g")])
    [m] = await messages.receive(conn, "q.fifo", qty=1, vt=0)
    assert m.body == "poison"
    got = await messages.receive(conn, "q.fifo", qty=10, vt=60)
    assert [m.body for m in got] == ["next"]
    [dead] = await messages.receive(conn, "dlq.fifo")
    assert (dead.body, dead.group_id) == ("poison", "g")


async def test_purge_then_send_again(conn):
    await queues.create(conn, "q.fifo")
    await messages.send(conn, "q.fifo", fifo("a", "g"))
    assert await queues.purge(conn, "q.fifo") == 1
    await messages.send(conn, "q.fifo", fifo("b", "g"))
    assert [m.body for m in await messages.receive(conn, "q.fifo")] == ["b"]


async def test_clean_up_removes_empty_groups_only(conn):
    await queues.create(conn, "q.fifo")
    [a, _] = [s.id for s in await messages.send_batch(conn, "q.fifo", [fifo("a", "ga"), fifo("b", "gb")])]
    await messages.delete(conn, "q.fifo", [a])
    assert (await queues.maintenance(conn))["empty_groups"] == 1
    assert [m.body for m in await messages.receive(conn, "q.fifo")] == ["b"]


async def test_a_duplicate_returns_the_first_messages_uuid(conn):
    await queues.create(conn, "q.fifo")
    [first] = await messages.send_batch(conn, "q.fifo", [fifo("x", "g", "d")])
    [dup] = await messages.send_batch(conn, "q.fifo", [fifo("y", "g", "d")])
    assert dup == first
    await messages.delete(conn, "q.fifo", [first.id])
    [again] = await messages.send_batch(conn, "q.fifo", [fifo("z", "g", "d")])
    assert again == first  # still within the window, even once the original is gone


async def test_a_receive_returns_its_groups_one_after_the_other(conn):
    await queues.create(conn, "q.fifo")
    await messages.send_batch(conn, "q.fifo", [fifo("a1", "a"), fifo("b1", "b"), fifo("a2", "a"), fifo("b2", "b")])
    assert [m.body for m in await messages.receive(conn, "q.fifo", qty=10)] == ["a1", "a2", "b1", "b2"]


async def test_a_group_opens_again_up_to_its_next_message_in_flight(conn):
    await queues.create(conn, "q.fifo")
    await messages.send_batch(conn, "q.fifo", [fifo("a1", "a"), fifo("a2", "a"), fifo("a3", "a")])
    a1, a2, _ = await messages.receive(conn, "q.fifo", qty=3, vt=60)
    await messages.set_vt(conn, "q.fifo", [a1.id, a2.id], 0, receive_counts=[1, 1])  # a3 stays in flight
    assert [m.body for m in await messages.receive(conn, "q.fifo", qty=10, vt=60)] == ["a1", "a2"]


async def test_deduplication_per_group(conn):
    await queues.create(conn, "q.fifo", {"extra_attributes": {"dedup_scope": "group"}})
    first = await messages.send(conn, "q.fifo", fifo("x", "g1", "d"))
    assert await messages.send(conn, "q.fifo", fifo("x again", "g1", "d")) == first
    other = await messages.send(conn, "q.fifo", fifo("y", "g2", "d"))
    assert other != first
    await queues.alter(conn, "q.fifo", {"extra_attributes": {"dedup_scope": "queue"}})
    assert await messages.send(conn, "q.fifo", fifo("z", "g3", "e")) == await messages.send(
        conn, "q.fifo", fifo("z again", "g4", "e"))


async def test_purge_clears_the_deduplication_window(conn):
    await queues.create(conn, "q.fifo")
    first = await messages.send(conn, "q.fifo", fifo("a", "g", "d"))
    await queues.purge(conn, "q.fifo")
    assert await messages.send(conn, "q.fifo", fifo("b", "g", "d")) != first


async def test_delete_in_flight_refuses_deliveries_that_are_over(conn):
    await queues.create(conn, "q.fifo")
    await messages.send_batch(conn, "q.fifo", [fifo("a", "g"), fifo("b", "h")])
    a, b = await messages.receive(conn, "q.fifo", qty=2, vt=60)
    await messages.set_vt(conn, "q.fifo", [a.id], 0)  # visible again
    assert await messages.delete_in_flight(conn, "q.fifo", [a.id, b.id], [1, 1]) == ([b.id], [a.id])
    assert await messages.delete_in_flight(conn, "q.fifo", [b.id], [1]) == ([], [])  # gone: no error
