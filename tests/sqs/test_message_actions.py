"""SQS message actions through boto3, in both wire protocols, with AWS's digests."""

from __future__ import annotations

import base64
import hashlib
import struct
import threading
import time

import botocore.exceptions
import pytest

from support.sqs_clients import error_code


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def attributes_md5(attributes: dict) -> str:
    """AWS's algorithm, written out independently of the server's code."""
    out = b""
    for name in sorted(attributes):
        value = attributes[name]
        out += struct.pack(">I", len(name.encode())) + name.encode()
        out += struct.pack(">I", len(value["DataType"].encode())) + value["DataType"].encode()
        if "BinaryValue" in value:
            out += b"\x02" + struct.pack(">I", len(value["BinaryValue"])) + value["BinaryValue"]
        else:
            data = value["StringValue"].encode()
            out += b"\x01" + struct.pack(">I", len(data)) + data
    return md5(out)


def test_digests_match_aws_published_examples():
    """Values from the AWS CLI's own examples for send-message and receive-message."""
    assert md5(b"Information about the largest city in Any Region.").startswith("51b0a325")
    example = {"City": {"DataType": "String", "StringValue": "Any City"},
               "Greeting": {"DataType": "Binary", "BinaryValue": base64.b64encode(b"Hello, World!")},
               "Population": {"DataType": "Number", "StringValue": "1250800"}}
    assert attributes_md5(example) == "00484c6852e072874de421e059e48f06"
    assert attributes_md5({"PostalCode": {"DataType": "String", "StringValue": "ABC123"},
                           "City": {"DataType": "String", "StringValue": "Any City"}}).startswith("9424c491")


ATTRIBUTES = {
    "City": {"DataType": "String", "StringValue": "Any City"},
    "Population": {"DataType": "Number", "StringValue": "1250800"},
    "Blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xfe\xff"},
    "Custom": {"DataType": "String.custom-label", "StringValue": "ünï 🎉"},
    "Price": {"DataType": "Number.float", "StringValue": "-12.5e3"},
}


def test_send_receive_delete_with_attributes_and_digests(sqs, make_queue):
    url = make_queue()
    body = "héllo\r\n\t<xml> & \"quotes\" 🎉"
    sent = sqs.send_message(QueueUrl=url, MessageBody=body, MessageAttributes=ATTRIBUTES,
                            MessageSystemAttributes={"AWSTraceHeader": {
                                "DataType": "String", "StringValue": "Root=1-5759e988-bd862e3fe1be46a994272793"}})
    assert sent["MD5OfMessageBody"] == md5(body.encode())
    assert sent["MD5OfMessageAttributes"] == attributes_md5(ATTRIBUTES)
    assert sent["MD5OfMessageSystemAttributes"] == attributes_md5(
        {"AWSTraceHeader": {"DataType": "String", "StringValue": "Root=1-5759e988-bd862e3fe1be46a994272793"}})
    [m] = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"], AttributeNames=["All"])["Messages"]
    assert m["Body"] == body and m["MessageId"] == sent["MessageId"]
    assert m["MD5OfBody"] == md5(body.encode())
    assert m["MessageAttributes"] == ATTRIBUTES
    assert m["MD5OfMessageAttributes"] == attributes_md5(ATTRIBUTES)
    a = m["Attributes"]
    # nobody verified the client's signature (no CONVEYOR_AWS_CREDENTIALS): the sender is the
    # account, not the access key the client claims (a verified one: tests/sqs/test_wire.py)
    assert a["ApproximateReceiveCount"] == "1" and a["SenderId"] == "000000000000"
    assert abs(int(a["SentTimestamp"]) / 1000 - time.time()) < 60
    assert int(a["ApproximateFirstReceiveTimestamp"]) >= int(a["SentTimestamp"])
    assert a["AWSTraceHeader"] == "Root=1-5759e988-bd862e3fe1be46a994272793"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])  # deleting twice is fine, as in SQS
    assert "Messages" not in sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)


