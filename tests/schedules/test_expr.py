"""conveyor.core.schedule_expr without a database: the four shapes, their canonical forms,
every refusal with its reason, fire times across DST changes, catch-up windows and
descriptions."""

from __future__ import annotations

import datetime as dt

import pytest

from conveyor import errors, types
from conveyor.core import schedule_expr as se

UTC = dt.UTC
NY = "America/New_York"


def utc(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=UTC)


def cron(**kwargs: str) -> str | None:
    return se.parse(**kwargs).cron


# --------------------------------------------------------------------------- shapes


@pytest.mark.parametrize(("text", "expected"), [
    ("30 2 * * *", "30 2 * * *"),
    ("  0   9 * *   1-5 ", "0 9 * * 1-5"),
    ("0 9 * * mon-fri", "0 9 * * MON-FRI"),
    ("0 0 1 jan *", "0 0 1 JAN *"),
    ("*/7 * * * *", "*/7 * * * *"),
    ("0 0 L * *", "0 0 L * *"),
    ("0 0 * * 1#2", "0 0 * * 1#2"),
    ("@hourly", "0 * * * *"), ("@daily", "0 0 * * *"), ("@midnight", "0 0 * * *"),
    ("@weekly", "0 0 * * 0"), ("@monthly", "0 0 1 * *"), ("@yearly", "0 0 1 1 *"), ("@ANNUALLY", "0 0 1 1 *"),
])
def test_cron_canonical_forms(text, expected):
    e = se.parse(cron=text)
    assert (e.kind, e.cron, e.timezone, e.fire_at, e.source) == ("cron", expected, "UTC", None, {"cron": text})


@pytest.mark.parametrize(("text", "reason"), [
    ("* * * * * *", "6 fields: give five (minute hour day-of-month month day-of-week); seconds are not supported"),
    ("0 9 * *", "4 fields"),
    ("", "cron is empty"),
    ("60 * * * *", "bad minute"),
    ("0 24 * * *", "bad hour"),
    ("0 0 31 2 *", "bad day-of-month"),
    ("0 0 * 13 *", "bad month"),
    ("0 0 * * 8", "bad day-of-week"),
    ("@sometimes", "1 fields"),
])
def test_cron_refusals(text, reason):
    with pytest.raises(errors.InvalidInput, match=reason.replace("(", r"\(").replace(")", r"\)")):
        se.parse(cron=text)


@pytest.mark.parametrize(("text", "expected"), [
    ("1m", "* * * * *"), ("5m", "*/5 * * * *"), ("15 minutes", "*/15 * * * *"), ("30min", "*/30 * * * *"),
    ("60s", "* * * * *"), ("300 seconds", "*/5 * * * *"), ("60m", "0 * * * *"), ("1h", "0 * * * *"),
    ("2h", "0 */2 * * *"), ("12 hours", "0 */12 * * *"), ("24h", "0 0 * * *"), ("1d", "0 0 * * *"),
    ("1 day", "0 0 * * *"), ("7d", "0 0 * * 0"), ("1w", "0 0 * * 0"), ("1 week", "0 0 * * 0"), ("5M", "*/5 * * * *"),
])
def test_every_becomes_cron(text, expected):
    e = se.parse(every=text)
    assert (e.kind, e.cron, e.source) == ("cron", expected, {"every": text})


@pytest.mark.parametrize(("text", "reason"), [
    ("30s", "minute resolution"), ("90s", "minute resolution"), ("7m", "7 minutes does not divide an hour"),
    ("45m", "does not divide an hour"), ("90m", "a whole number of hours"), ("5h", "5 hours does not divide a day"),
    ("36h", "not every 36 hours"), ("2d", "not every 2 days"), ("2w", "not every 14 days"),
    ("0m", "must be positive"), ("five minutes", "a number and a unit"), ("5 fortnights", "a number and a unit"),
    ("", "a number and a unit"),
])
def test_every_refusals_say_why(text, reason):
    with pytest.raises(errors.InvalidInput, match=reason):
        se.parse(every=text)


