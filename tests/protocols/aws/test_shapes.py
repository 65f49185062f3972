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
    ({"Entries": [None]}, "Entries.1", "must not be null"),
    ({"Entries": [{"MessageAttributes": {"color": None}}]}, "Entries.1.MessageAttributes.color", "must not be null"),
])
def test_an_error_names_the_path_of_the_value(value, path, reason):
    with pytest.raises(ShapeError) as caught:
        shapes.from_json(BATCH, value)
    assert (caught.value.path, caught.value.reason) == (path, reason)


def test_a_path_prefix_is_kept():
    with pytest.raises(ShapeError) as caught:
        shapes.from_json(ENTRY, {"DelaySeconds": 1.5}, "Entries.3")
    assert caught.value.path == "Entries.3.DelaySeconds"


def test_xml_text_escapes_and_replaces_what_xml_cannot_carry():
    assert shapes.xml_text("a<b>&\r\n\t") == "a&lt;b&gt;&amp;&#xD;\n\t"
    assert shapes.xml_text("\x00x\x08\x1f\ufffe\ud800é😀") == "\ufffdx\ufffd\ufffd\ufffd\ufffdé😀"


QUERY_BATCH = Struct({"Entries": ListOf(Struct({"Id": STRING, "DelaySeconds": INTEGER}), "member"),
                      "Names": ListOf(STRING), "Tags": MapOf(STRING)})


def test_query_forms_read_lists_and_maps():
    form = {"Entries.member.1.Id": "a", "Entries.member.1.DelaySeconds": "5", "Entries.member.2.Id": "b",
            "Names.member.1": "x", "Tags.entry.1.key": "k", "Tags.entry.1.value": "v"}
    assert shapes.from_query(QUERY_BATCH, form) == {
        "Entries": [{"Id": "a", "DelaySeconds": 5}, {"Id": "b"}], "Names": ["x"], "Tags": {"k": "v"}}
    assert shapes.from_query(QUERY_BATCH, {"Names": ""}) == {"Names": []}


@pytest.mark.parametrize(("form", "path", "reason"), [
    ({"Entries.member.1.Id": "a", "Entries.member.2": "b"}, "Entries.member.2", "must be a structure"),
    ({"Names.member.1.x": "y"}, "Names.member.1", "missing"),
    ({"Tags.entry.1.key": "k"}, "Tags.entry.1.value", "missing"),
    ({"Tags.entry.1.value": "v"}, "Tags.entry.1.key", "missing"),
    ({"Entries.member.1.DelaySeconds": "soon"}, "Entries.member.1.DelaySeconds", "'soon' is not an integer"),
])
def test_query_form_errors_name_the_field(form, path, reason):
    with pytest.raises(ShapeError) as caught:
        shapes.from_query(QUERY_BATCH, form)
    assert (caught.value.path, caught.value.reason) == (path, reason)
