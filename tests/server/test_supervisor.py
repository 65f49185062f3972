"""Background workers keep running: a failure nobody expected is logged, the worker is
started again, and until it runs /readyz and the metrics say so."""

from __future__ import annotations

import asyncio
import time

from starlette.testclient import TestClient

from conveyor.core import streams
from conveyor.server.app import create_app
from conveyor.server.metrics import Metrics
from conveyor.server.supervisor import Supervisor
from conveyor.settings import Settings


async def test_a_failed_worker_is_started_again():
    metrics = Metrics()
    supervisor = Supervisor(metrics, first_backoff=0.05)
    runs = []

    async def worker() -> None:
        runs.append(time.monotonic())
        if len(runs) < 3:
            raise KeyError("not a Conveyor error")
        await asyncio.sleep(3600)

    supervisor.start("flaky", worker)
    for _ in range(200):
        if len(runs) == 3:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.01)
    assert len(runs) == 3 and supervisor.healthy()
    report = supervisor.report()["flaky"]
    assert report == {"running": True, "restarts": 2, "last_error": "KeyError: 'not a Conveyor error'"}
    assert runs[2] - runs[1] >= runs[1] - runs[0]  # the pause doubles
    text = metrics.render().decode()
    assert 'conveyor_worker_restarts_total{worker="flaky"} 2.0' in text
    assert 'conveyor_worker_up{worker="flaky"} 1.0' in text
    await supervisor.stop()
    assert not supervisor.healthy()


def test_the_stream_ticker_survives_an_unexpected_error(dsn, monkeypatch):
    """It died on any exception other than a Conveyor error, and streams stalled silently."""
    real, calls = streams.ticker, []

    async def flaky(conn):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug in the ticker")
        return await real(conn)

    monkeypatch.setattr(streams, "ticker", flaky)
    settings = Settings(stream_tick_interval=0.05, schedule_enabled=False)
    auth = {"Authorization": "x"}
    with TestClient(create_app(settings, dsn), headers=auth) as c:
        assert c.post("/v1/streams", json={"name": "orders"}).status_code == 201
        assert c.post("/v1/streams/orders/consumers", json={"name": "billing"}).status_code == 201
        assert c.post("/v1/streams/orders/events", json={"payload": "one"}).status_code == 201
        batch = c.get("/v1/streams/orders/consumers/billing/batch", params={"wait": 10}).json()
        assert [e["payload"] for e in batch["events"]] == ["one"]
        ready = c.get("/readyz").json()
        assert ready["workers"]["stream-ticker"]["restarts"] == 1
        assert ready["workers"]["stream-ticker"]["last_error"] == "RuntimeError: a bug in the ticker"
        assert 'conveyor_worker_restarts_total{worker="stream-ticker"} 1.0' in c.get("/metrics").text


async def test_stop_ends_a_worker_that_lost_its_cancellation(monkeypatch):
    """Python 3.11's wait_for can drop a cancellation that races its result; stop() must
    not then wait for ever (the server's shutdown hung on this)."""
    monkeypatch.setattr("conveyor.server.supervisor.STOP_RETRY_SECONDS", 0.05)
    supervisor = Supervisor(Metrics())
    swallowed = []

    async def stubborn() -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed.append(True)  # the first cancellation is lost

    supervisor.start("stubborn", stubborn)
    await asyncio.sleep(0.01)
    await asyncio.wait_for(supervisor.stop(), 5)
    assert swallowed == [True]
