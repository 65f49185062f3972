"""SNS Publish and PublishBatch: check a message as SNS does, then hand it to the topics
engine, which fans it out to the topic's queues and queues its webhook deliveries in one
transaction (and signs the envelope).

A Publish names its topic by TopicArn or TargetArn (a topic ARN; Conveyor has no mobile
endpoints) — SMS (PhoneNumber) is not offered. ``MessageStructure=json`` gives a message
per protocol: a JSON object with a ``default`` string and optionally ``sqs``, ``http`` and
``https`` ones. FIFO topics need a MessageGroupId and a MessageDeduplicationId unless the
topic has ContentBasedDeduplication, in which case the engine takes the SHA-256 of the
message as the id. Standard topics take a MessageGroupId too, which their SQS
subscriptions keep (SQS fair queues).
"""

from __future__ import annotations

import base64
import re
from typing import Any

from conveyor import errors, json_input, types
from conveyor.protocols.sns import topic_actions
from conveyor.protocols.sns import topic_attributes as attrs
from conveyor.protocols.sns.context import Context
from conveyor.protocols.sns.errors import SnsError, from_conveyor, invalid, invalid_value

MAX_MESSAGE_BYTES = 262144  # message and attributes together
MAX_BATCH = 10
MAX_SUBJECT = 99
_SUBJECT = re.compile(r"^[\x21-\x7e][\x20-\x7e]*$")  # printable ASCII, not starting with a space
_ATTRIBUTE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,256}$")
_TYPE = re.compile(r"^(String|Number|Binary)(\..+)?$", re.DOTALL)  # any custom suffix: "String.  x." too
_NUMBER = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")
_ASCII_ID = re.compile(r"^[!-~]{1,128}$")
_ENTRY_ID = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
STRUCTURE_PROTOCOLS = ("sqs", "http", "https")


# -- message attributes ------------------------------------------------------------------------

def _check_attribute_name(name: str) -> None:
    lowered = name.lower()
    if (not _ATTRIBUTE_NAME.match(name) or name.startswith(".") or name.endswith(".") or ".." in name
            or lowered.startswith(("aws.", "amazon."))):
        raise invalid_value(f"The message attribute name '{name}' is invalid: up to 256 letters, digits, _ - and "
                            ". (not at either end, not two in a row), not starting with AWS. or Amazon.")


def _attribute(name: str, value: dict[str, Any], values: bool = True) -> dict[str, str]:
    """One message attribute, checked; as the topics engine stores it (binary in base64).
    ``values`` False leaves out what SNS checks per batch entry rather than for the whole
    batch (that a Number is a number, a String.Array an array)."""
    _check_attribute_name(name)
    data_type = value.get("DataType") or ""
    match = _TYPE.match(data_type)
    if not match:
        raise invalid_value(f"The message attribute '{name}' has an invalid message attribute type, the set of "
                            "supported type prefixes is Binary, Number, and String.")
    kind = match[1]
    if kind == "Binary":
        if value.get("BinaryValue") is None:
            raise invalid_value(f"The message attribute '{name}' with type 'Binary' must use field 'Binary'.")
        return {"DataType": data_type, "BinaryValue": base64.b64encode(value["BinaryValue"]).decode()}
    text = value.get("StringValue")
    if text is None or text == "":
        raise invalid_value(f"The message attribute '{name}' must contain non-empty message attribute value "
                            f"for message attribute type '{data_type}'.")
    if values and kind == "Number" and not _NUMBER.match(text):
        raise invalid_value(f"Could not cast message attribute '{name}' value to number.")
    if values and data_type.startswith("String.Array"):
        _check_array(name, text)
    return {"DataType": data_type, "StringValue": text}


def _check_array(name: str, text: str) -> None:
    """A JSON array holds strings, numbers, booleans and nulls. A value that is no JSON
    array is taken, as SNS takes it, and filter policies match it as one value."""
    try:
        parsed = json_input.loads(text, big_integers=True)
    except json_input.TooDeep:
        parsed = [[]] if text.lstrip().startswith("[") else None  # an array of arrays, at least
    except ValueError:
        return
    if isinstance(parsed, list) and any(isinstance(v, (list, dict)) for v in parsed):
        raise invalid_value(f"The message attribute '{name}' with type 'String.Array' must be a JSON array of "
                            "strings, numbers, booleans or nulls.")


