"""The SQS API (2012-11-05) as shapes: every action's input and output, with the wire
names the Query protocol uses (``Attribute.1.Name``, ``SendMessageBatchRequestEntry.1.Id``,
``<Message>`` ...). Member names are the JSON protocol's."""

from __future__ import annotations

from conveyor.protocols.aws.shapes import (
    BLOB,
    BOOLEAN,
    INTEGER,
    LONG,
    STRING,
    ListOf,
    MapOf,
    Member,
    Shape,
    Struct,
)

NAMESPACE = "http://queue.amazonaws.com/doc/2012-11-05/"

# name -> value maps, flattened: Attribute.1.Name / Attribute.1.Value
ATTRIBUTE_MAP = MapOf(STRING, key_name="Name", value_name="Value", flattened=True)
TAG_MAP = MapOf(STRING, key_name="Key", value_name="Value", flattened=True)

MESSAGE_ATTRIBUTE_VALUE = Struct({
    "StringValue": STRING,
    "BinaryValue": BLOB,
    "StringListValues": ListOf(STRING, member_name="StringListValue", flattened=True),
    "BinaryListValues": ListOf(BLOB, member_name="BinaryListValue", flattened=True),
    "DataType": STRING,
})
MESSAGE_ATTRIBUTE_MAP = MapOf(MESSAGE_ATTRIBUTE_VALUE, key_name="Name", value_name="Value", flattened=True)


def _names(member_name: str) -> ListOf:
    return ListOf(STRING, member_name=member_name, flattened=True)


def _entries(member_name: str, entry: Struct) -> ListOf:
    return ListOf(entry, member_name=member_name, flattened=True)


SEND_ENTRY_FIELDS: dict[str, Member | Shape] = {
    "MessageBody": STRING,
    "DelaySeconds": INTEGER,
    "MessageAttributes": Member(MESSAGE_ATTRIBUTE_MAP, "MessageAttribute"),
    "MessageSystemAttributes": Member(MESSAGE_ATTRIBUTE_MAP, "MessageSystemAttribute"),
    "MessageDeduplicationId": STRING,
    "MessageGroupId": STRING,
}

BATCH_ERROR = Struct({"Id": STRING, "SenderFault": BOOLEAN, "Code": STRING, "Message": STRING})
BATCH_FAILED = _entries("BatchResultErrorEntry", BATCH_ERROR)

MESSAGE = Struct({
    "MessageId": STRING,
    "ReceiptHandle": STRING,
    "MD5OfBody": STRING,
    "Body": STRING,
    "Attributes": Member(ATTRIBUTE_MAP, "Attribute"),
    "MD5OfMessageAttributes": STRING,
    "MessageAttributes": Member(MESSAGE_ATTRIBUTE_MAP, "MessageAttribute"),
})

MOVE_TASK = Struct({
    "TaskHandle": STRING,
    "Status": STRING,
    "SourceArn": STRING,
    "DestinationArn": STRING,
    "MaxNumberOfMessagesPerSecond": INTEGER,
    "ApproximateNumberOfMessagesMoved": LONG,
    "ApproximateNumberOfMessagesToMove": LONG,
    "FailureReason": STRING,
    "StartedTimestamp": LONG,
})

QUEUE_URL: dict[str, Member | Shape] = {"QueueUrl": STRING}

