"""hq's HTTP API (seed 003) against a real server, driven with curl as hq's README does:
the README session replayed byte for byte, on the hq port (hq's routes at the root) and
under /hq on the server's port; every route of hq's server; only the consumer holding
the current delivery completes or fails; visibility timeouts, max_attempts, bad input in
hq's plain-text errors, and authentication on both ways in."""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest

from support.server import ServerProcess, free_port

UUID_RE = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
TIME_RE = r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3}"


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: str


def curl(*args: str) -> Reply:
    """One curl call (as in hq's README); the status line, headers and body it printed."""
    out = subprocess.run(["curl", "-s", "-i", "--max-time", "10", *args], capture_output=True, check=True).stdout
    head, _, body = out.partition(b"\r\n\r\n")
    while head.startswith(b"HTTP/1.1 100"):  # curl's Expect: 100-continue, before a large body
        head, _, body = body.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return Reply(int(lines[0].split()[1]), headers, body.decode())


@dataclass
class Hq:
    """Where an hq client points: the hq port's root, or /hq on the server's port."""

    base: str
    server: ServerProcess

    def __call__(self, method: str, path: str, *args: str) -> Reply:
        return curl("-X" + method, self.base + path, *args)


@pytest.fixture(scope="module")
def hq_server(module_dsn) -> Iterator[ServerProcess]:
    """No authentication, as hq has none; hq's port as well as the server's."""
    proc = ServerProcess(module_dsn, env={"CONVEYOR_AUTH": "none", "CONVEYOR_HQ_PORT": str(free_port())})
    yield proc.start()
    proc.kill()


@pytest.fixture(scope="module", params=["hq-port", "prefix"])
def hq(request, hq_server) -> Hq:
    port = hq_server.env["CONVEYOR_HQ_PORT"]
    return Hq(f"http://localhost:{port}" if request.param == "hq-port" else hq_server.url + "/hq", hq_server)


def fresh(prefix: str = "q") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def make_queue(hq: Hq, max_attempts: int = 5, visibility: int = 30) -> str:
    name = fresh()
    r = hq("POST", f"/queues?name={name}&max_attempts={max_attempts}&visibility_timeout_seconds={visibility}")
    assert (r.status, r.body) == (200, "")
    return name


def enqueue(hq: Hq, name: str, body: str = '{"a":1, "b":2}') -> str:
    r = hq("POST", f"/queues/{name}/enqueue", "-H", "Content-type: application/json", "-d", body)
    assert r.status == 200, r
    return re.fullmatch(f'{{"message_id":"({UUID_RE})"}}', r.body)[1]  # type: ignore[index]


def plain(r: Reply, status: int, body: str) -> None:
    """An error as hq answers one: the status, the reason as plain text."""
    assert (r.status, r.body) == (status, body), r
    assert r.headers["content-type"] == "text/plain; charset=utf-8"


# -- hq's README, replayed ----------------------------------------------------------------


def test_the_readme_session_byte_for_byte(hq):
    name = fresh("myqueue")
    created = hq("POST", f"/queues?name={name}&max_attempts=5&visibility_timeout_seconds=30")
    assert (created.status, created.body) == (200, "")
    sent = hq("POST", f"/queues/{name}/enqueue", "-H", "Content-type: application/json", "-d", '{"a":1, "b":2}')
    assert sent.status == 200 and sent.headers["content-type"] == "application/json"
    message_id = re.fullmatch(f'{{"message_id":"({UUID_RE})"}}', sent.body)[1]  # type: ignore[index]
    got = hq("GET", f"/queues/{name}/receive")
    assert got.status == 200 and got.headers["content-type"] == "application/json"
    assert got.body == f'{{"id":"{message_id}","args":{{"a":1,"b":2}},"queue":"{name}","attempts":1}}'


def test_args_come_back_as_hqs_serde_json_writes_them(hq):
    name = make_queue(hq)
    enqueue(hq, name, '{"z": [3, {"y": 1.5, "x": null}], "a": "ü"}')
    got = hq("GET", f"/queues/{name}/receive")
    assert '"args":{"a":"ü","z":[3,{"x":null,"y":1.5}]}' in got.body
    enqueue(hq, name, "42")
    assert '"args":42,' in hq("GET", f"/queues/{name}/receive").body


