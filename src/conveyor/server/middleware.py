"""The server's one edge layer (pure ASGI): what every request passes before its protocol
sees it, in one place and one wrapper of ``send``: request metrics and the request's span,
admission control, the request deadline, the body size limit and, for the plain-HTTP APIs,
authentication. The AWS endpoints and the plain-HTTP APIs each get an ``Edge`` with their
protocol's refusals (``Answers``); the two share the server's ``Gate`` and metrics."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor import errors, tracing
from conveyor.protocols import auth
from conveyor.protocols.rest import render
from conveyor.server import deadline
from conveyor.server.metrics import Metrics

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/livez", "/readyz", "/metrics", "/v1/openapi.json", "/SimpleNotificationService.pem"})
# The dashboard's page and its static files hold no data: a browser loads them without
# credentials, then the page asks for a token and sends it on every /ui/api call.
OPEN_PREFIXES = ("/ui/static/", "/SimpleNotificationService-")  # the SNS certificate by its digest
UI_PAGES = frozenset({"/ui", "/ui/"})


def open_to_all(path: str) -> bool:
    """Whether a path is served without authentication."""
    return path in OPEN_PATHS or path in UI_PAGES or path.startswith(OPEN_PREFIXES)


async def reply(send: Send, status: int, error: str, code: str,
                headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    """A REST error answered from the edge (the REST API's error body)."""
    body = orjson.dumps({"error": error, "code": code})
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


def _route_label(scope: Scope) -> str:
    label = scope.get("conveyor.route")  # set by the app's short path for the AWS endpoints
    if label is not None:
        return label
    route = scope.get("route")
    template = getattr(route, "path", None)
    if template is None:
        return "unmatched"
    return scope.get("root_path", "") + template


class Gate:
    """The requests in progress in one server process, against a limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0


Refuse = Callable[[Scope, Receive, Send], Awaitable[None]]


async def refuse_rest(scope: Scope, receive: Receive, send: Send) -> None:
    """The answer to an overloaded server on the plain-HTTP APIs: REST's 503 with
    Retry-After; for Queen's API (/api/), the 429 with Retry-After its clients back off on."""
    status = 429 if scope["path"].startswith("/api/") else 503
    await reply(send, status, "the server is overloaded: too many requests in progress; retry later", "Throttled",
                ((b"retry-after", b"1"),))


async def timeout_rest(scope: Scope, receive: Receive, send: Send) -> None:
    await reply(send, 408, "the request took longer than the server's request timeout; retry it", "RequestTimeout")


@dataclasses.dataclass(frozen=True)
class Answers:
    """A protocol's answers from the edge: to a request refused by admission control
    (SQS RequestThrottled, SNS Throttled, REST 503, Queen 429), and to one cut by the
    deadline (the protocol's 408)."""

    refused: Refuse
    timed_out: Refuse


REST_ANSWERS = Answers(refuse_rest, timeout_rest)


@dataclasses.dataclass(frozen=True)
class Limits:
    """The edge's settings: requests in progress (``gate``, shared by every protocol),
    seconds before a request is cancelled (0: never), bytes of a request body."""

    gate: Gate
    request_timeout: float
    body_bytes: int


def _too_large(limit: int) -> HTTPException:
    return HTTPException(413, f"request body larger than {limit} bytes")


class Edge:
    """Every request, in order:

    - **telemetry**: ``http_requests_total``, ``http_request_duration_seconds`` (labelled by
      route template, so the set of series stays small), ``http_connections_active``, and
      the request's span when tracing is on;
    - **admission**: beyond ``gate.limit`` requests in progress (long polls included), a
      request is refused at once in its protocol's terms and counted in
      ``conveyor_admission_refused_total{stage="requests"}`` (fusion and the pool count
      theirs as ``fusion`` and ``pool``). Health and metrics always pass;
    - **the deadline** (seed 000's TimeoutLayer): a request still running after
      ``request_timeout`` seconds is cancelled and answered 408 in its protocol's terms,
      unless its answer has begun; long-poll waits do not count (``deadline.waiting``);
    - **the body limit**: a body over ``body_bytes``, announced by Content-Length or
      discovered while streaming, is refused where it is read, as an ``HTTPException`` 413,
      so that each protocol answers it in its own format; an announced length over the
      limit is refused before a byte is read. A body whose announced length is within the
      limit is read as is (the HTTP parser delivers no more than it announced);
    - **authentication** (``policy``, the plain-HTTP APIs; the AWS endpoints ask the same
      policy in AWS's terms): the identity proven is left in the scope
      (``conveyor.identity``) for the handlers' role checks; missing or wrong credentials
      are 401 with a ``WWW-Authenticate`` challenge and the REST error body. Health,
      metrics, the OpenAPI document, the dashboard's page and the SNS certificate stay open.
    """

    def __init__(self, app: ASGIApp, *, metrics: Metrics, limits: Limits, answers: Answers,
                 policy: auth.Policy | None = None) -> None:
        self.app = app
        self.metrics = metrics
        self.limits = limits
        self.answers = answers
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not tracing.enabled():
            await self._observe(scope, receive, send, None)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        with tracing.request_span(scope["method"], scope["path"], headers) as span:
            await self._observe(scope, receive, send, span)

    async def _observe(self, scope: Scope, receive: Receive, send: Send, span: Any) -> None:
        status = 500
        answered = False

        async def sender(message: Message) -> None:
            nonlocal status, answered
            if message["type"] == "http.response.start":
                status = message["status"]
            answered = True
            await send(message)

        metrics = self.metrics
        metrics.http_active.inc()
        started = time.perf_counter()
        try:
            await self._admit(scope, receive, sender, lambda: answered)
        finally:
            metrics.http_active.dec()
            route = _route_label(scope)
            metrics.series(metrics.http_requests, scope["method"], route, str(status)).inc()
            metrics.series(metrics.http_duration, scope["method"], route).observe(time.perf_counter() - started)
            if span is not None:
                span.update_name(f"{scope['method']} {route}")
                span.set_attribute("http.response.status_code", status)
                span.set_attribute("http.route", route)

    async def _admit(self, scope: Scope, receive: Receive, send: Send, answered: Callable[[], bool]) -> None:
        path = scope["path"]
        if path in OPEN_PATHS:
            await self._enter(scope, receive, send)
            return
        limits = self.limits
        gate = limits.gate
        if gate.active >= gate.limit:
            self.metrics.series(self.metrics.admission_refused, "requests").inc()
            await self.answers.refused(scope, receive, send)
            return
        gate.active += 1
        try:
            seconds = limits.request_timeout
            if seconds <= 0:
                await self._enter(scope, receive, send)
                return
            task = deadline.start(seconds)
            cancelling = task.cancelling()
            try:
                await self._enter(scope, receive, send)
            except asyncio.CancelledError:
                if not deadline.end(task, cancelling):
                    raise  # not the deadline's: the client went away, the server stops
                self.metrics.request_timeouts.inc()
                log.warning("%s %s cancelled after %ss (CONVEYOR_REQUEST_TIMEOUT)", scope["method"], path, seconds)
                if not answered():
                    await self.answers.timed_out(scope, receive, send)
            finally:
                deadline.end(task, cancelling)
        finally:
            gate.active -= 1

    async def _enter(self, scope: Scope, receive: Receive, send: Send) -> None:
        length = authorization = None
        chunked = False
        for key, value in scope["headers"]:
            if key == b"content-length":
                length = value
            elif key == b"authorization":
                authorization = value
            elif key == b"transfer-encoding":
                chunked = True
        limit = self.limits.body_bytes
        if length is None or chunked or not length.isdigit() or int(length) > limit:
            receive = _limited(receive, limit, announced_over=length is not None and (
                not length.isdigit() or int(length) > limit))
        if self.policy is not None and not open_to_all(scope["path"]):
            try:
                scope["conveyor.identity"] = self.policy.http(
                    None if authorization is None else authorization.decode("latin-1"))
            except errors.Unauthorized as exc:
                challenge = render.challenge(authorization is not None).encode()
                await reply(send, 401, exc.message, "Unauthorized", ((b"www-authenticate", challenge),))
                return
        await self.app(scope, receive, send)


def _limited(receive: Receive, limit: int, *, announced_over: bool) -> Receive:
    seen = 0

    async def limited_receive() -> Message:
        nonlocal seen
        if announced_over:
            raise _too_large(limit)
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise _too_large(limit)
        return message

    return limited_receive
