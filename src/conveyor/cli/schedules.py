"""``conveyor schedules``: cron, interval, natural-language and one-shot schedules from the
shell — list, create, show, update, pause, resume, delete, run now, and preview an
expression without storing anything. A server's scheduler fires them (the CLI does not).

Expressions (exactly one): --cron '0 9 * * 1-5', --every 15m, --when 'every day at 09:00',
--at 2026-05-01T09:00:00Z; --timezone names the IANA zone they are read in (default UTC).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import click

from conveyor import errors, types
from conveyor.cli import context, output
from conveyor.cli.output import Column
from conveyor.core import schedule_expr, signing, topics
from conveyor.core import schedules as ops

_SHAPE_OPTIONS = ("cron", "every", "when", "at")


# -- JSON and formatting -------------------------------------------------------------------

def _message(s: types.Schedule) -> Any:
    if s.content_type == types.JSON_CONTENT_TYPE:
        try:
            return json.loads(s.body)
        except ValueError:
            return s.body
    return s.body


def data(s: types.Schedule) -> dict[str, Any]:
    """A schedule as JSON (the REST API's shape)."""
    return {
        "name": s.name, "kind": s.canonical.kind, "expression": s.expression, "cron": s.cron,
        "timezone": s.timezone, "fire_at": s.fire_at, "human_readable": ops.describe(s),
        "target_kind": s.target_kind, "target": s.target, "message": _message(s), "headers": s.headers,
        "group_id": s.group_id, "status": s.status, "catchup": s.catchup, "catchup_limit": s.catchup_limit,
        "failure_threshold": s.failure_threshold, "consecutive_failures": s.consecutive_failures,
        "last_error": s.last_error, "last_error_at": s.last_error_at, "last_fired_at": s.last_fired_at,
        "fire_count": s.fire_count, "next_fire_at": s.next_fire_at, "next_fires": ops.upcoming(s),
        "created_at": s.created_at, "updated_at": s.updated_at,
    }


def _when(s: types.Schedule) -> str:
    return f"once at {ops.iso(s.fire_at)}" if s.fire_at is not None else f"{s.cron}"


_LIST_COLUMNS = [
    Column("NAME", "name"),
    Column("STATUS", "status"),
    Column("SCHEDULE", _when),
    Column("TIMEZONE", "timezone"),
    Column("TARGET", lambda s: f"{s.target_kind}:{s.target}"),
    Column("NEXT FIRE", "next_fire_at"),
    Column("FIRED", "fire_count"),
    Column("FAILURES", "consecutive_failures"),
]


def _pairs(s: types.Schedule) -> list[tuple[str, Any]]:
    upcoming = ops.upcoming(s)
    return [
        ("name", s.name),
        ("status", s.status),
        ("written as", ", ".join(f"{k}={v}" for k, v in s.expression.items())),
        ("schedule", _when(s)),
        ("timezone", s.timezone),
        ("in words", ops.describe(s)),
        ("target", f"{s.target_kind} {s.target}"),
        ("message", output.preview(s.body)),
        ("headers", json.dumps(s.headers) if s.headers else None),
        ("group id", s.group_id),
        ("catch-up", f"yes, up to {s.catchup_limit}" if s.catchup else "no"),
        ("failure threshold", s.failure_threshold),
        ("consecutive failures", s.consecutive_failures),
        ("last error", s.last_error),
        ("last error at", s.last_error_at),
        ("last fired for", s.last_fired_at),
        ("fired", s.fire_count),
        ("next fires", ", ".join(t.isoformat(timespec="seconds") for t in upcoming) if upcoming else None),
        ("created at", s.created_at),
        ("updated at", s.updated_at),
    ]


def _emit(obj: Any, s: types.Schedule) -> None:
    output.emit(data(s), obj.as_json, lambda: output.record(_pairs(s)))


def _saved(obj: Any, action: Callable[[Any], Awaitable[types.Schedule]]) -> None:
    """Create or change a schedule, print it, and warn of what will go wrong when it fires."""

    async def save(conn: Any) -> tuple[types.Schedule, list[str]]:
        s = await action(conn)
        return s, await ops.warnings(conn, s)

    s, warnings = context.run(obj.settings(), save)
    _emit(obj, s)
    for warning in warnings:
        output.note(f"warning: {warning}")


# -- options -------------------------------------------------------------------------------

def _apply(f: Callable[..., Any], options: Sequence[Callable[..., Any]]) -> Callable[..., Any]:
    for option in reversed(options):
        f = option(f)
    return f


def expression_options(f: Callable[..., Any]) -> Callable[..., Any]:
    return _apply(f, [
        click.option("--cron", metavar="EXPR", help="Five cron fields, e.g. '0 9 * * 1-5' (or @daily, @hourly...)."),
        click.option("--every", metavar="INTERVAL", help="An interval cron can repeat: 5m, 15m, 2h, 1d, 1w."),
        click.option("--when", metavar="TEXT", help="Plain English: 'every day at 09:00', 'every monday at 8am', "
                                                    "'hourly', 'every 15 minutes'."),
        click.option("--at", metavar="ISO8601", help="Fire once at this instant (without an offset: in --timezone)."),
        click.option("--timezone", "--tz", "timezone", metavar="ZONE", help="IANA time zone (default UTC)."),
    ])


def config_options(f: Callable[..., Any]) -> Callable[..., Any]:
    return _apply(f, [
        click.option("--queue", metavar="NAME", help="Fire into this queue."),
        click.option("--topic", metavar="ROUTING_KEY", help="Publish to this routing key (topic) instead."),
        click.option("--message", metavar="TEXT", help="The body of each fired message, as text."),
        click.option("--message-json", metavar="JSON", help="The body as JSON (default {})."),
        click.option("--header", "headers", multiple=True, metavar="NAME=VALUE",
                     help="A header of each fired message (repeatable)."),
        click.option("--group-id", metavar="ID", help="FIFO queues: the message group (default: the schedule name)."),
        click.option("--catchup/--no-catchup", default=None,
                     help="After downtime, fire missed occurrences (up to --catchup-limit), or only the latest."),
        click.option("--catchup-limit", type=int, metavar="N", help="Missed occurrences fired at most (default 10)."),
        click.option("--failure-threshold", type=int, metavar="N",
                     help="Pause after this many consecutive failed fires (default 5)."),
    ])


def _expression(opts: dict[str, Any], *, required: bool = True,
                default_timezone: str | None = None) -> types.ScheduleExpression | None:
    given = [k for k in _SHAPE_OPTIONS if opts.get(k) is not None]
    if not given and not required:
        return None
    if len(given) != 1:
        raise click.UsageError("give exactly one of --cron, --every, --when or --at")
    try:
        return schedule_expr.parse(cron=opts.get("cron"), every=opts.get("every"), when=opts.get("when"),
                                   fire_at=opts.get("at"),
                                   timezone=opts.get("timezone") if opts.get("timezone") else default_timezone)
    except errors.InvalidInput as exc:
        raise click.UsageError(exc.message) from None


def _target(opts: dict[str, Any], *, required: bool) -> tuple[str | None, str | None]:
    if opts.get("queue") and opts.get("topic"):
        raise click.UsageError("give --queue or --topic, not both")
    if opts.get("queue"):
        return "queue", opts["queue"]
    if opts.get("topic"):
        return "topic", opts["topic"]
    if required:
        raise click.UsageError("give the target: --queue NAME or --topic ROUTING_KEY")
    return None, None


def _body(opts: dict[str, Any]) -> tuple[str, str | None] | None:
    if opts.get("message") is not None and opts.get("message_json") is not None:
        raise click.UsageError("give --message or --message-json, not both")
    if opts.get("message") is not None:
        return opts["message"], None
    if opts.get("message_json") is not None:
        try:
            value = json.loads(opts["message_json"])
        except ValueError as exc:
            raise click.UsageError(f"--message-json is not valid JSON: {exc}") from None
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False), types.JSON_CONTENT_TYPE
    return None


