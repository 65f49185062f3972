"""AWS fidelity, round 2 (issue 13, SQS): behaviour real applications rely on, each
checked through boto3 in both wire protocols (JSON and Query)."""

from __future__ import annotations

import botocore.exceptions
import pytest

from support.sqs_clients import error_code

NO_QUEUE = "AWS.SimpleQueueService.NonExistentQueue"


def _name(url: str) -> str:
    return url.rsplit("/", 1)[1]


def _message(exc: Exception) -> str:
    return exc.response["Error"]["Message"]  # type: ignore[attr-defined]


def test_a_bare_queue_name_is_a_queue_url(sqs, make_queue):
    url = make_queue()
    sqs.send_message(QueueUrl=_name(url), MessageBody="by name")
    [got] = sqs.receive_message(QueueUrl=_name(url))["Messages"]
    assert got["Body"] == "by name"
    sqs.delete_message(QueueUrl=_name(url), ReceiptHandle=got["ReceiptHandle"])
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])[
        "Attributes"]["ApproximateNumberOfMessages"] == "0"
    with pytest.raises(botocore.exceptions.ClientError) as err:
        sqs.send_message(QueueUrl="no-such-queue-here", MessageBody="x")
    assert error_code(err.value) == NO_QUEUE


def test_message_attribute_names_select_by_prefix(sqs, make_queue):
    url = make_queue()
    attributes = {name: {"DataType": "String", "StringValue": name}
                  for name in ("Hello", "Help.Me", "Hola", "Custom.a", "Custom.b")}
    sqs.send_message(QueueUrl=url, MessageBody="m", MessageAttributes=attributes)

    def names(wanted: list[str]) -> set[str]:
        [m] = sqs.receive_message(QueueUrl=url, MessageAttributeNames=wanted, VisibilityTimeout=0)["Messages"]
        return set(m.get("MessageAttributes", {}))

    assert names(["Hel.*"]) == {"Hello", "Help.Me"}
    assert names(["Custom.*"]) == {"Custom.a", "Custom.b"}
    assert names(["*"]) == set(attributes) == names(["All"]) == names([".*"])
    assert names(["Hola", "Custom.*"]) == {"Hola", "Custom.a", "Custom.b"}
    assert names(["Nothing"]) == set()


def test_attribute_names_in_any_script(sqs, make_queue):
    url = make_queue()
    attributes = {"attr.1øßä": {"DataType": "String", "StringValue": "v"},
                  "название": {"DataType": "Number", "StringValue": "1"}}
    sent = sqs.send_message(QueueUrl=url, MessageBody="m", MessageAttributes=attributes)
    [m] = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"])["Messages"]
    assert m["MessageAttributes"]["attr.1øßä"]["StringValue"] == "v"
    assert m["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]  # botocore checks it too
    for bad in ("has space", "a..b", ".start", "AWS.reserved"):
        with pytest.raises(botocore.exceptions.ClientError) as err:
            sqs.send_message(QueueUrl=url, MessageBody="m",
                             MessageAttributes={bad: {"DataType": "String", "StringValue": "v"}})
        assert error_code(err.value) == "InvalidParameterValue"


def test_batch_size_is_the_whole_request_before_entries_are_checked(sqs, make_queue):
    url = make_queue()
    # each entry alone is invalid (a body over the queue's limit), and together they are
    # over 1 MiB: the whole request is refused, not each entry
    entries = [{"Id": str(i), "MessageBody": "x" * 300000} for i in range(4)]
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"MaximumMessageSize": "1024"})
    with pytest.raises(sqs.exceptions.BatchRequestTooLong) as err:
        sqs.send_message_batch(QueueUrl=url, Entries=entries)
    assert "1048576" in _message(err.value)
    # under 1 MiB in all: entries fail one by one
    small = sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "big", "MessageBody": "x" * 2000},
                                                          {"Id": "ok", "MessageBody": "fine"}])
    assert [f["Id"] for f in small["Failed"]] == ["big"] and [s["Id"] for s in small["Successful"]] == ["ok"]


