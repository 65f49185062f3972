"""Cost under a backlog: the hot calls' rates with 0 to 10M messages waiting, right after
the burst that left them (tables never analyzed since) and again after ANALYZE.

    ./bin/bench backlog_bench.py [--sizes 0 10000 100000 1000000] [--systems queue fifo pgmq partitioned stream]
                                 [--where queue other] [--seconds 3] [--repeat 3] [--clients 8]
                                 [--before-src ../main/src]

For each system and place of the backlog, one fresh database per backlog size (and, with
--before-src, one more per size migrated by that source tree) gets its backlog in one
INSERT ... SELECT generate_series beneath the API (the way a burst of sends leaves a
table: grown from empty in seconds, never analyzed; autovacuum vacuums those tables as
usual but is kept from analyzing them). Then pgbench (-M prepared, --clients clients, -T --seconds) runs
each system's cycle on every database of the group in turn, --repeat rounds in a rotating
order (so that the machine's drift weighs on all alike), first right after the burst,
then again after ANALYZE:

  queue        SELECT conveyor.message_send_json(q, <10 messages>)          "send"
               receive 10 (conveyor.message_receive, vt 300) and delete them
               by receipt (conveyor.message_delete(q, ids, receive_counts))  "receive+delete"
  fifo         the same on a FIFO queue: 10 messages over 100 groups (distinct deduplication
               ids); the backlog spread over those groups
  pgmq         pgmq.send_batch(q, <10 messages>); pgmq.read(q, 300, 10) and pgmq.delete(q, ids)
  partitioned  conveyor.pqueue_push(10 messages to one of 16 partitions); conveyor.pqueue_pop
               (any partition, batch 10) and conveyor.pqueue_ack of what it got
  stream       conveyor.stream_send_batch(s, 't', <10 events>); conveyor.stream_receive (the
               consumer's next batch; a ticker ticks every 50 ms) and conveyor.stream_ack,
               each client its own consumer

Each cycle sends 10 and takes 10, so the depth stays at the backlog while it runs. --where
queue puts the backlog in the queue (partition, stream) the cycle works on; --where other
in another queue of the same kind beside it. The figures are messages per second through
the whole cycle and each statement's mean latency (pgbench -r), the median of --repeat
runs; the goal is each within 20% of the empty queue's. A partitioned queue's backlog is
spread over its 16 partitions. A stream's backlog is events that a consumer subscribed
before them has not read (ticked every 5,000), in the stream the cycle appends to and its
consumers read (they subscribe after the backlog) or in another one: what one consumer
far behind costs the others. (What reading through a backlog costs a consumer, per event,
is tests/sql/test_plans.py's.)

Creates (and drops) databases conveyor_backlog_bench_<random>_* on
CONVEYOR_BENCH_DATABASE_URL (default postgresql://postgres@127.0.0.1:5432/postgres); each
pgbench run is bounded by --seconds. 10M messages take a few minutes to load and about
3 GB of disk (each database is dropped once measured).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import conninfo

ADMIN_DSN = os.environ.get("CONVEYOR_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
SRC = Path(__file__).resolve().parents[1] / "src"
BODY = "x" * 100
TEN = json.dumps([{"body": BODY}] * 10)
PARTITIONS = 16
GROUPS = 100  # message groups of a FIFO queue (its backlog spread over them)
TICK_EVERY = 5000

# system -> (pgbench script; every statement is one row of the report)
SCRIPTS = {
    "queue": f"""\
SELECT count(*) FROM conveyor.message_send_json(:q, '{TEN}');
WITH r AS MATERIALIZED (SELECT id, receive_count FROM conveyor.message_receive(:q, 300, 10)) SELECT count(*) FROM conveyor.message_delete(:q, ARRAY(SELECT id FROM r), ARRAY(SELECT receive_count FROM r));
""",
    "fifo": f"""\
