"""Reading Queen requests: JSON bodies, query parameters, the caller, and rendering
answers and errors the way Queen's clients read them (``{"error": "..."}``)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from conveyor import errors, json_input
from conveyor.protocols.broker import Broker
from conveyor.protocols.rest import render

MAX_PAGE = 10000


def broker(request: Request) -> Broker:
    found: Broker = request.app.state.broker
    return found


def json(content: Any, status: int = 200) -> Response:
    if status == 204:
        return Response(status_code=204)
    return Response(orjson.dumps(content), status_code=status, media_type="application/json")


def error(exc: errors.ConveyorError) -> Response:
    headers = {"Retry-After": "1"} if isinstance(exc, errors.Throttled) else None
    status = 429 if isinstance(exc, errors.Throttled) else render.status_of(exc)
    return Response(orjson.dumps({"error": exc.message, "code": type(exc).__name__}), status_code=status,
                    media_type="application/json", headers=headers)


async def body(request: Request, *, required: bool = True) -> Any:
    raw = await request.body()
    if not raw:
        if required:
            raise errors.InvalidInput("a JSON body is required")
        return {}
    try:
        return json_input.loads(raw)
    except json_input.TooDeep as exc:
        raise errors.InvalidInput(f"the body is {exc.msg}") from None
    except orjson.JSONDecodeError as exc:
        raise errors.InvalidInput(f"the body is not valid JSON ({exc.msg})") from None


async def body_object(request: Request, *, required: bool = True) -> dict[str, Any]:
    data = await body(request, required=required)
    if not isinstance(data, dict):
        raise errors.InvalidInput("the body must be a JSON object")
    return data


def text(request: Request, name: str) -> str | None:
    value = request.query_params.get(name)
    return value if value not in (None, "") else None


def integer(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    value = request.query_params.get(name)
    if value in (None, ""):
        return default
    if not value.lstrip("-").isascii() or not value.lstrip("-").isdigit():
        raise errors.InvalidInput(f"{name} must be a whole number, got {value[:40]!r}")
    n = int(value)
    if not lo <= n <= hi:
        raise errors.InvalidInput(f"{name} must be from {lo} to {hi}, got {n}")
    return n


def flag(request: Request, name: str, default: bool = False) -> bool:
    value = request.query_params.get(name)
    if value in (None, ""):
        return default
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise errors.InvalidInput(f"{name} must be true or false, got {value[:40]!r}")


def instant(value: Any, name: str) -> dt.datetime | None:
    """An ISO 8601 instant (a naive one is UTC), or None."""
    if value in (None, ""):
        return None
    if not isinstance(value, str):
        raise errors.InvalidInput(f"{name} must be an ISO 8601 timestamp")
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise errors.InvalidInput(f"{name} must be an ISO 8601 timestamp, got {value[:60]!r}") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def partition_id(value: str) -> str:
    """A partition id from a path (a UUID), refused cleanly if it is not one."""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise errors.InvalidInput(f"invalid partitionId {value[:60]!r}: not a UUID") from None