def test_selected_message_attributes_and_their_digest(sqs, make_queue):
    url = make_queue()
    dotted = {"order.id": {"DataType": "Number", "StringValue": "7"},
              "order.kind": {"DataType": "String", "StringValue": "rush"}}
    sqs.send_message(QueueUrl=url, MessageBody="x", MessageAttributes={"City": ATTRIBUTES["City"], **dotted,
                                                                         "orderly": ATTRIBUTES["Custom"]})
    [m] = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["City", "order.*"], VisibilityTimeout=0)["Messages"]
    chosen = {"City": ATTRIBUTES["City"], **dotted, "orderly": ATTRIBUTES["Custom"]}  # "order.*": names starting "order"
    assert m["MessageAttributes"] == chosen and m["MD5OfMessageAttributes"] == attributes_md5(chosen)
    [m] = sqs.receive_message(QueueUrl=url)["Messages"]
    assert "MessageAttributes" not in m and "MD5OfMessageAttributes" not in m and "Attributes" not in m


def test_rest_headers_appear_as_attributes(sqs, make_queue, server):
    import httpx

    url = make_queue()
    name = url.rsplit("/", 1)[1]
    httpx.post(f"{server.url}/v1/queues/{name}/messages", headers={"Authorization": "x"},
               json={"message": "from rest", "headers": {"kind": "order", "count": 3, "flag": True}})
    [m] = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"])["Messages"]
    assert m["MessageAttributes"] == {"kind": {"DataType": "String", "StringValue": "order"},
                                      "count": {"DataType": "Number", "StringValue": "3"},
                                      "flag": {"DataType": "String", "StringValue": "true"}}
    assert m["MD5OfMessageAttributes"] == attributes_md5(m["MessageAttributes"])


@pytest.mark.parametrize("kwargs, code", [
    ({"MessageBody": ""}, "MissingParameter"),  # as AWS answers an empty body
    ({"MessageBody": "bad \x01 char"}, "InvalidMessageContents"),
    ({"MessageBody": "x", "DelaySeconds": 901}, "InvalidParameterValue"),
    ({"MessageBody": "x", "MessageDeduplicationId": "d"}, "InvalidParameterValue"),
    ({"MessageBody": "x", "MessageAttributes": {"AWS.reserved": {"DataType": "String", "StringValue": "v"}}},
     "InvalidParameterValue"),
    ({"MessageBody": "x", "MessageAttributes": {"n": {"DataType": "Number", "StringValue": "twelve"}}},
     "InvalidParameterValue"),
    ({"MessageBody": "x", "MessageAttributes": {"e": {"DataType": "String", "StringValue": ""}}},
     "InvalidParameterValue"),
    ({"MessageBody": "x", "MessageAttributes": {"t": {"DataType": "Date", "StringValue": "now"}}},
     "InvalidParameterValue"),
    ({"MessageBody": "x", "MessageAttributes": {f"a{i}": {"DataType": "String", "StringValue": "v"}
                                                for i in range(11)}}, "InvalidParameterValue"),
    ({"MessageBody": "x", "MessageSystemAttributes": {"Other": {"DataType": "String", "StringValue": "v"}}},
     "InvalidParameterValue"),
])
def test_send_validation(sqs, make_queue, kwargs, code):
    with pytest.raises(botocore.exceptions.ClientError) as err:
        sqs.send_message(QueueUrl=make_queue(), **kwargs)
    assert error_code(err.value) == code


def test_message_size_limit_counts_attributes(sqs, make_queue):
    url = make_queue(MaximumMessageSize="1024")
    sqs.send_message(QueueUrl=url, MessageBody="x" * 1024)
    with pytest.raises(botocore.exceptions.ClientError) as err:
        sqs.send_message(QueueUrl=url, MessageBody="x" * 1000,
                         MessageAttributes={"pad": {"DataType": "String", "StringValue": "y" * 30}})
    assert "shorter than 1024 bytes" in err.value.response["Error"]["Message"]


