"""The options of the ``conveyor`` data source, checked once on the driver.

Spark hands options over as strings, case-insensitively. ``Options`` is what readers and
writers carry to the executors (it is pickled with them), so the DSN is resolved here,
on the driver: from the ``dsn`` option, else ``DATABASE_URL``. So are, for a partitioned
queue, the encryption keys that open sealed payloads (``CONVEYOR_ENCRYPTION_KEY``, as the
server reads it): the executors need no configuration of their own, and the keys stay out
of Spark's settings, plans and UI.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from conveyor import errors, settings
from conveyor.spark import offsets, schemas

QUEUE_KINDS = ("messages", "archive", "dead_letters")
STREAM_KINDS = ("events", "dead_letters")
PARTITIONED_KINDS = ("messages",)
DEFAULT_PARTITIONS = 4
DEFAULT_BATCH_SIZE = 10_000

_KNOWN = {"dsn", "queue", "stream", "partitionedqueue", "kind", "numpartitions", "fromtick", "totick", "consumer",
          "startingposition", "maxeventspertrigger", "tick", "startingoffsets", "endingoffsets",
          "maxoffsetspertrigger", "batchsize", "commitkey", "path", "checkpointlocation", "queryname"}
# options of one kind of target only, by their names as documented
_PARTITIONED_ONLY = {"startingoffsets": "startingOffsets", "endingoffsets": "endingOffsets",
                     "maxoffsetspertrigger": "maxOffsetsPerTrigger"}
_NOT_PARTITIONED = {"fromtick": "fromTick", "totick": "toTick", "consumer": "consumer",
                    "startingposition": "startingPosition", "maxeventspertrigger": "maxEventsPerTrigger",
                    "tick": "tick", "batchsize": "batchSize", "commitkey": "commitKey"}


@dataclass(frozen=True)
class Options:
    dsn: str
    queue: str | None = None
    stream: str | None = None
    partitioned_queue: str | None = None
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
    starting_offsets: offsets.Spec | None = None
    ending_offsets: offsets.Spec | None = None
    max_offsets: int | None = None
    encryption_keys: tuple[tuple[str, bytes], ...] = field(default=(), repr=False)

    @property
    def target(self) -> str:
        """The queue, stream or partitioned queue named."""
        return next(t for t in (self.queue, self.stream, self.partitioned_queue) if t is not None)

    @property
    def fields(self) -> tuple[schemas.Field, ...]:
        if self.partitioned_queue is not None:
            return schemas.PARTITIONED_MESSAGES
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
    queue, stream, partitioned = raw.get("queue"), raw.get("stream"), raw.get("partitionedqueue")
    if [queue, stream, partitioned].count(None) != 2:
        raise errors.InvalidInput("give exactly one of the options queue, stream and partitionedQueue")
    if partitioned is not None:
        return _partitioned(raw, dsn, partitioned, env)
    wrong = sorted(set(raw) & set(_PARTITIONED_ONLY))
    if wrong:
        raise errors.InvalidInput(f"option {_PARTITIONED_ONLY[wrong[0]]} is for partitioned queues (partitionedQueue)")
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


def _partitioned(raw: Mapping[str, str], dsn: str, name: str, env: Mapping[str, str]) -> Options:
    wrong = sorted(set(raw) & set(_NOT_PARTITIONED))
    if wrong:
        raise errors.InvalidInput(f"option {_NOT_PARTITIONED[wrong[0]]} is not one of a partitioned queue's "
                                  "(those are startingOffsets, endingOffsets, maxOffsetsPerTrigger)")
    kind = raw.get("kind", PARTITIONED_KINDS[0])
    if kind not in PARTITIONED_KINDS:
        raise errors.InvalidInput(f"option kind must be one of {', '.join(PARTITIONED_KINDS)} for a partitioned "
                                  f"queue, got {kind!r}")
    # checked for the widest use here (a streaming start may be latest); readers narrow it
    start, end = raw.get("startingoffsets"), raw.get("endingoffsets")
    return Options(
        dsn=dsn, partitioned_queue=name, kind=kind,
        partitions=_int(raw, "numpartitions", 1, "numPartitions") or DEFAULT_PARTITIONS,
        starting_offsets=None if start is None else offsets.parse(
            start, name, "startingOffsets", default=offsets.EARLIEST, allowed=(offsets.EARLIEST, offsets.LATEST)),
        ending_offsets=None if end is None else offsets.parse(
            end, name, "endingOffsets", default=offsets.LATEST, allowed=(offsets.LATEST,)),
        max_offsets=_int(raw, "maxoffsetspertrigger", 1, "maxOffsetsPerTrigger"),
        encryption_keys=_keys(env),
    )


def _keys(env: Mapping[str, str]) -> tuple[tuple[str, bytes], ...]:
    spec = env.get("CONVEYOR_ENCRYPTION_KEY")
    if not spec:
        return ()
    try:
        return settings.encryption_keys(spec)
    except ValueError as exc:
        raise errors.InvalidInput(f"CONVEYOR_ENCRYPTION_KEY: {exc}") from None
