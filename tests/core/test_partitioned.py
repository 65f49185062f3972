"""Partitioned queues (seed 004's model) against a real PostgreSQL: push idempotency,
leases per (partition, group), acknowledgements with fencing, retries and dead letters,
consumer groups, transactions."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import random
import uuid

import pytest

from conveyor import errors
from conveyor.core import partitioned as pq
from conveyor.db import pool
from support import xmin


def _items(queue: str, partition: str, *txns: str) -> list[dict]:
    return [{"queue": queue, "partition": partition, "payload": {"n": t}, "transactionId": t} for t in txns]


def _acks(popped: dict, status: str = "completed", group: str | None = None, **extra) -> list[dict]:
    return [{"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"],
             "status": status, "consumerGroup": group, **extra} for m in popped["messages"]]


async def test_push_is_idempotent_per_partition(conn):
    first = await pq.push(conn, _items("orders", "p1", "a", "b", "a") + _items("orders", "p2", "a"))
    assert [a["status"] for a in first] == ["queued", "queued", "duplicate", "queued"]
    assert first[2]["messageId"] == first[0]["messageId"]  # a duplicate answers with the stored message
    again = await pq.push(conn, _items("orders", "p1", "b", "c"))
    assert [a["status"] for a in again] == ["duplicate", "queued"]
    assert again[0]["messageId"] == first[1]["messageId"]
    assert [a["seq"] for a in first + again] == [1, 2, 1, 1, 2, 3]
    q = await pq.get(conn, "orders")
    assert q is not None and q.lease_time == 300  # created by the push


async def test_a_lone_item_is_pushed_as_it_would_be_among_others(conn):
    """A push of one item to a partition that exists takes pqueue_push's one-item path;
    pushed one at a time, the items get the answers and the stored rows that one push of
    all of them (the general path) gives."""
    trace = "0af7651916cd43dd8448eb211c80319c"
    items = [{"payload": {"n": 1}, "transactionId": "a"},  # creates the partition: the general path
             {"payload": "two", "transactionId": "b", "traceId": trace, "producerSub": "alice"},
             {"payload": None},
             {"payload": [3], "transactionId": "a"},  # a duplicate of the first
             {"payload": "sealed", "transactionId": "c", "encrypted": True, "traceId": "not a uuid"},
             {"payload": {"n": 4}, "transactionId": ""}]
    one_by_one = [(await pq.push(conn, [{"queue": "lone", "partition": "p", **item}]))[0] for item in items]
    together = await pq.push(conn, [{"queue": "all", "partition": "p", **item} for item in items])

    def answer(a: dict, index: int) -> dict:
        random_id = len(a["transactionId"]) == 36  # none given: a UUID of its own
        return {k: v for k, v in a.items() if k not in ("queue", "messageId", "partitionId")} | {
            "index": index, "transactionId": "random" if random_id else a["transactionId"]}

    assert [answer(a, i) for i, a in enumerate(one_by_one)] == [answer(a, i) for i, a in enumerate(together)]
    assert one_by_one[3]["messageId"] == one_by_one[0]["messageId"]
    assert [a["status"] for a in one_by_one] == ["queued", "queued", "queued", "duplicate", "queued", "queued"]

    async def stored(queue: str) -> list[tuple]:
        cur = await conn.execute(
            "SELECT m.seq, length(m.transaction_id), m.trace_id, m.payload, m.is_encrypted, m.producer_sub,"
            " p.head, p.head_at IS NOT NULL, p.head_xid <> '0'"
            " FROM conveyor.partition_messages m JOIN conveyor.partitions p ON p.id = m.partition_id"
            " JOIN conveyor.pqueues q ON q.id = p.queue_id WHERE q.name = %s ORDER BY m.seq", (queue,))
        return await cur.fetchall()

    assert await stored("lone") == await stored("all")
    assert len(await stored("lone")) == 5


async def test_pushes_to_a_partition_update_its_row_in_place(conn):
    """A push moves its partition's head; the mark it leaves for wildcard pops changes
    only once per 1024 transaction ids, so the update of the partition's row is HOT
    (no new index entries) except when a push crosses into a new range of ids. Each push
    is its own transaction here (autocommit), as a client's pushes are."""
    await pq.push(conn, _items("hot", "p", "first") + _items("hot", "q", "first"))

    async def counts() -> tuple[int, int, int]:
        await conn.execute("SELECT pg_stat_force_next_flush()")
        await conn.execute("SELECT 1")  # the flush happens when a transaction ends
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        cur = await conn.execute("SELECT n_tup_upd, n_tup_hot_upd, pg_current_xact_id()::text::bigint"
                                 " FROM pg_stat_user_tables WHERE relid = 'conveyor.partitions'::regclass")
        row = await cur.fetchone()
        assert row is not None
        return row

    upd0, hot0, xid0 = await counts()
    await pq.push(conn, _items("hot", "p", "one"))                      # the one-item path
    for i in range(40):
        await pq.push(conn, _items("hot", "p", f"a{i}") + _items("hot", "q", f"b{i}"))  # the general path
    upd1, hot1, xid1 = await counts()
    assert upd1 - upd0 == 81
    ranges_crossed = (xid1 >> 10) - (xid0 >> 10)  # other tests' transactions may take ids meanwhile
    assert (upd1 - upd0) - (hot1 - hot0) <= 2 * (ranges_crossed + 1)
    cur = await conn.execute("SELECT p.head, p.head_xid::text::bigint FROM conveyor.partitions p"
                             " JOIN conveyor.pqueues q ON q.id = p.queue_id WHERE q.name = 'hot' AND p.name = 'p'")
    head, mark = await cur.fetchone()
    assert head == 42 and mark % 1024 == 0 and xid0 < mark <= xid1 + 1024