def test_default_limit_is_one_mebibyte(sqs, make_queue):
    url = make_queue()
    sqs.send_message(QueueUrl=url, MessageBody="x" * 1048576)
    [m] = sqs.receive_message(QueueUrl=url)["Messages"]
    assert len(m["Body"]) == 1048576


def test_batch_send_partial_failure(sqs, make_queue):
    url = make_queue()
    result = sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "ok-1", "MessageBody": "one", "MessageAttributes": {"a": {"DataType": "String", "StringValue": "v"}}},
        {"Id": "bad", "MessageBody": "nul \x00 char"},
        {"Id": "ok_2", "MessageBody": "two", "DelaySeconds": 0},
    ])
    assert sorted(s["Id"] for s in result["Successful"]) == ["ok-1", "ok_2"]
    ok1 = next(s for s in result["Successful"] if s["Id"] == "ok-1")
    assert ok1["MD5OfMessageBody"] == md5(b"one")
    assert ok1["MD5OfMessageAttributes"] == attributes_md5({"a": {"DataType": "String", "StringValue": "v"}})
    [failed] = result["Failed"]
    assert failed["Id"] == "bad" and failed["SenderFault"] is True and failed["Code"] == "InvalidMessageContents"
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert sorted(m["Body"] for m in got) == ["one", "two"]


@pytest.mark.parametrize("entries, exception", [
    ([], "EmptyBatchRequest"),
    ([{"Id": str(i), "MessageBody": "x"} for i in range(11)], "TooManyEntriesInBatchRequest"),
    ([{"Id": "same", "MessageBody": "x"}, {"Id": "same", "MessageBody": "y"}], "BatchEntryIdsNotDistinct"),
    ([{"Id": "bad id!", "MessageBody": "x"}], "InvalidBatchEntryId"),
    ([{"Id": str(i), "MessageBody": "x" * 200000} for i in range(6)], "BatchRequestTooLong"),
])
def test_batch_request_errors(sqs, make_queue, entries, exception):
    with pytest.raises(getattr(sqs.exceptions, exception)):
        sqs.send_message_batch(QueueUrl=make_queue(), Entries=entries)


def test_receive_limits_and_visibility(sqs, make_queue):
    url = make_queue()
    sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": str(i)} for i in range(10)])
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=300)["Messages"]
    assert len(got) == 10
    assert "Messages" not in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
    for bad in ({"MaxNumberOfMessages": 11}, {"MaxNumberOfMessages": 0}, {"VisibilityTimeout": 43201},
                {"WaitTimeSeconds": 21}):
        with pytest.raises(botocore.exceptions.ClientError) as err:
            sqs.receive_message(QueueUrl=url, **bad)
        assert error_code(err.value) == "InvalidParameterValue"


def test_long_poll_wait_time_seconds(sqs, make_queue):
    url = make_queue()
    started = time.monotonic()
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)
    assert time.monotonic() - started >= 0.9


def test_change_visibility_single_and_batch(sqs, make_queue):
    url = make_queue()
    sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "a"}, {"Id": "b", "MessageBody": "b"}])
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=300)["Messages"]
    a, b = sorted(got, key=lambda m: m["Body"])
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=a["ReceiptHandle"], VisibilityTimeout=0)
    [again] = sqs.receive_message(QueueUrl=url, VisibilityTimeout=300)["Messages"]
    assert again["Body"] == "a" and again["ReceiptHandle"] != a["ReceiptHandle"]
    result = sqs.change_message_visibility_batch(QueueUrl=url, Entries=[
        {"Id": "1", "ReceiptHandle": again["ReceiptHandle"], "VisibilityTimeout": 0},
        {"Id": "2", "ReceiptHandle": b["ReceiptHandle"], "VisibilityTimeout": 0},
        {"Id": "3", "ReceiptHandle": "not-a-handle", "VisibilityTimeout": 0},
    ])
    assert sorted(s["Id"] for s in result["Successful"]) == ["1", "2"]
    assert [(f["Id"], f["Code"]) for f in result["Failed"]] == [("3", "ReceiptHandleIsInvalid")]
    with pytest.raises(botocore.exceptions.ClientError) as err:
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=a["ReceiptHandle"], VisibilityTimeout=43201)
    assert error_code(err.value) == "InvalidParameterValue"


