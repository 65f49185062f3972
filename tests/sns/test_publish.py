"""SNS Publish and PublishBatch through boto3 in both wire protocols, read back with boto3's
SQS client: the signed envelope (verified with the certificate the server serves, as an SNS
client verifies it), raw delivery, filter policies on attributes and on the body,
MessageStructure=json, FIFO topics into FIFO queues, batches, and SNS's errors."""

from __future__ import annotations

import base64
import json
import re
import uuid

import botocore.exceptions
import httpx
import psycopg
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding

from support.sns_clients import (
    ACCOUNT,
    REGION,
    error_code,
    receive_all,
    sns_client,
    status_code,
    subscribe_http,
    unique,
)
from support.sqs_clients import client as sqs_client

pytestmark = pytest.mark.slow

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def _fails(call, code: str, status: int = 400, message: str | None = None) -> None:
    with pytest.raises(botocore.exceptions.ClientError) as info:
        call()
    assert error_code(info.value) == code, info.value.response
    assert status_code(info.value) == status
    if message is not None:
        assert info.value.response["Error"]["Message"] == message


def verify_sns_signature(envelope: dict[str, str]) -> bool:
    """What an SNS client does: fetch SigningCertURL, build the canonical string of the
    signed fields (name and value, each followed by a newline, in field-name order;
    Subject only when present) and check the RSA signature with the certificate: SHA1 for
    SignatureVersion 1 (SNS's default), SHA256 for 2."""
    assert envelope["SignatureVersion"] in ("1", "2")
    pem = httpx.get(envelope["SigningCertURL"]).raise_for_status().content
    certificate = x509.load_pem_x509_certificate(pem)
    names = ["Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"]
    canonical = "".join(f"{n}\n{envelope[n]}\n" for n in names if n in envelope)
    try:
        certificate.public_key().verify(base64.b64decode(envelope["Signature"]), canonical.encode(),
                                        padding.PKCS1v15(),
                                        hashes.SHA1() if envelope["SignatureVersion"] == "1" else hashes.SHA256())
    except Exception:  # noqa: BLE001 - any failure to verify is "not verified"
        return False
    return True


def _subscribe_queue(sns, make_queue, topic_arn: str, **attributes: str) -> tuple[str, str]:
    url, queue_arn = make_queue()
    sub = sns.subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=queue_arn, Attributes=attributes,
                        ReturnSubscriptionArn=True)["SubscriptionArn"]
    return url, sub


def test_fan_out_to_queues_with_signed_envelopes(server, sns, sqs, make_topic, make_queue):
    topic = make_topic()
    (url_a, _), (url_b, _) = (_subscribe_queue(sns, make_queue, topic) for _ in range(2))
    sent = sns.publish(TopicArn=topic, Message='héllo {"x": 1}', Subject="Greetings",
                       MessageAttributes={"colour": {"DataType": "String", "StringValue": "blue"},
                                          "size": {"DataType": "Number", "StringValue": "42"},
                                          "blob": {"DataType": "Binary", "BinaryValue": b"\x00\xff"}})
    message_id = sent["MessageId"]
    assert uuid.UUID(message_id)
    for url in (url_a, url_b):
        [msg] = receive_all(sqs, url, 1)
        envelope = json.loads(msg["Body"])
        assert envelope["Type"] == "Notification"
        assert envelope["MessageId"] == message_id
        assert envelope["TopicArn"] == topic
        assert envelope["Message"] == 'héllo {"x": 1}'
        assert envelope["Subject"] == "Greetings"
        assert TIMESTAMP.match(envelope["Timestamp"])
        assert re.fullmatch(re.escape(server.url) + r"/SimpleNotificationService-[0-9a-f]{32}\.pem",
                            envelope["SigningCertURL"])
        assert envelope["UnsubscribeURL"].startswith(f"{server.url}/?Action=Unsubscribe&SubscriptionArn=")
        assert envelope["MessageAttributes"] == {"blob": {"Type": "Binary", "Value": "AP8="},
                                                 "colour": {"Type": "String", "Value": "blue"},
                                                 "size": {"Type": "Number", "Value": "42"}}
        assert verify_sns_signature(envelope)
        assert not verify_sns_signature({**envelope, "Message": "tampered"})


