"""``conveyor status``: every queue's depth and traffic at a glance."""

from __future__ import annotations

from typing import Any

import click

from conveyor import types
from conveyor.cli import context, output
from conveyor.cli.output import Column
from conveyor.core import queues

_COLUMNS = [
    Column("QUEUE", "queue_name"),
    Column("FIFO", "fifo"),
    Column("DEPTH", "queue_length"),
    Column("IN FLIGHT", "in_flight"),
    Column("DELAYED", "delayed"),
    Column("OLDEST", "oldest_msg_age_sec", output.duration, right=True),
    Column("TOTAL SENT", "total_messages"),
    Column("DEAD-LETTER QUEUE", "dead_letter_queue"),
    Column("DLQ DEPTH", lambda r: r["dead_letter_length"] if r["dead_letter_queue"] else None, right=True),
]


def _rows(metrics: list[types.QueueMetrics], found: list[types.Queue]) -> list[dict[str, Any]]:
    fifo = {q.name: q.fifo for q in found}
    # the two reads are not one snapshot: a queue created in between is still shown, and
    # a queue is FIFO exactly when its name ends in .fifo
    return [{"queue_name": m.queue_name, "fifo": fifo.get(m.queue_name, m.queue_name.endswith(".fifo")),
             **{k: v for k, v in output.to_data(m).items() if k != "queue_name"}}
            for m in metrics]


@click.command()
@output.json_option
@click.pass_obj
def status(obj) -> None:  # noqa: ANN001
    """Show every queue's depth and traffic, one line per queue.

    Columns: depth (visible now), in flight, delayed, age of the oldest message, total sent,
    and the dead-letter queue with its depth."""

    async def action(conn: Any) -> list[dict[str, Any]]:
        return _rows(await queues.metrics_all(conn), await queues.list_all(conn))

    output.emit_rows(context.run(obj.settings(), action), _COLUMNS, obj.as_json, empty="no queues")
