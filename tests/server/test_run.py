"""``conveyor serve --workers N``: N processes on one port that start, stop and fail together."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import psycopg
import pytest

from conveyor import settings
from conveyor.settings import DEFAULT_WORKERS_CAP, Settings, usable_cores
from support.server import ServerProcess, children


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_gone(pids: set[int], timeout: float = 15.0) -> set[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return {p for p in pids if _alive(p)}


def test_workers_serve_one_port_and_stop_together_on_sigterm(dsn, queue_name):
    server = ServerProcess(dsn, args=["--workers", "2"]).start()
    try:
        workers = children(server.proc.pid)
        assert len(workers) == 2
        url = f"{server.url}/v1/queues/{queue_name}/messages"
        httpx.post(f"{server.url}/v1/queues", json={"name": queue_name}, headers={"Authorization": "t"})
        for i in range(40):  # a new connection each time: the kernel hands them to either worker
            r = httpx.post(url, json={"message": str(i)}, headers={"Authorization": "t", "Connection": "close"})
            assert r.status_code == 201, r.text
        got = httpx.get(url, params={"max": 100}, headers={"Authorization": "t"}).json()
        assert sorted(int(m["message"]) for m in got) == list(range(40))
        # /metrics, answered by either worker, counts the requests of both
        for _ in range(4):
            text = httpx.get(f"{server.url}/metrics", headers={"Connection": "close"}).text
            sent = [line for line in text.splitlines()
                    if line.startswith(f'queue_messages_sent_total{{queue="{queue_name}"}}')]
            assert sent and float(sent[0].split()[-1]) == 40.0, sent
        assert server.terminate() == 0
        assert not _wait_gone(workers)
    finally:
        server.kill()


def _calls(dsn: str, function: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT coalesce(sum(calls), 0)::int FROM pg_stat_user_functions "
                           "WHERE schemaname = 'conveyor' AND funcname = %s", (function,)).fetchone()
    return row[0] if row else 0


def test_one_worker_reads_the_queue_depths_and_every_worker_shows_them(dsn, queue_name):
    """The figures of the database (queue depths) are the same for every worker: one of
    them reads them (a count of every queue's messages; two workers reading them doubled
    the server's background cost under a backlog) and /metrics shows them from any; a
    dropped queue's series goes from every worker's /metrics (multiprocess gauges kept it)."""
    with psycopg.connect(dsn, autocommit=True) as conn:  # counts the calls of SQL functions
        conn.execute(f"ALTER DATABASE \"{conn.info.dbname}\" SET track_functions = 'all'")
    server = ServerProcess(dsn, args=["--workers", "2"], env={"CONVEYOR_DEPTH_SCRAPE_INTERVAL": "0.2",
                                                              "CONVEYOR_HISTORY_INTERVAL": "0.5"}).start()
    try:
        httpx.post(f"{server.url}/v1/queues", json={"name": queue_name}, headers={"Authorization": "t"})
        for i in range(5):
            httpx.post(f"{server.url}/v1/queues/{queue_name}/messages", json={"message": str(i)},
                       headers={"Authorization": "t"})
        shown = f'queue_depth{{queue="{queue_name}"}} 5.0'
        deadline = time.monotonic() + 30
        while shown not in httpx.get(f"{server.url}/metrics").text and time.monotonic() < deadline:
            time.sleep(0.1)
        for _ in range(6):  # a new connection each time: the kernel hands them to either worker
            assert shown in httpx.get(f"{server.url}/metrics", headers={"Connection": "close"}).text
        # each scrape looks at the dashboard's latest sample first (and counts if it is stale)
        before, began = _calls(dsn, "history_latest_queues"), time.monotonic()
        time.sleep(3)
        scrapes = _calls(dsn, "history_latest_queues") - before
        # one worker every 0.2 s: about 15 (two: about 30); statistics are flushed now and then
        assert 0 < scrapes <= (time.monotonic() - began) / 0.2 + 5, scrapes

        assert httpx.delete(f"{server.url}/v1/queues/{queue_name}", headers={"Authorization": "t"}).status_code == 204
        def figures(text: str) -> list[str]:  # the gauges' lines of the queue (its counters stay)
            return [line for line in text.splitlines() if line.split("{")[0] in
                    ("queue_depth", "queue_in_flight", "queue_delayed") and f'queue="{queue_name}"' in line]

        deadline = time.monotonic() + 30
        while figures(httpx.get(f"{server.url}/metrics").text) and time.monotonic() < deadline:
            time.sleep(0.1)
        for _ in range(6):
            text = httpx.get(f"{server.url}/metrics", headers={"Connection": "close"}).text
            assert not figures(text) and "# TYPE queue_depth gauge" in text
    finally:
        server.kill()


def test_a_worker_that_dies_stops_the_others_and_the_server_fails(dsn):
    server = ServerProcess(dsn, args=["--workers", "2"]).start()
    try:
        first, second = sorted(children(server.proc.pid))
        os.kill(first, signal.SIGKILL)
        assert server.proc.wait(30) != 0
        assert not _wait_gone({second})
        assert "stopping the others" in server.output()
    finally:
        server.kill()


@pytest.mark.parametrize("workers", [0, 65])
def test_workers_out_of_range_are_refused(workers):
    with pytest.raises(ValueError, match="workers must be from 1 to 64"):
        Settings(workers=workers)


def test_without_a_setting_the_server_runs_one_worker_per_usable_core(dsn):
    expected = min(usable_cores(), DEFAULT_WORKERS_CAP)
    assert Settings().workers == Settings.from_env({}).workers == expected
    server = ServerProcess(dsn, env={"CONVEYOR_WORKERS": ""}).start()  # empty: not set
    try:
        # one worker is the parent process itself; more are its children
        assert len(children(server.proc.pid)) == (expected if expected > 1 else 0)
        assert server.terminate() == 0
    finally:
        server.kill()


@pytest.mark.parametrize(("cpu_max", "cap"), [("max 100000\n", None), ("150000 100000\n", 2),
                                               ("50000 100000\n", 1), ("garbage\n", None)])
def test_usable_cores_honour_the_cgroup_cpu_quota(tmp_path, cpu_max, cap):
    affinity = len(os.sched_getaffinity(0))
    (tmp_path / "cpu.max").write_text(cpu_max)
    assert usable_cores(tmp_path / "cpu.max") == (affinity if cap is None else min(affinity, cap))
    assert usable_cores(tmp_path / "missing") == affinity


def test_the_default_worker_count_is_capped(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(64)))
    assert usable_cores(Path("/nonexistent")) == 64
    monkeypatch.setattr(settings, "usable_cores", lambda: 64)  # whatever this machine's cgroup says
    assert Settings().workers == DEFAULT_WORKERS_CAP
    assert Settings.from_env({"CONVEYOR_WORKERS": "3"}).workers == 3