\\set n random(1, 1000000000)
SELECT count(*) FROM conveyor.message_send_json(:q, (SELECT jsonb_agg(jsonb_build_object('body', '{BODY}', 'group_id', 'g' || ((:n + i) % {GROUPS}), 'dedup_id', :client_id || '-' || :n || '-' || i)) FROM generate_series(1, 10) i));
WITH r AS MATERIALIZED (SELECT id, receive_count FROM conveyor.message_receive(:q, 300, 10)) SELECT count(*) FROM conveyor.message_delete(:q, ARRAY(SELECT id FROM r), ARRAY(SELECT receive_count FROM r));
""",
    "pgmq": f"""\
SELECT count(*) FROM pgmq.send_batch(:q, array_fill('{json.dumps({"body": BODY})}'::jsonb, ARRAY[10]));
WITH r AS MATERIALIZED (SELECT msg_id FROM pgmq.read(:q, 300, 10)) SELECT count(*) FROM pgmq.delete(:q, ARRAY(SELECT msg_id FROM r));
""",
    "partitioned": f"""\
\\set p random(1, {PARTITIONS})
SELECT jsonb_array_length(conveyor.pqueue_push((SELECT jsonb_agg(jsonb_build_object('queue', :q::text, 'partition', 'p' || :p, 'payload', '{BODY}')) FROM generate_series(1, 10))));
WITH p AS MATERIALIZED (SELECT conveyor.pqueue_pop(jsonb_build_object('queue', :q::text, 'batch', 10)) AS j) SELECT json_array_length(conveyor.pqueue_ack(coalesce((SELECT jsonb_agg(jsonb_build_object('transactionId', m ->> 'transactionId', 'partitionId', m ->> 'partitionId', 'leaseId', m ->> 'leaseId')) FROM p, json_array_elements(p.j -> 'messages') m), '[]')));
""",
    "stream": f"""\
SELECT count(*) FROM conveyor.stream_send_batch(:q, 't', array_fill('{BODY}'::text, ARRAY[10]));
SELECT conveyor.stream_ack(b) FROM (SELECT max(batch_id) AS b FROM conveyor.stream_receive(:q, 'c' || :client_id::text, 100000)) x WHERE b IS NOT NULL;
""",
}
ROWS = {"queue": ("send 10", "receive+delete 10"), "fifo": ("send 10 (FIFO)", "receive+delete 10 (FIFO)"),
        "pgmq": ("send_batch 10", "read+delete 10"),
        "partitioned": ("push 10", "pop+ack 10"), "stream": ("append 10", "receive+ack (batch)")}


@dataclass
class Result:
    rate: float  # messages/s through the cycle (10 per transaction)
    latencies: list[float]  # ms per statement


def sql(dsn: str, statement: str, params: tuple[object, ...] = ()) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement.encode(), params)


def create_database(name: str, src: Path) -> str:
    """A fresh database migrated (with the pgmq dialect) by the Conveyor whose sources are at src."""
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    dsn = conninfo.make_conninfo(ADMIN_DSN, dbname=name)
    env = {**os.environ, "PYTHONPATH": str(src), "DATABASE_URL": dsn}
    subprocess.run([sys.executable, "-m", "conveyor", "db", "migrate", "--dialects", "pgmq"], env=env, check=True,
                   capture_output=True, text=True)
    return dsn


def drop_database(name: str) -> None:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _hold_autoanalyze(conn: psycopg.Connection) -> None:
    """Autovacuum still vacuums the backlog's tables, but never analyzes them: the statistics
    stay those of the empty tables until the second phase's ANALYZE."""
    for table in ("messages_shared", "partition_messages"):
        conn.execute(f"ALTER TABLE conveyor.{table} SET (autovacuum_analyze_threshold = 2000000000)".encode())


