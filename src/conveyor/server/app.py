"""Assembles the ASGI application: routes, middleware, lifespan (pool, migrations,
broker, workers)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Collection
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

import conveyor
from conveyor import errors, tracing
from conveyor.db import migrate
from conveyor.db.pool import Database
from conveyor.protocols import auth, jwt_tokens
from conveyor.protocols.aws import gateway as aws_gateway
from conveyor.protocols.aws import service as aws_service
from conveyor.protocols.hq import routes as hq
from conveyor.protocols.queen import routes as queen
from conveyor.protocols.rest import render
from conveyor.protocols.rest import routes as rest
from conveyor.protocols.sns import certificate as sns_certificate
from conveyor.server import health, middleware, routing, scheduler, ui, webhooks, workers
from conveyor.server.broker import ServerBroker
from conveyor.server.metrics import Metrics
from conveyor.server.supervisor import Supervisor
from conveyor.settings import Settings

log = logging.getLogger(__name__)


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return render.error(errors.InternalError("internal error"))


async def _aws_throttled(scope: Scope, receive: Receive, send: Send) -> None:
    response = aws_gateway.unread(Request(scope, receive), "Throttled",
                                  "The server is overloaded: too many requests in progress; retry later.")
    await response(scope, receive, send)


async def _aws_timeout(scope: Scope, receive: Receive, send: Send) -> None:
    response = aws_gateway.unread(Request(scope, receive), "RequestTimeout",
                                  "The request took longer than the server's request timeout; retry it.")
    await response(scope, receive, send)


async def _aws_endpoint(scope: Scope, receive: Receive, send: Send) -> None:
    """The AWS wire endpoint as plain ASGI, answering as Starlette's handlers would."""
    request = Request(scope, receive)
    try:
        response = await aws_gateway.endpoint(request)
    except Exception as exc:  # noqa: BLE001 - the gateway answers its own errors; this is a bug
        response = await _internal_error(request, exc)
    await response(scope, receive, send)


def _aws_path(path: str) -> dict[str, str] | None:
    """The path parameters of an AWS wire path (``/``, ``/{account_id}/{queue_name}``, and
    a queue URL of a region: ``/queue/{region}/{account_id}/{queue_name}``)."""
    if path == "/":
        return {}
    parts = path[1:].split("/")
    if len(parts) == 4 and parts[0] == "queue" and all(parts[1:]):
        return {"region": parts[1], "account_id": parts[2], "queue_name": parts[3]}
    if len(parts) == 2 and all(parts) and parts[0] not in ("v1", "hq"):
        return {"account_id": parts[0], "queue_name": parts[1]}
    return None


def _aws_route(params: dict[str, str]) -> str:
    if not params:
        return "/"
    return "/queue/{region}/{account_id}/{queue_name}" if "region" in params else "/{account_id}/{queue_name}"


_EVERY_PORT = frozenset({"/livez", "/readyz", "/metrics"})


def _browser_at_root(scope: Scope) -> bool:
    """A person's browser opening the address the server logs: ``GET /`` without AWS's
    query parameters, asking for HTML. SDKs and the aws CLI send either a query
    (``?Action=...``) or no ``text/html`` in Accept, so they still reach the SQS/SNS gateway."""
    if scope["method"] != "GET" or scope["path"] != "/" or scope.get("query_string"):
        return False
    accept = next((v for k, v in scope["headers"] if k == b"accept"), b"")
    return b"text/html" in accept


async def _to_dashboard(scope: Scope, receive: Receive, send: Send) -> None:
    await RedirectResponse("/ui/", status_code=303)(scope, receive, send)


