"""Move tasks and repeatable FIFO receives (migration 0002)."""

from __future__ import annotations

import uuid

import pytest

from conveyor import errors, types
from conveyor.core import messages, move_tasks, queues

M = types.OutgoingMessage


async def _dead_letters(conn, n: int) -> None:
    await queues.create(conn, "dlq")
    await queues.create(conn, "src", {"max_receive_count": 1, "dead_letter_queue": "dlq"})
    await messages.send_batch(conn, "src", [M(str(i)) for i in range(n)])
    await messages.receive(conn, "src", qty=n, vt=0)
    assert await messages.receive(conn, "src", qty=n) == []  # all dead-lettered


async def test_messages_go_back_to_their_source(conn):
    await _dead_letters(conn, 5)
    before = {m.message_uuid for m in await messages.peek(conn, "dlq")}
    task = await move_tasks.start(conn, "dlq")
    assert (task.status, task.to_move, task.source_queue) == ("RUNNING", 5, "dlq")
    assert await move_tasks.step(conn) == 5
    [done] = await move_tasks.list_for(conn, "dlq")
    assert (done.status, done.moved) == ("COMPLETED", 5)
    back = await messages.peek(conn, "src")
    assert {m.message_uuid for m in back} == before and all(m.receive_count == 0 for m in back)


async def test_explicit_destination_and_rate(conn):
    await _dead_letters(conn, 5)
    await queues.create(conn, "elsewhere")
    await move_tasks.start(conn, "dlq", "elsewhere", max_per_second=2)
    assert await move_tasks.step(conn) == 2
    assert (await move_tasks.list_for(conn, "dlq"))[0].status == "RUNNING"
    while await move_tasks.step(conn):
        pass
    assert len(await messages.peek(conn, "elsewhere")) == 5


async def test_one_task_per_source_and_cancel(conn):
    await _dead_letters(conn, 3)
    task = await move_tasks.start(conn, "dlq", max_per_second=1)
    with pytest.raises(errors.InvalidInput, match="already running"):
        await move_tasks.start(conn, "dlq")
    cancelled = await move_tasks.cancel(conn, task.handle)
    assert cancelled.status == "CANCELLED"
    with pytest.raises(errors.InvalidInput, match="not running"):
        await move_tasks.cancel(conn, task.handle)
    with pytest.raises(errors.MoveTaskNotFound):
        await move_tasks.cancel(conn, uuid.uuid4())
    assert await move_tasks.step(conn) == 0
    await move_tasks.start(conn, "dlq")  # a new one may start now


async def test_source_must_be_a_dead_letter_queue(conn):
    await queues.create(conn, "plain")
    with pytest.raises(errors.InvalidInput, match="not the dead-letter queue"):
        await move_tasks.start(conn, "plain")
    with pytest.raises(errors.QueueNotFound):
        await move_tasks.start(conn, "missing")


async def test_messages_without_a_source_fail_the_task(conn):
    await _dead_letters(conn, 1)
    await messages.send(conn, "dlq", M("sent directly"))
    await move_tasks.start(conn, "dlq")
    await move_tasks.step(conn)
    [task] = await move_tasks.list_for(conn, "dlq")
    assert task.status == "FAILED" and "no queue to go back to" in task.failure_reason
    assert [m.body for m in await messages.peek(conn, "dlq")] == ["sent directly"]


async def test_receive_attempt_repeats_until_something_changes(conn):
    await queues.create(conn, "q.fifo")
    await messages.send_batch(conn, "q.fifo", [M(f"m{i}", group_id="g", dedup_id=str(i)) for i in range(3)])
    first = await messages.receive_attempt(conn, "q.fifo", "try-1", qty=2)
    again = await messages.receive_attempt(conn, "q.fifo", "try-1", qty=2)
    assert [m.id for m in again] == [m.id for m in first] and again[0].vt >= first[0].vt
    await messages.delete(conn, "q.fifo", [first[0].id])
    other = await messages.receive_attempt(conn, "q.fifo", "try-1", qty=2)
    assert [m.id for m in other] != [m.id for m in first]  # changed: a fresh receive
    with pytest.raises(errors.InvalidInput, match="attempt id"):
        await messages.receive_attempt(conn, "q.fifo", "bad id")
