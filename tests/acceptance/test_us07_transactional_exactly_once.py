"""US-7: the application's writes and the ack commit together; a crash before commit
redelivers the batch."""

import psycopg

from conveyor.db import pool


async def test_transactional_processing_and_crash_redelivery(dsn, sql):
    await sql("SELECT * FROM conveyor.stream_create('payments')")
    await sql("SELECT conveyor.stream_subscribe('payments', 'processor')")
    await sql("CREATE TABLE processed_payments (id int PRIMARY KEY)")

    await sql("SELECT conveyor.stream_send('payments', '42')")
    await sql("SELECT conveyor.stream_force_tick('payments')")
    async with pool.connect(dsn, autocommit=False) as tx:
        rows = await (await tx.execute(
            "SELECT batch_id, payload FROM conveyor.stream_receive('payments', 'processor', 10)")).fetchall()
        await tx.execute("INSERT INTO processed_payments VALUES (%s)", (int(rows[0][1]),))
        await tx.execute("SELECT conveyor.stream_ack(%s)", (rows[0][0],))
        await tx.commit()
    assert await sql("SELECT id FROM processed_payments") == [(42,)]
    assert await sql("SELECT * FROM conveyor.stream_receive('payments', 'processor', 10)") == []

    await sql("SELECT conveyor.stream_send('payments', '43')")
    await sql("SELECT conveyor.stream_force_tick('payments')")
    crashed = await psycopg.AsyncConnection.connect(dsn)
    rows = await (await crashed.execute(
        "SELECT batch_id, payload FROM conveyor.stream_receive('payments', 'processor', 10)")).fetchall()
    await crashed.execute("INSERT INTO processed_payments VALUES (%s)", (int(rows[0][1]),))
    await crashed.close()  # no commit: the process died

    again = await sql("SELECT payload FROM conveyor.stream_receive('payments', 'processor', 10)")
    assert again == [("43",)], "redelivered"
    assert await sql("SELECT id FROM processed_payments ORDER BY id") == [(42,)]
    await sql("SELECT conveyor.stream_drop('payments')")
