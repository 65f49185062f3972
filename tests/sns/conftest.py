"""SNS fixtures: boto3 SNS clients of both wire protocols, a server whose webhooks may
reach loopback only (and poll fast), and a real local HTTP endpoint that records what it
receives."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from support.server import ServerProcess
from support.sns_clients import ACCOUNT, REGION, sns_client, unique
from support.sqs_clients import client as sqs_client

# loopback only, and fast rounds, so deliveries arrive within a fraction of a second
SERVER_ENV = {"CONVEYOR_WEBHOOK_ALLOW": "127.0.0.1/32", "CONVEYOR_WEBHOOK_POLL": "0.1",
              "CONVEYOR_WEBHOOK_TIMEOUT": "2"}


# -- the server and clients ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(module_dsn: str) -> Iterator[ServerProcess]:
    proc = ServerProcess(module_dsn, env=SERVER_ENV).start()
    yield proc
    proc.kill()


@pytest.fixture(params=["query", "json"])
def protocol(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def sns(server: ServerProcess, protocol: str) -> Any:
    return sns_client(server.url, protocol)


@pytest.fixture
def sqs(server: ServerProcess) -> Any:
    return sqs_client(server.url, "json")


@pytest.fixture
def make_topic(sns: Any) -> Callable[..., str]:
    def make(suffix: str = "", **attributes: str) -> str:
        return sns.create_topic(Name=unique() + suffix, Attributes=attributes)["TopicArn"]
    return make


@pytest.fixture
def make_queue(sqs: Any) -> Callable[..., tuple[str, str]]:
    """A new SQS queue: (url, arn)."""
    def make(suffix: str = "", **attributes: str) -> tuple[str, str]:
        name = unique("q") + suffix
        url = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
        return url, f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}"
    return make


# -- a webhook endpoint -------------------------------------------------------------------------

@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: str
    at: float


@dataclass
class Endpoint:
    """A real HTTP server on loopback that records each POST and answers with the next
    status of ``statuses`` (then 200)."""

    url: str
    received: list[Received] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def wait_for(self, count: int, timeout: float = 10.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.received) >= count:
                    return list(self.received)
            time.sleep(0.02)
        with self.lock:
            raise AssertionError(f"expected {count} requests, got {len(self.received)}")


def _handler(endpoint: Endpoint) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
            with endpoint.lock:
                endpoint.received.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()},
                                                  body, time.monotonic()))
                status = endpoint.statuses.pop(0) if endpoint.statuses else 200
            answer = b"ok" if status < 300 else b"try again later"
            self.send_response(status)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    holder = Endpoint(url="")
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(holder))
    holder.url = f"http://127.0.0.1:{httpd.server_address[1]}/hook"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield holder
    httpd.shutdown()
    httpd.server_close()
