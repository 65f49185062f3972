"""``conveyor serve`` with a wrong DATABASE_URL: the cause at once, nothing announced, no traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from conftest import ADMIN_DSN, dsn_for
from support.server import free_port


def _serve(database_url: str, **env: str) -> tuple[int, str, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "conveyor", "serve", "--port", str(free_port())],
                          env={**os.environ, "DATABASE_URL": database_url, **env},
                          capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


@pytest.mark.parametrize(("url", "words"), [
    (dsn_for("conveyor_no_such_db").replace("user=postgres", "user=postgres password=s3cret"),
     'database "conveyor_no_such_db" does not exist'),
    ("postgres//oops", "malformed database URL"),
])
def test_a_wrong_url_fails_at_once_with_its_cause(url, words):
    code, out, took = _serve(url)
    assert code != 0 and took < 20
    assert words in out and "cannot connect to the database at" in out
    assert "s3cret" not in out and "Traceback" not in out and "serving on" not in out


def test_a_refusing_database_is_waited_for_saying_so():
    url = ADMIN_DSN.replace("5432", str(free_port()))
    code, out, _ = _serve(url, CONVEYOR_DATABASE_WAIT="1.5")
    assert code != 0
    assert "waiting for the database" in out and "Connection refused" in out and "did not answer within 1.5s" in out
    assert "Traceback" not in out and "serving on" not in out


def test_a_taken_port_is_said_at_once_and_nothing_announced(dsn):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "conveyor", "serve", "--port", str(port)],
                              env={**os.environ, "DATABASE_URL": dsn}, capture_output=True, text=True, timeout=60)
    out = done.stdout + done.stderr
    assert done.returncode != 0 and time.monotonic() - started < 20
    assert f"127.0.0.1:{port} is already in use" in out and "CONVEYOR_PORT" in out
    assert "serving on" not in out and "Traceback" not in out and "Errno" not in out


def test_the_test_harness_does_not_take_another_servers_answer_for_its_own(dsn):
    """ServerProcess waits for /livez; an answer from a server of another process on the
    same port (two test workers given one port) must not pass for its server's."""
    import http.server
    import threading

    from support.server import ServerProcess

    class Live(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    squatter = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Live)
    threading.Thread(target=squatter.serve_forever, daemon=True).start()
    try:
        server = ServerProcess(dsn)
        server.port = squatter.server_address[1]
        server.url = f"http://127.0.0.1:{server.port}"
        server.env["CONVEYOR_PORT"] = str(server.port)
        with pytest.raises(RuntimeError, match="another process"):
            server.start()
        server.kill()
    finally:
        squatter.shutdown()
        squatter.server_close()
