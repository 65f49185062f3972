"""Publishing: one SQL call fans a message out to every matching queue and endpoint
inside the caller's transaction; raw and enveloped deliveries; filter policies; FIFO
targets; waking listeners."""

from __future__ import annotations

import asyncio
import json
import uuid

import psycopg
import pytest

from conveyor import errors, types
from conveyor.core import messages, queues, signing, topics

Sub = types.NewSubscription
P = types.Publication
URLS = types.TopicUrls(region="us-east-1", account_id="123456789012", base_url="http://sns.test:9324")


@pytest.fixture
async def signer(conn) -> signing.Signer:
    return await signing.load_or_create(conn)


async def _bodies(conn, queue: str) -> list[str]:
    return [m.body for m in await messages.receive(conn, queue, qty=100)]


async def test_fan_out_to_every_matching_queue(conn, signer):
    for q in ("all", "orders", "created", "eu", "none"):
        await queues.create(conn, q)
    await topics.subscribe(conn, Sub(pattern="#", queue="all", raw_delivery=True))
    await topics.subscribe(conn, Sub(pattern="orders.#", queue="orders", raw_delivery=True))
    await topics.subscribe(conn, Sub(pattern="*.created", queue="created", raw_delivery=True))
    await topics.subscribe(conn, Sub(pattern="orders.created.eu", queue="eu", raw_delivery=True))
    await topics.subscribe(conn, Sub(pattern="invoices.*", queue="none", raw_delivery=True))
    published = await topics.publish(conn, "orders.created", P("m1"), signer=signer, urls=URLS)
    assert published.queues == ("all", "orders", "created") and published.queues_matched == 3
    assert published.endpoints == 0
    assert isinstance(published.message_id, uuid.UUID)
    stored = {c.queue: c for c in published.messages}
    assert sorted(stored) == ["all", "created", "orders"]
    for q, expected in {"all": ["m1"], "orders": ["m1"], "created": ["m1"], "eu": [], "none": []}.items():
        got = await messages.receive(conn, q, qty=100)
        assert [m.body for m in got] == expected, q
        if got:  # the publish names the message it stored in each queue
            assert (got[0].id, got[0].message_uuid) == (stored[q].id, stored[q].message_uuid)
    only_all = await topics.publish(conn, "unheard.of", P("m2"), signer=signer, urls=URLS)
    assert only_all.queues == ("all",) and only_all.endpoints == 0
    assert await _bodies(conn, "all") == ["m2"]


async def test_a_rollback_publishes_nothing(dsn, conn, signer):
    await queues.create(conn, "q")
    await topics.subscribe(conn, Sub(pattern="orders", queue="q"))
    await topics.subscribe(conn, Sub(pattern="orders", protocol="http", endpoint="http://127.0.0.1:1/hook"))
    async with await psycopg.AsyncConnection.connect(dsn) as tx:  # not autocommit: one transaction
        published = await topics.publish(tx, "orders", P("gone"), signer=signer, urls=URLS)
        assert published.queues == ("q",) and published.endpoints == 1
        await tx.rollback()
    assert await _bodies(conn, "q") == []
    assert await topics.delivery_list(conn) == []
    async with await psycopg.AsyncConnection.connect(dsn) as tx:
        await topics.publish(tx, "orders", P("kept"), signer=signer, urls=URLS)
        assert await _bodies(conn, "q") == []  # not visible before the commit
        await tx.commit()
    assert len(await _bodies(conn, "q")) == 1
    assert len(await topics.delivery_list(conn)) == 1