def test_envelope_without_subject_verifies_and_its_unsubscribe_url_needs_credentials(server, sns, sqs, make_topic, make_queue):
    topic = make_topic()
    url, sub = _subscribe_queue(sns, make_queue, topic)
    sns.publish(TopicArn=topic, Message="no subject")
    [msg] = receive_all(sqs, url, 1)
    envelope = json.loads(msg["Body"])
    assert "Subject" not in envelope and verify_sns_signature(envelope)
    assert envelope["UnsubscribeURL"].endswith(sub)
    # a queue subscription authenticates on unsubscribe: whoever may browse the queue sees
    # the link, so without credentials it is refused (docs/sns.md); Unsubscribe removes it
    answer = httpx.get(envelope["UnsubscribeURL"])
    assert answer.status_code == 403 and "<Code>AuthorizationError</Code>" in answer.text
    assert sub in [s["SubscriptionArn"] for s in sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"]]
    sns.unsubscribe(SubscriptionArn=sub)
    assert sub not in [s["SubscriptionArn"] for s in sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"]]


def test_raw_delivery_to_a_queue(sns, sqs, make_topic, make_queue):
    topic = make_topic()
    url, sub = _subscribe_queue(sns, make_queue, topic, RawMessageDelivery="true")
    sns.publish(TopicArn=topic, Message="just the body",
                MessageAttributes={"kind": {"DataType": "String", "StringValue": "raw"},
                                   "list": {"DataType": "String.Array", "StringValue": '["a", 1]'}})
    [msg] = receive_all(sqs, url, 1)
    assert msg["Body"] == "just the body"
    assert msg["MessageAttributes"]["kind"] == {"DataType": "String", "StringValue": "raw"}
    assert msg["MessageAttributes"]["list"]["StringValue"] == '["a", 1]'
    sqs.delete_message(QueueUrl=url, ReceiptHandle=msg["ReceiptHandle"])
    # switching it off brings the envelope back
    sns.set_subscription_attributes(SubscriptionArn=sub, AttributeName="RawMessageDelivery", AttributeValue="false")
    sns.publish(TopicArn=topic, Message="wrapped")
    [msg] = receive_all(sqs, url, 1)
    assert json.loads(msg["Body"])["Message"] == "wrapped"


def test_filter_policies_on_attributes_and_body(sns, sqs, make_topic, make_queue):
    topic = make_topic()
    policy = {"colour": ["blue", {"prefix": "gr"}], "size": [{"numeric": [">", 10]}]}
    url_attr, sub_attr = _subscribe_queue(sns, make_queue, topic, FilterPolicy=json.dumps(policy))
    url_body, _ = _subscribe_queue(sns, make_queue, topic, FilterPolicy=json.dumps({"order": {"total": [
        {"numeric": [">=", 100]}]}}), FilterPolicyScope="MessageBody")
    url_all, _ = _subscribe_queue(sns, make_queue, topic)

    def publish(body: str, colour: str | None = None, size: str | None = None) -> None:
        attributes = {}
        if colour:
            attributes["colour"] = {"DataType": "String", "StringValue": colour}
        if size:
            attributes["size"] = {"DataType": "Number", "StringValue": size}
        sns.publish(TopicArn=topic, Message=body, MessageAttributes=attributes)

    publish("a", "blue", "11")                          # attr: yes
    publish("b", "green", "50")                         # attr: yes (prefix gr)
    publish("c", "blue", "5")                           # attr: no (size)
    publish("d", "red", "99")                           # attr: no (colour)
    publish(json.dumps({"order": {"total": 150}}))      # body: yes
    publish(json.dumps({"order": {"total": 5}}))        # body: no
    publish("not json")                                 # body: no
    assert sorted(json.loads(m["Body"])["Message"] for m in receive_all(sqs, url_all, 7)) == sorted(
        ["a", "b", "c", "d", json.dumps({"order": {"total": 150}}), json.dumps({"order": {"total": 5}}), "not json"])
    assert sorted(json.loads(m["Body"])["Message"] for m in receive_all(sqs, url_attr, 2)) == ["a", "b"]
    assert [json.loads(m["Body"])["Message"] for m in receive_all(sqs, url_body, 1)] == [
        json.dumps({"order": {"total": 150}})]
    assert receive_all(sqs, url_attr, 3, timeout=1.0)[2:] == []

    attrs = sns.get_subscription_attributes(SubscriptionArn=sub_attr)["Attributes"]
    assert json.loads(attrs["FilterPolicy"]) == policy and attrs["FilterPolicyScope"] == "MessageAttributes"
    # removing the policy lets everything through
    sns.set_subscription_attributes(SubscriptionArn=sub_attr, AttributeName="FilterPolicy", AttributeValue="")
    assert "FilterPolicy" not in sns.get_subscription_attributes(SubscriptionArn=sub_attr)["Attributes"]
    _fails(lambda: sns.set_subscription_attributes(SubscriptionArn=sub_attr, AttributeName="FilterPolicy",
                                                   AttributeValue='{"a": "not a list"}'), "InvalidParameter")


def test_message_structure_json(sns, sqs, make_topic, make_queue):
    topic = make_topic()
    url, _ = _subscribe_queue(sns, make_queue, topic)
    sns.publish(TopicArn=topic, MessageStructure="json",
                Message=json.dumps({"default": "for everyone", "sqs": "for queues", "http": "for webhooks"}))
    [msg] = receive_all(sqs, url, 1)
    envelope = json.loads(msg["Body"])
    assert envelope["Message"] == "for queues" and verify_sns_signature(envelope)
    _fails(lambda: sns.publish(TopicArn=topic, MessageStructure="json", Message="{oops"), "InvalidParameter",
           message="Invalid parameter: Message Structure - JSON message body failed to parse")
    _fails(lambda: sns.publish(TopicArn=topic, MessageStructure="json", Message='{"sqs": "x"}'), "InvalidParameter",
           message="Invalid parameter: Message Structure - No default entry in JSON message body")
    _fails(lambda: sns.publish(TopicArn=topic, MessageStructure="xml", Message="x"), "InvalidParameter")


def test_fifo_topic_to_fifo_queue(sns, sqs, make_queue):
    topic = sns.create_topic(Name=unique() + ".fifo", Attributes={"FifoTopic": "true"})["TopicArn"]
    url, queue_arn = make_queue(".fifo", FifoQueue="true")
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn, Attributes={"RawMessageDelivery": "true"})
    first = sns.publish(TopicArn=topic, Message="one", MessageGroupId="g", MessageDeduplicationId="d1")
    again = sns.publish(TopicArn=topic, Message="one again", MessageGroupId="g", MessageDeduplicationId="d1")
    second = sns.publish(TopicArn=topic, Message="two", MessageGroupId="g", MessageDeduplicationId="d2")
    assert int(first["SequenceNumber"]) < int(again["SequenceNumber"]) < int(second["SequenceNumber"])
    got = receive_all(sqs, url, 2)
    assert [m["Body"] for m in got] == ["one", "two"]  # the duplicate was dropped, order kept
    assert got[0]["Attributes"]["MessageGroupId"] == "g"

    _fails(lambda: sns.publish(TopicArn=topic, Message="x"), "InvalidParameter",
           message="Invalid parameter: The MessageGroupId parameter is required for FIFO topics")
    _fails(lambda: sns.publish(TopicArn=topic, Message="x", MessageGroupId="g"), "InvalidParameter")
    sns.set_topic_attributes(TopicArn=topic, AttributeName="ContentBasedDeduplication", AttributeValue="true")
    sns.publish(TopicArn=topic, Message="three", MessageGroupId="g")
    sns.publish(TopicArn=topic, Message="three", MessageGroupId="g")  # same body: a duplicate
    for m in got:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    assert [m["Body"] for m in receive_all(sqs, url, 2, timeout=1.0)] == ["three"]
    # a FIFO queue does not take a standard topic's messages
    standard = sns.create_topic(Name=unique())["TopicArn"]
    _fails(lambda: sns.subscribe(TopicArn=standard, Protocol="sqs", Endpoint=queue_arn), "InvalidParameter",
           message="Invalid parameter: Invalid parameter: Endpoint Reason: FIFO SQS Queues can not be subscribed "
                   "to standard SNS topics")  # SNS's words, doubled prefix included
    # the other way round is allowed: a FIFO topic delivers to a standard queue
    standard_url, standard_queue = make_queue()
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=standard_queue, Attributes={"RawMessageDelivery": "true"})
    sns.publish(TopicArn=topic, Message="four", MessageGroupId="g")
    [to_standard] = receive_all(sqs, standard_url, 1)
    # ... without the group, which orders FIFO queues only (as SNS delivers)
    assert to_standard["Body"] == "four" and "MessageGroupId" not in to_standard["Attributes"]
    _fails(lambda: sns.publish(TopicArn=standard, Message="x", MessageDeduplicationId="d"), "InvalidParameter")


