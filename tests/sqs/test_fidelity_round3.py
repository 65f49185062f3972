"""AWS fidelity, round 3 (issue 27, SQS items 5-9 and 16-20): behaviour checked against
what AWS answers (LocalStack's snapshots recorded against AWS, AWS's API reference),
each through boto3 in both wire protocols (JSON and Query)."""

from __future__ import annotations

import base64
import json
import uuid

import botocore.exceptions
import httpx
import pytest

from support.sqs_clients import client, error_code

AUTH = {"Authorization": "AWS4-HMAC-SHA256 Credential=AKIDX/20260101/us-east-1/sqs/aws4_request, "
                         "SignedHeaders=host, Signature=0"}


def _message(exc: Exception) -> str:
    return exc.response["Error"]["Message"]  # type: ignore[attr-defined]


def _fails(call, *args, **kwargs) -> botocore.exceptions.ClientError:
    with pytest.raises(botocore.exceptions.ClientError) as err:
        call(*args, **kwargs)
    return err.value


def _arn(sqs, url: str) -> str:
    return sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]


# -- item 16: the JSON protocol's error types ----------------------------------------------------

def test_json_error_type_is_the_shape_name_and_the_query_code_is_in_the_header(sqs, protocol, make_queue):
    url = make_queue()
    bad = _fails(sqs.receive_message, QueueUrl=url, MaxNumberOfMessages=11)
    missing = _fails(sqs.get_queue_url, QueueName="no-such-queue-round-3")
    assert error_code(bad) == "InvalidParameterValue" and error_code(missing) == "AWS.SimpleQueueService.NonExistentQueue"
    if protocol == "json":  # botocore keeps the JSON __type's name beside the Query code
        assert bad.response["Error"]["QueryErrorCode"] == "InvalidParameterValueException"
        assert missing.response["Error"]["QueryErrorCode"] == "QueueDoesNotExist"
        empty = _fails(sqs.send_message, QueueUrl=url, MessageBody="")
        assert empty.response["Error"]["QueryErrorCode"] == "MissingRequiredParameterException"


def test_json_error_type_over_raw_http(server):
    answer = httpx.post(server.url + "/", content=b'{"QueueName": "x", "Attributes": {"DelaySeconds": "1000"}}',
                        headers={"Content-Type": "application/x-amz-json-1.0",
                                 "X-Amz-Target": "AmazonSQS.CreateQueue", **AUTH})
    assert answer.status_code == 400
    assert answer.json()["__type"] == "com.amazonaws.sqs#InvalidAttributeValue"
    bad = httpx.post(server.url + "/", content=b'{"QueueName": "x y"}',
                     headers={"Content-Type": "application/x-amz-json-1.0",
                              "X-Amz-Target": "AmazonSQS.CreateQueue", **AUTH})
    assert bad.json()["__type"] == "com.amazon.coral.service#InvalidParameterValueException"
    assert bad.headers["x-amzn-query-error"] == "InvalidParameterValue;Sender"


# -- item 17: error codes and an empty ListQueues -----------------------------------------------

def test_list_queues_without_match_omits_queue_urls(sqs):
    assert "QueueUrls" not in sqs.list_queues(QueueNamePrefix=f"nothing-{uuid.uuid4().hex}")


def test_error_codes_as_aws(sqs, make_queue):
    url = make_queue()
    err = _fails(sqs.send_message, QueueUrl=url, MessageBody="")
    assert (error_code(err), _message(err)) == ("MissingParameter", "The request must contain the parameter MessageBody.")
    err = _fails(sqs.send_message, QueueUrl=url, MessageBody="m",
                 MessageAttributes={"a": {"DataType": "String", "StringValue": "bad\x01char"}})
    assert error_code(err) == "InvalidParameterValue"
    err = _fails(sqs.send_message, QueueUrl=url, MessageBody="bad\x01char")
    assert error_code(err) == "InvalidMessageContents"  # the body keeps its own code
    fifo = make_queue(".fifo", FifoQueue="true", ContentBasedDeduplication="true")
    err = _fails(sqs.send_message_batch, QueueUrl=fifo, Entries=[{"Id": "a", "MessageBody": "1"}])
    assert (error_code(err), _message(err)) == ("InvalidParameterValue",
                                                "The request must contain the parameter MessageGroupId.")
    err = _fails(sqs.send_message, QueueUrl=fifo, MessageBody="1")
    assert error_code(err) == "MissingParameter"  # a single send keeps MissingParameter


