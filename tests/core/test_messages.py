"""Message operations against a real PostgreSQL: the SQL API's semantics."""

from __future__ import annotations

import asyncio
import random
import time
import uuid

import pytest

from conveyor import errors, types
from conveyor.core import messages, queues
from conveyor.db import pool

M = types.OutgoingMessage


async def _age(conn, queue: str, seconds: int) -> None:
    """Pretend every message of a queue became visible ``seconds`` ago (tests only)."""
    await conn.execute(
        "UPDATE conveyor.messages SET vt = now() - make_interval(secs => %s) "
        "WHERE queue_id = (SELECT id FROM conveyor.queues WHERE name = %s)", (seconds, queue))


async def test_send_receive_delete(conn):
    await queues.create(conn, "jobs")
    mid = await messages.send(conn, "jobs", M("hello", headers={"k": "v"}))
    [got] = await messages.receive(conn, "jobs", vt=30)
    assert (got.id, got.body, got.headers, got.receive_count) == (mid, "hello", {"k": "v"}, 1)
    assert got.first_received_at is not None and got.vt > got.sent_at
    assert await messages.receive(conn, "jobs") == []  # invisible now
    assert await messages.delete(conn, "jobs", [mid, 999]) == [mid]
    assert await messages.delete(conn, "jobs", [mid]) == []


async def test_a_lazy_receive_from_a_standard_queue_commits_without_waiting_for_the_flush(conn):
    """The server's receives (lazy): a claim on a standard queue leaves its commit
    asynchronous (lost in a crash, the messages are visible again, as when their timeout
    ends); a FIFO queue's claim (it holds the group for one consumer) does not, nor does a
    call without lazy, nor the statements after a lazy call's commit."""
    await queues.create(conn, "plain")
    await queues.create(conn, "ordered.fifo", {"fifo": True})
    await messages.send_batch(conn, "plain", [M(str(i)) for i in range(4)])
    await messages.send_batch(conn, "ordered.fifo", [M(str(i), group_id=f"g{i}", dedup_id=str(i)) for i in range(4)])

    async def commit_of(queue: str, lazy: bool = True) -> str:
        async with conn.transaction(force_rollback=True):
            assert len(await messages.receive(conn, queue, qty=2, lazy=lazy)) == 2
            return (await (await conn.execute("SHOW synchronous_commit")).fetchone())[0]

    assert await commit_of("plain") == "off"
    assert await commit_of("plain", lazy=False) == "on"
    assert await commit_of("ordered.fifo") == "on"
    assert len(await messages.receive(conn, "plain", lazy=True)) == 1  # committed: the setting went with it
    assert (await (await conn.execute("SHOW synchronous_commit")).fetchone())[0] == "on"


async def test_acknowledgements_by_delivery(conn):
    """The SQL API's receipt-checked forms: only the receive count a consumer got acts, so a
    late consumer cannot acknowledge the delivery of the one that received the message after it."""
    await queues.create(conn, "jobs")
    ids = [s.id for s in await messages.send_batch(conn, "jobs", [M("a"), M("b")])]
    await messages.receive(conn, "jobs", qty=2, vt=0)
    again = await messages.receive(conn, "jobs", qty=2, vt=60)
    assert [m.receive_count for m in again] == [2, 2]
    assert await messages.delete(conn, "jobs", ids, [1, 1]) == []
    assert await messages.archive(conn, "jobs", ids, [1, 1]) == []
    assert await messages.fail(conn, "jobs", ids[0], "late", receive_count=1) is False
    assert await messages.set_vt(conn, "jobs", ids, 0, receive_counts=[1, 1]) == []
    assert [m.id for m in await messages.set_vt(conn, "jobs", ids, 60, receive_counts=[2, None])] == ids
    assert await messages.archive(conn, "jobs", [ids[0]], [2]) == [ids[0]]
    assert await messages.delete(conn, "jobs", [ids[1]], [2]) == [ids[1]]
    with pytest.raises(errors.InvalidInput):
        await messages.delete(conn, "jobs", ids, [1])