def test_message_group_id_on_a_standard_topic(sns, sqs, make_topic, make_queue, endpoint):
    """A standard topic takes a MessageGroupId (Publish and PublishBatch): its standard SQS
    subscriptions keep it on the queue message (SQS fair queues: the MessageGroupId
    system attribute on receive), envelope or raw; an HTTP delivery has no place for it."""
    topic = make_topic()
    url_env, _ = _subscribe_queue(sns, make_queue, topic)
    url_raw, _ = _subscribe_queue(sns, make_queue, topic, RawMessageDelivery="true")
    subscribe_http(sns, topic, endpoint)
    assert "SequenceNumber" not in sns.publish(TopicArn=topic, Message="one", MessageGroupId="tenant-1")
    result = sns.publish_batch(TopicArn=topic, PublishBatchRequestEntries=[
        {"Id": "a", "Message": "two", "MessageGroupId": "tenant-2"}, {"Id": "b", "Message": "three"}])
    assert len(result["Successful"]) == 2 and not result["Failed"]
    for url in (url_env, url_raw):
        got = receive_all(sqs, url, 3)
        groups = {(json.loads(m["Body"])["Message"] if url == url_env else m["Body"]):
                  m["Attributes"].get("MessageGroupId") for m in got}
        assert groups == {"one": "tenant-1", "two": "tenant-2", "three": None}
    posted = endpoint.wait_for(3)
    assert {json.loads(r.body)["Message"] for r in posted} == {"one", "two", "three"}
    assert not any("tenant" in r.body or "tenant" in json.dumps(r.headers) for r in posted)
    _fails(lambda: sns.publish(TopicArn=topic, Message="x", MessageGroupId="bad group\n"), "InvalidParameter")


