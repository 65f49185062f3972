"""Pure ASGI middleware: request metrics, authentication, request size limits."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import orjson
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor import errors, tracing
from conveyor.protocols import auth
from conveyor.protocols.rest import render
from conveyor.server.metrics import Metrics

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
    """A REST error answered from ASGI middleware (the REST API's error body)."""
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


class Telemetry:
    """http_requests_total, http_request_duration_seconds, http_connections_active."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    def _record(self, method: str, path: str, status: int, seconds: float) -> None:
        # labels are route templates (not raw paths), so the set of series stays small
        m = self.metrics
        m.series(m.http_requests, method, path, str(status)).inc()
        m.series(m.http_duration, method, path).observe(seconds)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        started = time.perf_counter()

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self.metrics.http_active.inc()
        headers = ({k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
                   if tracing.enabled() else {})
        with tracing.request_span(scope["method"], scope["path"], headers) as span:
            try:
                await self.app(scope, receive, send_wrapper)
            finally:
                self.metrics.http_active.dec()
                route = _route_label(scope)
                self._record(scope["method"], route, status, time.perf_counter() - started)
                if span is not None:
                    span.update_name(f"{scope['method']} {route}")
                    span.set_attribute("http.response.status_code", status)
                    span.set_attribute("http.route", route)


class Auth:
    """Authentication of every plain-HTTP route (REST, and any API added beside it) by the
    server's one policy (``conveyor.protocols.auth``); the identity it proves is left in
    the scope (``conveyor.identity``) for the role checks of the handlers. Missing or wrong
    credentials are 401 with a ``WWW-Authenticate`` challenge and the REST error body ("who
    are you?"); a role that may not act is the handlers' 403 ("not allowed"). Health, metrics, the OpenAPI document and the SNS
    certificate stay open; the AWS endpoints never come here (the app's short path) and
    ask the same policy in AWS's terms."""

    def __init__(self, app: ASGIApp, policy: auth.Policy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or open_to_all(scope["path"]):
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        try:
            scope["conveyor.identity"] = self.policy.http(None if header is None else header.decode("latin-1"))
        except errors.Unauthorized as exc:
            challenge = render.challenge(header is not None).encode()
            await reply(send, 401, exc.message, "Unauthorized", ((b"www-authenticate", challenge),))
            return
        await self.app(scope, receive, send)


class Gate:
    """The requests in progress in one server process, against a limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0


Refuse = Callable[[Scope, Receive, Send], Awaitable[None]]


class Admission:
    """Admission control at the edge: beyond ``gate.limit`` requests in progress (long
    polls included), a request is refused at once by ``refuse``, in its protocol's terms
    (SQS RequestThrottled, SNS Throttled, REST 503 with Retry-After), and counted in
    ``conveyor_admission_refused_total{stage="requests"}`` (fusion and the pool count
    theirs as ``fusion`` and ``pool``). Health and metrics always pass."""

    def __init__(self, app: ASGIApp, gate: Gate, refuse: Refuse, metrics: Metrics) -> None:
        self.app = app
        self.gate = gate
        self.refuse = refuse
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        gate = self.gate
        if gate.active >= gate.limit:
            self.metrics.series(self.metrics.admission_refused, "requests").inc()
            await self.refuse(scope, receive, send)
            return
        gate.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            gate.active -= 1


async def refuse_rest(scope: Scope, receive: Receive, send: Send) -> None:
    """The answer to an overloaded server on the plain-HTTP APIs: REST's 503 with
    Retry-After; for Queen's API (/api/), the 429 with Retry-After its clients back off on."""
    status = 429 if scope["path"].startswith("/api/") else 503
    await reply(send, status, "the server is overloaded: too many requests in progress; retry later", "Throttled",
                ((b"retry-after", b"1"),))


class BodyLimit:
    """Reject request bodies over ``limit`` bytes with 413, whether announced by
    Content-Length or discovered while streaming. Either way the rejection is raised where
    the body is read, as an ``HTTPException``, so that each protocol answers it in its own
    format (the REST API's JSON error, an AWS error for SQS and SNS clients); an announced
    length over the limit is refused before a byte of the body is read."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        announced_over = length is not None and (not length.isdigit() or int(length) > self.limit)
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            if announced_over:
                raise HTTPException(413, f"request body larger than {self.limit} bytes")
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise HTTPException(413, f"request body larger than {self.limit} bytes")
            return message

        await self.app(scope, limited_receive, send)
