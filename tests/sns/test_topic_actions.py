"""SNS topic actions and tags through boto3, in both wire protocols: CreateTopic,
DeleteTopic, ListTopics (paging), GetTopicAttributes, SetTopicAttributes, TagResource,
UntagResource, ListTagsForResource — and SNS's errors for each."""

from __future__ import annotations

import json

import botocore.exceptions
import pytest

from support.sns_clients import ACCOUNT, REGION, error_code, sns_client, status_code, unique

pytestmark = pytest.mark.slow


def _fails(call, code: str, status: int = 400, message: str | None = None) -> None:
    with pytest.raises(botocore.exceptions.ClientError) as info:
        call()
    assert error_code(info.value) == code, info.value.response
    assert status_code(info.value) == status
    if message is not None:
        assert info.value.response["Error"]["Message"] == message


def test_create_is_idempotent_and_lists_without_subscriptions(sns):
    name = unique()
    arn = sns.create_topic(Name=name)["TopicArn"]
    assert arn == f"arn:aws:sns:{REGION}:{ACCOUNT}:{name}"
    assert sns.create_topic(Name=name)["TopicArn"] == arn
    listed = [t["TopicArn"] for t in sns.list_topics()["Topics"]]
    assert arn in listed  # a topic with no subscriptions is a real object


def test_create_checks_name_attributes_and_fifo(sns):
    _fails(lambda: sns.create_topic(Name="bad name"), "InvalidParameter", message="Invalid parameter: Topic Name")
    _fails(lambda: sns.create_topic(Name="x" * 257), "InvalidParameter")
    _fails(lambda: sns.create_topic(Name=unique() + ".fifo"), "InvalidParameter",
           message="Invalid parameter: Topic Name")
    _fails(lambda: sns.create_topic(Name=unique(), Attributes={"FifoTopic": "true"}), "InvalidParameter",
           message="Invalid parameter: Topic Name")
    _fails(lambda: sns.create_topic(Name=unique(), Attributes={"Colour": "blue"}), "InvalidParameter",
           message="Invalid parameter: AttributeName")
    _fails(lambda: sns.create_topic(Name=unique(), Attributes={"ContentBasedDeduplication": "true"}),
           "InvalidParameter")
    _fails(lambda: sns.create_topic(Name=unique(), Attributes={"Policy": "{not json"}), "InvalidParameter")
    name = unique()
    sns.create_topic(Name=name, Attributes={"DisplayName": "first"})
    _fails(lambda: sns.create_topic(Name=name, Attributes={"DisplayName": "second"}), "InvalidParameter",
           message="Invalid parameter: Attributes Reason: Topic already exists with different attributes")


def test_fifo_topic_attributes(sns):
    name = unique() + ".fifo"
    arn = sns.create_topic(Name=name, Attributes={"FifoTopic": "true", "ContentBasedDeduplication": "true"})[
        "TopicArn"]
    attrs = sns.get_topic_attributes(TopicArn=arn)["Attributes"]
    assert attrs["FifoTopic"] == "true" and attrs["ContentBasedDeduplication"] == "true"
    sns.set_topic_attributes(TopicArn=arn, AttributeName="ContentBasedDeduplication", AttributeValue="false")
    assert sns.get_topic_attributes(TopicArn=arn)["Attributes"]["ContentBasedDeduplication"] == "false"


def test_boolean_attributes_are_read_in_any_case(sns):
    """SNS reads "True" and "TRUE" as true; the topic then behaves and answers as with "true"."""
    name = unique() + ".fifo"
    arn = sns.create_topic(Name=name, Attributes={"FifoTopic": "True", "ContentBasedDeduplication": "TRUE"})[
        "TopicArn"]
    attrs = sns.get_topic_attributes(TopicArn=arn)["Attributes"]
    assert attrs["FifoTopic"] == "true" and attrs["ContentBasedDeduplication"] == "true"
    # content-based deduplication is in force: no MessageDeduplicationId needed
    assert sns.publish(TopicArn=arn, Message="m", MessageGroupId="g")["SequenceNumber"]
    assert sns.create_topic(Name=name, Attributes={"FifoTopic": "true", "ContentBasedDeduplication": "true"})[
        "TopicArn"] == arn  # the same attributes, as far as SNS is concerned
    sns.set_topic_attributes(TopicArn=arn, AttributeName="ContentBasedDeduplication", AttributeValue="False")
    assert sns.get_topic_attributes(TopicArn=arn)["Attributes"]["ContentBasedDeduplication"] == "false"
    _fails(lambda: sns.publish(TopicArn=arn, Message="m", MessageGroupId="g"), "InvalidParameter")
    _fails(lambda: sns.set_topic_attributes(TopicArn=arn, AttributeName="ContentBasedDeduplication",
                                            AttributeValue="yes"), "InvalidParameter")
    assert sns.create_topic(Name=unique(), Attributes={"FifoTopic": "FALSE"})["TopicArn"]


