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
    database = request.app.state.database
    try:
        async with asyncio.timeout(READY_TIMEOUT):
            await database.ping(READY_TIMEOUT)
    except (errors.ConveyorError, TimeoutError):
        return render.json({"status": "degraded", "database": "unreachable"}, 503)
    return render.json({"status": "ok", "database": "ok"})


async def metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE)
