"""What each SQL function of the hot path costs PostgreSQL per call, beside the raw
statements that do the same writes: pgbench (prepared statements) runs each script for
--seconds with --clients connections, and the CPU of those connections' backends is read
from /proc (pg_stat_activity names them), so the other users of the server do not count.
Meanwhile the tables past the server's vacuum bar are vacuumed every second, as a running
server does (sqs_bench.vacuuming; its backend is not counted).

    ./bin/bench sql_call_bench.py [--clients 8] [--seconds 5] [--repeat 3] [--before DIR]

Prints, per script, transactions/s and backend CPU us per call and per message (median of
--repeat runs, the scripts taking turns). Creates and drops database conveyor_sql_call_bench.

--before DIR compares function bodies in one run: a second database, conveyor_sql_call_before,
is migrated the same way and then given the functions files of DIR (a tree's src, e.g. from
`git archive main src | tar -x -C /tmp/before`: DIR/conveyor/sql/functions/*.sql), and each
script runs on both databases in turn; the table gets a column per database and the median
of the paired runs' ratios (after / before).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg import conninfo

sys.path.insert(0, str(Path(__file__).parent))
import sqs_bench as shared

DATABASE = "conveyor_sql_call_bench"
BEFORE = "conveyor_sql_call_before"
BODY = "x" * 100
ONE = f'[{{"body": "{BODY}"}}]'
TEN = "[" + ", ".join([f'{{"body": "{BODY}"}}'] * 10) + "]"
# a push to one of 64 partitions (as bench/queen_bench.py and peers_bench.py push): pushes to
# one partition take turns on its row lock
PUSH1 = ("\\set p random(0, 63)\n"
         f"SELECT conveyor.pqueue_push(('[{{\"queue\": \"pq\", \"partition\": \"p' || :p || '\", "
         f"\"payload\": {{\"note\": \"{BODY}\"}}}}]')::jsonb);")
# ten items to ten consecutive partitions of 64, as peers_bench.py's push of 10
PUSH10 = ("\\set p random(0, 63)\n"
          "SELECT conveyor.pqueue_push((SELECT jsonb_agg(jsonb_build_object('queue', 'pq', 'partition', "
          f"'p' || (:p + k) % 64, 'payload', '{{\"note\": \"{BODY}\"}}'::jsonb)) FROM generate_series(0, 9) k));")
# a wildcard pop of the queue (Queen's queue mode, as peers_bench.py pops), then the ack of
# what came in one call, each under the pop's lease (the server's /ack/batch); {lazy}: ""
# or ", true", the server's call (a pop that only leases does not wait for its flush)
POP_ACK = """SELECT conveyor.pqueue_pop_many('[{{"queue": "pqr", "batch": {n}}}]'{lazy}) -> 0 -> 'messages' AS got \\gset
SELECT conveyor.pqueue_ack(coalesce((SELECT jsonb_agg(jsonb_build_object(
           'transactionId', m ->> 'transactionId', 'partitionId', m ->> 'partitionId',
           'leaseId', m ->> 'leaseId', 'status', 'completed'))
      FROM jsonb_array_elements(:got::jsonb) m), '[]'), false);"""
# three pops of one in one call, then one ack of what they got: the server's calls at 8
# clients, where request fusion puts ~2-3 pops in a pqueue_pop_many and their acks in one
# pqueue_ack
POP3_ACK = """SELECT conveyor.pqueue_pop_many('[{"queue": "pqr", "batch": 1}, {"queue": "pqr", "batch": 1},
                                         {"queue": "pqr", "batch": 1}]', true) AS got \\gset
SELECT conveyor.pqueue_ack(coalesce((SELECT jsonb_agg(jsonb_build_object(
           'transactionId', m ->> 'transactionId', 'partitionId', m ->> 'partitionId',
           'leaseId', m ->> 'leaseId', 'status', 'completed'))
      FROM jsonb_array_elements(:got::jsonb) r, jsonb_array_elements(r -> 'messages') m), '[]'), false);"""
RECEIVE_DELETE = """SELECT array_agg(id)::text AS ids, array_agg(receive_count)::text AS rcs
  FROM conveyor.message_receive{lazy}('pgr', 30, 10) \\gset
SELECT count(*) FROM conveyor.message_delete('pgr', :ids::bigint[], :rcs::integer[]);"""
RAW_RECEIVE_DELETE = """WITH c AS (
    UPDATE bench_raw SET vt = now() + interval '30 seconds', receive_count = receive_count + 1
     WHERE id IN (SELECT id FROM bench_raw WHERE vt <= now() ORDER BY vt, id LIMIT 10 FOR UPDATE SKIP LOCKED)
    RETURNING id)