async def test_create_missing_creates_within_its_bounds_or_nothing(conn):
    await pq.configure(conn, "there")
    assert await pq.create_missing(conn, ["there", "b", "a", "b"], max_new=2, max_total=3) == ["a", "b"]
    assert await pq.create_missing(conn, ["there", "a"], max_new=0, max_total=3) == []  # nothing new
    with pytest.raises(errors.QueueLimitReached, match="may not create"):
        await pq.create_missing(conn, ["c"], max_new=0)
    with pytest.raises(errors.QueueLimitReached, match=r"names 2 queues .* at most 1"):
        await pq.create_missing(conn, ["c", "d"], max_new=1)
    with pytest.raises(errors.QueueLimitReached, match="3 partitioned queues exist"):
        await pq.create_missing(conn, ["c"], max_new=5, max_total=3)
    with pytest.raises(errors.InvalidInput, match="invalid queue name"):
        await pq.create_missing(conn, ["ok", "not ok"])
    assert [q.name for q in await pq.list_all(conn)] == ["a", "b", "there"]
    assert await pq.create_missing(conn, ["c", "d"]) == ["c", "d"]  # no bounds: the SQL API's default


async def test_a_lease_gives_a_partition_to_one_worker(conn):
    await pq.push(conn, _items("jobs", "a", "1", "2") + _items("jobs", "b", "3"))
    first = await pq.pop(conn, {"queue": "jobs", "batch": 10})
    assert [m["transactionId"] for m in first["messages"]] == ["1", "2"] and first["leaseId"]
    second = await pq.pop(conn, {"queue": "jobs", "batch": 10})
    assert [m["transactionId"] for m in second["messages"]] == ["3"]  # a is leased: b is next
    assert (await pq.pop(conn, {"queue": "jobs", "batch": 10}))["messages"] == []
    assert (await pq.pop(conn, {"queue": "jobs", "partition": "a", "batch": 10}))["messages"] == []
    answers = await pq.ack(conn, _acks(first))
    assert [a["outcome"] for a in answers] == ["completed", "completed"]
    await pq.push(conn, _items("jobs", "a", "4"))
    third = await pq.pop(conn, {"queue": "jobs", "partition": "a", "batch": 10})
    assert [m["transactionId"] for m in third["messages"]] == ["4"]  # the lease ended with the last ack


async def test_an_expired_lease_goes_to_another_worker_and_fences_the_first(conn):
    await pq.configure(conn, "slow", {"leaseTime": 1})
    await pq.push(conn, _items("slow", "p", "1", "2"))
    first = await pq.pop(conn, {"queue": "slow", "batch": 10})
    await pq.ack(conn, _acks(first)[:1])  # "1" is done; "2" is not when the lease runs out
    await asyncio.sleep(1.2)
    second = await pq.pop(conn, {"queue": "slow", "batch": 10})
    assert [m["transactionId"] for m in second["messages"]] == ["2"]
    late = await pq.ack(conn, _acks(first)[1:])
    assert [(a["success"], a["error"]) for a in late] == [(False, "Invalid or expired lease")]
    with pytest.raises(errors.LeaseNotHeld):
        await pq.ack(conn, _acks(first)[1:], strict=True)
    assert [a["outcome"] for a in await pq.ack(conn, _acks(second))] == ["completed"]


def _leaseless(acks: list[dict]) -> list[dict]:
    return [{k: v for k, v in a.items() if k != "leaseId"} for a in acks]


