"""Queue storage kinds (migration 0016): what partitioning conveyor.messages costs the hot
path, and what unlogged and partitioned queues give, side by side in one run.

    .venv/bin/python bench/storage_bench.py [--before-src ../main/src] [--seconds 5] [--repeat 5]
                                            [--clients 1 16] [--kind-queues 20] [--only 'before;logged']

The SQL API, driven by pgbench (-M prepared, so that no Python client is in the way), in
databases of their own; columns:
  before            a logged queue in a database migrated by the Conveyor whose sources are
                    at --before-src (a checkout from before 0016: one unpartitioned messages
                    table); left out without --before-src
  logged            a logged queue, this build: conveyor.messages partitioned, no other kind
  logged, beside K  a logged queue in a database that also holds --kind-queues queues with
                    storage of their own (half unlogged, half partitioned by id, premake 4:
                    K/2 * 14 + K/2 * 2 tables): every statement on conveyor.messages plans,
                    prunes and (PostgreSQL 15, generic plans) locks their tables too
  unlogged          an unlogged queue (in that same database)
  partitioned 8     a queue partitioned by id, 10000 ids a partition, retention 30000 ids:
                    about 8 partitions (3 behind, the current one, 4 premade; same database)
  partitioned 40    the same with 1000 ids a partition and retention 35000: about 40
Rows, statements per second with each --clients concurrency:
  send              SELECT conveyor.message_send(q, <100 bytes>)
  send 10           SELECT conveyor.message_send_json(q, <10 messages>)  (x10 messages)
  receive+delete    SELECT conveyor.message_delete(q, m.id) FROM conveyor.message_receive(q, 600) m
                    on a queue filled beforehand
Each repeat runs every column in turn (the order rotating between repeats, so that a drift
of the machine's speed weighs on all); the median of --repeat runs is reported, with each
column's ratio to the first.

Creates (and drops at the end) databases conveyor_storage_bench_<random>_* on
CONVEYOR_BENCH_DATABASE_URL (default postgresql://postgres@127.0.0.1:5432/postgres);
every pgbench run is bounded by --seconds.
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
import uuid
from pathlib import Path

import psycopg
from psycopg import conninfo

ADMIN_DSN = os.environ.get("CONVEYOR_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
SRC = Path(__file__).resolve().parents[1] / "src"
BODY = "x" * 100
SCRIPTS = {
    "send": f"SELECT conveyor.message_send(:q, '{BODY}');\n",
    "send 10": f"SELECT count(*) FROM conveyor.message_send_json(:q, '{json.dumps([{'body': BODY}] * 10)}');\n",
    "receive+delete": "SELECT conveyor.message_delete(:q, m.id) FROM conveyor.message_receive(:q, 600) m;\n",
}
FILL = 60_000  # messages queued before each receive+delete run (more than it takes)


def create_database(name: str, src: Path) -> str:
    """A fresh database migrated by the Conveyor whose sources are at ``src``."""
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    dsn = conninfo.make_conninfo(ADMIN_DSN, dbname=name)
    env = {**os.environ, "PYTHONPATH": str(src), "DATABASE_URL": dsn}
    subprocess.run([sys.executable, "-m", "conveyor", "db", "migrate"], env=env, check=True,
                   capture_output=True, text=True)
    return dsn


def drop_database(name: str) -> None:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def sql(dsn: str, statement: str, params: tuple[object, ...] = ()) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement.encode(), params)


def columns(args: argparse.Namespace, dsns: dict[str, str]) -> dict[str, tuple[str, str]]:
    """Column -> (dsn, queue name), their queues made."""
    out = {}
    if args.before_src:
        out["before"] = (dsns["before"], "q")
    out["logged"] = (dsns["after"], "q")
    for i in range(args.kind_queues):
        kind = '{"storage": "unlogged"}' if i % 2 else '{"storage": "partitioned", "partition_interval": 1000}'
        sql(dsns["many"], "SELECT conveyor.queue_create(%s, %s::jsonb)", (f"kind{i}", kind))
    out[f"logged, beside {args.kind_queues}"] = (dsns["many"], "q")
    out["unlogged"] = (dsns["many"], "u")
    out["partitioned 8"] = (dsns["many"], "p8")
    out["partitioned 40"] = (dsns["many"], "p40")
    sql(dsns["many"], "SELECT conveyor.queue_create('u', '{\"storage\": \"unlogged\"}')")
    for name, interval, retention in (("p8", 10_000, 30_000), ("p40", 1_000, 35_000)):
        sql(dsns["many"], "SELECT conveyor.queue_create(%s, %s::jsonb)", (name, json.dumps(
            {"storage": "partitioned", "partition_interval": interval, "partition_retention": retention})))
    for dsn, queue in out.values():
        if queue == "q":
            sql(dsn, "SELECT conveyor.queue_create('q')")
    return out


def prepare(dsn: str, queue: str, op: str) -> None:
    """Before a run: for receive+delete, FILL visible messages in the queue; for every run,
    a maintenance round (a partitioned queue's partitions made ahead, as the server's
    maintenance does every minute) and a vacuum."""
    if op == "receive+delete":
        sql(dsn, "SELECT conveyor.queue_purge(%s)", (queue,))
        for _ in range(FILL // 10_000):
            sql(dsn, "SELECT count(*) FROM conveyor.message_send_batch(%s, array_fill('x'::text, ARRAY[10000]))",
                (queue,))
    sql(dsn, "SELECT count(*) FROM conveyor.maintenance()")
    sql(dsn, "VACUUM ANALYZE conveyor.messages")


def pgbench(dsn: str, queue: str, script: Path, clients: int, seconds: float) -> float:
    """Transactions per second of one pgbench run."""
    params = conninfo.conninfo_to_dict(dsn)
    argv = ["pgbench", "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(clients, 2)),
            "-T", str(max(1, round(seconds))), "-D", f"q={queue}", "-f", str(script),
            "-h", str(params.get("host", "127.0.0.1")), "-p", str(params.get("port", 5432)),
            "-U", str(params.get("user", "postgres")), str(params["dbname"])]
    out = subprocess.run(argv, check=True, capture_output=True, text=True, timeout=seconds + 60).stdout
    found = re.search(r"tps = ([0-9.]+)", out)
    if not found:
        raise RuntimeError(f"pgbench said: {out}")
    return float(found[1])


def measure(args: argparse.Namespace, cols: dict[str, tuple[str, str]], scripts: dict[str, Path]
            ) -> dict[tuple[str, str, int], float]:
    results: dict[tuple[str, str, int], float] = {}
    names = list(cols)
    for clients in args.clients:
        for op, script in scripts.items():
            runs: dict[str, list[float]] = {name: [] for name in names}
            for dsn, queue in cols.values():  # warm up: connections, plans, caches
                prepare(dsn, queue, op)
                pgbench(dsn, queue, script, clients, 1)
            for r in range(args.repeat):
                for name in names[r % len(names):] + names[:r % len(names)]:
                    dsn, queue = cols[name]
                    prepare(dsn, queue, op)
                    runs[name].append(pgbench(dsn, queue, script, clients, args.seconds))
            for name in names:
                results[(name, op, clients)] = statistics.median(runs[name])
            print(f"  {op:<15} clients={clients:<3} " +
                  "  ".join(f"{name} {statistics.median(runs[name]):7.0f}" for name in names), flush=True)
    return results


def report(args: argparse.Namespace, names: list[str], results: dict[tuple[str, str, int], float]) -> None:
    print()
    print(f"statements/s, pgbench -M prepared (median of {args.repeat} runs of {args.seconds:g} s); "
          f"ratio to '{names[0]}'")
    print(f"{'statement':<22}" + "".join(f"{n:>22}" for n in names))
    for clients in args.clients:
        for op in SCRIPTS:
            base = results[(names[0], op, clients)]
            print(f"{op + f' x{clients}':<22}" + "".join(
                f"{results[(n, op, clients)]:>14.0f} ({results[(n, op, clients)] / base:4.2f})" for n in names))


def main(args: argparse.Namespace) -> None:
    tag = f"conveyor_storage_bench_{uuid.uuid4().hex[:8]}"
    wanted = {"after": SRC, "many": SRC} | ({"before": Path(args.before_src)} if args.before_src else {})
    with tempfile.TemporaryDirectory() as tmp:
        scripts = {}
        for op, text in SCRIPTS.items():
            scripts[op] = Path(tmp) / f"{op.replace(' ', '_').replace('+', '_')}.sql"
            scripts[op].write_text(text)
        try:
            dsns = {key: create_database(f"{tag}_{key}", src) for key, src in wanted.items()}
            cols = columns(args, dsns)
            if args.only:
                cols = {name: cols[name] for name in args.only.split(";")}
            report(args, list(cols), measure(args, cols, scripts))
        finally:
            for key in wanted:
                drop_database(f"{tag}_{key}")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before-src", help="src/ of a Conveyor from before migration 0016, for the 'before' column")
    p.add_argument("--seconds", type=float, default=5.0, help="duration of each pgbench run")
    p.add_argument("--repeat", type=int, default=5, help="runs per cell; the median is reported")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 16], help="concurrency levels")
    p.add_argument("--kind-queues", type=int, default=20, help="queues with storage of their own beside")
    p.add_argument("--only", help="columns to run, separated by ';' (e.g. 'before;logged, beside 20'); default all")
    return p.parse_args()


if __name__ == "__main__":
    main(parse_args())