def prepare(dsn: str, system: str, backlog: int, where: str, clients: int) -> str:
    """Creates the cycle's target ('q') and the backlog's ('q' or 'other'), loads the backlog;
    returns the target's name."""
    suffix = ".fifo" if system == "fifo" else ""
    target = "q" + suffix
    holder = target if where == "queue" else "other" + suffix
    with psycopg.connect(dsn, autocommit=True) as conn:
        run = conn.execute
        _hold_autoanalyze(conn)
        if system in ("queue", "fifo", "pgmq"):
            for name in {target, holder}:
                run("SELECT pgmq.create(%s)" if system == "pgmq" else "SELECT conveyor.queue_create(%s)", (name,))
            groups = f"'g' || (g %% {GROUPS})" if system == "fifo" else "NULL"
            run(f"""INSERT INTO conveyor.messages (queue_id, id, vt, sent_at, body, content_type, group_id)
                    SELECT q.id, g, now(), now(), %s, %s, {groups} FROM conveyor.queues q,
                           generate_series(1, {backlog}) g
                     WHERE q.name = %s""".encode(),
                (json.dumps({"body": BODY}) if system == "pgmq" else BODY,
                 "application/json" if system == "pgmq" else None, holder))
            if system == "fifo":
                run(f"""INSERT INTO conveyor.message_groups (queue_id, group_id)
                        SELECT q.id, 'g' || k FROM conveyor.queues q, generate_series(0, {GROUPS - 1}) k
                         WHERE q.name IN (%s, %s) ON CONFLICT DO NOTHING""".encode(), (target, holder))
            run("SELECT setval(q.seq, %s) FROM conveyor.queues q WHERE q.name = %s AND %s > 0", (backlog, holder, backlog))
        elif system == "partitioned":
            for name in {target, holder}:
                run("SELECT conveyor.pqueue_push(%s::jsonb)", (json.dumps(
                    [{"queue": name, "partition": f"p{k}", "payload": 0} for k in range(1, PARTITIONS + 1)]),))
            per = backlog // PARTITIONS
            run(f"""INSERT INTO conveyor.partition_messages (partition_id, seq, transaction_id, payload)
                    SELECT p.id, g + 1, 'b' || g, to_jsonb(%s::text) FROM conveyor.partitions p
                      JOIN conveyor.pqueues q ON q.id = p.queue_id AND q.name = %s, generate_series(1, {per}) g""".encode(),
                (BODY, holder))
            run("""UPDATE conveyor.partitions p SET head = p.head + %s, head_xid = pg_current_xact_id()
                     FROM conveyor.pqueues q WHERE q.id = p.queue_id AND q.name = %s""", (per, holder))
            # the target's one message per partition goes first, so that every pop finds work
            run("SELECT conveyor.pqueue_pop_many(%s::jsonb)", (json.dumps([{"queue": target, "batch": 1000,
                                                                            "autoAck": True}] * PARTITIONS),))
        else:
            # the backlog: events a consumer subscribed before them has not read; the
            # cycle's consumers subscribe after them
            for name in {target, holder}:
                run("SELECT conveyor.stream_create(%s, '{\"ticker_max_count\": 1000000}')", (name,))
            run("SELECT conveyor.stream_subscribe(%s, 'behind')", (holder,))
            current = run("SELECT table_name, event_seq FROM conveyor.stream_current_table(%s)", (holder,)).fetchone()
            assert current is not None
            table, seq = current
            for lo in range(0, backlog, TICK_EVERY):
                run(f"INSERT INTO {table} (ev_id, ev_type, ev_data) SELECT nextval('{seq}'), 't', %s "
                    f"FROM generate_series(1, {min(TICK_EVERY, backlog - lo)})".encode(), (BODY,))
                run("SELECT conveyor.stream_force_tick(%s)", (holder,))
            for c in range(clients):  # pgbench's client_id: 0 to clients - 1
                run("SELECT conveyor.stream_subscribe(%s, %s)", (target, f"c{c}"))
    return target


