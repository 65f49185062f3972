"""Per-partition offsets of a partitioned queue, kept the way Spark's Kafka source keeps
them: ``{queue: {partition: position}}``.

A partition's position is the ``seq`` of migration 0009: its messages are numbered 1, 2,
... and a push numbers them while it holds the partition's row lock until it commits,
so within a partition they commit in the order of their numbers, and the partition's
``head`` (the newest number, written by the same transaction) is never ahead of a
message that has not committed. A position read from ``head`` is therefore a safe
offset: every message at or below it is committed and visible to the executors' later
reads, and a push still in flight can only get a number above it. (Message ids are
random UUIDs and ``created_at`` is taken before commit, so neither would do.)

An offset maps each partition to the position of the last message read (0: none), so a
micro-batch reads, per partition, the messages after its start position up to its end
position. This module is pure: the readers fetch the heads and hand them in.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from conveyor import errors

EARLIEST, LATEST = -2, -1  # Kafka's sentinels, in a JSON of positions
Positions = dict[str, int]


@dataclass(frozen=True)
class Partition:
    """A partition as the driver saw it: its id (for the executors' reads) and head."""

    id: int
    head: int


@dataclass(frozen=True)
class Spec:
    """Where a read starts or ends: ``positions`` for the partitions named, ``default``
    (EARLIEST or LATEST) for the others."""

    default: int
    positions: tuple[tuple[str, int], ...] = ()


def parse(text: str, queue: str, label: str, *, default: int, allowed: tuple[int, ...]) -> Spec:
    """An option's value: ``earliest``, ``latest`` (each if ``allowed``) or a JSON object
    ``{"<queue>": {"<partition>": position}}`` with positions >= 0, or -2 / -1 for earliest /
    latest (again if allowed). Partitions not named get ``default``."""
    words = {"earliest": EARLIEST, "latest": LATEST}
    if text.strip().lower() in words:
        value = words[text.strip().lower()]
        if value not in allowed:
            raise errors.InvalidInput(f"option {label} cannot be {text.strip().lower()} here")
        return Spec(value)
    shape = f'{{"{queue}": {{"<partition>": <position>}}}}'
    try:
        document = json.loads(text)
    except ValueError:
        document = None
    if not isinstance(document, dict) or list(document) != [queue] or not isinstance(document[queue], dict):
        choices = " or ".join(k for k, v in words.items() if v in allowed)
        raise errors.InvalidInput(f"option {label} must be {choices + ' or ' if choices else ''}a JSON object "
                                  f"{shape}, got {text[:200]!r}")
    positions: list[tuple[str, int]] = []
    for name, value in document[queue].items():
        if type(value) is not int or value < EARLIEST or (value < 0 and value not in allowed):
            raise errors.InvalidInput(f"option {label}: the position of partition {name!r} must be a whole number "
                                      f">= 0{''.join(f' or {v}' for v in allowed)}, got {value!r}")
        positions.append((name, value))
    return Spec(default, tuple(sorted(positions)))


def resolve(spec: Spec, heads: Mapping[str, int], queue: str, label: str) -> Positions:
    """The positions ``spec`` means for the partitions there are now (``heads``)."""
    named = dict(spec.positions)
    unknown = sorted(set(named) - set(heads))
    if unknown:
        raise errors.InvalidInput(f"option {label} names partition {unknown[0]!r}, which the partitioned queue "
                                  f"{queue!r} does not have")
    positions: Positions = {}
    for name, head in heads.items():
        value = named.get(name, spec.default)
        if value > head:
            raise errors.InvalidInput(f"option {label}: partition {name!r} of {queue!r} has no message {value} yet "
                                      f"(its newest is {head})")
        positions[name] = {EARLIEST: 0, LATEST: head}.get(value, value)
    return positions


def offset(queue: str, positions: Mapping[str, int]) -> dict[str, Any]:
    """The offset Spark keeps: partitions in a fixed order, since Spark compares offsets
    by their JSON text."""
    return {queue: dict(sorted(positions.items()))}


def positions(value: Mapping[str, Any], queue: str) -> Positions:
    """The positions of an offset, after checking that it is one of this queue."""
    inner = value.get(queue)
    if (list(value) != [queue] or not isinstance(inner, dict)
            or not all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in inner.items())):
        raise errors.InvalidInput(
            f"checkpoint offset {json.dumps(value)[:300]} is not one of the partitioned queue {queue!r}: the "
            "checkpoint belongs to another query (use a checkpoint location of its own for each source)")
    return dict(inner)


def check(start: Mapping[str, int], heads: Mapping[str, int], queue: str) -> None:
    """A checkpoint ahead of the queue means it was dropped and created again since: the
    positions no longer name the same messages, so refuse rather than skip or repeat."""
    for name, position in start.items():
        head = heads.get(name)
        if head is None or head < position:
            now = "no longer exists" if head is None else f"has only {head} messages"
            raise errors.InvalidInput(
                f"the checkpoint has read partition {name!r} of {queue!r} up to message {position}, but it {now}: "
                "the queue was dropped and created again since; give the query a new checkpoint location")


def limit(start: Mapping[str, int], end: Mapping[str, int], max_rows: int | None) -> Positions:
    """``end`` cut down to about ``max_rows`` messages in all, spread over the partitions in
    proportion to what each has waiting (Kafka's maxOffsetsPerTrigger rule: a share under
    one message is rounded up, so every partition with messages moves)."""
    sizes = {name: position - start.get(name, 0) for name, position in end.items()}
    total = sum(size for size in sizes.values() if size > 0)
    if max_rows is None or total <= max_rows:
        return dict(end)
    cut: Positions = {}
    for name, size in sizes.items():
        share = max_rows * size / total
        take = math.ceil(share) if share < 1 else math.floor(share)
        cut[name] = start.get(name, 0) + min(max(size, 0), take)
    return cut