def test_publish_batch(sns, sqs, make_topic, make_queue):
    topic = make_topic()
    url, _ = _subscribe_queue(sns, make_queue, topic, RawMessageDelivery="true")
    result = sns.publish_batch(TopicArn=topic, PublishBatchRequestEntries=[
        {"Id": "a", "Message": "first"},
        {"Id": "b", "Message": "second", "MessageAttributes": {"n": {"DataType": "Number", "StringValue": "1"}}},
        {"Id": "bad", "Message": "x", "MessageAttributes": {"n": {"DataType": "Number", "StringValue": "one"}}},
        {"Id": "c", "Message": "third", "Subject": "bad\nsubject"},
    ])
    assert sorted(e["Id"] for e in result["Successful"]) == ["a", "b"]
    assert all(uuid.UUID(e["MessageId"]) for e in result["Successful"])
    failed = {e["Id"]: e for e in result["Failed"]}
    assert failed["bad"]["Code"] == "ParameterValueInvalid" and failed["bad"]["SenderFault"] is True
    assert failed["bad"]["Message"] == "Could not cast message attribute 'n' value to number."
    assert failed["c"]["Code"] == "InvalidParameter"
    assert sorted(m["Body"] for m in receive_all(sqs, url, 2)) == ["first", "second"]

    entries = [{"Id": f"e{i}", "Message": "m"} for i in range(11)]
    _fails(lambda: sns.publish_batch(TopicArn=topic, PublishBatchRequestEntries=entries),
           "TooManyEntriesInBatchRequest")
    _fails(lambda: sns.publish_batch(TopicArn=topic, PublishBatchRequestEntries=[
        {"Id": "x", "Message": "m"}, {"Id": "x", "Message": "n"}]), "BatchEntryIdsNotDistinct")
    _fails(lambda: sns.publish_batch(TopicArn=topic, PublishBatchRequestEntries=[{"Id": "no spaces", "Message": "m"}]),
           "InvalidBatchEntryId")
    _fails(lambda: sns.publish_batch(TopicArn=topic, PublishBatchRequestEntries=[
        {"Id": f"e{i}", "Message": "x" * 100_000} for i in range(3)]), "BatchRequestTooLong")
    _fails(lambda: sns.publish_batch(TopicArn=topic, PublishBatchRequestEntries=[]), "EmptyBatchRequest")
    missing = f"arn:aws:sns:{REGION}:{ACCOUNT}:{unique()}"
    _fails(lambda: sns.publish_batch(TopicArn=missing, PublishBatchRequestEntries=[{"Id": "a", "Message": "m"}]),
           "NotFound", 404)


