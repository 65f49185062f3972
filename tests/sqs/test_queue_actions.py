"""SQS queue actions through boto3, in both wire protocols."""

from __future__ import annotations

import json
import time

import botocore.exceptions
import pytest

from support.sqs_clients import client, error_code


def _name(url: str) -> str:
    return url.rsplit("/", 1)[1]


def test_create_get_url_and_idempotent_create(sqs, make_queue, server):
    url = make_queue(VisibilityTimeout="45")
    assert url.startswith(server.url + "/000000000000/q-")
    assert sqs.get_queue_url(QueueName=_name(url))["QueueUrl"] == url
    assert sqs.create_queue(QueueName=_name(url), Attributes={"VisibilityTimeout": "45"})["QueueUrl"] == url
    with pytest.raises(sqs.exceptions.QueueNameExists) as err:
        sqs.create_queue(QueueName=_name(url), Attributes={"VisibilityTimeout": "46"})
    assert err.value.response["Error"]["Code"] == "QueueAlreadyExists"


def test_get_queue_attributes_all_and_selected(sqs, make_queue):
    url = make_queue(DelaySeconds="2", MaximumMessageSize="2048", MessageRetentionPeriod="600",
                     ReceiveMessageWaitTimeSeconds="3", VisibilityTimeout="7")
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert {k: attrs[k] for k in ("DelaySeconds", "MaximumMessageSize", "MessageRetentionPeriod",
                                  "ReceiveMessageWaitTimeSeconds", "VisibilityTimeout")} == {
        "DelaySeconds": "2", "MaximumMessageSize": "2048", "MessageRetentionPeriod": "600",
        "ReceiveMessageWaitTimeSeconds": "3", "VisibilityTimeout": "7"}
    assert attrs["QueueArn"] == f"arn:aws:sqs:us-east-1:000000000000:{_name(url)}"
    for key in ("ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
                "ApproximateNumberOfMessagesDelayed"):
        assert attrs[key] == "0"
    assert abs(int(attrs["CreatedTimestamp"]) - time.time()) < 60
    assert "FifoQueue" not in attrs and attrs["SqsManagedSseEnabled"] == "true"
    one = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])["Attributes"]
    assert one == {"VisibilityTimeout": "7"}


def test_counts(sqs, make_queue):
    url = make_queue()
    for body in ("a", "b", "c"):
        sqs.send_message(QueueUrl=url, MessageBody=body)
    sqs.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=60)
    sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1)
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages",
                                                                    "ApproximateNumberOfMessagesNotVisible",
                                                                    "ApproximateNumberOfMessagesDelayed"])
    assert attrs["Attributes"] == {"ApproximateNumberOfMessages": "2", "ApproximateNumberOfMessagesNotVisible": "1",
                                   "ApproximateNumberOfMessagesDelayed": "1"}


def test_set_queue_attributes_and_last_modified(sqs, make_queue):
    url = make_queue()
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "99", "Policy": json.dumps(
        {"Version": "2012-10-17", "Statement": []}), "KmsMasterKeyId": "alias/aws/sqs"})
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["VisibilityTimeout"] == "99" and attrs["KmsMasterKeyId"] == "alias/aws/sqs"
    assert json.loads(attrs["Policy"])["Version"] == "2012-10-17"
    assert attrs["SqsManagedSseEnabled"] == "false"


@pytest.mark.parametrize("attributes, code", [
    ({"VisibilityTimeout": "43201"}, "InvalidAttributeValue"),
    ({"VisibilityTimeout": "soon"}, "InvalidAttributeValue"),
    ({"DelaySeconds": "901"}, "InvalidAttributeValue"),
    ({"MaximumMessageSize": "1023"}, "InvalidAttributeValue"),
    ({"MessageRetentionPeriod": "59"}, "InvalidAttributeValue"),
    ({"ReceiveMessageWaitTimeSeconds": "21"}, "InvalidAttributeValue"),
    ({"Colour": "red"}, "InvalidAttributeName"),
    ({"ContentBasedDeduplication": "true"}, "InvalidAttributeName"),  # FIFO only
    ({"QueueArn": "arn:aws:sqs:us-east-1:000000000000:x"}, "InvalidAttributeName"),
    ({"Policy": "not json"}, "InvalidParameterValue"),
    ({"RedrivePolicy": "{}"}, "InvalidParameterValue"),
    ({"DeduplicationScope": "queue"}, "InvalidAttributeName"),
])
def test_invalid_attributes(sqs, make_queue, attributes, code):
    url = make_queue()
    with pytest.raises(botocore.exceptions.ClientError) as err:
        sqs.set_queue_attributes(QueueUrl=url, Attributes=attributes)
    assert error_code(err.value) == code
    with pytest.raises(botocore.exceptions.ClientError) as err:
        sqs.create_queue(QueueName=_name(url) + "-new", Attributes=attributes)
    assert error_code(err.value) == code


def test_unknown_attribute_name_in_get(sqs, make_queue):
    with pytest.raises(botocore.exceptions.ClientError) as err:
        sqs.get_queue_attributes(QueueUrl=make_queue(), AttributeNames=["Nope"])
    assert error_code(err.value) == "InvalidAttributeName"
    assert "Unknown Attribute Nope." in err.value.response["Error"]["Message"]


@pytest.mark.parametrize("name", ["has space", "x" * 81, "dot.name", "fifo-without-attribute.fifo"])
def test_invalid_queue_names(sqs, name):
    with pytest.raises(botocore.exceptions.ClientError) as err:
        sqs.create_queue(QueueName=name)
    assert error_code(err.value) == "InvalidParameterValue"