class App(Starlette):
    """Starlette, with the AWS wire endpoints (``GET``/``POST`` on ``/`` and
    ``/{account_id}/{queue_name}``) taken on a short path: straight to the gateway through
    the edge (``middleware.Edge``, with AWS's refusals), without the router and exception
    middleware that the REST API needs. Those are the hot calls of SQS clients; the layers
    skipped cost 70-100 us of a SendMessage's ~580 us of server CPU (measured in process).
    The mounted plain-HTTP APIs take a short path of their own past Starlette's router to
    their routes (``routing.IndexedRouter``)."""

    def __init__(self, *, aws: ASGIApp, routes: list[BaseRoute], indexed: Collection[str],
                 lifespan: Any, hq_port: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.router = routing.IndexedRouter(routes, indexed=indexed, lifespan=lifespan, on_error=_internal_error)
        self._aws = aws
        self._hq_port = hq_port

    def _on_hq_port(self, scope: Scope) -> bool:
        """Whether a request came to the hq port (whose root is hq's API) for other than
        health and metrics, which every port serves."""
        server = scope.get("server")
        return (self._hq_port is not None and server is not None and server[1] == self._hq_port
                and scope["path"] not in _EVERY_PORT)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self._on_hq_port(scope):
            scope = hq.at_root(scope)  # then served as /hq/..., through the same middleware
        if scope["type"] == "http" and scope["method"] in ("POST", "GET"):
            if _browser_at_root(scope):
                await _to_dashboard(scope, receive, send)
                return
            params = _aws_path(scope["path"])
            if params is not None:
                scope["app"] = self
                scope["path_params"] = params
                scope["conveyor.route"] = _aws_route(params)
                await self._aws(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


async def _startup(settings: Settings, database: Database, open_timeout: float) -> None:
    await database.open(wait=True, timeout=open_timeout)
    async with database.connection() as conn:
        try:
            if not settings.migrate:
                await migrate.verify(conn)
                return
            applied = await migrate.migrate(conn, dialects=settings.dialects)
        except errors.SchemaMismatch as exc:
            log.critical("%s", exc.message)
            raise
    for m in applied:
        log.info("applied %s %s", "functions file" if m.functions else "migration", m.label)


def _jwt_config(settings: Settings) -> jwt_tokens.JwtConfig | None:
    if settings.auth_mode != "jwt":
        return None
    return jwt_tokens.JwtConfig(
        secret=settings.jwt_secret, public_key=settings.jwt_public_key, algorithms=settings.jwt_algorithms,
        role_claim=settings.jwt_role_claim, roles=settings.jwt_roles or jwt_tokens.DEFAULT_ROLES,
        audience=settings.jwt_audience, issuer=settings.jwt_issuer, leeway=settings.jwt_leeway)


def create_app(settings: Settings, dsn: str, *, open_timeout: float = 30.0, first_worker: bool = True) -> App:
    metrics = Metrics()
    database = Database(dsn, min_size=settings.pool_min, max_size=settings.pool_max,
                        max_waiting=settings.pool_max_waiting,
                        on_throttled=lambda: metrics.series(metrics.admission_refused, "pool").inc())
    metrics.watch_pool(database.stats)
    broker = ServerBroker(settings, database, metrics)
    supervisor = Supervisor(metrics)
    limits = middleware.Limits(gate=middleware.Gate(settings.max_requests),  # requests in progress, every protocol
                               request_timeout=settings.request_timeout, body_bytes=settings.max_request_bytes)
    policy = auth.Policy(settings.auth_mode, settings.auth_tokens, settings.aws_credentials, _jwt_config(settings))
    if policy.takes_bearers and not settings.aws_credentials:
        log.warning("auth mode %s without CONVEYOR_AWS_CREDENTIALS: SQS and SNS requests are refused "
                    "unless they carry a bearer token", settings.auth_mode)

    provider = tracing.configure(settings.tracing, settings.tracing_endpoint, settings.tracing_sample_rate)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await _startup(settings, database, open_timeout)
        await broker.start()
        workers.start(supervisor, database, metrics, maintenance_interval=settings.maintenance_interval,
                              depth_interval=settings.depth_scrape_interval, first=first_worker,
                              stream_intervals=(settings.stream_tick_interval, settings.stream_maint_interval),
                              vacuum_interval=settings.vacuum_interval,
                              webhook_config=webhooks.config_from(
                                  settings.webhook_allow, timeout=settings.webhook_timeout,
                                  batch=settings.webhook_batch, poll=settings.webhook_poll,
                                  region=settings.region),
                              scheduler_config=scheduler.config_from(settings, broker.topic_urls(), broker.signer),
                              history_config=(settings.history_interval, settings.history_retention))
        try:
            yield
        finally:
            await supervisor.stop()
            await broker.stop()
            await database.close()
            if provider is not None:
                provider.shutdown()  # flushes the spans still batched

    v1 = rest.app(broker, conveyor.__version__)
    v1.add_exception_handler(Exception, _internal_error)
    queen_v1 = queen.app(broker, queen.messages.CreateOnPush(settings.queen_create_on_push,
                                                             settings.queen_create_per_push))
    queen_v1.add_exception_handler(Exception, _internal_error)
    hq_api = hq.app(broker)
    app = App(
        aws=middleware.Edge(_aws_endpoint, metrics=metrics, limits=limits,
                            answers=middleware.Answers(_aws_throttled, _aws_timeout)),
        routes=[
            Route("/livez", health.livez, methods=["GET"]),
            Route("/readyz", health.readyz, methods=["GET"]),
            Route("/metrics", health.metrics, methods=["GET"]),
            Mount("/v1", v1),
            Mount("/api/v1", queen_v1),  # Queen's HTTP API (docs/queen.md)
            Mount(hq.PREFIX, hq_api),  # hq's HTTP API, also at the root of the hq port (docs/dialects/hq.md)
            Route("/SimpleNotificationService.pem", sns_certificate.certificate, methods=["GET"]),
            Route("/SimpleNotificationService-{digest}.pem", sns_certificate.certificate, methods=["GET"]),
            Mount("/ui", ui.app(broker, settings.auth_mode, settings.history_interval)),  # docs/dashboard.md
        ],
        indexed=("/v1", "/api/v1", hq.PREFIX),  # the APIs' short path to their routes (server/routing.py)
        middleware=[
            Middleware(ui.SecurityHeaders, prefix="/ui"),  # outermost: the server's refusals of /ui too
            Middleware(middleware.Edge, metrics=metrics, limits=limits, answers=middleware.REST_ANSWERS,
                       policy=policy),
        ],
        exception_handlers={Exception: _internal_error, HTTPException: rest.http_error},
        lifespan=lifespan,
        hq_port=settings.hq_port,
    )
    app.state.aws = aws_service.Endpoint(  # what the SQS and SNS endpoints know of the server
        broker=broker, region=settings.region, account_id=settings.account_id, base_url=settings.base_url,
        policy=policy)
    app.state.version = conveyor.__version__
    app.state.database = database
    app.state.metrics = metrics
    app.state.broker = broker
    app.state.supervisor = supervisor
    app.state.settings = settings
    return app
