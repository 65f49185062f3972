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
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from conveyor import errors, settings
from conveyor.spark import offsets, schemas

QUEUE_KINDS = ("messages", "archive", "dead_letters")
STREAM_KINDS = ("events", "dead_letters")
PARTITIONED_KINDS = ("messages",)
DEFAULT_PARTITIONS = 4
DEFAULT_BATCH_SIZE = 10_000

_KNOWN = {"dsn", "queue", "stream", "partitionedqueue", "kind", "numpartitions", "fromtick", "totick", "consumer",
          "startingposition", "maxeventspertrigger", "tick", "startingoffsets", "endingoffsets",
          "maxoffsetspertrigger", "batchsize", "commitkey", "path", "checkpointlocation", "queryname",
          "queuepattern", "streampattern", "partitionedqueuepattern", "startingtimestamp",
          "startingoffsetsbytimestamp", "minoffsetspertrigger", "maxtriggerdelay", "includeheaders",
          "failondataloss"}
# the options naming what is read: one name, a comma-separated list, or a pattern
TARGETS = {"queue": "queue", "stream": "stream", "partitionedqueue": "partitionedQueue"}
PATTERNS = {"queuepattern": "queue", "streampattern": "stream", "partitionedqueuepattern": "partitionedqueue"}
DEFAULT_MAX_TRIGGER_DELAY = 15 * 60.0  # seconds, as Kafka's maxTriggerDelay
# options of one kind of target only, by their names as documented
_PARTITIONED_ONLY = {"startingoffsets": "startingOffsets", "endingoffsets": "endingOffsets",
                     "maxoffsetspertrigger": "maxOffsetsPerTrigger",
                     "startingoffsetsbytimestamp": "startingOffsetsByTimestamp"}
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
    pattern: str | None = None  # a regular expression the names read match (whole), instead of names
    starting_timestamp: int | None = None  # ms since the epoch: start at the first message at or after it
    timestamps: offsets.Spec | None = None  # startingOffsetsByTimestamp (ms per partition)
    min_offsets: int | None = None  # minOffsetsPerTrigger
    max_trigger_delay: float = DEFAULT_MAX_TRIGGER_DELAY  # seconds
    include_headers: bool = True
    fail_on_data_loss: bool = True
    raw: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # as given (lower-case keys)

    @property
    def target(self) -> str:
        """The queue, stream or partitioned queue named (a comma-separated list, or "" for a
        pattern, when several are read)."""
        return next(t for t in (self.queue, self.stream, self.partitioned_queue) if t is not None)

    @property
    def several(self) -> bool:
        """Whether the options name several sources (a list or a pattern): see spark.sources."""
        return self.pattern is not None or "," in self.target

    @property
    def fields(self) -> tuple[schemas.Field, ...]:
        """The schema read (without ``attributes`` when includeHeaders is false)."""
        return tuple(f for f in self.row_fields if self.include_headers or f.name != "attributes")

    @property
    def row_fields(self) -> tuple[schemas.Field, ...]:
        """What the read queries return (after the name column), attributes included."""
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
    given = [key for key in (*TARGETS, *PATTERNS) if key in raw]
    if len(given) != 1:
        raise errors.InvalidInput("give exactly one of the options queue, stream and partitionedQueue (a name or a "
                                  "comma-separated list), or queuePattern, streamPattern, partitionedQueuePattern")
    pattern = _pattern(raw, given[0])
    names = {**raw, PATTERNS[given[0]]: ""} if pattern is not None else raw
    queue, stream, partitioned = names.get("queue"), names.get("stream"), names.get("partitionedqueue")
    for key, value in (("queue", queue), ("stream", stream), ("partitionedqueue", partitioned)):
        if value is not None and pattern is None and not all(n.strip() for n in value.split(",")):
            raise errors.InvalidInput(f"option {TARGETS[key]} must name one or more (comma-separated), got {value!r}")
    common = _common(raw, pattern)
    if partitioned is not None:
        return replace(_partitioned(raw, dsn, partitioned, env), **common)
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
    if queue is not None and "startingtimestamp" in raw:
        raise errors.InvalidInput("option startingTimestamp is for streams and partitioned queues (a queue's "
                                  "archive starts from a mark: startingPosition)")
    return replace(Options(
        dsn=dsn, queue=queue, stream=stream, kind=kind,
        partitions=_int(raw, "numpartitions", 1, "numPartitions") or DEFAULT_PARTITIONS,
        from_tick=_int(raw, "fromtick", 0, "fromTick"), to_tick=_int(raw, "totick", 0, "toTick"),
        consumer=raw.get("consumer") or None, starting_position=start,
        max_events=_int(raw, "maxeventspertrigger", 1, "maxEventsPerTrigger"),
        tick=_bool(raw, "tick", "tick"),
        batch_size=_int(raw, "batchsize", 1, "batchSize") or DEFAULT_BATCH_SIZE,
        commit_key=raw.get("commitkey") or raw.get("checkpointlocation") or None,
    ), **common)