async def test_envelope_is_snss_and_its_signature_verifies(conn, signer):
    await queues.create(conn, "q")
    sub = await topics.subscribe(conn, Sub(pattern="orders.*", queue="q"))
    attributes = {"kind": {"DataType": "String", "StringValue": "big"},
                  "n": {"DataType": "Number", "StringValue": "5"},
                  "b": {"DataType": "Binary", "BinaryValue": "aGk="}}
    published = await topics.publish(conn, "orders.created", P('héllo "world"\n', subject="Hi",
                                                               attributes=attributes), signer=signer, urls=URLS)
    [m] = await messages.receive(conn, "q")
    assert m.content_type == types.JSON_CONTENT_TYPE and m.headers is None
    envelope = json.loads(m.body)
    assert list(envelope) == ["Type", "MessageId", "TopicArn", "Subject", "Message", "Timestamp",
                              "SignatureVersion", "Signature", "SigningCertURL", "UnsubscribeURL",
                              "MessageAttributes"]
    assert envelope["Type"] == "Notification"
    assert envelope["MessageId"] == str(published.message_id)
    assert envelope["TopicArn"] == "arn:aws:sns:us-east-1:123456789012:orders.created"
    assert envelope["Message"] == 'héllo "world"\n' and envelope["Subject"] == "Hi"
    assert envelope["Timestamp"] == published.timestamp
    assert envelope["SignatureVersion"] == "2"
    assert envelope["SigningCertURL"] == f"http://sns.test:9324/SimpleNotificationService-{signer.digest}.pem"
    assert envelope["UnsubscribeURL"] == ("http://sns.test:9324/?Action=Unsubscribe&SubscriptionArn="
                                          f"arn:aws:sns:us-east-1:123456789012:orders.*:{sub.uuid}")
    assert envelope["MessageAttributes"] == {"b": {"Type": "Binary", "Value": "aGk="},
                                             "kind": {"Type": "String", "Value": "big"},
                                             "n": {"Type": "Number", "Value": "5"}}
    assert signing.verify(signer.certificate_pem, envelope)
    assert not signing.verify(signer.certificate_pem, {**envelope, "Message": "tampered"})


async def test_raw_delivery_keeps_the_body_and_attributes(conn, signer):
    await queues.create(conn, "q")
    await topics.subscribe(conn, Sub(pattern="orders", queue="q", raw_delivery=True))
    attributes = {"kind": {"DataType": "String", "StringValue": "big"}}
    await topics.publish(conn, "orders", P('{"id": 1}', attributes=attributes,
                                           content_type=types.JSON_CONTENT_TYPE), signer=signer, urls=URLS)
    await topics.publish(conn, "orders", P("plain"), signer=signer, urls=URLS)
    first, second = await messages.receive(conn, "q", qty=10)
    assert (first.body, first.headers, first.content_type) == ('{"id": 1}', attributes, types.JSON_CONTENT_TYPE)
    assert (second.body, second.headers, second.content_type) == ("plain", None, None)


async def test_unsigned_envelopes_without_a_signer(conn):
    await queues.create(conn, "q")
    await topics.subscribe(conn, Sub(pattern="orders", queue="q"))
    await topics.publish(conn, "orders", P("x"), signer=None, urls=URLS)
    [m] = await messages.receive(conn, "q")
    envelope = json.loads(m.body)
    assert "Signature" not in envelope and "SigningCertURL" not in envelope and "Subject" not in envelope
    assert envelope["Message"] == "x"


async def test_publishing_from_sql_alone(conn):
    """The SQL API works from psql: a message with just a body."""
    await queues.create(conn, "q")
    await topics.subscribe(conn, Sub(pattern="orders.*", queue="q"))
    cur = await conn.execute("""SELECT * FROM conveyor.topic_publish('orders.new', '{"body": "from psql"}')""")
    queues_, endpoints, sequence, [copy], sealed = await cur.fetchone()
    assert sealed == []  # no encrypted queue: nothing left for the caller to seal
    assert (queues_, endpoints, sequence) == (["q"], 0, None)
    assert (copy["queue"], copy["id"]) == ("q", 1)
    [m] = await messages.receive(conn, "q")
    envelope = json.loads(m.body)
    assert envelope["Message"] == "from psql"
    assert envelope["TopicArn"] == "arn:aws:sns:us-east-1:000000000000:orders.new"
    uuid.UUID(envelope["MessageId"])
    assert envelope["Timestamp"].endswith("Z")