async def test_bodies_are_stored_byte_exact(conn):
    await queues.create(conn, "jobs")
    bodies = ["  padded  \n", "emoji 🎉 and ünïcödé", '{"a": 1,   "b":[ ]}', "\t\r\n", "x" * 200_000,
              "quotes ' \" \\ $$ %s %(x)s"]
    ids = [s.id for s in await messages.send_batch(conn, "jobs", [M(b) for b in bodies])]
    got = await messages.receive(conn, "jobs", qty=10)
    assert [m.id for m in got] == ids
    assert [m.body for m in got] == bodies


async def test_nul_characters_are_rejected_cleanly(conn):
    await queues.create(conn, "jobs")
    with pytest.raises(errors.InvalidInput):
        await messages.send(conn, "jobs", M("a\x00b"))
    assert (await queues.metrics(conn, "jobs")).total_messages == 0


async def test_batch_ids_in_order_and_in_one_statement(conn):
    await queues.create(conn, "jobs")
    ids = [s.id for s in await messages.send_batch(conn, "jobs", [M(str(i), headers={"i": i}) for i in range(100)])]
    assert ids == sorted(ids) and len(set(ids)) == 100
    got = await messages.receive(conn, "jobs", qty=100)
    assert [m.headers["i"] for m in got] == list(range(100))


async def test_message_too_large(conn):
    await queues.create(conn, "small", {"max_message_size": 1024})
    await messages.send(conn, "small", M("x" * 1024))
    with pytest.raises(errors.MessageTooLarge):
        await messages.send(conn, "small", M("x" * 1025))
    with pytest.raises(errors.MessageTooLarge):  # headers count too, and nothing of the batch is stored
        await messages.send_batch(conn, "small", [M("ok"), M("x" * 1000, headers={"pad": "y" * 100})])
    assert (await queues.metrics(conn, "small")).queue_length == 1


async def test_unknown_queue(conn):
    for call in (messages.send(conn, "nope", M("x")), messages.receive(conn, "nope"),
                 messages.delete(conn, "nope", [1]), messages.peek(conn, "nope")):
        with pytest.raises(errors.QueueNotFound, match="nope"):
            await call


async def test_delay_per_message_and_per_queue(conn):
    await queues.create(conn, "slow", {"delay_seconds": 60})
    await messages.send(conn, "slow", M("queue delay"))
    await messages.send(conn, "slow", M("no delay", delay=0))
    assert [m.body for m in await messages.receive(conn, "slow", qty=10)] == ["no delay"]
    with pytest.raises(errors.InvalidInput, match="delay"):
        await messages.send(conn, "slow", M("x", delay=901))


async def test_visibility_timeout_expires_and_receive_count_grows(conn):
    await queues.create(conn, "jobs", {"visibility_timeout": 60})
    mid = await messages.send(conn, "jobs", M("x"))
    await messages.receive(conn, "jobs")
    assert await messages.receive(conn, "jobs") == []
    await _age(conn, "jobs", 1)
    [again] = await messages.receive(conn, "jobs", vt=0)
    assert (again.id, again.receive_count) == (mid, 2)
    [third] = await messages.receive(conn, "jobs")  # vt=0 made it visible at once
    assert third.receive_count == 3


async def test_receive_validates_arguments(conn):
    await queues.create(conn, "jobs")
    for kwargs in ({"qty": 0}, {"qty": 1001}, {"vt": -1}, {"vt": 43201}, {"wait": -1}):
        with pytest.raises(errors.InvalidInput):
            await messages.receive(conn, "jobs", **kwargs)


async def test_receive_with_wait_polls_inside_the_database(conn):
    await queues.create(conn, "jobs")
    started = time.monotonic()
    assert await messages.receive(conn, "jobs", wait=1) == []
    assert time.monotonic() - started >= 0.9