# -- queues ------------------------------------------------------------------------------


def test_queue_metadata_update_listing_and_delete(hq):
    name = make_queue(hq, 5, 30)
    shown = hq("GET", f"/queues/{name}")
    assert shown.status == 200
    assert re.fullmatch(f'{{"name":"{name}","max_attempts":5,"visibility_timeout_seconds":30,'
                        f'"inserted_at":"{TIME_RE}","updated_at":"{TIME_RE}"}}', shown.body), shown.body
    assert (hq("PUT", f"/queues/{name}?max_attempts=7").status, hq("PUT", f"/queues/{name}").status) == (200, 200)
    r = hq("PUT", f"/queues/{name}?visibility_timeout_seconds=45")
    assert (r.status, r.body) == (200, "")
    assert '"max_attempts":7,"visibility_timeout_seconds":45,' in hq("GET", f"/queues/{name}").body
    listed = hq("GET", "/queues")
    assert listed.status == 200 and f'{{"name":"{name}","max_attempts":7,' in listed.body
    names = re.findall(r'"name":"([^"]+)"', listed.body)
    assert names == sorted(names)
    assert (hq("DELETE", f"/queues/{name}").status, hq("GET", f"/queues/{name}").body) == (200, "null")
    # as in hq: what does not exist is no error
    assert [hq(m, f"/queues/{fresh()}").status for m in ("DELETE", "PUT")] == [200, 200]
    assert hq("GET", f"/queues/{fresh()}").body == "null"
    assert hq("GET", f"/queues/{fresh()}/receive").body == "null"
    assert hq("GET", f"/queues/{name}/").body == "null"  # a trailing slash is trimmed, as hq does


def test_an_hq_queue_is_a_conveyor_queue(hq):
    name = make_queue(hq, 3, 20)
    r = curl(hq.server.url + f"/v1/queues/{name}", "-H", "Authorization: x")
    assert r.status == 200
    assert '"visibility_timeout":20' in r.body and '"max_receive_count":3' in r.body
    enqueue(hq, name)
    rest = curl(hq.server.url + f"/v1/queues/{name}/messages", "-H", "Authorization: x")
    assert '"message":{"a":1, "b":2}' in rest.body and '"receive_count":1' in rest.body  # the body as sent
    # a queue made elsewhere, without a receive limit, shows hq's "not set" (-1)
    other = fresh()
    curl("-XPOST", hq.server.url + "/v1/queues", "-H", "Authorization: x", "-d", f'{{"name":"{other}"}}')
    assert f'"name":"{other}","max_attempts":-1,' in hq("GET", f"/queues/{other}").body


# -- deliveries --------------------------------------------------------------------------


def test_a_message_comes_back_after_its_visibility_timeout(hq):
    name = make_queue(hq, 5, 1)
    message_id = enqueue(hq, name)
    assert '"attempts":1}' in hq("GET", f"/queues/{name}/receive").body
    assert hq("GET", f"/queues/{name}/receive").body == "null"  # locked
    time.sleep(1.2)
    again = hq("GET", f"/queues/{name}/receive").body
    assert again.startswith(f'{{"id":"{message_id}"') and again.endswith('"attempts":2}')


def test_complete_and_fail_only_by_the_consumer_holding_the_delivery(hq):
    name = make_queue(hq, 5, 1)
    message_id = enqueue(hq, name)
    locked = f"Error: message {message_id} is not locked by this consumer: it was not received, or its " \
             "visibility timeout ran out, or another consumer has received it since"
    plain(hq("PUT", f"/messages/{message_id}/complete"), 409, locked)  # nobody received it
    first = hq("GET", f"/queues/{name}/receive").headers["x-conveyor-receipt"]
    time.sleep(1.2)
    plain(hq("PUT", f"/messages/{message_id}/fail"), 409, locked)  # its lock ran out
    second = hq("GET", f"/queues/{name}/receive").headers["x-conveyor-receipt"]
    # the first consumer, whose delivery is over, is refused; the second one is not
    plain(hq("PUT", f"/messages/{message_id}/complete?receipt={first}"), 409, locked)
    plain(hq("PUT", f"/messages/{message_id}/fail?receipt={first}"), 409, locked)
    r = hq("PUT", f"/messages/{message_id}/complete?receipt={second}")
    assert (r.status, r.body) == (200, "")
    gone = f"Error: message {message_id} does not exist, or was already completed or failed"
    plain(hq("PUT", f"/messages/{message_id}/complete?receipt={second}"), 404, gone)
    plain(hq("PUT", f"/messages/{message_id}/fail"), 404, gone)
    assert _archived(hq, message_id) == ("completed", 2)


