"""AWS fidelity, round 3 (issue 27, SNS items 9-15 and 17): behaviour checked against what
AWS answers (LocalStack's snapshots recorded against AWS, SNS's developer guide), each
through boto3 in both wire protocols (Query and JSON)."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import botocore.exceptions
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding

from support.sns_clients import ACCOUNT, REGION, error_code, receive_all, unique

AUTH = {"Authorization": "AWS4-HMAC-SHA256 Credential=AKIDX/20260101/us-east-1/sns/aws4_request, "
                         "SignedHeaders=host, Signature=0"}


def _fails(call, *args: Any, **kwargs: Any) -> botocore.exceptions.ClientError:
    with pytest.raises(botocore.exceptions.ClientError) as err:
        call(*args, **kwargs)
    return err.value


def _message(exc: Exception) -> str:
    return exc.response["Error"]["Message"]  # type: ignore[attr-defined]


def _subscribe(sns: Any, topic: str, queue_arn: str, **attributes: str) -> str:
    return sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn, Attributes=attributes,
                         ReturnSubscriptionArn=True)["SubscriptionArn"]


# -- item 15: SNS's error document ---------------------------------------------------------------

def test_query_error_has_type_code_and_message_only(server):
    answer = httpx.post(server.url + "/", data={"Action": "GetTopicAttributes",
                                                "TopicArn": f"arn:aws:sns:{REGION}:{ACCOUNT}:{unique()}"},
                        headers=AUTH)
    assert answer.status_code == 404
    assert "<Detail" not in answer.text
    assert re.search(r"<Error><Type>Sender</Type><Code>NotFound</Code><Message>Topic does not exist</Message>"
                     r"</Error>", answer.text)


# -- item 17: ARN and token errors ---------------------------------------------------------------

def test_malformed_arns_in_aws_words(sns):
    err = _fails(sns.unsubscribe, SubscriptionArn="randomstring")
    assert (error_code(err), _message(err)) == (
        "InvalidParameter", "Invalid parameter: SubscriptionArn Reason: An ARN must have at least 6 elements, not 1")
    err = _fails(sns.unsubscribe, SubscriptionArn="arn:aws:sns:us-east-1:random")
    assert _message(err) == "Invalid parameter: SubscriptionArn Reason: An ARN must have at least 6 elements, not 5"
    err = _fails(sns.unsubscribe, SubscriptionArn=f"arn:aws:sns:{REGION}:{ACCOUNT}:random")
    assert _message(err) == "Invalid parameter: SubscriptionId"
    for arn, elements in (("randomstring", 1), ("randomstring:1", 2)):
        err = _fails(sns.publish, TopicArn=arn, Message="m")
        assert _message(err) == f"Invalid parameter: TopicArn Reason: An ARN must have at least 6 elements, not {elements}"


def test_confirm_subscription_with_a_bad_token(sns, make_topic):
    topic = make_topic()
    err = _fails(sns.confirm_subscription, TopicArn=topic, Token="randomtoken")
    assert (error_code(err), _message(err)) == ("InvalidParameter", "Invalid token")
    err = _fails(sns.confirm_subscription, TopicArn=topic, Token="0" * 288)
    assert (error_code(err), _message(err)) == ("InvalidParameter", "Invalid parameter: Token")


# -- item 12: what Publish and Subscribe accept --------------------------------------------------

def test_custom_data_type_suffixes(sns, sqs, make_topic, make_queue):
    topic = make_topic()
    url, arn = make_queue()
    _subscribe(sns, topic, arn, RawMessageDelivery="true")
    attributes = {"a": {"DataType": "String.  prefixed.", "StringValue": "x"},
                  "n": {"DataType": "Number.float", "StringValue": "1.5"}}
    sns.publish(TopicArn=topic, Message="typed", MessageAttributes=attributes)
    [m] = receive_all(sqs, url, 1)
    assert m["MessageAttributes"]["n"] == {"DataType": "Number.float", "StringValue": "1.5"}
    assert m["MessageAttributes"]["a"]["DataType"] == "String.  prefixed."
    for bad in ("String.", "Stringprefixed"):
        err = _fails(sns.publish, TopicArn=topic, Message="m",
                     MessageAttributes={"attr1": {"DataType": bad, "StringValue": "v"}})
        assert (error_code(err), _message(err)) == (
            "ParameterValueInvalid", "The message attribute 'attr1' has an invalid message attribute type, the set "
            "of supported type prefixes is Binary, Number, and String.")


def test_message_structure_with_entries_for_other_protocols(sns, sqs, make_topic, make_queue):
    topic = make_topic()
    url, arn = make_queue()
    _subscribe(sns, topic, arn, RawMessageDelivery="true")
    message = {"default": "everyone", "sqs": "for queues", "email": "by mail",
               "APNS": {"aps": {"alert": "not a string: ignored"}}, "GCM": 5}
    sns.publish(TopicArn=topic, MessageStructure="json", Message=json.dumps(message))
    assert [m["Body"] for m in receive_all(sqs, url, 1)] == ["for queues"]
    err = _fails(sns.publish, TopicArn=topic, MessageStructure="json", Message=json.dumps({"default": {"x": 1}}))
    assert _message(err) == "Invalid parameter: Message Structure - No default entry in JSON message body"


def test_subscribe_again_with_a_subset_of_the_attributes(sns, make_topic, make_queue):
    topic = make_topic()
    _, arn = make_queue()
    first = _subscribe(sns, topic, arn, RawMessageDelivery="True", FilterPolicy='{"a": ["b"]}')
    assert _subscribe(sns, topic, arn) == first
    assert _subscribe(sns, topic, arn, RawMessageDelivery="true") == first
    assert _subscribe(sns, topic, arn, FilterPolicyScope="MessageAttributes") == first
    err = _fails(_subscribe, sns, topic, arn, RawMessageDelivery="false", FilterPolicyScope="MessageBody")
    assert _message(err) == "Invalid parameter: Attributes Reason: Subscription already exists with different attributes"


# -- item 13: validation -------------------------------------------------------------------------

def test_duplicate_tag_keys(sns, make_topic):
    topic = make_topic()
    err = _fails(sns.tag_resource, ResourceArn=topic, Tags=[{"Key": "k1", "Value": "v1"}, {"Key": "k2", "Value": "v2"},
                                                            {"Key": "k2", "Value": "v2"}])
    assert (error_code(err), _message(err)) == ("InvalidParameter", "Invalid parameter: Duplicated keys are not allowed.")


def test_publish_batch_counts_attributes_and_checks_them_first(sns, make_topic):
    topic = make_topic()
    attributes = {"attr1": {"DataType": "Number", "StringValue": "1"}}
    body = "a" * (262144 - len("attr1") - len("Number") - len("1"))
    err = _fails(sns.publish_batch, TopicArn=topic, PublishBatchRequestEntries=[
        {"Id": "1", "Message": body, "MessageAttributes": attributes}, {"Id": "2", "Message": "b"}])
    assert (error_code(err), _message(err)) == ("BatchRequestTooLong",
                                                "The length of all the messages put together is more than the limit.")
    err = _fails(sns.publish_batch, TopicArn=topic, PublishBatchRequestEntries=[
        {"Id": "1", "Message": "fine"},
        {"Id": "2", "Message": "bad", "MessageAttributes": {"a": {"DataType": "Date", "StringValue": "x"}}}])
    assert error_code(err) == "ParameterValueInvalid"


def test_subscription_redrive_policy_validation(sns, make_topic, make_queue):
    topic = make_topic()
    _, arn = make_queue()
    sub = _subscribe(sns, topic, arn)
    err = _fails(sns.set_subscription_attributes, SubscriptionArn=sub, AttributeName="RedrivePolicy",
                 AttributeValue=json.dumps({"deadLetterTargetArn": "not-an-arn"}))
    assert (error_code(err), _message(err)) == ("InvalidParameter",
                                                "Invalid parameter: RedrivePolicy: deadLetterTargetArn is an invalid arn")
    fifo_topic = make_topic(".fifo", FifoTopic="true")
    _, fifo_queue = make_queue(".fifo", FifoQueue="true")
    _, standard_dlq = make_queue()
    err = _fails(_subscribe, sns, fifo_topic, fifo_queue,
                 RedrivePolicy=json.dumps({"deadLetterTargetArn": standard_dlq}))
    assert _message(err) == ("Invalid parameter: RedrivePolicy: must use a FIFO queue as DLQ for a FIFO Subscription "
                             "to a FIFO Topic.")
    _, fifo_dlq = make_queue(".fifo", FifoQueue="true")
    assert _subscribe(sns, fifo_topic, fifo_queue, RedrivePolicy=json.dumps({"deadLetterTargetArn": fifo_dlq}))


# -- item 11: signatures -------------------------------------------------------------------------

def _verify(envelope: dict[str, str]) -> None:
    assert re.search(r"/SimpleNotificationService-[0-9a-f]{32}\.pem$", envelope["SigningCertURL"])
    pem = httpx.get(envelope["SigningCertURL"]).raise_for_status().content
    key = x509.load_pem_x509_certificate(pem).public_key()
    names = ["Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"]
    canonical = "".join(f"{n}\n{envelope[n]}\n" for n in names if n in envelope)
    digest = {"1": hashes.SHA1(), "2": hashes.SHA256()}[envelope["SignatureVersion"]]
    key.verify(base64.b64decode(envelope["Signature"]), canonical.encode(), padding.PKCS1v15(), digest)  # type: ignore[union-attr]


def test_signature_versions(sns, sqs, make_topic, make_queue):
    topic = make_topic()
    assert "SignatureVersion" not in sns.get_topic_attributes(TopicArn=topic)["Attributes"]
    url, arn = make_queue()
    _subscribe(sns, topic, arn)
    sns.publish(TopicArn=topic, Message="version one", Subject="s")
    [m] = receive_all(sqs, url, 1)
    envelope = json.loads(m["Body"])
    assert envelope["SignatureVersion"] == "1"  # SHA1, AWS's default
    _verify(envelope)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    sns.set_topic_attributes(TopicArn=topic, AttributeName="SignatureVersion", AttributeValue="2")
    assert sns.get_topic_attributes(TopicArn=topic)["Attributes"]["SignatureVersion"] == "2"
    sns.publish(TopicArn=topic, Message="version two")
    [m] = receive_all(sqs, url, 1)
    envelope = json.loads(m["Body"])
    assert envelope["SignatureVersion"] == "2"
    _verify(envelope)
    wrong = re.sub(r"-[0-9a-f]{32}\.pem$", "-" + "0" * 32 + ".pem", envelope["SigningCertURL"])
    assert httpx.get(wrong).status_code == 404  # only the certificate of that digest


def test_fifo_topic_notifications(sns, sqs, make_topic, make_queue):
    topic = make_topic(".fifo", FifoTopic="true", ContentBasedDeduplication="true")
    fifo_url, fifo_arn = make_queue(".fifo", FifoQueue="true")
    standard_url, standard_arn = make_queue()
    _subscribe(sns, topic, fifo_arn)
    _subscribe(sns, topic, standard_arn)
    sns.publish(TopicArn=topic, Message="ordered", MessageGroupId="g")
    [fifo] = receive_all(sqs, fifo_url, 1)
    [standard] = receive_all(sqs, standard_url, 1)
    for m in (fifo, standard):
        envelope = json.loads(m["Body"])
        assert envelope["SequenceNumber"] and "Signature" not in envelope and "SigningCertURL" not in envelope
        assert "SignatureVersion" not in envelope
    assert fifo["Attributes"]["MessageGroupId"] == "g"
    assert "MessageGroupId" not in standard["Attributes"]  # dropped on delivery to a standard queue


# -- item 9: AWSTraceHeader through SNS ----------------------------------------------------------

def test_trace_header_reaches_sqs_subscribers(sns, sqs, make_topic, make_queue):
    trace = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"

    def add(request: Any, **_: Any) -> None:
        request.headers["X-Amzn-Trace-Id"] = trace

    sns.meta.events.register("before-sign.sns.Publish", add)
    topic = make_topic()
    url, arn = make_queue()
    _subscribe(sns, topic, arn, RawMessageDelivery="true")
    sns.publish(TopicArn=topic, Message="traced")
    [m] = receive_all(sqs, url, 1)
    assert m["Attributes"]["AWSTraceHeader"] == trace


# -- item 10: filter policies --------------------------------------------------------------------

ATTRIBUTE_CASES = [  # (policy, attributes, matches)
    ({"a": [{"anything-but": "x"}]}, {"b": "1"}, False),  # lacks the attribute
    ({"a": [{"anything-but": "x"}]}, {"a": "y"}, True),
    ({"a": [{"anything-but": "x"}]}, {"a": "x"}, False),
    ({"a": [None]}, {"b": "1"}, False),
    ({"a": [None]}, {"a": "null"}, False),
    ({"a": [{"exists": True}]}, {"a": "1"}, True),
    ({"a": [{"exists": True}]}, {"b": "1"}, False),
    ({"a": [{"exists": False}]}, {"b": "1"}, True),
    ({"a": [{"exists": False}]}, {"a": "1"}, False),
    ({"a": [{"prefix": "ab"}]}, {"a": "abc"}, True),
    ({"a": [{"suffix": "bc"}]}, {"a": "abc"}, True),
    ({"a": [{"equals-ignore-case": "ABC"}]}, {"a": "abc"}, True),
    ({"a": [{"numeric": [">", 1, "<=", 5]}]}, {"a": 5}, True),
    ({"a": [{"numeric": [">", 1, "<=", 5]}]}, {"a": 6}, False),
    ({"a": [{"cidr": "10.0.0.0/24"}]}, {"a": "10.0.0.7"}, True),
    ({"a": [{"anything-but": {"prefix": "ab"}}]}, {"a": "abc"}, False),
]

BODY_CASES = [  # (policy, body, matches)
    ({"a": [{"anything-but": "x"}]}, {"b": 1}, False),
    ({"a": [None]}, {"a": None}, True),
    ({"a": [None]}, {"b": 1}, False),
    ({"a": [{"exists": True}]}, {"a": {"b": 1}}, True),
    ({"a": [{"exists": False}]}, {"b": 1}, True),
    ({"a": [{"prefix": "ab"}]}, {"a": ["x", "abc"]}, True),
    ({"a": [{"numeric": ["=", 5]}]}, {"a": 5}, True),
    ({"a": [{"cidr": "10.0.0.0/24"}]}, {"a": "10.0.1.7"}, False),
    ({"a.b": ["x"]}, {"a": {"b": "x"}}, True),  # a dotted key is a path too
    ({"a.b": ["x"]}, {"a.b": "x"}, True),
    ({"a": {"b": ["x"]}}, {"a.b": "x"}, True),
    ({"Records": {"s3": {"object": {"key": [{"prefix": "auto-"}]}}, "eventName": [{"prefix": "Created"}]}},
     {"Records": [{"eventName": "Created:Put", "s3": {"object": [[{"key": "auto-1.xml"}]]}},
                  {"eventName": "Removed", "s3": {"object": {"key": "home-1.xml"}}}]}, True),
    ({"Records": {"s3": {"object": {"key": [{"prefix": "auto-"}]}}}},
     {"Records": [{"s3": {"object": {"key": "home-1.xml"}}}]}, False),
]


def _attribute(value: Any) -> dict[str, str]:
    if isinstance(value, (int, float)):
        return {"DataType": "Number", "StringValue": str(value)}
    return {"DataType": "String", "StringValue": value}


@pytest.mark.parametrize("scope", ["MessageAttributes", "MessageBody"])
def test_filter_policy_operators_in_both_scopes(sns, sqs, make_topic, make_queue, scope):
    topic = make_topic()
    cases = ATTRIBUTE_CASES if scope == "MessageAttributes" else BODY_CASES
    queues = []
    for i, (policy, _, _) in enumerate(cases):
        url, arn = make_queue()
        _subscribe(sns, topic, arn, FilterPolicy=json.dumps(policy), FilterPolicyScope=scope, RawMessageDelivery="true")
        queues.append(url)
        assert i == len(queues) - 1
    for i, (_, doc, _) in enumerate(cases):
        if scope == "MessageAttributes":
            sns.publish(TopicArn=topic, Message=f"case {i}",
                        MessageAttributes={k: _attribute(v) for k, v in doc.items()})
        else:
            sns.publish(TopicArn=topic, Message=json.dumps({**doc, "case": i}))
    for i, ((policy, doc, matches), url) in enumerate(zip(cases, queues, strict=True)):
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", [])
        bodies = [m["Body"] for m in got]
        mine = [b for b in bodies if (b == f"case {i}" if scope == "MessageAttributes" else json.loads(b)["case"] == i)]
        assert bool(mine) == matches, (policy, doc, bodies)


def test_filter_policy_on_a_large_nested_payload(sns, sqs, make_topic, make_queue):
    topic = make_topic()
    url, arn = make_queue()
    policy = {"detail": {"payload.nested.another-level.deep": {"inside-list": [{"prefix": "q-test"}]}}}
    _subscribe(sns, topic, arn, FilterPolicy=json.dumps(policy), FilterPolicyScope="MessageBody")
    filler = {f"field{i}": {"value": "x" * 40, "list": list(range(20))} for i in range(300)}
    body = {"id": "1", "detail": {"payload": {**filler, "nested": {"another-level": {
        "deep": [{"inside-list": "nope"}, {"inside-list": ["a", "q-test-1"]}]}}}}}
    message = json.dumps(body)
    assert len(message) > 40_000
    sns.publish(TopicArn=topic, Message=message)
    assert len(receive_all(sqs, url, 1)) == 1


def test_filter_policy_complexity_counts_nesting(sns, make_topic, make_queue):
    topic = make_topic()
    _, arn = make_queue()
    nested = {"$or": [{"metricName": ["CPUUtilization", "ReadLatency", "TestValue"]}, {"namespace": ["AWS/EC2", "AWS/ES"]}],
              "detail": {"scope": ["Service", "Test"],
                         "$or": [{"source": ["aws.cloudwatch"]},
                                 {"type": ["CloudWatch Alarm State Change", "TestValue", "TestValue2"]}]}}
    err = _fails(_subscribe, sns, topic, arn, FilterPolicy=json.dumps(nested), FilterPolicyScope="MessageBody")
    assert _message(err) == "Invalid parameter: Attributes Reason: FilterPolicy: Filter policy is too complex"
    flat = {"source": ["aws.cloudwatch", "aws.events", "aws.test"],
            "$or": [{"metricName": ["a", "b", "c", "d", "e", "f"]},
                    {"metricType": ["A", "B", "C", "D"], "$or": [{"metricId": [1, 2, 3, 4]},
                                                                 {"spaceId": [1, 2, 3, 4, 5, 6, 7]}]}]}
    assert _subscribe(sns, topic, arn, FilterPolicy=json.dumps(flat))  # exactly 150


# -- item 14: what SNS does that Conveyor used to leave out --------------------------------------

def test_http_subscription_is_confirmed_by_its_endpoint(server, sns, make_topic, endpoint):
    topic = make_topic()
    sns.set_topic_attributes(TopicArn=topic, AttributeName="SignatureVersion", AttributeValue="2")
    assert sns.subscribe(TopicArn=topic, Protocol="http", Endpoint=endpoint.url)["SubscriptionArn"] == \
        "pending confirmation"
    sns.publish(TopicArn=topic, Message="before confirmation")  # an unconfirmed endpoint gets nothing
    [request] = endpoint.wait_for(1)
    assert request.headers["x-amz-sns-message-type"] == "SubscriptionConfirmation"
    confirmation = json.loads(request.body)
    assert confirmation["Type"] == "SubscriptionConfirmation" and confirmation["TopicArn"] == topic
    assert re.fullmatch(r"[0-9a-f]{288}", confirmation["Token"])
    assert confirmation["Message"].startswith(f"You have chosen to subscribe to the topic {topic}.")
    assert confirmation["SignatureVersion"] == "2"
    pem = httpx.get(confirmation["SigningCertURL"]).raise_for_status().content
    names = ["Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"]
    canonical = "".join(f"{n}\n{confirmation[n]}\n" for n in names)
    x509.load_pem_x509_certificate(pem).public_key().verify(  # type: ignore[union-attr]
        base64.b64decode(confirmation["Signature"]), canonical.encode(), padding.PKCS1v15(), hashes.SHA256())
    [pending] = sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"]
    assert pending["SubscriptionArn"] == "PendingConfirmation"
    # the endpoint confirms by fetching SubscribeURL, without credentials (the token is the capability)
    answer = httpx.get(confirmation["SubscribeURL"])
    assert answer.status_code == 200 and "<ConfirmSubscriptionResult>" in answer.text
    [confirmed] = sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"]
    assert confirmed["SubscriptionArn"].startswith(topic + ":")
    attrs = sns.get_subscription_attributes(SubscriptionArn=confirmed["SubscriptionArn"])["Attributes"]
    assert attrs["PendingConfirmation"] == "false"
    sns.publish(TopicArn=topic, Message="after confirmation")
    received = endpoint.wait_for(2)
    assert [json.loads(r.body)["Message"] for r in received[1:]] == ["after confirmation"]
    forged = confirmation["SubscribeURL"].replace(confirmation["Token"], confirmation["Token"][:-4] + "0000")
    assert httpx.get(forged).status_code == 400


def test_deleting_a_queue_keeps_its_subscriptions(sns, sqs, make_topic, make_queue):
    topic = make_topic()
    url, arn = make_queue()
    dlq_url, dlq_arn = make_queue()
    sub = _subscribe(sns, topic, arn, RawMessageDelivery="true")
    sqs.delete_queue(QueueUrl=url)
    attrs = sns.get_subscription_attributes(SubscriptionArn=sub)["Attributes"]  # still there, as on SNS
    assert attrs["Endpoint"] == arn
    sns.set_subscription_attributes(SubscriptionArn=sub, AttributeName="RedrivePolicy",
                                    AttributeValue=json.dumps({"deadLetterTargetArn": dlq_arn}))
    sns.publish(TopicArn=topic, Message="undeliverable")
    assert [m["Body"] for m in receive_all(sqs, dlq_url, 1)] == ["undeliverable"]  # dead-lettered
    sqs.create_queue(QueueName=arn.rsplit(":", 1)[1])  # the queue again: the subscription delivers to it
    sns.publish(TopicArn=topic, Message="delivered")
    assert [m["Body"] for m in receive_all(sqs, url, 1)] == ["delivered"]
