"""The queue client: send, receive and settle messages over either of two transports.

- ``SqlTransport``: Conveyor's SQL API on PostgreSQL directly. An enqueue can run on the
  caller's own connection (``send(..., conn=...)``), so it commits or rolls back with
  the caller's writes: transactional enqueue.
- ``HttpTransport``: the server's REST API (``/v1/queues``), with a bearer token.

Both hand out ``Received`` messages that remember their delivery (the REST receipt, or
the message id and receive count), so that acknowledging, extending or releasing acts
only on that delivery: a worker whose message was redelivered to another cannot settle
the other's. See docs/client.md.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar

import httpx
import orjson

from conveyor import errors, types
from conveyor.core import messages, partitioned
from conveyor.db import execute, pool
from conveyor.db import sync as db_sync

Connection = execute.Connection


@dataclass(frozen=True, slots=True)
class Message:
    """What to send: a body (text, or any JSON value) and its options."""

    body: Any
    headers: dict[str, Any] | None = None
    delay: int | None = None  # seconds (standard queues)
    group_id: str | None = None  # FIFO queues: the message group
    dedup_id: str | None = None  # FIFO queues: the idempotency key (five minutes)

    def outgoing(self) -> types.OutgoingMessage:
        text, content_type = ((self.body, None) if isinstance(self.body, str)
                              else (orjson.dumps(self.body).decode(), types.JSON_CONTENT_TYPE))
        return types.OutgoingMessage(body=text, headers=self.headers, delay=self.delay, content_type=content_type,
                                     group_id=self.group_id, dedup_id=self.dedup_id)


def _message(value: Message | Any) -> Message:
    return value if isinstance(value, Message) else Message(value)


@dataclass(frozen=True, slots=True)
class Received:
    """A message as a consumer holds it: one delivery of it."""

    queue: str
    id: int
    body: str
    receive_count: int
    receipt: str  # names this delivery
    headers: dict[str, Any] | None = None
    group_id: str | None = None
    sent_at: datetime | str | None = None
    is_json: bool = False
    traceparent: str | None = None  # the sender's trace (conveyor.tracing), for the handler to continue

    def json(self) -> Any:
        """The body parsed as JSON."""
        return orjson.loads(self.body)


@dataclass(frozen=True, slots=True)
class Leased:
    """A message of a partitioned queue (seed 004's model, docs/queen.md) as a consumer
    group holds it: under the lease of its pop, which settling names (fencing)."""

    queue: str
    partition: str
    partition_id: str
    transaction_id: str
    lease_id: str
    data: Any
    group: str | None = None
    retry_count: int = 0
    created_at: str | None = None
    traceparent: str | None = None

    @property
    def receive_count(self) -> int:  # deliveries so far, as for queue messages
        return self.retry_count + 1

    @property
    def id(self) -> str:
        return self.transaction_id

    def json(self) -> Any:
        return self.data


def _leased(m: dict[str, Any], group: str | None) -> Leased:
    return Leased(queue=m["queue"], partition=m["partition"], partition_id=str(m["partitionId"]),
                  transaction_id=m["transactionId"], lease_id=str(m.get("leaseId") or ""), data=m.get("data"),
                  group=group, retry_count=int(m.get("retryCount") or 0), created_at=m.get("createdAt"))


def _ack_item(m: Leased, status: str, error: str | None = None) -> dict[str, Any]:
    item = {"transactionId": m.transaction_id, "partitionId": m.partition_id, "leaseId": m.lease_id,
            "status": status, "consumerGroup": m.group}
    if error is not None:
        item["error"] = error[:1000]
    return {k: v for k, v in item.items() if v is not None}


class Transport(Protocol):
    async def send(self, queue: str, batch: Sequence[types.OutgoingMessage],
                   conn: Connection | None = None) -> list[int]: ...

    async def receive(self, queue: str, qty: int, vt: int | None, wait: float) -> list[Received]: ...

    async def ack(self, m: Received) -> bool: ...

    async def extend(self, m: Received, seconds: int) -> bool: ...

    async def fail(self, m: Received, reason: str) -> bool: ...

    # partitioned queues: Queen's JSON shapes (conveyor.core.partitioned)
    async def pq_push(self, items: Sequence[dict[str, Any]], conn: Connection | None = None) -> list[dict[str, Any]]: ...

    async def pq_pop(self, request: dict[str, Any], wait: float) -> list[dict[str, Any]]: ...

    async def pq_ack(self, acks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]: ...

    async def pq_renew(self, lease_id: str, seconds: int | None) -> bool: ...

    async def close(self) -> None: ...


# -- SQL ------------------------------------------------------------------------------------

class SqlTransport:
    """Conveyor's SQL API through a small pool (``dsn``). Receives wait by polling (a
    server's long polls wake on NOTIFY instead); use the HTTP transport for many idle
    consumers."""

    def __init__(self, dsn: str, *, max_connections: int = 8, poll_interval: float = 0.2) -> None:
        self.dsn = dsn
        self.poll_interval = poll_interval
        self._db = pool.Database(dsn, min_size=1, max_size=max_connections, application_name="conveyor-client")
        self._opened = False

    async def _database(self) -> pool.Database:
        if not self._opened:
            await self._db.open(wait=True)
            self._opened = True
        return self._db

    async def send(self, queue: str, batch: Sequence[types.OutgoingMessage],
                   conn: Connection | None = None) -> list[int]:
        if conn is not None:  # the caller's transaction
            return [s.id for s in await messages.send_batch(conn, queue, batch)]
        async with (await self._database()).connection() as own:
            return [s.id for s in await messages.send_batch(own, queue, batch)]

    async def receive(self, queue: str, qty: int, vt: int | None, wait: float) -> list[Received]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            async with (await self._database()).connection() as conn:
                got = await messages.receive(conn, queue, qty=qty, vt=vt)
            if got or loop.time() >= deadline:
                return [_from_row(queue, m) for m in got]
            await asyncio.sleep(min(self.poll_interval, max(deadline - loop.time(), 0)))

    async def ack(self, m: Received) -> bool:
        async with (await self._database()).connection() as conn:
            return bool(await messages.delete(conn, m.queue, [m.id], [m.receive_count]))

    async def extend(self, m: Received, seconds: int) -> bool:
        async with (await self._database()).connection() as conn:
            return bool(await messages.set_vt(conn, m.queue, [m.id], seconds, in_flight_only=True,
                                              receive_counts=[m.receive_count]))

    async def fail(self, m: Received, reason: str) -> bool:
        async with (await self._database()).connection() as conn:
            return await messages.fail(conn, m.queue, m.id, reason, m.receive_count)

    async def pq_push(self, items: Sequence[dict[str, Any]], conn: Connection | None = None) -> list[dict[str, Any]]:
        if conn is not None:
            return await partitioned.push(conn, items)
        async with (await self._database()).connection() as own:
            return await partitioned.push(own, items)

    async def pq_pop(self, request: dict[str, Any], wait: float) -> list[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            async with (await self._database()).connection() as conn:
                got = await partitioned.pop(conn, request)
            if got["messages"] or loop.time() >= deadline:
                return [{**m, "leaseId": m.get("leaseId") or got.get("leaseId")} for m in got["messages"]]
            await asyncio.sleep(min(self.poll_interval, max(deadline - loop.time(), 0)))

    async def pq_ack(self, acks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        async with (await self._database()).connection() as conn:
            return await partitioned.ack(conn, acks)

    async def pq_renew(self, lease_id: str, seconds: int | None) -> bool:
        lease: dict[str, Any] = {"leaseId": lease_id, **({"seconds": seconds} if seconds else {})}
        async with (await self._database()).connection() as conn:
            [answer] = await partitioned.renew(conn, [lease])
        return bool(answer.get("success"))

    async def close(self) -> None:
        if self._opened:
            await self._db.close()
            self._opened = False


def _from_row(queue: str, m: types.Message) -> Received:
    trace = (m.system_attributes or {}).get("traceparent") or {}
    return Received(queue=queue, id=m.id, body=m.body, receive_count=m.receive_count,
                    receipt=f"{m.id}:{m.receive_count}", headers=m.headers, group_id=m.group_id,
                    sent_at=m.sent_at, is_json=m.is_json, traceparent=trace.get("StringValue"))


# -- HTTP -----------------------------------------------------------------------------------

class HttpTransport:
    """The REST API of a Conveyor server; long polls wait in the server (``wait`` up to 20 s
    per call)."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {"Authorization": "conveyor-client"}
        self._http = httpx.AsyncClient(base_url=url.rstrip("/"), headers=headers, timeout=timeout)

    async def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            r = await self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise errors.Unavailable(f"the Conveyor server cannot be reached: {exc}") from None
        if r.status_code >= 500:
            raise errors.Unavailable(f"the Conveyor server answered {r.status_code}: {r.text[:200]}")
        return r

    @staticmethod
    def _raise(r: httpx.Response) -> None:
        if r.status_code < 400:
            return
        try:
            body = r.json()
        except ValueError:
            body = {"error": r.text[:200], "code": ""}
        kind = getattr(errors, str(body.get("code", "")), None)
        if isinstance(kind, type) and issubclass(kind, errors.ConveyorError):
            raise kind(body.get("error", ""))
        raise errors.InvalidInput(f"{r.status_code}: {body.get('error', '')}")

    async def send(self, queue: str, batch: Sequence[types.OutgoingMessage],
                   conn: Connection | None = None) -> list[int]:
        if conn is not None:
            raise ValueError("a transactional send (conn=) needs the SQL transport")
        items = [{"message": orjson.Fragment(m.body) if m.content_type == types.JSON_CONTENT_TYPE else m.body,
                  **{k: v for k, v in (("headers", m.headers), ("delay", m.delay), ("group_id", m.group_id),
                                        ("dedup_id", m.dedup_id)) if v is not None}} for m in batch]
        r = await self._call("POST", f"/v1/queues/{queue}/messages", content=orjson.dumps(items),
                             headers={"Content-Type": "application/json"})
        self._raise(r)
        answer = r.json()
        return list(answer["ids"]) if answer.get("ids") is not None else [0] * len(items)  # 0: spooled

    async def receive(self, queue: str, qty: int, vt: int | None, wait: float) -> list[Received]:
        params: dict[str, Any] = {"max": qty, "wait": int(min(max(wait, 0), 20))}
        if vt is not None:
            params["vt"] = vt
        r = await self._call("GET", f"/v1/queues/{queue}/messages", params=params)
        self._raise(r)
        return [Received(queue=queue, id=m["id"], receipt=m["receipt"], receive_count=m["receive_count"],
                         body=m["message"] if isinstance(m["message"], str) else orjson.dumps(m["message"]).decode(),
                         is_json=not isinstance(m["message"], str), headers=m.get("headers"),
                         group_id=m.get("group_id"), sent_at=m.get("sent_at"),
                         traceparent=m.get("traceparent")) for m in r.json()]

    async def _settle(self, method: str, m: Received, suffix: str = "", **kwargs: Any) -> bool:
        r = await self._call(method, f"/v1/queues/{m.queue}/messages/{m.id}{suffix}",
                             params={"receipt": m.receipt}, **kwargs)
        if r.status_code in (404, 409):  # gone, or delivered again since: not ours to settle
            return False
        self._raise(r)
        return True

    async def ack(self, m: Received) -> bool:
        return await self._settle("DELETE", m)

    async def extend(self, m: Received, seconds: int) -> bool:
        return await self._settle("PATCH", m, json={"vt": seconds})

    async def fail(self, m: Received, reason: str) -> bool:
        return await self._settle("POST", m, "/fail", json={"error": reason[:1000]})

    async def pq_push(self, items: Sequence[dict[str, Any]], conn: Connection | None = None) -> list[dict[str, Any]]:
        if conn is not None:
            raise ValueError("a transactional push (conn=) needs the SQL transport")
        r = await self._call("POST", "/api/v1/push", content=orjson.dumps({"items": list(items)}),
                             headers={"Content-Type": "application/json"})
        self._raise(r)
        answer: list[dict[str, Any]] = r.json()
        return answer

    async def pq_pop(self, request: dict[str, Any], wait: float) -> list[dict[str, Any]]:
        path = f"/api/v1/pop/queue/{request['queue']}"
        if request.get("partition"):
            path += f"/partition/{request['partition']}"
        params: dict[str, Any] = {"batch": request.get("batch", 1), "wait": "true" if wait > 0 else "false",
                                  "timeout": int(min(wait, 30) * 1000)}
        if request.get("consumerGroup"):
            params["consumerGroup"] = request["consumerGroup"]
        r = await self._call("GET", path, params=params, timeout=wait + 10)
        if r.status_code == 204:
            return []
        self._raise(r)
        body = r.json()
        return [{**m, "leaseId": m.get("leaseId") or body.get("leaseId")} for m in body["messages"]]

    async def pq_ack(self, acks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        r = await self._call("POST", "/api/v1/ack/batch", content=orjson.dumps({"acknowledgments": list(acks)}),
                             headers={"Content-Type": "application/json"})
        self._raise(r)
        answer: list[dict[str, Any]] = r.json()
        return answer

    async def pq_renew(self, lease_id: str, seconds: int | None) -> bool:
        r = await self._call("POST", f"/api/v1/lease/{lease_id}/extend",
                             json={"seconds": seconds} if seconds else {})
        return r.status_code == 200

    async def close(self) -> None:
        await self._http.aclose()


# -- the client -------------------------------------------------------------------------------

class AsyncClient:
    """Queues through one transport: ``AsyncClient.sql(dsn)`` or
    ``AsyncClient.http(url, token)``. ``conveyor.client.worker.Worker(client)`` runs handlers
    over received messages (the worker is built on the client, never the other way round)."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    @classmethod
    def sql(cls, dsn: str, **options: Any) -> AsyncClient:
        return cls(SqlTransport(dsn, **options))

    @classmethod
    def http(cls, url: str, token: str | None = None, **options: Any) -> AsyncClient:
        return cls(HttpTransport(url, token, **options))

    async def send(self, queue: str, body: Message | Any, *, conn: Connection | None = None, **options: Any) -> int:
        """Send one message (``body`` text or JSON, or a ``Message``); its id (0 when a
        server's failover spool took it). With ``conn`` (SQL transport), in the caller's
        transaction."""
        message = body if isinstance(body, Message) else Message(body, **options)
        [sent] = await self.transport.send(queue, [message.outgoing()], conn)
        return sent

    async def send_batch(self, queue: str, bodies: Sequence[Message | Any], *,
                         conn: Connection | None = None) -> list[int]:
        """Send many in one call, all or nothing."""
        return await self.transport.send(queue, [_message(b).outgoing() for b in bodies], conn)

    async def receive(self, queue: str, *, max: int = 1, vt: int | None = None,
                      wait: float = 0.0) -> list[Received]:
        return await self.transport.receive(queue, max, vt, wait)

    async def ack(self, m: Received | Leased) -> bool:
        if isinstance(m, Leased):
            return await self._settle_leased(m, "completed")
        return await self.transport.ack(m)

    async def extend(self, m: Received | Leased, seconds: int) -> bool:
        """Keep the message: its visibility timeout (or its partition's lease) runs
        ``seconds`` from now."""
        if isinstance(m, Leased):
            return await self.transport.pq_renew(m.lease_id, seconds)
        return await self.transport.extend(m, seconds)

    async def release(self, m: Received | Leased, delay: int = 0) -> bool:
        """Give the message back: visible again in ``delay`` seconds (a partitioned
        queue's message at once, its lease released, no failure counted)."""
        if isinstance(m, Leased):
            return await self._settle_leased(m, "retry")
        return await self.transport.extend(m, delay)

    async def retry(self, m: Received | Leased, delay: int, reason: str) -> bool:
        """The handler failed: try again later (a queue's message after ``delay``; a
        partitioned queue's by its retry limit, then its dead letters)."""
        if isinstance(m, Leased):
            return await self._settle_leased(m, "failed", reason)
        return await self.transport.extend(m, delay)

    async def fail(self, m: Received | Leased, reason: str) -> bool:
        """To the queue's dead-letter queue, else to its archive as failed."""
        if isinstance(m, Leased):
            return await self._settle_leased(m, "dlq", reason)
        return await self.transport.fail(m, reason)

    # -- partitioned queues (Queen's model: docs/queen.md) ---------------------------------

    async def push(self, queue: str, payload: Any, *, partition: str | None = None,
                   transaction_id: str | None = None, conn: Connection | None = None) -> dict[str, Any]:
        """Push one message to a partition (created on first use; ``Default`` if none);
        ``transaction_id`` makes it idempotent. Its answer (``status`` queued, duplicate,
        or buffered by a server's spool)."""
        [answer] = await self.push_batch(queue, [payload], partition=partition, conn=conn,
                                         transaction_ids=[transaction_id] if transaction_id else None)
        return answer

    async def push_batch(self, queue: str, payloads: Sequence[Any], *, partition: str | None = None,
                         transaction_ids: Sequence[str] | None = None,
                         conn: Connection | None = None) -> list[dict[str, Any]]:
        items = [{"queue": queue, "payload": p, **({"partition": partition} if partition else {}),
                  **({"transactionId": transaction_ids[i]} if transaction_ids else {})}
                 for i, p in enumerate(payloads)]
        return await self.transport.pq_push(items, conn)

    async def pop(self, queue: str, *, partition: str | None = None, group: str | None = None,
                  batch: int = 1, wait: float = 0.0) -> list[Leased]:
        """Messages of one partition (any with work when ``partition`` is None) under a
        lease, for ``group`` (queue mode when None)."""
        request = {"queue": queue, "batch": batch, **({"partition": partition} if partition else {}),
                   **({"consumerGroup": group} if group else {})}
        return [_leased(m, group) for m in await self.transport.pq_pop(request, wait)]

    async def _settle_leased(self, m: Leased, status: str, error: str | None = None) -> bool:
        [answer] = await self.transport.pq_ack([_ack_item(m, status, error)])
        return bool(answer.get("success"))

    async def close(self) -> None:
        await self.transport.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def send_in(conn: db_sync.Connection, queue: str, body: Message | Any, **options: Any) -> int:
    """Send one message on the caller's blocking psycopg connection, inside whatever
    transaction it has open: it commits or rolls back with the caller's own writes."""
    message = (body if isinstance(body, Message) else Message(body, **options)).outgoing()
    if "\x00" in message.body:
        raise errors.InvalidInput("message bodies cannot contain NUL characters (U+0000)")
    row = db_sync.fetch_one(conn, "message_send_json", {"queue": queue, "messages": orjson.dumps(
        [message.to_json()]).decode()})
    if row is None:
        raise errors.InternalError("message_send_json returned no row")
    return int(row[0])


class Client:
    """The blocking face of ``AsyncClient`` for code without an event loop (web handlers,
    scripts): ``Client.sql(dsn)`` or ``Client.http(url, token)``; the calls run on a loop
    of the client's own thread. For transactional enqueue on your own blocking psycopg
    connection, use ``send_in``."""

    def __init__(self, transport_factory: Callable[[], Transport]) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="conveyor-client", daemon=True)
        self._thread.start()
        self._async = AsyncClient(self._run(_make(transport_factory)))

    @classmethod
    def sql(cls, dsn: str, **options: Any) -> Client:
        return cls(lambda: SqlTransport(dsn, **options))

    @classmethod
    def http(cls, url: str, token: str | None = None, **options: Any) -> Client:
        return cls(lambda: HttpTransport(url, token, **options))

    def _run(self, coro: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(_awaited(coro), self._loop).result()

    def send(self, queue: str, body: Message | Any, **options: Any) -> int:
        return self._run(self._async.send(queue, body, **options))

    def send_batch(self, queue: str, bodies: Sequence[Message | Any]) -> list[int]:
        return self._run(self._async.send_batch(queue, bodies))

    def receive(self, queue: str, *, max: int = 1, vt: int | None = None, wait: float = 0.0) -> list[Received]:
        return self._run(self._async.receive(queue, max=max, vt=vt, wait=wait))

    def ack(self, m: Received) -> bool:
        return self._run(self._async.ack(m))

    def extend(self, m: Received, seconds: int) -> bool:
        return self._run(self._async.extend(m, seconds))

    def release(self, m: Received, delay: int = 0) -> bool:
        return self._run(self._async.release(m, delay))

    def fail(self, m: Received, reason: str) -> bool:
        return self._run(self._async.fail(m, reason))

    def close(self) -> None:
        self._run(self._async.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


T = TypeVar("T")


async def _make(factory: Callable[[], Transport]) -> Transport:
    return factory()  # built on the client's loop (httpx and the pool bind to it)


async def _awaited(coro: Awaitable[T]) -> T:
    return await coro
