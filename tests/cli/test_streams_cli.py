"""``conveyor streams`` and the streams part of ``conveyor status``, end to end against a
real database through click's runner, without a server: the tests tick (``streams tick
NAME``) and run maintenance (``streams maint``) themselves."""

from __future__ import annotations

import pytest
from click.testing import CliRunner, Result

from support.cli import CLI, failed, ok, ok_json, rows, run


def streams(dsn: str, *args: str, input: str | None = None) -> Result:
    return run(dsn, "streams", *args, input=input)


@pytest.fixture
def jobs(dsn: str) -> str:
    """Stream ``jobs`` (max 1 retry) with consumer ``worker`` subscribed."""
    ok(streams(dsn, "create", "jobs", "--max-retries", "1"))
    ok(streams(dsn, "subscribe", "jobs", "worker"))
    return dsn


def _receive_one(dsn: str) -> dict:
    [event] = ok_json(streams(dsn, "receive", "jobs", "worker", "--json"))
    return event


# -- managing streams ----------------------------------------------------------------------

def test_create_list_show_config_drop(dsn):
    assert ok(streams(dsn, "list")).strip() == "no streams"
    assert ok_json(streams(dsn, "list", "--json")) == []
    text = ok(streams(dsn, "create", "orders", "--rotation-period", "3600", "--ticker-max-lag", "1"))
    assert "rotation period     1h00m" in text and "ticker max lag      1s" in text and "event ttl           -" in text
    created = ok_json(streams(dsn, "create", "audit", "--max-retries", "0", "--event-ttl", "86400",
                              "--ticker-max-count", "10", "--ticker-idle-period", "30", "--json"))
    assert (created["name"], created["max_retries"], created["event_ttl"]) == ("audit", 0, 86400)
    assert (created["ticker_max_count"], created["ticker_idle_period"], created["rotation_period"]) == (10, 30, 7200)

    again = streams(dsn, "create", "audit", "--max-retries", "3", "--json")  # exists: unchanged, said so
    assert ok_json(again)["max_retries"] == 0 and "already exists with other max_retries" in again.stderr

    table = ok(streams(dsn, "list")).splitlines()
    assert table[0].split()[:3] == ["NAME", "ROTATION", "MAX"]
    assert [r[0] for r in rows("\n".join(table))] == ["audit", "orders"]
    assert [s["name"] for s in ok_json(run(dsn, "--json", "streams", "list"))] == ["audit", "orders"]

    paused = ok_json(streams(dsn, "config", "orders", "--pause", "--max-retries", "9", "--json"))
    assert paused["ticker_paused"] is True and paused["max_retries"] == 9 and paused["rotation_period"] == 3600
    assert "ticker paused       no" in ok(streams(dsn, "config", "orders", "--resume"))
    assert "nothing to change" in failed(streams(dsn, "config", "orders"), 2)

    shown = ok(streams(dsn, "show", "orders"))
    assert "max retries         9" in shown and "depth               0" in shown
    assert shown.rstrip().endswith("no consumers")
    data = ok_json(streams(dsn, "show", "orders", "--json"))
    assert data["stream"]["name"] == "orders" and data["stats"]["depth"] == 0 and data["consumers"] == []
    assert data["stats"]["last_tick_id"] is not None and "stream" not in data["stats"]

    result = streams(dsn, "drop", "orders", input="n\n")
    assert "Drop stream 'orders'" in failed(result) and "Aborted" in result.stderr
    assert ok(streams(dsn, "drop", "orders", input="y\n")).strip() == "dropped stream orders"
    assert ok_json(streams(dsn, "drop", "audit", "--yes", "--json")) == {"stream": "audit", "dropped": True}
    assert ok_json(streams(dsn, "list", "--json")) == []


