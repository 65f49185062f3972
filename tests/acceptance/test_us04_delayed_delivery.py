"""US-4: an event scheduled for later arrives only when its time has come."""

import asyncio


async def test_delayed_delivery(sql):
    await sql("SELECT * FROM conveyor.stream_create('reminders')")
    await sql("SELECT conveyor.stream_subscribe('reminders', 'sender')")
    await sql("""SELECT conveyor.stream_send_at('reminders', '{"user": 7}', now() + interval '2 seconds', 'remind')""")
    await sql("SELECT * FROM conveyor.maint()")
    await sql("SELECT conveyor.stream_force_tick('reminders')")
    assert await sql("SELECT * FROM conveyor.stream_receive('reminders', 'sender', 10)") == []
    await asyncio.sleep(2.2)
    moved = await sql("SELECT operation, count FROM conveyor.maint()")
    assert ("delayed", 1) in moved
    await sql("SELECT conveyor.stream_force_tick('reminders')")
    rows = await sql("SELECT type, payload FROM conveyor.stream_receive('reminders', 'sender', 10)")
    assert rows == [("remind", '{"user": 7}')]
    await sql("SELECT conveyor.stream_drop('reminders')")