async def test_an_ack_naming_no_lease_cannot_settle_what_another_holds(conn):
    """Issue 25, item 2: a worker whose lease ran out acked without its leaseId while
    another held the partition; the ack settled the message and released the other's
    lease, whose own valid ack was then refused."""
    await pq.configure(conn, "fenced", {"leaseTime": 1})
    await pq.push(conn, _items("fenced", "p", "1", "2"))
    first = await pq.pop(conn, {"queue": "fenced", "batch": 10})
    await asyncio.sleep(1.2)
    second = await pq.pop(conn, {"queue": "fenced", "batch": 10})
    assert [m["transactionId"] for m in second["messages"]] == ["1", "2"]
    late = await pq.ack(conn, _leaseless(_acks(first)))  # one call, as a batch
    assert [a["success"] for a in late] == [False, False]
    assert all("leased to another consumer" in a["error"] for a in late)
    for status in ("completed", "failed", "dlq", "retry"):
        [one] = await pq.ack(conn, _leaseless(_acks(first, status))[:1])
        assert one["success"] is False, status
    with pytest.raises(errors.LeaseNotHeld):
        await pq.ack(conn, _leaseless(_acks(first)), strict=True)
    await conn.rollback()
    assert [a["outcome"] for a in await pq.ack(conn, _acks(second))] == ["completed", "completed"]
    assert (await pq.pop(conn, {"queue": "fenced", "batch": 10}))["messages"] == []
    assert await (await conn.execute("SELECT count(*) FROM conveyor.partition_retries")).fetchone() == (0,)


async def test_an_ack_naming_no_lease_settles_when_no_lease_is_held(conn):
    """As Queen's server: with no live lease on the partition, an ack without a leaseId
    settles a message the group has not done; one it has done is refused."""
    await pq.configure(conn, "loose", {"leaseTime": 1})
    await pq.push(conn, _items("loose", "p", "1", "2", "3"))
    got = await pq.pop(conn, {"queue": "loose", "batch": 2})
    [done] = await pq.ack(conn, _acks(got)[:1])
    await asyncio.sleep(1.2)  # the lease runs out; nobody takes the partition meanwhile
    answers = await pq.ack(conn, _leaseless(_acks(got)))
    assert [(a["success"], a["error"]) for a in answers] == [(False, "Message already acknowledged"), (True, None)]
    again = await pq.pop(conn, {"queue": "loose", "batch": 10})
    assert [m["transactionId"] for m in again["messages"]] == ["3"]
    [other] = await pq.ack(conn, [{"transactionId": "3", "partitionId": done["partitionId"],
                                   "consumerGroup": "never-read"}])
    assert other["error"] == "Message not delivered to this consumer group"


async def test_a_transaction_acks_under_the_leases_its_caller_holds(conn):
    """Queen's client sends a transaction's acks without leaseIds and the leases beside
    them (requiredLeases): each must still be held, and a leaseless ack acts under it."""
    await pq.configure(conn, "tin", {"leaseTime": 1})
    await pq.push(conn, _items("tin", "p", "1"))
    first = await pq.pop(conn, {"queue": "tin"})
    await asyncio.sleep(1.2)
    second = await pq.pop(conn, {"queue": "tin"})
    ops = [{"type": "ack", **a} for a in _leaseless(_acks(first))] + [
        {"type": "push", "items": _items("tout", "p", "r1")}]
    for held in ([first["leaseId"]], []):  # its own lease ran out / it names none: B holds the partition
        with pytest.raises(errors.LeaseNotHeld, match="lease"):
            await pq.transaction(conn, ops, held)
        await conn.rollback()
    assert await pq.get(conn, "tout") is None
    done = await pq.transaction(conn, ops, [second["leaseId"]])
    assert [a["outcome"] for a in done["acks"]] == ["completed"]
    with pytest.raises(errors.LeaseNotHeld):  # released by its last ack
        await pq.transaction(conn, [{"type": "push", "items": _items("tout", "p", "r2")}], [second["leaseId"]])
    await conn.rollback()
    with pytest.raises(errors.InvalidInput):
        await pq.transaction(conn, ops, [1])  # type: ignore[list-item]


async def test_renew_keeps_the_lease(conn):
    await pq.configure(conn, "long", {"leaseTime": 1})
    await pq.push(conn, _items("long", "p", "1"))
    got = await pq.pop(conn, {"queue": "long"})
    for _ in range(3):
        await asyncio.sleep(0.5)
        [renewed] = await pq.renew(conn, [{"leaseId": got["leaseId"]}])
        assert renewed["expiresAt"] is not None
    assert (await pq.pop(conn, {"queue": "long"}))["messages"] == []  # still held
    assert [a["outcome"] for a in await pq.ack(conn, _acks(got))] == ["completed"]
    [gone] = await pq.renew(conn, [{"leaseId": got["leaseId"]}])
    assert gone["expiresAt"] is None


