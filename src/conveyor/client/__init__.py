"""Conveyor's Python client: queues (``AsyncClient`` / ``Client`` over SQL or HTTP, and a
``Worker`` with heartbeats, retries and a graceful stop) and streams (a ``Consumer`` with
handlers per event type, and ``Producer`` / ``append``). See docs/client.md.

    from conveyor.client import AsyncClient, Client, Consumer, DeadLetter, Producer
"""

from conveyor.client.consumer import BatchResult, Consumer, Context, DeadLetter
from conveyor.client.producer import Producer, append, append_batch
from conveyor.client.queues import AsyncClient, Client, HttpTransport, Leased, Message, Received, SqlTransport, send_in
from conveyor.client.worker import Worker, WorkerStats
from conveyor.types import StreamEvent, StreamEventIn

__all__ = ["AsyncClient", "BatchResult", "Client", "Consumer", "Context", "DeadLetter", "HttpTransport", "Leased", "Message",
           "Producer", "Received", "SqlTransport", "StreamEvent", "StreamEventIn", "Worker", "WorkerStats", "append",
           "append_batch", "send_in"]
