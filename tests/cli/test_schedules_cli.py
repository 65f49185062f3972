"""``conveyor schedules`` end to end against a real database through click's runner (no
server: runs fire through the CLI itself, passes of the scheduler are not involved)."""

from __future__ import annotations

import asyncio
import json

from click.testing import Result

from conveyor import types
from conveyor.core import topics
from conveyor.db import pool
from support.cli import failed, ok, ok_json, run


def sch(dsn: str, *args: str) -> Result:
    return run(dsn, "schedules", *args)


def test_create_show_list_update_pause_resume_delete(dsn):
    ok(run(dsn, "queues", "create", "jobs"))
    created = ok_json(sch(dsn, "create", "nightly", "--cron", "30 2 * * *", "--tz", "America/New_York",
                          "--queue", "jobs", "--message-json", '{"job": "nightly"}', "--header", "team=data",
                          "--catchup", "--catchup-limit", "3", "--json"))
    assert (created["cron"], created["timezone"], created["target"], created["message"]) == (
        "30 2 * * *", "America/New_York", "jobs", {"job": "nightly"})
    assert created["headers"] == {"team": "data"} and created["catchup"] is True and created["catchup_limit"] == 3
    assert created["human_readable"] == "At 02:30 (America/New_York)" and len(created["next_fires"]) == 5
    assert "already exists" in failed(sch(dsn, "create", "nightly", "--every", "5m", "--queue", "jobs"))

    text = ok(sch(dsn, "show", "nightly"))
    assert "At 02:30 (America/New_York)" in text and "yes, up to 3" in text

    ok(sch(dsn, "create", "ping", "--every", "15m", "--topic", "health.ping", "--message", "ping"))
    table = ok(sch(dsn, "list"))
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["NAME", "STATUS", "SCHEDULE"]
    assert [line.split()[0] for line in lines[1:]] == ["nightly", "ping"]
    assert "topic:health.ping" in table
    assert [s["name"] for s in ok_json(sch(dsn, "list", "--target-kind", "topic", "--json"))] == ["ping"]

    updated = ok_json(sch(dsn, "update", "nightly", "--every", "1h", "--message", "plain", "--json"))
    assert (updated["cron"], updated["message"], updated["timezone"]) == ("0 * * * *", "plain", "America/New_York")
    moved = ok_json(sch(dsn, "update", "ping", "--tz", "Asia/Tokyo", "--json"))
    assert (moved["cron"], moved["timezone"]) == ("*/15 * * * *", "Asia/Tokyo")
    assert "nothing to change" in failed(sch(dsn, "update", "ping"), code=2)

    assert ok_json(sch(dsn, "pause", "nightly", "--json"))["status"] == "paused"
    assert [s["name"] for s in ok_json(sch(dsn, "list", "--status", "paused", "--json"))] == ["nightly"]
    assert ok_json(sch(dsn, "resume", "nightly", "--json"))["status"] == "active"

    assert ok(sch(dsn, "delete", "ping")).strip() == "deleted schedule ping"
    assert ok(sch(dsn, "delete", "ping")).strip() == "schedule ping did not exist"
    assert "does not exist" in failed(sch(dsn, "show", "ping"))


def test_run_fires_now_out_of_band(dsn):
    ok(run(dsn, "queues", "create", "jobs"))
    ok(sch(dsn, "create", "report", "--when", "every monday at 8am", "--queue", "jobs", "--message", "go"))
    fired = ok_json(sch(dsn, "run", "report", "--json"))
    assert fired["out_of_band"] is True and fired["queues"] == ["jobs"] and len(fired["msg_ids"]) == 1
    [m] = ok_json(run(dsn, "peek", "jobs", "--json"))
    assert m["body"] == "go" and m["headers"]["_schedule"]["name"] == "report"
    assert m["headers"]["_schedule"]["out_of_band"] is True
    assert ok_json(sch(dsn, "show", "report", "--json"))["fire_count"] == 0
    assert "fired report into jobs" in ok(sch(dsn, "run", "report"))


def test_preview_and_usage_errors(dsn):
    got = ok_json(sch(dsn, "preview", "--cron", "0 1 * * *", "--tz", "America/New_York",
                      "--after", "2026-10-31T12:00:00Z", "--count", "3", "--json"))
    assert got["cron"] == "0 1 * * *" and got["human_readable"] == "At 01:00 (America/New_York)"
    assert got["next_fires"] == ["2026-11-01T05:00:00+00:00", "2026-11-02T06:00:00+00:00",
                                 "2026-11-03T06:00:00+00:00"]
    text = ok(sch(dsn, "preview", "--when", "every weekday at 17:30", "--after", "2026-01-02T00:00:00Z",
                  "--count", "2"))
    assert "30 17 * * 1-5" in text and "2026-01-02T17:30:00+00:00" in text and "2026-01-05T17:30:00+00:00" in text
    assert "minute resolution" in failed(sch(dsn, "preview", "--every", "30s"), code=2)
    assert "exactly one" in failed(sch(dsn, "preview", "--every", "5m", "--cron", "* * * * *"), code=2)
    assert "--queue NAME or --topic" in failed(sch(dsn, "create", "x", "--every", "5m"), code=2)
    assert "not valid JSON" in failed(sch(dsn, "create", "x", "--every", "5m", "--queue", "q",
                                          "--message-json", "{oops"), code=2)
    assert "invalid schedule name" in failed(sch(dsn, "create", ".x", "--every", "5m", "--queue", "q"))


def test_run_of_a_topic_schedule_publishes_signed(dsn):
    ok(run(dsn, "queues", "create", "audit"))

    async def subscribe() -> None:
        async with pool.connect(dsn) as conn:
            await topics.subscribe(conn, types.NewSubscription(pattern="ops.#", protocol="sqs", queue="audit"))

    asyncio.run(subscribe())
    ok(sch(dsn, "create", "ping", "--every", "1h", "--topic", "ops.ping", "--message", "ping"))
    fired = ok_json(sch(dsn, "run", "ping", "--json"))
    assert fired["queues"] == ["audit"] and fired["msg_ids"] == [] and fired["message_id"]
    [m] = ok_json(run(dsn, "peek", "audit", "--json"))
    envelope = json.loads(m["body"])
    assert envelope["Message"] == "ping" and envelope["MessageId"] == fired["message_id"]
    assert envelope["Signature"] and envelope["SignatureVersion"] == "2"
    assert json.loads(envelope["MessageAttributes"]["_schedule"]["Value"])["out_of_band"] is True


def test_create_warns_of_a_missing_target_queue(dsn):
    result = run(dsn, "schedules", "create", "lonely", "--every", "5m", "--queue", "not-there")
    assert result.exit_code == 0, result.output
    assert "warning: queue 'not-there' does not exist" in result.stderr
    ok(run(dsn, "queues", "create", "not-there"))
    assert "warning" not in run(dsn, "schedules", "update", "lonely", "--every", "10m").stderr