async def test_a_batch_of_acks_settles_as_the_same_acks_one_by_one(conn):
    """pqueue_ack writes a partition's cursor once for a run of completions; its answers
    and the cursors, leases and retries it leaves are those of the same acks sent one per
    call: completions out of order, a duplicate, a failure in the middle of a run (which
    gives the lease up, so the run's later acks are refused), the completion that ends
    the lease, and one after it."""
    async def settle(queue: str, together: bool) -> tuple[list[dict], list[tuple]]:
        await pq.push(conn, _items(queue, "a", "a1", "a2", "a3", "a4", "a5") + _items(queue, "b", "b1", "b2", "b3"))
        got = await pq.pop(conn, {"queue": queue, "batch": 8, "maxPartitions": 2})
        assert len(got["messages"]) == 8
        acks = {m["transactionId"]: m for m in _acks(got)}
        plan = [("a3", "completed"), ("a1", "completed"), ("b1", "completed"), ("a2", "completed"),
                ("a2", "completed"), ("b2", "failed"), ("b3", "completed"), ("a4", "completed"),
                ("a5", "completed"), ("a5", "completed")]
        batch = [{**acks[t], "status": status} for t, status in plan]
        if together:
            answers = await pq.ack(conn, batch)
        else:
            answers = [{**(await pq.ack(conn, [one]))[0], "index": i} for i, one in enumerate(batch)]
        cur = await conn.execute(
            "SELECT p.name, x.cursor, x.done, x.consumed, x.lease_id IS NULL, x.leased_through, x.behind,"
            " (SELECT array_agg((r.seq, r.failures)::text ORDER BY r.seq) FROM conveyor.partition_retries r"
            "   WHERE r.partition_id = p.id AND r.consumer_group = x.consumer_group)"
            " FROM conveyor.partition_cursors x JOIN conveyor.partitions p ON p.id = x.partition_id"
            " JOIN conveyor.pqueues q ON q.id = p.queue_id WHERE q.name = %s ORDER BY p.name", (queue,))
        rows = await cur.fetchall()
        return [{k: v for k, v in a.items() if k not in ("messageId", "partitionId", "queueName")}
                for a in answers], rows

    together, one_by_one = await settle("acks-together", True), await settle("acks-apart", False)
    assert together == one_by_one
    answers, cursors = together
    assert [(a["success"], a.get("outcome"), a["leaseReleased"]) for a in answers] == [
        (True, "completed", False), (True, "completed", False), (True, "completed", False),
        (True, "completed", False), (False, None, False), (True, "retry", True), (False, None, False),
        (True, "completed", False), (True, "completed", True), (False, None, False)]
    assert cursors == [("a", 5, [], 5, True, None, False, None), ("b", 1, [], 1, True, None, True, ["(2,1)"])]


async def test_the_usual_runs_of_completions_settle_as_the_loop_would(conn):
    """pqueue_ack settles each run of completions under the group's lease of one partition
    in a few statements (_ack_completions) instead of its loop, several runs in one call as
    fusion sends them; the answers and the cursors are the loop's (acks sent one per call),
    whether a run ends the lease or not, in any order, with messages done before it, runs
    interleaved, beside acks the loop decides."""
    async def settle(queue: str, together: bool) -> tuple[list, list[tuple], list]:
        await pq.push(conn, _items(queue, "p", *"abcdefgh") + _items(queue, "r", "r1", "r2", "r3")
                      + _items(queue, "s", "s1", "s2"))
        got = await pq.pop(conn, {"queue": queue, "batch": 8, "partition": "p"})
        rs = await pq.pop(conn, {"queue": queue, "batch": 3, "partition": "r"})
        ss = await pq.pop(conn, {"queue": queue, "batch": 2, "partition": "s"})
        acks = {m["transactionId"]: m for m in _acks(got) + _acks(rs) + _acks(ss)}
        batches = [[acks["c"]], [acks["e"], acks["b"], acks["f"]],  # out of order: the lease stays
                   # two runs interleaved, the second ending its lease, and s's acks, one
                   # naming no lease: the loop's
                   [acks["h"], acks["r1"], acks["a"], acks["r3"], acks["g"], acks["r2"],
                    {k: v for k, v in acks["s1"].items() if k != "leaseId"}, acks["s2"], acks["d"]]]
        answers, settled = [], []
        for batch in batches:
            if together:
                async with conn.transaction(force_rollback=True):  # which acks it settles: asked, then undone
                    cur = await conn.execute("SELECT conveyor._ack_completions(%s::jsonb, clock_timestamp())",
                                             (json.dumps(batch),))
                    settled.append([a["index"] for a in (await cur.fetchone())[0]])
                answers.append(await pq.ack(conn, batch))
            else:
                answers.append([{**(await pq.ack(conn, [one]))[0], "index": i} for i, one in enumerate(batch)])
        cur = await conn.execute(
            "SELECT p.name, x.cursor, x.done, x.consumed, x.lease_id IS NULL, x.leased_through, x.behind"
            " FROM conveyor.partition_cursors x JOIN conveyor.partitions p ON p.id = x.partition_id"
            " JOIN conveyor.pqueues q ON q.id = p.queue_id WHERE q.name = %s ORDER BY p.name", (queue,))
        strip = ("messageId", "partitionId", "queueName")
        return [[{k: v for k, v in a.items() if k not in strip} for a in run] for run in answers], \
            await cur.fetchall(), settled

    together, one_by_one = await settle("usual-together", True), await settle("usual-apart", False)
    assert together[:2] == one_by_one[:2]
    assert together[2] == [[], [0, 1, 2], [0, 1, 2, 3, 4, 5, 8]]  # a lone ack is the loop's
    assert [[a["leaseReleased"] for a in run] for run in together[0]] == [
        [False], [False, False, False], [False, False, False, False, False, True, False, False, True]]
    assert [a.get("error") for a in together[0][2]][6] == "Message is leased to another consumer " \
        "(an ack under a lease names its leaseId)"
    assert together[1] == [("p", 8, [], 8, True, None, False), ("r", 3, [], 3, True, None, False),
                           ("s", 0, [2], 1, False, 2, False)]

    await pq.push(conn, _items("unusual", "p", "1", "2", "3"))
    got = await pq.pop(conn, {"queue": "unusual", "batch": 3})
    acks = _acks(got)
    for batch in ([acks[0], acks[0]],  # the same message twice
                  [acks[0], {**acks[1], "status": "failed"}],
                  [acks[0], {k: v for k, v in acks[1].items() if k != "leaseId"}],
                  [acks[0], {**acks[1], "transactionId": "nope"}],
                  [acks[0], {**acks[1], "leaseId": str(uuid.uuid4())}],
                  [{**acks[0], "leaseId": str(uuid.uuid4())}, {**acks[1], "leaseId": str(uuid.uuid4())}],
                  [acks[0], {**acks[1], "consumerGroup": "other"}], [], ["not an object", 1],
                  # the partition's id written two ways (either names it), or not an id
                  [acks[0], {**acks[1], "partitionId": acks[1]["partitionId"].upper()}],
                  [acks[0], {**acks[1], "partitionId": acks[1]["partitionId"].replace("-", "")}],
                  [{**a, "partitionId": a["partitionId"][:-1] + "-"} for a in acks[:2]]):
        cur = await conn.execute("SELECT conveyor._ack_completions(%s::jsonb, clock_timestamp())",
                                 (json.dumps(batch),))
        assert (await cur.fetchone())[0] == [], batch
    # as the loop decides them: each form names the partition
    forms = await pq.ack(conn, [acks[0], {**acks[1], "partitionId": acks[1]["partitionId"].upper()}])
    assert [(a["success"], a["leaseReleased"]) for a in forms] == [(True, False), (True, False)]
    twice = await pq.ack(conn, [acks[2], acks[2]])  # decided by the loop
    assert [(a["success"], a["error"]) for a in twice] == [(True, None), (False, "Invalid or expired lease")]