SELECT array_agg(id)::text AS ids FROM c \\gset
DELETE FROM bench_raw WHERE id = ANY (:ids::bigint[]);"""
SCRIPTS = {  # name: (messages per call, script)
    "SELECT 1 (a round trip, no write)": (1, "SELECT 1;"),
    "raw INSERT, 1 row": (1, f"INSERT INTO bench_raw (body) VALUES ('{BODY}');"),
    "message_send_json, 1 message": (1, f"SELECT count(*) FROM conveyor.message_send_json('pgb', '{ONE}');"),
    "raw INSERT, 10 rows": (10, "INSERT INTO bench_raw (body) VALUES " + ", ".join([f"('{BODY}')"] * 10) + ";"),
    "message_send_json, 10 messages": (10, f"SELECT count(*) FROM conveyor.message_send_json('pgb', '{TEN}');"),
    "pqueue_push, 1 item (64 partitions)": (1, PUSH1),
    "pqueue_push, 10 items (10 of 64 partitions)": (10, PUSH10),
    "pqueue_pop_many 1 + pqueue_ack": (1, POP_ACK.format(n=1, lazy="")),
    "pqueue_pop_many 10 + pqueue_ack": (10, POP_ACK.format(n=10, lazy="")),
    # as the server pops and receives (lazy: a tree before 0030 has no such function;
    # leave these out of --before runs against one with --only)
    "pqueue_pop_many 1 lazy + pqueue_ack": (1, POP_ACK.format(n=1, lazy=", true")),
    "pqueue_pop_many 10 lazy + pqueue_ack": (10, POP_ACK.format(n=10, lazy=", true")),
    "pqueue_pop_many 3 pops of 1 lazy + one pqueue_ack of the 3": (3, POP3_ACK),
    # an idle consumer's poll (its "messages" column counts calls)
    "pqueue_pop_many 10, nothing waiting": (1, """SELECT conveyor.pqueue_pop_many('[{"queue": "pqe", "batch": 10}]');"""),
    # a pair per transaction of the script (two calls): receive 10, then delete what came
    "message_receive 10 + message_delete": (10, RECEIVE_DELETE.format(lazy="")),
    "message_receive 10 lazy + message_delete": (10, RECEIVE_DELETE.format(lazy="_lazy")),
    "raw UPDATE ... SKIP LOCKED 10 + DELETE": (10, RAW_RECEIVE_DELETE),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--backlog", type=int, default=300_000, help="messages waiting for the receive scripts")
    p.add_argument("--partitions", type=int, default=64,
                   help="partitions the pop scripts' backlog is spread over (a wildcard pop's candidates)")
    p.add_argument("--only", nargs="+", help="run only the scripts whose names start with these")
    p.add_argument("--before", type=Path, help="a src folder whose functions files the second database gets")
    args = p.parse_args()
    pgbench = shutil.which("pgbench") or str(next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/pgbench")))))
    scripts = {name: v for name, v in SCRIPTS.items() if not args.only or name.startswith(tuple(args.only))}
    databases = [DATABASE] + ([BEFORE] if args.before else [])
    try:
        dsns = {db: prepare(db, args.backlog, args.before if db == BEFORE else None, args.partitions)
                for db in databases}
        results: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for _ in range(args.repeat):
            for name, (_n, script) in scripts.items():
                for db in databases:
                    tps, cpu = run_polled(dsns[db], pgbench, name, script, args.clients, args.seconds)
                    us = cpu / (tps * args.seconds) * 1e6
                    results.setdefault((name, db), []).append((tps, us))
                    print(f"  {db:<26} {name:<44} {tps:8.0f} calls/s {us:6.0f} us/call", flush=True)
        report(args, scripts, databases, results)
    finally:
        for db in databases:
            shared.drop_database(db)


def apply_functions(conn: psycopg.Connection, text: str) -> None:
    """A functions file over this build's schema; a function whose result type the other
    tree changed (which CREATE OR REPLACE cannot do) is dropped first, as PostgreSQL's hint
    says, and the file (one implicit transaction, undone by the error) applied again."""
    for _ in range(20):
        try:
            conn.execute(text)
            return
        except psycopg.errors.InvalidFunctionDefinition as exc:
            drop = re.fullmatch(r"Use (DROP FUNCTION .*) first\.", exc.diag.message_hint or "")
            if drop is None:
                raise
            conn.execute(drop.group(1))
    raise RuntimeError("a functions file kept asking for functions to be dropped")


def prepare(database: str, backlog: int, before: Path | None, partitions: int = 64) -> str:
    """A migrated database with the scripts' queues and backlogs; with ``before``, the
    function bodies of that tree (its functions files applied over this build's schema)."""
    dsn = shared.create_database(database, migrated=True)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for f in sorted((before / "conveyor" / "sql" / "functions").glob("*.sql")) if before else []:
            apply_functions(conn, f.read_text())
        conn.execute("CREATE TABLE bench_raw (id bigserial PRIMARY KEY, vt timestamptz NOT NULL DEFAULT now(), "
                     "receive_count int NOT NULL DEFAULT 0, body text NOT NULL)")
        conn.execute("CREATE INDEX ON bench_raw (vt, id)")
        conn.execute("SELECT conveyor.queue_create('pgb')")
        conn.execute("SELECT conveyor.pqueue_configure('pq')")
        # a queue that held messages and was drained (an idle consumer's)
        conn.execute("""SELECT conveyor.pqueue_pop('{"queue": "pqe", "autoAck": true}')
                          FROM (SELECT conveyor.pqueue_push('[{"queue": "pqe", "payload": 1}]')) x""")
        # the receive scripts' backlogs: enough for --repeat runs of --seconds
        conn.execute("SELECT conveyor.queue_create('pgr')")
        for _ in range(0, backlog, 10_000):  # a send holds at most 10,000
            conn.execute("SELECT count(*) FROM conveyor.message_send_batch('pgr', array_fill(%s::text, "
                         "ARRAY[10000]))", (BODY,))
        for _ in range(0, backlog, 1_000):  # (a push of 10,000 items took seconds before this pass)
            conn.execute("SELECT jsonb_array_length(conveyor.pqueue_push((SELECT jsonb_agg(jsonb_build_object("
                         "'queue', 'pqr', 'partition', 'p' || k %% %s, 'payload', jsonb_build_object('note', %s::text)))"
                         " FROM generate_series(1, 1000) k)))", (partitions, BODY))
        conn.execute("INSERT INTO bench_raw (body) SELECT %s FROM generate_series(1, %s)", (BODY, backlog))
        conn.execute("ANALYZE")
    return dsn


def report(args: argparse.Namespace, scripts: dict[str, tuple[int, str]], databases: list[str],
           results: dict[tuple[str, str], list[tuple[float, float]]]) -> None:
    print(f"\n{args.clients} clients, medians of {args.repeat} runs of {args.seconds:g}s\n")
    if len(databases) == 1:
        print("| statement | calls/s | messages/s | backend CPU us per call | per message |")
        print("|---|---:|---:|---:|---:|")
        for name, (n, _) in scripts.items():
            tps = statistics.median(r[0] for r in results[name, DATABASE])
            us = statistics.median(r[1] for r in results[name, DATABASE])
            print(f"| {name} | {tps:,.0f} | {tps * n:,.0f} | {us:,.0f} | {us / n:,.0f} |")
        return
    print(f"functions: before = {args.before}, after = this build\n")
    print("| statement | calls/s before / after | backend CPU us per call before / after | after / before |")
    print("|---|---:|---:|---:|")
    for name in scripts:
        before, after = results[name, BEFORE], results[name, DATABASE]
        ratio = statistics.median(a[1] / b[1] for a, b in zip(after, before, strict=True))
        print(f"| {name} | {statistics.median(r[0] for r in before):,.0f} / "
              f"{statistics.median(r[0] for r in after):,.0f} | {statistics.median(r[1] for r in before):,.0f} / "
              f"{statistics.median(r[1] for r in after):,.0f} | {ratio:.2f}x |")


def run_polled(dsn: str, pgbench: str, name: str, script: str, clients: int, seconds: float) -> tuple[float, float]:
    """As ``run``, reading the backends' CPU every 100 ms until pgbench ends (they exit
    with it, so the last reading is at most 100 ms old: a few percent of a 5 s run)."""
    params = conninfo.conninfo_to_dict(dsn)
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script + "\n")
    argv = [pgbench, "-n", "-M", "prepared", "-c", str(clients), "-j", "2", "-T", str(int(seconds)),
            "-h", str(params.get("host", "127.0.0.1")), "-p", str(params.get("port", 5432)),
            "-U", str(params.get("user", "postgres")), "-f", f.name, str(params["dbname"])]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    with shared.vacuuming(dsn), psycopg.connect(dsn, autocommit=True) as monitor:
        while proc.poll() is None:
            for (pid,) in monitor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                                          "AND pid <> pg_backend_pid() AND application_name = 'pgbench'").fetchall():
                cpu = shared._pid_cpu(pid)
                if cpu:
                    first.setdefault(pid, cpu)
                    last[pid] = cpu
            time.sleep(0.1)
    out, err = proc.communicate()
    os.unlink(f.name)
    if proc.returncode != 0:
        raise RuntimeError(f"pgbench {name}: {err.strip()}")
    tps = float(next(line.split("=")[1].split()[0] for line in out.splitlines() if line.startswith("tps")))
    return tps, sum(last[p] - first[p] for p in last)


if __name__ == "__main__":
    main()