async def test_set_vt_single_batch_and_in_flight_only(conn):
    await queues.create(conn, "jobs")
    a, b = [s.id for s in await messages.send_batch(conn, "jobs", [M("a"), M("b")])]
    await messages.receive(conn, "jobs", qty=1, vt=300)  # a in flight
    changed = await messages.set_vt(conn, "jobs", [a, b], 0, in_flight_only=True)
    assert [m.id for m in changed] == [a]
    assert [m.id for m in await messages.receive(conn, "jobs", qty=10, vt=300)] == [a, b]
    [m] = await messages.set_vt(conn, "jobs", [b], 100)
    assert m.vt > m.sent_at
    assert await messages.set_vt(conn, "jobs", [12345], 10) == []
    with pytest.raises(errors.InvalidInput):
        await messages.set_vt(conn, "jobs", [a], 43201)


async def test_archive_and_pop_and_peek(conn):
    await queues.create(conn, "jobs")
    ids = [s.id for s in await messages.send_batch(conn, "jobs", [M(str(i)) for i in range(4)])]
    peeked = await messages.peek(conn, "jobs", qty=10)
    assert [m.id for m in peeked] == ids and all(m.receive_count == 0 for m in peeked)
    assert [m.id for m in await messages.peek(conn, "jobs", qty=2, after_id=ids[0])] == ids[1:3]
    assert await messages.archive(conn, "jobs", ids[:2]) == ids[:2]
    popped = await messages.pop(conn, "jobs", qty=1)
    assert [m.body for m in popped] == ["2"]
    assert [m.id for m in await messages.peek(conn, "jobs")] == [ids[3]]
    cur = await conn.execute("SELECT id, outcome FROM conveyor.archive ORDER BY id")
    assert await cur.fetchall() == [(ids[0], "completed"), (ids[1], "completed")]


async def test_pop_returns_messages_as_their_claim_leaves_them(conn):
    """A standard queue's pop deletes in one statement (migration 0014) and answers what
    claim-then-delete answered: the receive counted, the first receive time kept or set,
    the visibility the pop's time; with a redrive policy, a message past its receives goes
    to the dead-letter queue instead."""
    await queues.create(conn, "jobs")
    first, second = [s.id for s in await messages.send_batch(conn, "jobs", [M("a"), M("b")])]
    [received] = await messages.receive(conn, "jobs", qty=1, vt=0)
    clock = "SELECT clock_timestamp()"
    started = (await (await conn.execute(clock)).fetchone())[0]
    popped = sorted(await messages.pop(conn, "jobs", qty=5), key=lambda m: m.id)
    ended = (await (await conn.execute(clock)).fetchone())[0]
    assert [(m.id, m.receive_count) for m in popped] == [(first, 2), (second, 1)]
    assert popped[0].first_received_at == received.first_received_at
    assert popped[1].first_received_at == popped[1].vt and started <= popped[1].vt <= ended
    assert await messages.peek(conn, "jobs") == []

    await queues.create(conn, "dlq")
    await queues.create(conn, "redriven", {"max_receive_count": 1, "dead_letter_queue": "dlq"})
    ids = [s.id for s in await messages.send_batch(conn, "redriven", [M("a"), M("b")])]
    await messages.receive(conn, "redriven", qty=1, vt=0)
    assert [(m.id, m.receive_count) for m in await messages.pop(conn, "redriven", qty=5)] == [(ids[1], 1)]
    assert [m.body for m in await messages.peek(conn, "dlq")] == ["a"]


async def test_fail_goes_to_archive_without_dead_letter_queue(conn):
    await queues.create(conn, "jobs")
    mid = await messages.send(conn, "jobs", M("x"))
    assert await messages.fail(conn, "jobs", mid, "boom") is True
    assert await messages.fail(conn, "jobs", mid, "boom") is False
    cur = await conn.execute("SELECT outcome, error FROM conveyor.archive WHERE id = %s", (mid,))
    assert await cur.fetchone() == ("failed", "boom")


