"""Archive throughput: `conveyor pipeline archive` (Spark, local[1] and local[2]) beside a
plain single-process export of the same rows, in one run against the same PostgreSQL.

    ./bin/bench pipeline_bench.py [--rows 200000] [--masters local[1] local[2]] [--repeat 1]

Rows: a stream of --rows events (100-byte payloads) appended and ticked up front.
Columns:
  spark local[N]   ArchiveJob --once from the stream's first tick into a fresh Delta table
                   (read through the conveyor data source, committed by delta-rs on the
                   driver); timed from the query's start to its end, JVM start excluded
                   (shown apart), so the first micro-batch's Python worker start is in it
  copy + parquet   one process: psycopg COPY (SELECT ...) TO STDOUT as CSV, parsed by
                   pyarrow and written as one Parquet file: the one-machine baseline
Each Spark column runs in a child process of its own (one master per JVM). Everything is
bounded: --rows at most 2,000,000, each child at most --timeout seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from queue_bench import fresh_database

STREAM = "bench"
PAYLOAD = "x" * 100



def fill(dsn: str, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT conveyor.stream_create(%s, '{\"ticker_paused\": true}')", (STREAM,))
        done = 0
        while done < rows:
            n = min(10_000, rows - done)
            conn.execute("SELECT count(*) FROM conveyor.stream_send_batch(%s, 'bench', array_fill(%s::text, ARRAY[%s]))",
                         (STREAM, PAYLOAD, n))
            done += n
        conn.execute("SELECT conveyor.stream_force_tick(%s)", (STREAM,))


def baseline(dsn: str, target: Path) -> tuple[int, float]:
    """COPY the stream's events out as CSV, parse with pyarrow, write Parquet."""
    started = time.perf_counter()
    buf = io.BytesIO()
    with psycopg.connect(dsn) as conn, conn.cursor() as cur, cur.copy(
            "COPY (SELECT ev_id, ev_type, ev_data, ev_time FROM conveyor.stream_events) TO STDOUT (FORMAT csv)") as copy:
        for chunk in copy:
            buf.write(chunk)
    buf.seek(0)
    table = pacsv.read_csv(buf, read_options=pacsv.ReadOptions(column_names=["id", "type", "payload", "created_at"]),
                           convert_options=pacsv.ConvertOptions(column_types={"created_at": pa.timestamp("us", "UTC")}))
    pq.write_table(table, target)
    return table.num_rows, time.perf_counter() - started


def spark_child(master: str, dsn: str, path: str, consumer: str) -> None:
    """In a child process: one archive run; prints JSON."""
    started = time.perf_counter()
    from conveyor.pipeline import archive, session

    spark = session.build(master)
    jvm = time.perf_counter() - started
    result = archive.run(spark, archive.ArchiveJob(dsn=dsn, path=Path(path), stream=STREAM, consumer=consumer,
                                                   starting_position="earliest", max_events=1_000_000))
    spark.stop()
    print(json.dumps({"rows": result.rows, "seconds": result.seconds, "jvm_seconds": jvm,
                      "batches": result.batches}))


def run_spark(master: str, dsn: str, work: Path, n: int, timeout: float) -> dict[str, float]:
    path = work / f"lake-{master.removeprefix('local[').removesuffix(']')}-{n}"
    proc = subprocess.run([sys.executable, __file__, "--child", master, dsn, str(path), f"bench-{path.name}"],
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{master} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--masters", nargs="+", default=["local[1]", "local[2]"])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--child", nargs=4, metavar=("MASTER", "DSN", "PATH", "CONSUMER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        spark_child(*args.child)
        return
    rows = max(1, min(args.rows, 2_000_000))
    dsn = asyncio.run(fresh_database("conveyor_bench_pipeline"))
    print(f"filling stream {STREAM!r} with {rows:,} events ...", file=sys.stderr)
    fill(dsn, rows)
    results: dict[str, list[tuple[int, float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="conveyor-pipeline-bench-") as tmp:
        work = Path(tmp)
        for n in range(args.repeat):
            for master in args.masters:
                r = run_spark(master, dsn, work, n, args.timeout)
                results.setdefault(f"spark {master}", []).append((r["rows"], r["seconds"], r["jvm_seconds"]))
            got, seconds = baseline(dsn, work / f"baseline-{n}.parquet")
            results.setdefault("copy + parquet", []).append((got, seconds, 0.0))
    print(f"\narchive of {rows:,} stream events (100-byte payloads), median of {args.repeat} run(s)")
    print(f"{'':18}{'rows':>10}{'seconds':>10}{'rows/s':>12}{'JVM start s':>13}")
    for name, runs in results.items():
        runs.sort(key=lambda r: r[1])
        got, seconds, jvm = runs[len(runs) // 2]
        print(f"{name:18}{got:>10,}{seconds:>10.2f}{got / seconds:>12,.0f}{jvm:>13.1f}")
        if got != rows:
            print(f"  !! {name} archived {got:,} rows, expected {rows:,}")


if __name__ == "__main__":
    main()
