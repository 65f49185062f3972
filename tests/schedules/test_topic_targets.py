"""Schedules that target a topic (a routing key): each fire is a publish, so it lands in
every queue subscribed to a matching pattern, raw or in the SNS envelope, with the
schedule's name and intended time in the ``_schedule`` message attribute."""

from __future__ import annotations

import datetime as dt
import json

from conveyor import types
from conveyor.core import messages, queues, schedule_expr, schedules, topics

UTC = dt.UTC
T0 = dt.datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def spec(target: str, **kwargs: object) -> types.ScheduleSpec:
    return types.ScheduleSpec(expression=schedule_expr.parse(every="5m"), target=target, target_kind="topic",
                              **kwargs)


async def subscribe(conn, pattern: str, queue: str, *, raw: bool) -> None:
    await queues.create(conn, queue)
    await topics.subscribe(conn, types.NewSubscription(pattern=pattern, protocol="sqs", queue=queue,
                                                       raw_delivery=raw))


def schedule_attribute(headers: dict) -> dict:
    attribute = headers["_schedule"]
    assert attribute["DataType"] == "String"
    return json.loads(attribute["StringValue"])


async def test_a_topic_schedule_lands_in_every_subscribed_queue(conn):
    await subscribe(conn, "reports.*", "raw-q", raw=True)
    await subscribe(conn, "reports.#", "envelope-q", raw=False)
    await subscribe(conn, "billing.#", "other-q", raw=True)
    await schedules.create(conn, "daily-report", spec("reports.daily", body='{"kind": "daily"}',
                                                      headers={"team": "data", "priority": 2}), now=at(0))
    [firing] = await schedules.fire_due(conn, now=at(5))
    assert firing.fired == (at(5),) and firing.error is None

    [raw] = await messages.peek(conn, "raw-q")
    assert raw.body == '{"kind": "daily"}'
    assert schedule_attribute(raw.headers) == {"name": "daily-report", "scheduled_for": "2026-01-05T12:05:00Z",
                                               "out_of_band": False}
    assert raw.headers["team"] == {"DataType": "String", "StringValue": "data"}
    assert raw.headers["priority"] == {"DataType": "Number", "StringValue": "2"}

    [enveloped] = await messages.peek(conn, "envelope-q")
    envelope = json.loads(enveloped.body)
    assert envelope["Type"] == "Notification" and envelope["Message"] == '{"kind": "daily"}'
    assert envelope["TopicArn"].endswith(":reports.daily")
    assert json.loads(envelope["MessageAttributes"]["_schedule"]["Value"])["name"] == "daily-report"

    assert await messages.peek(conn, "other-q") == []


async def test_manual_run_of_a_topic_schedule_reports_the_queues(conn):
    await subscribe(conn, "ops.#", "ops-q", raw=True)
    await schedules.create(conn, "ping", spec("ops.ping", body="ping", content_type=None), now=at(0))
    run = await schedules.run(conn, "ping", now=at(1))
    assert run.queues == ("ops-q",) and run.ids == () and run.message_id
    [m] = await messages.peek(conn, "ops-q")
    assert m.body == "ping" and schedule_attribute(m.headers)["out_of_band"] is True


async def test_a_topic_with_no_subscribers_is_not_a_failure(conn):
    await schedules.create(conn, "lonely", spec("nobody.listens"), now=at(0))
    [firing] = await schedules.fire_due(conn, now=at(5))
    assert firing.fired == (at(5),) and firing.error is None
    assert (await schedules.get(conn, "lonely")).fire_count == 1
