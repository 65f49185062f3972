"""US-8: on a managed PostgreSQL, install from one SQL file with psql, start, use,
stop and uninstall (pg_cron itself is covered by tests/streams/test_pg_cron.py)."""

import subprocess

from conveyor.db import migrate, pool


async def test_install_use_uninstall_from_one_file(empty_dsn, tmp_path):
    script = tmp_path / "conveyor.sql"
    script.write_text(migrate.bundle())
    subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(script), empty_dsn],
                   check=True, capture_output=True, text=True)
    async with pool.connect(empty_dsn) as conn:
        async def one(q, *p):
            return await (await conn.execute(q, p or None)).fetchall()

        started = (await one("SELECT conveyor.start()"))[0][0]
        assert "pg_cron is not installed" in started  # says so clearly on a database without it
        assert (await one("SELECT state FROM conveyor.status()")) == [("absent",)]
        await one("SELECT * FROM conveyor.stream_create('orders')")
        await one("SELECT conveyor.stream_subscribe('orders', 'c')")
        await one("SELECT conveyor.stream_send('orders', 'x')")
        [(ticks,)] = await one("SELECT conveyor.ticker()")
        assert ticks in (0, 1)  # ticks only when the stream needs it
        await one("SELECT conveyor.stream_force_tick('orders')")
        [(batch, payload)] = await one("SELECT batch_id, payload FROM conveyor.stream_receive('orders', 'c', 10)")
        assert payload == "x"
        await one("SELECT conveyor.stream_ack(%s)", batch)
        statuses = {s for _, _, s, _ in await one("SELECT * FROM conveyor.stream_health()")}
        assert statuses == {"ok"}
        assert (await one("SELECT conveyor.stop()")) == [("pg_cron is not installed: nothing to stop",)]
        assert (await one("SELECT conveyor.uninstall()")) == [("conveyor uninstalled",)]
        assert (await one("SELECT count(*) FROM pg_namespace WHERE nspname = 'conveyor'")) == [(0,)]
        leftovers = await one("SELECT relname FROM pg_class WHERE relname LIKE 'stream\\_%%'")
        assert leftovers == []