async def test_fail_goes_to_dead_letter_queue(conn):
    await queues.create(conn, "dlq")
    await queues.create(conn, "jobs", {"max_receive_count": 5, "dead_letter_queue": "dlq"})
    mid = await messages.send(conn, "jobs", M("x", headers={"h": 1}))
    await messages.fail(conn, "jobs", mid)
    [dead] = await messages.peek(conn, "dlq")
    assert (dead.body, dead.headers, dead.receive_count) == ("x", {"h": 1}, 0)
    cur = await conn.execute("SELECT id FROM conveyor.queues WHERE name = 'jobs'")
    assert dead.source_queue_id == (await cur.fetchone())[0]


async def test_max_receive_count_moves_to_dead_letter_queue(conn):
    await queues.create(conn, "dlq")
    await queues.create(conn, "jobs", {"max_receive_count": 2, "dead_letter_queue": "dlq"})
    await messages.send(conn, "jobs", M("poison"))
    for expected in (1, 2):
        [m] = await messages.receive(conn, "jobs", vt=0)
        assert m.receive_count == expected
    assert await messages.receive(conn, "jobs", vt=0) == []  # third receive: moved instead
    [dead] = await messages.receive(conn, "dlq")
    assert dead.body == "poison" and dead.receive_count == 3  # its count moved with it (as SQS's), and counts on
    assert (await queues.metrics(conn, "jobs")).queue_length == 0


async def test_max_receive_count_without_dead_letter_queue_fails_the_message(conn):
    await queues.create(conn, "jobs", {"max_receive_count": 1})
    mid = await messages.send(conn, "jobs", M("x"))
    await messages.receive(conn, "jobs", vt=0)
    assert await messages.receive(conn, "jobs") == []
    cur = await conn.execute("SELECT outcome, receive_count FROM conveyor.archive WHERE id = %s", (mid,))
    assert await cur.fetchone() == ("failed", 1)


async def test_json_content_type_round_trips(conn):
    await queues.create(conn, "jobs")
    await messages.send(conn, "jobs", M('{"a":1}', content_type=types.JSON_CONTENT_TYPE))
    [m] = await messages.receive(conn, "jobs")
    assert m.is_json and m.body == '{"a":1}'


async def test_dedup_ids_only_on_fifo_but_group_ids_are_kept_on_standard_queues(conn):
    await queues.create(conn, "jobs")
    with pytest.raises(errors.InvalidInput, match="FIFO"):
        await messages.send(conn, "jobs", M("x", dedup_id="d"))
    await messages.send(conn, "jobs", M("fair", group_id="tenant-1"))  # SQS fair queues
    [m] = await messages.receive(conn, "jobs")
    assert m.group_id == "tenant-1"


async def test_retention_clean_up(conn):
    await queues.create(conn, "jobs", {"retention_seconds": 60})
    old, new = [s.id for s in await messages.send_batch(conn, "jobs", [M("old"), M("new")])]
    await messages.archive(conn, "jobs", [await messages.send(conn, "jobs", M("archived"))])
    await conn.execute("UPDATE conveyor.messages SET sent_at = now() - interval '2 minutes' WHERE id = %s", (old,))
    await conn.execute("UPDATE conveyor.archive SET archived_at = now() - interval '2 minutes'")
    report = await queues.maintenance(conn)
    assert report["expired_messages"] == 1 and report["expired_archive"] == 1
    assert [m.id for m in await messages.peek(conn, "jobs")] == [new]
    assert (await queues.maintenance(conn))["expired_messages"] == 0


async def test_message_uuid_sender_and_system_attributes_travel_with_the_message(conn):
    await queues.create(conn, "dlq")
    await queues.create(conn, "jobs", {"max_receive_count": 1, "dead_letter_queue": "dlq"})
    [sent] = await messages.send_batch(conn, "jobs", [M("x", sender_id="AIDA1", system_attributes={"AWSTraceHeader": "t"})])
    [got] = await messages.receive(conn, "jobs", vt=0)
    assert (got.message_uuid, got.sender_id, got.system_attributes) == (sent.message_uuid, "AIDA1", {"AWSTraceHeader": "t"})
    assert await messages.receive(conn, "jobs") == []  # dead-lettered now
    [dead] = await messages.peek(conn, "dlq")
    assert dead.message_uuid == sent.message_uuid and dead.sender_id == "AIDA1"