def test_subscribe_unsubscribe_consumers(jobs):
    dsn = jobs
    assert ok(streams(dsn, "subscribe", "jobs", "worker")).strip() == "worker was already subscribed to jobs"
    assert ok_json(streams(dsn, "subscribe", "jobs", "audit", "--json")) == {
        "stream": "jobs", "consumer": "audit", "subscribed": True}
    ok(streams(dsn, "append", "jobs", "a"))
    ok(streams(dsn, "tick", "jobs"))
    ok(streams(dsn, "receive", "jobs", "worker"))

    table = ok(streams(dsn, "consumers", "jobs"))
    assert table.splitlines()[0].split()[:3] == ["CONSUMER", "LAG", "PENDING"]
    by_name = {r[0]: r for r in rows(table)}
    assert by_name.keys() == {"audit", "worker"} and by_name["audit"][2] == "1"
    assert by_name["audit"][-2:] == ["-", "-"] and by_name["worker"][-2] != "-"  # worker's batch is open
    found = {c["consumer"]: c for c in ok_json(streams(dsn, "consumers", "jobs", "--json"))}
    assert found["worker"]["batch_active"] is True and isinstance(found["worker"]["batch_id"], int)
    assert found["audit"]["pending_events"] == 1 and isinstance(found["audit"]["lag"], (int, float))

    assert ok(streams(dsn, "unsubscribe", "jobs", "audit")).strip() == "unsubscribed audit from jobs"
    assert ok_json(streams(dsn, "unsubscribe", "jobs", "worker", "--json"))["unsubscribed"] is True
    assert ok(streams(dsn, "consumers", "jobs")).strip() == "no consumers"


# -- producing and consuming ---------------------------------------------------------------

def test_full_cycle(jobs):
    dsn = jobs
    assert ok(streams(dsn, "append", "jobs", "first")).strip() == "1"
    assert ok(streams(dsn, "append", "jobs", "-", "--type", "multi", input="line one\nline two")).strip() == "2"
    assert ok_json(streams(dsn, "append", "jobs", "--type", "t", "--extra1", "e1", "--extra4", "e4", "--json",
                           input='{"k": 1}')) == {"stream": "jobs", "id": 3}
    assert ok(streams(dsn, "receive", "jobs", "worker")).strip() == "no events"  # not ticked yet
    assert "ticked jobs: tick" in ok(streams(dsn, "tick", "jobs"))

    table = ok(streams(dsn, "receive", "jobs", "worker"))
    assert table.splitlines()[0].split() == ["BATCH", "ID", "TYPE", "RETRIES", "CREATED", "AT", "PAYLOAD"]
    assert [(r[1], r[2], r[3]) for r in rows(table)] == [("1", "default", "-"), ("2", "multi", "-"), ("3", "t", "-")]
    assert "line one\\nline two" in table and rows(table)[0][-1] == "first"

    events = ok_json(streams(dsn, "receive", "jobs", "worker", "--json"))  # the open batch again
    assert [e["id"] for e in events] == [1, 2, 3] and len({e["batch_id"] for e in events}) == 1
    assert events[1]["payload"] == "line one\nline two" and events[2]["payload"] == '{"k": 1}'
    third = events[2]
    assert (third["type"], third["extra1"], third["extra4"], third["retry_count"]) == ("t", "e1", "e4", None)

    batch = events[0]["batch_id"]
    assert ok(streams(dsn, "ack", str(batch))).strip() == f"acknowledged batch {batch}"
    assert ok_json(streams(dsn, "receive", "jobs", "worker", "--json")) == []
    assert "does not exist or is finished" in failed(streams(dsn, "ack", str(batch)))


def test_receive_ack_and_a_batch_larger_than_max(jobs):
    dsn = jobs
    for payload in ("a", "b", "c"):
        ok(streams(dsn, "append", "jobs", payload))
    ok(streams(dsn, "tick", "jobs"))

    partial = streams(dsn, "receive", "jobs", "worker", "--max", "2")
    assert len(rows(ok(partial))) == 2 and "holds more than 2 events" in partial.stderr
    refused = streams(dsn, "receive", "jobs", "worker", "--max", "2", "--ack")
    assert "not acknowledged" in failed(refused) and len(rows(refused.stdout)) == 2  # printed, kept open

    acked = streams(dsn, "receive", "jobs", "worker", "--ack", "--json")
    assert [e["payload"] for e in ok_json(acked)] == ["a", "b", "c"] and "acknowledged batch" in acked.stderr
    assert ok(streams(dsn, "receive", "jobs", "worker", "--ack")).strip() == "no events"

    ok(streams(dsn, "append", "jobs", "d"))
    ok(streams(dsn, "tick", "jobs"))
    assert rows(ok(streams(dsn, "receive", "jobs", "worker", "--ack")))[0][-1] == "d"
    assert ok_json(streams(dsn, "receive", "jobs", "worker", "--json")) == []