def _attributes(given: dict[str, dict[str, Any]] | None, values: bool = True) -> dict[str, dict[str, str]]:
    return {name: _attribute(name, value, values) for name, value in (given or {}).items()}


def _size(message: str, attributes: dict[str, dict[str, str]]) -> int:
    size = len(message.encode("utf-8"))
    for name, value in attributes.items():
        size += len(name.encode()) + len(value["DataType"].encode())
        size += len(value.get("StringValue", "").encode()) + len(base64.b64decode(value.get("BinaryValue", "")))
    return size


# -- the message ---------------------------------------------------------------------------------

def _structure(message: str, structure: str | None) -> tuple[str, dict[str, str] | None]:
    """(default body, per-protocol bodies) of a message."""
    if structure is None:
        return message, None
    if structure != "json":
        raise invalid("MessageStructure")
    try:
        parsed = json_input.loads(message, big_integers=True)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise invalid("Message Structure - JSON message body failed to parse")
    # an entry whose value is not a string is ignored, as SNS ignores it (the protocols
    # Conveyor does not deliver to, APNS, GCM and the like, are ignored anyway)
    parsed = {k: v for k, v in parsed.items() if isinstance(v, str)}
    if "default" not in parsed:
        raise invalid("Message Structure - No default entry in JSON message body")
    bodies = {p: parsed[p] for p in STRUCTURE_PROTOCOLS if p in parsed}
    return parsed["default"], bodies or None


def _subject(subject: str | None) -> str | None:
    if subject is not None and (len(subject) > MAX_SUBJECT or not _SUBJECT.match(subject)):
        raise invalid("Subject")
    return subject


def _fifo_ids(topic: types.Topic, entry: dict[str, Any]) -> tuple[str | None, str | None]:
    """(group, deduplication id). A standard topic takes a MessageGroupId too (SQS fair
    queues): its SQS subscriptions keep it on the queue message; HTTP(S) deliveries,
    which have no place for it, drop it."""
    group, dedup = entry.get("MessageGroupId"), entry.get("MessageDeduplicationId")
    if group is not None and not _ASCII_ID.match(group):
        raise invalid("MessageGroupId", "up to 128 letters, digits and punctuation")
    if not topic.fifo:
        if dedup is not None:
            raise invalid("MessageDeduplicationId", "The request includes MessageDeduplicationId parameter that "
                          "is not valid for this topic type")
        return group, None
    if group is None:
        raise invalid("The MessageGroupId parameter is required for FIFO topics")
    if dedup is None:  # the engine derives it from the body (SHA-256) for such topics
        if not attrs.content_based_deduplication(topic):
            raise invalid("The topic should either have ContentBasedDeduplication enabled or "
                          "MessageDeduplicationId provided explicitly")
    elif not _ASCII_ID.match(dedup):
        raise invalid("MessageDeduplicationId", "up to 128 letters, digits and punctuation")
    return group, dedup


def publication(topic: types.Topic, entry: dict[str, Any], trace_header: str | None = None) -> types.Publication:
    """A Publish (or a PublishBatch entry) checked as SNS checks it, as the engine's input:
    signed with the topic's SignatureVersion (FIFO topics' envelopes unsigned, as SNS sends
    them), and carrying the request's X-Ray header (``trace_header``) to SQS subscribers
    as their messages' AWSTraceHeader."""
    message = entry.get("Message")
    if message is None:
        raise invalid("Message")
    if message == "":
        raise invalid("Empty message")
    attributes = _attributes(entry.get("MessageAttributes"))
    if _size(message, attributes) > MAX_MESSAGE_BYTES:
        raise invalid("Message too long")
    body, bodies = _structure(message, entry.get("MessageStructure"))
    group, dedup = _fifo_ids(topic, entry)
    system = {"AWSTraceHeader": {"DataType": "String", "StringValue": trace_header}} if trace_header else None
    return types.Publication(body=body, subject=_subject(entry.get("Subject")), attributes=attributes or None,
                             group_id=group, dedup_id=dedup, bodies=bodies,
                             signature_version=attrs.signature_version(topic), signed=not topic.fifo,
                             system_attributes=system)


def _published(sent: types.Published) -> dict[str, Any]:
    out = {"MessageId": str(sent.message_id)}
    if sent.sequence_number is not None:
        out["SequenceNumber"] = sent.sequence_number
    return out