async def test_message_uuids_are_distinct_version_4_uuids_per_message(conn):
    """A send draws one random seed per statement (migration 0018) and makes each message's
    UUID from it and the message's id: distinct within a batch and across batches, in the
    RFC 4122 version 4 form SQS MessageIds take; a UUID the caller gives is kept."""
    await queues.create(conn, "jobs")
    await queues.create(conn, "jobs.fifo", {"fifo": True})
    given = uuid.uuid4()
    first = await messages.send_batch(conn, "jobs", [M(str(i)) for i in range(500)] + [M("x", message_uuid=given)])
    second = await messages.send_batch(conn, "jobs", [M(str(i)) for i in range(500)])
    fifo = await messages.send_batch(conn, "jobs.fifo", [M(str(i), group_id="g", dedup_id=str(i)) for i in range(50)])
    assert first[-1].message_uuid == given
    made = [s.message_uuid for s in first[:-1] + second + fifo]
    assert len(set(made)) == len(made) == 1050
    assert {(u.version, u.variant) for u in made} == {(4, uuid.RFC_4122)}
    stored = {r[0] for r in await (await conn.execute("SELECT message_uuid FROM conveyor.messages")).fetchall()}
    assert stored == set(made) | {given}


async def test_message_uuid_of_an_id_is_a_bijection_of_its_low_48_bits(conn):
    """conveyor._message_uuid keeps the seed's first 80 bits and XORs the id into its last 48,
    so ids that differ in their low 48 bits never share a UUID."""
    seed = str(uuid.uuid4())
    rows = await (await conn.execute(
        "SELECT conveyor._message_uuid(%s, i)::text FROM unnest(%s::bigint[]) i",
        (seed, [0, 1, 2, 3, 2**40, 2**48 - 1, 2**48 + 5, 2**62]))).fetchall()
    got = [r[0] for r in rows]
    assert all(u[:24] == seed[:24] for u in got)
    assert got[0] == seed  # id 0 XORs nothing
    assert len(set(got[:6])) == 6
    assert int(got[6][24:], 16) == int(seed[24:], 16) ^ 5 and int(got[7][24:], 16) == int(seed[24:], 16)


async def test_bad_message_objects_are_rejected(conn):
    await queues.create(conn, "jobs")
    with pytest.raises(errors.InvalidInput, match="system_attributes"):
        await messages.send_batch(conn, "jobs", [M("x", system_attributes=["no"])])  # type: ignore[arg-type]


async def test_grouped_receives_of_a_standard_queue_never_share_a_group(dsn):
    """Concurrent grouped receivers (seed 000's receive_fifo on a standard queue): each group
    is held by one receiver at a time and delivered in send order, every message once."""
    async with pool.connect(dsn) as conn:
        await queues.create(conn, "fair")
        await messages.send_batch(conn, "fair", [M(f"{g}:{i}", group_id=g) for i in range(15) for g in "abcd"])
    holders: dict[str, int] = {}
    seen: dict[str, list[int]] = {g: [] for g in "abcd"}

    async def worker(n: int) -> None:
        async with pool.connect(dsn) as conn:
            for _ in range(200):
                got = await messages.receive_grouped(conn, "fair", qty=random.randint(1, 3), vt=30)
                if not got:
                    if sum(map(len, seen.values())) == 60:
                        return
                    await asyncio.sleep(0.005)
                    continue
                groups = {m.group_id for m in got}
                for g in groups:
                    assert holders.get(g) is None, f"group {g} held by {holders[g]} and {n}"
                    holders[g] = n
                for m in got:
                    seen[m.group_id].append(int(m.body.split(":")[1]))
                await asyncio.sleep(random.random() / 100)
                for g in groups:
                    del holders[g]
                await messages.delete(conn, "fair", [m.id for m in got])

    await asyncio.gather(*(worker(n) for n in range(6)))
    assert seen == {g: list(range(15)) for g in "abcd"}
