"""Queue operations against a real PostgreSQL."""

from __future__ import annotations

import pytest

from conveyor import errors, types
from conveyor.core import messages, queues


async def test_create_defaults(conn):
    q = await queues.create(conn, "jobs")
    assert q.name == "jobs" and not q.fifo
    assert (q.visibility_timeout, q.delay_seconds, q.retention_seconds) == (30, 0, 345600)
    assert (q.max_message_size, q.receive_wait_seconds, q.max_receive_count) == (1048576, 0, None)


async def test_create_with_every_attribute(conn):
    await queues.create(conn, "dlq")
    q = await queues.create(conn, "Work-Items_1", {
        "visibility_timeout": 60, "delay_seconds": 5, "retention_seconds": 3600,
        "max_message_size": 2048, "receive_wait_seconds": 20, "max_receive_count": 3,
        "dead_letter_queue": "dlq",
    })
    assert q.attributes() == {
        "visibility_timeout": 60, "delay_seconds": 5, "retention_seconds": 3600,
        "max_message_size": 2048, "receive_wait_seconds": 20, "max_receive_count": 3,
        "dead_letter_queue": "dlq", "content_based_deduplication": False,
    }


async def test_create_is_idempotent_but_rejects_different_attributes(conn):
    first = await queues.create(conn, "jobs", {"visibility_timeout": 10})
    again = await queues.create(conn, "jobs", {"visibility_timeout": 10})
    assert again == first
    assert await queues.create(conn, "jobs") == first  # no attributes given: nothing to contradict
    with pytest.raises(errors.QueueAlreadyExists):
        await queues.create(conn, "jobs", {"visibility_timeout": 11})


async def test_fifo_follows_the_name(conn):
    q = await queues.create(conn, "orders.fifo", {"content_based_deduplication": True})
    assert q.fifo and q.content_based_deduplication
    with pytest.raises(errors.InvalidInput, match="FIFO"):
        await queues.create(conn, "plain", {"fifo": True})
    with pytest.raises(errors.InvalidInput, match="FIFO"):
        await queues.create(conn, "plain", {"content_based_deduplication": True})


@pytest.mark.parametrize("name", ["", "a" * 81, "has space", "semi;colon", "q'); drop table x; --",
                                  ".fifo", "x.fifo.fifo", "ünïcode", "a" * 76 + ".fifo"])
async def test_invalid_names_are_rejected(conn, name):
    with pytest.raises(errors.InvalidInput, match="invalid queue name"):
        await queues.create(conn, name)


async def test_longest_names_are_accepted(conn):
    assert (await queues.create(conn, "a" * 80)).name == "a" * 80
    assert (await queues.create(conn, "b" * 75 + ".fifo")).fifo


@pytest.mark.parametrize("attrs, fragment", [
    ({"visibility_timeout": -1}, "visibility_timeout"),
    ({"visibility_timeout": 43201}, "visibility_timeout"),
    ({"delay_seconds": 901}, "delay_seconds"),
    ({"retention_seconds": 59}, "retention_seconds"),
    ({"max_message_size": 1023}, "max_message_size"),
    ({"receive_wait_seconds": 21}, "receive_wait_seconds"),
    ({"max_receive_count": 0}, "max_receive_count"),
    ({"visibility_timeout": 1.5}, "visibility_timeout"),
    ({"visibility_timeout": "ten"}, "visibility_timeout"),
    ({"colour": "red"}, "unknown queue attribute"),
    ({"dead_letter_queue": "nope", "max_receive_count": 2}, "does not exist"),
    ({"dead_letter_queue": 5, "max_receive_count": 2}, "dead_letter_queue"),
])
async def test_invalid_attributes_are_rejected(conn, attrs, fragment):
    with pytest.raises((errors.InvalidInput, errors.QueueNotFound), match=fragment):
        await queues.create(conn, "jobs", attrs)


async def test_dead_letter_queue_needs_max_receive_count_and_same_type(conn):
    await queues.create(conn, "dlq")
    await queues.create(conn, "dlq.fifo")
    with pytest.raises(errors.InvalidInput, match="max_receive_count"):
        await queues.create(conn, "a", {"dead_letter_queue": "dlq"})
    with pytest.raises(errors.InvalidInput, match="FIFO"):
        await queues.create(conn, "b", {"dead_letter_queue": "dlq.fifo", "max_receive_count": 1})
    # a queue may be its own dead-letter queue, as on AWS (0022)
    q = await queues.alter(conn, "dlq", {"dead_letter_queue": "dlq", "max_receive_count": 1})
    assert q.dead_letter_queue == "dlq"


async def test_alter_changes_only_given_keys_and_null_resets(conn):
    await queues.create(conn, "dlq")
    await queues.create(conn, "jobs", {"visibility_timeout": 5, "max_receive_count": 2, "dead_letter_queue": "dlq"})
    q = await queues.alter(conn, "jobs", {"delay_seconds": 7})
    assert (q.visibility_timeout, q.delay_seconds, q.dead_letter_queue) == (5, 7, "dlq")
    q = await queues.alter(conn, "jobs", {"visibility_timeout": None, "dead_letter_queue": None,
                                          "max_receive_count": None})
    assert (q.visibility_timeout, q.dead_letter_queue, q.max_receive_count) == (30, None, None)
    assert q.updated_at >= q.created_at
    with pytest.raises(errors.QueueNotFound):
        await queues.alter(conn, "missing", {"delay_seconds": 1})