def _pattern(raw: Mapping[str, str], key: str) -> str | None:
    if key not in PATTERNS:
        return None
    try:
        re.compile(raw[key])
    except re.error as exc:
        raise errors.InvalidInput(f"option {key} is not a regular expression: {exc}") from None
    return raw[key]


def _common(raw: Mapping[str, str], pattern: str | None) -> dict[str, Any]:
    """The options every kind of source takes."""
    delay = raw.get("maxtriggerdelay")
    return {
        "pattern": pattern, "raw": tuple(sorted(raw.items())),
        "starting_timestamp": _int(raw, "startingtimestamp", 0, "startingTimestamp"),
        "min_offsets": _int(raw, "minoffsetspertrigger", 1, "minOffsetsPerTrigger"),
        "max_trigger_delay": DEFAULT_MAX_TRIGGER_DELAY if delay is None else _duration(delay, "maxTriggerDelay"),
        "include_headers": _bool({"x": raw.get("includeheaders") or "true"}, "x", "includeHeaders"),
        "fail_on_data_loss": _bool({"x": raw.get("failondataloss") or "true"}, "x", "failOnDataLoss"),
    }


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def _duration(text: str, label: str) -> float:
    """Kafka's durations: ``15m``, ``30s``, ``500ms``, ``1h`` (a bare number: seconds)."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|min|m|h)?\s*", text)
    if not found:
        raise errors.InvalidInput(f"option {label} must be a duration such as 30s, 15m or 500ms, got {text!r}")
    return float(found[1]) * _UNITS[found[2] or "s"]


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
    start, end, by_time = raw.get("startingoffsets"), raw.get("endingoffsets"), raw.get("startingoffsetsbytimestamp")
    if start is not None and (by_time is not None or "startingtimestamp" in raw):
        raise errors.InvalidInput("give startingOffsets or a start by time (startingOffsetsByTimestamp, "
                                  "startingTimestamp), not both")

    def spec(text: str | None, label: str, default: int, allowed: tuple[int, ...]) -> offsets.Spec | None:
        several = not name or "," in name
        if text is None or (several and text.strip().lower() not in ("earliest", "latest")):
            return None  # several queues: each source's part is parsed for it alone (spark.sources.one)
        return offsets.parse(text, name, label, default=default, allowed=allowed)

    return Options(
        dsn=dsn, partitioned_queue=name, kind=kind,
        partitions=_int(raw, "numpartitions", 1, "numPartitions") or DEFAULT_PARTITIONS,
        starting_offsets=spec(start, "startingOffsets", offsets.EARLIEST, (offsets.EARLIEST, offsets.LATEST)),
        ending_offsets=spec(end, "endingOffsets", offsets.LATEST, (offsets.LATEST,)),
        max_offsets=_int(raw, "maxoffsetspertrigger", 1, "maxOffsetsPerTrigger"),
        encryption_keys=_keys(env),
        timestamps=spec(by_time, "startingOffsetsByTimestamp", offsets.EARLIEST, ()),
    )


def _keys(env: Mapping[str, str]) -> tuple[tuple[str, bytes], ...]:
    spec = env.get("CONVEYOR_ENCRYPTION_KEY")
    if not spec:
        return ()
    try:
        return settings.encryption_keys(spec)
    except ValueError as exc:
        raise errors.InvalidInput(f"CONVEYOR_ENCRYPTION_KEY: {exc}") from None
