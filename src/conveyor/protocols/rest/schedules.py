"""REST handlers for schedules: /v1/schedules[/{name}[/runs]] and /v1/previews.

POST creates strictly (201 + Location, 409 if the name is taken); PUT creates or replaces
the whole configuration (201 created, 200 replaced; the same configuration again changes
nothing); PATCH changes some fields ({"status": "paused"} pauses, "active" resumes);
DELETE is idempotent (204 either way); POST .../runs fires once now, out of band (202).
Timestamps are ISO 8601 with an offset; expressions are described in docs/schedules.md.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from conveyor import errors, types
from conveyor.core import schedule_expr, schedules
from conveyor.protocols.rest import models, render
from conveyor.protocols.rest import request as req
from conveyor.protocols.rest.context import broker

_NAME = re.compile(models.SCHEDULE_NAME_PATTERN)
_SHAPES = schedule_expr.SHAPES


# -- rendering -------------------------------------------------------------------------

def _message(s: types.Schedule) -> Any:
    return orjson.Fragment(s.body) if s.content_type == types.JSON_CONTENT_TYPE else s.body


def _warned(shown: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    """A created or changed schedule, with what will go wrong when it fires, if anything."""
    return {**shown, "warnings": warnings} if warnings else shown


def _schedule(s: types.Schedule) -> dict[str, Any]:
    return {
        "name": s.name, "kind": s.canonical.kind, "expression": {k: str(v) for k, v in s.expression.items()},
        "cron": s.cron, "timezone": s.timezone, "fire_at": s.fire_at, "human_readable": schedules.describe(s),
        "target_kind": s.target_kind, "target": s.target, "message": _message(s), "headers": s.headers,
        "group_id": s.group_id, "status": s.status, "catchup": s.catchup, "catchup_limit": s.catchup_limit,
        "failure_threshold": s.failure_threshold, "consecutive_failures": s.consecutive_failures,
        "last_error": s.last_error, "last_error_at": s.last_error_at, "last_fired_at": s.last_fired_at,
        "fire_count": s.fire_count, "next_fire_at": s.next_fire_at, "next_fires": schedules.upcoming(s),
        "created_at": s.created_at, "updated_at": s.updated_at,
    }


def _location(name: str) -> dict[str, str]:
    return {"Location": f"/v1/schedules/{name}"}


# -- request values --------------------------------------------------------------------

def _name(request: Request) -> str:
    name = str(request.path_params["name"])
    if not _NAME.fullmatch(name):
        raise errors.InvalidInput(f"invalid schedule name {name[:130]!r} in the path: use 1 to 128 characters "
                                  "of A-Z, a-z, 0-9 and _ - . :, not starting with a dot")
    return name


def _expression(body: models._ScheduleExpressionIn, default_timezone: str | None = None) -> types.ScheduleExpression:
    return schedule_expr.parse(cron=body.cron, every=body.every, when=body.when, fire_at=body.fire_at,
                               timezone=body.timezone if body.timezone is not None else default_timezone)


def _body(message: Any) -> tuple[str, str | None]:
    if isinstance(message, str):
        return message, None
    return orjson.dumps(message).decode(), types.JSON_CONTENT_TYPE


def _spec(body: models.ScheduleIn, status: str | None) -> types.ScheduleSpec:
    text, content_type = _body(body.message)
    return types.ScheduleSpec(
        expression=_expression(body), target=body.target, target_kind=body.target_kind, body=text,
        content_type=content_type, headers=body.headers, group_id=body.group_id, status=status,
        catchup=body.catchup, catchup_limit=body.catchup_limit, failure_threshold=body.failure_threshold)


def _changes(patch: models.SchedulePatch, current: types.Schedule) -> types.ScheduleChanges:
    given = patch.model_fields_set
    nulls = sorted(k for k in given - {"headers", "message"} if getattr(patch, k) is None)
    if nulls:
        raise errors.InvalidInput(f"invalid request: {', '.join(nulls)} cannot be null (leave it out to keep it)")
    expression = None
    if given & {*_SHAPES, "timezone"}:
        if not given & set(_SHAPES):  # a new time zone for the expression as it was written
            shape = next((k for k in _SHAPES if k in current.expression), "cron")
            value = current.expression.get(shape) or current.cron or current.fire_at
            patch = patch.model_copy(update={shape: str(value)})
        expression = _expression(patch, default_timezone=current.timezone)
    body = content_type = None
    if "message" in given:
        body, content_type = _body(patch.message)
        content_type = content_type or ""  # "": no content type (a text body)
    return types.ScheduleChanges(
        expression=expression, target=patch.target, target_kind=patch.target_kind, body=body,
        content_type=content_type, headers=({} if patch.headers is None else patch.headers) if "headers" in given
        else None, group_id=patch.group_id, status=patch.status, catchup=patch.catchup,
        catchup_limit=patch.catchup_limit, failure_threshold=patch.failure_threshold)


# -- handlers --------------------------------------------------------------------------

async def list_schedules(request: Request) -> Response:
    q = req.query(request, models.ScheduleListQuery)
    async with broker(request).connection() as conn:
        found = await schedules.list_all(conn, status=q.status, target_kind=q.target_kind,
                                         name_prefix=q.name_prefix, limit=q.limit)
    return render.json([_schedule(s) for s in found])


async def create_schedule(request: Request) -> Response:
    body = await req.body(request, models.ScheduleCreate)
    spec = _spec(body, body.status or "active")
    async with broker(request).connection() as conn:
        s = await schedules.create(conn, body.name, spec)
        warnings = await schedules.warnings(conn, s)
    return render.json(_warned(_schedule(s), warnings), 201, headers=_location(s.name))


async def get_schedule(request: Request) -> Response:
    name = _name(request)
    async with broker(request).connection() as conn:
        s = await schedules.get(conn, name)
    return render.json(_schedule(s))


async def put_schedule(request: Request) -> Response:
    name = _name(request)
    body = await req.body(request, models.ScheduleIn)
    spec = _spec(body, body.status)  # None: a new schedule is active, an existing one keeps its status
    async with broker(request).connection() as conn:
        s, created = await schedules.upsert(conn, name, spec)
        warnings = await schedules.warnings(conn, s)
    return render.json(_warned(_schedule(s), warnings), 201 if created else 200,
                       headers=_location(s.name) if created else None)


async def patch_schedule(request: Request) -> Response:
    name = _name(request)
    patch = await req.body(request, models.SchedulePatch)
    async with broker(request).connection() as conn:
        changes = _changes(patch, await schedules.get(conn, name))
        s = await schedules.alter(conn, name, changes)
        warnings = await schedules.warnings(conn, s)
    return render.json(_warned(_schedule(s), warnings))


async def delete_schedule(request: Request) -> Response:
    name = _name(request)
    async with broker(request).connection() as conn:
        await schedules.drop(conn, name)
    return Response(status_code=204)


async def run_schedule(request: Request) -> Response:
    name = _name(request)
    b = broker(request)
    urls = b.topic_urls(f"{request.url.scheme}://{request.url.netloc}")

    async def publish(conn: Any, routing_key: str, publication: types.Publication) -> types.Published:
        # through the broker: signed with the server's key, counted in its metrics
        return await b.publish(routing_key, publication, urls)

    async with b.connection() as conn:
        run = await schedules.run(conn, name, publish=publish)
    return render.json({
        "schedule": run.schedule, "scheduled_for": run.scheduled_for, "out_of_band": True,
        "target_kind": run.target_kind, "target": run.target, "message_id": run.message_id,
        "msg_ids": list(run.ids), "queues": list(run.queues)}, 202)


async def preview(request: Request) -> Response:
    body = await req.body(request, models.PreviewIn)
    expr = _expression(body)
    after = dt.datetime.now(dt.UTC) if body.after is None else schedule_expr.parse_instant(
        body.after, expr.timezone)
    return render.json({
        "kind": expr.kind, "cron": expr.cron, "timezone": expr.timezone, "fire_at": expr.fire_at,
        "human_readable": schedule_expr.describe(expr),
        "next_fires": schedule_expr.next_fires(expr, after, body.count)})
