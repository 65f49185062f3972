"""Background cost under a backlog: the CPU a server spends with no calls at all (its
processes and its PostgreSQL backends), with 0 to 10M messages waiting.

    ./bin/bench idle_bench.py [--sizes 0 1000000] [--workers 2] [--seconds 30] [--repeat 2]
                              [--before-src /tmp/before/src]

A server with no traffic still runs its background jobs: the stream ticker, move tasks,
the webhook and schedule polls, retention maintenance, the depth scrape of /metrics and
the dashboard's history. The last two count every queue's messages, so their cost grows
with the backlog; the goal is a background that stays small whatever is waiting.

For each build (this tree, and with --before-src another src/ side by side) and backlog
size, a fresh database is migrated by that build and gets its backlog beneath the API
(backlog_bench.prepare: one INSERT ... SELECT generate_series into queue 'q'); then
`conveyor serve` of that build (--workers processes) runs idle: after --settle seconds
(every job has run once), its CPU is read over --seconds from /proc, the server's
processes and every backend connected to its database. Rounds alternate the builds;
the figures are the medians of --repeat rounds, in ms of CPU per second.

Creates (and drops) databases conveyor_idle_bench_<random>_*.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg

from backlog_bench import ADMIN_DSN, create_database, drop_database, prepare

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support.server import ServerProcess  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> float:
    """CPU seconds of a process so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / HZ


def _children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [pid, *map(int, found)]


def idle_cpu(dsn: str, src: Path, workers: int, settle: float, seconds: float) -> tuple[float, float]:
    """(server, backends) CPU in ms per second of an idle server of the build at ``src``."""
    name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    server = ServerProcess(dsn, env={"CONVEYOR_WORKERS": str(workers), "PYTHONPATH": str(src)}).start(timeout=120)
    try:
        time.sleep(settle)
        procs = _children(server.proc.pid)
        seen: dict[int, float] = {}
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:

            def read() -> tuple[float, float]:
                for (pid,) in admin.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (name,)):
                    seen[pid] = max(seen.get(pid, 0.0), _cpu(pid))
                return sum(_cpu(p) for p in procs), sum(seen.values())

            server0, backends0 = read()
            began = time.monotonic()
            while time.monotonic() - began < seconds:
                time.sleep(1.0)
                server1, backends1 = read()
            took = time.monotonic() - began
    finally:
        server.kill()
    return (server1 - server0) / took * 1e3, (backends1 - backends0) / took * 1e3


def main(args: argparse.Namespace) -> None:
    builds = {"after": ROOT / "src"} | ({"before": Path(args.before_src)} if args.before_src else {})
    tag = uuid.uuid4().hex[:8]
    figures: dict[tuple[str, int], list[tuple[float, float]]] = {}
    made: list[str] = []
    try:
        dsns = {}
        for build, src in builds.items():
            for size in args.sizes:
                db = f"conveyor_idle_bench_{tag}_{build}_{size}"
                dsns[(build, size)] = create_database(db, src)
                made.append(db)
                prepare(dsns[(build, size)], "queue", size, "queue", 1)
                with psycopg.connect(dsns[(build, size)], autocommit=True) as conn:
                    conn.execute("VACUUM ANALYZE conveyor.messages_shared")
        for round_ in range(args.repeat):
            order = list(builds) if round_ % 2 == 0 else list(reversed(builds))
            for size in args.sizes:
                for build in order:
                    got = idle_cpu(dsns[(build, size)], builds[build], args.workers, args.settle, args.seconds)
                    figures.setdefault((build, size), []).append(got)
                    print(f"  round {round_ + 1} {build:6s} {size:>10,} waiting: server {got[0]:6.1f} ms/s, "
                          f"PostgreSQL {got[1]:6.1f} ms/s", flush=True)
    finally:
        for db in made:
            drop_database(db)
    print(f"\nidle server, {args.workers} worker(s), medians of {args.repeat} rounds of {args.seconds:.0f} s "
          "(CPU ms per second: server processes / PostgreSQL backends / both)")
    print("| messages waiting | " + " | ".join(builds) + " |" + (" after / before |" if len(builds) > 1 else ""))
    print("|---:|" + "---|" * len(builds) + ("---:|" if len(builds) > 1 else ""))
    for size in args.sizes:
        cells, totals = [], []
        for build in builds:
            server = statistics.median(f[0] for f in figures[(build, size)])
            backends = statistics.median(f[1] for f in figures[(build, size)])
            cells.append(f"{server:.1f} / {backends:.1f} / {server + backends:.1f}")
            totals.append(server + backends)
        ratio = f" {totals[0] / totals[1]:.2f}x |" if len(totals) > 1 and totals[1] else ""
        print(f"| {size:,} | " + " | ".join(cells) + " |" + ratio)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[0, 1_000_000], help="messages waiting in the queue")
    p.add_argument("--workers", type=int, default=2, help="server worker processes")
    p.add_argument("--seconds", type=float, default=30.0, help="seconds of idle CPU read per run")
    p.add_argument("--settle", type=float, default=20.0, help="seconds after the start before reading")
    p.add_argument("--repeat", type=int, default=2, help="rounds (builds alternate); the median is reported")
    p.add_argument("--before-src", help="src/ of another Conveyor to compare with, side by side")
    return p.parse_args()


if __name__ == "__main__":
    main(parse_args())
