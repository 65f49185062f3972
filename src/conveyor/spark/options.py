"""The options of the ``conveyor`` data source, checked once on the driver.

Spark hands options over as strings, case-insensitively. ``Options`` is what readers and
writers carry to the executors (it is pickled with them), so the DSN is resolved here,
on the driver: from the ``dsn`` option, else ``DATABASE_URL``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from conveyor import errors
from conveyor.spark import schemas

QUEUE_KINDS = ("messages", "archive", "dead_letters")
STREAM_KINDS = ("events", "dead_letters")
DEFAULT_PARTITIONS = 4
DEFAULT_BATCH_SIZE = 10_000

_KNOWN = {"dsn", "queue", "stream", "kind", "numpartitions", "fromtick", "totick", "consumer",
          "startingposition", "maxeventspertrigger", "tick", "batchsize", "commitkey", "path",
          "checkpointlocation", "queryname"}


@dataclass(frozen=True)
class Options:
    dsn: str
    queue: str | None = None
    stream: str | None = None
    kind: str = "messages"
    partitions: int = DEFAULT_PARTITIONS
    from_tick: int | None = None
    to_tick: int | None = None
    consumer: str | None = None
    starting_position: str | None = None
    max_events: int | None = None
    tick: bool = False
    batch_size: int = DEFAULT_BATCH_SIZE
    commit_key: str | None = None

    @property
    def target(self) -> str:
        """The queue or stream named."""
        return self.queue if self.queue is not None else str(self.stream)

    @property
    def fields(self) -> tuple[schemas.Field, ...]:
        if self.stream is not None:
            return schemas.STREAM_DEAD_LETTERS if self.kind == "dead_letters" else schemas.STREAM_EVENTS
        return {"messages": schemas.QUEUE_MESSAGES, "archive": schemas.QUEUE_ARCHIVE,
                "dead_letters": schemas.QUEUE_MESSAGES}[self.kind]


def _int(raw: Mapping[str, str], key: str, low: int, label: str) -> int | None:
    value = raw.get(key)
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except ValueError:
        raise errors.InvalidInput(f"option {label} must be an integer, got {value!r}") from None
    if number < low:
        raise errors.InvalidInput(f"option {label} must be at least {low}, got {number}")
    return number


def _bool(raw: Mapping[str, str], key: str, label: str) -> bool:
    value = (raw.get(key) or "false").strip().lower()
    if value not in ("true", "false"):
        raise errors.InvalidInput(f"option {label} must be true or false, got {value!r}")
    return value == "true"


def parse(options: Mapping[str, str], environ: Mapping[str, str] | None = None) -> Options:
    """Check the options; InvalidInput names the first one that is wrong."""
    raw = {k.lower(): v for k, v in options.items()}
    unknown = sorted(set(raw) - _KNOWN)
    if unknown:
        raise errors.InvalidInput(f"unknown option {unknown[0]!r} for the conveyor data source")
    env = os.environ if environ is None else environ
    dsn = raw.get("dsn") or env.get("DATABASE_URL")
    if not dsn:
        raise errors.InvalidInput("option dsn (or DATABASE_URL) is required: the PostgreSQL to use")
    queue, stream = raw.get("queue"), raw.get("stream")
    if (queue is None) == (stream is None):
        raise errors.InvalidInput("give exactly one of the options queue and stream")
    kinds = STREAM_KINDS if stream is not None else QUEUE_KINDS
    kind = raw.get("kind", kinds[0])
    if kind not in kinds:
        raise errors.InvalidInput(f"option kind must be one of {', '.join(kinds)} for a "
                                  f"{'stream' if stream is not None else 'queue'}, got {kind!r}")
    start = raw.get("startingposition")
    if start is not None and start not in ("latest", "earliest"):
        raise errors.InvalidInput(f"option startingPosition must be latest or earliest, got {start!r}")
    return Options(
        dsn=dsn, queue=queue, stream=stream, kind=kind,
        partitions=_int(raw, "numpartitions", 1, "numPartitions") or DEFAULT_PARTITIONS,
        from_tick=_int(raw, "fromtick", 0, "fromTick"), to_tick=_int(raw, "totick", 0, "toTick"),
        consumer=raw.get("consumer") or None, starting_position=start,
        max_events=_int(raw, "maxeventspertrigger", 1, "maxEventsPerTrigger"),
        tick=_bool(raw, "tick", "tick"),
        batch_size=_int(raw, "batchsize", 1, "batchSize") or DEFAULT_BATCH_SIZE,
        commit_key=raw.get("commitkey") or raw.get("checkpointlocation") or None,
    )