def test_nack_maint_tick_redelivers_then_dead_letters(jobs):
    dsn = jobs
    ok(streams(dsn, "append", "jobs", "flaky", "--type", "job"))
    ok(streams(dsn, "tick", "jobs"))
    event = _receive_one(dsn)
    batch, event_id = str(event["batch_id"]), str(event["id"])

    assert ok(streams(dsn, "nack", batch, event_id, "--retry-after", "0")).strip() == \
        f"event {event_id} will be retried in 0s"
    ok(streams(dsn, "ack", batch))
    assert ok_json(streams(dsn, "receive", "jobs", "worker", "--json")) == []  # not moved back yet
    maint = ok(streams(dsn, "maint"))
    assert ["jobs", "retries", "1"] in rows(maint)
    ok(streams(dsn, "tick", "jobs"))
    again = _receive_one(dsn)
    assert (again["id"], again["payload"], again["retry_count"]) == (event["id"], "flaky", 1)

    # max retries 1: the second nack dead-letters it
    result = ok_json(streams(dsn, "nack", str(again["batch_id"]), event_id, "--reason", "still broken", "--json"))
    assert result == {"batch_id": again["batch_id"], "event_id": event["id"], "result": "dead"}
    ok(streams(dsn, "ack", str(again["batch_id"])))
    assert ok(streams(dsn, "maint")).strip() == "nothing to do"
    assert ok_json(streams(dsn, "maint", "--json")) == []


def test_dead_letters_list_replay_purge(jobs):
    dsn = jobs
    ok(streams(dsn, "config", "jobs", "--max-retries", "0"))
    for payload in ("one", "two", "three"):
        ok(streams(dsn, "append", "jobs", payload))
    ok(streams(dsn, "tick", "jobs"))
    events = ok_json(streams(dsn, "receive", "jobs", "worker", "--json"))
    for e in events:
        ok(streams(dsn, "nack", str(e["batch_id"]), str(e["id"]), "--reason", f"bad {e['payload']}"))
    ok(streams(dsn, "ack", str(events[0]["batch_id"])))

    table = ok(streams(dsn, "dead-letters", "jobs"))
    assert table.splitlines()[0].split()[:3] == ["ID", "CONSUMER", "DEAD"]
    assert [(r[1], r[-1]) for r in rows(table)] == [("worker", "one"), ("worker", "two"), ("worker", "three")]
    dead = ok_json(streams(dsn, "dead-letters", "jobs", "--max", "2", "--json"))
    assert [(d["ev_data"], d["reason"], d["consumer"]) for d in dead] == [("one", "bad one", "worker"),
                                                                        ("two", "bad two", "worker")]

    new_id = int(ok(streams(dsn, "replay", str(dead[0]["id"]))))
    assert new_id > max(e["id"] for e in events)
    assert "does not exist" in failed(streams(dsn, "replay", str(dead[0]["id"])))
    assert [d["ev_data"] for d in ok_json(streams(dsn, "dead-letters", "jobs", "--json"))] == ["two", "three"]
    ok(streams(dsn, "tick", "jobs"))
    replayed = _receive_one(dsn)
    assert (replayed["id"], replayed["payload"], replayed["retry_count"]) == (new_id, "one", None)
    ok(streams(dsn, "ack", str(replayed["batch_id"])))

    assert ok(streams(dsn, "purge-dead-letters", "jobs", "--older-than", "3600", "--yes")).strip() == \
        "deleted 0 dead letters"
    result = streams(dsn, "purge-dead-letters", "jobs", input="n\n")
    assert "Delete the dead letters of stream 'jobs'" in failed(result)
    assert ok(streams(dsn, "purge-dead-letters", "jobs", "--yes")).strip() == "deleted 2 dead letters"
    assert ok(streams(dsn, "dead-letters", "jobs")).strip() == "no dead letters"

    # replay-all: dead-letter one more, then send everything back
    ok(streams(dsn, "append", "jobs", "four"))
    ok(streams(dsn, "tick", "jobs"))
    four = _receive_one(dsn)
    ok(streams(dsn, "nack", str(four["batch_id"]), str(four["id"])))
    ok(streams(dsn, "ack", str(four["batch_id"])))
    assert ok(streams(dsn, "replay-all", "jobs")).strip() == "replayed 1 dead letter"
    assert ok_json(streams(dsn, "replay-all", "jobs", "--json")) == {"stream": "jobs", "replayed": 0}
    assert ok_json(streams(dsn, "purge-dead-letters", "jobs", "-y", "--json")) == {"stream": "jobs", "deleted": 0}