@pytest.mark.parametrize(("text", "expected"), [
    ("hourly", "0 * * * *"), ("daily", "0 0 * * *"), ("weekly", "0 0 * * 0"), ("monthly", "0 0 1 * *"),
    ("Every Minute", "* * * * *"), ("every hour", "0 * * * *"), ("every day", "0 0 * * *"),
    ("every week", "0 0 * * 0"), ("every month", "0 0 1 * *"),
    ("every 15 minutes", "*/15 * * * *"), ("every 2 hours", "0 */2 * * *"), ("every 5m", "*/5 * * * *"),
    ("every day at 09:00", "0 9 * * *"), ("daily at 6pm", "0 18 * * *"), ("every day at 12am", "0 0 * * *"),
    ("every day at 12pm", "0 12 * * *"), ("every day at noon", "0 12 * * *"), ("daily at midnight", "0 0 * * *"),
    ("weekly at 10:30", "30 10 * * 0"), ("monthly at 7am", "0 7 1 * *"), ("every month at 23:59", "59 23 1 * *"),
    ("every monday at 8am", "0 8 * * 1"), ("every Monday at 8 AM", "0 8 * * 1"), ("every mondays", "0 0 * * 1"),
    ("every fri at 5:30pm", "30 17 * * 5"), ("every tuesday and thursday at 9", "0 9 * * 2,4"),
    ("every mon, wed, fri at 07:15", "15 7 * * 1,3,5"), ("every weekday at 17:30", "30 17 * * 1-5"),
    ("every weekend at 10am", "0 10 * * 0,6"), ("every sunday", "0 0 * * 0"),
])
def test_when_becomes_cron(text, expected):
    e = se.parse(when=text)
    assert (e.cron, e.source) == (expected, {"when": text})


@pytest.mark.parametrize(("text", "reason"), [
    ("sometimes", "cannot read when"), ("every day at 25:00", "hours are 0-23"), ("every day at 9:75", "minutes 0-59"),
    ("every day at 13pm", "with am/pm the hour is 1 to 12"), ("every day at teatime", "cannot read the time"),
    ("every 7 minutes", "does not divide an hour"), ("every blursday", "cannot read when"),
    ("every t at 9", "cannot read when"),  # "t" could be tuesday or thursday
])
def test_when_refusals(text, reason):
    with pytest.raises(errors.InvalidInput, match=reason):
        se.parse(when=text)


def test_fire_at_is_one_utc_instant():
    e = se.parse(fire_at="2026-05-01T09:00:00Z")
    assert (e.kind, e.cron, e.fire_at, e.source) == ("once", None, utc(2026, 5, 1, 9), {"fire_at": "2026-05-01T09:00:00Z"})
    assert se.parse(fire_at="2026-05-01T09:00:00+02:00").fire_at == utc(2026, 5, 1, 7)
    local = se.parse(fire_at="2026-05-01T09:00", timezone="Europe/Paris")
    assert local.fire_at == utc(2026, 5, 1, 7) and local.source == {"fire_at": "2026-05-01T09:00",
                                                                     "timezone": "Europe/Paris"}
    assert se.parse(fire_at=dt.datetime(2026, 5, 1, 9, tzinfo=UTC)).fire_at == utc(2026, 5, 1, 9)
    with pytest.raises(errors.InvalidInput, match="ISO 8601"):
        se.parse(fire_at="tomorrow")


def test_exactly_one_shape_and_a_real_time_zone():
    with pytest.raises(errors.InvalidInput, match=r"exactly one of cron, every, when or fire_at$"):
        se.parse()
    with pytest.raises(errors.InvalidInput, match=r"\(got cron, when\)"):
        se.parse(cron="* * * * *", when="hourly")
    for zone in ("Mars/Olympus", "../../etc/passwd", "", "EST5EDT/../x", "x" * 80):
        with pytest.raises(errors.InvalidInput, match="unknown time zone"):
            se.parse(every="5m", timezone=zone)
    assert se.parse(every="5m", timezone="Asia/Kolkata").source == {"every": "5m", "timezone": "Asia/Kolkata"}


# --------------------------------------------------------------------------- fire times


def test_next_fires_in_a_time_zone_across_spring_forward():
    half_two = se.parse(cron="30 2 * * *", timezone=NY)
    assert se.next_fires(half_two, utc(2026, 3, 6, 12), 4) == [
        utc(2026, 3, 7, 7, 30),  # 02:30 EST
        utc(2026, 3, 8, 7, 0),   # 02:30 does not exist: 03:00 EDT, the first minute after the gap
        utc(2026, 3, 9, 6, 30),  # 02:30 EDT
        utc(2026, 3, 10, 6, 30)]
    one = se.parse(cron="0 1 * * *", timezone=NY)
    assert se.next_fires(one, utc(2026, 3, 6, 12), 3) == [utc(2026, 3, 7, 6), utc(2026, 3, 8, 6), utc(2026, 3, 9, 5)]


