"""Reading hq requests and answering the way hq does (seed 003; hq's server is axum over
SQLite): query strings read as its ``Query<...>`` extractors read them, path UUIDs as its
``Path<Uuid>``, answers as JSON or an empty 200 (its ``()``), and errors as a status with
a plain-text body (its ``(StatusCode, &str)`` and ``Something went wrong: ...``)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl

import orjson
from starlette.requests import Request
from starlette.responses import Response

from conveyor import errors
from conveyor.protocols.broker import Broker
from conveyor.protocols.rest import render

I64_MAX = 2**63 - 1


class HqError(Exception):
    """An answer in hq's own words and status (e.g. 422 ``max_attempts must be >= 1``):
    hq's, so not part of Conveyor's error tree; rendered at the same edge."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def broker(request: Request) -> Broker:
    found: Broker = request.app.state.broker
    return found


def empty() -> Response:
    """hq's ``()``: 200 with no body."""
    return Response(status_code=200)


def json(content: Any, headers: Mapping[str, str] | None = None) -> Response:
    return raw_json(orjson.dumps(content), headers)


def raw_json(body: bytes, headers: Mapping[str, str] | None = None) -> Response:
    return Response(body, status_code=200, media_type="application/json", headers=headers)


def text(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    return Response(message, status_code=status, media_type="text/plain; charset=utf-8", headers=headers)


def error(exc: errors.ConveyorError | HqError) -> Response:
    """A Conveyor error as hq answers errors: its status, the reason as plain text."""
    if isinstance(exc, HqError):
        return text(exc.status, exc.message)
    if isinstance(exc, errors.Throttled):
        return text(503, f"Error: {exc.message}", {"Retry-After": "1"})
    if isinstance(exc, errors.InternalError):
        return text(500, f"Something went wrong: {exc.message}")  # hq's AppError wording
    status = 422 if isinstance(exc, errors.InvalidInput) and not isinstance(exc, errors.MessageTooLarge) \
        else render.status_of(exc)
    return text(status, f"Error: {exc.message}")


def _query_error(reason: str) -> HqError:
    return HqError(400, f"Failed to deserialize query string: {reason}")


def query(request: Request) -> dict[str, str]:
    """The query string as hq's extractors see it: a repeated name is refused."""
    found: dict[str, str] = {}
    try:
        pairs = parse_qsl(request.url.query, keep_blank_values=True, errors="strict")
    except UnicodeDecodeError:
        raise _query_error("invalid UTF-8 in the query string") from None
    for name, value in pairs:
        if name in found:
            raise _query_error(f"duplicate field `{name}`")
        found[name] = value
    return found


def integer(params: Mapping[str, str], name: str, *, required: bool) -> int | None:
    """An i64 parameter, refused with serde's words when absent (if required) or not one."""
    value = params.get(name)
    if value is None:
        if required:
            raise _query_error(f"missing field `{name}`")
        return None
    if value == "":
        raise _query_error(f"{name}: cannot parse integer from empty string")
    digits = value[1:] if value[:1] in "+-" else value
    if not digits or not (digits.isascii() and digits.isdigit()):
        raise _query_error(f"{name}: invalid digit found in string")
    n = int(value)
    if not -I64_MAX - 1 <= n <= I64_MAX:
        raise _query_error(f"{name}: number too {'large' if n > 0 else 'small'} to fit in target type")
    return n


def string(params: Mapping[str, str], name: str) -> str:
    value = params.get(name)
    if value is None:
        raise _query_error(f"missing field `{name}`")
    return value


def in_range(name: str, value: int | None, hi: int) -> None:
    """hq's bound (>= 1, answered 422) and Conveyor's upper one, in the same words."""
    if value is None:
        return
    if value < 1:
        raise HqError(422, f"{name} must be >= 1")
    if value > hi:
        raise HqError(422, f"{name} must be <= {hi}")


def message_id(request: Request) -> uuid.UUID:
    """The ``{id}`` of a /messages route, a UUID as hq's ``Path<Uuid>`` takes it."""
    value = request.path_params["id"]
    try:
        return uuid.UUID(value)
    except ValueError:
        raise HqError(400, f"Invalid URL: UUID parsing failed: {value[:60]!r} is not a UUID") from None


def timestamp(at: dt.datetime) -> str:
    """A time as hq's SQLite columns hold them (``STRFTIME('%Y-%m-%d %H:%M:%f')``, UTC)."""
    utc = at.astimezone(dt.UTC)
    return utc.strftime("%Y-%m-%d %H:%M:%S.") + f"{utc.microsecond // 1000:03d}"