async def test_out_of_order_acks_are_kept(conn):
    await pq.configure(conn, "ooo", {"leaseTime": 1})
    await pq.push(conn, _items("ooo", "p", "1", "2", "3"))
    got = await pq.pop(conn, {"queue": "ooo", "batch": 3})
    acks = _acks(got)
    await pq.ack(conn, [acks[2]])  # the third, before the first two
    await asyncio.sleep(1.2)
    again = await pq.pop(conn, {"queue": "ooo", "batch": 3})
    assert [m["transactionId"] for m in again["messages"]] == ["1", "2"]


async def test_failures_retry_then_dead_letter(conn):
    await pq.configure(conn, "flaky", {"retryLimit": 2})
    await pq.push(conn, _items("flaky", "p", "1", "2"))
    for attempt in range(3):
        got = await pq.pop(conn, {"queue": "flaky", "batch": 1})
        assert [m["transactionId"] for m in got["messages"]] == ["1"]
        assert got["messages"][0]["retryCount"] == attempt
        [answer] = await pq.ack(conn, _acks(got, "failed", error=f"boom {attempt}"))
        assert answer["outcome"] == ("dlq" if attempt == 2 else "retry")
    got = await pq.pop(conn, {"queue": "flaky", "batch": 1})
    assert [m["transactionId"] for m in got["messages"]] == ["2"]
    rows = await (await conn.execute(
        "SELECT transaction_id, error, failures FROM conveyor.partition_dead_letters")).fetchall()
    assert rows == [("1", "boom 2", 3)]
    [[dlq_id]] = await (await conn.execute("SELECT id FROM conveyor.partition_dead_letters")).fetchall()
    assert await pq.retry_dead_letters(conn, [dlq_id]) == 1
    await pq.ack(conn, _acks(got))
    again = await pq.pop(conn, {"queue": "flaky", "batch": 5})
    assert [m["data"] for m in again["messages"]] == [{"n": "1"}]


async def test_groups_have_their_own_positions(conn):
    await pq.push(conn, _items("events", "p", "old"))
    await pq.configure(conn, "events")
    await pq.subscribe(conn, "events", "fresh", "new")
    await pq.push(conn, _items("events", "p", "new"))
    for group, want in (("audit", ["old", "new"]), ("fresh", ["new"]), (None, ["old", "new"])):
        got = await pq.pop(conn, {"queue": "events", "consumerGroup": group, "batch": 10})
        assert [m["transactionId"] for m in got["messages"]] == want, group
        await pq.ack(conn, _acks(got, group=group))
    lag = {g.consumer_group: g.lag for g in await pq.group_lag(conn, "events")}
    assert lag == {"audit": 0, "fresh": 0, "__QUEUE_MODE__": 0}
    # replay: move "audit" back before everything
    assert await pq.seek(conn, "events", "audit", dt.datetime(2000, 1, 1, tzinfo=dt.UTC)) == 1
    got = await pq.pop(conn, {"queue": "events", "consumerGroup": "audit", "batch": 10})
    assert [m["transactionId"] for m in got["messages"]] == ["old", "new"]
    assert await pq.delete_group(conn, "audit", "events") == 1
    assert {g.consumer_group for g in await pq.group_lag(conn, "events")} == {"fresh", "__QUEUE_MODE__"}