async def test_list_get_drop(conn):
    for name in ["b", "a", "c.fifo", "ab"]:
        await queues.create(conn, name)
    assert [q.name for q in await queues.list_all(conn)] == ["a", "ab", "b", "c.fifo"]
    assert [q.name for q in await queues.list_all(conn, prefix="a")] == ["a", "ab"]
    assert (await queues.get(conn, "b")).name == "b"
    assert await queues.drop(conn, "b") is True
    assert await queues.drop(conn, "b") is False
    with pytest.raises(errors.QueueNotFound):
        await queues.get(conn, "b")


async def test_drop_removes_messages_and_clears_dead_letter_links(conn):
    await queues.create(conn, "dlq")
    await queues.create(conn, "jobs", {"max_receive_count": 1, "dead_letter_queue": "dlq"})
    await messages.send(conn, "dlq", types.OutgoingMessage("x"))
    assert await queues.drop(conn, "dlq")
    assert (await queues.get(conn, "jobs")).dead_letter_queue is None
    await queues.create(conn, "dlq")
    assert (await queues.metrics(conn, "dlq")).queue_length == 0
    assert (await queues.metrics(conn, "dlq")).total_messages == 0


async def test_purge_counts_and_removes_everything(conn):
    await queues.create(conn, "jobs")
    await messages.send_batch(conn, "jobs", [types.OutgoingMessage(str(i)) for i in range(5)])
    await messages.receive(conn, "jobs", qty=2)
    assert await queues.purge(conn, "jobs") == 5
    assert (await queues.metrics(conn, "jobs")).queue_length == 0
    with pytest.raises(errors.QueueNotFound):
        await queues.purge(conn, "missing")


async def test_metrics(conn):
    await queues.create(conn, "dlq")
    await queues.create(conn, "jobs", {"max_receive_count": 5, "dead_letter_queue": "dlq"})
    await messages.send_batch(conn, "jobs", [types.OutgoingMessage(str(i)) for i in range(4)])
    await messages.send(conn, "jobs", types.OutgoingMessage("later", delay=60))
    await messages.send(conn, "dlq", types.OutgoingMessage("dead"))
    await messages.receive(conn, "jobs", qty=1)
    m = await queues.metrics(conn, "jobs")
    assert (m.queue_length, m.in_flight, m.delayed, m.total_messages) == (3, 1, 1, 5)
    assert (m.dead_letter_queue, m.dead_letter_length) == ("dlq", 1)
    assert m.oldest_msg_age_sec is not None and m.oldest_msg_age_sec >= 0
    assert [x.queue_name for x in await queues.metrics_all(conn)] == ["dlq", "jobs"]
    empty = await queues.metrics(conn, "dlq")
    assert empty.dead_letter_queue is None


async def test_listen_and_unknown_queue(conn):
    await queues.create(conn, "jobs")
    assert await queues.listen(conn, "jobs", 30) is not None
    with pytest.raises(errors.QueueNotFound):
        await queues.listen(conn, "nope", 30)


async def test_region_prefixed_names(conn):
    q = await queues.create(conn, "eu-west-1:jobs")
    assert q.name == "eu-west-1:jobs" and not q.fifo
    assert (await queues.create(conn, "eu-west-1:orders.fifo")).fifo
    with pytest.raises(errors.InvalidInput):
        await queues.create(conn, "Not A Region:jobs")
    assert [x.name for x in await queues.list_all(conn, prefix="eu-west-1:")] == ["eu-west-1:jobs",
                                                                                  "eu-west-1:orders.fifo"]


async def test_extra_attributes_merge_and_take_part_in_create_matching(conn):
    q = await queues.create(conn, "jobs", {"extra_attributes": {"Policy": "{}", "KmsMasterKeyId": "k1"}})
    assert q.extra_attributes == {"Policy": "{}", "KmsMasterKeyId": "k1"}
    assert (await queues.create(conn, "jobs", {"extra_attributes": {"KmsMasterKeyId": "k1"}})).name == "jobs"
    with pytest.raises(errors.QueueAlreadyExists):
        await queues.create(conn, "jobs", {"extra_attributes": {"KmsMasterKeyId": "k2"}})
    q = await queues.alter(conn, "jobs", {"extra_attributes": {"KmsMasterKeyId": None, "Other": "x"}})
    assert q.extra_attributes == {"Policy": "{}", "Other": "x"}
    with pytest.raises(errors.InvalidInput, match="extra_attributes"):
        await queues.alter(conn, "jobs", {"extra_attributes": ["not", "an", "object"]})


async def test_tags(conn):
    await queues.create(conn, "jobs")
    assert await queues.tag(conn, "jobs", {"team": "a", "env": "dev"}) == {"team": "a", "env": "dev"}
    assert await queues.tag(conn, "jobs", {"team": "b", "env": None}) == {"team": "b"}
    assert await queues.untag(conn, "jobs", ["team", "nope"]) == {}
    with pytest.raises(errors.InvalidInput, match="tags"):
        await queues.tag(conn, "jobs", {"n": 1})  # type: ignore[dict-item]
    with pytest.raises(errors.QueueNotFound):
        await queues.tag(conn, "missing", {"a": "b"})


async def test_purge_records_when(conn):
    await queues.create(conn, "jobs")
    assert (await queues.get(conn, "jobs")).purged_at is None
    await queues.purge(conn, "jobs")
    assert (await queues.get(conn, "jobs")).purged_at is not None
