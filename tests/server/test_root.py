"""``GET /`` from a browser leads to the dashboard; the SQS and SNS gateway keeps every other
request to ``/`` (queries, POSTs, clients that do not ask for HTML)."""

from __future__ import annotations

import httpx

BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


def test_a_browser_opening_the_root_is_sent_to_the_dashboard(server):
    r = httpx.get(server.url + "/", headers={"Accept": BROWSER}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/"
    page = httpx.get(server.url + "/", headers={"Accept": BROWSER}, follow_redirects=True)
    assert page.status_code == 200 and "<html" in page.text.lower()


def test_aws_requests_to_the_root_still_reach_the_gateway(server):
    listed = httpx.get(server.url + "/", params={"Action": "ListQueues"},
                       headers={"Accept": BROWSER, "Authorization": "x"})
    assert listed.status_code == 200 and "ListQueuesResponse" in listed.text
    bare = httpx.get(server.url + "/")  # no Accept: text/html (an SDK, curl): the gateway answers
    assert bare.status_code != 303 and "xml" in bare.headers["content-type"]
    posted = httpx.post(server.url + "/", data={"Action": "ListQueues"}, headers={"Accept": BROWSER,
                                                                                  "Authorization": "x"})
    assert posted.status_code == 200 and "ListQueuesResponse" in posted.text