def test_fifo_queue_attribute_as_aws(sqs, make_queue):
    standard, fifo = make_queue(), make_queue(".fifo", FifoQueue="true")
    err = _fails(sqs.set_queue_attributes, QueueUrl=fifo, Attributes={"FifoQueue": "false"})
    assert (error_code(err), _message(err)) == (
        "InvalidAttributeValue", "Invalid value for the parameter FifoQueue. Reason: Modifying queue type is not supported.")
    sqs.set_queue_attributes(QueueUrl=fifo, Attributes={"FifoQueue": "true"})  # no change: accepted
    err = _fails(sqs.set_queue_attributes, QueueUrl=standard, Attributes={"FifoQueue": "true"})
    assert (error_code(err), _message(err)) == ("InvalidAttributeName", "Unknown Attribute FifoQueue.")


# -- item 18: the Query protocol's edges ---------------------------------------------------------

def test_query_request_accepting_json_is_answered_in_json(server, sqs):
    url = sqs.create_queue(QueueName=f"q-accept-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="hello")
    answer = httpx.get(server.url + "/", params={"Action": "ListQueues", "Version": "2012-11-05"},
                       headers={"Accept": "application/json", **AUTH})
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("application/json")
    document = answer.json()["ListQueuesResponse"]
    assert url in document["ListQueuesResult"]["QueueUrls"] and document["ResponseMetadata"]["RequestId"]
    received = httpx.get(server.url + "/", params={"Action": "ReceiveMessage", "QueueUrl": url, "VisibilityTimeout": "0"},
                         headers={"Accept": "application/json", **AUTH}).json()
    assert received["ReceiveMessageResponse"]["ReceiveMessageResult"]["Messages"][0]["Body"] == "hello"
    failed = httpx.get(url, params={"Action": "ListQueues"}, headers={"Accept": "application/json", **AUTH})
    assert failed.status_code == 400
    assert failed.json()["Error"]["Code"] == "InvalidAction"
    assert failed.json()["Error"]["Message"] == "The action ListQueues is not valid for this endpoint."
    xml = httpx.get(server.url + "/", params={"Action": "ListQueues"}, headers=AUTH)  # the default stays XML
    assert b"<ListQueuesResponse" in xml.content


@pytest.mark.parametrize("action", ["ListQueues", "CreateQueue"])
def test_queueless_actions_on_a_queue_url_are_invalid(server, sqs, action):
    url = sqs.create_queue(QueueName=f"q-queueless-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    answer = httpx.post(url, data={"Action": action, "QueueName": "other-queue"}, headers=AUTH)
    assert answer.status_code == 400
    assert "<Code>InvalidAction</Code>" in answer.text
    assert f"<Message>The action {action} is not valid for this endpoint.</Message>" in answer.text
    same = httpx.post(url, data={"Action": "GetQueueUrl", "QueueName": url.rsplit("/", 1)[1]}, headers=AUTH)
    assert same.status_code == 200  # GetQueueUrl names a queue: allowed


def test_request_without_action(server, sqs):
    url = sqs.create_queue(QueueName=f"q-noaction-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    for target in (url, server.url + "/"):
        answer = httpx.get(target, headers={"Accept": "application/json", **AUTH})
        assert answer.status_code == 404 and "<UnknownOperationException" in answer.text


# -- item 19: attributes -------------------------------------------------------------------------

def test_add_permission_policy_version(sqs, make_queue):
    url = make_queue()
    sqs.add_permission(QueueUrl=url, Label="l", AWSAccountIds=["111122223333"], Actions=["SendMessage"])
    policy = json.loads(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"])["Attributes"]["Policy"])
    assert policy["Version"] == "2008-10-17"


def test_kms_reuse_period_hidden_once_kms_is_off(sqs, make_queue):
    url = make_queue(KmsMasterKeyId="alias/aws/sqs", KmsDataKeyReusePeriodSeconds="120")
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert got["KmsDataKeyReusePeriodSeconds"] == "120"
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"KmsMasterKeyId": ""})
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert "KmsDataKeyReusePeriodSeconds" not in got and "KmsMasterKeyId" not in got


def test_standard_queue_refuses_fifo_only_attributes(sqs):
    name = f"q-std-{uuid.uuid4().hex[:8]}"
    cases = {"FifoQueue": ("false", "Unknown Attribute FifoQueue."),
             "ContentBasedDeduplication": ("false", "Unknown Attribute ContentBasedDeduplication."),
             "DeduplicationScope": ("queue", "You can specify the DeduplicationScope only when FifoQueue is set to true."),
             "FifoThroughputLimit": ("perQueue",
                                     "You can specify the FifoThroughputLimit only when FifoQueue is set to true.")}
    for attribute, (value, message) in cases.items():
        err = _fails(sqs.create_queue, QueueName=name, Attributes={attribute: value})
        assert (error_code(err), _message(err)) == ("InvalidAttributeName", message)


def test_batch_entry_of_exactly_the_maximum_size_is_accepted(sqs, make_queue):
    url = make_queue(MaximumMessageSize="1024")
    attributes = {"k": {"DataType": "String", "StringValue": "v" * 10}}  # 1 + 6 + 10 bytes
    body = "x" * (1024 - 17)
    result = sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "a", "MessageBody": body,
                                                            "MessageAttributes": attributes}])
    assert [s["Id"] for s in result["Successful"]] == ["a"] and not result.get("Failed")
    sqs.send_message(QueueUrl=url, MessageBody=body, MessageAttributes=attributes)
    over = sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "b", "MessageBody": body + "x",
                                                          "MessageAttributes": attributes}])
    assert [f["Id"] for f in over["Failed"]] == ["b"]