def test_publish_batch_fifo_errors_fail_the_whole_request(sns, sqs, make_queue):
    """What SNS answers for the whole PublishBatch (400, nothing published) rather than per
    entry: FIFO entries without MessageGroupId, or without MessageDeduplicationId on a topic
    without content-based deduplication; an unreadable MessageStructure=json entry."""
    topic = sns.create_topic(Name=unique() + ".fifo", Attributes={"FifoTopic": "true"})["TopicArn"]
    url, queue_arn = make_queue(".fifo", FifoQueue="true")
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn, Attributes={"RawMessageDelivery": "true"})
    good = {"Id": "good", "Message": "fine", "MessageGroupId": "g", "MessageDeduplicationId": "d1"}

    def batch(*entries):
        return lambda: sns.publish_batch(TopicArn=topic, PublishBatchRequestEntries=[good, *entries])

    _fails(batch({"Id": "nogroup", "Message": "m", "MessageDeduplicationId": "d2"}), "InvalidParameter",
           message="Invalid parameter: The MessageGroupId parameter is required for FIFO topics")
    _fails(batch({"Id": "nodedup", "Message": "m", "MessageGroupId": "g"}), "InvalidParameter",
           message="Invalid parameter: The topic should either have ContentBasedDeduplication enabled or "
                   "MessageDeduplicationId provided explicitly")
    _fails(batch({"Id": "nodefault", "Message": '{"sqs": "x"}', "MessageStructure": "json",
                  "MessageGroupId": "g", "MessageDeduplicationId": "d3"}), "InvalidParameter",
           message="Invalid parameter: Message Structure - No default entry in JSON message body")
    assert receive_all(sqs, url, 1, timeout=1.0) == []  # not even the good entry went out
    # with content-based deduplication, entries without an id are fine
    sns.set_topic_attributes(TopicArn=topic, AttributeName="ContentBasedDeduplication", AttributeValue="true")
    result = sns.publish_batch(TopicArn=topic, PublishBatchRequestEntries=[
        good, {"Id": "cbd", "Message": "by content", "MessageGroupId": "g"}])
    assert sorted(e["Id"] for e in result["Successful"]) == ["cbd", "good"] and not result["Failed"]
    assert [m["Body"] for m in receive_all(sqs, url, 2)] == ["fine", "by content"]


