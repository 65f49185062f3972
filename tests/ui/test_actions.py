"""Destructive actions from the dashboard: replay from a dead-letter queue end to end,
purge behind the admin role and a confirmation, stream and partitioned dead letters."""

from __future__ import annotations

import time

import httpx
import pytest

from ui.browser import ADMIN, READER, open_dashboard, visit


@pytest.fixture(scope="module")
def admin_page(browser, ui_server):
    page, console = open_dashboard(browser, ui_server, ADMIN)
    yield page, console
    page.context.close()


def _client(server, token: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=10)


def _depth(server, queue: str) -> int:
    with _client(server, ADMIN) as c:
        [q] = [q for q in c.get("/ui/api/queues").json() if q["name"] == queue]
    return q["depth"] + q["in_flight"] + q["delayed"]


def _until(check, timeout: float = 8.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_the_server_refuses_destructive_actions_to_a_reader(ui_server):
    with _client(ui_server, READER) as c:
        for method, path in (("POST", "/ui/api/queues/orders-dlq/redrives"), ("POST", "/v1/queues/orders-dlq/purge"),
                             ("DELETE", "/v1/streams/clicks/dead-letters"),
                             ("POST", "/v1/streams/clicks/dead-letters/replay")):
            r = c.request(method, path)
            assert r.status_code == 403 and r.json()["code"] == "PermissionDenied", (path, r.text)
        assert c.get("/ui/api/queues/orders-dlq/messages").status_code == 200  # reading is fine
    assert _depth(ui_server, "orders-dlq") == 3


def test_purge_asks_first_and_cancel_keeps_everything(admin_page, ui_server):
    page, console = admin_page
    visit(page, "#/dead-letters/queue/orders-dlq", "#view table")
    page.click("#view button:has-text('Purge')")
    page.wait_for_selector("#confirm[open]")
    assert "orders-dlq" in page.inner_text("#confirm-title")
    page.click("#confirm-cancel")
    page.wait_for_selector("#confirm", state="hidden")
    time.sleep(0.3)
    assert _depth(ui_server, "orders-dlq") == 3
    assert console.errors == []


def test_replay_from_the_dead_letter_queue_end_to_end(admin_page, ui_server):
    page, console = admin_page
    visit(page, "#/dead-letters/queue/orders-dlq", "#view table")
    assert page.locator("#view tbody tr").count() == 3
    page.click("#view button:has-text('Replay all')")
    page.wait_for_selector("#confirm[open]")
    page.click("#confirm-ok")
    page.wait_for_selector("#toast:has-text('replaying 3 messages')")
    _until(lambda: _depth(ui_server, "orders-dlq") == 0)  # the server's move-tasks worker
    with _client(ui_server, ADMIN) as c:  # back where they came from, receivable again
        got = c.get("/v1/queues/orders/messages", params={"max": 10}).json()
    assert sorted(m["message"]["order"] for m in got) == [0, 1, 2]
    visit(page, "#/queues", "#view table")
    assert console.errors == []


def test_purge_with_confirmation_empties_the_queue(admin_page, ui_server):
    page, console = admin_page
    with _client(ui_server, ADMIN) as c:
        c.post("/v1/queues/emails/messages", json={"message": "one more"}).raise_for_status()
    before = _depth(ui_server, "emails")
    assert before > 0
    with _client(ui_server, ADMIN) as c:  # make emails a dead-letter queue so it is listed
        c.patch("/v1/queues/orders", json={"dead_letter_queue": "emails"}).raise_for_status()
    visit(page, "#/dead-letters", "#view table")
    row = page.locator("#view tbody tr", has_text="emails")
    row.locator("button:has-text('Purge')").click()
    page.wait_for_selector("#confirm[open]")
    page.click("#confirm-ok")
    page.wait_for_selector(f"#toast:has-text('purged {before} messages')")
    assert _depth(ui_server, "emails") == 0
    assert console.errors == []


def test_a_stream_dead_letter_replayed(admin_page, ui_server):
    page, console = admin_page
    visit(page, "#/dead-letters/stream/clicks", "#view table")
    page.locator("#view tbody tr").first.locator("button:has-text('Replay')").click()
    page.click("#confirm-ok")
    page.wait_for_selector("#toast:has-text('replayed as event')")
    page.wait_for_selector("#view .empty")  # the list is empty now
    assert console.errors == []


def test_a_partitioned_dead_letter_retried(admin_page, ui_server):
    page, console = admin_page
    visit(page, "#/dead-letters/pqueue", "#view table")
    page.locator("#view tbody tr").first.locator("button:has-text('Retry')").click()
    page.click("#confirm-ok")
    page.wait_for_selector("#toast:has-text('retried')")
    page.wait_for_selector("#view .empty")
    with _client(ui_server, ADMIN) as c:
        assert c.get("/api/v1/dlq").json()["total"] == 0
    assert console.errors == []
