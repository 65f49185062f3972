"""Archive throughput and driver memory: `conveyor pipeline archive` (Spark) at local[1],
local[2] and on a standalone cluster, beside a plain single-process export of the same
rows, in one run against the same PostgreSQL; and the driver's peak memory against the
micro-batch size.

    ./bin/bench pipeline_bench.py [--rows 200000] [--max-events 100000] [--repeat 3]
                                  [--sizes 10000 100000 400000] [--small 1000] [--no-cluster]
                                  [--steady 20000 200000] [--rounds 3]
                                  [--tree before=/path/to/old/src --tree after=src]

Throughput: a stream of --rows events (100-byte payloads), a tick every 10,000 events
(a micro-batch is made of whole ticks, so --max-events can split it).
  spark local[N] / cluster   ArchiveJob --once from the stream's first tick into a fresh
                   Delta table, as a new consumer, --max-events per micro-batch; timed
                   from the query's start to its end (JVM start excluded, shown apart), so
                   the first micro-batch's Python worker start is in it. --repeat runs in
                   one Spark session (a child process per master and tree), median quoted.
  cluster          a standalone master and two one-core workers (512 MB executors) started
                   here from the installed PySpark on loopback, as tests/spark/test_cluster.py
                   does, and stopped at the end
  copy + parquet   one process: psycopg COPY (SELECT ...) TO STDOUT as CSV, parsed by
                   pyarrow and written as one Parquet file: the floor any archiver must beat
Memory: for each of --sizes in increasing order, a stream of exactly that many events (a
tick every --small events) archived as one micro-batch (local[2], and on the cluster, in
the same child process, before its throughput runs); after each, the peak resident set so
far (VmHWM) of the driver's Python process and of its JVM: the most any micro-batch up to
that size needed. In local mode the JVM also runs the tasks; on the cluster it is the
driver alone.
Fixed cost: the smallest of --sizes again, in micro-batches of --small events, in the
warm session (seconds per micro-batch).
Steady rate, another way (--steady A B; --steady with no numbers skips it): the CLI
`conveyor pipeline archive --once` (its own process, local[2]) of a new stream of A events,
then of B events appended after it (incremental, the same table and consumer): the JVM's
start and the job's set-up cancel in B / (median t2 - median t1), the medians over --rounds
rounds, trees alternated (a round's own t2 - t1 is at the mercy of one JVM start's noise).
Small work (--rounds times, trees alternated, after a warm-up round): a bare local Spark
session started and stopped (`SparkSession.builder...getOrCreate(); stop()`, a process of
its own), an incremental `archive --once` of 1 event (CLI, local[*]), and `report` over a
table of 4 events (CLI, local[*]); each as wall time and as a ratio to the bare session of
the same round (median of the rounds' ratios); for a tree that gives its driver JVM
options of its own (a class data sharing archive, the quick compiler only: pipeline.cds,
pipeline.session), also a bare session with those options ("bare tuned") and the report's
ratio to it. Each tree's warm-up runs its report once (creating such an archive).
--tree LABEL=SRC runs the Spark children and the CLI on that source tree (PYTHONPATH=SRC);
given more than once, each master runs each tree in turn, side by side in one run
(before/after).
Everything is bounded: --rows and --sizes at most 2,000,000, each child at most --timeout
seconds, the cluster's start at 60 s.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from conveyor.spark import standalone
from sqs_bench import create_database, drop_database

STREAM = "bench"
PAYLOAD = "x" * 100
TICK_EVERY = 10_000
CLUSTER_CONF = {"spark.executor.memory": "512m", "spark.cores.max": "2", "spark.sql.shuffle.partitions": "2",
                "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                "spark.ui.enabled": "false"}


def fill(dsn: str, stream: str, rows: int, tick_every: int = TICK_EVERY) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT conveyor.stream_create(%s, '{\"ticker_paused\": true}')", (stream,))
        done = 0
        while done < rows:
            n = min(tick_every, rows - done)
            conn.execute("SELECT count(*) FROM conveyor.stream_send_batch(%s, 'bench', array_fill(%s::text, ARRAY[%s]))",
                         (stream, PAYLOAD, n))
            conn.execute("SELECT conveyor.stream_force_tick(%s)", (stream,))
            done += n


def baseline(dsn: str, target: Path) -> tuple[int, float]:
    """COPY the throughput stream's events out as CSV, parse with pyarrow, write Parquet."""
    started = time.perf_counter()
    buf = io.BytesIO()
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        # a stream's events are in conveyor.stream_<its id> (the parent of its tables)
        sid = int(cur.execute("SELECT id FROM conveyor.streams WHERE name = %s", (STREAM,)).fetchone()[0])
        with cur.copy(f"COPY (SELECT ev_id, ev_type, ev_data, ev_time FROM conveyor.stream_{sid}) "
                      "TO STDOUT (FORMAT csv)") as copy:
            for chunk in copy:
                buf.write(chunk)
    buf.seek(0)
    table = pacsv.read_csv(buf, read_options=pacsv.ReadOptions(column_names=["id", "type", "payload", "created_at"]),
                           convert_options=pacsv.ConvertOptions(column_types={"created_at": pa.timestamp("us", "UTC")}))
    pq.write_table(table, target)
    return table.num_rows, time.perf_counter() - started


