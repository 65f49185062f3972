"""No regression elsewhere: the other benches, each against two source trees, alternating.

    git archive BASE src | tar -x -C /tmp/before_regress
    .venv/bin/python bench/regression_bench.py --before-src /tmp/before_regress/src [--after-src src]
                                               [--repeat 3] [--benches queue sqs ...] [--logs DIR]
    .venv/bin/python bench/regression_bench.py --from-logs DIR    # the table again, from saved runs

Each bench of BENCHES (queue, sqs, stream, topic, pgmq, pgq, queen, encryption, overload, and
sql_call: the hot SQL functions' backend CPU per call, the figure a busy machine moves least) runs
as a child process, `python bench/<name>_bench.py <its short configuration>`, with the tree's
``src`` first on PYTHONPATH: the bench imports conveyor from it (the migrations it applies
to its own fresh database included: every bench drops and creates its databases, so a
tree never meets the other's schema) and the `python -m conveyor serve` children it
starts inherit it. The bench files are this checkout's; only ``src`` differs. For
--repeat rounds, every bench runs once per tree, the trees alternating (before, after;
after, before; ...), so a drift of the machine's speed weighs on both. The figures each
bench prints (its medians, over its own short inner runs) are parsed from its output;
per row, the table shows the median over the rounds for each tree and the median of the
rounds' paired ratios after/before, with their range. "worse" / "better" marks a row
whose every paired ratio moved more than --threshold the same way (for figures where
lower is better, ms, MB and error counts, the direction is turned round). Rows that do
not depend on Conveyor's tree (raw PostgreSQL, moto, the real pgmq and PgQ, pgbench on a
plain table) are kept as controls: their spread is the run's noise.

The benches use fixed database names on CONVEYOR_BENCH_DATABASE_URL: a run waits (up to
--db-wait s) while another session is connected to one of its databases (someone else's
run of the same bench), runs one at a time, and its databases are dropped after it. Every
run is bounded by --timeout; its output is kept in --logs; a run that fails before printing
any figure is made once more (its first output kept as .failed); the figures a failed run
printed before it failed count. Given an existing --logs, the runs already there are kept
(a run interrupted is resumed by running the same command again). The configurations keep every bench under ~40
PostgreSQL connections (8 clients at most beside a server's pool of 16): on a shared
server with max_connections 100, 32 clients ran it out of connections.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg

ADMIN_DSN = os.environ.get("CONVEYOR_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
ROOT = Path(__file__).resolve().parents[1]
TREES = ("before", "after")

Figures = dict[str, float]


# -- parsers: a bench's output -> {row: value} ------------------------------------------------

def _number(text: str) -> float:
    return float(text.replace(",", ""))


def parse_queue(out: str) -> Figures:
    figures: Figures = {}
    columns = ("rest fusion=on", "rest fusion=off", "sql conveyor", "sql raw table (control)")
    for m in re.finditer(r"^(send|receive|delete) x(\d+) clients\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$",
                         out, re.M):
        for column, value in zip(columns, m.groups()[2:], strict=True):
            figures[f"{column} {m[1]} x{m[2]}, msg/s"] = _number(value)
    for m in re.finditer(r"^\s+fusion=(on|off)\s+p50\s+([\d.]+)\s+p99\s+([\d.]+)", out, re.M):
        figures[f"long-poll wake-up fusion={m[1]} p50, ms"] = _number(m[2])
    return figures


def parse_sqs(out: str) -> Figures:
    figures: Figures = {}
    for m in re.finditer(r"^  (conveyor boto3|moto boto3|conveyor raw|raw postgresql)\s+x(\d+)\s+(.+?)\s+(\d+) msg/s"
                         r".*?(?:, conveyor\s+(\d+),|$)", out, re.M):
        column = m[1] if m[1].startswith("conveyor") else f"{m[1]} (control)"
        figures[f"{column} {m[3]} x{m[2]}, msg/s"] = _number(m[4])
        if m[5]:  # the server process's own CPU (PostgreSQL's column counts every user of the server)
            figures[f"{column} {m[3]} x{m[2]}, server CPU us/request"] = _number(m[5])
    return figures


def parse_stream(out: str) -> Figures:
    figures: Figures = {}
    for m in re.finditer(r"^  (.+?)\s+(\d+) ev/s\s", out, re.M):
        figures[f"{m[1]}, ev/s"] = _number(m[2])
    for m in re.finditer(r"^(tick commit -> LISTEN consumer has the event|SQL send commit -> REST long-poll, "
                         r"tick every [\d.]+s)\s+([\d.]+)\s+([\d.]+)", out, re.M):
        figures[f"{m[1]} p50, ms"] = _number(m[2])
    return figures


def parse_topic(out: str) -> Figures:
    figures: Figures = {}
    for m in re.finditer(r"^  (sns publish \(http\)|moto sns publish|sql topic_publish)\s+fan-out\s+(\d+):\s+(\d+) "
                         r"publishes/s", out, re.M):
        column = f"{m[1]} (control)" if m[1].startswith("moto") else m[1]
        figures[f"{column} fan-out {m[2]}, publishes/s"] = _number(m[3])
    if m := re.search(r"^webhook delivery to a local endpoint: (\d+) deliveries/s", out, re.M):
        figures["webhook delivery, deliveries/s"] = _number(m[1])
    return figures


def parse_pgmq(out: str) -> Figures:
    figures: Figures = {}
    section = ""
    for line in out.splitlines():
        if line.startswith("pgbench, transactions/s"):
            section = "pgbench "
        elif m := re.match(r"^(\S+ x\d+ clients)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", line):
            unit = "tx/s" if section else "msg/s"
            figures[f"dialect {section}{m[1]}, {unit}"] = _number(m[2])
            figures[f"real pgmq (control) {section}{m[1]}, {unit}"] = _number(m[3])
    return figures


def parse_sql_call(out: str) -> Figures:
    figures: Figures = {}
    for m in re.finditer(r"^\| (.+?) \| ([\d,]+) \| [\d,]+ \| ([\d,]+) \| [\d,]+ \|$", out, re.M):
        label = f"{m[1]} (control)" if m[1].startswith(("raw", "SELECT 1")) else m[1]
        figures[f"{label}, calls/s"] = _number(m[2])
        figures[f"{label}, backend CPU us/call"] = _number(m[3])
    return figures


def _table_after(out: str, header: str) -> list[str]:
    """The lines after the last line starting with ``header``, up to the first blank one (or
    the driver's closing comment)."""
    lines = out.splitlines()
    starts = [n for n, line in enumerate(lines) if line.startswith(header)]
    rows = []
    for line in lines[starts[-1] + 1:] if starts else []:
        if not line.strip() or line.startswith("# exit"):
            break
        rows.append(line)
    return rows


def parse_pgq(out: str) -> Figures:
    figures: Figures = {}
    for line in _table_after(out, "scenario (events/s)"):
        mine, real = line[52:66], line[66:80]
        figures[f"dialect {line[:52].strip()}, ev/s"] = _number(mine)
        figures[f"PgQ C extension (control) {line[:52].strip()}, ev/s"] = _number(real)
    return figures


def parse_queen(out: str) -> Figures:
    figures: Figures = {}
    for line in _table_after(out, "figure"):
        name = line[:44].strip()
        # per broker CPU-s divides by every postgres process's CPU, other users' included:
        # on a shared machine that measures the neighbours
        if "CPU-s" in name:
            continue
        unit = "ms" if " ms" in name else "msg/s"
        label = f"{name} (control)" if name.startswith("pgbench") else name
        figures[f"{label}, {unit}"] = _number(line[45:57])
    return figures


def parse_encryption(out: str) -> Figures:
    figures: Figures = {}
    for line in _table_after(out, "figure"):
        name = line[:32].strip()
        if not name.startswith("("):
            figures[f"{name}, msg/s"] = _number(line[33:43])
    return figures


def parse_overload(out: str) -> Figures:
    figures: Figures = {}
    for line in _table_after(out, "clients server"):
        f = line.split()
        clients, server = f[0], f[1]
        for name, value in (("accepted/s", f[2]), ("throttled/s", f[3]), ("other answers", f[4]),
                            ("accepted p50, ms", f[5]), ("accepted p99, ms", f[6]), ("peak RSS, MB", f[9])):
            figures[f"{server} x{clients} {name}"] = _number(value)
    return figures


@dataclass(frozen=True)
class Bench:
    name: str
    args: tuple[str, ...]       # its short configuration
    databases: tuple[str, ...]  # the fixed names it creates
    parse: Callable[[str], Figures]


BENCHES = {b.name: b for b in (
    Bench("queue", ("--seconds", "1", "--repeat", "1", "--clients", "1", "8", "--wake-rounds", "30"),
          ("conveyor_bench",), parse_queue),
    Bench("sqs", ("--seconds", "1", "--repeat", "1", "--clients", "4", "--raw-clients", "1", "8", "--workers", "1",
                  "--warmup", "0.5"), ("conveyor_sqs_bench",), parse_sqs),
    Bench("stream", ("--seconds", "1", "--repeat", "1", "--clients", "4", "--latency-rounds", "40",
                     "--tick-intervals", "0.05"), ("conveyor_stream_bench",), parse_stream),
    Bench("topic", ("--seconds", "1", "--repeat", "1", "--clients", "4", "--deliveries", "500"),
          ("conveyor_topic_bench", "conveyor_topic_bench_hooks"), parse_topic),
    Bench("pgmq", ("--seconds", "1", "--repeat", "1", "--clients", "8", "--max-ops", "3000"),
          ("conveyor_pgmq_bench_conveyor", "conveyor_pgmq_bench_pgmq"), parse_pgmq),
    Bench("pgq", ("--events", "5000", "--seconds", "1", "--repeat", "1"),
          ("conveyor_pgq_bench", "conveyor_pgq_bench_real"), parse_pgq),
    Bench("queen", ("--clients", "8", "--seconds", "1", "--repeat", "1", "--preload", "20000", "--skip-wildcard"),
          ("conveyor_queen_bench",), parse_queen),
    Bench("encryption", ("--clients", "8", "--seconds", "1", "--repeat", "1", "--preload", "5000"),
          ("conveyor_encryption_bench",), parse_encryption),
    Bench("overload", ("--clients", "500", "--seconds", "5", "--repeat", "1"),
          ("conveyor_overload_bench",), parse_overload),
    # the SQL functions' own cost: CPU of the bench's own backends only, so the figure least
    # moved by other users of a shared machine
    Bench("sql_call", ("--clients", "8", "--seconds", "2", "--repeat", "1", "--backlog", "100000"),
          ("conveyor_sql_call_bench",), parse_sql_call),
)}

LOWER_IS_BETTER = re.compile(r"ms$|MB$|other answers$|us/request$|us/call$")


# -- running ----------------------------------------------------------------------------------

def tree_env(src: Path) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(src), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1"}


def check_tree(src: Path) -> str:
    """Where conveyor (and its migrations) come from under this tree's PYTHONPATH; it must be
    the tree itself, not the installed checkout."""
    found = subprocess.run(
        [sys.executable, "-c", "import conveyor.db.migrate as m, conveyor; print(conveyor.__file__)"],
        env=tree_env(src), capture_output=True, text=True, check=True, cwd=ROOT).stdout.strip()
    if not Path(found).resolve().is_relative_to(src.resolve()):
        raise SystemExit(f"PYTHONPATH={src} imports conveyor from {found}, not from the tree")
    return found


def _sessions(name: str) -> int:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        return admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                             (name,)).fetchone()[0]


