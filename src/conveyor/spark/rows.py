"""Database rows to Arrow record batches (what the readers hand to Spark)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from conveyor.spark import schemas


def _attributes(value: Any) -> list[tuple[str, str]] | None:
    if value is None:
        return None
    return [(k, v if isinstance(v, str) else json.dumps(v, separators=(",", ":")))
            for k, v in value.items()]


def to_batch(fields: Sequence[schemas.Field], name: str, rows: Sequence[Sequence[Any]]) -> pa.RecordBatch:
    """``rows`` hold every field but the first (the queue or stream name, ``name``)."""
    columns = list(zip(*rows, strict=False)) if rows else [() for _ in fields[1:]]
    arrays = [pa.array([name] * len(rows), pa.string())]
    for field, values in zip(fields[1:], columns, strict=False):
        if field.name == "attributes":
            values = [_attributes(v) for v in values]
        arrays.append(pa.array(values, type=field.arrow))
    return pa.RecordBatch.from_arrays(arrays, schema=schemas.arrow(fields))
