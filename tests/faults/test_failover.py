"""PostgreSQL failover: the primary of a pg_auto_failover formation is killed under load;
``conveyor serve``, given the formation's multi-host URL, follows the new primary by
itself and every acknowledged message is stored exactly once (the failover spool is
off: sends fail with 503 until the new primary answers).

No mocks: a real formation (Debian's ``postgresql-15-auto-failover``, installed by
``.ci/run``) of a monitor, a primary and a synchronous secondary, each a ``pg_autoctl``
service on a free loopback port, in a directory directly under /tmp. pg_autoctl refuses
to run as root, so as root it runs as ``postgres`` (whose name is then also the
PostgreSQL superuser's); as anyone else it runs as that user.

Only the monitor's failure detection is shortened (health checks every second, a node
unhealthy after 2 s, the old primary given 1 s to demote itself); with pg_auto_failover's
defaults the same switch takes about 30 s longer (docs/operations.md, "PostgreSQL
failover"). The figures this test measures are printed (``pytest -s``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import conninfo

from conveyor import types
from conveyor.core import messages, queues
from conveyor.db import migrate, pool
from conveyor.db.embedded import EmbeddedError, find_binaries
from support.server import ServerProcess, free_port

pytestmark = pytest.mark.slow

INSTALL_HINT = ("pg_auto_failover is not installed for the PostgreSQL server "
                "(apt-get install -y postgresql-15-auto-failover; .ci/run does)")
NODES = ("node1", "node2")  # node1 is created first, so it starts as the primary
DATABASE = "conveyor"
QUEUE = "failover"
# The monitor's failure detection, shortened so that the switch fits a test (ms).
MONITOR_SETTINGS = {
    "pgautofailover.health_check_period": 1000,
    "pgautofailover.health_check_timeout": 1000,
    "pgautofailover.health_check_max_retries": 1,
    "pgautofailover.health_check_retry_delay": 500,
    "pgautofailover.node_considered_unhealthy_timeout": 2000,
    "pgautofailover.startup_grace_period": 2000,
    "pgautofailover.primary_demote_timeout": 1000,
}
FORMATION_TIMEOUT = 60.0  # seconds to build the formation
RECOVERY_TIMEOUT = 45.0  # seconds from the kill to sends that work again
STEADY_AFTER_RECOVERY = 2.0  # seconds of sends that must all work after recovery


# ------------------------------------------------------------------------- formation


def auto_failover_bin() -> Path | None:
    """The server binaries pg_autoctl will drive, if pg_autoctl and its extension are
    installed for them."""
    if shutil.which("pg_autoctl") is None:
        return None
    try:
        bin_dir = find_binaries()
    except EmbeddedError:
        return None
    return bin_dir if (bin_dir.parent / "lib" / "pgautofailover.so").exists() else None


def run_user() -> str:
    """pg_autoctl refuses root: run it as ``postgres`` then."""
    if os.geteuid() == 0:
        return "postgres"
    import pwd
    return pwd.getpwuid(os.geteuid()).pw_name


@dataclass
class Formation:
    base: Path
    bin_dir: Path
    user: str
    ports: dict[str, int] = field(default_factory=dict)
    services: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    # -- running pg_autoctl as the run user, with everything it keeps under ``base``

    def _command(self, *args: str) -> list[str]:
        env = [f"PATH={self.bin_dir}:/usr/bin:/bin", f"HOME={self.base}", "PGHOST=127.0.0.1",
               f"XDG_CONFIG_HOME={self.base / 'xdg/config'}", f"XDG_DATA_HOME={self.base / 'xdg/data'}",
               f"XDG_RUNTIME_DIR={self.base / 'xdg/run'}", "LANG=C.UTF-8"]
        prefix = ["runuser", "-u", self.user, "--"] if os.geteuid() == 0 else []
        return [*prefix, "env", "-i", *env, "pg_autoctl", *args]

    def autoctl(self, *args: str, timeout: float = 30.0) -> str:
        done = subprocess.run(self._command(*args), capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"pg_autoctl {' '.join(args)}: {done.stderr[-2000:]}")
        return done.stdout

    def pgdata(self, name: str) -> Path:
        return self.base / name

    def spawn(self, name: str, *args: str) -> None:
        """``pg_autoctl create <args> --run``: the node's services, in the background."""
        self.ports[name] = free_port()
        log = (self.base / f"{name}.log").open("ab")
        self.services[name] = subprocess.Popen(
            self._command("create", *args, "--pgdata", str(self.pgdata(name)), "--pgport", str(self.ports[name]),
                          "--hostname", "127.0.0.1", "--listen", "127.0.0.1", "--auth", "trust", "--no-ssl",
                          "--run"),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def dsn(self, name: str, dbname: str = DATABASE) -> str:
        return conninfo.make_conninfo(host="127.0.0.1", port=self.ports[name], user=self.user, dbname=dbname,
                                      connect_timeout=2)

    @property
    def monitor_uri(self) -> str:
        return f"postgres://autoctl_node@127.0.0.1:{self.ports['monitor']}/pg_auto_failover?sslmode=disable"

    def uri(self) -> str:
        """The formation's multi-host URL as pg_autoctl prints it (every node, then
        ``target_session_attrs=read-write``), plus the user to log in as."""
        uri = self.autoctl("show", "uri", "--formation", "default", "--pgdata", str(self.pgdata("monitor")))
        return f"{uri.strip()}&user={self.user}"

    def states(self) -> dict[str, tuple[str, str]]:
        """node name -> (reported state, assigned state), as the monitor has them."""
        rows = sql(self.dsn("monitor", "pg_auto_failover"),
                   "SELECT nodename, reportedstate::text, goalstate::text FROM pgautofailover.node")
        return {name: (reported, goal) for name, reported, goal in rows}

    def wait_for(self, what: str, done: Any, timeout: float = FORMATION_TIMEOUT, *,
                 meanwhile: Any = None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(psycopg.Error):
                if done():
                    return
            if meanwhile is not None:
                with contextlib.suppress(psycopg.Error):
                    meanwhile()
            time.sleep(0.3)
        raise AssertionError(f"{what}: not within {timeout}s\n{self.diagnostics()}")

    def kill(self, name: str) -> None:
        """The node dies as with its machine: SIGKILL to its pg_autoctl services and its
        PostgreSQL at once (one process group), so nothing is left to restart it."""
        postmaster = int((self.pgdata(name) / "postmaster.pid").read_text().split()[0])
        os.killpg(self.services[name].pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(postmaster, signal.SIGKILL)  # in case it had a group of its own
        self.services[name].wait(10)

    def teardown(self) -> None:
        for name in reversed(list(self.services)):
            with contextlib.suppress(Exception):
                self.autoctl("stop", "--pgdata", str(self.pgdata(name)), "--immediate", timeout=15)
        for proc in self.services.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        for name in self.services:  # a postmaster that outlived its service
            with contextlib.suppress(OSError, ValueError, IndexError):
                os.kill(int((self.pgdata(name) / "postmaster.pid").read_text().split()[0]), signal.SIGKILL)
        shutil.rmtree(self.base, ignore_errors=True)

    def diagnostics(self) -> str:
        parts = []
        for name in self.services:
            try:
                parts.append(f"--- {name}.log\n{(self.base / f'{name}.log').read_text(errors='replace')[-3000:]}")
            except OSError as exc:
                parts.append(f"--- {name}.log: {exc}")
        return "\n".join(parts)


def sql(dsn: str, query: str, params: tuple[Any, ...] | None = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


def build_formation(formation: Formation) -> None:
    f = formation
    f.spawn("monitor", "monitor")
    f.wait_for("the monitor is up", lambda: sql(f.dsn("monitor", "pg_auto_failover"),
                                               "SELECT 1 FROM pgautofailover.formation"))
    monitor = f.dsn("monitor", "pg_auto_failover")
    for name, value in MONITOR_SETTINGS.items():
        sql(monitor, f"ALTER SYSTEM SET {name} = {int(value)}")
    sql(monitor, "SELECT pg_reload_conf()")
    for node in NODES:
        f.spawn(node, "postgres", "--name", node, "--dbname", DATABASE, "--monitor", f.monitor_uri)
        if node == NODES[0]:
            f.wait_for("the first node runs alone", lambda: f.states().get(NODES[0]) == ("single", "single"))
    # The secondary's pg_basebackup waits for a spread checkpoint (minutes on an idle
    # server): an explicit CHECKPOINT on the primary lets it go on at once.
    f.wait_for("a primary and a secondary",
               lambda: f.states() == {NODES[0]: ("primary", "primary"), NODES[1]: ("secondary", "secondary")},
               meanwhile=lambda: sql(f.dsn(NODES[0], "postgres"), "CHECKPOINT"))
    f.wait_for("synchronous replication",
               lambda: sql(f.dsn(NODES[0], "postgres"),
                           "SELECT current_setting('synchronous_standby_names') <> '' "
                           "AND current_setting('synchronous_commit') = 'on'") == [(True,)])


@pytest.fixture
def formation() -> Iterator[Formation]:
    bin_dir = auto_failover_bin()
    if bin_dir is None:
        if os.environ.get("CONVEYOR_REQUIRE_AUTO_FAILOVER"):  # set by .ci/run: CI must not skip this
            pytest.fail(INSTALL_HINT)
        pytest.skip(INSTALL_HINT)
    user = run_user()
    base = Path(tempfile.mkdtemp(prefix="conveyor-failover-", dir="/tmp"))
    if os.geteuid() == 0:
        shutil.chown(base, user, user)
    (base / "xdg/run").mkdir(parents=True)
    if os.geteuid() == 0:
        for d in (base / "xdg", base / "xdg/run"):
            shutil.chown(d, user, user)
    f = Formation(base, bin_dir, user)
    try:
        build_formation(f)
        yield f
    finally:
        f.teardown()


# ------------------------------------------------------------------------------ load


@dataclass
class Outcome:
    body: str
    started: float
    ended: float
    id: int | None = None  # set when the send was acknowledged (201)
    error: str | None = None  # HTTP status or exception name otherwise


async def send_load(url: str, stop: asyncio.Event, outcomes: list[Outcome], clients: int = 8,
                    per_second: float = 50.0, max_per_client: int = 3000) -> None:
    """Concurrent REST sends, each with a body of its own, until ``stop`` (bounded in
    count, and paced below what the machine's PostgreSQL takes). A failed send is not
    retried: its body is simply never acknowledged."""

    async def client(n: int) -> None:
        # longer than the server's 10 s wait for a pooled connection: the answer, not a
        # client-side timeout, decides whether a send was acknowledged
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": "t"}, timeout=20) as c:
            for i in range(max_per_client):
                if stop.is_set():
                    return
                outcome = Outcome(f"{n}-{i}", time.monotonic(), 0.0)
                try:
                    r = await c.post(f"/v1/queues/{QUEUE}/messages", json={"message": outcome.body})
                except httpx.HTTPError as exc:
                    outcome.error = type(exc).__name__
                else:
                    if r.status_code == 201:
                        outcome.id = r.json()["id"]
                    else:
                        outcome.error = str(r.status_code)
                outcome.ended = time.monotonic()
                outcomes.append(outcome)
                await asyncio.sleep(max(0.05 if outcome.error else 0.0,
                                        outcome.started + 1 / per_second - outcome.ended))

    await asyncio.gather(*(client(n) for n in range(clients)))


def recovered_at(outcomes: list[Outcome], after: float) -> float | None:
    """When sends worked again for good: the end of the first acknowledged send that
    started after the last failure (None: none failed after ``after``)."""
    failures = [o.ended for o in outcomes if o.error is not None and o.ended >= after]
    if not failures:
        return None
    later = [o.ended for o in outcomes if o.id is not None and o.started >= max(failures)]
    return min(later) if later else None


def sends_after(outcomes: list[Outcome], killed: float) -> str:
    """What the sends did from the kill on, for a failure's message: counts, and each
    failure's and the acknowledged sends' times (seconds after the kill)."""
    after = sorted((o for o in outcomes if o.ended >= killed), key=lambda o: o.ended)
    failed = [o for o in after if o.error is not None]
    acked = [o for o in after if o.id is not None]
    lines = [f"--- sends ending after the kill: {len(acked)} acknowledged, {len(failed)} failed "
             f"({dict(collections.Counter(o.error for o in failed))})"]
    lines += [f"  failed: started {o.started - killed:+.2f}s, ended {o.ended - killed:+.2f}s: {o.error}"
              for o in failed[:20]]
    if acked:
        lines.append(f"  acknowledged: first ended {acked[0].ended - killed:+.2f}s, last ended "
                     f"{acked[-1].ended - killed:+.2f}s; slowest {max(o.ended - o.started for o in acked):.2f}s")
    return "\n".join(lines)


async def stored(dsn: str) -> list[types.Message]:
    found: list[types.Message] = []
    async with pool.connect(dsn) as conn:
        while batch := await messages.peek(conn, QUEUE, qty=5000, after_id=found[-1].id if found else 0):
            found.extend(batch)
    return found


# ------------------------------------------------------------------------------ test


async def test_primary_killed_under_load_server_follows_and_loses_nothing(formation):
    url = formation.uri()
    hosts = conninfo.conninfo_to_dict(url)
    assert hosts["target_session_attrs"] == "read-write" and "," in str(hosts["host"]), url
    async with pool.connect(url) as conn:  # the multi-host URL finds the primary, node1
        await migrate.migrate(conn)
        await queues.create(conn, QUEUE)
    server = ServerProcess(url).start()
    outcomes: list[Outcome] = []
    stop = asyncio.Event()
    load = asyncio.create_task(send_load(server.url, stop, outcomes))
    try:
        for _ in range(100):  # the load is running before the kill
            if sum(o.id is not None for o in outcomes) >= 300:
                break
            await asyncio.sleep(0.05)
        killed = time.monotonic()
        await asyncio.to_thread(formation.kill, NODES[0])
        promoted = None
        while time.monotonic() - killed < RECOVERY_TIMEOUT:
            if promoted is None and await asyncio.to_thread(
                    lambda: formation.states()[NODES[1]][0] in ("wait_primary", "primary")):
                promoted = time.monotonic()
            back = recovered_at(outcomes, killed)
            # steady for a while, and for as many sends as the test counts after the recovery
            # (a busy machine sends fewer a second); bounded by RECOVERY_TIMEOUT all the same
            if promoted is not None and back is not None and time.monotonic() - back > STEADY_AFTER_RECOVERY \
                    and sum(o.id is not None and o.started > back for o in outcomes) > 100:
                break
            await asyncio.sleep(0.2)
        stop.set()
        await asyncio.wait_for(load, 30)
    finally:
        stop.set()
        server.kill()
    back = recovered_at(outcomes, killed)
    context = f"\n{sends_after(outcomes, killed)}\n--- server\n{server.output()[-8000:]}\n{formation.diagnostics()}"
    assert promoted is not None, f"pg_auto_failover promoted {NODES[1]}{context}"
    assert back is not None, f"sends failed after the kill and worked again within {RECOVERY_TIMEOUT}s{context}"
    failed = [o for o in outcomes if o.error is not None]
    acked = [o for o in outcomes if o.id is not None]
    assert all(o.error in ("503",) for o in failed), \
        f"failed sends answered 503, nothing else: {collections.Counter(o.error for o in failed)}{context}"
    assert sum(o.started > back for o in acked) > 100, "the load went on after the recovery"
    assert failed, "sends failed during the switch"

    # on the new primary, node2 (node1 is dead: nothing can be read from it by mistake)
    with pytest.raises(psycopg.OperationalError):
        sql(formation.dsn(NODES[0]), "SELECT 1")
    assert sql(formation.dsn(NODES[1]), "SELECT pg_is_in_recovery()") == [(False,)]
    rows = await stored(formation.dsn(NODES[1]))
    count = collections.Counter(m.body for m in rows)
    by_body = {m.body: m for m in rows}
    lost = [o.body for o in acked if count[o.body] == 0]
    twice = [o.body for o in acked if count[o.body] > 1]
    assert not lost, f"{len(lost)} acknowledged messages lost: {lost[:10]}"
    assert not twice, (f"{len(twice)} acknowledged messages stored more than once: "
                       f"{[(o, [(m.id, m.message_uuid, m.sent_at) for m in rows if m.body == o.body]) for o in acked if o.body in twice[:5]]}"
                       f" (killed at {killed})")
    assert all(by_body[o.body].id == o.id for o in acked), "each under its acknowledged id"
    sent = {o.body for o in outcomes}
    assert set(count) <= sent, "nothing stored that was not sent"
    in_doubt = len(rows) - len(acked)  # failed sends that had committed all the same
    assert 0 <= in_doubt <= len(failed)
    window = (f"failures from {min(o.ended for o in failed) - killed:.1f}s to "
              f"{max(o.ended for o in failed) - killed:.1f}s after the kill; " if failed else "")
    print(f"\nfailover figures: {len(acked)} sends acknowledged, {len(failed)} failed "
          f"({dict(collections.Counter(o.error for o in failed))}), {in_doubt} of the failed stored; "
          f"primary killed -> {NODES[1]} promoted in {promoted - killed:.1f}s, "
          f"sends working again in {back - killed:.1f}s ({window}"
          f"slowest acknowledged send {max(o.ended - o.started for o in acked):.1f}s)")
