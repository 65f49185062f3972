"""The SNS wire over raw HTTP: routing at ``POST /`` (SNS JSON by X-Amz-Target, SNS Query by
its Action, SQS otherwise), response and error shapes of both protocols, authentication."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import botocore.exceptions
import httpx
import orjson
import pytest

from support.server import ServerProcess
from support.sns_clients import error_code, sns_client, unique
from support.sqs_clients import client as sqs_client

pytestmark = pytest.mark.slow

NS = {"sns": "http://sns.amazonaws.com/doc/2010-03-31/"}
AUTH = {"Authorization": "AWS4-HMAC-SHA256 Credential=AKIDX/20260101/us-east-1/sns/aws4_request, "
                         "SignedHeaders=host, Signature=0"}


def _json(server, action: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(server.url + "/", content=orjson.dumps(body), headers={
        "Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": f"AmazonSNS.{action}", **AUTH,
        **(headers or {})})


def _query(server, **fields: str) -> httpx.Response:
    return httpx.post(server.url + "/", data=fields, headers=AUTH)


def test_json_success_and_error_shapes(server):
    name = unique()
    ok = _json(server, "CreateTopic", {"Name": name})
    assert ok.status_code == 200 and ok.headers["content-type"] == "application/x-amz-json-1.0"
    assert ok.json() == {"TopicArn": f"arn:aws:sns:us-east-1:000000000000:{name}"} and ok.headers["x-amzn-RequestId"]
    missing = _json(server, "GetTopicAttributes", {"TopicArn": "arn:aws:sns:us-east-1:000000000000:nope-nope"})
    assert missing.status_code == 404
    assert missing.json() == {"__type": "com.amazonaws.sns#NotFoundException", "message": "Topic does not exist"}
    assert missing.headers["x-amzn-query-error"] == "NotFound;Sender"
    bad = _json(server, "GetTopicAttributes", {"TopicArn": "nope"})
    assert bad.status_code == 400 and bad.json()["__type"] == "com.amazonaws.sns#InvalidParameterException"
    assert bad.json()["message"] == "Invalid parameter: TopicArn Reason: An ARN must have at least 6 elements, not 1"
    assert bad.headers["x-amzn-query-error"] == "InvalidParameter;Sender"
    typed = _json(server, "Subscribe", {"TopicArn": ok.json()["TopicArn"], "Protocol": "sqs",
                                        "ReturnSubscriptionArn": "perhaps"})
    assert typed.status_code == 400 and typed.json()["message"].startswith("Invalid parameter: ReturnSubscriptionArn")
    assert _json(server, "FlyToTheMoon", {}).json()["__type"] == "com.amazonaws.sns#InvalidAction"
    broken = httpx.post(server.url + "/", content=b"{nope", headers={
        "Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSNS.ListTopics", **AUTH})
    assert broken.status_code == 400 and broken.json()["__type"].endswith("#SerializationException")


def test_query_success_and_error_shapes(server):
    name = unique()
    ok = _query(server, Action="CreateTopic", Name=name, Version="2010-03-31",
                **{"Attributes.entry.1.key": "DisplayName", "Attributes.entry.1.value": "Shown"})
    assert ok.status_code == 200 and ok.headers["content-type"].startswith("text/xml")
    root = ET.fromstring(ok.text)
    assert root.tag == "{{{}}}CreateTopicResponse".format(NS["sns"])
    arn = root.find("sns:CreateTopicResult/sns:TopicArn", NS).text
    assert root.find("sns:ResponseMetadata/sns:RequestId", NS).text == ok.headers["x-amzn-RequestId"]
    attrs = ET.fromstring(_query(server, Action="GetTopicAttributes", TopicArn=arn).text)
    entries = {e.find("sns:key", NS).text: e.find("sns:value", NS).text
               for e in attrs.findall("sns:GetTopicAttributesResult/sns:Attributes/sns:entry", NS)}
    assert entries["DisplayName"] == "Shown" and entries["TopicArn"] == arn
    listed = ET.fromstring(_query(server, Action="ListTopics").text)
    assert arn in [t.text for t in listed.findall("sns:ListTopicsResult/sns:Topics/sns:member/sns:TopicArn", NS)]
    bad = _query(server, Action="GetTopicAttributes", TopicArn=arn + "-missing")
    assert bad.status_code == 404
    error = ET.fromstring(bad.text)
    assert error.find("sns:Error/sns:Type", NS).text == "Sender"
    assert error.find("sns:Error/sns:Code", NS).text == "NotFound"
    assert error.find("sns:Error/sns:Message", NS).text == "Topic does not exist"
    assert error.find("sns:RequestId", NS).text == bad.headers["x-amzn-RequestId"]


def test_gateway_tells_sns_from_sqs(server):
    # an SQS Query request and an SQS JSON request still reach SQS
    sqs_query = _query(server, Action="CreateQueue", QueueName=unique("q"))
    assert sqs_query.status_code == 200 and "CreateQueueResponse" in sqs_query.text
    assert "queue.amazonaws.com" in sqs_query.text
    sqs_json = httpx.post(server.url + "/", content=b"{}", headers={
        "Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.ListQueues", **AUTH})
    assert sqs_json.status_code == 200 and "__type" not in sqs_json.json()
    # SNS's Action in the query string (as the UnsubscribeURL carries it) reaches SNS
    by_url = httpx.post(server.url + "/?Action=ListTopics", headers=AUTH)
    assert by_url.status_code == 200 and "ListTopicsResponse" in by_url.text
    # an action neither service knows goes to SQS, the default, which says so
    unknown = _query(server, Action="FlyToTheMoon")
    assert unknown.status_code == 400 and "queue.amazonaws.com" in unknown.text
    # path-style queue URLs are always SQS
    path = httpx.post(server.url + "/000000000000/whatever", data={"Action": "ListTopics"}, headers=AUTH)
    assert "queue.amazonaws.com" in path.text


def test_both_clients_against_one_server(server):
    sns, sqs = sns_client(server.url, "query"), sqs_client(server.url, "query")
    topic = sns.create_topic(Name=unique())["TopicArn"]
    url = sqs.create_queue(QueueName=unique("q"))["QueueUrl"]
    assert topic.startswith("arn:aws:sns:") and url.startswith(server.url)


def test_authentication(server):
    anonymous = httpx.post(server.url + "/", data={"Action": "ListTopics"})
    assert anonymous.status_code == 403
    assert "<Code>MissingAuthenticationToken</Code>" in anonymous.text
    no_auth_json = httpx.post(server.url + "/", content=b"{}", headers={
        "Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSNS.ListTopics"})
    assert no_auth_json.status_code == 403
    assert no_auth_json.json()["__type"] == "com.amazonaws.sns#MissingAuthenticationToken"
    # an Unsubscribe link without credentials is judged by its token, which an ARN is not
    link = httpx.get(server.url + "/", params={
        "Action": "Unsubscribe",
        "SubscriptionArn": "arn:aws:sns:us-east-1:000000000000:t:00000000-0000-4000-8000-000000000000"})
    assert link.status_code == 403 and "<Code>AuthorizationError</Code>" in link.text
    # ... and nothing else is taken without credentials
    assert httpx.get(server.url + "/", params={"Action": "ListTopics"}).status_code == 403


def test_sigv4_when_credentials_are_configured(module_dsn):
    signed = ServerProcess(module_dsn, env={"CONVEYOR_AWS_CREDENTIALS": "AKIDCONVEYORTEST:secret"}).start()
    try:
        assert sns_client(signed.url, "query").list_topics()["ResponseMetadata"]["HTTPStatusCode"] == 200
        assert sns_client(signed.url, "json").list_topics()["ResponseMetadata"]["HTTPStatusCode"] == 200
        wrong = sns_client(signed.url, "query", secret_key="wrong")
        with pytest.raises(botocore.exceptions.ClientError) as info:
            wrong.list_topics()
        assert error_code(info.value) == "SignatureDoesNotMatch"
    finally:
        signed.kill()


def test_sns_target_with_a_form_body_is_the_query_protocol(server):
    """Seed 000: an SNS target header routes to SNS; the Content-Type picks the protocol."""
    answer = httpx.post(server.url + "/", data={"Action": "ListTopics"},
                        headers={"X-Amz-Target": "AmazonSNS.ListTopics", **AUTH})
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/xml")
    assert "ListTopicsResponse" in answer.text
