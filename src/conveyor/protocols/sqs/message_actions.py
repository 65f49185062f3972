"""SQS message actions: SendMessage(Batch), ReceiveMessage, DeleteMessage(Batch),
ChangeMessageVisibility(Batch)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from conveyor import errors, types
from conveyor.protocols.sqs import message_attributes as ma
from conveyor.protocols.sqs import receipts
from conveyor.protocols.sqs.context import Context
from conveyor.protocols.sqs.errors import SqsError, invalid_value, missing

MAX_BATCH = 10
MAX_BATCH_BYTES = 1048576
_ENTRY_ID = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
_ASCII_ID = re.compile(r"^[!-~]{1,128}$")
SYSTEM_NAMES = ("SenderId", "SentTimestamp", "ApproximateReceiveCount", "ApproximateFirstReceiveTimestamp",
                "SequenceNumber", "MessageDeduplicationId", "MessageGroupId", "AWSTraceHeader")


# -- sending -----------------------------------------------------------------------------------

def _outgoing(ctx: Context, q: types.Queue, entry: dict[str, Any]) -> tuple[types.OutgoingMessage, int]:
    """Validate one message as AWS does; the message to store and its size in bytes."""
    body = entry.get("MessageBody")
    if not body:  # an empty body is a missing one, as AWS answers it
        raise missing("MessageBody")
    ma.check_characters(body)
    attributes = ma.stored_attributes(entry.get("MessageAttributes"))
    system = ma.stored_system_attributes(entry.get("MessageSystemAttributes"))
    if ctx.trace_header and not (system and "AWSTraceHeader" in system):
        # X-Ray's header becomes the message's AWSTraceHeader, as on AWS (an explicit
        # AWSTraceHeader system attribute wins)
        system = {**(system or {}), "AWSTraceHeader": {"DataType": "String", "StringValue": ctx.trace_header}}
    size = len(body.encode("utf-8")) + ma.size(attributes)
    if size > q.max_message_size:
        raise SqsError("InvalidParameterValue", "One or more parameters are invalid. Reason: Message must be "
                       f"shorter than {q.max_message_size} bytes.")
    delay = entry.get("DelaySeconds")
    if delay is not None and not 0 <= delay <= 900:
        raise invalid_value("DelaySeconds", delay, "DelaySeconds must be >= 0 and <= 900")
    group, dedup = entry.get("MessageGroupId"), entry.get("MessageDeduplicationId")
    if q.fifo:
        _check_fifo(q, group, dedup, delay)
    elif dedup is not None:
        raise invalid_value("MessageDeduplicationId", dedup,
                            "The request include parameter that is not valid for this queue type")
    if group is not None and not _ASCII_ID.match(group):
        raise invalid_value("MessageGroupId", group, "MessageGroupId can contain up to 128 alphanumeric "
                            "and punctuation characters")
    message = types.OutgoingMessage(body=body, headers=attributes, delay=None if q.fifo else delay,
                                    group_id=group, dedup_id=dedup, sender_id=ctx.sender_id,
                                    system_attributes=system)
    return message, size


def _check_fifo_ids(q: types.Queue, group: str | None, dedup: str | None, batch: bool = False) -> None:
    """The ids a FIFO queue requires; in a batch, one entry without them fails the whole
    request, as AWS does (and a missing MessageGroupId is then InvalidParameterValue,
    not MissingParameter, in AWS's words)."""
    if group is None:
        if batch:
            raise SqsError("InvalidParameterValue", "The request must contain the parameter MessageGroupId.")
        raise missing("MessageGroupId")
    if dedup is None and not q.content_based_deduplication:
        raise invalid_value("MessageDeduplicationId", "null",
                            "The queue should either have ContentBasedDeduplication enabled or "
                            "MessageDeduplicationId provided explicitly")


def _check_fifo(q: types.Queue, group: str | None, dedup: str | None, delay: int | None) -> None:
    _check_fifo_ids(q, group, dedup)
    if delay:
        raise invalid_value("DelaySeconds", delay,
                            "The request include parameter that is not valid for this queue type")
    if dedup is not None and not _ASCII_ID.match(dedup):
        raise invalid_value("MessageDeduplicationId", dedup, "MessageDeduplicationId can contain up to 128 "
                            "alphanumeric and punctuation characters")


def _sent(message: types.OutgoingMessage, sent: types.Sent, fifo: bool, entry: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"MessageId": str(sent.message_uuid), "MD5OfMessageBody": ma.md5_of_body(message.body)}
    if message.headers:
        out["MD5OfMessageAttributes"] = ma.md5_of_attributes(message.headers)
    if entry.get("MessageSystemAttributes") and message.system_attributes:  # those the request gave
        out["MD5OfMessageSystemAttributes"] = ma.md5_of_attributes(message.system_attributes)
    if fifo:
        out["SequenceNumber"] = sequence_number(sent.id)
    return out


def sequence_number(message_id: int) -> str:
    return f"{message_id:020d}"


async def send_message(ctx: Context, p: dict[str, Any]) -> dict[str, Any]:
    queue = ctx.queue_from_url(p.get("QueueUrl"))
    q = await ctx.broker.queue(queue)
    message, _ = _outgoing(ctx, q, p)
    [sent] = await ctx.broker.send(queue, [message], spool=_spools(ctx, q))
    return _sent(message, sent, q.fifo, p)


def _spools(ctx: Context, q: types.Queue) -> bool:
    """SQS sends are acknowledged from the failover spool only when the operator allows
    it (CONVEYOR_SPOOL_SQS: their MessageId is then promised before the database has the
    message) and only to standard queues (a FIFO send's SequenceNumber needs the database)."""
    return not q.fifo and ctx.broker.spools("sqs")


def _check_entries(entries: Sequence[dict[str, Any]] | None, kind: str) -> Sequence[dict[str, Any]]:
    """A batch's entries, checked as AWS checks them before looking at any one."""
    if not entries:
        raise SqsError("EmptyBatchRequest", f"There should be at least one {kind} in the request.")
    if len(entries) > MAX_BATCH:
        raise SqsError("TooManyEntriesInBatchRequest",
                       f"Maximum number of entries per request are {MAX_BATCH}. You have sent {len(entries)}.")
    seen = set()
    for entry in entries:
        entry_id = entry.get("Id")
        if not entry_id or not _ENTRY_ID.match(entry_id):
            raise SqsError("InvalidBatchEntryId", "A batch entry id can only contain alphanumeric characters, "
                           "hyphens and underscores. It can be at most 80 letters long.")
        if entry_id in seen:
            raise SqsError("BatchEntryIdsNotDistinct", f"Id {entry_id} repeated.")
        seen.add(entry_id)
    return entries


def _failure(entry_id: str, exc: SqsError) -> dict[str, Any]:
    return {"Id": entry_id, "SenderFault": exc.kind.sender, "Code": exc.kind.query_code, "Message": exc.message}


def _raw_size(entry: dict[str, Any]) -> int:
    """An entry's bytes as sent (body, attribute names, types and values), before it is
    validated: what AWS adds up for a batch's size limit."""
    def length(value: Any) -> int:
        if isinstance(value, str):
            return len(value.encode("utf-8", "surrogatepass"))
        return len(value) if isinstance(value, (bytes, bytearray)) else 0

    total = length(entry.get("MessageBody"))
    attributes = entry.get("MessageAttributes")
    for name, value in (attributes.items() if isinstance(attributes, dict) else ()):
        total += length(name)
        if isinstance(value, dict):
            total += sum(length(value.get(k)) for k in ("DataType", "StringValue", "BinaryValue"))
    return total


async def send_message_batch(ctx: Context, p: dict[str, Any]) -> dict[str, Any]:
    queue = ctx.queue_from_url(p.get("QueueUrl"))
    entries = _check_entries(p.get("Entries"), "SendMessageBatchRequestEntry")
    total = sum(_raw_size(entry) for entry in entries)  # the whole request's size comes first
    if total > MAX_BATCH_BYTES:
        raise SqsError("BatchRequestTooLong", f"Batch requests cannot be longer than {MAX_BATCH_BYTES} bytes. "
                       f"You have sent {total} bytes.")
    q = await ctx.broker.queue(queue)
    if q.fifo:
        for entry in entries:
            _check_fifo_ids(q, entry.get("MessageGroupId"), entry.get("MessageDeduplicationId"), batch=True)
    valid, failed = [], []
    for entry in entries:
        try:
            message, _ = _outgoing(ctx, q, entry)
        except SqsError as exc:
            failed.append(_failure(entry["Id"], exc))
            continue
        valid.append((entry, message))
    successful = []
    for (entry, message), outcome in zip(valid, await _send_all(ctx, queue, valid), strict=True):
        if isinstance(outcome, SqsError):
            failed.append(_failure(entry["Id"], outcome))
        else:
            successful.append(_sent(message, outcome, q.fifo, entry) | {"Id": entry["Id"]})
    return {"Successful": successful, "Failed": failed}


async def _send_all(ctx: Context, queue: str,
                    valid: list[tuple[dict[str, Any], types.OutgoingMessage]]) -> list[types.Sent | SqsError]:
    """Send the valid entries in one call; if the database still refuses one (its limits
    changed since they were read), send them one by one so only that entry fails."""
    if not valid:
        return []
    try:
        return list(await ctx.broker.send(queue, [m for _, m in valid], spool=_spools(ctx, await ctx.broker.queue(queue))))
    except errors.InvalidInput:
        pass
    outcomes: list[types.Sent | SqsError] = []
    for _, message in valid:
        try:
            [sent] = await ctx.broker.send(queue, [message])
            outcomes.append(sent)
        except errors.InvalidInput as exc:
            outcomes.append(SqsError("InvalidParameterValue", exc.message))
    return outcomes


# -- receiving ---------------------------------------------------------------------------------

async def receive_message(ctx: Context, p: dict[str, Any]) -> dict[str, Any]:
    queue = ctx.queue_from_url(p.get("QueueUrl"))
    qty = p.get("MaxNumberOfMessages", 1)
    if not 1 <= qty <= 10:
        raise invalid_value("MaxNumberOfMessages", qty, "Must be between 1 and 10, if provided")
    vt = p.get("VisibilityTimeout")
    if vt is not None and not 0 <= vt <= 43200:
        raise invalid_value("VisibilityTimeout", vt, "Must be between 0 and 43200, if provided")
    wait = p.get("WaitTimeSeconds")
    if wait is not None and not 0 <= wait <= 20:
        raise invalid_value("WaitTimeSeconds", wait, "Must be >= 0 and <= 20, if provided")
    attempt = p.get("ReceiveRequestAttemptId")
    if attempt is not None and not _ASCII_ID.match(attempt):
        raise invalid_value("ReceiveRequestAttemptId", attempt, "ReceiveRequestAttemptId can contain up to 128 "
                            "alphanumeric and punctuation characters")
    got = await ctx.broker.receive(queue, types.ReceiveParams(
        qty=qty, vt=vt, wait=wait, attempt_id=attempt if queue.endswith(".fifo") else None))
    system = _system_names(p)
    user = p.get("MessageAttributeNames")
    return {"Messages": [_received(ctx, queue, m, system, user) for m in got]} if got else {}


def _system_names(p: dict[str, Any]) -> set[str]:
    names = set(p.get("AttributeNames") or []) | set(p.get("MessageSystemAttributeNames") or [])
    return set(SYSTEM_NAMES) if "All" in names else names


def _received(ctx: Context, queue: str, m: types.Message, system: set[str],
              user: list[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "MessageId": str(m.message_uuid),
        "ReceiptHandle": receipts.encode(ctx.broker, queue, m),
        "MD5OfBody": ma.md5_of_body(m.body),
        "Body": m.body,
    }
    if system:
        attributes = {k: v for k, v in _system_values(ctx, m).items() if k in system}
        if attributes:
            out["Attributes"] = attributes
    chosen = ma.select(ma.from_headers(m.headers), user)
    if chosen:
        out["MessageAttributes"] = ma.to_wire(chosen)
        out["MD5OfMessageAttributes"] = ma.md5_of_attributes(chosen)
    return out


def _millis(value: Any) -> str | None:
    return None if value is None else str(int(value.timestamp() * 1000))


def _system_values(ctx: Context, m: types.Message) -> dict[str, str]:
    values = {
        "SenderId": m.sender_id or ctx.account_id,
        "SentTimestamp": _millis(m.sent_at),
        "ApproximateReceiveCount": str(m.receive_count),
        "ApproximateFirstReceiveTimestamp": _millis(m.first_received_at),
        "MessageGroupId": m.group_id,
    }
    if m.dedup_id is not None:
        values["MessageDeduplicationId"] = m.dedup_id
        values["SequenceNumber"] = sequence_number(m.id)
    trace = (m.system_attributes or {}).get("AWSTraceHeader")
    if trace:
        values["AWSTraceHeader"] = trace.get("StringValue")
    return {k: v for k, v in values.items() if v is not None}


# -- deleting and changing visibility ------------------------------------------------------------

async def _existing_queue(ctx: Context, p: dict[str, Any]) -> str:
    """The queue a request names, checked to exist before its receipt handles are read
    (AWS answers NonExistentQueue for an unknown queue whatever the handles are)."""
    queue = ctx.queue_from_url(p.get("QueueUrl"))
    await ctx.broker.queue(queue)
    return queue


def _expired(handle: str) -> SqsError:
    """A FIFO queue's handle whose visibility ran out (the message is visible again, or was
    received again since): AWS refuses the delete."""
    return invalid_value("ReceiptHandle", handle, "The receipt handle has expired")


async def _delete(ctx: Context, queue: str, deliveries: list[types.MessageRef]) -> set[int]:
    """Delete deliveries; the ids of those refused. On a standard queue a handle of a
    delivery that is over deletes nothing (the newer one may) and succeeds; on a FIFO queue
    a handle acts only while its visibility lasts, and one that ran out is refused, as AWS
    refuses it (a message deleted since is no error on either)."""
    if not (await ctx.broker.queue(queue)).fifo:
        await ctx.broker.delete(queue, deliveries)
        return set()
    _, over = await ctx.broker.delete_in_flight(queue, deliveries)
    return set(over)


async def delete_message(ctx: Context, p: dict[str, Any]) -> None:
    queue = await _existing_queue(ctx, p)
    if await _delete(ctx, queue, [receipts.decode(ctx.broker, p.get("ReceiptHandle"), queue)]):
        raise _expired(p["ReceiptHandle"])


async def delete_message_batch(ctx: Context, p: dict[str, Any]) -> dict[str, Any]:
    queue = await _existing_queue(ctx, p)
    entries = _check_entries(p.get("Entries"), "DeleteMessageBatchRequestEntry")
    decoded, failed = [], []
    for entry in entries:
        try:
            decoded.append((entry, receipts.decode(ctx.broker, entry.get("ReceiptHandle"), queue)))
        except SqsError as exc:
            failed.append(_failure(entry["Id"], exc))
    refused = await _delete(ctx, queue, [d for _, d in decoded]) if decoded else set()
    successful = []
    for entry, delivery in decoded:
        if delivery.id in refused:
            failed.append(_failure(entry["Id"], _expired(entry["ReceiptHandle"])))
        else:
            successful.append({"Id": entry["Id"]})
    return {"Successful": successful, "Failed": failed}


def _visibility(value: Any) -> int:
    if value is None:
        raise missing("VisibilityTimeout")
    if not 0 <= value <= 43200:
        raise invalid_value("VisibilityTimeout", value, "VisibilityTimeout must be an integer between 0 and 43200")
    return int(value)


def _not_changeable(handle: str) -> SqsError:
    """A handle of a message deleted since, or received again since (a newer handle acts
    for it now): AWS's InvalidParameterValue."""
    return invalid_value("ReceiptHandle", handle,
                         "Message does not exist or is not available for visibility timeout change")


async def change_message_visibility(ctx: Context, p: dict[str, Any]) -> None:
    """The newest handle of a message changes its visibility, as on AWS, even once its
    timeout has run out (the message is hidden again for ``VisibilityTimeout``); the
    handle's receive count fences off older ones."""
    queue = await _existing_queue(ctx, p)
    delivery = receipts.decode(ctx.broker, p.get("ReceiptHandle"), queue)
    vt = _visibility(p.get("VisibilityTimeout"))
    if not await ctx.broker.set_vt(queue, [delivery], vt):
        raise _not_changeable(p["ReceiptHandle"])


async def change_message_visibility_batch(ctx: Context, p: dict[str, Any]) -> dict[str, Any]:
    queue = await _existing_queue(ctx, p)
    entries = _check_entries(p.get("Entries"), "ChangeMessageVisibilityBatchRequestEntry")
    by_vt: dict[int, list[tuple[dict[str, Any], types.MessageRef]]] = {}
    failed = []
    for entry in entries:
        try:
            delivery = receipts.decode(ctx.broker, entry.get("ReceiptHandle"), queue)
            by_vt.setdefault(_visibility(entry.get("VisibilityTimeout")), []).append((entry, delivery))
        except SqsError as exc:
            failed.append(_failure(entry["Id"], exc))
    successful = []
    for vt, pairs in by_vt.items():  # one call per distinct timeout
        changed = {m.id for m in await ctx.broker.set_vt(queue, [d for _, d in pairs], vt)}
        for entry, delivery in pairs:
            if delivery.id in changed:
                successful.append({"Id": entry["Id"]})
            else:
                failed.append(_failure(entry["Id"], _not_changeable(entry["ReceiptHandle"])))
    return {"Successful": successful, "Failed": failed}

