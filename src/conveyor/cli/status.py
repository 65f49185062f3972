"""``conveyor status``: every queue's depth and traffic, then every stream and consumer, the
topics with the webhook outbox, and the schedules, at a glance."""

from __future__ import annotations

import datetime as dt
from typing import Any

import click

from conveyor import types
from conveyor.cli import context, output, streams
from conveyor.cli.output import Column
from conveyor.core import partitioned, queues, schedules, topics
from conveyor.core import streams as stream_ops

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

_STREAM_COLUMNS = [
    Column("STREAM", "stream"),
    Column("DEPTH", "depth"),
    Column("CONSUMERS", "consumers"),
    Column("EVENTS/S", "events_per_sec", lambda v: f"{v:.1f}", right=True),
    Column("ROTATION AGE", "rotation_age", output.duration, right=True),
    Column("DEAD LETTERS", "dead_letters"),
    Column("LAST TICK", "last_tick_age", output.duration, right=True),
    Column("PAUSED", "ticker_paused"),
]

# `conveyor pipeline archive` reads a stream as the consumer conveyor-archive (--consumer):
# names starting so are shown as the pipeline's, whose lag is what is not archived yet
PIPELINE_CONSUMER = "conveyor-archive"

_CONSUMER_COLUMNS = [
    Column("STREAM", "stream"),
    Column("CONSUMER", lambda row: f"{row['consumer']} ({row['role']})" if row.get("role") else row["consumer"]),
    Column("LAG", "lag", output.duration, right=True),
    Column("PENDING", "pending_events"),
    Column("OPEN BATCH", "batch_id", right=True),
]

_PARTITIONED_COLUMNS = [
    Column("PARTITIONED QUEUE", "name"),
    Column("PARTITIONS", "partitions"),
    Column("PENDING", "pending"),
    Column("PROCESSING", "processing"),
    Column("DEAD LETTERS", "dead_letters"),
    Column("GROUPS", "consumer_groups"),
]

_GROUP_COLUMNS = [
    Column("PARTITIONED QUEUE", "queue"),
    Column("CONSUMER GROUP", "consumer_group"),
    Column("LAG", "lag"),
    Column("PARTITIONS BEHIND", "partitions_behind"),
    Column("LEASES", "leases"),
]

_TOPIC_COLUMNS = [
    Column("TOPIC", "name"),
    Column("FIFO", "fifo"),
    Column("SUBSCRIPTIONS", "subscriptions"),
]

_WEBHOOK_COLUMNS = [
    Column("WEBHOOK OUTBOX", lambda r: "deliveries"),
    Column("PENDING", "pending"),
    Column("DUE", "due"),
    Column("HELD", "held"),
    Column("EXHAUSTED", "exhausted"),
    Column("OLDEST PENDING", "oldest_pending_age", output.duration, right=True),
]

_SCHEDULE_COLUMNS = [
    Column("SCHEDULE", "name"),
    Column("STATUS", "status"),
    Column("TARGET", lambda r: f"{r['target_kind']} {r['target']}"),
    Column("NEXT FIRE", "next_fire_at"),
    Column("FIRES", "fire_count"),
    Column("FAILURES", "consecutive_failures"),
]


def _rows(metrics: list[types.QueueMetrics], found: list[types.Queue]) -> list[dict[str, Any]]:
    fifo = {q.name: q.fifo for q in found}
    # the two reads are not one snapshot: a queue created in between is still shown, and
    # a queue is FIFO exactly when its name ends in .fifo
    return [{"queue_name": m.queue_name, "fifo": fifo.get(m.queue_name, m.queue_name.endswith(".fifo")),
             **{k: v for k, v in output.to_data(m).items() if k != "queue_name"}}
            for m in metrics]


def _stream_rows(stats: list[types.StreamStats], found: list[types.Stream]) -> list[dict[str, Any]]:
    # the database's clock, not ours: a stream's switch time plus its rotation age is
    # the time stream_stats() ran (a stream created in between falls back to ours)
    switched = {s.name: s.switch_time for s in found}
    rows = []
    for st in stats:
        now = switched[st.stream] + st.rotation_age if st.stream in switched else dt.datetime.now(dt.UTC)
        age = max(now - st.last_tick_time, dt.timedelta(0)) if st.last_tick_time is not None else None
        rows.append({**streams.data(st), "last_tick_age": streams.seconds(age) if age is not None else None})
    return rows


