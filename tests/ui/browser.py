"""The dashboard's browser tests' helpers: the data they see, the signed-in page."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import httpx
import pytest

from support.server import ServerProcess

CHROMIUM = os.environ.get("CONVEYOR_CHROMIUM", "/usr/bin/chromium")
ADMIN, READER = "ui-admin-token", "ui-reader-token"


def chromium_or_fail() -> str:
    if Path(CHROMIUM).is_file() or shutil.which(CHROMIUM):
        return CHROMIUM
    reason = f"chromium is not installed at {CHROMIUM} (apt-get install chromium; .ci/run does)"
    if os.environ.get("CONVEYOR_REQUIRE_CHROMIUM"):  # set by .ci/run: CI must not skip these
        pytest.fail(reason)
    pytest.skip(reason)


def _ok(r: httpx.Response) -> dict:
    assert r.status_code < 300, f"{r.request.method} {r.request.url}: {r.status_code} {r.text}"
    return r.json() if r.content else {}


def seed(url: str) -> None:
    """Queues with a dead-letter queue holding messages, a stream with a consumer and a dead
    letter, a routing-key subscription to a queue and one to a webhook (held: the allowlist
    allows none), a schedule, a partitioned queue with a consumer group and a dead letter."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30) as c:
        _ok(c.post("/v1/queues", json={"name": "orders-dlq"}))
        _ok(c.post("/v1/queues", json={"name": "orders", "max_receive_count": 1, "dead_letter_queue": "orders-dlq"}))
        _ok(c.post("/v1/queues", json={"name": "emails", "storage": "partitioned", "partition_interval": "1 day"}))
        _ok(c.post("/v1/queues/orders/messages", json=[{"message": {"order": i}} for i in range(3)]))
        _ok(c.post("/v1/queues/emails/messages", json=[{"message": f"hello {i}"} for i in range(5)]))
        _ok(c.get("/v1/queues/orders/messages", params={"max": 3, "vt": 1}))
        time.sleep(1.2)
        assert _ok(c.get("/v1/queues/orders/messages", params={"max": 3, "vt": 1})) == []  # all dead-lettered
        _ok(c.post("/v1/streams", json={"name": "clicks"}))
        _ok(c.post("/v1/streams/clicks/consumers", json={"name": "billing"}))
        _ok(c.post("/v1/streams/clicks/events", json=[{"type": "click", "payload": {"n": i}} for i in range(4)]))
        batch = _ok(c.get("/v1/streams/clicks/consumers/billing/batch", params={"wait": 5}))
        _ok(c.post(f"/v1/streams/clicks/batches/{batch['batch_id']}/dead-letter",
                   json={"event_id": batch["events"][0]["id"], "reason": "bad click"}))
        _ok(c.post(f"/v1/streams/clicks/batches/{batch['batch_id']}/ack"))
        _ok(c.post("/v1/events/shop.%23/subscriptions", json={"queue_name": "emails"}))
        _ok(c.post("/v1/events/shop.%23/subscriptions", json={"protocol": "https",
                                                              "endpoint": "https://hooks.example.com/in"}))
        _ok(c.post("/v1/events/shop.created", json={"message": {"id": 7}}))
        _ok(c.post("/v1/schedules", json={"name": "nightly", "cron": "0 2 * * *", "timezone": "Europe/Paris",
                                          "target": "emails", "message": {"task": "report"}}))
        _ok(c.post("/api/v1/push", json={"items": [{"queue": "jobs", "partition": p, "payload": {"job": i}}
                                                   for i, p in enumerate(["a", "a", "b"])]}))
        popped = _ok(c.get("/api/v1/pop/queue/jobs", params={"consumerGroup": "workers", "batch": 1}))
        m = popped["messages"][0]
        _ok(c.post(f"/api/v1/messages/{m['partitionId']}/{m['transactionId']}/dlq",
                   json={"consumerGroup": "workers"}))
        time.sleep(1.5)  # a few history samples


class Console:
    """The console errors and uncaught exceptions of a page."""

    def __init__(self, page) -> None:
        self.errors: list[str] = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))


def open_dashboard(browser, server: ServerProcess, token: str):
    """A fresh browser context signed in with ``token``; (page, console)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    console = Console(page)
    page.set_default_timeout(10000)
    page.goto(server.url + "/ui/")
    page.fill("#token", token)
    page.click("#login-submit")
    page.wait_for_selector("#view[data-page='queues'] table")
    return page, console


def visit(page, hash_: str, selector: str = "#view") -> None:
    """Go to a page of the dashboard and wait until it has rendered."""
    before = page.get_attribute("#view", "data-loaded")
    # the same hash again fires no hashchange: the page is drawn again on one sent by hand
    page.evaluate("h => { if (location.hash === h) dispatchEvent(new HashChangeEvent('hashchange'));"
                  " else location.hash = h; }", hash_)
    page.wait_for_function("([b, h]) => { const v = document.querySelector('#view');"
                           " return v.dataset.loaded !== b && v.dataset.hash === h; }", arg=[before, hash_])
    page.wait_for_selector(selector)