# -- item 5: ChangeMessageVisibility and old handles ---------------------------------------------

def test_change_visibility_after_the_timeout_ran_out_is_accepted(sqs, make_queue):
    url = make_queue()
    sqs.send_message(QueueUrl=url, MessageBody="x")
    [m] = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)["Messages"]
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=30)
    assert "Messages" not in sqs.receive_message(QueueUrl=url)  # hidden again by the newest handle
    result = sqs.change_message_visibility_batch(QueueUrl=url, Entries=[
        {"Id": "a", "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}])
    assert [s["Id"] for s in result["Successful"]] == ["a"]
    assert sqs.receive_message(QueueUrl=url)["Messages"][0]["Body"] == "x"


def test_change_visibility_with_an_old_or_deleted_handle(sqs, make_queue):
    url = make_queue()
    sqs.send_message(QueueUrl=url, MessageBody="x")
    [first] = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)["Messages"]
    [second] = sqs.receive_message(QueueUrl=url, VisibilityTimeout=30)["Messages"]
    for handle, delete in ((first["ReceiptHandle"], False), (second["ReceiptHandle"], True)):
        if delete:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=handle)
        err = _fails(sqs.change_message_visibility, QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=5)
        assert (error_code(err), _message(err)) == (
            "InvalidParameterValue", f"Value {handle} for parameter ReceiptHandle is invalid. Reason: Message does "
            "not exist or is not available for visibility timeout change.")
        result = sqs.change_message_visibility_batch(QueueUrl=url, Entries=[
            {"Id": "a", "ReceiptHandle": handle, "VisibilityTimeout": 5}])
        assert [(f["Id"], f["Code"]) for f in result["Failed"]] == [("a", "InvalidParameterValue")]


# -- item 6: dead letters keep their receive count ----------------------------------------------

def test_dead_letter_keeps_approximate_receive_count(sqs, make_queue):
    dlq = make_queue()
    url = make_queue(RedrivePolicy=json.dumps({"deadLetterTargetArn": _arn(sqs, dlq), "maxReceiveCount": 2}))
    sqs.send_message(QueueUrl=url, MessageBody="poison")
    for _ in range(2):
        [m] = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0, AttributeNames=["All"])["Messages"]
    assert m["Attributes"]["ApproximateReceiveCount"] == "2"
    assert "Messages" not in sqs.receive_message(QueueUrl=url)  # moved on this receive
    [dead] = sqs.receive_message(QueueUrl=dlq, AttributeNames=["All"])["Messages"]
    assert dead["Body"] == "poison" and dead["Attributes"]["ApproximateReceiveCount"] == "3"
    assert dead["Attributes"]["ApproximateFirstReceiveTimestamp"] == m["Attributes"]["ApproximateFirstReceiveTimestamp"]