# -- in a child process: one Spark session ---------------------------------------------------

def peak_kb(pid: int) -> int:
    """A process's peak resident set (VmHWM), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def jvm_pid() -> int:
    """The driver's JVM: this process's child running java (spark-submit execs into it)."""
    me = str(os.getpid())
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if fields[1] == me and "java" in (stat.parent / "comm").read_text():
                return int(stat.parent.name)
    raise RuntimeError("no JVM child found")


def archive_once(spark: object, dsn: str, work: str, stream: str, max_events: int) -> dict:
    """One archive of the whole stream into a fresh table, as a new consumer."""
    from conveyor.pipeline import archive

    name = uuid.uuid4().hex[:8]
    result = archive.run(spark, archive.ArchiveJob(dsn=dsn, path=Path(work) / f"lake-{name}", stream=stream,
                                                   consumer=f"bench-{name}", starting_position="earliest",
                                                   max_events=max_events))
    return {"rows": result.rows, "seconds": result.seconds, "batches": result.batches}


def peaks() -> dict[str, int]:
    return {"python_peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "jvm_peak_kb": peak_kb(jvm_pid())}


def spark_child(master: str, dsn: str, work: str, sizes: list[int], small: int, max_events: int,
                repeat: int) -> None:
    """In a child process, one Spark session: first the memory sweep (for each size, in
    increasing order, one micro-batch of that many events, then the peaks so far: each
    is the most any micro-batch up to that size needed), then the smallest size again in
    micro-batches of ``small`` events (the fixed cost of a micro-batch, warm), then
    ``repeat`` archives of the throughput stream. Prints JSON."""
    started = time.perf_counter()
    from conveyor.pipeline import session

    spark = session.build(master, {} if master.startswith("local") else CLUSTER_CONF)
    jvm = time.perf_counter() - started
    sweep = [{"size": size, **archive_once(spark, dsn, work, sweep_stream(size), size), **peaks()}
             for size in sorted(sizes)]
    little = archive_once(spark, dsn, work, sweep_stream(min(sizes)), small) if sizes and small else None
    runs = [archive_once(spark, dsn, work, STREAM, max_events) for _ in range(repeat)]
    spark.stop()
    print(json.dumps({"sweep": sweep, "small": little, "runs": runs, "jvm_seconds": jvm}))


def run_spark(master: str, tree: str | None, dsn: str, work: Path, sizes: list[int], small: int, max_events: int,
              repeat: int, timeout: float) -> dict:
    """A child process; ``tree``: the source tree (its ``src``) whose archive it runs."""
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", **({"PYTHONPATH": tree} if tree else {})}
    proc = subprocess.run([sys.executable, __file__, "--child", master, dsn, str(work),
                           ",".join(str(s) for s in sizes), str(small), str(max_events), str(repeat)],
                          capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{master} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- the CLI, timed: steady rate and small work ---------------------------------------------------

BARE = ("from pyspark.sql import SparkSession\n"
        "SparkSession.builder.master('local[*]').config('spark.ui.enabled', 'false')"
        ".config('spark.driver.host', '127.0.0.1').config('spark.driver.bindAddress', '127.0.0.1')"
        ".getOrCreate().stop()")
# the same bare session with the JVM options the tree's `report` gives its driver (its class
# data sharing archive, the quick compiler only): what those options do without Conveyor
BARE_TUNED = ("from pyspark.sql import SparkSession\n"
              "from conveyor.pipeline import cds, session\n"
              "archive = cds.prepare()\n"
              "options = [*(archive.options() if archive and archive.creating is None else []), *session.SHORT]\n"
              "SparkSession.builder.master('local[*]').config('spark.ui.enabled', 'false')"
              ".config('spark.driver.host', '127.0.0.1').config('spark.driver.bindAddress', '127.0.0.1')"
              ".config(session.JAVA_OPTIONS, ' '.join(options)).getOrCreate().stop()")


def tuned(tree: str | None) -> bool:
    """Whether the tree gives its driver JVM options of its own (pipeline.cds)."""
    return (Path(tree) if tree else Path(__file__).resolve().parents[1] / "src").joinpath(
        "conveyor", "pipeline", "cds.py").is_file()


def timed(args: list[str], tree: str | None, timeout: float) -> float:
    """Wall seconds of a child process (PYTHONPATH=``tree``); it must succeed."""
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", **({"PYTHONPATH": tree} if tree else {})}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{args} failed:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - started


def conveyor(dsn: str, *args: str) -> list[str]:
    return ["-m", "conveyor", "--database-url", dsn, "pipeline", *args]


def steady(dsn: str, work: Path, trees: list[tuple[str, str | None]], first: int, then: int, rounds: int,
           timeout: float) -> dict[str, list[tuple[float, float]]]:
    """Per tree, (t1, t2) of each round: the seconds of the first run and of the second."""
    rates: dict[str, list[tuple[float, float]]] = {label: [] for label, _ in trees}
    for r in range(rounds):
        for label, tree in trees:
            stream = f"steady_{r}_{uuid.uuid4().hex[:6]}"
            fill(dsn, stream, first)
            job = conveyor(dsn, "archive", "--stream", stream, "--path", str(work / f"steady-{stream}"), "--once",
                           "--master", "local[2]")
            t1 = timed(job, tree, timeout)
            append_events(dsn, stream, then)
            t2 = timed(job, tree, timeout)
            rates[label].append((t1, t2))
    return rates


def append_events(dsn: str, stream: str, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for done in range(0, rows, TICK_EVERY):
            conn.execute("SELECT count(*) FROM conveyor.stream_send_batch(%s, 'bench', array_fill(%s::text, ARRAY[%s]))",
                         (stream, PAYLOAD, min(TICK_EVERY, rows - done)))
            conn.execute("SELECT conveyor.stream_force_tick(%s)", (stream,))


def small_work(dsn: str, work: Path, trees: list[tuple[str, str | None]], rounds: int,
               timeout: float) -> dict[str, dict[str, list[float]]]:
    """Per tree: seconds of the bare session, the 1-event archive and the small report, per round."""
    seconds: dict[str, dict[str, list[float]]] = {
        label: {"bare": [], "archive": [], "report": [], "bare_tuned": []} for label, _ in trees}
    lakes = {}
    for label, tree in trees:  # warm-up: each tree's table of 4 events, and its first runs
        stream = f"small_{uuid.uuid4().hex[:6]}"
        fill(dsn, stream, 4)
        lakes[label] = (stream, work / f"small-{stream}")
        timed(conveyor(dsn, "archive", "--stream", stream, "--path", str(lakes[label][1]), "--once"), tree, timeout)
        # a tree that keeps a class data sharing archive creates it here, not in a timed run
        timed(conveyor(dsn, "report", str(lakes[label][1]), "--out", str(work / f"report-{label}")), tree, timeout)
    for _ in range(rounds):
        for label, tree in trees:
            stream, lake = lakes[label]
            seconds[label]["bare"].append(timed(["-c", BARE], tree, timeout))
            if tuned(tree):
                seconds[label]["bare_tuned"].append(timed(["-c", BARE_TUNED], tree, timeout))
            append_events(dsn, stream, 1)
            seconds[label]["archive"].append(timed(
                conveyor(dsn, "archive", "--stream", stream, "--path", str(lake), "--once"), tree, timeout))
            seconds[label]["report"].append(timed(
                conveyor(dsn, "report", str(lake), "--out", str(work / f"report-{label}")), tree, timeout))
    return seconds


def report_cli(steady_rates: dict[str, list[tuple[float, float]]], small: dict[str, dict[str, list[float]]],
               copy_rate: float, first: int, then: int) -> None:
    if steady_rates:
        print(f"\nsteady rate: `archive --once` of {first:,} events (t1), then of {then:,} more (t2) (CLI, local[2]): "
              f"{then:,} / (median t2 - median t1), {len(next(iter(steady_rates.values())))} round(s)")
        print(f"{'':18}{'t1 s':>7}{'t2 s':>7}{'rows/s':>10}{'x COPY':>9}")
        for label, runs in steady_rates.items():
            t1, t2 = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
            rate = then / (t2 - t1) if t2 > t1 else float("inf")
            print(f"{label or 'this tree':18}{t1:>7.1f}{t2:>7.1f}{rate:>10,.0f}{rate / copy_rate:>9.2f}")
    if small:
        print("\nsmall work (CLI, local[*]): seconds, median; ratio to a bare session start+stop of the same round")
        print(f"{'':18}{'bare':>7}{'archive 1':>11}{'ratio':>7}{'report 4':>10}{'ratio':>7}"
              f"{'bare tuned':>12}{'report/tuned':>14}")
        for label, runs in small.items():
            def ratio(key: str, base: str = "bare", runs: dict[str, list[float]] = runs) -> float:
                return statistics.median(a / b for a, b in zip(runs[key], runs[base], strict=True))

            print(f"{label or 'this tree':18}{statistics.median(runs['bare']):>7.1f}"
                  f"{statistics.median(runs['archive']):>11.1f}{ratio('archive'):>7.2f}"
                  f"{statistics.median(runs['report']):>10.1f}{ratio('report'):>7.2f}"
                  + (f"{statistics.median(runs['bare_tuned']):>12.1f}{ratio('report', 'bare_tuned'):>14.2f}"
                     if runs["bare_tuned"] else f"{'-':>12}{'-':>14}"))


# -- the run ----------------------------------------------------------------------------------

def sweep_stream(size: int) -> str:
    return f"sweep_{size}"


def report(rows: int, max_events: int, repeat: int, small: int, results: dict[str, dict],
           copies: list[tuple[int, float]]) -> None:
    print(f"\narchive of {rows:,} stream events (100-byte payloads), {max_events:,} per micro-batch, "
          f"median of {repeat} run(s)")
    width = max(18, *(len(label) + 8 for label in results))
    print(f"{'':{width}}{'rows':>10}{'seconds':>9}{'rows/s':>10}{'JVM start s':>13}")
    for label, result in results.items():
        seconds = statistics.median(r["seconds"] for r in result["runs"])
        got = result["runs"][0]["rows"]
        print(f"{'spark ' + label:{width}}{got:>10,}{seconds:>9.2f}{got / seconds:>10,.0f}"
              f"{result['jvm_seconds']:>13.1f}")
        if any(r["rows"] != rows for r in result["runs"]):
            print(f"  !! spark {label} archived {[r['rows'] for r in result['runs']]} rows, expected {rows:,}")
    got, seconds = sorted(copies, key=lambda c: c[1])[len(copies) // 2]
    print(f"{'copy + parquet':{width}}{got:>10,}{seconds:>9.2f}{got / seconds:>10,.0f}{'-':>13}")
    print("\ndriver peak resident memory (MiB) after one micro-batch of N events (sizes in increasing order)")
    print(f"{'':{width}}{'N':>10}{'Python':>9}{'JVM':>9}{'seconds':>9}{'rows/s':>10}")
    for label, result in results.items():
        for point in result["sweep"]:
            print(f"{'spark ' + label:{width}}{point['size']:>10,}{point['python_peak_kb'] / 1024:>9,.0f}"
                  f"{point['jvm_peak_kb'] / 1024:>9,.0f}{point['seconds']:>9.2f}"
                  f"{point['rows'] / point['seconds']:>10,.0f}")
            if point["rows"] != point["size"] or point["batches"] != 1:
                print(f"  !! {point['rows']:,} rows in {point['batches']} micro-batches, expected one of {point['size']:,}")
    smalls = {label: r["small"] for label, r in results.items() if r.get("small")}
    if smalls:
        print(f"\nfixed cost: micro-batches of {small:,} events, warm session")
        print(f"{'':{width}}{'batches':>10}{'seconds':>9}{'s/batch':>9}")
        for label, run in smalls.items():
            print(f"{'spark ' + label:{width}}{run['batches']:>10}{run['seconds']:>9.2f}"
                  f"{run['seconds'] / max(run['batches'], 1):>9.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--max-events", type=int, default=100_000, help="micro-batch size for the throughput runs")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000, 400_000],
                        help="micro-batch sizes for the memory sweep (local[2] and the cluster)")
    parser.add_argument("--small", type=int, default=1_000,
                        help="micro-batch size for the fixed-cost run (over the smallest of --sizes)")
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=SRC",
                        help="run the Spark children on this source tree's src (repeatable: side by side)")
    parser.add_argument("--no-cluster", action="store_true", help="skip the standalone cluster")
    parser.add_argument("--no-throughput", action="store_true",
                        help="skip the Spark children (throughput, memory, fixed cost); CLI sections only")
    parser.add_argument("--steady", type=int, nargs="*", default=[20_000, 200_000], metavar="N",
                        help="events of the first and the second `archive --once` of the steady rate (none: skip)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the steady and small-work sections")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--child", nargs=7, help=argparse.SUPPRESS,
                        metavar=("MASTER", "DSN", "WORK", "SIZES", "SMALL", "MAX_EVENTS", "REPEAT"))
    args = parser.parse_args()
    if args.child:
        master, dsn, work, sizes, small, max_events, repeat = args.child
        spark_child(master, dsn, work, [int(s) for s in sizes.split(",") if s], int(small), int(max_events),
                    int(repeat))
        return
    rows = max(1, min(args.rows, 2_000_000))
    sizes = [max(1, min(size, 2_000_000)) for size in args.sizes]
    small = max(0, min(args.small, min(sizes, default=0)))
    trees: list[tuple[str, str | None]] = [(t.partition("=")[0], t.partition("=")[2]) for t in args.tree] or [("", None)]
    database = f"conveyor_bench_archive_{uuid.uuid4().hex[:8]}"
    dsn = create_database(database, migrated=True)
    results: dict[str, dict] = {}
    try:
        print(f"filling stream {STREAM!r} with {rows:,} events, and one stream per size {sizes} ...", file=sys.stderr)
        fill(dsn, STREAM, rows)
        for size in sizes:
            fill(dsn, sweep_stream(size), size, min(TICK_EVERY, small or TICK_EVERY))
        with tempfile.TemporaryDirectory(prefix="conveyor-pipeline-bench-") as tmp:
            work = Path(tmp)
            copies = [baseline(dsn, work / f"baseline-{n}.parquet") for n in range(args.repeat)]

            def measure(name: str, master: str, sweep: list[int]) -> None:
                for label, tree in trees:
                    key = f"{name} {label}".strip()
                    print(f"spark {key} ...", file=sys.stderr)
                    results[key] = run_spark(master, tree, dsn, work, sweep, small, args.max_events, args.repeat,
                                             args.timeout)

            if not args.no_throughput:
                measure("local[1]", "local[1]", [])
                measure("local[2]", "local[2]", sizes)
                if not args.no_cluster:
                    (work / "cluster").mkdir()
                    with standalone.standalone(work / "cluster") as url:
                        measure("cluster", url, sizes)
            first, then = ([max(1, min(n, 2_000_000)) for n in args.steady] + [0, 0])[:2]
            rounds = max(1, min(args.rounds, 20))
            print("steady rate ...", file=sys.stderr)
            steady_rates = steady(dsn, work, trees, first, then, rounds, args.timeout) if first and then else {}
            print("small work ...", file=sys.stderr)
            small_runs = small_work(dsn, work, trees, rounds, args.timeout)
    finally:
        drop_database(database)
    if results:
        report(rows, args.max_events, args.repeat, small, results, copies)
    got, seconds = sorted(copies, key=lambda c: c[1])[len(copies) // 2]
    report_cli(steady_rates, small_runs, got / seconds, first, then)


if __name__ == "__main__":
    main()
