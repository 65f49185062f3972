"""A real Celery worker on kombu's SQS transport, with Conveyor as the SQS service.

The worker is a child process (``celery -A celery_app worker --pool=solo``) using the app
in ``celery_app.py``; this process sends tasks with ``.delay()`` through its own instance
of the same app. There is no result backend: each task appends JSON lines to a file it is
given, and the tests read that file. The worker receives through kombu's asynchronous HTTP
client (pycurl since kombu 5.6, urllib3 in 5.5), signing JSON-protocol requests with
botocore, and acknowledges (DeleteMessage) through boto3 once a task has finished.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from support.server import ServerProcess

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
WAIT = 30.0  # seconds allowed for any one effect of the worker


def load_celery_app_module() -> Any:
    """``celery_app.py`` under a private module name (the worker imports it as ``celery_app``)."""
    spec = importlib.util.spec_from_file_location("conveyor_tests_celery_app", HERE / "celery_app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


celery_app = load_celery_app_module()


class Worker:
    """``celery worker`` as a child process, its output in a log file."""

    def __init__(self, endpoint: str, prefix: str, log: Path) -> None:
        self.log = log
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update({
            celery_app.ENDPOINT_ENV: endpoint,
            celery_app.PREFIX_ENV: prefix,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
            "AWS_EC2_METADATA_DISABLED": "true",
            "HOME": str(log.parent),
        })
        cmd = [sys.executable, "-m", "celery", "-A", "celery_app", "worker",
               "--pool=solo", "-c", "1", "-Q", "celery", "-n", f"{prefix}@localhost",
               "--without-mingle", "--without-gossip", "--without-heartbeat", "-l", "info"]
        self._out = log.open("wb")
        self.proc = subprocess.Popen(cmd, env=env, cwd=log.parent, stdin=subprocess.DEVNULL,
                                     stdout=self._out, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = WAIT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if " ready." in self.output():
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited with {self.proc.returncode}:\n{self.output()}")
            time.sleep(0.1)
        raise AssertionError(f"worker not ready in {timeout}s:\n{self.output()}")

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM (a warm shutdown), then SIGKILL; the exit code, or None if it had to be killed."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    return self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
                    return None
            return self.proc.returncode
        finally:
            self._out.close()


@pytest.fixture(scope="module")
def prefix() -> str:
    return f"cel-{uuid.uuid4().hex[:10]}-"


@pytest.fixture(scope="module")
def worker(server: ServerProcess, prefix: str,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    w = Worker(server.url, prefix, tmp_path_factory.mktemp("celery-worker") / "worker.log")
    try:
        w.wait_ready()
        yield w
    finally:
        code = w.stop()
    out = w.output()
    assert code == 0, f"worker did not exit cleanly on SIGTERM (exit {code}):\n{out}"
    assert "Traceback" not in out, out


@pytest.fixture(scope="module")
def app(server: ServerProcess, prefix: str) -> Iterator[Any]:
    """The sending side: the same tasks, in this process."""
    a = celery_app.create_app(server.url, prefix)
    yield a
    a.close()


@pytest.fixture(scope="module")
def boto_sqs(server: ServerProcess) -> Iterator[Any]:
    client = boto3.client("sqs", endpoint_url=server.url, region_name="us-east-1",
                          aws_access_key_id="x", aws_secret_access_key="y")
    yield client
    client.close()


def read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for(what: str, check: Callable[[], bool], worker: Worker, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if worker.proc.poll() is not None:
            raise AssertionError(f"worker exited with {worker.proc.returncode} while waiting "
                                 f"for {what}:\n{worker.output()}")
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\nworker log:\n{worker.output()}")


def queue_counts(boto_sqs: Any, url: str) -> dict[str, int]:
    attrs = boto_sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages",
                                      "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    return {k: int(v) for k, v in attrs.items()}


def assert_queue_drains(boto_sqs: Any, server: ServerProcess, prefix: str, worker: Worker) -> None:
    """The worker's queue ends empty: every message was deleted, none is in flight."""
    url = boto_sqs.get_queue_url(QueueName=f"{prefix}celery")["QueueUrl"]
    assert url == f"{server.url}/000000000000/{prefix}celery"
    empty = {"ApproximateNumberOfMessages": 0, "ApproximateNumberOfMessagesNotVisible": 0}
    wait_for(f"{url} to be empty", lambda: queue_counts(boto_sqs, url) == empty, worker, timeout=10)


def test_tasks_run_end_to_end(worker: Worker, app: Any, boto_sqs: Any, server: ServerProcess,
                              prefix: str, tmp_path: Path) -> None:
    out = tmp_path / "record.jsonl"
    values = [0, "text ✓", {"nested": [1, 2.5, None]}, [True, False], "x" * 10_000]
    for value in values:
        app.tasks["conveyor_e2e.record"].delay(str(out), value)

    wait_for(f"{len(values)} tasks", lambda: len(read_lines(out)) >= len(values), worker)
    lines = read_lines(out)
    assert len(lines) == len(values), lines  # each task ran exactly once
    assert sorted(json.dumps(line["value"]) for line in lines) == sorted(json.dumps(v) for v in values)
    assert {line["pid"] for line in lines} == {worker.proc.pid}  # in the worker, not here

    assert_queue_drains(boto_sqs, server, prefix, worker)
    log = worker.output()
    assert log.count("conveyor_e2e.record[") >= 2 * len(values)  # received + succeeded
    assert "ERROR/" not in log, log


def test_retry_then_success(worker: Worker, app: Any, boto_sqs: Any, server: ServerProcess,
                            prefix: str, tmp_path: Path) -> None:
    out = tmp_path / "flaky.jsonl"
    result = app.tasks["conveyor_e2e.flaky"].delay(str(out), "k1")

    wait_for("the retried task to succeed", lambda: any(line.get("done") for line in read_lines(out)),
             worker)
    lines = read_lines(out)
    attempts = [line for line in lines if "attempt" in line]
    assert [a["attempt"] for a in attempts] == [0, 1], lines
    # The retry was a new message delivered no earlier than its countdown (1 s).
    assert attempts[1]["at"] - attempts[0]["at"] >= 0.9, attempts
    assert [line for line in lines if line.get("done")] == [lines[-1]]

    assert_queue_drains(boto_sqs, server, prefix, worker)
    log = worker.output()
    assert f"conveyor_e2e.flaky[{result.id}] retry: Retry in 1s" in log, log
    assert f"conveyor_e2e.flaky[{result.id}] succeeded" in log, log
