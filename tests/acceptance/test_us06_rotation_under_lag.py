"""US-6: rotation keeps working for a fast consumer while a slow one lags, never loses
the slow one's events, and resumes once it catches up."""

import asyncio

import pytest


async def _receive_all(sql, consumer: str) -> list[str]:
    got = []
    while True:
        rows = await sql("SELECT batch_id, payload FROM conveyor.stream_receive('stream', %s, 100000)", consumer)
        if not rows:
            return got
        got += [p for _, p in rows]
        await sql("SELECT conveyor.stream_ack(%s)", rows[0][0])


@pytest.mark.own_cluster  # rotation waits for transactions older than the switch, anywhere on the server
async def test_rotation_under_consumer_lag(sql):
    await sql("""SELECT * FROM conveyor.stream_create('stream', '{"rotation_period": "1 second"}')""")
    await sql("SELECT conveyor.stream_subscribe('stream', 'fast')")
    await sql("SELECT conveyor.stream_subscribe('stream', 'slow')")
    sent, fast_got, operations = [], [], []
    for i in range(8):  # ~8 s: many rotation periods
        payload = f"e{i}"
        await sql("SELECT conveyor.stream_send('stream', %s)", payload)
        sent.append(payload)
        await sql("SELECT conveyor.stream_force_tick('stream')")
        fast_got += await _receive_all(sql, "fast")
        operations += [op for _, op, _ in await sql("SELECT * FROM conveyor.maint()")]
        await asyncio.sleep(1.0)

    assert fast_got == sent, "the fast consumer kept receiving everything"
    assert "rotation_blocked" in operations, "the slow consumer blocked rotation"
    await sql("SELECT conveyor.stream_force_tick('stream')")
    await _receive_all(sql, "fast")
    health = {check: status for _, check, status, _ in await sql("SELECT * FROM conveyor.stream_health()")}
    assert health["consumer_lag:slow"] in ("warning", "critical")
    assert health["consumer_lag:fast"] == "ok"

    assert await _receive_all(sql, "slow") == sent, "nothing was lost for the slow consumer"
    rotated = []
    for _ in range(3):
        await asyncio.sleep(1.1)
        rotated += [op for _, op, _ in await sql("SELECT * FROM conveyor.maint()")]
    assert "rotation_step1" in rotated, "rotation resumed once the slow consumer caught up"
    await sql("SELECT conveyor.stream_drop('stream')")
