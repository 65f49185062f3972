"""US-10: re-running the install script keeps queues, streams, events and consumer
positions, and everything keeps working."""

import subprocess

from conveyor.db import migrate, pool


async def test_reinstall_preserves_everything(empty_dsn, tmp_path):
    script = tmp_path / "conveyor.sql"
    script.write_text(migrate.bundle())
    psql = ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(script), empty_dsn]
    subprocess.run(psql, check=True, capture_output=True, text=True)
    async with pool.connect(empty_dsn) as conn:
        async def one(q, *p):
            return await (await conn.execute(q, p or None)).fetchall()

        await one("SELECT * FROM conveyor.stream_create('orders')")
        await one("SELECT conveyor.stream_subscribe('orders', 'c')")
        await one("SELECT conveyor.stream_send_batch('orders', 't', ARRAY['1','2'])")
        await one("SELECT conveyor.stream_force_tick('orders')")
        [(batch, _)] = set(await one("SELECT batch_id, 1 FROM conveyor.stream_receive('orders', 'c', 10)"))
        await one("SELECT conveyor.stream_ack(%s)", batch)
        await one("SELECT conveyor.stream_send('orders', '3')")
        before_positions = await one("SELECT name, last_tick FROM conveyor.stream_consumers")
        before_depth = await one("SELECT depth FROM conveyor.stream_stats()")

        result = subprocess.run(psql, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr

        assert await one("SELECT name, last_tick FROM conveyor.stream_consumers") == before_positions
        assert await one("SELECT depth FROM conveyor.stream_stats()") == before_depth
        await one("SELECT conveyor.stream_force_tick('orders')")
        rows = await one("SELECT batch_id, payload FROM conveyor.stream_receive('orders', 'c', 10)")
        assert [p for _, p in rows] == ["3"]
        await one("SELECT conveyor.stream_ack(%s)", rows[0][0])
