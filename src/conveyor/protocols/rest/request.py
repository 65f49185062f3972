"""Reading REST requests: JSON bodies, query strings and path values, validated against
the models, every problem reported as ``InvalidInput`` naming the field."""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
import pydantic
from starlette.requests import Request

from conveyor import errors, json_input

M = TypeVar("M", bound=pydantic.BaseModel)


def _describe(exc: pydantic.ValidationError) -> str:
    problems = []
    for e in exc.errors(include_url=False)[:5]:
        where = ".".join(str(p) for p in e["loc"]) or "body"
        problems.append(f"{where}: {e['msg']}")
    return "; ".join(problems)


def validate(model: type[M], data: Any) -> M:
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        raise errors.InvalidInput(f"invalid request: {_describe(exc)}") from None


def parse(raw: bytes) -> Any:
    """A request body as JSON (``conveyor.json_input``: nested at most its ``MAX_DEPTH``
    deep), or ``InvalidInput``."""
    try:
        return json_input.loads(raw)
    except json_input.TooDeep as exc:
        raise errors.InvalidInput(f"invalid request: the body is {exc.msg}") from None
    except orjson.JSONDecodeError as exc:
        raise errors.InvalidInput(f"invalid request: the body is not valid JSON ({exc.msg})") from None


async def body(request: Request, model: type[M]) -> M:
    raw = await request.body()
    if not raw:
        raise errors.InvalidInput("invalid request: a JSON body is required")
    return validate(model, parse(raw))


def query(request: Request, model: type[M]) -> M:
    return validate(model, dict(request.query_params))


def path_id(request: Request, key: str = "id", what: str = "message id") -> int:
    """A positive 64-bit integer from the path: ASCII digits only (``"²".isdigit()`` is
    true, and ``int("٣")`` is 3), or ``InvalidInput`` naming what was expected. The one
    parser of every id in a REST path."""
    raw = request.path_params[key]
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 19) or not 1 <= int(raw) <= 2**63 - 1:
        raise errors.InvalidInput(f"invalid {what} {raw[:40]!r} in the path: expected a positive integer")
    return int(raw)


def message_id(request: Request) -> int:
    return path_id(request, "id", "message id")


def queue_name(request: Request) -> str:
    return str(request.path_params["name"])
