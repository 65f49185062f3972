"""The lake: Delta tables written by delta-rs (the ``deltalake`` package), committed on
the driver, so that every reader — Spark, DuckDB, pyarrow, delta-rs — sees a micro-batch
entirely or not at all.

Each commit carries an application transaction (run id, micro-batch id): a micro-batch
that Spark replays after a crash finds its id already committed and is skipped. Spark's
own Parquet sink would leave the files of a failed attempt behind, hidden only from
readers of Spark's metadata log; a Delta commit is one atomic rename of the log entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import TableNotFoundError

PARTITION = "date"


def open_table(path: str | Path) -> DeltaTable | None:
    """The table at ``path``, or None if there is none yet."""
    try:
        return DeltaTable(str(path))
    except TableNotFoundError:
        return None


def committed(path: str | Path, run_id: str) -> int | None:
    """The last micro-batch id the run committed into the table (None: none yet)."""
    table = open_table(path)
    return None if table is None else table.transaction_version(run_id)


def with_date(data: pa.Table, column: str) -> pa.Table:
    """Adds the partition column ``date``: the UTC day of ``column``."""
    return data.append_column(PARTITION, pc.cast(data.column(column), pa.date32()))


def commit(path: str | Path, data: pa.Table, run_id: str, batch_id: int, metadata: Mapping[str, Any]) -> bool:
    """Appends ``data`` as micro-batch ``batch_id`` of ``run_id``, unless that batch is
    already in the table (then False). One Delta commit: all of it or nothing."""
    done = committed(path, run_id)
    if done is not None and done >= batch_id:
        return False
    write_deltalake(
        str(path), data, mode="append", partition_by=[PARTITION],
        commit_properties=CommitProperties(
            custom_metadata={**metadata, "conveyor.run_id": run_id, "conveyor.batch_id": batch_id},
            app_transactions=[Transaction(app_id=run_id, version=batch_id)]))
    return True


def tables(paths: list[str | Path]) -> list[Path]:
    """The Delta tables named: each path is a table, or a directory of tables."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if (path / "_delta_log").is_dir():
            found.append(path)
        elif path.is_dir():
            found.extend(sorted(p for p in path.iterdir() if (p / "_delta_log").is_dir()))
    return found


def live_files(path: str | Path) -> list[str]:
    """The Parquet files of the table's current version (what a Delta reader reads)."""
    table = DeltaTable(str(path))
    return list(table.file_uris())
