"""Every page of the dashboard renders the server's real data, with no console errors."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest

from support.server import ServerProcess
from ui.browser import ADMIN, READER, open_dashboard, visit


@pytest.fixture(scope="module")
def signed_in(browser, ui_server):
    page, console = open_dashboard(browser, ui_server, ADMIN)
    yield page, console
    page.context.close()


def cells(page, selector: str = "#view table") -> list[list[str]]:
    return page.eval_on_selector(selector, "t => [...t.tBodies[0].rows].map(r => [...r.cells].map(c => c.innerText))")


def test_the_page_loads_without_credentials_and_the_data_does_not(ui_server: ServerProcess):
    shell = httpx.get(ui_server.url + "/ui/")
    assert shell.status_code == 200 and "<title>Conveyor</title>" in shell.text
    assert httpx.get(ui_server.url + "/ui", follow_redirects=True).status_code == 200
    assert httpx.get(ui_server.url + "/ui/static/app.js").headers["content-type"].startswith("text/javascript")
    refused = httpx.get(ui_server.url + "/ui/api/queues")
    assert refused.status_code == 401 and refused.json()["code"] == "Unauthorized"
    assert httpx.get(ui_server.url + "/ui/static/../api/queues").status_code in (401, 404)


def test_a_wrong_token_is_refused_at_sign_in(browser, ui_server):
    context = browser.new_context()
    page = context.new_page()
    page.goto(ui_server.url + "/ui/")
    page.fill("#token", "not-a-token")
    page.click("#login-submit")
    page.wait_for_selector("#login-error:not([hidden])")
    assert "bearer token" in page.inner_text("#login-error")
    assert page.is_visible("#login")
    assert not page.is_visible("#logout")  # nobody to sign out yet
    context.close()


def test_queues(signed_in):
    page, console = signed_in
    rows = {r[0]: r for r in cells(page)}
    assert set(rows) == {"emails", "orders", "orders-dlq"}
    assert rows["emails"][1] == "6"  # five sent, one from the topic subscription
    assert rows["orders"][7].startswith("orders-dlq (3)")
    assert "DLQ of orders" in rows["orders-dlq"][7]
    assert page.inner_text("#who") == "role: admin"
    assert console.errors == []


def test_a_queue_with_its_charts_from_the_history(signed_in):
    page, console = signed_in
    visit(page, "#/queues/emails", ".charts")
    assert page.inner_text("p.storage") == ("partitioned Partitioned by time, 1 day a partition, 4 made ahead; "
                                            "partitions are kept.")
    assert int(page.get_attribute(".charts", "data-samples")) >= 2
    assert page.locator(".chart path[data-series='visible']").count() == 1
    assert page.locator(".chart svg").count() == 2
    bodies = [r[4] for r in cells(page)]
    assert bodies[:5] == [f"hello {i}" for i in range(5)]
    page.click(".ranges button:has-text('24 h')")
    page.wait_for_selector(".ranges button.on:has-text('24 h')")
    assert console.errors == []


def test_partitioned_queues_partitions_and_groups_with_lag(signed_in):
    page, console = signed_in
    visit(page, "#/pqueues", "#view table")
    assert cells(page)[0][0] == "jobs" and cells(page)[0][2] == "2"
    groups = cells(page, "#view table >> nth=1")
    assert groups[0][0] == "workers" and groups[0][1] == "jobs"
    visit(page, "#/pqueues/jobs", ".charts")
    partitions = cells(page, "#view table >> nth=1")
    assert [p[0] for p in partitions] == ["a", "b"]
    assert console.errors == []


def test_streams_and_consumers(signed_in):
    page, console = signed_in
    visit(page, "#/streams", "#view table")
    [stream] = cells(page)
    assert stream[0] == "clicks" and stream[4] == "1" and stream[6] == "1"
    [consumer] = cells(page, "#view table >> nth=1")
    assert consumer[:2] == ["clicks", "billing"]
    visit(page, "#/streams/clicks", ".charts")
    assert console.errors == []


def test_topics_subscriptions_and_the_outbox(signed_in):
    page, console = signed_in
    visit(page, "#/topics", ".charts")
    subs = cells(page, "#view table >> nth=0") if page.locator("#view table").count() > 2 else []
    text = page.inner_text("#view")
    assert "shop.#" in text and "https://hooks.example.com/in" in text
    assert "held" in text or "pending" in text
    assert subs == [] or any("shop.#" in r[0] for r in subs)
    assert console.errors == []


def test_schedules_with_next_fires(signed_in):
    page, console = signed_in
    visit(page, "#/schedules", "#view table")
    [row] = cells(page)
    assert row[0] == "nightly" and row[3] == "active"
    assert row[4].count("·") == 2  # three next fire times
    fires = row[4].split(" · ")
    page.select_option("#zone", "UTC")  # every time carries its zone: UTC on request...
    visit(page, "#/schedules", "#view table")
    [row] = cells(page)
    assert all(t.endswith("UTC") for t in row[4].split(" · ")), row[4]
    page.select_option("#zone", "local")  # ...else the browser's, named
    visit(page, "#/schedules", "#view table")
    assert cells(page)[0][4].split(" · ") == fires and all(t.rsplit(" ", 1)[-1] for t in fires)
    assert console.errors == []


def test_a_page_still_loading_does_not_draw_over_the_next(signed_in):
    page, console = signed_in
    visit(page, "#/queues", "#view table")
    held = []  # the schedules' answer is held back until the next page has drawn
    page.route("**/v1/schedules", lambda route: held.append(route))
    try:
        page.evaluate("location.hash = '#/schedules'")
        for _ in range(100):
            if held:
                break
            page.wait_for_timeout(50)
        visit(page, "#/dead-letters", "#view table")
        held[0].continue_()
        page.wait_for_timeout(1000)  # the late answer has arrived by now
        assert page.inner_text("#view h1").startswith("Dead letters")
        assert page.get_attribute("#view", "data-hash") == "#/dead-letters"
    finally:
        page.unroute("**/v1/schedules")
    assert console.errors == []


def test_dead_letters_of_every_kind(signed_in):
    page, console = signed_in
    visit(page, "#/dead-letters", "#view table")
    [dlq] = cells(page)
    assert dlq[:3] == ["orders-dlq", "orders", "3"]
    visit(page, "#/dead-letters/queue/orders-dlq", "#view table")
    replay, purge = (page.get_attribute(f"#view .toolbar button >> nth={i}", "class") for i in (0, 1))
    assert (replay, purge) == ("caution", "danger")  # a replay can be undone, a purge cannot
    visit(page, "#/queues/orders", ".charts")
    assert "after 1 receive." in page.inner_text("#view")  # max_receive_count 1: not "1 receives"
    visit(page, "#/dead-letters/stream/clicks", "#view table")
    [dead] = cells(page)
    assert dead[1] == "billing" and dead[3] == "bad click"
    visit(page, "#/dead-letters/pqueue", "#view table")
    [pdead] = cells(page)
    assert pdead[0] == "jobs" and pdead[2] == "workers"
    assert console.errors == []


def test_message_lookup_with_history_and_trace(signed_in, ui_server):
    page, console = signed_in
    visit(page, "#/lookup/queue/orders-dlq/1", "#view table")
    history = cells(page)
    assert [r[0] for r in history] == ["orders-dlq"]
    assert history[0][6] == "orders"  # dead-lettered from
    assert '{"order":' in page.inner_text("#view pre.body")
    visit(page, "#/lookup/queue/orders/99", "#view p.error")
    assert "has no message 99" in page.inner_text("#view p.error")
    # the partitioned queue's message, with its consumer groups and trace
    with httpx.Client(base_url=ui_server.url, headers={"Authorization": f"Bearer {ADMIN}"}) as c:
        m = c.get("/api/v1/dlq").json()["messages"][0]
        c.post("/api/v1/traces", json={"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                                       "eventType": "info", "data": {"text": "looked at"}, "traceNames": ["ui"]})
    visit(page, f"#/lookup/pqueue/{m['partitionId']}/{m['transactionId']}", "#view table")
    assert "dead_letter" in page.inner_text("#view .cards")
    assert "looked at" in page.inner_text("#view")
    assert console.errors == []


def test_a_reader_sees_everything_and_may_not_act(browser, ui_server):
    page, console = open_dashboard(browser, ui_server, READER)
    assert page.inner_text("#who") == "role: read"
    visit(page, "#/dead-letters/queue/orders-dlq", "#view table")
    assert page.locator("button:has-text('Purge')").is_disabled()
    assert page.locator("button:has-text('Replay all')").is_disabled()
    assert console.errors == []
    page.context.close()


SHOTS = [("queues", "#/queues", "#view table"), ("queue", "#/queues/emails", ".charts"),
         ("partitioned", "#/pqueues/jobs", ".charts"), ("streams", "#/streams", "#view table"),
         ("topics", "#/topics", ".charts"), ("schedules", "#/schedules", "#view table"),
         ("dead-letters", "#/dead-letters/queue/orders-dlq", "#view table"),
         ("lookup", "#/lookup/queue/orders-dlq/1", "#view table")]


def test_screenshots_of_every_page(signed_in, ui_server, tmp_path):
    """Every page draws to a PNG; with CONVEYOR_UI_SCREENSHOTS=docs they are the ones in
    docs/dashboard.md (taken after a few seconds of traffic, so the charts show some)."""
    page, console = signed_in
    out = Path(os.environ.get("CONVEYOR_UI_SCREENSHOTS") or tmp_path)
    with httpx.Client(base_url=ui_server.url, headers={"Authorization": f"Bearer {ADMIN}"}) as c:
        for i in range(12):
            c.post("/v1/queues/emails/messages", json=[{"message": f"burst {i}.{n}"} for n in range(i % 4 + 1)])
            if i % 3 == 2:
                for m in c.get("/v1/queues/emails/messages", params={"max": 3}).json():
                    c.delete(f"/v1/queues/emails/messages/{m['id']}", params={"receipt": m["receipt"]})
            time.sleep(0.25)
    page.evaluate("sessionStorage.setItem('conveyor.minutes', '15')")
    for name, hash_, selector in SHOTS:
        visit(page, hash_, selector)
        path = out / f"dashboard-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert console.errors == []


def test_every_answer_under_ui_carries_the_security_headers(ui_server: ServerProcess):
    """/ui was served without Content-Security-Policy, X-Frame-Options and
    X-Content-Type-Options: the page, its files, its data and its errors all carry them,
    the server's own refusals included (a request without credentials is refused by the
    server's authentication before it reaches the dashboard)."""
    reader = {"Authorization": f"Bearer {READER}"}
    for path, headers, status in (("/ui/", {}, 200), ("/ui/static/app.js", {}, 200),
                                  ("/ui/static/nothing.js", {}, 404), ("/ui/api/queues", reader, 200),
                                  ("/ui/api/nothing", reader, 404), ("/ui/api/queues", {}, 401)):
        r = httpx.get(ui_server.url + path, headers=headers)
        assert r.status_code == status, path
        policy = r.headers.get("content-security-policy", "")
        assert "default-src 'none'" in policy and "script-src 'self'" in policy, path
        assert "frame-ancestors 'none'" in policy, path
        assert r.headers.get("x-frame-options") == "DENY", path
        assert r.headers.get("x-content-type-options") == "nosniff", path


def test_the_policy_holds_in_the_browser(browser, ui_server):
    """What the headers promise, in Chromium: an inline script injected into the signed-in
    page does not run, and another page cannot frame the dashboard."""
    page, console = open_dashboard(browser, ui_server, READER)
    ran = page.evaluate("""() => { const s = document.createElement('script');
        s.textContent = 'window.injected = true'; document.body.append(s); return window.injected === true; }""")
    assert ran is False
    assert any("Content Security Policy" in e and "script-src" in e for e in console.errors)
    page.context.close()
    context = browser.new_context()
    framing = context.new_page()
    refused: list[str] = []
    framing.on("console", lambda m: refused.append(m.text) if m.type == "error" else None)
    framing.set_content(f'<iframe src="{ui_server.url}/ui/"></iframe>')
    framing.wait_for_timeout(1000)
    assert any("frame-ancestors" in e for e in refused), refused
    context.close()