# -- ticker, maintenance, health -----------------------------------------------------------

def test_tick_without_a_name_runs_the_ticker(jobs):
    dsn = jobs
    assert ok(streams(dsn, "tick")).strip() == "made 0 ticks"  # just created: nothing due
    ok(streams(dsn, "config", "jobs", "--ticker-max-count", "1"))
    ok(streams(dsn, "append", "jobs", "x"))
    assert ok_json(streams(dsn, "tick", "--json")) == {"ticks": 1}
    assert _receive_one(dsn)["payload"] == "x"
    forced = ok_json(streams(dsn, "tick", "jobs", "--json"))
    assert forced["stream"] == "jobs" and isinstance(forced["tick_id"], int)


def test_health(jobs):
    dsn = jobs
    ok(streams(dsn, "tick", "jobs"))
    table = ok(streams(dsn, "health"))
    assert table.splitlines()[0].split() == ["STREAM", "CHECK", "STATUS", "DETAIL"]
    checks = {r[1]: r[2] for r in rows(table)}
    assert checks == {"consumer_lag:worker": "ok", "dead_letters": "ok", "rotation": "ok", "ticker": "ok"}
    found = ok_json(run(dsn, "--json", "streams", "health"))
    assert {(c["stream"], c["check"], c["status"]) for c in found} >= {("jobs", "ticker", "ok")}
    assert all(c["status"] in ("ok", "warning", "critical") and c["detail"] for c in found)


def test_health_without_streams(dsn):
    assert ok(streams(dsn, "health")).strip() == "no streams"
    assert ok_json(streams(dsn, "health", "--json")) == []


# -- status --------------------------------------------------------------------------------

def test_status_with_streams(jobs):
    dsn = jobs
    ok(run(dsn, "queues", "create", "q"))
    ok(streams(dsn, "create", "idle"))
    ok(streams(dsn, "config", "idle", "--pause"))
    ok(streams(dsn, "subscribe", "jobs", "audit"))
    for payload in ("a", "b"):
        ok(streams(dsn, "append", "jobs", payload))
    ok(streams(dsn, "tick", "jobs"))
    batch = ok_json(streams(dsn, "receive", "jobs", "worker", "--json"))[0]["batch_id"]

    sections = ok(run(dsn, "status")).split("\n\n")
    assert len(sections) == 3
    assert sections[0].split()[:3] == ["QUEUE", "FIFO", "DEPTH"]
    assert sections[1].splitlines()[0].split() == ["STREAM", "DEPTH", "CONSUMERS", "EVENTS/S", "ROTATION", "AGE",
                                                   "DEAD", "LETTERS", "LAST", "TICK", "PAUSED"]
    by_stream = {r[0]: r for r in rows(sections[1])}
    assert by_stream["jobs"][1:3] == ["2", "2"] and by_stream["jobs"][-1] == "no"
    assert by_stream["idle"][1:3] == ["0", "0"] and by_stream["idle"][-1] == "yes"
    assert sections[2].splitlines()[0].split() == ["STREAM", "CONSUMER", "LAG", "PENDING", "OPEN", "BATCH"]
    by_consumer = {r[1]: r for r in rows(sections[2])}
    assert by_consumer["worker"][-1] == str(batch) and by_consumer["audit"][-2:] == ["2", "-"]

    found = ok_json(run(dsn, "--json", "status"))
    assert set(found) == {"queues", "streams", "consumers", "partitioned_queues", "consumer_groups", "topics", "webhooks",
                          "schedules"}
    assert [q["queue_name"] for q in found["queues"]] == ["q"]
    jobs_row = {s["stream"]: s for s in found["streams"]}["jobs"]
    assert (jobs_row["depth"], jobs_row["consumers"], jobs_row["dead_letters"]) == (2, 2, 0)
    assert jobs_row["ticker_paused"] is False
    assert isinstance(jobs_row["events_per_sec"], (int, float)) and 0 <= jobs_row["last_tick_age"] < 60
    assert isinstance(jobs_row["rotation_age"], (int, float))
    assert [(c["stream"], c["consumer"], c["pending_events"], c["batch_id"]) for c in found["consumers"]] == [
        ("jobs", "audit", 2, None), ("jobs", "worker", 2, batch)]