async def test_wildcard_pop_takes_several_partitions_under_one_lease(conn):
    await pq.push(conn, [i for p in "abcd" for i in _items("many", p, f"{p}1", f"{p}2")])
    got = await pq.pop(conn, {"queue": "many", "batch": 5, "maxPartitions": 3})
    parts = {m["partition"] for m in got["messages"]}
    assert len(got["messages"]) == 5 and len(parts) == 3
    assert {m["leaseId"] for m in got["messages"]} == {got["leaseId"]}
    rest = await pq.pop(conn, {"queue": "many", "batch": 10, "maxPartitions": 4})
    assert {m["partition"] for m in rest["messages"]} == set("abcd") - parts


async def test_a_wildcard_pop_looks_past_a_page_of_partitions_being_claimed(conn, dsn):
    """A wildcard pop reads its candidates a page at a time, oldest push first. When every
    partition of the first page is being claimed by other pops (their advisory locks are
    held here, by another session), the pop goes on to the rest and takes the one
    partition left free, pushed last, as it would have with every candidate in one list;
    and a pop wanting more partitions than a page holds gets them all."""
    parts = [f"p{k}" for k in range(40)]
    free = parts[-1]
    await pq.push(conn, [i for p in parts[:-1] for i in _items("paged", p, f"{p}-1")])
    await conn.commit()
    await pq.push(conn, _items("paged", free, f"{free}-1"))
    await conn.commit()
    ids = dict(await (await conn.execute(
        "SELECT p.name, p.id FROM conveyor.partitions p JOIN conveyor.pqueues q ON q.id = p.queue_id "
        "WHERE q.name = 'paged'")).fetchall())
    async with pool.connect(dsn) as other, other.transaction():
        for name, pid in ids.items():
            if name != free:
                await other.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s || '/' || %s, 7306554613))",
                                    (pid, "__QUEUE_MODE__"))
        got = await pq.pop(conn, {"queue": "paged", "batch": 5})
        assert [m["partition"] for m in got["messages"]] == [free]
        await conn.commit()
    rest = await pq.pop(conn, {"queue": "paged", "batch": 100, "maxPartitions": 100})
    assert sorted(m["partition"] for m in rest["messages"]) == sorted(parts[:-1])


async def test_the_pops_of_one_call_share_the_first_ones_candidates(conn):
    """The pops of one pop_many call on one queue and group: each after the first starts
    with the candidates the one before listed and did not try. They get distinct
    partitions, each under its own lease; a pop wanting more than those candidates hold
    reads the rest afresh; a pop of another group or queue reads its own."""
    parts = [f"p{k:02}" for k in range(20)]
    await pq.push(conn, [i for p in parts for i in _items("shared", p, f"{p}-1")])
    await pq.push(conn, _items("other", "x", "x-1"))
    await conn.commit()
    answers = await pq.pop_many(conn, [
        {"queue": "shared"}, {"queue": "shared"},
        {"queue": "shared", "consumerGroup": "g"},  # another group: its own candidates
        {"queue": "other"},  # another queue
        {"queue": "shared", "batch": 30, "maxPartitions": 30},  # more than carried (14): reads afresh
        {"queue": "shared"}])  # nothing left for the group
    got = [[m["partition"] for m in a["messages"]] for a in answers]
    assert got[0] == ["p00"] and got[1] == ["p01"]  # oldest push first, as a pop reads them
    assert got[2] == ["p00"] and got[3] == ["x"]
    assert sorted(got[4]) == parts[2:] and got[5] == []
    leases = [a["leaseId"] for a in answers[:5]]
    assert len(set(leases)) == 5 and answers[5]["leaseId"] is None
    for a in answers[:5]:
        assert {m["leaseId"] for m in a["messages"]} == {a["leaseId"]}

    # the candidates are read once per call: a page of them looks up 16 cursors
    await pq.push(conn, [i for p in parts for i in _items("shared", p, f"{p}-2")])
    await pq.ack(conn, [a for answer in answers for a in _acks(answer)])
    await conn.commit()

    async def cursor_lookups(pops: int) -> int:
        # (the backend's counts, which it sends out only between transactions)
        scans = "SELECT idx_scan FROM pg_stat_xact_user_tables WHERE relid = 'conveyor.partition_cursors'::regclass"
        async with conn.transaction(force_rollback=True):
            before = (await (await conn.execute(scans)).fetchone())[0]
            answers = await pq.pop_many(conn, [{"queue": "shared"}] * pops)
            assert len({a["messages"][0]["partition"] for a in answers}) == pops
            return (await (await conn.execute(scans)).fetchone())[0] - before

    one, three = await cursor_lookups(1), await cursor_lookups(3)
    assert one >= 16 and three < one + 16, (one, three)


