"""What the plain-HTTP APIs' endpoint tables share (REST, Queen's API, hq's): each route's
handler behind the role check of the identity the server's edge proved, with Conveyor's
errors answered in the API's own format."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from conveyor import errors
from conveyor.protocols import auth

Handler = Callable[[Request], Awaitable[Response]]


def identity(request: Request) -> auth.Identity:
    """Who the edge proved the caller to be (admin when the server runs without auth)."""
    found: auth.Identity = request.scope.get("conveyor.identity", auth.ADMIN)
    return found


def guarded(handler: Handler, role: str, answer: Callable[[Any], Response],
            catches: tuple[type[Exception], ...] = (errors.ConveyorError,)) -> Handler:
    """``handler`` behind its role check (403 ``PermissionDenied`` unless the caller's role
    may act as ``role``), each error in ``catches`` answered by ``answer``."""

    @functools.wraps(handler)
    async def handle(request: Request) -> Response:
        caller = identity(request)
        try:
            if not caller.may(role):
                raise errors.PermissionDenied(f"this needs the {role} role; the caller has {caller.role}")
            return await handler(request)
        except catches as exc:
            return answer(exc)

    return handle