async def test_http_subscriptions_get_outbox_rows(conn, signer):
    raw = await topics.subscribe(conn, Sub(pattern="orders.*", protocol="http", endpoint="http://127.0.0.1:9/raw",
                                           raw_delivery=True))
    env = await topics.subscribe(conn, Sub(pattern="#", protocol="https", endpoint="https://h.example/env"))
    await topics.subscribe(conn, Sub(pattern="invoices", protocol="http", endpoint="http://127.0.0.1:9/no"))
    published = await topics.publish(conn, "orders.created", P("hello", subject="S"), signer=signer, urls=URLS)
    assert published.endpoints == 2 and published.queues == ()
    first, second = await topics.delivery_list(conn)
    assert (first.subscription_id, first.endpoint, first.payload) == (raw.id, "http://127.0.0.1:9/raw", "hello")
    assert first.message_id == published.message_id and first.attempt == 0 and first.max_attempts == 4  # SNS: the first try and 3 retries
    assert first.state == "pending" and first.held_reason is None
    topic_arn = "arn:aws:sns:us-east-1:123456789012:orders.created"
    assert first.headers == {
        "Content-Type": "text/plain; charset=UTF-8", "x-amz-sns-message-type": "Notification",
        "x-amz-sns-message-id": str(published.message_id), "x-amz-sns-topic-arn": topic_arn,
        "x-amz-sns-subscription-arn": f"arn:aws:sns:us-east-1:123456789012:orders.*:{raw.uuid}",
        "x-amz-sns-rawdelivery": "true"}
    assert second.subscription_id == env.id and "x-amz-sns-rawdelivery" not in second.headers
    envelope = json.loads(second.payload)
    assert envelope["Message"] == "hello" and signing.verify(signer.certificate_pem, envelope)
    # '#' is a URL fragment marker, so the ARN in the URL spells it %23
    assert envelope["UnsubscribeURL"].endswith(f"SubscriptionArn=arn:aws:sns:us-east-1:123456789012:%23:{env.uuid}")


async def test_per_protocol_bodies_are_signed_each(conn, signer):
    await queues.create(conn, "q")
    await topics.subscribe(conn, Sub(pattern="t", queue="q"))
    await topics.subscribe(conn, Sub(pattern="t", protocol="http", endpoint="http://127.0.0.1:9/x"))
    await topics.publish(conn, "t", P("default", bodies={"sqs": "for queues"}), signer=signer, urls=URLS)
    [m] = await messages.receive(conn, "q")
    [d] = await topics.delivery_list(conn)
    for envelope, text in ((json.loads(m.body), "for queues"), (json.loads(d.payload), "default")):
        assert envelope["Message"] == text
        assert signing.verify(signer.certificate_pem, envelope)


async def test_filter_policies_decide_who_gets_a_message(conn, signer):
    for q in ("attrs", "body", "none", "all"):
        await queues.create(conn, q)
    await topics.subscribe(conn, Sub(pattern="t", queue="attrs", raw_delivery=True,
                                     filter_policy={"kind": ["big"], "n": [{"numeric": [">", 3]}]}))
    await topics.subscribe(conn, Sub(pattern="t", queue="body", raw_delivery=True, filter_policy_scope="MessageBody",
                                     filter_policy={"order": {"total": [{"numeric": [">=", 100]}]}}))
    await topics.subscribe(conn, Sub(pattern="t", queue="none", raw_delivery=True, filter_policy={"kind": ["tiny"]}))
    await topics.subscribe(conn, Sub(pattern="t", queue="all", raw_delivery=True))
    big = {"kind": {"DataType": "String", "StringValue": "big"}, "n": {"DataType": "Number", "StringValue": "4"}}
    p1 = await topics.publish(conn, "t", P('{"order": {"total": 150}}', attributes=big), signer=signer, urls=URLS)
    p2 = await topics.publish(conn, "t", P('{"order": {"total": 50}}', attributes=big), signer=signer, urls=URLS)
    p3 = await topics.publish(conn, "t", P("not json"), signer=signer, urls=URLS)
    assert p1.queues == ("attrs", "body", "all")
    assert p2.queues == ("attrs", "all")
    assert p3.queues == ("all",)
    assert len(await _bodies(conn, "attrs")) == 2 and len(await _bodies(conn, "none")) == 0