def test_status_streams_without_consumers_or_queues(dsn):
    ok(streams(dsn, "create", "lonely"))
    sections = ok(run(dsn, "status")).split("\n\n")
    assert sections[0].strip() == "no queues" and len(sections) == 2  # no consumers: no consumer table
    assert rows(sections[1])[0][0] == "lonely"
    assert ok_json(run(dsn, "status", "--json"))["consumers"] == []


# -- errors --------------------------------------------------------------------------------

def test_unknown_stream_is_a_clean_error(dsn):
    for args in (["show", "nope"], ["config", "nope", "--pause"], ["drop", "nope", "--yes"], ["append", "nope", "x"],
                 ["subscribe", "nope", "c"], ["unsubscribe", "nope", "c"], ["consumers", "nope"],
                 ["receive", "nope", "c"], ["dead-letters", "nope"], ["replay-all", "nope"],
                 ["purge-dead-letters", "nope", "--yes"], ["tick", "nope"]):
        assert "Error: stream 'nope' does not exist" in failed(streams(dsn, *args)), args


def test_unknown_consumer_batch_event_and_dead_letter(jobs):
    dsn = jobs
    assert "consumer 'ghost' is not subscribed to stream 'jobs'" in failed(streams(dsn, "receive", "jobs", "ghost"))
    assert "consumer 'ghost' is not subscribed to stream 'jobs'" in failed(streams(dsn, "unsubscribe", "jobs", "ghost"))
    assert "batch 999 does not exist" in failed(streams(dsn, "ack", "999"))
    assert "batch 999 does not exist" in failed(streams(dsn, "nack", "999", "1"))
    assert "dead letter 999 does not exist" in failed(streams(dsn, "replay", "999"))
    ok(streams(dsn, "append", "jobs", "x"))
    ok(streams(dsn, "tick", "jobs"))
    event = _receive_one(dsn)
    assert f"event 12345 is not in batch {event['batch_id']}" in failed(
        streams(dsn, "nack", str(event["batch_id"]), "12345"))


def test_invalid_input_is_a_clean_error(dsn):
    assert "invalid stream name 'bad name'" in failed(streams(dsn, "create", "bad name"))
    assert "out of range" in failed(streams(dsn, "create", "s", "--rotation-period", "0"))
    ok(streams(dsn, "create", "s"))
    assert "out of range" in failed(streams(dsn, "config", "s", "--max-retries", "-1"))
    assert "invalid consumer name" in failed(streams(dsn, "subscribe", "s", "bad consumer"))
    assert failed(streams(dsn, "ack", "notanumber"), 2)
    assert failed(streams(dsn, "nack", "1", "2", "--retry-after", "-5"), 2)
    assert failed(streams(dsn, "receive", "s", "c", "--max", "0"), 2)


def test_help_of_every_streams_command():
    group = CLI.commands["streams"]
    assert set(group.commands) == {
        "list", "create", "show", "config", "drop", "append", "subscribe", "unsubscribe", "consumers", "receive",
        "ack", "nack", "dead-letters", "replay", "replay-all", "purge-dead-letters", "tick", "maint", "health"}
    for name, command in group.commands.items():
        text = ok(CliRunner().invoke(CLI, ["streams", name, "--help"]))
        assert command.help.splitlines()[0] in " ".join(text.split()), name
        assert "--json" in text, name
