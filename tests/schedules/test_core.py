"""conveyor.core.schedules and the SQL of migration 0004, with the clock injected: every
operation that depends on the time takes ``now``, and the SQL claim takes the instant as
a parameter, so these tests jump the clock instead of waiting. Each test has its own
fresh database (``conn``: autocommit, the ``postgres`` superuser)."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

from conveyor import errors, types
from conveyor.core import messages, queues, schedule_expr, schedules
from conveyor.db import execute, pool

UTC = dt.UTC
T0 = dt.datetime(2026, 1, 5, 12, 0, 0, tzinfo=UTC)  # a Monday


def at(minutes: float = 0, *, base: dt.datetime = T0) -> dt.datetime:
    return base + dt.timedelta(minutes=minutes)


def spec(target: str = "jobs", *, body: str = '{"task": "report"}', target_kind: str = "queue",
         **kwargs: object) -> types.ScheduleSpec:
    shape = {k: kwargs.pop(k) for k in ("cron", "every", "when", "fire_at", "timezone") if k in kwargs}
    if not any(k in shape for k in ("cron", "every", "when", "fire_at")):
        shape["every"] = "5m"
    return types.ScheduleSpec(expression=schedule_expr.parse(**shape), target=target, target_kind=target_kind,
                              body=body, **kwargs)


async def sql(conn, query: str, *params: object) -> list[tuple]:
    with execute.translated():
        cur = await conn.execute(query, params or None)
        return await cur.fetchall() if cur.description else []


async def fired_headers(conn, queue: str) -> list[dict]:
    return [m.headers["_schedule"] for m in await messages.peek(conn, queue, 1000)]


@pytest.fixture
async def jobs(conn):
    await queues.create(conn, "jobs")
    return "jobs"


# --------------------------------------------------------------------------- configuration


async def test_create_get_list_and_strict_create(conn, jobs):
    s = await schedules.create(conn, "report", spec(every="5m", headers={"team": "data"}), now=at(1))
    assert (s.name, s.cron, s.timezone, s.fire_at, s.status) == ("report", "*/5 * * * *", "UTC", None, "active")
    assert s.expression == {"every": "5m"}
    assert s.next_fire_at == at(5)
    assert s.headers == {"team": "data"} and s.content_type == "application/json"
    assert await schedules.get(conn, "report") == s
    with pytest.raises(errors.ScheduleAlreadyExists):
        await schedules.create(conn, "report", spec(every="1h"), now=at(1))
    await schedules.create(conn, "nightly", spec(cron="0 3 * * *", timezone="Europe/Paris"), now=at(1))
    await schedules.create(conn, "to-topic", spec("orders.created", target_kind="topic", when="hourly"), now=at(1))
    assert [x.name for x in await schedules.list_all(conn)] == ["nightly", "report", "to-topic"]
    assert [x.name for x in await schedules.list_all(conn, target_kind="topic")] == ["to-topic"]
    assert [x.name for x in await schedules.list_all(conn, name_prefix="n")] == ["nightly"]
    assert [x.name for x in await schedules.list_all(conn, limit=2)] == ["nightly", "report"]
    await schedules.pause(conn, "nightly")
    assert [x.name for x in await schedules.list_all(conn, status="paused")] == ["nightly"]
    with pytest.raises(errors.ScheduleNotFound):
        await schedules.get(conn, "missing")


async def test_upsert_keeps_next_fire_time_unless_the_expression_changes(conn, jobs):
    s, created = await schedules.upsert(conn, "sync", spec(every="15m"), now=at(1))
    assert created and s.next_fire_at == at(15)
    again, created = await schedules.upsert(conn, "sync", spec(every="15m"), now=at(20))
    assert not created and again.next_fire_at == at(15) and again.updated_at == s.updated_at
    body, _ = await schedules.upsert(conn, "sync", spec(every="15m", body='"new body"', content_type=None), now=at(20))
    assert body.next_fire_at == at(15) and body.body == '"new body"' and body.content_type is None
    moved, _ = await schedules.upsert(conn, "sync", spec(every="10m"), now=at(21))
    assert moved.next_fire_at == at(30) and moved.cron == "*/10 * * * *"
    # a PUT replaces the configuration: fields left out take their defaults again
    assert moved.body == '{"task": "report"}' and moved.headers is None


async def test_alter_pause_resume_and_drop(conn, jobs):
    await schedules.create(conn, "tick", spec(every="5m", catchup=True, catchup_limit=3), now=at(0))
    s = await schedules.alter(conn, "tick", types.ScheduleChanges(body='"x"', failure_threshold=2), now=at(1))
    assert (s.body, s.failure_threshold, s.catchup_limit, s.next_fire_at) == ('"x"', 2, 3, at(5))
    paused = await schedules.pause(conn, "tick")
    assert paused.status == "paused"
    resumed = await schedules.resume(conn, "tick", now=at(42))
    assert resumed.status == "active" and resumed.next_fire_at == at(45)
    changed = await schedules.alter(conn, "tick", types.ScheduleChanges(
        expression=schedule_expr.parse(cron="0 9 * * *", timezone="America/New_York")), now=at(50))
    assert changed.next_fire_at == dt.datetime(2026, 1, 5, 14, 0, tzinfo=UTC)  # 09:00 EST
    assert changed.expression == {"cron": "0 9 * * *", "timezone": "America/New_York"}
    assert await schedules.drop(conn, "tick") is True
    assert await schedules.drop(conn, "tick") is False


async def test_the_sql_validates_what_it_stores(conn, jobs):
    with pytest.raises(errors.InvalidInput, match="_schedule"):
        await schedules.create(conn, "a", spec(headers={"_schedule": 1}), now=at())
    with pytest.raises(errors.InvalidInput, match="invalid schedule name"):
        await schedules.create(conn, ".hidden", spec(), now=at())
    with pytest.raises(errors.InvalidInput, match="target_kind"):
        await schedules.create(conn, "a", spec(target_kind="workflow"), now=at())
    with pytest.raises(errors.InvalidInput, match="invalid queue name"):
        await schedules.create(conn, "a", spec("bad/queue"), now=at())
    with pytest.raises(errors.InvalidInput, match="needs a target"):
        await schedules.create(conn, "a", spec("with space"), now=at())
    with pytest.raises(errors.InvalidInput, match="catchup_limit"):
        await schedules.create(conn, "a", spec(catchup_limit=0), now=at())
    with pytest.raises(errors.InvalidInput, match="in the past"):
        await schedules.create(conn, "a", spec(fire_at="2026-01-05T11:00:00Z"), now=at())
    with pytest.raises(errors.InvalidInput, match="time zone"):
        await sql(conn, "SELECT conveyor.schedule_create('a', '{\"cron\": \"* * * * *\", \"timezone\": \"Mars/Base\", "
                        "\"target\": \"jobs\"}')")
    with pytest.raises(errors.InvalidInput, match="five fields"):
        await sql(conn, "SELECT conveyor.schedule_create('a', '{\"cron\": \"* * *\", \"target\": \"jobs\"}')")
    with pytest.raises(errors.InvalidInput, match="valid JSON"):
        await schedules.create(conn, "a", spec(body="not json", content_type="application/json"), now=at())
    assert await schedules.list_all(conn) == []
    # from SQL, a body is text unless a content type says otherwise
    await sql(conn, "SELECT conveyor.schedule_create('plain', '{\"cron\": \"* * * * *\", \"target\": \"jobs\", "
                    "\"body\": \"run\"}')")
    assert (await schedules.get(conn, "plain")).content_type is None


# --------------------------------------------------------------------------- firing


async def test_fires_due_schedules_with_the_schedule_header(conn, jobs):
    await schedules.create(conn, "report", spec(every="5m", headers={"team": "data"}), now=at(0))
    assert await schedules.fire_due(conn, now=at(4.9)) == []
    [firing] = await schedules.fire_due(conn, now=at(5, base=T0) + dt.timedelta(seconds=2))
    assert firing == types.ScheduleFiring(name="report", fired=(at(5),), next_fire_at=at(10))
    [m] = await messages.peek(conn, "jobs")
    assert m.body == '{"task": "report"}' and m.is_json
    assert m.headers == {"team": "data", "_schedule": {"name": "report", "scheduled_for": "2026-01-05T12:05:00Z",
                                                       "out_of_band": False}}
    s = await schedules.get(conn, "report")
    assert (s.fire_count, s.last_fired_at, s.next_fire_at, s.consecutive_failures) == (1, at(5), at(10), 0)
    assert await schedules.fire_due(conn, now=at(6)) == []


async def test_cron_in_new_york_across_the_spring_forward_change(conn, jobs):
    """2026-03-08: clocks jump from 02:00 EST to 03:00 EDT. 02:30 does not exist that
    night: the 02:30 schedule fires at 03:00 EDT (the first minute after the gap), the
    01:00 schedule fires at 01:00 EST as usual, and both move to EDT offsets after."""
    ny = "America/New_York"
    start = dt.datetime(2026, 3, 6, 12, 0, tzinfo=UTC)
    await schedules.create(conn, "half-two", spec(cron="30 2 * * *", timezone=ny), now=start)
    await schedules.create(conn, "one", spec(cron="0 1 * * *", timezone=ny), now=start)
    expected = {
        "half-two": ["2026-03-07T07:30:00Z", "2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"],
        "one": ["2026-03-07T06:00:00Z", "2026-03-08T06:00:00Z", "2026-03-09T05:00:00Z"],
    }
    clock = start
    for _ in range(4 * 24 * 4):  # every 15 minutes for four days
        clock += dt.timedelta(minutes=15)
        await schedules.fire_due(conn, now=clock)
    by_name: dict[str, list[str]] = {}
    for h in await fired_headers(conn, "jobs"):
        by_name.setdefault(h["name"], []).append(h["scheduled_for"])
    assert by_name == {name: [*times, t] for (name, times), t in
                       zip(expected.items(), ["2026-03-10T06:30:00Z", "2026-03-10T05:00:00Z"], strict=False)}


async def test_cron_in_new_york_across_the_fall_back_change(conn, jobs):
    """2026-11-01: 01:00-01:59 happens twice (EDT, then EST). A daily 01:00 job fires once
    (at 01:00 EDT); an every-30-minutes job fires in both repeated hours."""
    ny = "America/New_York"
    start = dt.datetime(2026, 10, 31, 12, 0, tzinfo=UTC)
    await schedules.create(conn, "one", spec(cron="0 1 * * *", timezone=ny), now=start)
    await schedules.create(conn, "half-two", spec(cron="30 2 * * *", timezone=ny), now=start)
    await schedules.create(conn, "halfhourly", spec(every="30m", timezone=ny), now=dt.datetime(2026, 11, 1, 4, 50,
                                                                                                tzinfo=UTC))
    clock = start
    while clock < dt.datetime(2026, 11, 2, 12, 0, tzinfo=UTC):
        clock += dt.timedelta(minutes=10)
        await schedules.fire_due(conn, now=clock)
    by_name: dict[str, list[str]] = {}
    for h in await fired_headers(conn, "jobs"):
        by_name.setdefault(h["name"], []).append(h["scheduled_for"])
    assert by_name["one"] == ["2026-11-01T05:00:00Z", "2026-11-02T06:00:00Z"]
    assert by_name["half-two"] == ["2026-11-01T07:30:00Z", "2026-11-02T07:30:00Z"]
    # 01:00 EDT, 01:30 EDT, 01:00 EST, 01:30 EST, 02:00 EST: each instant once
    assert by_name["halfhourly"][:5] == ["2026-11-01T05:00:00Z", "2026-11-01T05:30:00Z", "2026-11-01T06:00:00Z",
                                         "2026-11-01T06:30:00Z", "2026-11-01T07:00:00Z"]
    assert len(by_name["halfhourly"]) == len(set(by_name["halfhourly"]))


async def test_catch_up_fires_the_latest_missed_occurrences_up_to_the_limit(conn, jobs):
    await schedules.create(conn, "off", spec(every="5m"), now=at(0))
    await schedules.create(conn, "on", spec(every="5m", catchup=True, catchup_limit=3), now=at(0))
    await schedules.create(conn, "all", spec(every="5m", catchup=True, catchup_limit=100), now=at(0))
    # the scheduler was away for an hour: 12 occurrences (12:05 .. 13:00) were missed
    results = {f.name: f for f in await schedules.fire_due(conn, now=at(61))}
    assert results["off"].fired == (at(60),)
    assert results["on"].fired == (at(50), at(55), at(60))
    assert results["all"].fired == tuple(at(5 * i) for i in range(1, 13))
    assert {f.next_fire_at for f in results.values()} == {at(65)}
    got = [(h["name"], h["scheduled_for"]) for h in await fired_headers(conn, "jobs")]
    assert [t for n, t in got if n == "on"] == ["2026-01-05T12:50:00Z", "2026-01-05T12:55:00Z",
                                                "2026-01-05T13:00:00Z"]
    assert len(got) == 1 + 3 + 12
    assert (await schedules.get(conn, "all")).fire_count == 12


async def test_catch_up_far_behind_stays_bounded(conn, jobs):
    await schedules.create(conn, "minutely", spec(every="1m", catchup=True, catchup_limit=2), now=at(0))
    year_later = at(0) + dt.timedelta(days=365, seconds=30)
    [firing] = await schedules.fire_due(conn, now=year_later)
    base = year_later.replace(second=0)
    assert firing.fired == (base - dt.timedelta(minutes=1), base)
    assert firing.next_fire_at == base + dt.timedelta(minutes=1)


async def test_one_shots_fire_once_and_are_deleted(conn, jobs):
    await schedules.create(conn, "once", spec(fire_at="2026-01-05T12:10:00Z", headers={"k": "v"}), now=at(0))
    s = await schedules.get(conn, "once")
    assert (s.cron, s.fire_at, s.next_fire_at) == (None, at(10), at(10))
    assert await schedules.fire_due(conn, now=at(9)) == []
    [firing] = await schedules.fire_due(conn, now=at(30))  # late: it still fires, once
    assert firing.fired == (at(10),) and firing.next_fire_at is None
    with pytest.raises(errors.ScheduleNotFound):
        await schedules.get(conn, "once")
    assert await fired_headers(conn, "jobs") == [
        {"name": "once", "scheduled_for": "2026-01-05T12:10:00Z", "out_of_band": False}]
    assert await schedules.fire_due(conn, now=at(40)) == []


async def test_pause_after_consecutive_failures_keeps_the_error(conn, jobs):
    await queues.create(conn, "doomed")
    await schedules.create(conn, "flaky", spec("doomed", every="5m", failure_threshold=3), now=at(0))
    await queues.drop(conn, "doomed")
    for i, minute in enumerate((5, 10, 15), start=1):
        [firing] = await schedules.fire_due(conn, now=at(minute))
        assert firing.fired == () and "QueueNotFound" in firing.error and "doomed" in firing.error
        assert firing.paused is (i == 3)
        s = await schedules.get(conn, "flaky")
        assert s.consecutive_failures == i and s.last_error_at == at(minute)
    assert s.status == "paused" and "does not exist" in s.last_error
    assert await schedules.fire_due(conn, now=at(60)) == []  # paused: never claimed
    await queues.create(conn, "doomed")
    resumed = await schedules.resume(conn, "flaky", now=at(61))
    assert (resumed.status, resumed.consecutive_failures, resumed.next_fire_at) == ("active", 0, at(65))
    assert resumed.last_error is not None  # kept for inspection
    [firing] = await schedules.fire_due(conn, now=at(65))
    assert firing.fired == (at(65),) and firing.error is None


async def test_a_success_resets_the_failure_count(conn, jobs):
    await queues.create(conn, "flip")
    await schedules.create(conn, "s", spec("flip", every="5m", failure_threshold=2), now=at(0))
    await queues.drop(conn, "flip")
    [f] = await schedules.fire_due(conn, now=at(5))
    assert f.error and not f.paused
    await queues.create(conn, "flip")
    [f] = await schedules.fire_due(conn, now=at(10))
    assert f.error is None and (await schedules.get(conn, "s")).consecutive_failures == 0


async def test_a_failing_schedule_does_not_lose_the_others(conn, jobs):
    await queues.create(conn, "gone")
    await schedules.create(conn, "a-good", spec(every="5m"), now=at(0))
    await schedules.create(conn, "b-bad", spec("gone", every="5m"), now=at(0))
    await schedules.create(conn, "c-good", spec(every="5m", body='"c"'), now=at(0))
    await queues.drop(conn, "gone")
    results = {f.name: f for f in await schedules.fire_due(conn, now=at(5))}
    assert results["a-good"].fired == (at(5),) and results["c-good"].fired == (at(5),)
    assert results["b-bad"].error and results["b-bad"].next_fire_at == at(10)
    assert sorted(h["name"] for h in await fired_headers(conn, "jobs")) == ["a-good", "c-good"]
    assert (await schedules.get(conn, "a-good")).next_fire_at == at(10)
    assert (await schedules.get(conn, "b-bad")).consecutive_failures == 1


async def test_a_message_the_queue_refuses_fails_only_its_schedule(conn, jobs):
    await queues.create(conn, "small", {"max_message_size": 1024})
    await schedules.create(conn, "big", spec("small", every="5m", body="x" * 2000, content_type=None), now=at(0))
    await schedules.create(conn, "fine", spec(every="5m"), now=at(0))
    results = {f.name: f for f in await schedules.fire_due(conn, now=at(5))}
    assert "MessageTooLarge" in results["big"].error
    assert results["fine"].fired == (at(5),)
    assert await messages.peek(conn, "small") == []


async def test_fifo_targets_get_a_group_and_a_deduplication_id(conn):
    await queues.create(conn, "jobs.fifo")
    await schedules.create(conn, "fifo", spec("jobs.fifo", every="5m", catchup=True, catchup_limit=2), now=at(0))
    await schedules.fire_due(conn, now=at(10))
    got = await messages.peek(conn, "jobs.fifo")
    assert [m.group_id for m in got] == ["fifo", "fifo"]
    assert len({m.dedup_id for m in got}) == 2
    assert [m.headers["_schedule"]["scheduled_for"] for m in got] == ["2026-01-05T12:05:00Z", "2026-01-05T12:10:00Z"]


async def test_manual_runs_are_out_of_band(conn, jobs):
    await schedules.create(conn, "report", spec(every="1h"), now=at(0))
    before = await schedules.get(conn, "report")
    run = await schedules.run(conn, "report", now=at(7))
    assert (run.schedule, run.scheduled_for, run.target, run.queues) == ("report", at(7), "jobs", ("jobs",))
    assert len(run.ids) == 1
    assert await fired_headers(conn, "jobs") == [
        {"name": "report", "scheduled_for": "2026-01-05T12:07:00Z", "out_of_band": True}]
    assert await schedules.get(conn, "report") == before  # next fire, counts: untouched
    await schedules.pause(conn, "report")
    await schedules.run(conn, "report", now=at(8))  # a paused schedule runs on demand too
    await queues.drop(conn, "jobs")
    with pytest.raises(errors.QueueNotFound):  # a manual run reports its error to the caller
        await schedules.run(conn, "report", now=at(9))
    assert (await schedules.get(conn, "report")).consecutive_failures == 0


async def test_a_cron_schedule_created_from_sql_gets_its_first_time_from_the_scheduler(conn, jobs):
    [(name,)] = await sql(conn, """SELECT name FROM conveyor.schedule_create('from-psql',
        '{"cron": "0 * * * *", "target": "jobs", "body": "hello", "content_type": null}')""")
    s = await schedules.get(conn, name)
    assert s.next_fire_at is None and s.expression == {"cron": "0 * * * *"}
    [f] = await schedules.fire_due(conn, now=at(10))
    assert f.fired == () and f.next_fire_at == at(60)  # computed, nothing fired
    [f] = await schedules.fire_due(conn, now=at(60))
    assert f.fired == (at(60),)
    [m] = await messages.peek(conn, "jobs")
    assert m.body == "hello" and not m.is_json
    # an expression only the scheduler can check fails (and pauses) like any other failure
    await sql(conn, """SELECT conveyor.schedule_create('broken',
        '{"cron": "99 * * * *", "target": "jobs", "failure_threshold": 1}')""")
    [f] = await schedules.fire_due(conn, now=at(61))
    assert f.paused and "invalid cron" in f.error


async def test_two_schedulers_never_fire_a_schedule_twice(dsn, template_db):
    """Two schedulers on two connections run passes concurrently over the same due rows
    (the same clock), again and again: every occurrence lands exactly once."""
    async with pool.connect(dsn) as setup:
        await queues.create(setup, "jobs")
        for i in range(40):
            await schedules.create(setup, f"s{i:02d}", spec(every="1m"), now=at(0))

    async def scheduler(fired: list[tuple[str, dt.datetime]]) -> None:
        async with pool.connect(dsn) as c:
            for minute in range(1, 6):
                for _ in range(10):  # passes until nothing is due at this minute
                    done = await schedules.fire_due(c, now=at(minute, base=T0) + dt.timedelta(seconds=1),
                                                    batch_size=7)
                    fired.extend((f.name, t) for f in done for t in f.fired)
                    if not done:
                        break
                    await asyncio.sleep(0)

    a: list = []
    b: list = []
    await asyncio.wait_for(asyncio.gather(scheduler(a), scheduler(b)), 60)
    assert a and b, "both schedulers should have fired some schedules"
    assert sorted(a + b) == sorted((f"s{i:02d}", at(m)) for i in range(40) for m in range(1, 6))
    async with pool.connect(dsn) as check:
        got = await fired_headers(check, "jobs")
    assert len(got) == 200
    assert len({(h["name"], h["scheduled_for"]) for h in got}) == 200


async def test_claim_skips_rows_another_scheduler_holds(dsn):
    async with pool.connect(dsn) as c1, pool.connect(dsn) as c2:
        await queues.create(c1, "jobs")
        await schedules.create(c1, "held", spec(every="5m"), now=at(0))
        await schedules.create(c1, "free", spec(every="5m"), now=at(0))
        async with c1.transaction():
            await sql(c1, "SELECT 1 FROM conveyor.schedules WHERE name = 'held' FOR UPDATE")
            done = await asyncio.wait_for(schedules.fire_due(c2, now=at(5)), 10)
            assert [f.name for f in done] == ["free"]
        [f] = await schedules.fire_due(c2, now=at(5))
        assert f.name == "held"


# --------------------------------------------------------------------------- roles and plans


async def test_roles_gate_the_schedule_functions(conn, jobs):
    await schedules.create(conn, "report", spec(), now=at(0))
    await conn.execute("SET ROLE conveyor_reader")
    assert [s.name for s in await schedules.list_all(conn)] == ["report"]
    assert (await schedules.get(conn, "report")).name == "report"
    with pytest.raises(errors.PermissionDenied):
        await schedules.create(conn, "mine", spec(), now=at(0))
    await conn.execute("RESET ROLE")
    await conn.execute("SET ROLE conveyor_writer")
    with pytest.raises(errors.PermissionDenied):  # firing and configuring are the admin's
        await schedules.fire_due(conn, now=at(5))
    await conn.execute("RESET ROLE")
    await conn.execute("SET ROLE conveyor_admin")
    await schedules.create(conn, "mine", spec(), now=at(0))
    assert {f.name for f in await schedules.fire_due(conn, now=at(5))} == {"mine", "report"}
    assert await schedules.drop(conn, "mine")
    await conn.execute("RESET ROLE")


async def test_the_claim_probes_the_due_index(conn):
    """With thousands of schedules not due, finding the due ones is an index range scan
    on next_fire_at over the active rows, in order, without a sort."""
    await sql(conn, """
        INSERT INTO conveyor.schedules (name, expression, cron, target_kind, target, body, status, next_fire_at)
        SELECT 's' || g, '{}', '* * * * *', 'queue', 'jobs', '{}',
               CASE WHEN g % 10 = 0 THEN 'paused' ELSE 'active' END,
               timestamptz '2026-01-01' + make_interval(mins => g)
          FROM generate_series(1, 5000) g""")
    await sql(conn, "ANALYZE conveyor.schedules")
    cur = await conn.execute("""EXPLAIN SELECT * FROM conveyor.schedules t
         WHERE t.status = 'active' AND t.next_fire_at <= %s
         ORDER BY t.next_fire_at LIMIT 32 FOR UPDATE SKIP LOCKED""", (at(0),))
    plan = "\n".join(r[0] for r in await cur.fetchall())
    assert "schedules_due_idx" in plan and "Sort" not in plan, plan
