"""US-5: an ETL consumer takes 10,000 events in one batch, and the event tables stay
free of dead tuples."""

import asyncio


async def test_ten_thousand_events_in_one_batch(sql):
    await sql("SELECT * FROM conveyor.stream_create('ingest')")
    await sql("SELECT conveyor.stream_subscribe('ingest', 'etl')")
    await sql("SELECT count(*) FROM conveyor.stream_send_batch('ingest', 'row', "
              "ARRAY(SELECT 'r' || g FROM generate_series(1, 10000) g))")
    await sql("SELECT conveyor.stream_force_tick('ingest')")
    rows = await sql("SELECT id, batch_id FROM conveyor.stream_receive('ingest', 'etl', 10000)")
    assert len(rows) == 10000 and len({b for _, b in rows}) == 1
    assert [i for i, _ in rows] == sorted(i for i, _ in rows)
    await sql("SELECT conveyor.stream_ack(%s)", rows[0][1])
    [(depth,)] = await sql("SELECT depth FROM conveyor.stream_stats() WHERE stream = 'ingest'")
    assert depth == 0
    await asyncio.sleep(0.6)  # statistics are flushed at most once a second or so
    await sql("SELECT pg_stat_clear_snapshot()")
    dead = await sql("""SELECT relname, n_dead_tup FROM pg_stat_user_tables
                         WHERE schemaname = 'conveyor' AND relname ~ '^stream_[0-9]+_[0-2]$'""")
    assert dead and all(n == 0 for _, n in dead), dead
    await sql("SELECT conveyor.stream_drop('ingest')")