def test_next_fires_across_fall_back():
    one = se.parse(cron="0 1 * * *", timezone=NY)  # 01:00 happens twice on 2026-11-01: fires once
    assert se.next_fires(one, utc(2026, 10, 31, 12), 3) == [utc(2026, 11, 1, 5), utc(2026, 11, 2, 6),
                                                              utc(2026, 11, 3, 6)]
    half_two = se.parse(cron="30 2 * * *", timezone=NY)
    assert se.next_fires(half_two, utc(2026, 10, 31, 12), 2) == [utc(2026, 11, 1, 7, 30), utc(2026, 11, 2, 7, 30)]
    every30 = se.parse(every="30m", timezone=NY)  # sub-hourly: both repeated hours, each instant once
    assert se.next_fires(every30, utc(2026, 11, 1, 4, 50), 5) == [
        utc(2026, 11, 1, 5), utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 6), utc(2026, 11, 1, 6, 30),
        utc(2026, 11, 1, 7)]
    # starting inside the repeated hour (second pass, EST) goes on from there
    assert se.next_after(every30, utc(2026, 11, 1, 6, 10)) == utc(2026, 11, 1, 6, 30)


def test_next_after_is_strict_and_one_shots_end():
    e = se.parse(every="5m")
    assert se.next_after(e, utc(2026, 1, 1, 12, 5)) == utc(2026, 1, 1, 12, 10)
    once = se.parse(fire_at="2026-01-01T12:00:00Z")
    assert se.next_after(once, utc(2026, 1, 1, 11)) == utc(2026, 1, 1, 12)
    assert se.next_after(once, utc(2026, 1, 1, 12)) is None
    assert se.next_fires(once, utc(2026, 1, 1), 5) == [utc(2026, 1, 1, 12)]
    assert se.next_fires(e, utc(2026, 1, 1), 0) == []
    with pytest.raises(errors.InvalidInput, match="count"):
        se.next_fires(e, utc(2026, 1, 1), 101)


def test_due_keeps_the_latest_occurrences_oldest_first():
    e = se.parse(every="5m")
    first = utc(2026, 1, 1, 12, 5)
    assert se.due(e, first, utc(2026, 1, 1, 12, 4), 3) == []
    assert se.due(e, first, first, 3) == [first]
    assert se.due(e, first, utc(2026, 1, 1, 13, 1), 3) == [utc(2026, 1, 1, 12, 50), utc(2026, 1, 1, 12, 55),
                                                            utc(2026, 1, 1, 13)]
    assert len(se.due(e, first, utc(2026, 1, 1, 13, 1), 100)) == 12
    once = se.parse(fire_at="2026-01-01T12:00:00Z")
    assert se.due(once, utc(2026, 1, 1, 12), utc(2026, 1, 2), 5) == [utc(2026, 1, 1, 12)]


def test_due_far_behind_is_fast_and_exact():
    """Two years behind a per-minute schedule: the walk jumps near now instead of stepping
    through a million occurrences, and still returns exactly the latest ones."""
    e = se.parse(every="1m")
    now = utc(2028, 1, 1, 0, 0) + dt.timedelta(seconds=30)
    got = se.due(e, utc(2026, 1, 1), now, 3)
    assert got == [utc(2027, 12, 31, 23, 58), utc(2027, 12, 31, 23, 59), utc(2028, 1, 1, 0, 0)]
    # irregular: weekdays at 09:00 only, far behind, 4 kept
    weekdays = se.parse(cron="0 9 * * 1-5")
    assert se.due(weekdays, utc(2020, 1, 1, 9), utc(2026, 1, 5, 12), 4) == [
        utc(2025, 12, 31, 9), utc(2026, 1, 1, 9), utc(2026, 1, 2, 9), utc(2026, 1, 5, 9)]


def test_an_invalid_stored_cron_is_reported_as_invalid_input():
    broken = types.ScheduleExpression(kind="cron", cron="99 * * * *")
    with pytest.raises(errors.InvalidInput, match="invalid cron"):
        se.next_after(broken, utc(2026, 1, 1))


# --------------------------------------------------------------------------- words


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"cron": "30 2 * * *", "timezone": NY}, "At 02:30 (America/New_York)"),
    ({"every": "15m"}, "Every 15 minutes (UTC)"),
    ({"when": "every monday at 8am", "timezone": "Europe/Paris"}, "At 08:00, only on Monday (Europe/Paris)"),
    ({"when": "every weekday at 17:30"}, "At 17:30, Monday through Friday (UTC)"),
    ({"when": "hourly"}, "Every hour (UTC)"),
    ({"cron": "0 0 L * *"}, "At 00:00, on the last day of the month (UTC)"),
    ({"fire_at": "2026-05-01T09:00:00+02:00"}, "Once, at 2026-05-01 07:00:00 UTC"),
])
def test_descriptions(kwargs, words):
    assert se.describe(se.parse(**kwargs)) == words
