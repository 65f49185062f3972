"""/livez, /readyz and /metrics: unauthenticated, for orchestrators and scrapers."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response

from conveyor import errors
from conveyor.protocols.rest import render
from conveyor.server.metrics import CONTENT_TYPE

READY_TIMEOUT = 2.0


async def livez(request: Request) -> Response:
    return render.json({"status": "ok", "version": request.app.state.version})


async def readyz(request: Request) -> Response:
    """Ready when the database answers and every background worker runs (a worker that
    failed and waits to be started again makes the server degraded: it is listed)."""
    database, supervisor = request.app.state.database, request.app.state.supervisor
    reachable = True
    try:
        async with asyncio.timeout(READY_TIMEOUT):
            await database.ping(READY_TIMEOUT)
    except (errors.ConveyorError, TimeoutError):
        reachable = False
    ok = reachable and supervisor.healthy()
    return render.json({"status": "ok" if ok else "degraded", "database": "ok" if reachable else "unreachable",
                        "workers": supervisor.report()}, 200 if ok else 503)


async def metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE)
