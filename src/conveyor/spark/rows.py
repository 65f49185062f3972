"""Database rows to Arrow record batches (what the readers hand to Spark), with sealed
partitioned-queue payloads opened on the way."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from conveyor import crypto, errors
from conveyor.spark import schemas


def _attributes(value: Any) -> list[tuple[str, str]] | None:
    if value is None:
        return None
    return [(k, v if isinstance(v, str) else json.dumps(v, separators=(",", ":")))
            for k, v in value.items()]


def to_batch(fields: Sequence[schemas.Field], name: str, rows: Sequence[Sequence[Any]],
             keep: Sequence[schemas.Field] | None = None) -> pa.RecordBatch:
    """``rows`` hold every field but the first (the queue or stream name, ``name``); the
    batch has the fields of ``keep`` (default: all), the others are not converted."""
    keep = fields if keep is None else keep
    wanted = {f.name for f in keep}
    columns = list(zip(*rows, strict=False)) if rows else [() for _ in fields[1:]]
    arrays = [pa.array([name] * len(rows), pa.string())]
    for field, values in zip(fields[1:], columns, strict=False):
        if field.name not in wanted:
            continue
        if field.name == "attributes":
            values = [_attributes(v) for v in values]
        arrays.append(pa.array(values, type=field.arrow))
    return pa.RecordBatch.from_arrays(arrays, schema=schemas.arrow(keep))


def opened(fields: Sequence[schemas.Field], rows: Sequence[Sequence[Any]],
           keys: Sequence[tuple[str, bytes]]) -> Sequence[Sequence[Any]]:
    """Rows with a ``payload`` stored sealed (``encrypted``; conveyor.crypto) as it was
    pushed. ``keys`` are the driver's CONVEYOR_ENCRYPTION_KEY; a sealed payload without
    them fails the read rather than reach Spark as ciphertext."""
    names = [f.name for f in fields[1:]]  # the query's columns (row_fields)
    payload, sealed = names.index("payload"), names.index("encrypted")
    if not any(row[sealed] for row in rows):
        return rows
    if not keys:
        raise errors.Unavailable("the partitioned queue holds sealed payloads (encryption at rest) and the query's "
                                 "driver has no CONVEYOR_ENCRYPTION_KEY to open them: set it where the driver runs")
    keyring = crypto.Keyring.of(keys)
    return [(*row[:payload], keyring.open_text(row[payload]), *row[payload + 1:]) if row[sealed] else row
            for row in rows]
