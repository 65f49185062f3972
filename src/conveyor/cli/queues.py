"""``conveyor queues``: list, create, show, alter, delete and purge queues."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from conveyor import crypto, types
from conveyor.cli import context, output
from conveyor.cli.output import Column
from conveyor.core import queues as ops
from conveyor.core import sealing

# option name -> queue attribute; the database checks every range, so one place says them
_ATTRIBUTE_OPTIONS = {
    "visibility_timeout": "visibility_timeout",
    "delay": "delay_seconds",
    "retention": "retention_seconds",
    "max_message_size": "max_message_size",
    "receive_wait": "receive_wait_seconds",
    "max_receive_count": "max_receive_count",
    "dead_letter_queue": "dead_letter_queue",
    "content_based_deduplication": "content_based_deduplication",
}

_LIST_COLUMNS = [
    Column("NAME", "name"),
    Column("FIFO", "fifo"),
    Column("VISIBILITY", "visibility_timeout", output.duration, right=True),
    Column("DELAY", "delay_seconds", output.duration, right=True),
    Column("RETENTION", "retention_seconds", output.duration, right=True),
    Column("MAX RECEIVES", "max_receive_count"),
    Column("DEAD-LETTER QUEUE", "dead_letter_queue"),
    Column("CREATED AT", "created_at"),
]


def attribute_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The queue attributes as options (shared by create and alter)."""
    options = [
        click.option("--visibility-timeout", type=int, metavar="SECONDS",
                     help="How long a received message stays hidden (0-43200; default 30)."),
        click.option("--delay", type=int, metavar="SECONDS",
                     help="Delay of new messages before they become visible (0-900; default 0)."),
        click.option("--retention", type=int, metavar="SECONDS",
                     help="How long messages are kept (60-1209600; default 345600 = 4 days)."),
        click.option("--max-message-size", type=int, metavar="BYTES",
                     help="Largest body plus headers (1024-1048576; default 1048576)."),
        click.option("--receive-wait", type=int, metavar="SECONDS",
                     help="Default long-poll wait of receives over the API (0-20; default 0)."),
        click.option("--max-receive-count", type=int, metavar="N",
                     help="Receives after which a message is dead-lettered (1-1000)."),
        click.option("--dead-letter-queue", metavar="NAME",
                     help="Where messages go after --max-receive-count receives."),
        click.option("--content-based-deduplication/--no-content-based-deduplication", default=None,
                     help="FIFO only: deduplicate by a hash of the body when no dedup id is given."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _attributes(given: dict[str, Any]) -> dict[str, Any]:
    """The attributes the user set (options left out keep their value or default)."""
    return {attr: given[opt] for opt, attr in _ATTRIBUTE_OPTIONS.items() if given.get(opt) is not None}


def queue_data(q: types.Queue, m: types.QueueMetrics | None = None) -> dict[str, Any]:
    """A queue as JSON: the same shape as the REST API's (attributes, then metrics)."""
    data: dict[str, Any] = {"name": q.name, "fifo": q.fifo, **q.attributes(),
                            "created_at": q.created_at, "updated_at": q.updated_at}
    if m is not None:
        metrics = output.to_data(m)
        for key in ("queue_name", "dead_letter_queue"):  # already among the attributes
            metrics.pop(key)
        data.update(metrics)
    return data


def _describe(q: types.Queue, m: types.QueueMetrics | None = None) -> str:
    pairs: list[tuple[str, Any]] = [
        ("name", q.name),
        ("fifo", q.fifo),
        ("visibility timeout", output.duration(q.visibility_timeout)),
        ("delay", output.duration(q.delay_seconds)),
        ("retention", output.duration(q.retention_seconds)),
        ("max message size", q.max_message_size),
        ("receive wait", output.duration(q.receive_wait_seconds)),
        ("max receive count", q.max_receive_count),
        ("dead-letter queue", q.dead_letter_queue),
        ("content-based dedup", q.content_based_deduplication),
        ("created at", q.created_at),
        ("updated at", q.updated_at),
    ]
    if m is not None:
        pairs += [
            ("depth", m.queue_length),
            ("in flight", m.in_flight),
            ("delayed", m.delayed),
            ("oldest age", output.duration(m.oldest_msg_age_sec)),
            ("newest age", output.duration(m.newest_msg_age_sec)),
            ("total sent", m.total_messages),
            ("dead-letter depth", m.dead_letter_length if m.dead_letter_queue else None),
        ]
    return output.record(pairs)


def _emit_queue(obj: Any, q: types.Queue, m: types.QueueMetrics | None = None) -> None:
    output.emit(queue_data(q, m), obj.as_json, lambda: _describe(q, m))


@click.group()
def queues() -> None:
    """Create, inspect, change and delete queues."""


@queues.command("list")
@click.option("--prefix", metavar="P", help="Only queues whose name starts with P.")
@output.json_option
@click.pass_obj
def list_(obj, prefix: str | None) -> None:  # noqa: ANN001
    """List queues (name order) with their main attributes."""
    found = context.run(obj.settings(), lambda conn: ops.list_all(conn, prefix))
    output.emit_rows(found, _LIST_COLUMNS, obj.as_json, empty="no queues", data=queue_data)


@queues.command()
@click.argument("name")
@attribute_options
@output.json_option
@click.pass_obj
def create(obj, name: str, **options: Any) -> None:  # noqa: ANN001
    """Create queue NAME (a name ending in .fifo makes a FIFO queue).

    Succeeds without change if it exists with the given attributes; fails if they differ."""
    q = context.run(obj.settings(), lambda conn: ops.create(conn, name, _attributes(options)))
    _emit_queue(obj, q)


@queues.command()
@click.argument("name")
@output.json_option
@click.pass_obj
def show(obj, name: str) -> None:  # noqa: ANN001
    """Show queue NAME: its attributes and metrics.

    Metrics: depth, in flight, delayed, oldest and newest message age, total sent."""

    async def action(conn: Any) -> tuple[types.Queue, types.QueueMetrics]:
        return await ops.get(conn, name), await ops.metrics(conn, name)

    _emit_queue(obj, *context.run(obj.settings(), action))


@queues.command()
@click.argument("name")
@attribute_options
@click.option("--clear-redrive", is_flag=True,
              help="Remove the dead-letter queue and max receive count.")
@output.json_option
@click.pass_obj
def alter(obj, name: str, clear_redrive: bool, **options: Any) -> None:  # noqa: ANN001
    """Change attributes of queue NAME; those not given keep their value."""
    attributes = _attributes(options)
    if clear_redrive:
        if {"dead_letter_queue", "max_receive_count"} & attributes.keys():
            raise click.UsageError("--clear-redrive cannot be combined with --dead-letter-queue "
                                   "or --max-receive-count")
        # a JSON null clears these attributes in the database
        attributes.update(dead_letter_queue=None, max_receive_count=None)
    if not attributes:
        raise click.UsageError("nothing to change: give at least one attribute option")
    q = context.run(obj.settings(), lambda conn: ops.alter(conn, name, attributes))
    _emit_queue(obj, q)



@queues.command()
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@output.json_option
@click.pass_obj
def delete(obj, name: str, yes: bool) -> None:  # noqa: ANN001
    """Delete queue NAME with all its messages and archive."""

    async def action(conn: Any) -> bool:
        await ops.get(conn, name)  # fails for an unknown queue before asking anything
        output.confirm(f"Delete queue {name!r} and all its messages?", yes)
        return await ops.drop(conn, name)

    if not context.run(obj.settings(), action):
        raise click.ClickException(f"queue {name!r} does not exist")  # dropped meanwhile
    output.emit({"queue": name, "deleted": True}, obj.as_json, f"deleted queue {name}")


@queues.command()
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@output.json_option
@click.pass_obj
def purge(obj, name: str, yes: bool) -> None:  # noqa: ANN001
    """Delete every message of queue NAME.

    Messages in flight go too; the queue and its attributes stay."""

    async def action(conn: Any) -> int:
        await ops.get(conn, name)
        output.confirm(f"Delete all messages of queue {name!r}?", yes)
        return await ops.purge(conn, name)

    n = context.run(obj.settings(), action)
    output.emit({"queue": name, "deleted": n}, obj.as_json,
                f"deleted {n} message{'s' if n != 1 else ''} from queue {name}")


@queues.command()
@output.json_option
@click.pass_obj
def reencrypt(obj) -> None:  # noqa: ANN001
    """Seal stored messages with the first key of CONVEYOR_ENCRYPTION_KEY.

    Rotates keys: put a new key first (kid:base64,...), restart the servers, run this,
    then remove the old key. Also seals the messages that encrypted queues (and Queen
    queues with encryptionEnabled) stored before encryption was turned on. Safe to run
    again; run it again if it reports rows other transactions held."""
    settings = obj.settings()
    if not settings.encryption_keys:
        raise click.ClickException("CONVEYOR_ENCRYPTION_KEY is not set: there is no key to seal with")
    keyring = crypto.Keyring.of(settings.encryption_keys)

    def report(n: int) -> None:
        if not obj.as_json:
            click.echo(f"  sealed {n} more", err=True)

    done = context.run(settings, lambda conn: sealing.reseal(conn, keyring, report))
    output.emit({"key": keyring.active, "messages": done.messages, "archived": done.archived,
                 "partitioned": done.partitioned, "dead_letters": done.dead_letters}, obj.as_json,
                f"sealed {done.total} with key {keyring.active} ({done.messages} messages, {done.archived} archived, "
                f"{done.partitioned} partitioned-queue messages, {done.dead_letters} dead letters)")