async def test_a_carried_candidate_taken_meanwhile_is_passed_over(conn, dsn):
    """A carried candidate is looked at again when it is tried: one that another
    consumer leased since it was listed, or that is gone, gives nothing, and the pop goes
    on to the rest."""
    await pq.push(conn, [i for p in ("a", "b", "c") for i in _items("carried", p, f"{p}-1")])
    await conn.commit()
    ids = dict(await (await conn.execute(
        "SELECT p.name, p.id FROM conveyor.partitions p JOIN conveyor.pqueues q ON q.id = p.queue_id "
        "WHERE q.name = 'carried'")).fetchall())
    await conn.commit()
    async with pool.connect(dsn) as other:
        taken = await pq.pop(other, {"queue": "carried", "partition": "a"})
        await other.commit()
        assert [m["partition"] for m in taken["messages"]] == ["a"]
    answer, left = await (await conn.execute(
        "SELECT answer, left_over FROM conveyor._pqueue_pop(%s, %s)",
        (json.dumps({"queue": "carried"}), [ids["a"], -1, ids["b"], ids["c"]]))).fetchone()
    assert [m["partition"] for m in answer["messages"]] == ["b"]
    assert left == [ids["c"]]  # what the next pop of the call would start with


@pytest.mark.own_cluster  # the mark moves only below the oldest transaction running anywhere on the server
async def test_a_pop_that_finds_nothing_is_a_read(conn):
    """An idle consumer polls: its pops must not write (a transaction id, WAL and a flush at
    commit each). Only the first pop after work was drained moves the group's mark."""
    await pq.push(conn, _items("idle", "p1", "a") + _items("idle", "p2", "b"))
    for partition in ("p1", "p2"):
        popped = await pq.pop(conn, {"queue": "idle", "partition": partition, "batch": 10})
        await pq.ack(conn, _acks(popped))
    await pq.push(conn, _items("idle", "p3", "c"))
    assert len((await pq.pop(conn, {"queue": "idle", "partition": "p3", "leaseSeconds": 60}))["messages"]) == 1
    await xmin.past_pushes(conn)  # (so that the mark can pass p1 to p3)
    assert (await pq.pop(conn, {"queue": "idle", "batch": 10}))["messages"] == []  # moves the mark
    # ...up to the oldest running transaction; a newer one, and the mark could move again:
    # a pop moved it (a write) over a range of no partitions
    await xmin.past(conn, "SELECT g.scanned_xid FROM conveyor.consumer_groups g WHERE g.name = '__QUEUE_MODE__'")

    new_group = {"queue": "idle", "consumerGroup": "g", "subscriptionMode": "new"}

    async def xid_of(request: dict) -> int | None:
        async with conn.transaction(force_rollback=True):
            answer = await pq.pop(conn, request)
            assert answer["messages"] == []
            return (await (await conn.execute("SELECT pg_current_xact_id_if_assigned()::text::bigint")).fetchone())[0]

    for request in ({"queue": "idle", "batch": 10},  # wildcard: drained partitions, and one leased
                    {"queue": "idle", "partition": "p1"},  # drained
                    {"queue": "idle", "partition": "p3"},  # leased to another
                    {"queue": "idle", "partition": "nowhere"},
                    new_group):  # a group's first pop makes the group and its cursors: a write
        xid = await xid_of(request)
        assert (xid is not None) == (request is new_group), request
    await pq.pop(conn, new_group)
    assert await xid_of(new_group) is None  # its first pop moved its mark past what it read


async def test_a_lazy_pop_that_only_leases_commits_without_waiting_for_the_flush(conn):
    """The server's pops (pop_many with lazy): a pop that only leases leaves its commit
    asynchronous (lost in a crash, its messages are delivered again, as after a lease's
    expiry); one that acknowledges (autoAck) or registers a group does not, nor does a
    call without lazy, nor the statements after a lazy call's commit."""
    for partition in ("p1", "p2", "p3"):
        await pq.push(conn, _items("lazy", partition, "a"))
    await pq.pop_many(conn, [{"queue": "lazy"}, {"queue": "lazy", "consumerGroup": "known"}])  # registers both

    async def commit_of(requests: list[dict], lazy: bool = True) -> str:
        async with conn.transaction(force_rollback=True):
            answers = await pq.pop_many(conn, requests, lazy=lazy)
            assert all(len(a["messages"]) == 1 for a in answers), answers
            return (await (await conn.execute("SHOW synchronous_commit")).fetchone())[0]

    leases = [{"queue": "lazy"}, {"queue": "lazy", "consumerGroup": "known"}]
    assert await commit_of(leases) == "off"
    assert await commit_of(leases, lazy=False) == "on"
    assert await commit_of([*leases, {"queue": "lazy", "consumerGroup": "auto", "autoAck": True}]) == "on"
    assert await commit_of([*leases[:1], {"queue": "lazy", "consumerGroup": "newcomer"}]) == "on"
    await pq.pop_many(conn, leases, lazy=True)  # committed (autocommit): the setting went with it
    assert (await (await conn.execute("SHOW synchronous_commit")).fetchone())[0] == "on"


