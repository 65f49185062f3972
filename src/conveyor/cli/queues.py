"""``conveyor queues``: list, create, show, alter, delete and purge queues; their dead
letters (list, replay, purge); drain; reencrypt."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import click

from conveyor import crypto, types
from conveyor.cli import context, output
from conveyor.cli.output import Column
from conveyor.core import messages as message_ops
from conveyor.core import move_tasks, sealing
from conveyor.core import queues as ops

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
    data: dict[str, Any] = {"name": q.name, "fifo": q.fifo, **q.attributes(), "storage": q.storage,
                            "partitioning": q.partitioning, "created_at": q.created_at, "updated_at": q.updated_at}
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
        ("storage", _storage(q)),
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


def _storage(q: types.Queue) -> str:
    """``partitioned by id, 10000 ids, keep 100000 ids, premake 4``; or the kind."""
    p = q.partitioning
    if p is None:
        return q.storage
    unit = " ids" if p["by"] == "id" else ""
    keep = "keep all" if p["retention"] is None else f"keep {p['retention']}{unit}"
    return f"{q.storage} by {p['by']}, {p['interval']}{unit} each, {keep}, premake {p['premake']}"


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
@click.option("--storage", type=click.Choice(["logged", "unlogged", "partitioned"]),
              help="Where its messages are kept, chosen once: logged (default), unlogged (fast, emptied by "
                   "a crash of PostgreSQL, not on replicas) or partitioned (tables of its own by id or time).")
@click.option("--partition-interval", metavar="N|INTERVAL",
              help="Partitioned: ids per partition (default 10000) or a time such as '1 day'.")
@click.option("--partition-retention", metavar="N|INTERVAL",
              help="Partitioned: drop partitions this many ids behind the newest, or this old (default: keep).")
@click.option("--partition-premake", type=int, metavar="N", help="Partitioned: partitions made ahead (default 4).")
@output.json_option
@click.pass_obj
def create(obj, name: str, storage: str | None, partition_interval: str | None, partition_retention: str | None,  # noqa: ANN001
           partition_premake: int | None, **options: Any) -> None:
    """Create queue NAME (a name ending in .fifo makes a FIFO queue).

    Succeeds without change if it exists with the given attributes; fails if they differ."""
    kind = {"storage": storage, "partition_interval": partition_interval,
            "partition_retention": partition_retention, "partition_premake": partition_premake}
    attributes = _attributes(options) | {k: v for k, v in kind.items() if v is not None}
    q = context.run(obj.settings(), lambda conn: ops.create(conn, name, attributes))
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
    context.remove(obj, "queue", name, find=ops.get, remove_it=ops.drop, done="deleted", yes=yes,
                   question=lambda _q: f"Delete queue {name!r} and all its messages?")


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
        m = await ops.metrics(conn, name)
        with output.Progress(f"purging {name}", m.queue_length + m.in_flight + m.delayed) as bar:
            n = await ops.purge(conn, name)  # one statement: the line shows the count when it is done
            bar.update(n)
        return n

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

    async def action(conn: Any) -> sealing.Resealed:
        with output.Progress("sealing", None) as bar:
            return await sealing.reseal(conn, keyring, lambda n: bar.update(bar.done + n))

    done = context.run(settings, action)
    output.emit({"key": keyring.active, "messages": done.messages, "archived": done.archived,
                 "partitioned": done.partitioned, "dead_letters": done.dead_letters}, obj.as_json,
                f"sealed {done.total} with key {keyring.active} ({done.messages} messages, {done.archived} archived, "
                f"{done.partitioned} partitioned-queue messages, {done.dead_letters} dead letters)")


def _dead_letter_queue(q: types.Queue) -> str:
    if not q.dead_letter_queue:
        raise click.ClickException(f"queue {q.name!r} has no dead-letter queue (see queues alter "
                                   "--dead-letter-queue)")
    return q.dead_letter_queue


@queues.command("dead-letters")
@click.argument("name")
@click.option("--max", "max_rows", default=100, show_default=True, type=click.IntRange(1, 10000))
@output.json_option
@click.pass_obj
def dead_letters(obj, name: str, max_rows: int) -> None:  # noqa: ANN001
    """List the messages in queue NAME's dead-letter queue, oldest first (without receiving
    them)."""

    async def action(conn: Any) -> list[types.Message]:
        dlq = _dead_letter_queue(await ops.get(conn, name))
        return await message_ops.peek(conn, dlq, qty=max_rows)

    found = context.run(obj.settings(), action)
    columns = [Column("ID", "id", right=True), Column("RECEIVES", "receive_count", right=True),
               Column("SENT AT", "sent_at"), Column("BODY", lambda m: output.preview(m.body))]
    output.emit_rows(found, columns, obj.as_json, empty=f"no dead letters for queue {name}")


@queues.command("replay-dead-letters")
@click.argument("name")
@click.option("--timeout", default=300.0, show_default=True, type=click.FloatRange(min=1),
              help="Give up (exit 1) after this many seconds.")
@output.json_option
@click.pass_obj
def replay_dead_letters(obj, name: str, timeout: float) -> None:  # noqa: ANN001
    """Move every message of queue NAME's dead-letter queue back to the queue it came from
    (a move task, run here to the end with a progress bar; SQS's StartMessageMoveTask)."""

    async def action(conn: Any) -> types.MoveTask:
        q = await ops.get(conn, name)
        task = await move_tasks.start(conn, _dead_letter_queue(q))
        deadline = time.monotonic() + timeout
        with output.Progress(f"replaying {q.dead_letter_queue}", task.to_move) as bar:
            while task.status == "RUNNING":
                if time.monotonic() > deadline:
                    await move_tasks.cancel(conn, task.handle)
                    raise click.ClickException(f"replay not finished after {timeout:g} s: cancelled after "
                                               f"{task.moved} of {task.to_move}")
                await move_tasks.step(conn)
                [task] = await move_tasks.list_for(conn, task.source_queue)
                bar.update(task.moved)
        return task

    task = context.run(obj.settings(), action)
    output.emit({"queue": name, "dead_letter_queue": task.source_queue, "moved": task.moved, "status": task.status},
                obj.as_json, f"moved {task.moved} dead letters back ({task.status.lower()})")


@queues.command("purge-dead-letters")
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@output.json_option
@click.pass_obj
def purge_dead_letters(obj, name: str, yes: bool) -> None:  # noqa: ANN001
    """Delete every message of queue NAME's dead-letter queue for good."""

    async def action(conn: Any) -> tuple[str, int]:
        dlq = _dead_letter_queue(await ops.get(conn, name))
        output.confirm(f"Delete every message of {dlq!r}, the dead-letter queue of {name!r}?", yes)
        return dlq, await ops.purge(conn, dlq)

    dlq, n = context.run(obj.settings(), action)
    output.emit({"queue": name, "dead_letter_queue": dlq, "deleted": n}, obj.as_json,
                f"deleted {n} messages from {dlq}")


@queues.command()
@click.argument("name")
@click.option("--timeout", default=60.0, show_default=True, type=click.FloatRange(min=0),
              help="Give up (exit 1) after this many seconds.")
@click.option("--interval", default=1.0, show_default=True, type=click.FloatRange(min=0.05))
@output.json_option
@click.pass_obj
def drain(obj, name: str, timeout: float, interval: float) -> None:  # noqa: ANN001
    """Wait until queue NAME is drained: no message visible, in flight or delayed (its
    consumers have worked it off). Exit 0 once drained, 1 at --timeout; for deploys
    and shutdowns that must not leave work behind."""

    async def action(conn: Any) -> types.QueueMetrics:
        deadline = time.monotonic() + timeout
        m = await ops.metrics(conn, name)
        first = m.queue_length + m.in_flight + m.delayed
        with output.Progress(f"draining {name}", first) as bar:
            while m.queue_length + m.in_flight + m.delayed:
                if time.monotonic() >= deadline:
                    raise click.ClickException(
                        f"queue {name!r} not drained after {timeout:g} s: {m.queue_length} visible, "
                        f"{m.in_flight} in flight, {m.delayed} delayed")
                await asyncio.sleep(interval)
                m = await ops.metrics(conn, name)
                bar.update(max(first - (m.queue_length + m.in_flight + m.delayed), 0))
        return m

    context.run(obj.settings(), action)
    output.emit({"queue": name, "drained": True}, obj.as_json, f"queue {name} is drained")
