"""Operator tools (issue 17): ``conveyor top``, ``queues drain`` and the queue dead-letter
commands, through click's runner against a real database."""

from __future__ import annotations

import json
import threading
import time

import psycopg

from conveyor.cli import top as top_cli
from support.cli import failed, ok, ok_json, run


def _setup(dsn: str, queue: str) -> None:
    ok(run(dsn, "queues", "create", queue + "-dlq"))
    ok(run(dsn, "queues", "create", queue, "--dead-letter-queue", queue + "-dlq", "--max-receive-count", "1"))


def test_top_refreshes_with_rates(dsn, queue_name):
    ok(run(dsn, "queues", "create", queue_name))
    def send() -> None:  # another process's traffic (click's runner is not for two threads at once)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for i in range(5):
                conn.execute("SELECT conveyor.message_send(%s, %s)", (queue_name, f"m{i}"))
                time.sleep(0.2)

    sender = threading.Thread(target=send)
    sender.start()
    result = ok(run(dsn, "--json", "top", "--iterations", "3", "--interval", "0.5"))
    sender.join()
    frames = [json.loads(line) for line in result.splitlines() if line.strip()]
    assert len(frames) == 3
    rows = [next(r for r in f["queues"] if r["queue_name"] == queue_name) for f in frames]
    assert rows[0]["sent_per_sec"] is None and rows[-1]["sent_per_sec"] is not None
    text = ok(run(dsn, "top", "--iterations", "1", "--prefix", queue_name))
    assert "conveyor top" in text and queue_name in text and "SENT/S" in text


def test_rates_count_what_came_and_what_left():
    before = {"q": {"total_messages": 10, "queue_length": 5, "in_flight": 0, "delayed": 0}}
    rows = [{"queue_name": "q", "total_messages": 30, "queue_length": 15, "in_flight": 5, "delayed": 0}]
    top_cli.rates(before, rows, 2.0)
    assert rows[0]["sent_per_sec"] == 10.0 and rows[0]["done_per_sec"] == 2.5  # 20 in, backlog +15: 5 out in 2 s


def test_drain_waits_for_the_consumers_or_times_out(dsn, queue_name):
    ok(run(dsn, "queues", "create", queue_name))
    ok(run(dsn, "send", queue_name, "work"))
    assert "not drained" in failed(run(dsn, "queues", "drain", queue_name, "--timeout", "0.3", "--interval", "0.1"))

    def consume() -> None:
        time.sleep(0.5)
        with psycopg.connect(dsn, autocommit=True) as conn:
            [(message_id,)] = conn.execute("SELECT id FROM conveyor.message_receive(%s, 30, 1)", (queue_name,)).fetchall()
            conn.execute("SELECT conveyor.message_delete(%s, %s)", (queue_name, message_id))

    worker = threading.Thread(target=consume)
    worker.start()
    assert ok_json(run(dsn, "--json", "queues", "drain", queue_name, "--timeout", "10", "--interval", "0.1")) == {
        "queue": queue_name, "drained": True}
    worker.join()


def test_queue_dead_letters_list_replay_and_purge(dsn, queue_name):
    _setup(dsn, queue_name)
    for body in ("a", "b"):
        ok(run(dsn, "send", queue_name, body))
    for _ in range(2):  # received once with max_receive_count 1: the next receive dead-letters
        run(dsn, "receive", queue_name, "--max", "10", "--vt", "0")
    listed = ok_json(run(dsn, "--json", "queues", "dead-letters", queue_name))
    assert sorted(m["body"] for m in listed) == ["a", "b"]
    replayed = ok_json(run(dsn, "--json", "queues", "replay-dead-letters", queue_name))
    assert replayed["moved"] == 2 and replayed["status"] == "COMPLETED"
    assert ok_json(run(dsn, "--json", "queues", "dead-letters", queue_name)) == []
    assert sorted(m["body"] for m in ok_json(run(dsn, "--json", "peek", queue_name))) == ["a", "b"]
    for _ in range(2):
        run(dsn, "receive", queue_name, "--max", "10", "--vt", "0")
    assert ok_json(run(dsn, "--json", "queues", "purge-dead-letters", queue_name, "--yes"))["deleted"] == 2
    assert "no dead-letter queue" in failed(run(dsn, "queues", "dead-letters", queue_name + "-dlq"))
