"""The SQS wire itself, over raw HTTP: request ids, error shapes, routing, authentication."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import botocore.exceptions
import httpx
import orjson
import pytest

from support.server import ServerProcess
from support.sqs_clients import client, error_code

NS = {"sqs": "http://queue.amazonaws.com/doc/2012-11-05/"}
AUTH = {"Authorization": "AWS4-HMAC-SHA256 Credential=AKIDX/20260101/us-east-1/sqs/aws4_request, "
                         "SignedHeaders=host, Signature=0"}


def _json(server, action: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(server.url + "/", content=orjson.dumps(body), headers={
        "Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": f"AmazonSQS.{action}", **AUTH,
        **(headers or {})})


def _query(server, path: str = "/", **fields: str) -> httpx.Response:
    return httpx.post(server.url + path, data=fields, headers=AUTH)


def test_json_success_and_error_shapes(server):
    ok = _json(server, "CreateQueue", {"QueueName": "wire-json"})
    assert ok.status_code == 200 and ok.headers["content-type"] == "application/x-amz-json-1.0"
    assert ok.headers["x-amzn-RequestId"] and ok.json()["QueueUrl"].endswith("/000000000000/wire-json")
    missing = _json(server, "GetQueueUrl", {"QueueName": "nope-nope"})
    assert missing.status_code == 400
    assert missing.json() == {"__type": "com.amazonaws.sqs#QueueDoesNotExist",
                              "message": "The specified queue does not exist."}
    assert missing.headers["x-amzn-query-error"] == "AWS.SimpleQueueService.NonExistentQueue;Sender"
    assert missing.headers["x-amzn-RequestId"]


def test_query_success_and_error_shapes(server):
    ok = _query(server, Action="CreateQueue", QueueName="wire-query", Version="2012-11-05")
    assert ok.status_code == 200 and ok.headers["content-type"].startswith("text/xml")
    root = ET.fromstring(ok.text)
    assert root.tag == "{{{}}}CreateQueueResponse".format(NS["sqs"])
    url = root.find("sqs:CreateQueueResult/sqs:QueueUrl", NS).text
    request_id = root.find("sqs:ResponseMetadata/sqs:RequestId", NS).text
    assert url.endswith("/wire-query") and request_id == ok.headers["x-amzn-RequestId"]
    bad = _query(server, Action="GetQueueUrl", QueueName="nope-nope")
    assert bad.status_code == 400
    error = ET.fromstring(bad.text)
    assert error.find("sqs:Error/sqs:Type", NS).text == "Sender"
    assert error.find("sqs:Error/sqs:Code", NS).text == "AWS.SimpleQueueService.NonExistentQueue"
    assert error.find("sqs:Error/sqs:Message", NS).text == "The specified queue does not exist for this wsdl version."
    assert error.find("sqs:RequestId", NS).text == bad.headers["x-amzn-RequestId"]


def test_path_style_queue_url_and_get(server):
    _query(server, Action="CreateQueue", QueueName="wire-path")
    sent = _query(server, "/000000000000/wire-path", Action="SendMessage", MessageBody="by path")
    assert sent.status_code == 200, sent.text
    got = httpx.get(server.url + "/000000000000/wire-path", params={"Action": "ReceiveMessage"}, headers=AUTH)
    body = ET.fromstring(got.text).find("sqs:ReceiveMessageResult/sqs:Message/sqs:Body", NS).text
    assert body == "by path"


@pytest.mark.parametrize("send", ["json", "query"])
def test_unknown_action_and_bad_input(server, send):
    if send == "json":
        r = _json(server, "FlyToTheMoon", {})
        assert r.status_code == 400 and r.json()["__type"].endswith("#InvalidAction")
        r = httpx.post(server.url + "/", content=b"{not json", headers={
            "Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.ListQueues", **AUTH})
        assert r.status_code == 400 and "SerializationException" in r.json()["__type"]
        r = _json(server, "ReceiveMessage", {"QueueUrl": "x", "MaxNumberOfMessages": "ten"})
        assert r.status_code == 400 and r.json()["__type"] == "com.amazon.coral.service#InvalidParameterValueException"
    else:
        r = _query(server, Action="FlyToTheMoon")
        assert r.status_code == 400 and "<Code>InvalidAction</Code>" in r.text
        r = _query(server, Action="ReceiveMessage", QueueUrl="x", MaxNumberOfMessages="ten")
        assert r.status_code == 400 and "<Code>InvalidParameterValue</Code>" in r.text
        r = _query(server, Action="SendMessage")
        assert r.status_code == 400 and "<Code>MissingParameter</Code>" in r.text


def test_large_query_forms(server):
    """A form of many fields is read in one pass (a list's entries once looked for by a scan of
    every field each), and one of more fields than any real request has is refused."""
    created = ET.fromstring(_query(server, Action="CreateQueue", QueueName="wire-wide").text)
    url = created.find("sqs:CreateQueueResult/sqs:QueueUrl", NS).text
    entries = {f"SendMessageBatchRequestEntry.{i}.{k}": f"{k[0]}{i}" for i in range(1, 11)
               for k in ("Id", "MessageBody")}
    stray = {f"Stray.{i}.a.b": "x" for i in range(9_000)}
    r = _query(server, Action="SendMessageBatch", QueueUrl=url, **entries, **stray)
    root = ET.fromstring(r.text)
    assert r.status_code == 200, r.text
    assert sorted(e.text for e in root.iter("{{{}}}Id".format(NS["sqs"]))) == sorted(f"I{i}" for i in range(1, 11))
    r = _query(server, Action="ListQueues", **{f"Stray.{i}": "x" for i in range(10_001)})
    assert r.status_code == 400 and "The request has more than 10000 parameters." in r.text


def test_missing_authorization_is_refused_in_aws_terms(server):
    r = httpx.post(server.url + "/", data={"Action": "ListQueues"})
    assert r.status_code == 403 and "<Code>MissingAuthenticationToken</Code>" in r.text


@pytest.fixture(scope="module")
def signed_server(module_dsn):
    proc = ServerProcess(module_dsn, env={"CONVEYOR_AWS_CREDENTIALS": "AKIDGOOD:good-secret,AKIDTWO:two-secret"})
    proc.start()
    yield proc
    proc.kill()


@pytest.mark.parametrize("protocol", ["json", "query"])
def test_sigv4_mode(signed_server, protocol):
    good = client(signed_server.url, protocol, access_key="AKIDGOOD", secret_key="good-secret")
    url = good.create_queue(QueueName=f"signed-{protocol}")["QueueUrl"]
    good.send_message(QueueUrl=url, MessageBody="signed")
    [m] = good.receive_message(QueueUrl=url, AttributeNames=["SenderId"])["Messages"]
    assert m["Attributes"]["SenderId"] == "AKIDGOOD"
    for key, secret, code in (("AKIDGOOD", "wrong", "SignatureDoesNotMatch"),
                              ("AKIDNOBODY", "x", "InvalidClientTokenId")):
        bad = client(signed_server.url, protocol, access_key=key, secret_key=secret)
        with pytest.raises(botocore.exceptions.ClientError) as err:
            bad.list_queues()
        assert error_code(err.value) == code
        assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    r = httpx.post(signed_server.url + "/", data={"Action": "ListQueues"}, headers=AUTH)
    assert r.status_code in (400, 403) and "<Code>" in r.text


def test_rest_is_unaffected_by_the_aws_routes(server):
    assert httpx.get(server.url + "/v1/queues", headers={"Authorization": "x"}).status_code == 200
