"""US-3: failed events are retried and land in the dead letters after max retries."""


async def _receive(sql):
    rows = await sql("SELECT id, batch_id, retry_count FROM conveyor.stream_receive('jobs', 'worker', 10)")
    assert len(rows) == 1, rows
    return rows[0]


async def _next_cycle(sql):
    await sql("SELECT * FROM conveyor.maint()")  # moves the due retry into the stream
    await sql("SELECT conveyor.stream_force_tick('jobs')")


async def test_retry_then_dead_letter_then_replay(sql):
    await sql("""SELECT * FROM conveyor.stream_create('jobs', '{"max_retries": 2}')""")
    await sql("SELECT conveyor.stream_subscribe('jobs', 'worker')")
    await sql("SELECT conveyor.stream_send('jobs', 'do-it')")
    await sql("SELECT conveyor.stream_force_tick('jobs')")
    event_id, batch, retries = await _receive(sql)
    assert retries is None  # first delivery

    for expected in (1, 2):  # each cycle: nack, ack, maint, tick, receive
        assert await sql("SELECT conveyor.stream_nack(%s, %s, '0 seconds', 'flaky')", batch, event_id) == [("retry",)]
        await sql("SELECT conveyor.stream_ack(%s)", batch)
        await _next_cycle(sql)
        event_id, batch, retries = await _receive(sql)
        assert retries == expected

    assert await sql("SELECT conveyor.stream_nack(%s, %s, '0 seconds', 'still broken')", batch, event_id) == [("dead",)]
    await sql("SELECT conveyor.stream_ack(%s)", batch)
    await _next_cycle(sql)
    assert await sql("SELECT * FROM conveyor.stream_receive('jobs', 'worker', 10)") == []

    [(dead_id, reason, data, retry)] = await sql(
        "SELECT id, reason, ev_data, ev_retry FROM conveyor.stream_dead_letters('jobs', 10)")
    assert (reason, data, retry) == ("still broken", "do-it", 2)
    await sql("SELECT conveyor.stream_dead_letter_replay(%s)", dead_id)
    await sql("SELECT conveyor.stream_force_tick('jobs')")
    [(_, _, retries)] = [await _receive(sql)]
    assert retries is None  # replayed as a new event
    assert await sql("SELECT * FROM conveyor.stream_dead_letters('jobs', 10)") == []
    await sql("SELECT conveyor.stream_drop('jobs')")