def wait_for_databases(bench: Bench, limit: float) -> None:
    deadline = time.monotonic() + limit
    for name in bench.databases:
        while _sessions(name) and time.monotonic() < deadline:
            print(f"    database {name} in use by another session; waiting", flush=True)
            time.sleep(5)


def drop_databases(bench: Bench) -> None:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        for name in bench.databases:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


def run_once(bench: Bench, src: Path, log: Path, timeout: float) -> tuple[bool, float]:
    """One run of the bench on one tree, its output into ``log``; (succeeded, seconds)."""
    argv = [sys.executable, str(ROOT / "bench" / f"{bench.name}_bench.py"), *bench.args]
    started = time.monotonic()
    with log.open("w") as out:
        out.write(f"# PYTHONPATH={src} {shlex.join(argv)}\n# load average {os.getloadavg()}\n")
        out.flush()
        child = subprocess.Popen(argv, env=tree_env(src), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        try:
            code = child.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            if child.poll() is None:  # timed out or interrupted: its whole group (servers too)
                os.killpg(child.pid, signal.SIGTERM)
                try:
                    child.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(child.pid, signal.SIGKILL)
                    child.wait()
        out.write(f"\n# exit {code} after {time.monotonic() - started:.0f} s\n")
    return code == 0, time.monotonic() - started


def run(args: argparse.Namespace, logs: Path) -> None:
    trees = {"before": args.before_src, "after": args.after_src}
    for tree, src in trees.items():
        print(f"{tree}: PYTHONPATH={src} imports {check_tree(src)}", flush=True)
    for n in range(args.repeat):
        order = TREES if n % 2 == 0 else TREES[::-1]
        for name in args.benches:
            bench = BENCHES[name]
            for tree in order:
                log = logs / f"{name}-{n}-{tree}.log"
                if log.exists() and _finished(log) and bench.parse(log.read_text()):
                    print(f"  round {n + 1} {name:<10} {tree:<6} kept from {log}", flush=True)
                    continue
                for attempt in range(2):  # a run that printed nothing (e.g. PostgreSQL out of connections) once more
                    if attempt:
                        log.rename(log.with_suffix(".failed"))
                    wait_for_databases(bench, args.db_wait)
                    load = os.getloadavg()[0]
                    ok, seconds = run_once(bench, trees[tree], log, args.timeout)
                    drop_databases(bench)
                    if ok or bench.parse(log.read_text()):
                        break
                print(f"  round {n + 1} {name:<10} {tree:<6} {'ok' if ok else 'FAILED':<6} {seconds:5.0f} s  "
                      f"load {load:.2f}", flush=True)


def _finished(log: Path) -> bool:
    return bool(re.search(r"^# exit ", log.read_text(), re.M))


# -- the table --------------------------------------------------------------------------------

def read_logs(logs: Path) -> tuple[dict[tuple[str, str], dict[int, Figures]], dict[tuple[str, str], int], list[float]]:
    """Per (bench, tree): the figures of each round, by round; failed runs counted; the load
    averages the runs started at."""
    runs: dict[tuple[str, str], dict[int, Figures]] = {}
    failed: dict[tuple[str, str], int] = {}
    loads = []
    for log in sorted(logs.glob("*.log")):
        m = re.fullmatch(r"(\w+)-(\d+)-(before|after)\.log", log.name)
        if not m or m[1] not in BENCHES:
            continue
        text = log.read_text()
        if load := re.search(r"^# load average \(([\d.]+)", text, re.M):
            loads.append(float(load[1]))
        if not re.search(r"^# exit 0 ", text, re.M):  # its figures printed before it failed still count
            failed[(m[1], m[3])] = failed.get((m[1], m[3]), 0) + 1
        runs.setdefault((m[1], m[3]), {})[int(m[2])] = BENCHES[m[1]].parse(text)
    return runs, failed, loads


def table(logs: Path, threshold: float) -> str:
    runs, failed, loads = read_logs(logs)
    lines = ["| bench | figure | before | after | after/before | rounds' ratios: range (pairs) | moved |",
             "|---|---|---:|---:|---:|---|---|"]
    for name in BENCHES:
        before, after = runs.get((name, "before"), {}), runs.get((name, "after"), {})
        if failed.get((name, "before")) or failed.get((name, "after")):
            lines.append(f"| {name} | runs that failed after the figures below: before "
                         f"{failed.get((name, 'before'), 0)}, after {failed.get((name, 'after'), 0)} (see the logs) "
                         "| | | | | |")
        rows = list(dict.fromkeys(k for r in [*before.values(), *after.values()] for k in r))
        for row in rows:
            b = [r[row] for r in before.values() if row in r]
            a = [r[row] for r in after.values() if row in r]
            # pairs: the rounds in which both trees ran and printed the row
            ratios = [after[n][row] / before[n][row] for n in before.keys() & after.keys()
                      if row in before[n] and row in after[n] and before[n][row]]
            if not b or not a or not ratios:
                lines.append(f"| {name} | {row} | {_fmt(b)} | {_fmt(a)} | | | |")
                continue
            worse = (lambda r: r > 1 + threshold) if LOWER_IS_BETTER.search(row) else (lambda r: r < 1 - threshold)
            better = (lambda r: r < 1 - threshold) if LOWER_IS_BETTER.search(row) else (lambda r: r > 1 + threshold)
            mark = "worse" if all(map(worse, ratios)) else "better" if all(map(better, ratios)) else ""
            lines.append(f"| {name} | {row} | {_fmt(b)} | {_fmt(a)} | {statistics.median(ratios):.2f} | "
                         f"{min(ratios):.2f}-{max(ratios):.2f} ({len(ratios)}) | {mark} |")
    if loads:
        lines.append("")
        lines.append(f"load average (1 min) when the runs started: min {min(loads):.2f}, "
                     f"median {statistics.median(loads):.2f}, max {max(loads):.2f}; {os.cpu_count()} cores")
    return "\n".join(lines)


def _fmt(values: list[float]) -> str:
    if not values:
        return "-"
    v = statistics.median(values)
    return f"{v:,.2f}" if abs(v) < 100 else f"{v:,.0f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before-src", type=Path, help="the src directory of the tree before")
    p.add_argument("--after-src", type=Path, default=ROOT / "src", help="the src directory after (default: this one)")
    p.add_argument("--repeat", type=int, default=3, help="rounds; each runs every bench once per tree (default 3)")
    p.add_argument("--benches", nargs="+", choices=list(BENCHES), default=list(BENCHES))
    p.add_argument("--logs", type=Path, help="where the runs' output goes (default: a new temporary directory)")
    p.add_argument("--from-logs", type=Path, help="print the table of the runs saved there; run nothing")
    p.add_argument("--timeout", type=float, default=600, help="seconds a run may take at most (default 600)")
    p.add_argument("--db-wait", type=float, default=300,
                   help="seconds to wait at most while another session uses a bench's database (default 300)")
    p.add_argument("--threshold", type=float, default=0.10,
                   help="a row is marked when every round's ratio moved more than this (default 0.10)")
    args = p.parse_args()
    if args.from_logs:
        print(table(args.from_logs, args.threshold))
        return
    if not args.before_src or args.repeat < 1:
        p.error("--before-src is needed (or --from-logs), and --repeat >= 1")
    def on_term(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # through run_once's finally: the running bench is stopped

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)  # also when started in the background, SIGINT ignored
    logs = args.logs or Path(tempfile.mkdtemp(prefix="regression_bench-"))
    logs.mkdir(parents=True, exist_ok=True)
    command = shlex.join([os.path.relpath(sys.executable), *sys.argv])
    print(f"logs in {logs}; {os.cpu_count()} cores, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
          flush=True)
    started = time.monotonic()
    run(args, logs)
    print()
    print(table(logs, args.threshold))
    print(f"\ncommand: {command}\nwall time {time.monotonic() - started:.0f} s; load average at the end "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