# -- item 7: a queue may be its own dead-letter queue --------------------------------------------

def test_redrive_policy_naming_the_queue_itself(sqs, make_queue):
    url = make_queue()
    policy = json.dumps({"deadLetterTargetArn": _arn(sqs, url), "maxReceiveCount": 1})
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": policy})
    got = json.loads(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])["Attributes"][
        "RedrivePolicy"])
    assert got == {"deadLetterTargetArn": _arn(sqs, url), "maxReceiveCount": 1}
    sqs.send_message(QueueUrl=url, MessageBody="again")
    for _ in range(3):  # over the count it goes to the back of the same queue: never lost, never stuck
        [m] = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0, WaitTimeSeconds=1)["Messages"]
        assert m["Body"] == "again"
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": ""})
    assert "RedrivePolicy" not in sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]


# -- item 8: message move tasks ------------------------------------------------------------------

def _dead_lettered(sqs, make_queue, count: int) -> tuple[str, str]:
    """(source queue URL, dead-letter queue URL) with ``count`` messages dead-lettered."""
    dlq = make_queue()
    url = make_queue(RedrivePolicy=json.dumps({"deadLetterTargetArn": _arn(sqs, dlq), "maxReceiveCount": 1}))
    for i in range(count):
        sqs.send_message(QueueUrl=url, MessageBody=f"m{i}")
    for _ in range(count * 2):
        sqs.receive_message(QueueUrl=url, VisibilityTimeout=0, MaxNumberOfMessages=10)
    return url, dlq


def test_move_task_handle_has_aws_form(sqs, make_queue):
    _, dlq = _dead_lettered(sqs, make_queue, 20)
    destination = make_queue()
    handle = sqs.start_message_move_task(SourceArn=_arn(sqs, dlq), DestinationArn=_arn(sqs, destination),
                                         MaxNumberOfMessagesPerSecond=1)["TaskHandle"]
    doc = json.loads(base64.b64decode(handle))
    assert doc["sourceArn"] == _arn(sqs, dlq) and uuid.UUID(doc["taskId"])
    [listed] = sqs.list_message_move_tasks(SourceArn=_arn(sqs, dlq))["Results"]
    assert listed["TaskHandle"] == handle
    err = _fails(sqs.start_message_move_task, SourceArn=_arn(sqs, dlq))
    assert (error_code(err), _message(err)) == ("InvalidParameterValue", "There is already a task running. Only one "
                                                "active task is allowed for a source queue arn at a given time.")
    err = _fails(sqs.cancel_message_move_task, TaskHandle="foobared")
    assert (error_code(err), _message(err)) == ("InvalidParameterValue", "Value for parameter TaskHandle is invalid.")
    other = base64.b64encode(json.dumps({"taskId": str(uuid.uuid4()), "sourceArn": _arn(sqs, dlq)}).encode()).decode()
    err = _fails(sqs.cancel_message_move_task, TaskHandle=other)
    assert (error_code(err), _message(err)) == ("ResourceNotFoundException", "Task does not exist.")
    gone = base64.b64encode(json.dumps({"taskId": doc["taskId"], "sourceArn": _arn(sqs, dlq) + "-nope"}).encode())
    err = _fails(sqs.cancel_message_move_task, TaskHandle=gone.decode())
    assert (error_code(err), _message(err)) == (
        "ResourceNotFoundException", "The resource that you specified for the SourceArn parameter doesn't exist.")
    assert sqs.cancel_message_move_task(TaskHandle=handle)["ApproximateNumberOfMessagesMoved"] >= 0


def test_move_task_whose_destination_was_deleted_fails(sqs, make_queue):
    _, dlq = _dead_lettered(sqs, make_queue, 10)
    destination = make_queue()
    sqs.start_message_move_task(SourceArn=_arn(sqs, dlq), DestinationArn=_arn(sqs, destination),
                                MaxNumberOfMessagesPerSecond=1)
    destination_arn = _arn(sqs, destination)
    sqs.delete_queue(QueueUrl=destination)
    [task] = sqs.list_message_move_tasks(SourceArn=_arn(sqs, dlq))["Results"]
    assert task["Status"] == "FAILED" and task["FailureReason"] == "AWS.SimpleQueueService.NonExistentQueue"
    assert task["DestinationArn"] == destination_arn and "TaskHandle" not in task
    assert sqs.receive_message(QueueUrl=dlq)["Messages"]  # what was not moved stays


