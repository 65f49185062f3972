"""The files a task writes and their descriptions (pipeline.datafiles), committed by the
driver (lake.commit_files), read back by delta-rs: Hive-style date directories, and
statistics that never make a reader skip a file holding a matching row."""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from conveyor.pipeline import datafiles, lake

UTC = dt.UTC
T = dt.datetime(2026, 11, 25, 23, 59, 59, 747_500, tzinfo=UTC)  # sub-millisecond on purpose


def _batch(ids: list[int], stamps: list[dt.datetime | None], bodies: list[str]) -> pa.RecordBatch:
    batch = pa.RecordBatch.from_pydict({
        "id": pa.array(ids, pa.int64()), "created_at": pa.array(stamps, pa.timestamp("us", tz="UTC")),
        "body": pa.array(bodies, pa.string())})
    return datafiles.with_date(batch, "created_at")


def test_a_task_writes_a_file_per_date_and_describes_it(tmp_path):
    long = "x" * 40
    batches = [_batch([1, 2], [T, T + dt.timedelta(microseconds=1)], ["a", long]),
               _batch([3, 4], [T + dt.timedelta(seconds=1), None], ["b", "c"])]
    files = datafiles.write(tmp_path, datafiles.prefix("run", 7), batches)
    by_date = {f.date: f for f in files}
    assert set(by_date) == {"2026-11-25", "2026-11-26", None}
    day = by_date["2026-11-25"]
    assert day.path.startswith("date=2026-11-25/" + datafiles.prefix("run", 7)) and day.rows == 2
    assert by_date[None].path.startswith("date=__HIVE_DEFAULT_PARTITION__/")
    assert pq.read_table(tmp_path / day.path).column("id").to_pylist() == [1, 2]
    assert (tmp_path / day.path).stat().st_size == day.size
    stats = json.loads(day.stats)
    assert stats["numRecords"] == 2 and stats["nullCount"] == {"id": 0, "created_at": 0, "body": 0}
    # timestamps to the millisecond, widened outwards; a long string has a prefix as its
    # minimum and no maximum
    assert stats["minValues"] == {"id": 1, "created_at": "2026-11-25T23:59:59.747Z", "body": "a"}
    assert stats["maxValues"] == {"id": 2, "created_at": "2026-11-25T23:59:59.748Z"}


def test_readers_prune_with_the_statistics_and_never_lose_a_row(tmp_path):
    files = datafiles.write(tmp_path, datafiles.prefix("run", 0),
                            [_batch([1, 2], [T - dt.timedelta(minutes=1), T], ["a", "b"])])
    assert lake.commit_files(tmp_path, files, "run", 0, {})
    table = DeltaTable(str(tmp_path))
    # the last row's exact timestamp (23:59:59.7475, finer than the statistics) selects
    # the file; anything above its statistics prunes it
    exact = T.isoformat()
    assert len(table.file_uris(file_pruning_predicate=f"created_at >= '{exact}'")) == 1
    assert table.file_uris(file_pruning_predicate=f"created_at > '{(T + dt.timedelta(milliseconds=2)).isoformat()}'") == []
    assert table.file_uris(file_pruning_predicate="id > 2") == []
    got = table.to_pyarrow_table(filters=[("created_at", ">=", T)]).column("id").to_pylist()
    assert got == [2]


def test_sweep_deletes_only_what_no_commit_lists_of_that_micro_batch(tmp_path):
    name = datafiles.prefix("run", 3)
    kept = datafiles.write(tmp_path, name, [_batch([1], [T], ["a"])])
    lost = datafiles.write(tmp_path, name, [_batch([1], [T], ["a"])])  # a failed attempt's
    other = datafiles.write(tmp_path, datafiles.prefix("run", 4), [_batch([2], [T], ["b"])])
    assert lake.commit_files(tmp_path, kept, "run", 3, {})
    assert datafiles.sweep(tmp_path, name, {f.path for f in kept}, {f.date for f in kept}) == [lost[0].path]
    assert (tmp_path / kept[0].path).exists() and (tmp_path / other[0].path).exists()
    # a replay sweeps every date directory against the log: nothing more to delete
    assert datafiles.sweep(tmp_path, name, lake.files(DeltaTable(str(tmp_path)))) == []
    assert not lake.commit_files(tmp_path, lost, "run", 3, {})  # batch 3 is in: not again