async def test_priority_orders_queues_of_a_namespace(conn):
    await pq.configure(conn, "low", {"priority": 1}, namespace="billing")
    await pq.configure(conn, "high", {"priority": 9}, namespace="billing")
    await pq.push(conn, _items("low", "p", "l") + _items("high", "p", "h"))
    got = await pq.pop(conn, {"namespace": "billing", "batch": 1})
    assert [m["queue"] for m in got["messages"]] == ["high"]


async def test_a_transaction_is_all_or_nothing(conn):
    await pq.push(conn, _items("in", "p", "1"))
    got = await pq.pop(conn, {"queue": "in"})
    [ack] = _acks(got)
    bad = {**ack, "leaseId": "00000000-0000-0000-0000-000000000000"}
    with pytest.raises(errors.LeaseNotHeld):
        await pq.transaction(conn, [{"type": "push", "items": _items("out", "p", "r1")}, {"type": "ack", **bad}])
    await conn.rollback()
    assert await pq.get(conn, "out") is None  # the push was undone with the failed ack
    done = await pq.transaction(conn, [{"type": "ack", **ack}, {"type": "push", "items": _items("out", "p", "r1")}])
    assert [a["outcome"] for a in done["acks"]] == ["completed"]
    assert [p["status"] for p in done["pushes"]] == ["queued"]


async def test_concurrent_producers_committing_out_of_order_reach_every_group_once(dsn):
    """Producers push to a few partitions in transactions that commit in random order
    (some roll back) while workers of three groups pop and ack. Every committed message
    reaches every group exactly once, in push order within its partition."""
    async with pool.connect(dsn) as conn:
        await pq.configure(conn, "prop", {"leaseTime": 30})
    committed: dict[str, list[str]] = {p: [] for p in "xyz"}
    lock = asyncio.Lock()
    producing = True

    async def producer(n: int) -> None:
        async with pool.connect(dsn) as conn:
            for i in range(15):
                part = random.choice("xyz")
                txns = [f"{n}-{i}-{k}" for k in range(random.randint(1, 3))]
                rolled_back = random.random() < 0.2
                async with conn.transaction() as tx:
                    await pq.push(conn, _items("prop", part, *txns))
                    await asyncio.sleep(random.random() / 50)  # hold the partition: others wait
                    tx.force_rollback = rolled_back
                if not rolled_back:
                    async with lock:
                        committed[part].extend(txns)

    seen: dict[str, dict[str, list[str]]] = {g: {p: [] for p in "xyz"} for g in ("g1", "g2", "g3")}

    async def worker(group: str) -> None:
        async with pool.connect(dsn) as conn:
            idle = 0
            while idle < 20:
                got = await pq.pop(conn, {"queue": "prop", "consumerGroup": group, "batch": random.randint(1, 4)})
                if not got["messages"]:
                    idle = idle + 1 if not producing else 0
                    await asyncio.sleep(0.01)
                    continue
                for m in got["messages"]:
                    seen[group][m["partition"]].append(m["transactionId"])
                answers = await pq.ack(conn, _acks(got, group=group))
                assert {a["outcome"] for a in answers} == {"completed"}

    async def produce_all() -> None:
        nonlocal producing
        await asyncio.gather(*(producer(n) for n in range(4)))
        producing = False

    await asyncio.gather(produce_all(), *(worker(g) for g in ("g1", "g2", "g3", "g1", "g2", "g3")))
    for group in seen:
        for part in "xyz":
            got, want = seen[group][part], committed[part]
            assert got == want, (group, part, [t for t in want if t not in got], [t for t in got if t not in want],
                                 len(got), len(want), len(set(got)))


async def test_retention_removes_old_and_consumed_messages(conn):
    await pq.configure(conn, "short", {"retentionSeconds": 1})
    await pq.configure(conn, "done", {"completedRetentionSeconds": 1})
    await pq.push(conn, _items("short", "p", "a") + _items("done", "p", "x", "y"))
    got = await pq.pop(conn, {"queue": "done", "batch": 1})
    await pq.ack(conn, _acks(got))  # "x" consumed by the only group; "y" not yet
    await asyncio.sleep(1.1)
    assert await pq.maintain(conn) == 2
    left = await (await conn.execute("SELECT transaction_id FROM conveyor.partition_messages ORDER BY 1")).fetchall()
    assert left == [("y",)]
    again = await pq.pop(conn, {"queue": "done", "batch": 5})
    assert [m["transactionId"] for m in again["messages"]] == ["y"]  # the cursor is not disturbed