def test_change_visibility_of_a_message_whose_timeout_ran_out(sqs, make_queue):
    """Its newest handle still acts, as on SQS: the message is hidden again."""
    url = make_queue()
    sqs.send_message(QueueUrl=url, MessageBody="x")
    [m] = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)["Messages"]
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=10)
    assert "Messages" not in sqs.receive_message(QueueUrl=url)


def test_receipt_handles(sqs, make_queue):
    url, other = make_queue(), make_queue()
    sqs.send_message(QueueUrl=url, MessageBody="x")
    [m] = sqs.receive_message(QueueUrl=url)["Messages"]
    for bad in ("garbage", "", m["ReceiptHandle"][:-3]):
        with pytest.raises(botocore.exceptions.ClientError) as err:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=bad or "x")
        assert error_code(err.value) == "ReceiptHandleIsInvalid"
    with pytest.raises(botocore.exceptions.ClientError) as err:
        sqs.delete_message(QueueUrl=other, ReceiptHandle=m["ReceiptHandle"])  # another queue's handle
    assert error_code(err.value) == "ReceiptHandleIsInvalid"
    result = sqs.delete_message_batch(QueueUrl=url, Entries=[
        {"Id": "good", "ReceiptHandle": m["ReceiptHandle"]}, {"Id": "bad", "ReceiptHandle": "nope"}])
    assert [s["Id"] for s in result["Successful"]] == ["good"]
    assert [(f["Id"], f["Code"]) for f in result["Failed"]] == [("bad", "ReceiptHandleIsInvalid")]


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _forgeries(queue: str, message_id: int, receive_count: int) -> list[str]:
    """Handles for a delivery the caller never received, made by someone who knows the
    format but not the server's key: with an unkeyed digest as the check (the format
    Conveyor used before its handles were keyed), or a plausible tag."""
    payload = f"{queue}\0{message_id}\0{receive_count}\0abcd1234"
    unkeyed = f"{payload}\0{hashlib.sha256(payload.encode()).hexdigest()[:8]}"
    return [_b64(unkeyed.encode()),
            f"{_b64(payload.encode())}.{_b64(hashlib.sha256(payload.encode()).digest()[:16])}"]


def test_receipt_handles_cannot_be_forged(sqs, make_queue):
    url = make_queue()
    queue = url.rsplit("/", 1)[1]
    for body in ("one", "two"):
        sqs.send_message(QueueUrl=url, MessageBody=body)
    [m] = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, VisibilityTimeout=60)["Messages"]
    [other] = [i for i, body in ((1, "one"), (2, "two")) if body != m["Body"]]
    for forged in _forgeries(queue, other, 0) + _forgeries(queue, other, 1):
        with pytest.raises(botocore.exceptions.ClientError) as err:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=forged)
        assert error_code(err.value) == "ReceiptHandleIsInvalid"
    assert int(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"][
        "ApproximateNumberOfMessages"]) == 1  # the message nobody received is still there


