"""SNS AddPermission and RemovePermission through boto3 in both wire protocols: they edit
the topic's Policy attribute as SNS does — and, since SQS has actions of the same names
on the same endpoint, the gateway tells the two apart (TopicArn, or a SigV4 scope for
sns) while SQS's own AddPermission keeps working in both of its protocols."""

from __future__ import annotations

import json

import botocore.exceptions
import httpx
import pytest

from support.sns_clients import ACCOUNT, REGION, error_code, status_code, unique
from support.sqs_clients import client as sqs_client

pytestmark = pytest.mark.slow

DEFAULT_ACTIONS = ["SNS:GetTopicAttributes", "SNS:SetTopicAttributes", "SNS:AddPermission",
                   "SNS:RemovePermission", "SNS:DeleteTopic", "SNS:Subscribe", "SNS:ListSubscriptionsByTopic",
                   "SNS:Publish"]


def _fails(call, code: str, status: int = 400, message: str | None = None) -> None:
    with pytest.raises(botocore.exceptions.ClientError) as info:
        call()
    assert error_code(info.value) == code, info.value.response
    assert status_code(info.value) == status
    if message is not None:
        assert info.value.response["Error"]["Message"] == message


def _policy(sns, topic: str) -> dict:
    return json.loads(sns.get_topic_attributes(TopicArn=topic)["Attributes"]["Policy"])


def test_add_and_remove_permission_edit_the_policy(sns, make_topic):
    topic = make_topic()
    sns.add_permission(TopicArn=topic, Label="one", AWSAccountId=["111122223333"], ActionName=["Publish"])
    sns.add_permission(TopicArn=topic, Label="two", AWSAccountId=["111122223333", "444455556666"],
                       ActionName=["Publish", "Subscribe"])
    policy = _policy(sns, topic)
    assert policy["Version"] == "2008-10-17" and policy["Id"] == "__default_policy_ID"
    default, one, two = policy["Statement"]
    assert default["Sid"] == "__default_statement_ID" and default["Action"] == DEFAULT_ACTIONS
    assert one == {"Sid": "one", "Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::111122223333:root"},
                   "Action": "SNS:Publish", "Resource": topic}
    assert two == {"Sid": "two", "Effect": "Allow",
                   "Principal": {"AWS": ["arn:aws:iam::111122223333:root", "arn:aws:iam::444455556666:root"]},
                   "Action": ["SNS:Publish", "SNS:Subscribe"], "Resource": topic}

    _fails(lambda: sns.add_permission(TopicArn=topic, Label="one", AWSAccountId=[ACCOUNT],
                                      ActionName=["AddPermission"]),
           "InvalidParameter", message="Invalid parameter: Statement already exists")
    _fails(lambda: sns.add_permission(TopicArn=topic, Label="three", AWSAccountId=[ACCOUNT],
                                      ActionName=["InvalidAction"]),
           "InvalidParameter", message="Invalid parameter: Policy statement action out of service scope!")
    missing = f"arn:aws:sns:{REGION}:{ACCOUNT}:{unique()}"
    _fails(lambda: sns.add_permission(TopicArn=missing, Label="x", AWSAccountId=[ACCOUNT], ActionName=["Publish"]),
           "NotFound", 404, "Topic does not exist")
    _fails(lambda: sns.remove_permission(TopicArn=missing, Label="one"), "NotFound", 404, "Topic does not exist")

    sns.remove_permission(TopicArn=topic, Label="one")
    assert [s["Sid"] for s in _policy(sns, topic)["Statement"]] == ["__default_statement_ID", "two"]
    sns.remove_permission(TopicArn=topic, Label="not-there")  # changes nothing, as SNS
    sns.remove_permission(TopicArn=topic, Label="two")
    assert _policy(sns, topic)["Statement"] == [default]
    # a statement of the default policy goes like any other
    sns.remove_permission(TopicArn=topic, Label="__default_statement_ID")
    assert _policy(sns, topic)["Statement"] == []


def test_permissions_build_on_a_policy_that_was_set(sns, make_topic):
    topic = make_topic()
    own = {"Version": "2012-10-17", "Statement": [{"Sid": "mine", "Effect": "Deny", "Principal": "*",
                                                    "Action": "SNS:Publish", "Resource": topic}]}
    sns.set_topic_attributes(TopicArn=topic, AttributeName="Policy", AttributeValue=json.dumps(own))
    sns.add_permission(TopicArn=topic, Label="added", AWSAccountId=[ACCOUNT], ActionName=["Receive"])
    policy = _policy(sns, topic)
    assert policy["Version"] == "2012-10-17"
    assert [s["Sid"] for s in policy["Statement"]] == ["mine", "added"]
    _fails(lambda: sns.add_permission(TopicArn=topic, Label="mine", AWSAccountId=[ACCOUNT], ActionName=["Publish"]),
           "InvalidParameter", message="Invalid parameter: Statement already exists")


@pytest.mark.parametrize("sqs_protocol", ["json", "query"])
def test_sqs_permissions_still_reach_sqs(server, sqs_protocol):
    sqs = sqs_client(server.url, sqs_protocol)
    url = sqs.create_queue(QueueName=unique("q"))["QueueUrl"]
    sqs.add_permission(QueueUrl=url, Label="l", AWSAccountIds=[ACCOUNT], Actions=["SendMessage"])
    [statement] = json.loads(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"])[
        "Attributes"]["Policy"])["Statement"]
    assert statement["Sid"] == "l" and statement["Action"] == "SQS:SendMessage"
    sqs.remove_permission(QueueUrl=url, Label="l")
    assert "Policy" not in sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]


def _auth(service: str) -> str:
    return (f"AWS4-HMAC-SHA256 Credential=AKIDCONVEYORTEST/20260101/{REGION}/{service}/aws4_request, "
            "SignedHeaders=host;x-amz-date, Signature=" + "0" * 64)


@pytest.mark.parametrize(("service", "namespace", "message"), [
    ("sns", "http://sns.amazonaws.com/doc/2010-03-31/", "Invalid parameter: TopicArn"),
    ("sqs", "http://queue.amazonaws.com/doc/2012-11-05/", None),
])
def test_gateway_routes_a_shared_action_by_the_signed_service(server, service, namespace, message):
    """Without a TopicArn or a QueueUrl, the SigV4 credential scope decides: an sns-signed
    RemovePermission is SNS's (and SNS's error about the missing TopicArn), an sqs-signed
    one is SQS's."""
    answer = httpx.post(server.url + "/", data={"Action": "RemovePermission", "Label": "x"},
                        headers={"Authorization": _auth(service), "X-Amz-Date": "20260101T000000Z"})
    assert answer.status_code == 400
    assert f'xmlns="{namespace}"' in answer.text
    if message:
        assert f"<Message>{message}</Message>" in answer.text