async def test_unconfirmed_subscriptions_get_nothing(conn, signer):
    await queues.create(conn, "q")
    await topics.subscribe(conn, Sub(pattern="t", queue="q", confirmed=False))
    assert (await topics.publish(conn, "t", P("x"), signer=signer, urls=URLS)).queues == ()


async def test_fifo_routing_keys_deliver_in_groups_and_deduplicate(conn, signer):
    await queues.create(conn, "f.fifo")
    await queues.create(conn, "std")
    await topics.create(conn, "orders.fifo", {"FifoTopic": "true", "ContentBasedDeduplication": "true"})
    await topics.subscribe(conn, Sub(pattern="orders.fifo", queue="f.fifo", raw_delivery=True))
    await topics.subscribe(conn, Sub(pattern="orders.fifo", queue="std", raw_delivery=True))
    with pytest.raises(errors.InvalidInput, match="group_id"):
        await topics.publish(conn, "orders.fifo", P("a"), signer=signer, urls=URLS)
    first = await topics.publish(conn, "orders.fifo", P("a", group_id="g1"), signer=signer, urls=URLS)
    again = await topics.publish(conn, "orders.fifo", P("a", group_id="g1"), signer=signer, urls=URLS)
    await topics.publish(conn, "orders.fifo", P("b", group_id="g1", dedup_id="d-b"), signer=signer, urls=URLS)
    assert first.queues == ("f.fifo", "std") and first.sequence_number is not None
    assert int(again.sequence_number) > int(first.sequence_number)
    got = await messages.receive(conn, "f.fifo", qty=10)
    assert [(m.body, m.group_id) for m in got] == [("a", "g1"), ("b", "g1")]  # the repeat was deduplicated
    assert got[0].dedup_id == signing_hash("a") and got[1].dedup_id == "d-b"
    std = await messages.receive(conn, "std", qty=10)
    # a FIFO topic's group orders its FIFO queues only: standard queues get none, as on SNS
    assert [(m.body, m.group_id, m.dedup_id) for m in std] == [("a", None, None), ("a", None, None),
                                                              ("b", None, None)]


async def test_fifo_queue_content_based_deduplication_hashes_the_message(conn, signer):
    await queues.create(conn, "f.fifo", {"content_based_deduplication": True})
    await topics.subscribe(conn, Sub(pattern="x.fifo", queue="f.fifo"))  # enveloped
    for _ in range(2):
        await topics.publish(conn, "x.fifo", P("same", group_id="g"), signer=signer, urls=URLS)
    [m] = await messages.receive(conn, "f.fifo", qty=10)
    assert json.loads(m.body)["Message"] == "same" and json.loads(m.body)["SequenceNumber"]


def signing_hash(body: str) -> str:
    import hashlib

    return hashlib.sha256(body.encode()).hexdigest()


async def test_queue_rules_apply_to_published_copies(conn, signer):
    await queues.create(conn, "small", {"max_message_size": 1024})
    await queues.create(conn, "slow", {"delay_seconds": 60})
    await topics.subscribe(conn, Sub(pattern="big", queue="small", raw_delivery=True))
    await topics.subscribe(conn, Sub(pattern="later", queue="slow", raw_delivery=True))
    with pytest.raises(errors.MessageTooLarge):
        await topics.publish(conn, "big", P("x" * 2000), signer=signer, urls=URLS)
    await topics.publish(conn, "later", P("x"), signer=signer, urls=URLS)
    assert await _bodies(conn, "slow") == []  # the queue's delay
    await topics.publish(conn, "big", P("now", delay=0), signer=signer, urls=URLS)
    assert await _bodies(conn, "small") == ["now"]
    with pytest.raises(errors.InvalidInput, match="delay"):
        await topics.publish(conn, "big", P("x", delay=901), signer=signer, urls=URLS)
    with pytest.raises(errors.InvalidInput, match="NUL"):
        await topics.publish(conn, "big", P("a\x00b"), signer=signer, urls=URLS)
    with pytest.raises(errors.InvalidInput, match="invalid routing key"):
        await topics.publish(conn, "bad key", P("x"), signer=signer, urls=URLS)