def test_publish_errors_and_target_arn(sns, sqs, make_topic, make_queue):
    topic = make_topic()
    url, _ = _subscribe_queue(sns, make_queue, topic, RawMessageDelivery="true")
    assert sns.publish(TargetArn=topic, Message="by target")["MessageId"]
    assert [m["Body"] for m in receive_all(sqs, url, 1)] == ["by target"]
    missing = f"arn:aws:sns:{REGION}:{ACCOUNT}:{unique()}"
    _fails(lambda: sns.publish(TopicArn=missing, Message="x"), "NotFound", 404, "Topic does not exist")
    _fails(lambda: sns.publish(Message="x"), "InvalidParameter")
    _fails(lambda: sns.publish(TopicArn=topic, TargetArn=topic, Message="x"), "InvalidParameter")
    _fails(lambda: sns.publish(PhoneNumber="+15555550100", Message="x"), "InvalidParameter")
    _fails(lambda: sns.publish(TopicArn=topic, Message=""), "InvalidParameter",
           message="Invalid parameter: Empty message")
    _fails(lambda: sns.publish(TopicArn=topic, Message="x" * 262145), "InvalidParameter",
           message="Invalid parameter: Message too long")
    _fails(lambda: sns.publish(TopicArn=topic, Message="x", Subject="a" * 100), "InvalidParameter",
           message="Invalid parameter: Subject")
    _fails(lambda: sns.publish(TopicArn=topic, Message="x", MessageAttributes={
        "a": {"DataType": "Colour", "StringValue": "x"}}), "ParameterValueInvalid")
    _fails(lambda: sns.publish(TopicArn=topic, Message="x", MessageAttributes={
        "a": {"DataType": "String", "StringValue": ""}}), "ParameterValueInvalid")
    _fails(lambda: sns.publish(TopicArn=topic, Message="x", MessageAttributes={
        "AWS.reserved": {"DataType": "String", "StringValue": "v"}}), "ParameterValueInvalid")
    _fails(lambda: sns.publish(TopicArn=topic, Message="x", MessageAttributes={
        "a": {"DataType": "String.Array", "StringValue": '[{"nested": "object"}]'}}), "ParameterValueInvalid")
    _fails(lambda: sns.publish(TopicArn=topic, Message="nul \x00 inside"), "InvalidParameter")


def test_topics_and_queues_of_another_region(server, protocol):
    """A client of another region gets topics and queues of that region; an SQS
    subscription resolves the queue's ARN (region included) as the SQS layer does."""
    region = "eu-test-1"
    sns = sns_client(server.url, protocol, region=region)
    sqs = sqs_client(server.url, "json", region=region)
    name, queue = unique(), unique("q")
    topic = sns.create_topic(Name=name)["TopicArn"]
    assert topic == f"arn:aws:sns:{region}:{ACCOUNT}:{name}"
    url = sqs.create_queue(QueueName=queue)["QueueUrl"]
    sub = sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=f"arn:aws:sqs:{region}:{ACCOUNT}:{queue}",
                        Attributes={"RawMessageDelivery": "true"})["SubscriptionArn"]
    assert sub.startswith(topic + ":")
    sns.publish(TopicArn=topic, Message="regional")
    assert [m["Body"] for m in receive_all(sqs, url, 1)] == ["regional"]
    attrs = sns.get_subscription_attributes(SubscriptionArn=sub)["Attributes"]
    assert attrs["Endpoint"] == f"arn:aws:sqs:{region}:{ACCOUNT}:{queue}"
    # the default region's client neither lists the topic nor reaches it by its ARN (as SNS)
    default = sns_client(server.url, protocol)
    assert topic not in [t["TopicArn"] for t in default.list_topics()["Topics"]]
    _fails(lambda: default.get_topic_attributes(TopicArn=topic), "InvalidParameter",
           message="Invalid parameter: TopicArn")
    assert sns.get_topic_attributes(TopicArn=topic)["Attributes"]["SubscriptionsConfirmed"] == "1"