class Ticker:
    """Ticks the target stream every 50 ms while a stream cycle runs (the server's ticker does
    it once a second; more often here so that batches stay small)."""

    def __init__(self, dsn: str, stream: str) -> None:
        code = ("import sys, time, psycopg\n"
                "c = psycopg.connect(sys.argv[1], autocommit=True)\n"
                "end = time.monotonic() + float(sys.argv[3])\n"
                "while time.monotonic() < end:\n"
                "    c.execute('SELECT conveyor.stream_force_tick(%s)', (sys.argv[2],)); time.sleep(0.05)\n")
        self.args = [sys.executable, "-c", code, dsn, stream]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, seconds: float) -> None:
        self.proc = subprocess.Popen([*self.args, str(seconds + 2)])

    def stop(self) -> None:
        if self.proc:
            self.proc.kill()
            self.proc.wait()


def pgbench(dsn: str, target: str, script: Path, clients: int, seconds: float) -> Result:
    params = conninfo.conninfo_to_dict(dsn)
    argv = ["pgbench", "-n", "-r", "-M", "prepared", "-c", str(clients), "-j", str(min(clients, 2)),
            "-T", str(max(1, round(seconds))), "-D", f"q={target}", "-f", str(script),
            "-h", str(params.get("host", "127.0.0.1")), "-p", str(params.get("port", 5432)),
            "-U", str(params.get("user", "postgres")), str(params["dbname"])]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 120)
    if done.returncode:
        raise RuntimeError(f"pgbench failed ({done.returncode}): {done.stderr[-2000:]}")
    out = done.stdout
    tps = re.search(r"tps = ([0-9.]+)", out)
    if not tps:
        raise RuntimeError(f"pgbench said: {out}")
    latencies = [float(m[1]) for m in re.finditer(r"^\s+([0-9.]+)\s+\d+\s+(?:SELECT|WITH)", out, re.M)]
    if not latencies:  # pgbench 15 prints "latency  failures  statement"; older ones "latency  statement"
        latencies = [float(m[1]) for m in re.finditer(r"^\s+([0-9.]+)\s+(?:SELECT|WITH)", out, re.M)]
    return Result(float(tps[1]) * 10, latencies)


def run_once(dsn: str, system: str, target: str, script: Path, args: argparse.Namespace, seconds: float) -> Result:
    """One pgbench run (with a ticker beside it for a stream)."""
    ticker = Ticker(dsn, target) if system == "stream" else None
    try:
        if ticker:
            ticker.start(seconds)
        return pgbench(dsn, target, script, args.clients, seconds)
    finally:
        if ticker:
            ticker.stop()


@dataclass
class Cell:
    build: str
    backlog: int
    name: str
    dsn: str
    target: str = "q"


def measure_all(cells: list[Cell], system: str, script: Path, args: argparse.Namespace) -> dict[str, Result]:
    """Each cell warmed up, then --repeat rounds over all of them, the order rotating from
    round to round (a drift of the machine's speed weighs on every cell alike); medians."""
    runs: dict[str, list[Result]] = {c.name: [] for c in cells}
    for c in cells:
        run_once(c.dsn, system, c.target, script, args, 1)
    for r in range(args.repeat):
        for c in cells[r % len(cells):] + cells[:r % len(cells)]:
            runs[c.name].append(run_once(c.dsn, system, c.target, script, args, args.seconds))
    return {name: Result(statistics.median(x.rate for x in got),
                         [statistics.median(x.latencies[i] for x in got) for i in range(len(got[0].latencies))])
            for name, got in runs.items()}


