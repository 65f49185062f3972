"""Schedule operations: configuration (create, upsert, alter, pause, resume, drop, get,
list), manual runs, and the scheduler's step, ``fire_due``.

Every operation that depends on the time takes ``now`` (default: the wall clock), so
tests drive the clock; the SQL functions take the instants computed here and never read
the clock themselves where it matters.

``fire_due`` is one transaction: claim the due schedules (``FOR UPDATE SKIP LOCKED``, so
several schedulers share the work and none fires a row twice), then for each one, in
its own savepoint, send its message(s) and advance it; a failure rolls back that
schedule's savepoint only, counts a consecutive failure and pauses the schedule at its
``failure_threshold``. The COMMIT publishes every fire and every advance together.

What a pass fires for a schedule behind by several occurrences: with ``catchup`` on,
the latest ``catchup_limit`` missed occurrences, oldest first; with it off, only the
latest one. A fire that failed is not retried: a cron schedule moves on to its next
occurrence after now, a one-shot tries again a minute later.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from conveyor import errors, types
from conveyor.core import messages, queues, schedule_expr, topics
from conveyor.db import execute as db

Connection = db.Connection
Publisher = Callable[[Connection, str, types.Publication], Awaitable[types.Published]]

log = logging.getLogger(__name__)

UTC = dt.UTC
LIST_MAX = 1000
PREVIEW_COUNT = 5
ONE_SHOT_RETRY = dt.timedelta(seconds=60)
PAST_GRACE = dt.timedelta(seconds=60)  # a fire_at this far in the past is still taken


def _now(now: dt.datetime | None) -> dt.datetime:
    if now is None:
        return dt.datetime.now(UTC)
    if now.tzinfo is None:
        raise ValueError("now must be an aware datetime")
    return now.astimezone(UTC)


def iso(moment: dt.datetime) -> str:
    """An instant as ISO 8601 UTC with a Z (as it appears in headers._schedule)."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


# -- configuration --------------------------------------------------------------------------

def first_fire(expr: types.ScheduleExpression, now: dt.datetime) -> dt.datetime | None:
    """When a schedule with this expression, (re)started at ``now``, fires first."""
    if expr.kind == "once":
        return expr.fire_at
    return schedule_expr.next_after(expr, now)


def _check_fire_at(expr: types.ScheduleExpression, now: dt.datetime) -> None:
    if expr.kind == "once" and expr.fire_at is not None and expr.fire_at < now - PAST_GRACE:
        raise errors.InvalidInput(f"fire_at {iso(expr.fire_at)} is in the past (it is now {iso(now)})")


def _expression_json(expr: types.ScheduleExpression) -> dict[str, Any]:
    return {"expression": expr.source or None, "cron": expr.cron, "timezone": expr.timezone,
            "fire_at": None if expr.fire_at is None else iso(expr.fire_at)}


def _spec_json(spec: types.ScheduleSpec, now: dt.datetime) -> dict[str, Any]:
    """The SQL API's specification object for a whole configuration."""
    nxt = first_fire(spec.expression, now)
    out = {
        **_expression_json(spec.expression),
        "target_kind": spec.target_kind, "target": spec.target, "body": spec.body,
        "content_type": spec.content_type, "headers": spec.headers, "group_id": spec.group_id,
        "status": spec.status, "catchup": spec.catchup, "catchup_limit": spec.catchup_limit,
        "failure_threshold": spec.failure_threshold, "next_fire_at": None if nxt is None else iso(nxt),
    }
    if spec.status is None:  # upsert: a new schedule is active, an existing one keeps its status
        del out["status"]
    return out


def _changes_json(changes: types.ScheduleChanges, current: types.Schedule, now: dt.datetime) -> dict[str, Any]:
    """The SQL API's specification object for a partial update (None: unchanged)."""
    spec: dict[str, Any] = {}
    if changes.expression is not None:
        spec.update(_expression_json(changes.expression))
    for key in ("target", "target_kind", "body", "content_type", "headers", "group_id", "status", "catchup",
                "catchup_limit", "failure_threshold"):
        value = getattr(changes, key)
        if value is not None:
            spec[key] = value
    nxt = first_fire(changes.expression or current.canonical, now)
    spec["next_fire_at"] = None if nxt is None else iso(nxt)
    return spec


async def create(conn: Connection, name: str, spec: types.ScheduleSpec, *,
                 now: dt.datetime | None = None) -> types.Schedule:
    """Create a schedule; ScheduleAlreadyExists if the name is taken."""
    now = _now(now)
    _check_fire_at(spec.expression, now)
    return await db.fetch_row(conn, "schedule_create", {"name": name, "spec": _spec_json(spec, now)},
                              row=types.Schedule)


async def warnings(conn: Connection, s: types.Schedule) -> list[str]:
    """What will go wrong when ``s`` fires, said when it is created or changed rather than
    found at its first fire: a queue target that does not exist (yet)."""
    if s.target_kind != "queue":
        return []
    try:
        await queues.get(conn, s.target)
    except errors.QueueNotFound:
        return [f"queue {s.target!r} does not exist: each fire fails until it is created "
                f"(the schedule pauses after {s.failure_threshold} failures in a row)"]
    return []