def test_list_queues_prefix_and_pagination(sqs, make_queue):
    prefix = make_queue().rsplit("/", 1)[1][:12]
    urls = sorted([make_queue(f"-{i}") for i in range(3)])
    urls = [u for u in urls if _name(u).startswith(prefix)] or urls
    all_mine = sqs.list_queues(QueueNamePrefix="q-")["QueueUrls"]
    assert set(urls) <= set(all_mine)
    page = sqs.list_queues(QueueNamePrefix="q-", MaxResults=1)
    assert len(page["QueueUrls"]) == 1 and page["NextToken"]
    seen = list(page["QueueUrls"])
    while "NextToken" in page:
        page = sqs.list_queues(QueueNamePrefix="q-", MaxResults=2, NextToken=page["NextToken"])
        seen += page["QueueUrls"]
    assert seen == sorted(all_mine)
    assert sqs.list_queues(QueueNamePrefix="no-such-prefix").get("QueueUrls", []) == []


def test_delete_and_missing_queue_everywhere(sqs, make_queue, protocol):
    url = make_queue()
    sqs.delete_queue(QueueUrl=url)
    for call in (lambda: sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"]),
                 lambda: sqs.send_message(QueueUrl=url, MessageBody="x"),
                 lambda: sqs.receive_message(QueueUrl=url),
                 lambda: sqs.delete_queue(QueueUrl=url),
                 lambda: sqs.purge_queue(QueueUrl=url),
                 lambda: sqs.get_queue_url(QueueName=_name(url))):
        with pytest.raises(sqs.exceptions.QueueDoesNotExist) as err:
            call()
        assert err.value.response["Error"]["Code"] == "AWS.SimpleQueueService.NonExistentQueue"
        assert err.value.response["Error"]["Message"] == {
            "json": "The specified queue does not exist.",
            "query": "The specified queue does not exist for this wsdl version."}[protocol]


def test_purge_and_purge_in_progress(sqs, make_queue):
    url = make_queue()
    sqs.send_message(QueueUrl=url, MessageBody="x")
    sqs.purge_queue(QueueUrl=url)
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    with pytest.raises(sqs.exceptions.PurgeQueueInProgress) as err:
        sqs.purge_queue(QueueUrl=url)
    assert "60 seconds" in err.value.response["Error"]["Message"]


def test_tags(sqs, make_queue, server, protocol):
    url = make_queue()
    sqs.tag_queue(QueueUrl=url, Tags={"team": "a", "env": "dev"})
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "a", "env": "dev"}
    sqs.untag_queue(QueueUrl=url, TagKeys=["env"])
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "a"}
    sqs.untag_queue(QueueUrl=url, TagKeys=["team"])
    assert "Tags" not in sqs.list_queue_tags(QueueUrl=url)
    tagged = sqs.create_queue(QueueName=_name(url) + "-t", tags={"k": "v"})["QueueUrl"]
    assert sqs.list_queue_tags(QueueUrl=tagged)["Tags"] == {"k": "v"}


def test_permissions(sqs, make_queue):
    url = make_queue()
    sqs.add_permission(QueueUrl=url, Label="send", AWSAccountIds=["111122223333"], Actions=["SendMessage"])
    policy = json.loads(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"])["Attributes"]["Policy"])
    [statement] = policy["Statement"]
    assert statement["Sid"] == "send" and statement["Action"] == "SQS:SendMessage"
    assert statement["Principal"] == {"AWS": "arn:aws:iam::111122223333:root"}
    with pytest.raises(botocore.exceptions.ClientError) as err:
        sqs.add_permission(QueueUrl=url, Label="send", AWSAccountIds=["111122223333"], Actions=["SendMessage"])
    assert error_code(err.value) == "InvalidParameterValue"
    sqs.remove_permission(QueueUrl=url, Label="send")
    assert "Policy" not in sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    with pytest.raises(botocore.exceptions.ClientError) as err:
        sqs.remove_permission(QueueUrl=url, Label="send")
    assert error_code(err.value) == "InvalidParameterValue"


def test_regions_scope_queues(server, protocol):
    east, west = client(server.url, protocol, region="us-east-1"), client(server.url, protocol, region="eu-west-1")
    name = f"regional-{protocol}"
    east_url = east.create_queue(QueueName=name)["QueueUrl"]
    west_url = west.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "5"})["QueueUrl"]
    assert east_url == f"{server.url}/000000000000/{name}"  # the default region keeps the short form
    assert west_url == f"{server.url}/queue/eu-west-1/000000000000/{name}"  # two queues, two URLs
    east.send_message(QueueUrl=east_url, MessageBody="east")
    assert "Messages" not in west.receive_message(QueueUrl=west_url)
    arn = west.get_queue_attributes(QueueUrl=west_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    assert arn == f"arn:aws:sqs:eu-west-1:000000000000:{name}"
    assert west.get_queue_attributes(QueueUrl=west_url, AttributeNames=["VisibilityTimeout"])["Attributes"] == {
        "VisibilityTimeout": "5"}
    west_names = [_name(u) for u in west.list_queues()["QueueUrls"]]
    assert name in west_names and not any(n.startswith("q-") for n in west_names)  # us-east-1's stay there


def test_queue_url_resolved_by_path_whatever_the_host(sqs, make_queue):
    url = make_queue()
    foreign = "https://sqs.us-east-1.amazonaws.com/000000000000/" + _name(url)
    sqs.send_message(QueueUrl=foreign, MessageBody="via a foreign host")
    assert sqs.receive_message(QueueUrl=url)["Messages"][0]["Body"] == "via a foreign host"
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.send_message(QueueUrl=f"http://x/123456789012/{_name(url)}", MessageBody="other account")
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.send_message(QueueUrl=f"http://[::1/000000000000/{_name(url)}", MessageBody="a malformed host")