# -- item 9: AWSTraceHeader ----------------------------------------------------------------------

def _with_trace(sqs, trace: str):
    def add(request, **_):
        request.headers["X-Amzn-Trace-Id"] = trace
    sqs.meta.events.register("before-sign.sqs.*", add)
    return sqs


def test_trace_header_becomes_aws_trace_header(server, protocol, make_queue):
    trace = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
    traced = _with_trace(client(server.url, protocol), trace)
    url = make_queue()
    sent = traced.send_message(QueueUrl=url, MessageBody="traced")
    assert "MD5OfMessageSystemAttributes" not in sent  # the client gave no system attributes
    traced.send_message_batch(QueueUrl=url, Entries=[{"Id": "b", "MessageBody": "batched"}])
    explicit = "Root=1-00000000-000000000000000000000000"
    traced.send_message(QueueUrl=url, MessageBody="explicit", MessageSystemAttributes={
        "AWSTraceHeader": {"DataType": "String", "StringValue": explicit}})
    got = {}
    for _ in range(5):
        for m in traced.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["AWSTraceHeader"]).get(
                "Messages", []):
            got[m["Body"]] = m.get("Attributes", {}).get("AWSTraceHeader")
        if len(got) == 3:
            break
    assert got == {"traced": trace, "batched": trace, "explicit": explicit}
    plain = client(server.url, protocol)
    plain.send_message(QueueUrl=url, MessageBody="untraced")
    [m] = plain.receive_message(QueueUrl=url, AttributeNames=["All"])["Messages"]
    assert "AWSTraceHeader" not in m.get("Attributes", {})


# -- item 20: queue URLs carry the region --------------------------------------------------------

def test_queue_urls_carry_the_region(server, protocol):
    east, west = client(server.url, protocol, region="us-east-1"), client(server.url, protocol, region="eu-west-1")
    name = f"q-region-{uuid.uuid4().hex[:8]}"
    east_url = east.create_queue(QueueName=name)["QueueUrl"]
    west_url = west.create_queue(QueueName=name)["QueueUrl"]
    assert east_url != west_url and "/eu-west-1/" in west_url
    assert west.get_queue_url(QueueName=name)["QueueUrl"] == west_url
    assert west_url in west.list_queues(QueueNamePrefix=name)["QueueUrls"]
    west.send_message(QueueUrl=west_url, MessageBody="west")
    east.send_message(QueueUrl=east_url, MessageBody="east")
    # a URL names its queue whoever holds it: the region is in the URL, not the client
    assert east.receive_message(QueueUrl=west_url)["Messages"][0]["Body"] == "west"
    assert west.receive_message(QueueUrl=east_url.replace(server.url, "https://sqs.us-east-1.amazonaws.com"))[
        "Messages"][0]["Body"] == "east"
    aws_host = f"https://sqs.eu-west-1.amazonaws.com/000000000000/{name}"
    assert east.get_queue_attributes(QueueUrl=aws_host, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"] == \
        f"arn:aws:sqs:eu-west-1:000000000000:{name}"


def test_a_regional_queue_url_is_an_endpoint(server, sqs):
    """SDKs that send a queue's requests to its URL (the Query protocol's way) reach it."""
    west = client(server.url, "json", region="eu-west-1")
    url = west.create_queue(QueueName=f"q-endpoint-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    sent = httpx.post(url, data={"Action": "SendMessage", "MessageBody": "via the URL"}, headers=AUTH)
    assert sent.status_code == 200, sent.text
    assert west.receive_message(QueueUrl=url)["Messages"][0]["Body"] == "via the URL"
    # the URL's region wins over the signature's (us-east-1 in AUTH)
    listed = httpx.post(url, data={"Action": "GetQueueAttributes", "AttributeName.1": "QueueArn"}, headers=AUTH)
    assert ":eu-west-1:" in listed.text