def test_topic_arn_of_another_region_is_refused(server, protocol, make_topic, make_queue):
    """SNS answers InvalidParameter "Invalid parameter: TopicArn" when a topic ARN's region
    is not the request's: for attributes, publish (one and batch), subscribe and delete."""
    topic = make_topic()  # of the default region
    _, queue_arn = make_queue()
    other = sns_client(server.url, protocol, region="eu-test-2")
    calls = {
        "get": lambda: other.get_topic_attributes(TopicArn=topic),
        "set": lambda: other.set_topic_attributes(TopicArn=topic, AttributeName="DisplayName", AttributeValue="x"),
        "publish": lambda: other.publish(TopicArn=topic, Message="m"),
        "batch": lambda: other.publish_batch(TopicArn=topic, PublishBatchRequestEntries=[{"Id": "1", "Message": "m"}]),
        "subscribe": lambda: other.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn),
        "delete": lambda: other.delete_topic(TopicArn=topic),
    }
    for call in calls.values():
        _fails(call, "InvalidParameter", message="Invalid parameter: TopicArn")
    _fails(lambda: other.publish(TargetArn=topic, Message="m"), "InvalidParameter",
           message="Invalid parameter: TargetArn")
    # nothing happened to the topic: it is there, unchanged, without subscriptions
    sns = sns_client(server.url, protocol)
    attrs = sns.get_topic_attributes(TopicArn=topic)["Attributes"]
    assert attrs["DisplayName"] == "" and attrs["SubscriptionsConfirmed"] == "0"


def test_filter_policy_numbers_to_five_decimal_places_and_string_array_of_one(sns, sqs, make_topic, make_queue):
    """SNS compares numbers with five digits of accuracy after the decimal point, and a
    String.Array attribute that is no JSON array is taken and matched as one value."""
    topic = make_topic()
    url, _ = _subscribe_queue(sns, make_queue, topic, RawMessageDelivery="true", FilterPolicy=json.dumps(
        {"$or": [{"price": [{"numeric": ["=", 10]}]}, {"tags": ["solo"]}]}))
    number = lambda v: {"price": {"DataType": "Number", "StringValue": v}}  # noqa: E731
    tags = lambda v: {"tags": {"DataType": "String.Array", "StringValue": v}}  # noqa: E731
    sns.publish(TopicArn=topic, Message="10.000004", MessageAttributes=number("10.000004"))  # rounds to 10
    sns.publish(TopicArn=topic, Message="10.00001", MessageAttributes=number("10.00001"))
    sns.publish(TopicArn=topic, Message="9.999996", MessageAttributes=number("9.999996"))
    sns.publish(TopicArn=topic, Message="solo", MessageAttributes=tags("solo"))  # not a JSON array
    sns.publish(TopicArn=topic, Message="in array", MessageAttributes=tags('["x", "solo"]'))
    sns.publish(TopicArn=topic, Message="other", MessageAttributes=tags("other"))
    got = receive_all(sqs, url, 4)
    assert sorted(m["Body"] for m in got) == ["10.000004", "9.999996", "in array", "solo"]
    assert receive_all(sqs, url, 1, timeout=1.0) == []


def test_subscribing_a_queue_that_does_not_exist_yet(server, module_dsn, sns, sqs, make_topic):
    """As SNS, Subscribe takes a well-formed ARN of a queue that does not exist. Until the
    queue is created, what is published for it waits in the outbox, held with the reason;
    creating the queue (through SQS) delivers it, in order, and later messages go straight in."""
    topic = make_topic()
    name = unique("later")
    arn = f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}"
    sub = sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn,
                        Attributes={"RawMessageDelivery": "true"})["SubscriptionArn"]
    assert sns.get_subscription_attributes(SubscriptionArn=sub)["Attributes"]["Endpoint"] == arn
    assert sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn,
                         Attributes={"RawMessageDelivery": "true"})["SubscriptionArn"] == sub
    sns.publish(TopicArn=topic, Message="one")
    sns.publish_batch(TopicArn=topic, PublishBatchRequestEntries=[{"Id": "b", "Message": "two"}])
    with psycopg.connect(module_dsn, autocommit=True) as conn:
        held = conn.execute("SELECT endpoint, held_reason FROM conveyor.http_deliveries WHERE queue_name = %s "
                            "ORDER BY id", [name]).fetchall()
    assert held == [(arn, f"SQS queue '{name}' does not exist: held until it is created")] * 2
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    assert [m["Body"] for m in receive_all(sqs, url, 2)] == ["one", "two"]
    sns.publish(TopicArn=topic, Message="three")
    assert [m["Body"] for m in receive_all(sqs, url, 1)] == ["three"]  # (one and two are in flight)
