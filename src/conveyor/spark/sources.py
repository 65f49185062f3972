"""Several sources of one kind in one read (Kafka's ``subscribe`` and
``subscribePattern``): ``queue``, ``stream`` or ``partitionedQueue`` as a comma-separated
list, or ``queuePattern``, ``streamPattern``, ``partitionedQueuePattern`` as a regular
expression that whole names match (Python's ``re``, as Kafka's Java pattern; a pattern is
looked up again at each trigger of a streaming query). Every row already says which
source it came from: the schemas' first column is its queue or stream name.

Each source is read with the query's options re-parsed for it alone (``one``): a JSON
``startingOffsets``, ``endingOffsets`` or ``startingOffsetsByTimestamp`` may name several
partitioned queues, and each gets its own part. A streaming read keeps
``{"sources": {name: that source's offset}}`` (streaming.Several).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from conveyor import errors
from conveyor.db import sync
from conveyor.spark import options as opts

_NAMES = {"queue": "pipeline_queue_names", "stream": "pipeline_stream_names",
          "partitionedqueue": "pipeline_pqueue_names"}
_DOCUMENTS = ("startingoffsets", "endingoffsets", "startingoffsetsbytimestamp")


def _key(options: opts.Options) -> str:
    return "partitionedqueue" if options.partitioned_queue is not None else (
        "stream" if options.stream is not None else "queue")


def names(options: opts.Options) -> list[str]:
    """The sources named: the list as given, or the names matching the pattern now."""
    if options.pattern is None:
        return list(dict.fromkeys(n.strip() for n in options.target.split(",")))
    with sync.connect(options.dsn) as conn:
        found = [row[0] for row in sync.fetch_all(conn, _NAMES[_key(options)])]
    pattern = re.compile(options.pattern)
    return sorted(n for n in found if pattern.fullmatch(n))


def one(options: opts.Options, name: str, from_start: bool = False) -> opts.Options:
    """The options for source ``name`` alone. ``from_start``: a source found after the
    query started, read from its beginning."""
    raw = {k: v for k, v in options.raw if k not in opts.PATTERNS and k not in opts.TARGETS}
    raw[_key(options)] = name
    for key in _DOCUMENTS:
        text = raw.get(key)
        if text is not None and text.strip().lower() not in ("earliest", "latest"):
            raw[key] = json.dumps({name: _document(text, key).get(name, {})})
    if from_start:
        for key in (*_DOCUMENTS[::2], "startingtimestamp"):
            raw.pop(key, None)
        raw["startingoffsets" if _key(options) == "partitionedqueue" else "startingposition"] = "earliest"
    return opts.parse(raw)


def _document(text: str, key: str) -> dict[str, Any]:
    try:
        document = json.loads(text)
    except ValueError:
        document = None
    if not isinstance(document, dict):
        raise errors.InvalidInput(f"option {key} must be earliest, latest or a JSON object "
                                  f'{{"<queue>": {{"<partition>": <value>}}, ...}}, got {text[:200]!r}')
    return document


def offset(ends: Mapping[str, Any]) -> dict[str, Any]:
    return {"sources": dict(sorted(ends.items()))}


def inner(value: Mapping[str, Any]) -> dict[str, Any]:
    """The per-source offsets of an offset of several sources."""
    found = value.get("sources")
    if list(value) != ["sources"] or not isinstance(found, dict):
        raise errors.InvalidInput(f"checkpoint offset {json.dumps(value)[:300]} is not one of several sources: the "
                                  "checkpoint belongs to another query (use a checkpoint location of its own)")
    return dict(found)
