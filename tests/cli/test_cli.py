"""The CLI end to end: every command against a real database through click's runner, in
table and JSON form, its errors, and the installed ``conveyor`` entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from conveyor.cli import output
from support.cli import CLI, failed, ok, ok_json, run

ENTRY_POINT = str(Path(sys.executable).with_name("conveyor"))
# nothing listens there: commands that must not touch a database get this one
NOWHERE = "postgresql://nobody@127.0.0.1:1/nowhere"


def _commands(group: click.Group, path: tuple[str, ...] = ()):
    for name, command in group.commands.items():
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))


# -- help and the schema -------------------------------------------------------------------

def test_help_on_every_command_and_group():
    assert "Usage: conveyor" in ok(CliRunner().invoke(CLI, ["--help"], prog_name="conveyor"))
    found = dict(_commands(CLI))
    assert {("db", "migrate"), ("db", "sql"), ("db", "status"), ("queues", "list"), ("queues", "create"),
            ("queues", "show"), ("queues", "alter"), ("queues", "delete"), ("queues", "purge"),
            ("send",), ("receive",), ("peek",), ("status",), ("serve",)} <= found.keys()
    for path, command in found.items():
        text = ok(CliRunner().invoke(CLI, [*path, "--help"]))
        summary = command.help.splitlines()[0].split()[0]
        assert summary in text, path  # the docstring is the help


def test_db_sql_prints_the_install_script_without_a_database():
    script = ok(run(NOWHERE, "db", "sql"))
    assert "CREATE SCHEMA" in script and script.rstrip().endswith("COMMIT;")
    # the migrations, then the functions as they stand (installed with psql by
    # tests/db/test_schema_equivalence.py)
    assert script.index("-- migration 0001_queues") < script.index("-- functions file functions/05_common")


def test_db_migrate_twice_then_up_to_date(empty_dsn):
    assert "pending" in ok(run(empty_dsn, "db", "status"))
    assert ok_json(run(empty_dsn, "db", "status", "--json"))[0]["applied_at"] is None
    assert "applied 0001_queues" in ok(run(empty_dsn, "db", "migrate"))
    assert ok(run(empty_dsn, "db", "migrate")).strip() == "schema is up to date"
    assert ok_json(run(empty_dsn, "--json", "db", "migrate")) == []
    assert "pending" not in ok(run(empty_dsn, "db", "status"))
    rows = ok_json(run(empty_dsn, "--json", "db", "status"))
    assert [r["version"] for r in rows] == list(range(1, len(rows) + 1)) and rows[0]["name"] == "queues"
    assert all(r["applied_at"] for r in rows)


def test_db_migrate_json_lists_what_it_applied(empty_dsn):
    applied = ok_json(run(empty_dsn, "db", "migrate", "--json"))
    assert applied[:2] == [{"version": 1, "name": "queues", "dialect": None, "label": "0001_queues"},
                           {"version": 2, "name": "redrive_and_attempts", "dialect": None,
                            "label": "0002_redrive_and_attempts"}]


# -- queues --------------------------------------------------------------------------------

def test_queue_lifecycle(dsn):
    assert ok(run(dsn, "queues", "list")).strip() == "no queues"
    assert "visibility timeout   45s" in ok(run(dsn, "queues", "create", "jobs", "--visibility-timeout", "45"))
    dlq = ok_json(run(dsn, "queues", "create", "jobs-dlq", "--retention", "3600", "--json"))
    assert dlq["name"] == "jobs-dlq" and dlq["retention_seconds"] == 3600 and dlq["fifo"] is False

    table = ok(run(dsn, "queues", "list")).splitlines()
    assert table[0].split()[:2] == ["NAME", "FIFO"] and [line.split()[0] for line in table[1:]] == ["jobs", "jobs-dlq"]
    assert [q["name"] for q in ok_json(run(dsn, "--json", "queues", "list", "--prefix", "jobs-"))] == ["jobs-dlq"]

    altered = ok_json(run(dsn, "queues", "alter", "jobs", "--max-receive-count", "3",
                          "--dead-letter-queue", "jobs-dlq", "--delay", "2", "--json"))
    assert (altered["max_receive_count"], altered["dead_letter_queue"], altered["delay_seconds"]) == (3, "jobs-dlq", 2)
    assert "dead-letter queue    jobs-dlq" in ok(run(dsn, "queues", "show", "jobs"))
    shown = ok_json(run(dsn, "queues", "show", "jobs", "--json"))
    assert shown["visibility_timeout"] == 45 and shown["queue_length"] == 0 and shown["dead_letter_length"] == 0

    cleared = ok(run(dsn, "queues", "alter", "jobs", "--clear-redrive"))
    assert "dead-letter queue    -" in cleared and "max receive count    -" in cleared

    assert ok(run(dsn, "queues", "delete", "jobs-dlq", "--yes")).strip() == "deleted queue jobs-dlq"
    assert ok_json(run(dsn, "--json", "queues", "delete", "jobs", "-y")) == {"queue": "jobs", "deleted": True}
    assert ok_json(run(dsn, "queues", "list", "--json")) == []


def test_queues_with_storage_of_their_own(dsn):
    assert "storage              unlogged" in ok(run(dsn, "queues", "create", "fast", "--storage", "unlogged"))
    made = ok_json(run(dsn, "queues", "create", "events", "--storage", "partitioned", "--partition-interval",
                       "1 day", "--partition-retention", "7 days", "--json"))
    assert made["partitioning"] == {"by": "time", "interval": "1 day", "retention": "7 days", "premake": 4}
    assert "storage              partitioned by time, 1 day each, keep 7 days, premake 4" \
        in ok(run(dsn, "queues", "show", "events"))
    assert "partitioned queues only" in failed(run(dsn, "queues", "create", "bad", "--partition-premake", "3"))


def test_purge_reports_how_many(dsn):
    ok(run(dsn, "queues", "create", "q"))
    for body in ("a", "b", "c"):
        ok(run(dsn, "send", "q", body))
    assert ok(run(dsn, "queues", "purge", "q", "--yes")).strip() == "deleted 3 messages from queue q"
    assert ok_json(run(dsn, "queues", "purge", "q", "--json", "--yes")) == {"queue": "q", "deleted": 0}


def test_delete_asks_and_n_aborts(dsn):
    ok(run(dsn, "queues", "create", "keep"))
    result = run(dsn, "queues", "delete", "keep", input="n\n")
    assert "Delete queue 'keep'" in failed(result) and "Aborted" in result.stderr
    assert ok(run(dsn, "queues", "delete", "keep", input="y\n")).strip() == "deleted queue keep"


# -- messages ------------------------------------------------------------------------------

def test_send_peek_receive_delete(dsn):
    ok(run(dsn, "queues", "create", "work"))
    assert ok(run(dsn, "send", "work", "hello")).strip() == "1"
    long_body = "line one\n" + "x" * 100
    assert ok(run(dsn, "send", "work", "-", "--header", "k=v", "--header", "e=a=b", input=long_body)).strip() == "2"
    assert ok_json(run(dsn, "--json", "send", "work", '{"n": 1}', "--json-body")) == {"queue": "work", "id": 3}

    table = ok(run(dsn, "peek", "work")).splitlines()
    assert table[0].split() == ["ID", "RECEIVES", "SENT", "AT", "VISIBLE", "AT", "BODY"]
    assert len(table) == 4 and table[1].endswith("hello")
    assert "line one\\nxxx" in table[2] and table[2].endswith("...") and "x" * 60 not in table[2]

    peeked = ok_json(run(dsn, "peek", "work", "--max", "2", "--json"))
    assert [m["id"] for m in peeked] == [1, 2]
    assert peeked[1]["body"] == long_body and peeked[1]["headers"] == {"k": "v", "e": "a=b"}

    received = ok(run(dsn, "receive", "work", "--max", "2", "--vt", "60")).splitlines()
    assert [line.split()[:2] for line in received[1:]] == [["1", "1"], ["2", "1"]]
    [message] = ok_json(run(dsn, "--json", "receive", "work", "--delete"))
    assert message["id"] == 3 and message["content_type"] == "application/json" and message["body"] == '{"n": 1}'
    assert ok(run(dsn, "receive", "work")).strip() == "no messages"  # 1, 2 in flight; 3 deleted
    assert [m["id"] for m in ok_json(run(dsn, "peek", "work", "--json"))] == [1, 2]


def test_receive_delete_in_table_form_and_wait(dsn):
    ok(run(dsn, "queues", "create", "w"))
    assert ok_json(run(dsn, "receive", "w", "--wait", "1", "--json")) == []
    ok(run(dsn, "send", "w", "only"))
    result = run(dsn, "receive", "w", "--delete")
    assert ok(result).splitlines()[1].endswith("only") and "deleted 1 message" in result.stderr
    assert ok_json(run(dsn, "peek", "w", "--json")) == []


def test_fifo_send_with_group_and_dedup(dsn):
    ok(run(dsn, "queues", "create", "orders.fifo"))
    first = ok(run(dsn, "send", "orders.fifo", "one", "--group-id", "g", "--dedup-id", "d1"))
    again = ok(run(dsn, "send", "orders.fifo", "one", "--group-id", "g", "--dedup-id", "d1"))
    assert first == again  # deduplicated: the same id
    [m] = ok_json(run(dsn, "--json", "peek", "orders.fifo"))
    assert (m["group_id"], m["dedup_id"]) == ("g", "d1")


# -- status --------------------------------------------------------------------------------

def test_status_empty(dsn):
    assert ok(run(dsn, "status")).strip() == "no queues"
    assert ok_json(run(dsn, "status", "--json")) == {
        "queues": [], "streams": [], "consumers": [], "partitioned_queues": [], "consumer_groups": [],
        "topics": [], "schedules": [],
        "webhooks": {"pending": 0, "due": 0, "held": 0, "exhausted": 0, "oldest_pending_age": None}}


def test_status_shows_topics_the_webhook_outbox_and_schedules(dsn):
    ok(run(dsn, "queues", "create", "jobs"))
    ok(run(dsn, "topics", "create", "orders"))
    ok(run(dsn, "topics", "subscribe", "orders", "--queue", "jobs"))
    ok(run(dsn, "topics", "subscribe", "orders", "--endpoint", "http://127.0.0.1:9/hook"))
    ok(run(dsn, "topics", "publish", "orders", "hello"))
    ok(run(dsn, "schedules", "create", "nightly", "--cron", "0 2 * * *", "--queue", "jobs", "--message", "go"))
    found = ok_json(run(dsn, "--json", "status"))
    assert found["topics"] == [{"name": "orders", "fifo": False, "subscriptions": 2}]
    assert (found["webhooks"]["pending"], found["webhooks"]["held"]) == (1, 0)
    assert found["webhooks"]["oldest_pending_age"] >= 0
    [nightly] = found["schedules"]
    assert (nightly["name"], nightly["status"], nightly["target"], nightly["fire_count"]) == (
        "nightly", "active", "jobs", 0)
    text = ok(run(dsn, "status"))
    for header in ("TOPIC", "WEBHOOK OUTBOX", "SCHEDULE"):
        assert header in text
    [outbox] = [line.split() for line in text.splitlines() if line.startswith("deliveries")]
    assert outbox[1:5] == ["1", "1", "0", "0"]


def test_status_rows(dsn):
    ok(run(dsn, "queues", "create", "dead"))
    ok(run(dsn, "queues", "create", "live", "--max-receive-count", "5", "--dead-letter-queue", "dead"))
    ok(run(dsn, "queues", "create", "f.fifo"))
    ok(run(dsn, "send", "live", "a"))
    ok(run(dsn, "send", "live", "b"))
    ok(run(dsn, "receive", "live"))
    lines = ok(run(dsn, "status")).splitlines()
    assert lines[0].split()[:3] == ["QUEUE", "FIFO", "DEPTH"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["live"][1:5] == ["no", "1", "1", "0"] and rows["live"][-2:] == ["dead", "0"]
    assert rows["f.fifo"][1] == "yes" and rows["dead"][-2:] == ["-", "-"]
    by_name = {r["queue_name"]: r for r in ok_json(run(dsn, "--json", "status"))["queues"]}
    assert by_name["live"]["queue_length"] == 1 and by_name["live"]["in_flight"] == 1
    assert by_name["live"]["total_messages"] == 2 and by_name["live"]["dead_letter_queue"] == "dead"
    assert by_name["f.fifo"]["fifo"] is True


# -- errors --------------------------------------------------------------------------------

def test_unknown_queue_is_a_clean_error(dsn):
    for args in (["queues", "show", "nope"], ["send", "nope", "x"], ["receive", "nope"], ["peek", "nope"],
                 ["queues", "purge", "nope", "--yes"], ["queues", "delete", "nope", "--yes"],
                 ["queues", "alter", "nope", "--delay", "1"]):
        assert "Error: queue 'nope' does not exist" in failed(run(dsn, *args)), args


def test_invalid_input_is_a_clean_error(dsn):
    assert "invalid queue name 'bad name'" in failed(run(dsn, "queues", "create", "bad name"))
    assert "visibility_timeout must be an integer from 0 to 43200" in failed(
        run(dsn, "queues", "create", "q", "--visibility-timeout", "-1"))
    ok(run(dsn, "queues", "create", "q"))
    assert "expected KEY=VALUE" in failed(run(dsn, "send", "q", "x", "--header", "novalue"), 2)
    assert "not valid JSON" in failed(run(dsn, "send", "q", "{nope", "--json-body"), 2)
    assert "nothing to change" in failed(run(dsn, "queues", "alter", "q"), 2)
    assert "cannot be combined" in failed(run(dsn, "queues", "alter", "q", "--clear-redrive",
                                              "--max-receive-count", "2"), 2)
    assert ok_json(run(dsn, "peek", "q", "--json")) == []  # nothing was sent


def test_unreachable_database_is_a_clean_error():
    said = failed(run(NOWHERE, "status"))
    assert "cannot connect to the database at postgresql://nobody@127.0.0.1:1/nowhere" in said
    assert "Connection refused" in said


# -- output helpers ------------------------------------------------------------------------

def test_durations():
    assert [output.duration(s) for s in (None, 0, 12, 184, 7260, 93600)] == ["-", "0s", "12s", "3m04s", "2h01m", "1d02h"]


def test_table_aligns_numbers_right_and_shows_missing_values():
    cols = [output.Column("NAME", "name"), output.Column("N", "n")]
    assert output.table([{"name": "a", "n": 5}, {"name": "bbb", "n": None}, {"name": "c", "n": 120}], cols) == (
        "NAME    N\n"
        "a       5\n"
        "bbb     -\n"
        "c     120")


def test_preview_escapes_and_truncates():
    assert output.preview("a\tb\n") == "a\\tb\\n"
    assert output.preview("y" * 61) == "y" * 57 + "..." and len(output.preview("é" * 80)) == 60
    assert output.preview("字" * 40) == "字" * 28 + "..."  # wide characters count twice


# -- the installed entry point -------------------------------------------------------------

def _entry(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL" and not k.startswith("CONVEYOR_")}
    return subprocess.run([ENTRY_POINT, *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.skipif(not Path(ENTRY_POINT).exists(), reason="conveyor is not installed in this venv")
def test_installed_entry_point(dsn):
    help_ = _entry("--help")
    assert help_.returncode == 0 and "queues" in help_.stdout and "status" in help_.stdout
    sql = _entry("--database-url", NOWHERE, "db", "sql")
    assert sql.returncode == 0 and "CREATE SCHEMA" in sql.stdout
    missing = _entry("--database-url", dsn, "queues", "show", "nope")
    assert missing.returncode == 1 and "queue 'nope' does not exist" in missing.stderr
    assert "Traceback" not in missing.stderr and missing.stdout == ""
    assert json.loads(_entry("--database-url", dsn, "status", "--json").stdout)["queues"] == []


def test_a_database_without_the_schema_says_to_migrate(empty_dsn):
    from click.testing import CliRunner

    from conveyor.cli.main import cli

    result = CliRunner().invoke(cli, ["--database-url", empty_dsn, "queues", "list"])
    assert result.exit_code == 1
    assert "conveyor db migrate" in result.output
