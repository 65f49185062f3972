"""The lake: Delta tables whose data files the Spark tasks write (pipeline.datafiles)
and whose log the driver commits with delta-rs (the ``deltalake`` package), so that every
reader — Spark, DuckDB, pyarrow, delta-rs — sees a micro-batch entirely or not at all.

The driver commits the files of a micro-batch's successful task attempts as **one**
Delta commit (``add`` actions for files delta-rs did not write), carrying an
application transaction (run id, micro-batch id): a micro-batch that Spark replays after
a crash finds its id already committed and is skipped. A Delta commit is one atomic
write of the next log entry; files it does not list — a failed attempt's, a half-written
one — are never read. Spark's own Parquet sink would leave such files visible to every
reader that is not Spark.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Schema, Transaction
from deltalake.exceptions import TableNotFoundError
from deltalake.transaction import AddAction, create_table_with_add_actions

from conveyor import errors
from conveyor.pipeline import datafiles

PARTITION = datafiles.PARTITION


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


def table_schema(files: Sequence[datafiles.File]) -> pa.Schema:
    """The table's schema for these files: theirs (all the same), then ``date``."""
    schemas = {f.arrow_schema for f in files}
    if len(schemas) != 1:
        raise errors.InternalError(f"the files of one micro-batch have {len(schemas)} different schemas")
    return files[0].schema().append(pa.field(PARTITION, pa.date32()))


def _add(file: datafiles.File) -> AddAction:
    return AddAction(path=file.path, size=file.size, partition_values={PARTITION: file.date},
                     modification_time=file.modified_ms, data_change=True, stats=file.stats)


def commit_files(path: str | Path, files: Sequence[datafiles.File], run_id: str, batch_id: int,
                 metadata: Mapping[str, Any]) -> bool:
    """Commits ``files`` (written into the table's directory) as micro-batch ``batch_id``
    of ``run_id``, unless that batch is already in the table (then False). One Delta
    commit, which creates the table if there is none yet."""
    table = open_table(path)
    done = None if table is None else table.transaction_version(run_id)
    if done is not None and done >= batch_id:
        return False
    schema = Schema.from_arrow(table_schema(files))
    properties = CommitProperties(
        custom_metadata={**metadata, "conveyor.run_id": run_id, "conveyor.batch_id": batch_id},
        app_transactions=[Transaction(app_id=run_id, version=batch_id)])
    adds = [_add(f) for f in files]
    if table is None:
        create_table_with_add_actions(str(path), schema, adds, mode="error", partition_by=[PARTITION],
                                      commit_properties=properties)
        return True
    if table.schema() != schema or table.metadata().partition_columns != [PARTITION]:
        # delta-rs commits added files without checking them against the table
        raise errors.InvalidInput(f"the table {path} holds other columns than this archive writes: "
                                  "give each source a table of its own")
    table.create_write_transaction(adds, "append", schema, partition_by=[PARTITION], commit_properties=properties)
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


def size(path: str | Path) -> int:
    """The bytes of the table's current files."""
    return sum(pa.table(DeltaTable(str(path)).get_add_actions()).column("size_bytes").to_pylist())


def files(table: DeltaTable) -> set[str]:
    """The table's current files, relative to its root (as the log lists them)."""
    return set(pa.table(table.get_add_actions()).column("path").to_pylist())


def compact(path: str | Path, retention_hours: int = 168) -> dict[str, int]:
    """Keeps a table healthy, with delta-rs: small files of each date merged into larger
    ones (``optimize.compact``: one Delta commit that changes no data, so readers and the
    archive's replay check are unaffected and an archive may append meanwhile), then the
    files no version younger than ``retention_hours`` lists deleted (``vacuum``, full:
    the replaced files, and stray files of failed task attempts). Time travel to versions
    older than the retention is given up; 0 keeps only the current version."""
    table = open_table(path)
    if table is None:
        raise errors.InvalidInput(f"{path} is not a Delta table")
    merged = table.optimize.compact()
    removed = table.vacuum(retention_hours=retention_hours, dry_run=False, enforce_retention_duration=False,
                           full=True)
    return {"files_added": int(merged.get("numFilesAdded", 0)), "files_replaced": int(merged.get("numFilesRemoved", 0)),
            "files_deleted": len(removed)}
