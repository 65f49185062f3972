"""The SNS API (2010-03-31) as shapes: the input and output of every action Conveyor
serves, with the wire names of the Query protocol. Member names are the JSON protocol's.

SNS's Query protocol wraps its maps and lists (unlike SQS's flattened ones): a map is
``Attributes.entry.1.key`` / ``Attributes.entry.1.value`` (message attributes name theirs
``Name`` and ``Value``), a list ``Tags.member.1.Key``; responses nest the same way
(``<Attributes><entry><key/><value/></entry></Attributes>``, ``<Topics><member>``).
"""

from __future__ import annotations

from conveyor.protocols.aws.shapes import BLOB, BOOLEAN, STRING, ListOf, MapOf, Struct

NAMESPACE = "http://sns.amazonaws.com/doc/2010-03-31/"

ATTRIBUTES = MapOf(STRING)  # entry.N.key / entry.N.value
TAG = Struct({"Key": STRING, "Value": STRING})
TAGS = ListOf(TAG)
MESSAGE_ATTRIBUTE_VALUE = Struct({"DataType": STRING, "StringValue": STRING, "BinaryValue": BLOB})
MESSAGE_ATTRIBUTES = MapOf(MESSAGE_ATTRIBUTE_VALUE, key_name="Name", value_name="Value")

SUBSCRIPTION = Struct({
    "SubscriptionArn": STRING,
    "Owner": STRING,
    "Protocol": STRING,
    "Endpoint": STRING,
    "TopicArn": STRING,
})
SUBSCRIPTIONS = Struct({"Subscriptions": ListOf(SUBSCRIPTION), "NextToken": STRING})

PUBLISH_FIELDS = {
    "Message": STRING,
    "Subject": STRING,
    "MessageStructure": STRING,
    "MessageAttributes": MESSAGE_ATTRIBUTES,
    "MessageDeduplicationId": STRING,
    "MessageGroupId": STRING,
}

INPUT: dict[str, Struct] = {
    "CreateTopic": Struct({"Name": STRING, "Attributes": ATTRIBUTES, "Tags": TAGS,
                           "DataProtectionPolicy": STRING}),
    "DeleteTopic": Struct({"TopicArn": STRING}),
    "ListTopics": Struct({"NextToken": STRING}),
    "GetTopicAttributes": Struct({"TopicArn": STRING}),
    "SetTopicAttributes": Struct({"TopicArn": STRING, "AttributeName": STRING, "AttributeValue": STRING}),
    "Subscribe": Struct({"TopicArn": STRING, "Protocol": STRING, "Endpoint": STRING, "Attributes": ATTRIBUTES,
                         "ReturnSubscriptionArn": BOOLEAN}),
    "Unsubscribe": Struct({"SubscriptionArn": STRING}),
    "ConfirmSubscription": Struct({"TopicArn": STRING, "Token": STRING, "AuthenticateOnUnsubscribe": STRING}),
    "ListSubscriptions": Struct({"NextToken": STRING}),
    "ListSubscriptionsByTopic": Struct({"TopicArn": STRING, "NextToken": STRING}),
    "GetSubscriptionAttributes": Struct({"SubscriptionArn": STRING}),
    "SetSubscriptionAttributes": Struct({"SubscriptionArn": STRING, "AttributeName": STRING,
                                         "AttributeValue": STRING}),
    "Publish": Struct({"TopicArn": STRING, "TargetArn": STRING, "PhoneNumber": STRING, **PUBLISH_FIELDS}),
    "PublishBatch": Struct({"TopicArn": STRING, "PublishBatchRequestEntries": ListOf(
        Struct({"Id": STRING, **PUBLISH_FIELDS}))}),
    "AddPermission": Struct({"TopicArn": STRING, "Label": STRING, "AWSAccountId": ListOf(STRING),
                             "ActionName": ListOf(STRING)}),
    "RemovePermission": Struct({"TopicArn": STRING, "Label": STRING}),
    "TagResource": Struct({"ResourceArn": STRING, "Tags": TAGS}),
    "UntagResource": Struct({"ResourceArn": STRING, "TagKeys": ListOf(STRING)}),
    "ListTagsForResource": Struct({"ResourceArn": STRING}),
}

OUTPUT: dict[str, Struct] = {
    "CreateTopic": Struct({"TopicArn": STRING}),
    "ListTopics": Struct({"Topics": ListOf(Struct({"TopicArn": STRING})), "NextToken": STRING}),
    "GetTopicAttributes": Struct({"Attributes": ATTRIBUTES}),
    "Subscribe": Struct({"SubscriptionArn": STRING}),
    "ConfirmSubscription": Struct({"SubscriptionArn": STRING}),
    "ListSubscriptions": SUBSCRIPTIONS,
    "ListSubscriptionsByTopic": SUBSCRIPTIONS,
    "GetSubscriptionAttributes": Struct({"Attributes": ATTRIBUTES}),
    "Publish": Struct({"MessageId": STRING, "SequenceNumber": STRING}),
    "PublishBatch": Struct({
        "Successful": ListOf(Struct({"Id": STRING, "MessageId": STRING, "SequenceNumber": STRING})),
        "Failed": ListOf(Struct({"Id": STRING, "Code": STRING, "Message": STRING, "SenderFault": BOOLEAN})),
    }),
    "TagResource": Struct({}),
    "UntagResource": Struct({}),
    "ListTagsForResource": Struct({"Tags": TAGS}),
}

ACTIONS = frozenset(INPUT)
