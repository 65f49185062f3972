"""JSON-protocol values against their shapes: conversion, and the path an error names."""

import pytest

from conveyor.protocols.aws import shapes
from conveyor.protocols.aws.shapes import BLOB, INTEGER, STRING, ListOf, MapOf, ShapeError, Struct

ATTRIBUTE = Struct({"DataType": STRING, "StringValue": STRING, "BinaryValue": BLOB})
ENTRY = Struct({"Id": STRING, "MessageBody": STRING, "DelaySeconds": INTEGER,
                "MessageAttributes": MapOf(ATTRIBUTE)})
BATCH = Struct({"QueueUrl": STRING, "Entries": ListOf(ENTRY)})


def test_values_convert_and_unknown_or_null_members_drop():
    got = shapes.from_json(BATCH, {
        "QueueUrl": "q", "Unknown": 1,
        "Entries": [{"Id": "a", "MessageBody": "b", "DelaySeconds": "5", "MessageGroupId": None,
                     "MessageAttributes": {"k": {"DataType": "Binary", "BinaryValue": "AAE="}}}],
    })
    assert got == {"QueueUrl": "q", "Entries": [{
        "Id": "a", "MessageBody": "b", "DelaySeconds": 5,
        "MessageAttributes": {"k": {"DataType": "Binary", "BinaryValue": b"\x00\x01"}}}]}


@pytest.mark.parametrize(("value", "path", "reason"), [
    ([], "body", "must be an object"),
    ({"QueueUrl": 3}, "QueueUrl", "must be a string"),
    ({"Entries": {}}, "Entries", "must be a list"),
    ({"Entries": [{"Id": "a"}, "x"]}, "Entries.2", "must be an object"),
    ({"Entries": [{"Id": "a"}, {"DelaySeconds": True}]}, "Entries.2.DelaySeconds", "must be an integer"),
    ({"Entries": [{"MessageAttributes": []}]}, "Entries.1.MessageAttributes", "must be a map"),
    ({"Entries": [{"MessageAttributes": {"color": {"BinaryValue": "!!"}}}]},
     "Entries.1.MessageAttributes.color.BinaryValue", "is not valid base64"),
])
def test_an_error_names_the_path_of_the_value(value, path, reason):
    with pytest.raises(ShapeError) as caught:
        shapes.from_json(BATCH, value)
    assert (caught.value.path, caught.value.reason) == (path, reason)


def test_a_path_prefix_is_kept():
    with pytest.raises(ShapeError) as caught:
        shapes.from_json(ENTRY, {"DelaySeconds": 1.5}, "Entries.3")
    assert caught.value.path == "Entries.3.DelaySeconds"