INPUT: dict[str, Struct] = {
    "CreateQueue": Struct({"QueueName": STRING, "Attributes": Member(ATTRIBUTE_MAP, "Attribute"),
                           "tags": Member(TAG_MAP, "Tag")}),
    "DeleteQueue": Struct(QUEUE_URL),
    "GetQueueUrl": Struct({"QueueName": STRING, "QueueOwnerAWSAccountId": STRING}),
    "GetQueueAttributes": Struct({**QUEUE_URL, "AttributeNames": _names("AttributeName")}),
    "SetQueueAttributes": Struct({**QUEUE_URL, "Attributes": Member(ATTRIBUTE_MAP, "Attribute")}),
    "ListQueues": Struct({"QueueNamePrefix": STRING, "NextToken": STRING, "MaxResults": INTEGER}),
    "PurgeQueue": Struct(QUEUE_URL),
    "SendMessage": Struct({**QUEUE_URL, **SEND_ENTRY_FIELDS}),
    "SendMessageBatch": Struct({**QUEUE_URL, "Entries": _entries(
        "SendMessageBatchRequestEntry", Struct({"Id": STRING, **SEND_ENTRY_FIELDS}))}),
    "ReceiveMessage": Struct({
        **QUEUE_URL,
        "AttributeNames": _names("AttributeName"),
        "MessageSystemAttributeNames": _names("MessageSystemAttributeName"),
        "MessageAttributeNames": _names("MessageAttributeName"),
        "MaxNumberOfMessages": INTEGER,
        "VisibilityTimeout": INTEGER,
        "WaitTimeSeconds": INTEGER,
        "ReceiveRequestAttemptId": STRING,
    }),
    "DeleteMessage": Struct({**QUEUE_URL, "ReceiptHandle": STRING}),
    "DeleteMessageBatch": Struct({**QUEUE_URL, "Entries": _entries(
        "DeleteMessageBatchRequestEntry", Struct({"Id": STRING, "ReceiptHandle": STRING}))}),
    "ChangeMessageVisibility": Struct({**QUEUE_URL, "ReceiptHandle": STRING, "VisibilityTimeout": INTEGER}),
    "ChangeMessageVisibilityBatch": Struct({**QUEUE_URL, "Entries": _entries(
        "ChangeMessageVisibilityBatchRequestEntry",
        Struct({"Id": STRING, "ReceiptHandle": STRING, "VisibilityTimeout": INTEGER}))}),
    "TagQueue": Struct({**QUEUE_URL, "Tags": Member(TAG_MAP, "Tag")}),
    "UntagQueue": Struct({**QUEUE_URL, "TagKeys": _names("TagKey")}),
    "ListQueueTags": Struct(QUEUE_URL),
    "ListDeadLetterSourceQueues": Struct({**QUEUE_URL, "NextToken": STRING, "MaxResults": INTEGER}),
    "StartMessageMoveTask": Struct({"SourceArn": STRING, "DestinationArn": STRING,
                                    "MaxNumberOfMessagesPerSecond": INTEGER}),
    "CancelMessageMoveTask": Struct({"TaskHandle": STRING}),
    "ListMessageMoveTasks": Struct({"SourceArn": STRING, "MaxResults": INTEGER}),
    "AddPermission": Struct({**QUEUE_URL, "Label": STRING, "AWSAccountIds": _names("AWSAccountId"),
                             "Actions": _names("ActionName")}),
    "RemovePermission": Struct({**QUEUE_URL, "Label": STRING}),
}

OUTPUT: dict[str, Struct] = {
    "CreateQueue": Struct(QUEUE_URL),
    "GetQueueUrl": Struct(QUEUE_URL),
    "GetQueueAttributes": Struct({"Attributes": Member(ATTRIBUTE_MAP, "Attribute")}),
    "ListQueues": Struct({"QueueUrls": _names("QueueUrl"), "NextToken": STRING}),
    "SendMessage": Struct({"MD5OfMessageBody": STRING, "MD5OfMessageAttributes": STRING,
                           "MD5OfMessageSystemAttributes": STRING, "MessageId": STRING,
                           "SequenceNumber": STRING}),
    "SendMessageBatch": Struct({
        "Successful": _entries("SendMessageBatchResultEntry", Struct({
            "Id": STRING, "MessageId": STRING, "MD5OfMessageBody": STRING, "MD5OfMessageAttributes": STRING,
            "MD5OfMessageSystemAttributes": STRING, "SequenceNumber": STRING})),
        "Failed": BATCH_FAILED,
    }),
    "ReceiveMessage": Struct({"Messages": _entries("Message", MESSAGE)}),
    "DeleteMessageBatch": Struct({
        "Successful": _entries("DeleteMessageBatchResultEntry", Struct({"Id": STRING})),
        "Failed": BATCH_FAILED,
    }),
    "ChangeMessageVisibilityBatch": Struct({
        "Successful": _entries("ChangeMessageVisibilityBatchResultEntry", Struct({"Id": STRING})),
        "Failed": BATCH_FAILED,
    }),
    "ListQueueTags": Struct({"Tags": Member(TAG_MAP, "Tag")}),
    "ListDeadLetterSourceQueues": Struct({"queueUrls": _names("QueueUrl"), "NextToken": STRING}),
    "StartMessageMoveTask": Struct({"TaskHandle": STRING}),
    "CancelMessageMoveTask": Struct({"ApproximateNumberOfMessagesMoved": LONG}),
    "ListMessageMoveTasks": Struct({"Results": _entries("ListMessageMoveTasksResultEntry", MOVE_TASK)}),
}

ACTIONS = frozenset(INPUT)
