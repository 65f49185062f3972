"""``conveyor top``: a live view of the queues, streams, partitioned (Queen) queues and topics,
refreshed every few seconds: depth, in flight, oldest age and the rates since the last refresh."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import Any

import click

from conveyor.cli import context, output, status
from conveyor.cli.output import Column

_QUEUE_COLUMNS = [
    Column("QUEUE", "queue_name"),
    Column("DEPTH", "queue_length"),
    Column("IN FLIGHT", "in_flight"),
    Column("DELAYED", "delayed"),
    Column("OLDEST", "oldest_msg_age_sec", output.duration, right=True),
    Column("SENT/S", "sent_per_sec", lambda v: "-" if v is None else f"{v:.1f}", right=True),
    Column("DONE/S", "done_per_sec", lambda v: "-" if v is None else f"{v:.1f}", right=True),
    Column("DLQ DEPTH", lambda r: r["dead_letter_length"] if r["dead_letter_queue"] else None, right=True),
]


def rates(before: dict[str, dict[str, Any]] | None, rows: list[dict[str, Any]], seconds: float) -> None:
    """Adds sent/s (new messages) and done/s (messages that left the queue: deleted,
    archived or dead-lettered) to ``rows``, from the previous refresh ``before``."""
    for row in rows:
        prev = (before or {}).get(row["queue_name"])
        if prev is None or seconds <= 0:
            row["sent_per_sec"] = row["done_per_sec"] = None
            continue
        sent = max(row["total_messages"] - prev["total_messages"], 0)
        backlog = lambda r: r["queue_length"] + r["in_flight"] + r["delayed"]  # noqa: E731
        row["sent_per_sec"] = sent / seconds
        row["done_per_sec"] = max(sent - (backlog(row) - backlog(prev)), 0) / seconds


def _screen(found: dict[str, Any], prefix: str | None, at: str) -> str:
    rows = [r for r in found["queues"] if prefix is None or r["queue_name"].startswith(prefix)]
    parts = [f"conveyor top - {at}", output.table(rows, _QUEUE_COLUMNS) if rows else "no queues"]
    if found["streams"]:
        parts.append(output.table(found["streams"], status._STREAM_COLUMNS))
    if found["consumers"]:
        parts.append(output.table(found["consumers"], status._CONSUMER_COLUMNS))
    parts.extend(status.partitioned_tables(found))
    if found["topics"]:
        parts.append(output.table(found["topics"], status._TOPIC_COLUMNS))
    return "\n\n".join(parts)


@click.command()
@click.option("--interval", default=2.0, show_default=True, type=click.FloatRange(min=0.2),
              help="Seconds between refreshes.")
@click.option("--iterations", type=click.IntRange(min=1), help="Stop after this many refreshes (default: until ^C).")
@click.option("--prefix", metavar="P", help="Only queues whose name starts with P.")
@click.pass_obj
def top(obj, interval: float, iterations: int | None, prefix: str | None) -> None:  # noqa: ANN001
    """A live view: every queue's depth, in flight, delayed, oldest age, messages sent and
    done per second (since the previous refresh) and dead-letter depth; every stream and
    its consumers' lag; every partitioned (Queen) queue and its consumer groups' lag; the
    topics. Refreshes every --interval seconds until ^C (or --iterations).

    With --json, one JSON document per refresh, one per line."""

    async def watch(conn: Any) -> None:
        before: dict[str, dict[str, Any]] | None = None
        last = time.monotonic()
        count = 0
        while iterations is None or count < iterations:
            found = await status._gather(conn)
            now = time.monotonic()
            rates(before, found["queues"], now - last)
            before, last = {r["queue_name"]: r for r in found["queues"]}, now
            count += 1
            if obj.as_json:
                output.print_json(found, compact=True)
            else:
                clear = "\033[H\033[2J" if sys.stdout.isatty() else ""
                click.echo(clear + _screen(found, prefix, time.strftime("%H:%M:%S")) + "\n")
            if iterations is None or count < iterations:
                await asyncio.sleep(interval)

    with contextlib.suppress(KeyboardInterrupt):  # ^C ends the view
        context.run(obj.settings(), watch)