def test_json_attributes_come_back_as_given(sns):
    policy = '{ "Version":"2012-10-17",\n  "Statement" : [ ] , "Id":"x" }'  # odd spacing and key order
    arn = sns.create_topic(Name=unique(), Attributes={"DeliveryPolicy": '{"http":{ }}'})["TopicArn"]
    sns.set_topic_attributes(TopicArn=arn, AttributeName="Policy", AttributeValue=policy)
    attrs = sns.get_topic_attributes(TopicArn=arn)["Attributes"]
    assert attrs["Policy"] == policy and attrs["DeliveryPolicy"] == '{"http":{ }}'


def test_get_and_set_topic_attributes(sns):
    name = unique()
    arn = sns.create_topic(Name=name, Attributes={"DisplayName": "Orders"})["TopicArn"]
    attrs = sns.get_topic_attributes(TopicArn=arn)["Attributes"]
    assert attrs["TopicArn"] == arn and attrs["Owner"] == ACCOUNT and attrs["DisplayName"] == "Orders"
    assert attrs["SubscriptionsConfirmed"] == attrs["SubscriptionsPending"] == attrs["SubscriptionsDeleted"] == "0"
    policy = json.loads(attrs["Policy"])
    assert policy["Statement"][0]["Resource"] == arn
    delivery = json.loads(attrs["EffectiveDeliveryPolicy"])
    assert delivery["http"]["defaultHealthyRetryPolicy"]["numRetries"] == 3  # SNS's default
    assert "FifoTopic" not in attrs

    sns.set_topic_attributes(TopicArn=arn, AttributeName="DisplayName", AttributeValue="Renamed")
    policy_doc = json.dumps({"Version": "2012-10-17", "Statement": []})
    sns.set_topic_attributes(TopicArn=arn, AttributeName="Policy", AttributeValue=policy_doc)
    sns.set_topic_attributes(TopicArn=arn, AttributeName="DeliveryPolicy", AttributeValue='{"http": {}}')
    attrs = sns.get_topic_attributes(TopicArn=arn)["Attributes"]
    assert attrs["DisplayName"] == "Renamed" and attrs["Policy"] == policy_doc
    assert attrs["DeliveryPolicy"] == '{"http": {}}'

    _fails(lambda: sns.set_topic_attributes(TopicArn=arn, AttributeName="Nope", AttributeValue="x"),
           "InvalidParameter", message="Invalid parameter: AttributeName")
    _fails(lambda: sns.set_topic_attributes(TopicArn=arn, AttributeName="Policy", AttributeValue="[1]"),
           "InvalidParameter")
    _fails(lambda: sns.set_topic_attributes(TopicArn=arn, AttributeName="ContentBasedDeduplication",
                                            AttributeValue="true"), "InvalidParameter")
    _fails(lambda: sns.set_topic_attributes(TopicArn=arn, AttributeName="SignatureVersion", AttributeValue="3"),
           "InvalidParameter")
    _fails(lambda: sns.set_topic_attributes(TopicArn=arn, AttributeName="DisplayName", AttributeValue="x" * 101),
           "InvalidParameter", message="Invalid parameter: Attributes Reason: DisplayName")


