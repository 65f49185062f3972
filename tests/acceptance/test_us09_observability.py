"""US-9: an operator sees depth, lag, health and dead letters at a glance."""


async def test_stats_health_and_stuck_consumers(sql):
    for name in ("healthy", "lagging", "failing"):
        await sql("SELECT * FROM conveyor.stream_create(%s)", name)
        await sql("SELECT conveyor.stream_subscribe(%s, 'worker')", name)
        await sql("SELECT conveyor.stream_send_batch(%s, 't', ARRAY['1','2','3'])", name)
        await sql("SELECT conveyor.stream_force_tick(%s)", name)
    # healthy: consumed; lagging: untouched (and made old); failing: dead letters
    [(batch,)] = set(await sql("SELECT batch_id FROM conveyor.stream_receive('healthy', 'worker', 10)"))
    await sql("SELECT conveyor.stream_ack(%s)", batch)
    rows = await sql("SELECT id, batch_id FROM conveyor.stream_receive('failing', 'worker', 10)")
    for event_id, batch in rows:
        await sql("SELECT conveyor.stream_dead_letter(%s, %s, 'bad')", batch, event_id)
    await sql("SELECT conveyor.stream_ack(%s)", rows[0][1])
    await sql("""UPDATE conveyor.stream_ticks SET tick_time = tick_time - interval '3 hours'
                  WHERE stream_id = (SELECT id FROM conveyor.streams WHERE name = 'lagging')""")

    stats = {r[0]: r for r in await sql("SELECT stream, depth, consumers, dead_letters FROM conveyor.stream_stats()")}
    assert stats["healthy"][1:] == (0, 1, 0)
    assert stats["lagging"][1] == 3 and stats["failing"][3] == 3
    lag = {r[0]: r for r in await sql("SELECT stream, pending_events FROM conveyor.consumer_stats()")}
    assert lag["lagging"][1] == 3 and lag["healthy"][1] == 0

    health = {(s, c): st for s, c, st, _ in await sql("SELECT * FROM conveyor.stream_health()")}
    assert health[("healthy", "consumer_lag:worker")] == "ok"
    assert health[("lagging", "consumer_lag:worker")] == "critical"
    assert health[("failing", "dead_letters")] == "warning"
    assert health[("healthy", "dead_letters")] == "ok"

    metrics = await sql("SELECT metric_name, metric_type, value, labels FROM conveyor.otel_metrics()")
    names = {m for m, *_ in metrics}
    assert {"conveyor.stream.depth", "conveyor.consumer.lag_seconds", "conveyor.stream.dead_lettered"} <= names
    depth = {labels["stream"]: value for m, t, value, labels in metrics if m == "conveyor.stream.depth"}
    assert depth["lagging"] == 3
    stuck = await sql("SELECT stream, consumer FROM conveyor.stuck_consumers('1 hour')")
    assert stuck == [("lagging", "worker")]
    assert await sql("SELECT count(*) FROM conveyor.stream_in_flight('lagging')") == [(0,)]
    throughput = await sql("SELECT sum(events) FROM conveyor.stream_throughput('healthy', '1 hour', '1 minute')")
    assert throughput == [(3,)]
