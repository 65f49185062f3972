"""boto3 SQS clients for both wire protocols.

Today's botocore speaks SQS's JSON protocol. For the Query protocol (form fields in,
XML out), which older SDKs still use, this module derives a query-protocol service model
from botocore's own: the protocol switched, each operation's output wrapped in
``<Operation>Result``, and the Query serialisation names (``Attribute.1.Name``,
``SendMessageBatchRequestEntry.1.Id``, ``<Message>`` ...) restored from the SQS API's
query-protocol model, as botocore shipped it before SQS moved to JSON (botocore 1.31).
boto3 then serialises forms and parses XML with its own, independent code.
"""

from __future__ import annotations

import copy
import functools
import json
import tempfile
from pathlib import Path

import boto3
import botocore.config
import botocore.session

# list shape -> name of each member on the wire (all flattened unless listed otherwise)
_LIST_MEMBERS = {
    "AWSAccountIdList": "AWSAccountId",
    "ActionNameList": "ActionName",
    "AttributeNameList": "AttributeName",
    "BatchResultErrorEntryList": "BatchResultErrorEntry",
    "ChangeMessageVisibilityBatchRequestEntryList": "ChangeMessageVisibilityBatchRequestEntry",
    "ChangeMessageVisibilityBatchResultEntryList": "ChangeMessageVisibilityBatchResultEntry",
    "DeleteMessageBatchRequestEntryList": "DeleteMessageBatchRequestEntry",
    "DeleteMessageBatchResultEntryList": "DeleteMessageBatchResultEntry",
    "ListMessageMoveTasksResultEntryList": "ListMessageMoveTasksResultEntry",
    "MessageAttributeNameList": "MessageAttributeName",
    "MessageSystemAttributeList": "MessageSystemAttributeName",
    "MessageList": "Message",
    "QueueUrlList": "QueueUrl",
    "SendMessageBatchRequestEntryList": "SendMessageBatchRequestEntry",
    "SendMessageBatchResultEntryList": "SendMessageBatchResultEntry",
    "TagKeyList": "TagKey",
    "StringList": "StringListValue",
    "BinaryList": "BinaryListValue",
}
_NOT_FLATTENED = {"StringList", "BinaryList"}
# map shape -> (key name, value name, shape-level name)
_MAPS = {
    "MessageBodyAttributeMap": ("Name", "Value", None),
    "MessageBodySystemAttributeMap": ("Name", "Value", None),
    "MessageSystemAttributeMap": ("Name", "Value", "Attribute"),
    "QueueAttributeMap": ("Name", "Value", "Attribute"),
    "TagMap": ("Key", "Value", "Tag"),
}
# structure -> member -> wire name (and whether that member is flattened)
_MEMBERS = {
    "CreateQueueRequest": {"Attributes": "Attribute", "tags": "Tag"},
    "GetQueueAttributesResult": {"Attributes": "Attribute"},
    "ListQueueTagsResult": {"Tags": "Tag"},
    "Message": {"Attributes": "Attribute", "MessageAttributes": "MessageAttribute"},
    "MessageAttributeValue": {"StringListValues": "StringListValue", "BinaryListValues": "BinaryListValue"},
    "MessageSystemAttributeValue": {"StringListValues": "StringListValue", "BinaryListValues": "BinaryListValue"},
    "SendMessageBatchRequestEntry": {"MessageAttributes": "MessageAttribute",
                                     "MessageSystemAttributes": "MessageSystemAttribute"},
    "SendMessageRequest": {"MessageAttributes": "MessageAttribute",
                           "MessageSystemAttributes": "MessageSystemAttribute"},
    "SetQueueAttributesRequest": {"Attributes": "Attribute"},
}
# Query error codes of the modelled exceptions (so client.exceptions.* match XML errors)
_QUERY_CODES = {
    "QueueDoesNotExist": ("AWS.SimpleQueueService.NonExistentQueue", 400),
    "QueueNameExists": ("QueueAlreadyExists", 400),
    "MessageNotInflight": ("AWS.SimpleQueueService.MessageNotInflight", 400),
    "PurgeQueueInProgress": ("AWS.SimpleQueueService.PurgeQueueInProgress", 403),
    "TooManyEntriesInBatchRequest": ("AWS.SimpleQueueService.TooManyEntriesInBatchRequest", 400),
    "EmptyBatchRequest": ("AWS.SimpleQueueService.EmptyBatchRequest", 400),
    "BatchEntryIdsNotDistinct": ("AWS.SimpleQueueService.BatchEntryIdsNotDistinct", 400),
    "InvalidBatchEntryId": ("AWS.SimpleQueueService.InvalidBatchEntryId", 400),
    "BatchRequestTooLong": ("AWS.SimpleQueueService.BatchRequestTooLong", 400),
    "UnsupportedOperation": ("AWS.SimpleQueueService.UnsupportedOperation", 400),
    "OverLimit": ("OverLimit", 403),
    "ResourceNotFoundException": ("ResourceNotFoundException", 404),
}