async def upsert(conn: Connection, name: str, spec: types.ScheduleSpec, *,
                 now: dt.datetime | None = None) -> tuple[types.Schedule, bool]:
    """Create a schedule or replace its configuration; (the schedule, whether it was
    created). Replacing with the same expression keeps its next fire time and state."""
    now = _now(now)
    _check_fire_at(spec.expression, now)
    async with conn.transaction():
        created = bool(await db.fetch_value(conn, "schedule_upsert", {"name": name, "spec": _spec_json(spec, now)}))
        return await get(conn, name), created


async def alter(conn: Connection, name: str, changes: types.ScheduleChanges, *,
                now: dt.datetime | None = None) -> types.Schedule:
    """Change some fields. A new expression, or a resume, restarts the schedule from
    ``now`` (missed occurrences are not caught up)."""
    now = _now(now)
    if changes.expression is not None:
        _check_fire_at(changes.expression, now)
    async with conn.transaction():
        current = await get(conn, name)
        return await db.fetch_row(conn, "schedule_alter",
                                  {"name": name, "spec": _changes_json(changes, current, now)}, row=types.Schedule)


async def pause(conn: Connection, name: str) -> types.Schedule:
    return await alter(conn, name, types.ScheduleChanges(status="paused"))


async def resume(conn: Connection, name: str, *, now: dt.datetime | None = None) -> types.Schedule:
    """Resume from the next occurrence after ``now``; the failure count starts again."""
    return await alter(conn, name, types.ScheduleChanges(status="active"), now=now)


async def drop(conn: Connection, name: str) -> bool:
    return bool(await db.fetch_value(conn, "schedule_drop", {"name": name}))


async def get(conn: Connection, name: str) -> types.Schedule:
    return await db.fetch_row(conn, "schedule_get", {"name": name}, row=types.Schedule)


async def list_all(conn: Connection, *, status: str | None = None, target_kind: str | None = None,
                   name_prefix: str | None = None, limit: int = LIST_MAX) -> list[types.Schedule]:
    """Schedules by name, at most ``limit`` (capped at LIST_MAX)."""
    return await db.fetch_all(conn, "schedule_list", {
        "status": status, "target_kind": target_kind, "name_prefix": name_prefix,
        "max_rows": max(0, min(limit, LIST_MAX))}, row=types.Schedule)


def upcoming(schedule: types.Schedule, count: int = PREVIEW_COUNT, *,
             now: dt.datetime | None = None) -> list[dt.datetime]:
    """The next ``count`` intended fire times of an active schedule, from its next fire
    time (which may be past, if it is due); none for a paused one."""
    if schedule.status != "active" or count <= 0:
        return []
    expr = schedule.canonical
    try:
        first = schedule.next_fire_at or first_fire(expr, _now(now))
        if first is None:
            return []
        return [first, *schedule_expr.next_fires(expr, first, count - 1)]
    except errors.InvalidInput:  # an expression stored from SQL that does not parse
        return []


def describe(schedule: types.Schedule) -> str:
    try:
        return schedule_expr.describe(schedule.canonical)
    except errors.InvalidInput:
        return f"cron {schedule.cron} ({schedule.timezone})"


# -- fired messages ---------------------------------------------------------------------------

def _headers(s: types.Schedule, scheduled_for: dt.datetime, out_of_band: bool) -> dict[str, Any]:
    return {**(s.headers or {}),
            "_schedule": {"name": s.name, "scheduled_for": iso(scheduled_for), "out_of_band": out_of_band}}


def _dedup_id(s: types.Schedule, scheduled_for: dt.datetime, out_of_band: bool) -> str:
    """FIFO targets: the same intended time deduplicates (a fire is never delivered
    twice within the window); out-of-band runs never do."""
    if out_of_band:
        return uuid.uuid4().hex
    return hashlib.sha256(f"{s.name}\n{iso(scheduled_for)}".encode()).hexdigest()


def _outgoing(s: types.Schedule, scheduled_for: dt.datetime, out_of_band: bool) -> types.OutgoingMessage:
    fifo = s.target.endswith(".fifo")
    return types.OutgoingMessage(
        body=s.body, headers=_headers(s, scheduled_for, out_of_band), content_type=s.content_type,
        group_id=(s.group_id or s.name) if fifo else s.group_id,
        dedup_id=_dedup_id(s, scheduled_for, out_of_band) if fifo else None)



def _publication(s: types.Schedule, scheduled_for: dt.datetime, out_of_band: bool) -> types.Publication:
    """A topic target's message: the headers become message attributes, ``_schedule`` a
    String attribute holding its JSON object (filter policies and subscribers see it)."""
    fifo = s.target.endswith(".fifo")
    return types.Publication(
        body=s.body, content_type=s.content_type,
        attributes={k: topics.header_attribute(v) for k, v in _headers(s, scheduled_for, out_of_band).items()},
        group_id=(s.group_id or s.name) if fifo else s.group_id,
        dedup_id=_dedup_id(s, scheduled_for, out_of_band) if fifo else None)