def _headers(pairs: Sequence[str]) -> dict[str, str] | None:
    if not pairs:
        return None
    headers = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.UsageError(f"--header takes NAME=VALUE, got {pair!r}")
        headers[key] = value
    return headers


# -- commands ------------------------------------------------------------------------------

@click.group()
def schedules() -> None:
    """Schedules: fire a message into a queue or topic on a cron, an interval, a plain
    English phrase or once. A running `conveyor serve` fires them."""


@schedules.command("list")
@click.option("--status", type=click.Choice(types.SCHEDULE_STATUSES), help="Only active or paused ones.")
@click.option("--target-kind", type=click.Choice(types.SCHEDULE_TARGET_KINDS), help="Only queue or topic targets.")
@click.option("--prefix", metavar="TEXT", help="Only names starting with TEXT.")
@click.option("--limit", type=click.IntRange(1, ops.LIST_MAX), default=ops.LIST_MAX, show_default=True)
@output.json_option
@click.pass_obj
def list_(obj, status: str | None, target_kind: str | None, prefix: str | None, limit: int) -> None:  # noqa: ANN001
    """List schedules (name order)."""
    found = context.run(obj.settings(), lambda conn: ops.list_all(
        conn, status=status, target_kind=target_kind, name_prefix=prefix, limit=limit))
    output.emit_rows(found, _LIST_COLUMNS, obj.as_json, empty="no schedules", data=data)


