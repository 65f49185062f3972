"""A real ``conveyor serve`` child process for end-to-end tests."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

# Ports for test servers: below the kernel's ephemeral range (32768-60999, where clients'
# own ends and bind(0) land) and below the embedded clusters' 20000-32767, a slice of its
# own for each xdist worker, handed out in turn. Two workers asking the kernel for "any
# free port" could be given the same one while neither server listened yet; the second
# test then talked to the first test's server (a 404 for its queue, seen in CI).
PORT_BASE, PORT_SLICE = 10000, 1000
_turn = itertools.count()


def _worker_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker[2:]) if worker[2:].isdigit() else 0


def free_port() -> int:
    """A loopback port free now, the next of this worker's slice (so a server's hq port and
    its own port, picked one after the other, differ; a port comes round again only after
    the slice's other 999)."""
    first = PORT_BASE + (_worker_index() % 10) * PORT_SLICE
    for _ in range(PORT_SLICE):
        port = first + next(_turn) % PORT_SLICE
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port left in {first}-{first + PORT_SLICE - 1}")


def _parents() -> dict[int, int]:
    """Every process's parent (Linux /proc)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # "pid (comm) state ppid ...": comm may hold spaces, so split after its ")"
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
    return parents


def children(pid: int) -> set[int]:
    """The processes whose parent is pid."""
    return {child for child, parent in _parents().items() if parent == pid}


def _process_tree(root: int) -> set[int]:
    """root and its descendants."""
    parents = _parents()
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, ppid in parents.items() if ppid in tree} - tree
        tree |= more
        grew = bool(more)
    return tree


def listens_on(root: int, port: int) -> bool:
    """Whether a process of root's tree holds the socket listening on 127.0.0.1:port."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    inodes.add(f"socket:[{fields[9]}]")
    for pid in _process_tree(root):
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in inodes:
                        return True
    return False


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
                    if not listens_on(self.proc.pid, self.port):  # another process's server answered
                        self.kill()
                        raise RuntimeError(f"port {self.port} is another process's: {self.output()}")
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
