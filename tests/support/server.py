"""A real ``conveyor serve`` child process for end-to-end tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx

_GIVEN: set[int] = set()


def free_port() -> int:
    """A loopback port free now and not handed out before by this process: the kernel may
    give a port just released again, and a server's hq port and its own port must differ."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


class ServerProcess:
    """``conveyor serve`` as a child process on a free loopback port."""

    def __init__(self, database_url: str, *, env: dict[str, str] | None = None,
                 args: list[str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "DATABASE_URL": database_url, "CONVEYOR_PORT": str(self.port),
                    "CONVEYOR_HOST": "127.0.0.1", "CONVEYOR_LOG_LEVEL": "warning",
                    # one process unless a test asks for more (--workers): counters, logs and
                    # in-process state are then those of the one server the test talks to
                    "CONVEYOR_WORKERS": "1", **(env or {})}
        self.args = args or []
        self.proc: subprocess.Popen[bytes] | None = None
        # a file, not a pipe: a pipe nobody reads fills up (64 KiB of logged errors) and
        # then blocks the server's next log line, and with it the server
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as this object

    def start(self, timeout: float = 30.0) -> ServerProcess:
        self.proc = subprocess.Popen([sys.executable, "-m", "conveyor", "serve", *self.args],
                                     env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early: {self.output()}")
            try:
                if httpx.get(self.url + "/livez", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"server did not start in {timeout}s: {self.output()}")

    def output(self) -> str:
        """What the server has printed so far (logs go to stdout and stderr)."""
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def terminate(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def client(self, **kwargs: object) -> httpx.Client:
        headers = {"Authorization": "test"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, **kwargs)