@schedules.command()
@click.argument("name")
@expression_options
@config_options
@click.option("--paused", is_flag=True, help="Create it paused.")
@output.json_option
@click.pass_obj
def create(obj, name: str, paused: bool, **opts: Any) -> None:  # noqa: ANN001
    """Create schedule NAME (an error if it exists; change one with `update`)."""
    expression = _expression(opts)
    kind, target = _target(opts, required=True)
    body = _body(opts) or ("{}", types.JSON_CONTENT_TYPE)
    spec = types.ScheduleSpec(
        expression=expression, target=target, target_kind=kind, body=body[0], content_type=body[1],
        headers=_headers(opts["headers"]), group_id=opts["group_id"], status="paused" if paused else "active",
        catchup=bool(opts["catchup"]),
        catchup_limit=opts["catchup_limit"] if opts["catchup_limit"] is not None else 10,
        failure_threshold=opts["failure_threshold"] if opts["failure_threshold"] is not None else 5)
    _saved(obj, lambda conn: ops.create(conn, name, spec))


@schedules.command()
@click.argument("name")
@output.json_option
@click.pass_obj
def show(obj, name: str) -> None:  # noqa: ANN001
    """Show schedule NAME: its configuration, state and next fire times."""
    _emit(obj, context.run(obj.settings(), lambda conn: ops.get(conn, name)))


@schedules.command()
@click.argument("name")
@expression_options
@config_options
@output.json_option
@click.pass_obj
def update(obj, name: str, **opts: Any) -> None:  # noqa: ANN001
    """Change schedule NAME; options not given keep their value. A new expression
    restarts it from now. --timezone alone re-reads its expression in that zone."""

    async def action(conn: Any) -> types.Schedule:
        current = await ops.get(conn, name)
        shape_opts = dict(opts)
        if opts.get("timezone") and not any(opts.get(k) for k in _SHAPE_OPTIONS):
            shape = next((k for k in ("cron", "every", "when", "fire_at") if k in current.expression), "cron")
            shape_opts["at" if shape == "fire_at" else shape] = str(current.expression.get(shape) or current.cron)
        expression = _expression(shape_opts, required=False, default_timezone=current.timezone)
        kind, target = _target(opts, required=False)
        body = _body(opts)
        changes = types.ScheduleChanges(
            expression=expression, target=target, target_kind=kind,
            body=body[0] if body else None, content_type=(body[1] or "") if body else None,
            headers=_headers(opts["headers"]), group_id=opts["group_id"], catchup=opts["catchup"],
            catchup_limit=opts["catchup_limit"], failure_threshold=opts["failure_threshold"])
        if changes == types.ScheduleChanges():
            raise click.UsageError("nothing to change: give at least one option")
        return await ops.alter(conn, name, changes)

    _saved(obj, action)