def test_fifo_batches_without_ids_fail_whole(sqs, make_queue):
    url = make_queue(".fifo", FifoQueue="true")
    no_group = [{"Id": "a", "MessageBody": "1", "MessageGroupId": "g", "MessageDeduplicationId": "d1"},
                {"Id": "b", "MessageBody": "2", "MessageDeduplicationId": "d2"}]
    with pytest.raises(botocore.exceptions.ClientError) as err:
        sqs.send_message_batch(QueueUrl=url, Entries=no_group)
    assert error_code(err.value) == "InvalidParameterValue"  # AWS's code in a batch (a single send: MissingParameter)
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    no_dedup = [{"Id": "a", "MessageBody": "1", "MessageGroupId": "g", "MessageDeduplicationId": "d1"},
                {"Id": "b", "MessageBody": "2", "MessageGroupId": "g"}]
    with pytest.raises(botocore.exceptions.ClientError) as err:
        sqs.send_message_batch(QueueUrl=url, Entries=no_dedup)
    assert error_code(err.value) == "InvalidParameterValue"
    assert ("The queue should either have ContentBasedDeduplication enabled or MessageDeduplicationId "
            "provided explicitly") in _message(err.value)
    assert "Messages" not in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)  # nothing was sent
    cbd = make_queue(".fifo", FifoQueue="true", ContentBasedDeduplication="true")
    ok = sqs.send_message_batch(QueueUrl=cbd, Entries=[{"Id": "a", "MessageBody": "1", "MessageGroupId": "g"}])
    assert [s["Id"] for s in ok["Successful"]] == ["a"]


def test_unknown_queue_is_checked_before_the_receipt_handle(sqs, server):
    url = server.url + "/000000000000/never-created-queue"
    calls = [
        lambda: sqs.delete_message(QueueUrl=url, ReceiptHandle="junk"),
        lambda: sqs.change_message_visibility(QueueUrl=url, ReceiptHandle="junk", VisibilityTimeout=5),
        lambda: sqs.delete_message_batch(QueueUrl=url, Entries=[{"Id": "a", "ReceiptHandle": "junk"}]),
        lambda: sqs.change_message_visibility_batch(
            QueueUrl=url, Entries=[{"Id": "a", "ReceiptHandle": "junk", "VisibilityTimeout": 5}]),
    ]
    for call in calls:
        with pytest.raises(botocore.exceptions.ClientError) as err:
            call()
        assert error_code(err.value) == NO_QUEUE


def test_no_queue_wording_per_protocol(sqs, protocol):
    with pytest.raises(botocore.exceptions.ClientError) as err:
        sqs.get_queue_url(QueueName="no-such-queue-anywhere")
    expected = {"json": "The specified queue does not exist.",
                "query": "The specified queue does not exist for this wsdl version."}[protocol]
    assert _message(err.value) == expected


def test_add_permission_wording(sqs, make_queue):
    url = make_queue()
    cases = [
        ({"Actions": ["RemovePermission"]}, "InvalidParameterValue",
         "Value SQS:RemovePermission for parameter ActionName is invalid. "
         "Reason: Only the queue owner is allowed to invoke this action."),
        ({"Actions": ["CreateQueue"]}, "InvalidParameterValue",
         "Value SQS:CreateQueue for parameter ActionName is invalid. "
         "Reason: Only the queue owner is allowed to invoke this action."),
        ({"Actions": ["SendMessageBatch"]}, "InvalidParameterValue",
         "Value SQS:SendMessageBatch for parameter ActionName is invalid. "
         "Reason: Please refer to the appropriate WSDL for a list of valid actions."),
        ({"Actions": ["SendMessage"] * 8}, "OverLimit", "8 Actions were found, maximum allowed is 7."),
        ({"Actions": []}, "MissingParameter", "The request must contain the parameter Actions."),
    ]
    for change, code, message in cases:
        args = {"QueueUrl": url, "Label": "l", "AWSAccountIds": ["111122223333"], "Actions": ["SendMessage"]}
        with pytest.raises(botocore.exceptions.ClientError) as err:
            sqs.add_permission(**{**args, **change})
        assert (error_code(err.value), _message(err.value)) == (code, message)
    sqs.add_permission(QueueUrl=url, Label="l", AWSAccountIds=["111122223333"], Actions=["SendMessage"])
    with pytest.raises(botocore.exceptions.ClientError) as err:
        sqs.add_permission(QueueUrl=url, Label="l", AWSAccountIds=["111122223333"], Actions=["SendMessage"])
    assert _message(err.value) == "Value l for parameter Label is invalid. Reason: Already exists."
    sqs.remove_permission(QueueUrl=url, Label="l")
    with pytest.raises(botocore.exceptions.ClientError) as err:
        sqs.remove_permission(QueueUrl=url, Label="l")
    assert _message(err.value) == "Value l for parameter Label is invalid. Reason: can't find label on existing policy."