def test_errors_for_missing_malformed_and_foreign_topics(sns):
    missing = f"arn:aws:sns:{REGION}:{ACCOUNT}:{unique()}"
    _fails(lambda: sns.get_topic_attributes(TopicArn=missing), "NotFound", 404, "Topic does not exist")
    _fails(lambda: sns.set_topic_attributes(TopicArn=missing, AttributeName="DisplayName", AttributeValue="x"),
           "NotFound", 404)
    _fails(lambda: sns.get_topic_attributes(TopicArn="not-an-arn"), "InvalidParameter", 400,
           "Invalid parameter: TopicArn Reason: An ARN must have at least 6 elements, not 1")  # AWS's words
    _fails(lambda: sns.get_topic_attributes(TopicArn=f"arn:aws:sqs:{REGION}:{ACCOUNT}:q"), "InvalidParameter")
    _fails(lambda: sns.get_topic_attributes(TopicArn=f"arn:aws:sns:{REGION}:123456789012:t"),
           "AuthorizationError", 403)


def test_delete_topic_removes_it_and_its_subscriptions(sns, make_queue):
    name = unique()
    arn = sns.create_topic(Name=name)["TopicArn"]
    _, queue_arn = make_queue()
    sub = sns.subscribe(TopicArn=arn, Protocol="sqs", Endpoint=queue_arn)["SubscriptionArn"]
    sns.delete_topic(TopicArn=arn)
    sns.delete_topic(TopicArn=arn)  # deleting again succeeds, as on SNS
    assert arn not in [t["TopicArn"] for t in sns.list_topics()["Topics"]]
    _fails(lambda: sns.get_subscription_attributes(SubscriptionArn=sub), "NotFound", 404)
    _fails(lambda: sns.list_subscriptions_by_topic(TopicArn=arn), "NotFound", 404)


def test_list_topics_pages_of_100_and_regions_are_separate(server, protocol):
    region = f"xx-page-{protocol}"  # a region of its own: only this test's topics are in it
    sns = sns_client(server.url, protocol, region=region)
    names = sorted(f"p{i:03d}-{unique()}" for i in range(103))
    for name in names:
        sns.create_topic(Name=name)
    first = sns.list_topics()
    assert len(first["Topics"]) == 100 and first["NextToken"]
    second = sns.list_topics(NextToken=first["NextToken"])
    assert "NextToken" not in second
    arns = [t["TopicArn"] for t in first["Topics"] + second["Topics"]]
    assert arns == [f"arn:aws:sns:{region}:{ACCOUNT}:{n}" for n in names]
    paginated = [t for page in sns.get_paginator("list_topics").paginate() for t in page["Topics"]]
    assert len(paginated) == 103
    # the default region does not see them, and a bad token is SNS's error
    default = sns_client(server.url, protocol)
    assert not set(arns) & {t["TopicArn"] for t in default.list_topics()["Topics"]}
    _fails(lambda: sns.list_topics(NextToken="%%%"), "InvalidParameter")
    # an ARN names its region: a client of another region may not use it (as SNS)
    _fails(lambda: default.get_topic_attributes(TopicArn=arns[0]), "InvalidParameter",
           message="Invalid parameter: TopicArn")


def test_tags(sns, make_topic):
    arn = make_topic()
    sns.tag_resource(ResourceArn=arn, Tags=[{"Key": "team", "Value": "core"}, {"Key": "env", "Value": "test"}])
    sns.untag_resource(ResourceArn=arn, TagKeys=["env"])
    assert sns.list_tags_for_resource(ResourceArn=arn)["Tags"] == [{"Key": "team", "Value": "core"}]
    name = unique()
    created = sns.create_topic(Name=name, Tags=[{"Key": "k", "Value": "v"}])["TopicArn"]
    assert sns.list_tags_for_resource(ResourceArn=created)["Tags"] == [{"Key": "k", "Value": "v"}]

    missing = f"arn:aws:sns:{REGION}:{ACCOUNT}:{unique()}"
    _fails(lambda: sns.list_tags_for_resource(ResourceArn=missing), "ResourceNotFound", 404)
    _fails(lambda: sns.tag_resource(ResourceArn=missing, Tags=[{"Key": "a", "Value": "b"}]), "ResourceNotFound",
           404)
    _fails(lambda: sns.tag_resource(ResourceArn=arn, Tags=[{"Key": "aws:x", "Value": "b"}]), "InvalidParameter")
    _fails(lambda: sns.tag_resource(ResourceArn=arn, Tags=[{"Key": f"k{i}", "Value": "v"} for i in range(50)]),
           "TagLimitExceeded")
