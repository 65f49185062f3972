"""US-1: as a developer I send a JSON message and receive it, to use streams as a queue."""


async def test_basic_produce_consume_cycle(sql):
    await sql("SELECT * FROM conveyor.stream_create('orders')")
    await sql("SELECT conveyor.stream_subscribe('orders', 'app')")
    await sql("""SELECT conveyor.stream_send('orders', '{"id":1}')""")
    await sql("SELECT conveyor.stream_force_tick('orders')")
    rows = await sql("SELECT batch_id, type, payload FROM conveyor.stream_receive('orders', 'app', 10)")
    assert len(rows) == 1
    batch_id, type_, payload = rows[0]
    assert (type_, payload) == ("default", '{"id":1}')
    assert (await sql("SELECT conveyor.stream_ack(%s)", batch_id)) == [(1,)]
    assert await sql("SELECT * FROM conveyor.stream_receive('orders', 'app', 10)") == []
    assert await sql("SELECT conveyor.stream_drop('orders')") == [(True,)]