async def _gather(conn: Any) -> dict[str, list[dict[str, Any]]]:
    queue_rows = _rows(await queues.metrics_all(conn), await queues.list_all(conn))
    stream_rows = _stream_rows(await stream_ops.stats(conn), await stream_ops.list_all(conn))
    consumer_rows = [streams.data(c) for c in await stream_ops.consumer_stats(conn)] if stream_rows else []
    for row in consumer_rows:
        row["role"] = "pipeline archive" if str(row["consumer"]).startswith(PIPELINE_CONSUMER) else ""
    partitioned_rows = [{"name": q["name"], "partitions": q["partitions"], "pending": q["messages"]["pending"],
                         "processing": q["messages"]["processing"], "dead_letters": q["messages"]["deadLetter"],
                         "consumer_groups": q["consumerGroups"]}
                        for q in await partitioned.report(conn, "pqueue_queue_summaries",
                                                         {"name": None, "namespace": None, "task": None})]
    group_rows = [{k: getattr(g, k) for k in ("queue", "consumer_group", "lag", "partitions_behind", "leases")}
                  for g in await partitioned.group_lag(conn)] if partitioned_rows else []
    topic_rows = [{"name": t.name, "fifo": t.fifo, "subscriptions": t.subscriptions}
                  for t in await topics.list_all(conn)]
    webhooks = output.to_data(await topics.deliveries_stats(conn))
    if webhooks.get("oldest_pending_age") is not None:
        webhooks["oldest_pending_age"] = streams.seconds(webhooks["oldest_pending_age"])
    schedule_rows = [{k: getattr(s, k) for k in ("name", "status", "target_kind", "target", "next_fire_at",
                                                 "fire_count", "consecutive_failures", "last_error")}
                     for s in await schedules.list_all(conn)]
    return {"queues": queue_rows, "streams": stream_rows, "consumers": consumer_rows,
            "partitioned_queues": partitioned_rows, "consumer_groups": group_rows, "topics": topic_rows,
            "webhooks": webhooks, "schedules": schedule_rows}


def partitioned_tables(found: dict[str, Any]) -> list[str]:
    """The partitioned (Queen) queues and their consumer groups, when there are any."""
    parts = []
    if found["partitioned_queues"]:
        parts.append(output.table(found["partitioned_queues"], _PARTITIONED_COLUMNS))
    if found["consumer_groups"]:
        parts.append(output.table(found["consumer_groups"], _GROUP_COLUMNS))
    return parts


def _text(found: dict[str, list[dict[str, Any]]]) -> str:
    parts = [output.table(found["queues"], _COLUMNS) if found["queues"] else "no queues"]
    if found["streams"]:
        parts.append(output.table(found["streams"], _STREAM_COLUMNS))
    if found["consumers"]:
        parts.append(output.table(found["consumers"], _CONSUMER_COLUMNS))
    parts.extend(partitioned_tables(found))
    if found["topics"]:
        parts.append(output.table(found["topics"], _TOPIC_COLUMNS))
    if found["topics"] or any(found["webhooks"][k] for k in ("pending", "held", "exhausted")):
        parts.append(output.table([found["webhooks"]], _WEBHOOK_COLUMNS))
    if found["schedules"]:
        parts.append(output.table(found["schedules"], _SCHEDULE_COLUMNS))
    return "\n\n".join(parts)


@click.command()
@output.json_option
@click.pass_obj
def status(obj) -> None:  # noqa: ANN001
    """Show every queue's depth and traffic, every stream and its consumers, the topics
    with the webhook outbox, and the schedules.

    Queues: depth (visible now), in flight, delayed, age of the oldest message, total sent,
    and the dead-letter queue with its depth. Streams (when there are any): depth, consumers,
    events per second, rotation age, dead letters, time since the last tick, paused.
    Consumers: lag (age of the last tick finished), pending events, open batch. Partitioned
    (Queen) queues: partitions, pending, processing (leased), dead letters, consumer groups,
    and each group's lag. Topics:
    subscriptions; the webhook outbox: pending, due, held, exhausted deliveries and the
    age of the oldest pending one. Schedules: status, target, next fire, fires, failures.

    JSON: {"queues", "streams", "consumers", "partitioned_queues", "consumer_groups", "topics",
    "webhooks", "schedules"}, durations
    in seconds."""
    found = context.run(obj.settings(), _gather)
    output.emit(found, obj.as_json, lambda: _text(found))
