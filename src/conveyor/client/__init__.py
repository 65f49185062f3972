"""Conveyor's Python client for streams: a consumer with handlers per event type, and
helpers to append events. See docs/client.md.

    from conveyor.client import Consumer, DeadLetter, Producer
"""

from conveyor.client.consumer import BatchResult, Consumer, Context, DeadLetter
from conveyor.client.producer import Producer, append, append_batch
from conveyor.types import StreamEvent, StreamEventIn

__all__ = ["BatchResult", "Consumer", "Context", "DeadLetter", "Producer", "StreamEvent", "StreamEventIn",
           "append", "append_batch"]