def test_a_receipt_of_another_message_is_refused(hq):
    name = make_queue(hq)
    one, two = enqueue(hq, name), enqueue(hq, name)
    receipt = hq("GET", f"/queues/{name}/receive").headers["x-conveyor-receipt"]
    hq("GET", f"/queues/{name}/receive")
    r = hq("PUT", f"/messages/{two}/complete?receipt={receipt}")
    assert r.status == 400 and r.body.startswith("Error: invalid receipt")
    assert hq("PUT", f"/messages/{one}/complete").status == 200  # by id alone while it is locked
    assert hq("PUT", f"/messages/{two}/fail").status == 200


def test_fail_ends_a_message_as_failed(hq):
    name = make_queue(hq)
    message_id = enqueue(hq, name)
    hq("GET", f"/queues/{name}/receive")
    assert (hq("PUT", f"/messages/{message_id}/fail").status, hq("GET", f"/queues/{name}/receive").body) == (200, "null")
    assert _archived(hq, message_id) == ("failed", 1)


def test_max_attempts_then_the_message_is_failed(hq):
    name = make_queue(hq, 2, 1)
    message_id = enqueue(hq, name)
    for attempt in (1, 2):
        assert hq("GET", f"/queues/{name}/receive").body.endswith(f'"attempts":{attempt}}}')
        time.sleep(1.2)
    assert hq("GET", f"/queues/{name}/receive").body == "null"
    assert _archived(hq, message_id) == ("failed", 2)


def _archived(hq: Hq, message_id: str) -> tuple[str, int] | None:
    with psycopg.connect(hq.server.env["DATABASE_URL"]) as conn:
        row = conn.execute("SELECT outcome, receive_count FROM conveyor.archive WHERE message_uuid = %s",
                           (message_id,)).fetchone()
    return None if row is None else (row[0], row[1])


# -- bad input ---------------------------------------------------------------------------