def measure_group(args: argparse.Namespace, builds: dict[str, Path], system: str, where: str, sizes: list[int],
                  script: Path) -> dict[tuple[str, int], dict[str, Result]]:
    """Every (build, backlog) of one system and place: all databases loaded, then measured
    side by side right after the burst (never analyzed), and again after ANALYZE."""
    cells: list[Cell] = []
    try:
        for backlog in sizes:
            for build, src in builds.items():
                name = f"conveyor_backlog_bench_{uuid.uuid4().hex[:8]}_{build}"
                cells.append(Cell(build, backlog, name, create_database(name, src)))
                started = time.monotonic()
                cells[-1].target = prepare(cells[-1].dsn, system, backlog, where, args.clients)
                print(f"  {build:<7} {system:<12} backlog in {where:<6} {backlog:>11,}  loaded in "
                      f"{time.monotonic() - started:6.1f} s", flush=True)
        out: dict[tuple[str, int], dict[str, Result]] = {(c.build, c.backlog): {} for c in cells}
        for phase in ("burst", "analyzed"):
            if phase == "analyzed":
                for c in cells:
                    with psycopg.connect(c.dsn, autocommit=True) as conn:
                        conn.execute("ANALYZE")
            for name, result in measure_all(cells, system, script, args).items():
                c = next(x for x in cells if x.name == name)
                out[(c.build, c.backlog)][phase] = result
                print(f"  {c.build:<7} {system:<12} backlog in {where:<6} {c.backlog:>11,}  {phase:<9} "
                      f"{result.rate:8.0f} msg/s ({', '.join(f'{x:.2f}' for x in result.latencies)} ms)", flush=True)
        return out
    finally:
        for c in cells:
            drop_database(c.name)


def report(results: dict[tuple[str, str, str, int], dict[str, Result]], args: argparse.Namespace) -> None:
    print()
    print(f"messages/s through the cycle, and mean ms per statement (pgbench -M prepared, {args.clients} clients, "
          f"median of {args.repeat} runs of {args.seconds:g} s); in brackets the ratio to the same build's "
          "figure with no backlog")
    for (build, system, where, backlog), phases in sorted(results.items(), key=lambda kv: (
            kv[0][1], kv[0][2], kv[0][0], kv[0][3])):
        base = results.get((build, system, where, 0), phases)
        for phase, r in phases.items():
            b = base[phase]
            cells = [f"{r.rate:8.0f} ({r.rate / b.rate:4.2f})"] + [
                f"{row} {lat:7.2f} ms ({lat / blat:5.2f})"
                for row, lat, blat in zip(ROWS[system], r.latencies, b.latencies, strict=False)]
            print(f"{build:<7} {system:<12} backlog in {where:<6} {backlog:>11,} {phase:<9} " + "  ".join(cells))


def main(args: argparse.Namespace) -> None:
    builds = {"after": SRC} | ({"before": Path(args.before_src)} if args.before_src else {})
    results: dict[tuple[str, str, str, int], dict[str, Result]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for system in args.systems:
            script = Path(tmp) / f"{system}.sql"
            script.write_text(SCRIPTS[system])
            for where in args.where:
                sizes = sorted(set(args.sizes) | {0})  # no backlog: the reference, measured beside the others
                for (build, backlog), phases in measure_group(args, builds, system, where, sizes, script).items():
                    results[(build, system, where, backlog)] = phases
    report(results, args)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[0, 10_000, 100_000, 1_000_000],
                   help="backlogs to measure (0, the reference, is always measured too); 10000000 takes minutes")
    p.add_argument("--systems", nargs="+", default=list(SCRIPTS), choices=list(SCRIPTS))
    p.add_argument("--where", nargs="+", default=["queue", "other"], choices=["queue", "other"],
                   help="the backlog in the queue the cycle works on, or in another one beside it")
    p.add_argument("--seconds", type=float, default=3.0, help="duration of each pgbench run")
    p.add_argument("--repeat", type=int, default=3, help="runs per cell; the median is reported")
    p.add_argument("--clients", type=int, default=8, help="pgbench clients")
    p.add_argument("--before-src", help="src/ of a Conveyor to compare with (e.g. ../main/src), side by side")
    return p.parse_args()


if __name__ == "__main__":
    main(parse_args())