def test_a_stale_receipt_acts_on_nothing(sqs, make_queue):
    """A consumer whose visibility timeout ran out and whose message went to another
    consumer cannot delete it from under the other, nor change its visibility: SQS answers
    success (delete) and keeps the message, and InvalidParameterValue (visibility); only
    the newest handle acts."""
    url = make_queue()
    sqs.send_message(QueueUrl=url, MessageBody="job")
    [first] = sqs.receive_message(QueueUrl=url, VisibilityTimeout=1)["Messages"]
    time.sleep(1.2)
    [second] = sqs.receive_message(QueueUrl=url, VisibilityTimeout=60, WaitTimeSeconds=2)["Messages"]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])  # succeeds, deletes nothing
    result = sqs.delete_message_batch(QueueUrl=url, Entries=[{"Id": "a", "ReceiptHandle": first["ReceiptHandle"]}])
    assert [s["Id"] for s in result["Successful"]] == ["a"]
    with pytest.raises(botocore.exceptions.ClientError) as err:
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0)
    assert error_code(err.value) == "InvalidParameterValue"
    result = sqs.change_message_visibility_batch(QueueUrl=url, Entries=[
        {"Id": "a", "ReceiptHandle": first["ReceiptHandle"], "VisibilityTimeout": 0}])
    assert [f["Id"] for f in result["Failed"]] == ["a"]
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessagesNotVisible"] == "1"  # still the second consumer's
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"], VisibilityTimeout=30)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"])
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessagesNotVisible"] == "0" and attrs["ApproximateNumberOfMessages"] == "0"


def test_queue_delay_and_per_message_delay(sqs, make_queue):
    url = make_queue(DelaySeconds="60")
    sqs.send_message(QueueUrl=url, MessageBody="queue delay")
    sqs.send_message(QueueUrl=url, MessageBody="no delay", DelaySeconds=0)
    assert [m["Body"] for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]] == ["no delay"]


# -- FIFO ------------------------------------------------------------------------------------

def fifo_queue(sqs, make_queue, **attributes):
    return make_queue(".fifo", FifoQueue="true", **attributes)


def test_fifo_order_dedup_and_sequence_numbers(sqs, make_queue):
    url = fifo_queue(sqs, make_queue)
    first = sqs.send_message(QueueUrl=url, MessageBody="1", MessageGroupId="g", MessageDeduplicationId="d1")
    dup = sqs.send_message(QueueUrl=url, MessageBody="1 again", MessageGroupId="g", MessageDeduplicationId="d1")
    assert dup["MessageId"] == first["MessageId"] and dup["SequenceNumber"] == first["SequenceNumber"]
    second = sqs.send_message(QueueUrl=url, MessageBody="2", MessageGroupId="g", MessageDeduplicationId="d2")
    assert int(second["SequenceNumber"]) > int(first["SequenceNumber"])
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"])["Messages"]
    assert [m["Body"] for m in got] == ["1", "2"]
    assert got[0]["Attributes"]["MessageGroupId"] == "g"
    assert got[0]["Attributes"]["MessageDeduplicationId"] == "d1"
    assert got[0]["Attributes"]["SequenceNumber"] == first["SequenceNumber"]
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["FifoQueue"] == "true" and attrs["ContentBasedDeduplication"] == "false"
    assert attrs["DeduplicationScope"] == "queue" and attrs["FifoThroughputLimit"] == "perQueue"


def test_fifo_group_blocking_and_content_based_dedup(sqs, make_queue):
    url = fifo_queue(sqs, make_queue, ContentBasedDeduplication="true")
    sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "a1", "MessageBody": "a1", "MessageGroupId": "a"},
        {"Id": "b1", "MessageBody": "b1", "MessageGroupId": "b"},
        {"Id": "a2", "MessageBody": "a2", "MessageGroupId": "a"},
    ])
    dup = sqs.send_message(QueueUrl=url, MessageBody="a1", MessageGroupId="a")  # same content: deduplicated
    [first] = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1)["Messages"]
    assert first["Body"] == "a1" and first["MessageId"] == dup["MessageId"]
    rest = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert [m["Body"] for m in rest] == ["b1"]  # group a waits for a1