def test_bad_input_gets_hqs_errors_never_a_500(hq, tmp_path):
    name = make_queue(hq)
    plain(hq("POST", "/queues?max_attempts=1&visibility_timeout_seconds=1"), 400,
          "Failed to deserialize query string: missing field `name`")
    plain(hq("POST", f"/queues?name={fresh()}&max_attempts=1"), 400,
          "Failed to deserialize query string: missing field `visibility_timeout_seconds`")
    plain(hq("POST", f"/queues?name={fresh()}&max_attempts=x&visibility_timeout_seconds=1"), 400,
          "Failed to deserialize query string: max_attempts: invalid digit found in string")
    plain(hq("POST", f"/queues?name={fresh()}&max_attempts=99999999999999999999&visibility_timeout_seconds=1"), 400,
          "Failed to deserialize query string: max_attempts: number too large to fit in target type")
    plain(hq("POST", f"/queues?name={fresh()}&max_attempts=0&visibility_timeout_seconds=1"), 422,
          "max_attempts must be >= 1")
    plain(hq("POST", f"/queues?name={fresh()}&max_attempts=1&visibility_timeout_seconds=0"), 422,
          "visibility_timeout_seconds must be >= 1")
    plain(hq("POST", f"/queues?name={fresh()}&max_attempts=1001&visibility_timeout_seconds=1"), 422,
          "max_attempts must be <= 1000")
    plain(hq("PUT", f"/queues/{name}?visibility_timeout_seconds=-3"), 422, "visibility_timeout_seconds must be >= 1")
    plain(hq("PUT", f"/queues/{name}?max_attempts="), 400,
          "Failed to deserialize query string: max_attempts: cannot parse integer from empty string")
    plain(hq("POST", f"/queues?name={name}&max_attempts=5&visibility_timeout_seconds=30"), 409,
          "Error: queue name must be unique")
    r = hq("POST", "/queues?name=bad%20name!&max_attempts=1&visibility_timeout_seconds=1")
    assert r.status == 422 and r.body.startswith("Error: ")
    r = hq("POST", f"/queues/{name}/enqueue", "-d", '{"a":')
    assert r.status == 400 and r.body.startswith("Failed to parse the request body as JSON: ")
    assert hq("POST", f"/queues/{name}/enqueue", "--data-binary", "@/dev/null").status == 400
    r = hq("POST", f"/queues/{fresh()}/enqueue", "-d", "{}")
    assert r.status == 404 and r.body.startswith("Error: queue")
    plain(hq("PUT", "/messages/not-a-uuid/complete"), 400,
          "Invalid URL: UUID parsing failed: 'not-a-uuid' is not a UUID")
    unknown = uuid.uuid4()
    plain(hq("PUT", f"/messages/{unknown}/fail"), 404,
          f"Error: message {unknown} does not exist, or was already completed or failed")
    assert (hq("GET", "/nowhere").status, hq("GET", "/nowhere").body) == (404, "")
    assert hq("PATCH", f"/queues/{name}").status == 405
    big = tmp_path / "big.json"
    big.write_text('"' + "x" * 1_100_000 + '"')  # over the queue's 1 MiB max_message_size
    r = hq("POST", f"/queues/{name}/enqueue", "--data-binary", f"@{big}")
    assert r.status == 413 and r.headers["content-type"] == "text/plain; charset=utf-8"


def test_health_and_metrics_on_every_port(hq_server):
    port = hq_server.env["CONVEYOR_HQ_PORT"]
    for path in ("/livez", "/readyz", "/metrics"):
        assert curl(f"http://127.0.0.1:{port}{path}").status == 200
    # and the hq port is hq's only: REST is not at its root
    assert curl(f"http://127.0.0.1:{port}/v1/queues").status == 404


# -- authentication ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def token_server(module_dsn) -> Iterator[ServerProcess]:
    proc = ServerProcess(module_dsn, env={"CONVEYOR_AUTH": "token", "CONVEYOR_HQ_PORT": str(free_port()),
                                          "CONVEYOR_AUTH_TOKENS": "hq-admin:admin,hq-reader:read"})
    yield proc.start()
    proc.kill()


@pytest.mark.parametrize("where", ["hq-port", "prefix"])
def test_token_mode_covers_both_ways_in(token_server, where):
    base = f"http://127.0.0.1:{token_server.env['CONVEYOR_HQ_PORT']}" if where == "hq-port" \
        else token_server.url + "/hq"
    name = fresh()
    create = ["-XPOST", f"{base}/queues?name={name}&max_attempts=2&visibility_timeout_seconds=5"]
    for auth in ([], ["-H", "Authorization: Bearer wrong"], ["-H", "Authorization: hq-admin"]):
        r = curl(*create, *auth)
        assert r.status == 401 and '"code":"Unauthorized"' in r.body
    assert curl(f"{base}/queues").status == 401
    r = curl(*create, "-H", "Authorization: Bearer hq-reader")  # a reader may look, not create
    plain(r, 403, "Error: this needs the admin role; the caller has read")
    assert curl(f"{base}/queues", "-H", "Authorization: Bearer hq-reader").status == 200
    assert curl(*create, "-H", "Authorization: Bearer hq-admin").status == 200


def test_without_the_hq_dialect_the_message_routes_say_how_to_get_it(dsn):
    """A server without --hq-port serves /hq, but has not installed hq's dialect."""
    proc = ServerProcess(dsn, env={"CONVEYOR_AUTH": "none"}).start()
    try:
        r = curl("-XPUT", f"{proc.url}/hq/messages/{uuid.uuid4()}/complete")
        assert r.status == 503 and "CONVEYOR_DIALECTS=hq" in r.body
    finally:
        proc.kill()
