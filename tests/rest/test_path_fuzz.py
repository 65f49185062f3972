"""Every path parameter of every REST endpoint, fuzzed: whatever a client puts in a path
segment gets a 2xx or a REST error ({"error", "code"}, 4xx), never a 500.

Values are drawn by hypothesis: awkward strings (non-ASCII digits such as "²" and "٣",
NUL and control characters, signs, huge numbers, dot segments, percent signs, long
runs) and arbitrary text. CI runs a fixed set; ``CONVEYOR_FUZZ_EXAMPLES=N`` runs N fresh
random examples instead."""

from __future__ import annotations

import os
import re
from urllib.parse import quote

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conveyor.protocols.rest import routes

EXAMPLES = int(os.environ.get("CONVEYOR_FUZZ_EXAMPLES", "0")) or 150
DERANDOMIZE = "CONVEYOR_FUZZ_EXAMPLES" not in os.environ
AWKWARD = ["²", "٣", "１２", "0", "-1", "+1", "1e3", "1.0", " 1", "9" * 19, "9" * 40, str(2**63), str(2**63 - 1),
           "\x00", "\x01", "%", "%00", "..", ".", "a/b", "#", "?", "é" * 100, "x" * 5000, "🎉", "\ud7ff",
           "orders", "q.fifo", "eu-west-1:q", "*", "orders.#"]
GRID = ["²", "٣", "１２", "0", "-1", "9" * 40, str(2**63), "\x00", "%", "..", "x" * 5000, "🎉"]
PARAM = re.compile(r"\{([a-z_]+)\}")
ENDPOINTS = [e for e in routes.ENDPOINTS if PARAM.search(e.path)]
segment = st.one_of(st.sampled_from(AWKWARD), st.text(min_size=1, max_size=60))


def _check(server, endpoint, values) -> None:
    path = endpoint.path
    for name, value in zip(PARAM.findall(endpoint.path), values, strict=False):
        path = path.replace("{" + name + "}", quote(value, safe=""), 1)
    r = httpx.request(endpoint.method, server.url + "/v1" + path, json={} if endpoint.body else None,
                      headers={"Authorization": "x"}, timeout=30)
    assert r.status_code < 500, (endpoint.method, path, r.status_code, r.text[:300])
    if r.status_code >= 400:
        body = r.json()
        assert set(body) == {"error", "code"}, body


def test_every_awkward_value_in_every_path_parameter(server):
    """Each awkward value in each parameter of each endpoint (the others plausible)."""
    for endpoint in ENDPOINTS:
        names = PARAM.findall(endpoint.path)
        for i in range(len(names)):
            for value in GRID:
                values = ["orders.#" if n == "pattern" else "1" if "id" in n else "orders" for n in names]
                values[i] = value
                _check(server, endpoint, values)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=DERANDOMIZE, database=None,
          suppress_health_check=list(HealthCheck))
@given(endpoint=st.sampled_from(ENDPOINTS), values=st.lists(segment, min_size=4, max_size=4))
def test_path_parameters_never_give_a_500(server, endpoint, values):
    _check(server, endpoint, values)
