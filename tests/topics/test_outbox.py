"""The webhook outbox: claims with SKIP LOCKED and a lease, backoff as the caller says (the delivery policy),
exhaustion, holds, retries, inspection and stats."""

from __future__ import annotations

import datetime as dt

import psycopg
import pytest

from conveyor import errors, types
from conveyor.core import topics

URLS = types.TopicUrls()


async def _outbox(conn, n: int = 1, endpoint: str = "http://127.0.0.1:9/hook") -> types.Subscription:
    sub = await topics.subscribe(conn, types.NewSubscription(pattern="t", protocol="http", endpoint=endpoint,
                                                             raw_delivery=True))
    for i in range(n):
        await topics.publish(conn, "t", types.Publication(f"m{i}"), signer=None, urls=URLS)
    return sub


async def _make_due(conn) -> None:
    await conn.execute("UPDATE conveyor.http_deliveries SET next_attempt_at = now()")


async def _seconds_until_due(conn, delivery_id: int) -> float:
    cur = await conn.execute("SELECT extract(epoch FROM next_attempt_at - now())::float8 "
                             "FROM conveyor.http_deliveries WHERE id = %s", (delivery_id,))
    return (await cur.fetchone())[0]


async def test_claim_leases_rows_so_they_are_not_claimed_twice(conn):
    await _outbox(conn, 3)
    first = await topics.delivery_claim(conn, 2, 30)
    assert [d.payload for d in first] == ["m0", "m1"] and all(d.attempt == 0 for d in first)
    assert 25 < await _seconds_until_due(conn, first[0].id) <= 30
    second = await topics.delivery_claim(conn, 10, 30)
    assert [d.payload for d in second] == ["m2"]
    assert await topics.delivery_claim(conn, 10, 30) == []
    # a worker that died: the lease runs out and the rows come back
    await _make_due(conn)
    assert len(await topics.delivery_claim(conn, 10, 30)) == 3
    with pytest.raises(errors.InvalidInput):
        await topics.delivery_claim(conn, 0, 30)
    with pytest.raises(errors.InvalidInput):
        await topics.delivery_claim(conn, 1, 0)


async def test_concurrent_claims_skip_locked_rows(dsn, conn):
    """Two workers in open transactions never get the same row, and neither waits."""
    await _outbox(conn, 4)
    async with await psycopg.AsyncConnection.connect(dsn) as a, await psycopg.AsyncConnection.connect(dsn) as b:
        await a.execute("SET lock_timeout = '2s'")
        await b.execute("SET lock_timeout = '2s'")
        got_a = await topics.delivery_claim(a, 3, 30)
        got_b = await topics.delivery_claim(b, 3, 30)  # a still holds its rows locked
        assert len(got_a) == 3 and len(got_b) == 1
        assert {d.id for d in got_a}.isdisjoint({d.id for d in got_b})
        await a.rollback()  # a crashed before committing its lease
        await b.commit()
    again = await topics.delivery_claim(conn, 10, 30)
    assert {d.id for d in again} == {d.id for d in got_a}


async def test_success_deletes(conn):
    await _outbox(conn, 2)
    claimed = await topics.delivery_claim(conn, 10, 30)
    assert await topics.delivery_succeeded(conn, [d.id for d in claimed] + [999]) == 2
    assert await topics.delivery_list(conn) == []


