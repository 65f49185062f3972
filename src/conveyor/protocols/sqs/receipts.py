"""SQS receipt handles: Conveyor's receipts (``conveyor.core.receipts``: keyed, one per
delivery) in SQS's terms. A handle from another queue, a made-up or truncated one is
ReceiptHandleIsInvalid; a genuine handle of a delivery that is over (the message was
received again since) is accepted and acts on nothing, as on SQS."""

from __future__ import annotations

from conveyor import types
from conveyor.protocols.broker import Broker
from conveyor.protocols.sqs.errors import SqsError


def encode(broker: Broker, queue: str, m: types.Message) -> str:
    return broker.receipts.encode(queue, m.id, m.receive_count)


def decode(broker: Broker, handle: str | None, queue: str) -> types.MessageRef:
    """The delivery a handle stands for; ReceiptHandleIsInvalid unless it is one of this queue's."""
    if not handle:
        raise SqsError("MissingParameter", "The request must contain the parameter ReceiptHandle.")
    receipt = broker.receipts.decode(handle, queue)
    if receipt is None:
        raise invalid(handle)
    return types.MessageRef(receipt.message_id, receipt.receive_count)


def invalid(handle: str) -> SqsError:
    return SqsError("ReceiptHandleIsInvalid", f'The input receipt handle "{handle}" is not a valid receipt handle.')