async def test_region_prefixed_keys_name_their_region_in_arns(conn, signer):
    await queues.create(conn, "q")
    sub = await topics.subscribe(conn, Sub(pattern="eu-west-1:orders", queue="q"))
    await topics.publish(conn, "eu-west-1:orders", P("x"), signer=signer, urls=URLS)
    envelope = json.loads((await messages.receive(conn, "q"))[0].body)
    assert envelope["TopicArn"] == "arn:aws:sns:eu-west-1:123456789012:orders"
    assert envelope["UnsubscribeURL"].endswith(f"arn:aws:sns:eu-west-1:123456789012:orders:{sub.uuid}")
    assert signing.verify(signer.certificate_pem, envelope)


async def test_publish_wakes_listening_receivers(dsn, conn, signer):
    """A queue with long-pollers (queue_listen) gets a NOTIFY at commit, as for a send."""
    await queues.create(conn, "q")
    await topics.subscribe(conn, Sub(pattern="t", queue="q"))
    await queues.listen(conn, "q", 60)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
        await listener.execute("LISTEN conveyor_queue")
        await topics.publish(conn, "t", P("x"), signer=signer, urls=URLS)
        notice = await asyncio.wait_for(anext(listener.notifies()), timeout=5)
    assert notice.payload == "1 q"


async def test_publish_is_one_statement_for_many_subscriptions(conn, signer):
    """A hundred queues get their copy from one call; each queue keeps its own ids."""
    for i in range(100):
        await queues.create(conn, f"q{i}")
        await topics.subscribe(conn, Sub(pattern="wide.*", queue=f"q{i}", raw_delivery=i % 2 == 0))
    published = await topics.publish(conn, "wide.open", P("fan"), signer=signer, urls=URLS)
    assert len(published.queues) == 100
    cur = await conn.execute("SELECT count(*), count(DISTINCT queue_id), max(id) FROM conveyor.messages")
    assert await cur.fetchone() == (100, 100, 1)


# -- queues that do not exist yet ----------------------------------------------------------------

def _waiting(name: str = "later") -> Sub:
    return Sub(pattern="orders", queue=name, raw_delivery=True, queue_must_exist=False)


async def test_what_is_published_for_a_queue_not_created_yet_waits_for_it(conn, signer):
    sub = await topics.subscribe(conn, _waiting())
    assert sub.queue == "later"
    attrs = {"kind": {"DataType": "String", "StringValue": "created"}}
    first = await topics.publish(conn, "orders", P("first", attributes=attrs, group_id="g"), signer=signer, urls=URLS)
    assert first.queues == () and first.endpoints == 0
    await topics.publish(conn, "orders", P("second"), signer=signer, urls=URLS)
    held = await topics.delivery_list(conn, "held")
    assert [d.payload for d in held] == ["first", "second"]
    assert all(d.endpoint == "arn:aws:sqs:us-east-1:123456789012:later" and d.subscription_id == sub.id
               and d.held_reason == "SQS queue 'later' does not exist: held until it is created" for d in held)
    assert (await topics.deliveries_stats(conn)).held == 2
    assert await topics.delivery_claim(conn, 10, 30) == []  # never the webhook worker's
    assert await topics.delivery_retry(conn) == 0  # still no queue: still held
    assert len(await topics.delivery_list(conn, "held")) == 2

    await queues.create(conn, "later")  # delivers what waited, in publish order
    got = await messages.receive(conn, "later", qty=10)
    assert [m.body for m in got] == ["first", "second"]
    assert got[0].group_id == "g" and got[0].headers["kind"]["StringValue"] == "created"
    assert await topics.delivery_list(conn) == []
    assert (await topics.subscription_get(conn, sub.id)).queue == "later"
    third = await topics.publish(conn, "orders", P("third"), signer=signer, urls=URLS)
    assert third.queues == ("later",)
    assert await _bodies(conn, "later") == ["third"]