@pytest.mark.parametrize("kwargs, code", [
    ({"MessageBody": "x", "MessageDeduplicationId": "d"}, "MissingParameter"),
    ({"MessageBody": "x", "MessageGroupId": "g"}, "InvalidParameterValue"),  # no dedup id, no CBD
    ({"MessageBody": "x", "MessageGroupId": "g", "MessageDeduplicationId": "d", "DelaySeconds": 5},
     "InvalidParameterValue"),
])
def test_fifo_validation(sqs, make_queue, kwargs, code):
    with pytest.raises(botocore.exceptions.ClientError) as err:
        sqs.send_message(QueueUrl=fifo_queue(sqs, make_queue), **kwargs)
    assert error_code(err.value) == code


def test_receive_request_attempt_id(sqs, make_queue):
    url = fifo_queue(sqs, make_queue, ContentBasedDeduplication="true")
    for body in ("m1", "m2"):
        sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId="g")
    first = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, ReceiveRequestAttemptId="attempt-1")["Messages"]
    retry = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, ReceiveRequestAttemptId="attempt-1")["Messages"]
    assert [m["MessageId"] for m in retry] == [m["MessageId"] for m in first]


def test_receive_request_attempt_id_with_long_polling(sqs, make_queue):
    """Messages a long poll receives are recorded under the attempt id too: a retried call
    (the first answer was lost) gets them again instead of leaving the group blocked."""
    url = fifo_queue(sqs, make_queue, ContentBasedDeduplication="true")

    def send_later() -> None:
        time.sleep(0.5)
        sqs.send_message(QueueUrl=url, MessageBody="late", MessageGroupId="g")

    sender = threading.Thread(target=send_later)
    sender.start()
    first = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5, VisibilityTimeout=60,
                                ReceiveRequestAttemptId="attempt-lp")["Messages"]
    sender.join()
    retry = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1, VisibilityTimeout=60,
                                ReceiveRequestAttemptId="attempt-lp").get("Messages", [])
    assert [m["Body"] for m in retry] == ["late"]
    assert [m["MessageId"] for m in retry] == [m["MessageId"] for m in first]


# -- dead letters ------------------------------------------------------------------------------

def test_redrive_policy_and_move_task(sqs, make_queue):
    dlq = make_queue("-dlq")
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    policy = f'{{"deadLetterTargetArn":"{dlq_arn}","maxReceiveCount":2}}'
    src = make_queue(RedrivePolicy=policy)
    got = sqs.get_queue_attributes(QueueUrl=src, AttributeNames=["RedrivePolicy"])["Attributes"]["RedrivePolicy"]
    assert got == policy
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [src]
    sent = sqs.send_message(QueueUrl=src, MessageBody="poison")
    for _ in range(2):
        assert sqs.receive_message(QueueUrl=src, VisibilityTimeout=0)["Messages"]
    assert "Messages" not in sqs.receive_message(QueueUrl=src, VisibilityTimeout=0)
    [dead] = sqs.receive_message(QueueUrl=dlq, VisibilityTimeout=0)["Messages"]
    assert dead["Body"] == "poison" and dead["MessageId"] == sent["MessageId"]

    # a message in flight is not moved: the task runs until it is visible again
    [held] = sqs.receive_message(QueueUrl=dlq, VisibilityTimeout=60)["Messages"]
    busy = sqs.start_message_move_task(SourceArn=dlq_arn)
    with pytest.raises(botocore.exceptions.ClientError) as err:
        sqs.start_message_move_task(SourceArn=dlq_arn)
    assert error_code(err.value) == "InvalidParameterValue"  # AWS's code for a busy source
    assert sqs.cancel_message_move_task(TaskHandle=busy["TaskHandle"])["ApproximateNumberOfMessagesMoved"] == 0
    sqs.change_message_visibility(QueueUrl=dlq, ReceiptHandle=held["ReceiptHandle"], VisibilityTimeout=0)

    task = sqs.start_message_move_task(SourceArn=dlq_arn, MaxNumberOfMessagesPerSecond=10)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        status, cancelled = sqs.list_message_move_tasks(SourceArn=dlq_arn, MaxResults=10)["Results"]  # newest first
        assert cancelled["Status"] == "CANCELLED"
        if status["Status"] != "RUNNING":
            break
        time.sleep(0.2)
    assert status["Status"] == "COMPLETED" and status["ApproximateNumberOfMessagesMoved"] == 1
    assert "TaskHandle" not in status and status["SourceArn"] == dlq_arn
    [back] = sqs.receive_message(QueueUrl=src)["Messages"]
    assert back["Body"] == "poison" and back["MessageId"] == sent["MessageId"]
    with pytest.raises(botocore.exceptions.ClientError):
        sqs.cancel_message_move_task(TaskHandle=task["TaskHandle"])  # no longer running
    with pytest.raises(botocore.exceptions.ClientError) as err:  # not a handle of AWS's form
        sqs.cancel_message_move_task(TaskHandle="00000000-0000-0000-0000-000000000000")
    assert error_code(err.value) == "InvalidParameterValue"