# -- actions -------------------------------------------------------------------------------------

def _target(ctx: Context, p: dict[str, Any]) -> str:
    topic_arn, target_arn = p.get("TopicArn"), p.get("TargetArn")
    if p.get("PhoneNumber") is not None:
        raise invalid("PhoneNumber", "Conveyor does not send SMS")
    if topic_arn and target_arn:
        raise invalid("TopicArn or TargetArn", "Only one of TopicArn or TargetArn may be given")
    if target_arn:
        return ctx.topic_from_arn(target_arn, "TargetArn")
    if not topic_arn:
        raise invalid("TopicArn or TargetArn", "One of them is required")
    return ctx.topic_from_arn(topic_arn)


async def _topic(ctx: Context, name: str) -> types.Topic:
    async with ctx.broker.connection() as conn:
        return await topic_actions.get_topic(ctx, conn, name)


async def publish(ctx: Context, p: dict[str, Any]) -> dict[str, Any]:
    name = _target(ctx, p)
    topic = await _topic(ctx, name)
    sent = await ctx.broker.publish(name, publication(topic, p, ctx.trace_header), ctx.urls, topic=name)
    return _published(sent)


def _check_batch(entries: list[dict[str, Any]]) -> None:
    if not entries:
        raise SnsError("EmptyBatchRequestException", "The batch request doesn't contain any entries.")
    if len(entries) > MAX_BATCH:
        raise SnsError("TooManyEntriesInBatchRequestException",
                       "The batch request contains more entries than permissible.")
    ids = [e.get("Id") or "" for e in entries]
    if any(not _ENTRY_ID.match(i) for i in ids):
        raise SnsError("InvalidBatchEntryIdException",
                       "The Id of a batch entry in a batch request doesn't abide by the specification.")
    if len(set(ids)) != len(ids):
        raise SnsError("BatchEntryIdsNotDistinctException", "Two or more batch entries in the request have the "
                       "same Id.")
    # a malformed attribute fails the whole batch, as on SNS, and attributes count toward its size
    total = sum(_size(e.get("Message") or "", _attributes(e.get("MessageAttributes"), values=False))
                for e in entries)
    if total > MAX_MESSAGE_BYTES:
        raise SnsError("BatchRequestTooLongException",
                       "The length of all the messages put together is more than the limit.")


def _failed(entry_id: str, exc: SnsError) -> dict[str, Any]:
    return {"Id": entry_id, "Code": exc.kind.query_code, "Message": exc.message, "SenderFault": exc.kind.sender}


def _check_whole_batch(topic: types.Topic, entries: list[dict[str, Any]]) -> None:
    """What SNS refuses for the whole PublishBatch (400) rather than per entry: a FIFO
    entry without MessageGroupId, or without MessageDeduplicationId on a topic without
    content-based deduplication, and a MessageStructure=json entry it cannot read."""
    if topic.fifo and any(e.get("MessageGroupId") is None for e in entries):
        raise invalid("The MessageGroupId parameter is required for FIFO topics")
    if (topic.fifo and not attrs.content_based_deduplication(topic)
            and any(e.get("MessageDeduplicationId") is None for e in entries)):
        raise invalid("The topic should either have ContentBasedDeduplication enabled or "
                      "MessageDeduplicationId provided explicitly")
    for entry in entries:
        if entry.get("Message") is not None:
            _structure(entry["Message"], entry.get("MessageStructure"))


async def publish_batch(ctx: Context, p: dict[str, Any]) -> dict[str, Any]:
    if not p.get("TopicArn"):
        raise invalid("TopicArn")
    name = ctx.topic_from_arn(p["TopicArn"])
    entries = p.get("PublishBatchRequestEntries") or []
    _check_batch(entries)
    topic = await _topic(ctx, name)
    _check_whole_batch(topic, entries)
    successful, failed = [], []
    for entry in entries:
        try:
            sent = await ctx.broker.publish(name, publication(topic, entry, ctx.trace_header), ctx.urls, topic=name)
        except SnsError as exc:
            failed.append(_failed(entry["Id"], exc))
            continue
        except errors.InvalidInput as exc:
            failed.append(_failed(entry["Id"], from_conveyor(exc)))
            continue
        successful.append({"Id": entry["Id"], **_published(sent)})
    return {"Successful": successful, "Failed": failed}