default_publisher: Publisher = functools.partial(topics.publish, signer=None, urls=types.TopicUrls())


async def _dispatch(conn: Connection, s: types.Schedule, times: Sequence[dt.datetime], out_of_band: bool,
                    publish: Publisher | None) -> tuple[str, tuple[int, ...], tuple[str, ...]]:
    """Send one message per intended time; (the last message's id, queue message ids,
    the queues it landed in)."""
    if s.target_kind == "queue":
        sent = await messages.send_batch(conn, s.target, [_outgoing(s, t, out_of_band) for t in times])
        return str(sent[-1].message_uuid), tuple(m.id for m in sent), (s.target,)
    publisher = publish or default_publisher
    landed: dict[str, None] = {}
    message_id = ""
    for t in times:
        published = await publisher(conn, s.target, _publication(s, t, out_of_band))
        message_id = str(published.message_id)
        landed.update(dict.fromkeys(published.queues))
    return message_id, (), tuple(landed)


# -- manual runs ------------------------------------------------------------------------------

async def run(conn: Connection, name: str, *, now: dt.datetime | None = None,
              publish: Publisher | None = None) -> types.ScheduleRun:
    """Fire a schedule now, out of band (``headers._schedule.out_of_band`` true): its next
    fire time, state and failure count stay as they are. Paused schedules run too."""
    now = _now(now)
    s = await get(conn, name)
    async with conn.transaction():
        message_id, ids, queues = await _dispatch(conn, s, [now], True, publish)
    return types.ScheduleRun(schedule=s.name, scheduled_for=now, target_kind=s.target_kind, target=s.target,
                             message_id=message_id, ids=ids, queues=queues)


# -- the scheduler's step ---------------------------------------------------------------------

def _plan(s: types.Schedule, now: dt.datetime) -> tuple[list[dt.datetime], dt.datetime | None]:
    """(the intended times to fire now, the next fire time after them)."""
    expr = s.canonical
    if s.next_fire_at is None:  # created from SQL: compute its first fire time only
        return [], first_fire(expr, now)
    if expr.kind == "once":
        return [s.fire_at or s.next_fire_at], None
    keep = s.catchup_limit if s.catchup else 1
    return schedule_expr.due(expr, s.next_fire_at, now, keep), schedule_expr.next_after(expr, now)


def _retry_at(s: types.Schedule, now: dt.datetime) -> dt.datetime:
    if s.fire_at is None:
        try:
            nxt = schedule_expr.next_after(s.canonical, now)
            if nxt is not None:
                return nxt
        except errors.InvalidInput:
            pass
    return now + ONE_SHOT_RETRY


async def _fire_one(conn: Connection, s: types.Schedule, now: dt.datetime,
                    publish: Publisher | None) -> types.ScheduleFiring:
    try:
        times, nxt = _plan(s, now)
        async with conn.transaction():  # a savepoint: a failure undoes this schedule's work only
            if times:
                await _dispatch(conn, s, times, False, publish)
            await db.fetch_value(conn, "schedule_advance", {"name": s.name, "fired": times, "next_fire_at": nxt})
        return types.ScheduleFiring(name=s.name, fired=tuple(times), next_fire_at=nxt)
    except errors.Unavailable:
        raise  # the connection is gone: the whole pass rolls back and is retried
    except errors.ConveyorError as exc:
        error = f"{type(exc).__name__}: {exc.message}"
    except Exception as exc:  # a bug must not stop the other schedules
        log.exception("schedule %r failed", s.name)
        error = f"internal error: {type(exc).__name__}"
    retry_at = _retry_at(s, now)
    status = await db.fetch_value(conn, "schedule_failed",
                                  {"name": s.name, "error": error, "next_fire_at": retry_at, "at": now})
    if status == "paused":
        log.warning("schedule %r paused after %d consecutive failures: %s", s.name, s.failure_threshold, error)
    return types.ScheduleFiring(name=s.name, fired=(), next_fire_at=retry_at, error=error,
                                paused=status == "paused")


async def fire_due(conn: Connection, *, now: dt.datetime | None = None, batch_size: int = 32,
                   publish: Publisher | None = None) -> list[types.ScheduleFiring]:
    """One scheduler pass at ``now``: fire up to ``batch_size`` due schedules, in one
    transaction (see the module's docstring). ``publish`` sends topic targets' messages
    (default: unsigned envelopes with the default URLs; the server passes its own)."""
    now = _now(now)
    async with conn.transaction():
        claimed = await db.fetch_all(conn, "schedule_claim", {"at": now, "max_rows": batch_size},
                                     row=types.Schedule)
        return [await _fire_one(conn, s, now, publish) for s in claimed]
