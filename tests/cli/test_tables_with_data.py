"""Every CLI command's table output with data in it, not only the empty case (a table
column that reads a row the wrong way only fails once there is a row to read).

One database is filled once with something of every kind (queues with messages and dead
letters, a FIFO queue, a stream with a consumer, events, an open batch and a dead letter,
a topic with a subscription and a pending webhook delivery, a schedule); then each command
runs in its table form. The inventory test makes a new command fail here until it has a
case, or a stated reason not to print a table.
"""

from __future__ import annotations

import json

import click
import psycopg
import pytest

from support.cli import CLI, ok, ok_json, run

Q = "tbl-jobs"
DLQ = "tbl-jobs-dlq"
STREAM = "tbl-orders"

# command path -> arguments; each prints a table or record that must name each of ``expect``
CASES: dict[str, tuple[list[str], str | tuple[str, ...]]] = {
    "db status": ([], "0001"),
    "queues list": ([], Q),
    "queues show": ([Q], Q),
    "queues dead-letters": ([Q], "dead-body"),
    "peek": ([Q, "--max", "5"], "live-body"),
    "receive": ([Q, "--max", "1", "--vt", "30"], "live-body"),
    "status": ([], (Q, "tbl-pq", "reporting", "tbl-topic", "nightly")),
    "top": (["--iterations", "1", "--prefix", "tbl-"], (Q, STREAM, "tbl-pq", "reporting", "tbl-topic")),
    "streams list": ([], STREAM),
    "streams show": ([STREAM], STREAM),
    "streams consumers": ([STREAM], "billing"),
    "streams receive": ([STREAM, "audit"], "created"),
    "streams dead-letters": ([STREAM], "dead-event"),
    "streams health": ([], STREAM),
    "topics list": ([], "tbl-topic"),
    "topics show": (["tbl-topic"], "tbl-topic"),
    "topics subscriptions": ([], "orders.#"),
    "topics deliveries": ([], "127.0.0.1"),
    "schedules list": ([], "nightly"),
    "schedules show": (["nightly"], "nightly"),
    "schedules preview": (["--cron", "0 2 * * *", "--count", "2"], "02:00"),
}

# commands that change something and print one line about it, or are not tables at all:
# each is exercised with data by the test named beside it
NOT_TABLES = {
    "serve": "tests/server/test_run.py",
    "db migrate": "tests/cli/test_cli.py",
    "db sql": "tests/cli/test_cli.py",
    "db url": "test_db_commands.py", "db psql": "test_db_commands.py",
    "queues create": "test_cli.py::test_queue_lifecycle", "queues alter": "test_cli.py::test_queue_lifecycle",
    "queues delete": "test_cli.py::test_delete_asks_and_n_aborts", "queues purge": "test_cli.py",
    "queues reencrypt": "tests/server/test_encryption.py",
    "queues replay-dead-letters": "test_operator_cli.py", "queues purge-dead-letters": "test_operator_cli.py",
    "queues drain": "test_operator_cli.py", "send": "test_cli.py",
    "streams create": "test_streams_cli.py", "streams config": "test_streams_cli.py",
    "streams drop": "test_streams_cli.py", "streams append": "test_streams_cli.py",
    "streams subscribe": "test_streams_cli.py", "streams unsubscribe": "test_streams_cli.py",
    "streams ack": "test_streams_cli.py", "streams nack": "test_streams_cli.py",
    "streams replay": "test_streams_cli.py", "streams replay-all": "test_streams_cli.py",
    "streams purge-dead-letters": "test_streams_cli.py", "streams tick": "test_streams_cli.py",
    "streams maint": "test_streams_cli.py",
    "topics create": "test_topics_cli.py", "topics delete": "test_topics_cli.py",
    "topics publish": "test_topics_cli.py", "topics subscribe": "test_topics_cli.py",
    "topics unsubscribe": "test_topics_cli.py",
    "schedules create": "test_schedules_cli.py", "schedules update": "test_schedules_cli.py",
    "schedules pause": "test_schedules_cli.py", "schedules resume": "test_schedules_cli.py",
    "schedules delete": "test_schedules_cli.py", "schedules run": "test_schedules_cli.py",
    "pipeline archive": "tests/pipeline", "pipeline report": "tests/pipeline", "pipeline compact": "tests/pipeline",
}


def _leaves(cmd: click.Command, path: tuple[str, ...] = ()) -> list[str]:
    if isinstance(cmd, click.Group):
        return [leaf for name, sub in cmd.commands.items() for leaf in _leaves(sub, (*path, name))]
    return [" ".join(path)]


def test_every_command_has_a_case_or_a_reason():
    leaves = set(_leaves(CLI))
    assert leaves - CASES.keys() - NOT_TABLES.keys() == set()
    assert (CASES.keys() | NOT_TABLES.keys()) - leaves == set()


@pytest.fixture(scope="module")
def filled(module_dsn: str) -> str:
    dsn = module_dsn
    ok(run(dsn, "queues", "create", DLQ))
    ok(run(dsn, "queues", "create", Q, "--dead-letter-queue", DLQ, "--max-receive-count", "1"))
    ok(run(dsn, "queues", "create", "tbl-orders.fifo"))
    ok(run(dsn, "send", "tbl-orders.fifo", "fifo-body", "--group-id", "g1", "--dedup-id", "d1"))
    ok(run(dsn, "send", Q, "dead-body"))
    for _ in range(2):  # received once with max_receive_count 1: the next receive dead-letters it
        ok(run(dsn, "receive", Q, "--max", "10", "--vt", "0"))
    ok(run(dsn, "send", Q, "live-body\nwith a newline"))
    ok(run(dsn, "streams", "create", STREAM))
    ok(run(dsn, "streams", "config", STREAM, "--max-retries", "0"))
    for consumer in ("billing", "audit"):
        ok(run(dsn, "streams", "subscribe", STREAM, consumer))
    ok(run(dsn, "streams", "append", STREAM, '{"id": 1}', "--type", "created"))
    ok(run(dsn, "streams", "tick", STREAM))
    [event] = ok_json(run(dsn, "--json", "streams", "receive", STREAM, "billing"))
    batch = str(event["batch_id"])
    ok(run(dsn, "streams", "nack", batch, str(event["id"]), "--reason", "dead-event"))
    ok(run(dsn, "streams", "ack", batch))
    ok(run(dsn, "topics", "create", "tbl-topic"))
    ok(run(dsn, "topics", "subscribe", "orders.#", "--queue", Q))
    ok(run(dsn, "topics", "subscribe", "orders.#", "--endpoint", "http://127.0.0.1:9/hook"))
    ok(run(dsn, "topics", "publish", "orders.created", '{"id": 7}'))
    with psycopg.connect(dsn, autocommit=True) as conn:  # a partitioned (Queen) queue with a consumer group
        conn.execute("SELECT conveyor.pqueue_push(%s::jsonb)",
                     (json.dumps([{"queue": "tbl-pq", "partition": "p1", "payload": {"n": 1}}]),))
        conn.execute("SELECT conveyor.pqueue_subscribe('tbl-pq', 'reporting')")
    ok(run(dsn, "schedules", "create", "nightly", "--cron", "0 2 * * *", "--queue", Q, "--message", "report"))
    return dsn


@pytest.mark.parametrize("command", sorted(CASES))
def test_table_output_with_data(filled: str, command: str):
    args, expect = CASES[command]
    result = run(filled, *command.split(), *args)
    assert result.exit_code == 0, (result.output, result.exception)
    assert "Traceback" not in result.output
    for word in (expect,) if isinstance(expect, str) else expect:
        assert word in result.stdout, result.stdout
