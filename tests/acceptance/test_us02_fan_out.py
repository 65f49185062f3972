"""US-2: several independent consumers of one stream each get every event."""


async def test_multiple_consumers_fan_out(sql):
    await sql("SELECT * FROM conveyor.stream_create('events')")
    for consumer in ("analytics", "notifier", "audit"):
        await sql("SELECT conveyor.stream_subscribe('events', %s)", consumer)
    await sql("SELECT conveyor.stream_send_batch('events', 'e', ARRAY['1','2','3','4','5'])")
    await sql("SELECT conveyor.stream_force_tick('events')")

    got = {}
    for consumer in ("analytics", "notifier", "audit"):
        rows = await sql("SELECT batch_id, payload FROM conveyor.stream_receive('events', %s, 100)", consumer)
        got[consumer] = rows
        assert [p for _, p in rows] == ["1", "2", "3", "4", "5"]

    # acking one consumer does not move the others
    await sql("SELECT conveyor.stream_ack(%s)", got["analytics"][0][0])
    stats = {c: pending for _, c, _, pending, *_ in await sql("SELECT * FROM conveyor.consumer_stats()")}
    assert stats["analytics"] == 0 and stats["notifier"] == 5 and stats["audit"] == 5
    assert await sql("SELECT * FROM conveyor.stream_receive('events', 'analytics', 100)") == []
    # the others still hold their open batch and get the same events again
    again = await sql("SELECT payload FROM conveyor.stream_receive('events', 'notifier', 100)")
    assert [p for (p,) in again] == ["1", "2", "3", "4", "5"]
    await sql("SELECT conveyor.stream_drop('events')")