@schedules.command()
@click.argument("name")
@output.json_option
@click.pass_obj
def pause(obj, name: str) -> None:  # noqa: ANN001
    """Pause schedule NAME (it fires nothing until resumed)."""
    _emit(obj, context.run(obj.settings(), lambda conn: ops.pause(conn, name)))


@schedules.command()
@click.argument("name")
@output.json_option
@click.pass_obj
def resume(obj, name: str) -> None:  # noqa: ANN001
    """Resume schedule NAME from its next occurrence (missed ones are not caught up)."""
    _saved(obj, lambda conn: ops.resume(conn, name))


@schedules.command()
@click.argument("name")
@output.json_option
@click.pass_obj
def delete(obj, name: str) -> None:  # noqa: ANN001
    """Delete schedule NAME (nothing happens if it does not exist)."""
    existed = context.run(obj.settings(), lambda conn: ops.drop(conn, name))
    output.emit({"schedule": name, "deleted": existed}, obj.as_json,
                f"deleted schedule {name}" if existed else f"schedule {name} did not exist")


@schedules.command()
@click.argument("name")
@output.json_option
@click.pass_obj
def run(obj, name: str) -> None:  # noqa: ANN001
    """Fire schedule NAME once now, out of band (its next fire time does not move)."""
    settings = obj.settings()
    urls = topics.urls(settings)

    async def action(conn: Any) -> types.ScheduleRun:
        s = await ops.get(conn, name)
        publish = None
        if s.target_kind == "topic":  # signed with the stored SNS key, as the server would
            publish = functools.partial(topics.publish, signer=await signing.load_or_create(conn), urls=urls)
        return await ops.run(conn, name, publish=publish)

    r = context.run(settings, action)
    output.emit({"schedule": r.schedule, "scheduled_for": r.scheduled_for, "out_of_band": True,
                 "target_kind": r.target_kind, "target": r.target, "message_id": r.message_id,
                 "msg_ids": list(r.ids), "queues": list(r.queues)}, obj.as_json,
                f"fired {name} into {', '.join(r.queues) or 'no queue'}"
                + (f" (message {', '.join(map(str, r.ids))})" if r.ids else ""))


@schedules.command()
@expression_options
@click.option("--count", type=click.IntRange(0, schedule_expr.MAX_PREVIEW), default=5, show_default=True,
              help="How many fire times to list.")
@click.option("--after", metavar="ISO8601", help="List fire times after this instant (default: now).")
@output.json_option
@click.pass_obj
def preview(obj, count: int, after: str | None, **opts: Any) -> None:  # noqa: ANN001
    """Show what an expression means without storing anything: its canonical form, a
    description in words and its next fire times."""
    expr = _expression(opts)
    assert expr is not None
    try:
        start = schedule_expr.parse_instant(after, expr.timezone) if after else dt.datetime.now(dt.UTC)
    except errors.InvalidInput as exc:
        raise click.UsageError(exc.message) from None
    fires = schedule_expr.next_fires(expr, start, count)
    result = {"kind": expr.kind, "cron": expr.cron, "timezone": expr.timezone, "fire_at": expr.fire_at,
              "human_readable": schedule_expr.describe(expr), "next_fires": fires}

    def text() -> str:
        pairs = [("schedule", expr.cron if expr.kind == "cron" else f"once at {ops.iso(expr.fire_at)}"),
                 ("timezone", expr.timezone), ("in words", result["human_readable"])]
        zone = schedule_expr.zone(expr.timezone)
        lines = [t.astimezone(zone).isoformat(timespec="seconds") for t in fires]
        return output.record(pairs) + "\n\n" + ("\n".join(lines) if lines else "no fire times")

    output.emit(result, obj.as_json, text)