def test_cancel_a_running_move_task(sqs, make_queue):
    dlq = make_queue("-dlq")
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    src = make_queue(RedrivePolicy=f'{{"deadLetterTargetArn":"{arn}","maxReceiveCount":1}}')
    other = make_queue()
    other_arn = sqs.get_queue_attributes(QueueUrl=other, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sqs.send_message(QueueUrl=dlq, MessageBody="direct")
    sqs.receive_message(QueueUrl=dlq, VisibilityTimeout=60)  # in flight: the task cannot finish
    task = sqs.start_message_move_task(SourceArn=arn, DestinationArn=other_arn, MaxNumberOfMessagesPerSecond=1)
    moved = sqs.cancel_message_move_task(TaskHandle=task["TaskHandle"])["ApproximateNumberOfMessagesMoved"]
    assert moved == 0
    assert sqs.list_message_move_tasks(SourceArn=arn)["Results"][0]["Status"] == "CANCELLED"
    assert src


def test_redrive_policy_errors(sqs, make_queue):
    url = make_queue()
    missing_arn = "arn:aws:sqs:us-east-1:000000000000:does-not-exist"
    for policy, fragment in ((f'{{"deadLetterTargetArn":"{missing_arn}","maxReceiveCount":3}}', "does not exist"),
                             ('{"maxReceiveCount":3}', "deadLetterTargetArn"),
                             ('{"deadLetterTargetArn":"x","maxReceiveCount":0}', "maxReceiveCount")):
        with pytest.raises(botocore.exceptions.ClientError) as err:
            sqs.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": policy})
        assert error_code(err.value) == "InvalidParameterValue" and fragment in err.value.response["Error"]["Message"]
    plain = make_queue()
    arn = sqs.get_queue_attributes(QueueUrl=plain, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    with pytest.raises(botocore.exceptions.ClientError) as err:
        sqs.start_message_move_task(SourceArn=arn)
    assert error_code(err.value) == "InvalidParameterValue"


def test_redrive_allow_policy(sqs, make_queue):
    dlq = make_queue("-dlq", RedriveAllowPolicy='{"redrivePermission":"denyAll"}')
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    with pytest.raises(botocore.exceptions.ClientError) as err:
        make_queue(RedrivePolicy=f'{{"deadLetterTargetArn":"{arn}","maxReceiveCount":3}}')
    assert "does not allow" in err.value.response["Error"]["Message"]
    sqs.set_queue_attributes(QueueUrl=dlq, Attributes={"RedriveAllowPolicy": '{"redrivePermission":"allowAll"}'})
    make_queue(RedrivePolicy=f'{{"deadLetterTargetArn":"{arn}","maxReceiveCount":3}}')