async def test_failures_back_off_then_exhaust(conn):
    """The caller (the worker, from the delivery policy) says when the next attempt is due
    and how many attempts there are in all."""
    await _outbox(conn, 1)
    [d] = await topics.delivery_claim(conn, 1, 30)
    for attempt, backoff in enumerate([10, 30, 60, 300], start=1):
        after = await topics.delivery_failed(conn, d.id, f"HTTP 500 #{attempt}", backoff, 5)
        assert (after.attempt, after.state, after.last_error) == (attempt, "pending", f"HTTP 500 #{attempt}")
        assert backoff - 5 < await _seconds_until_due(conn, d.id) <= backoff
        assert await topics.delivery_claim(conn, 1, 30) == []  # not due yet
        await _make_due(conn)
        [d] = await topics.delivery_claim(conn, 1, 30)
        assert d.attempt == attempt
    last = await topics.delivery_failed(conn, d.id, "connection refused", 0, 5)
    assert (last.attempt, last.state, last.exhausted, last.last_error) == (5, "exhausted", True, "connection refused")
    await _make_due(conn)
    assert await topics.delivery_claim(conn, 10, 30) == []  # kept for inspection, never claimed
    assert [x.id for x in await topics.delivery_list(conn, "exhausted")] == [d.id]
    assert await topics.delivery_list(conn, "pending") == []
    with pytest.raises(errors.DeliveryNotFound):
        await topics.delivery_failed(conn, 424242, "x", 1, 5)
    for retry_in, attempts in ((-1, 5), (3601, 5), (1, 0), (1, 102)):
        with pytest.raises(errors.InvalidInput):
            await topics.delivery_failed(conn, d.id, "x", retry_in, attempts)


async def test_a_deferred_row_keeps_its_attempts(conn):
    """Rows a subscription's throttle holds back are due later and no attempt is counted."""
    await _outbox(conn, 2)
    claimed = await topics.delivery_claim(conn, 10, 30)
    assert await topics.delivery_defer(conn, [d.id for d in claimed], 2.0) == 2
    assert await topics.delivery_claim(conn, 10, 30) == []
    for d in claimed:
        assert 1 < await _seconds_until_due(conn, d.id) <= 2
    await _make_due(conn)
    assert [d.attempt for d in await topics.delivery_claim(conn, 10, 30)] == [0, 0]


async def test_holds_are_never_claimed_until_retried(conn):
    sub = await _outbox(conn, 2, endpoint="http://10.0.0.1/internal")
    first, second = await topics.delivery_claim(conn, 10, 30)
    held = await topics.delivery_hold(conn, first.id, "destination 10.0.0.1 is not allowed")
    assert (held.state, held.held_reason, held.attempt) == ("held", "destination 10.0.0.1 is not allowed", 0)
    await topics.delivery_failed(conn, second.id, "boom", 10, 5)
    for _ in range(4):
        await topics.delivery_failed(conn, second.id, "boom", 10, 5)
    await _make_due(conn)
    assert await topics.delivery_claim(conn, 10, 30) == []
    assert [d.id for d in await topics.delivery_list(conn, "held", subscription=sub.uuid)] == [first.id]
    with pytest.raises(errors.DeliveryNotFound):
        await topics.delivery_hold(conn, 424242, "x")
    # retry makes them due again with fresh attempts
    assert await topics.delivery_retry(conn, [first.id]) == 1
    assert await topics.delivery_retry(conn) == 1
    claimed = await topics.delivery_claim(conn, 10, 30)
    assert {(d.id, d.attempt, d.held_reason) for d in claimed} == {(first.id, 0, None), (second.id, 0, None)}
    with pytest.raises(errors.InvalidInput):
        await topics.delivery_list(conn, "weird")


async def test_stats_count_by_state(conn):
    empty = await topics.deliveries_stats(conn)
    assert (empty.pending, empty.due, empty.held, empty.exhausted, empty.oldest_pending_age) == (0, 0, 0, 0, None)
    await _outbox(conn, 4)
    a, b, c, _d = await topics.delivery_claim(conn, 10, 30)
    await topics.delivery_hold(conn, a.id, "no")
    for _ in range(5):
        await topics.delivery_failed(conn, b.id, "x", 10, 5)
    await topics.delivery_failed(conn, c.id, "x", 10, 5)
    stats = await topics.deliveries_stats(conn)
    assert (stats.pending, stats.due, stats.held, stats.exhausted) == (2, 0, 1, 1)
    assert isinstance(stats.oldest_pending_age, dt.timedelta)


async def test_unsubscribing_drops_pending_deliveries(conn):
    sub = await _outbox(conn, 3)
    assert len(await topics.delivery_list(conn, subscription=sub.id)) == 3
    await topics.unsubscribe(conn, sub.id)
    assert await topics.delivery_list(conn) == []