def _query_model(json_model: dict) -> dict:
    model = copy.deepcopy(json_model)
    model["metadata"]["protocol"] = "query"
    model["metadata"]["protocols"] = ["query"]
    model["metadata"].pop("awsQueryCompatible", None)
    model["metadata"].pop("jsonVersion", None)
    model["metadata"].pop("targetPrefix", None)
    model["metadata"]["xmlNamespace"] = "http://queue.amazonaws.com/doc/2012-11-05/"
    shapes = model["shapes"]
    for name, op in model["operations"].items():
        if "output" in op:
            op["output"]["resultWrapper"] = f"{name}Result"
    for name, member in _LIST_MEMBERS.items():
        if name in shapes:
            shapes[name]["member"]["locationName"] = member
            if name not in _NOT_FLATTENED:
                shapes[name]["flattened"] = True
    for name, (key, value, location) in _MAPS.items():
        if name in shapes:
            shapes[name]["key"]["locationName"] = key
            shapes[name]["value"]["locationName"] = value
            shapes[name]["flattened"] = True
            if location:
                shapes[name]["locationName"] = location
    for name, members in _MEMBERS.items():
        for member, wire in members.items():
            if name in shapes and member in shapes[name]["members"]:
                shapes[name]["members"][member]["locationName"] = wire
                if member in ("StringListValues", "BinaryListValues"):
                    shapes[name]["members"][member]["flattened"] = True
    if "ListMessageMoveTasksResult" in shapes:
        shapes["ListMessageMoveTasksResult"]["members"]["Results"]["flattened"] = True
    for name, (code, status) in _QUERY_CODES.items():
        if name in shapes:
            shapes[name]["error"] = {"code": code, "httpStatusCode": status, "senderFault": True}
    return model


@functools.cache
def _query_data_path() -> str:
    loader = botocore.session.get_session().get_component("data_loader")
    json_model = loader.load_service_model("sqs", "service-2")
    root = Path(tempfile.mkdtemp(prefix="conveyor-sqs-query-model-"))
    target = root / "sqs" / "2012-11-05"
    target.mkdir(parents=True)
    (target / "service-2.json").write_text(json.dumps(_query_model(json_model)))
    return str(root)


def client(endpoint_url: str, protocol: str = "json", region: str = "us-east-1",
           access_key: str = "AKIDCONVEYORTEST", secret_key: str = "secret", **config: object):
    """A boto3 SQS client speaking ``protocol`` ("json" or "query")."""
    session = botocore.session.get_session()
    if protocol == "query":
        session.get_component("data_loader").search_paths.insert(0, _query_data_path())
    elif protocol != "json":
        raise ValueError(protocol)
    return boto3.Session(botocore_session=session).client(
        "sqs", endpoint_url=endpoint_url, region_name=region, aws_access_key_id=access_key,
        aws_secret_access_key=secret_key, config=botocore.config.Config(retries={"max_attempts": 0}, **config))


def error_code(exc: Exception) -> str:
    return exc.response["Error"]["Code"]  # type: ignore[attr-defined]