async def test_a_queue_with_storage_of_its_own_created_later_gets_what_waited(conn, signer):
    # its tables exist before the queue_created trigger delivers into them
    await topics.subscribe(conn, _waiting("later-parts"))
    await topics.publish(conn, "orders", P("first"), signer=signer, urls=URLS)
    await queues.create(conn, "later-parts", {"storage": "partitioned", "partition_interval": 10})
    assert [m.body for m in await messages.receive(conn, "later-parts", qty=10)] == ["first"]
    cur = await conn.execute("SELECT m.tableoid::regclass::text FROM conveyor.messages m "
                             "JOIN conveyor.queues q ON q.id = m.queue_id WHERE q.name = 'later-parts'")
    assert (await cur.fetchone())[0].startswith("conveyor.messages_q")
    await topics.publish(conn, "orders", P("second"), signer=signer, urls=URLS)
    assert await _bodies(conn, "later-parts") == ["second"]


async def test_a_fifo_queue_created_later_deduplicates_what_waited(conn, signer):
    await topics.create(conn, "orders.fifo", {"ContentBasedDeduplication": "false"})
    await topics.subscribe(conn, Sub(pattern="orders.fifo", queue="later.fifo", raw_delivery=True,
                                     queue_must_exist=False))
    for body in ("a", "a", "b"):
        await topics.publish(conn, "orders.fifo", P(body, group_id="g"), signer=signer, urls=URLS)
    await queues.create(conn, "later.fifo", {"content_based_deduplication": True})
    assert [m.body for m in await messages.receive(conn, "later.fifo", qty=10)] == ["a", "b"]
    with pytest.raises(errors.InvalidInput):  # a standard routing key does not feed a FIFO queue
        await topics.subscribe(conn, Sub(pattern="orders", queue="other.fifo", queue_must_exist=False))


async def test_unsubscribing_drops_what_waited_and_a_refused_message_stays_held(conn, signer):
    sub = await topics.subscribe(conn, _waiting())
    await topics.publish(conn, "orders", P("gone"), signer=signer, urls=URLS)
    await topics.unsubscribe(conn, sub.id)
    assert await topics.delivery_list(conn) == []

    await topics.subscribe(conn, _waiting("small"))
    await topics.publish(conn, "orders", P("x" * 2000), signer=signer, urls=URLS)
    await topics.publish(conn, "orders", P("fits"), signer=signer, urls=URLS)
    await queues.create(conn, "small", {"max_message_size": 1024})  # the queue is created all the same
    assert await _bodies(conn, "small") == ["fits"]
    [refused] = await topics.delivery_list(conn, "held")
    assert refused.held_reason.startswith("SQS queue 'small' refused the message: ")
    await queues.alter(conn, "small", {"max_message_size": 4096})
    assert await topics.delivery_retry(conn, [refused.id]) == 1
    assert await _bodies(conn, "small") == ["x" * 2000]


async def test_a_queue_created_during_a_publish_gets_its_message(dsn, conn, signer):
    """A publish that saw no queue holds its subscription's row until it commits; the
    queue's creation waits for it and then takes the held message."""
    await topics.subscribe(conn, _waiting())
    async with await psycopg.AsyncConnection.connect(dsn) as tx:  # one transaction, left open
        await topics.publish(tx, "orders", P("in flight"), signer=signer, urls=URLS)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
            creating = asyncio.create_task(queues.create(other, "later"))
            await asyncio.sleep(0.5)
            assert not creating.done()
            await tx.commit()
            await asyncio.wait_for(creating, 10)
    assert await _bodies(conn, "later") == ["in flight"]
    assert await topics.delivery_list(conn) == []


async def test_a_publish_during_a_queue_creation_delivers_to_it(dsn, conn, signer):
    """A queue being created (not yet committed) has linked the subscription: a publish
    waits for it and then delivers into the queue directly."""
    await topics.subscribe(conn, _waiting())
    async with await psycopg.AsyncConnection.connect(dsn) as tx:
        await queues.create(tx, "later")
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
            publishing = asyncio.create_task(topics.publish(other, "orders", P("after"), signer=signer, urls=URLS))
            await asyncio.sleep(0.5)
            assert not publishing.done()
            await tx.commit()
            assert (await asyncio.wait_for(publishing, 10)).queues == ("later",)
    assert await _bodies(conn, "later") == ["after"]
    assert await topics.delivery_list(conn) == []
