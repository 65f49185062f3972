"""A private PostgreSQL cluster for ``conveyor serve`` when no DATABASE_URL is given.

Conveyor keeps all of its state in PostgreSQL. So that a first run needs no
database administration, Conveyor can run its own cluster in a data directory
it owns: initialised on first start, reused on later starts, stopped cleanly
on exit. The cluster listens only on 127.0.0.1 (never on 5432, which belongs
to any system PostgreSQL) and its unix socket lives inside the data directory,
so it cannot collide with another cluster on the machine.

Layout of the data directory (see :func:`default_data_dir`)::

    pgdata/         the cluster (owned by the run user, see below)
    sock/           unix socket directory (owned by the run user)
    credentials     superuser password of role ``conveyor`` (0600, generated once)
    port            the TCP port chosen on first start (reused while it is free)
    owner.lock      flock()ed by the process that owns the running cluster
    postgres.log    server log (written by the run user)

Running as root: ``initdb`` and ``postgres`` refuse to run as root, so the
cluster runs as the system user ``postgres`` if it exists, else ``nobody``.
That user must be able to traverse every parent of the data directory; the
data directory itself is then mode 0710 with the run user's group (instead of
0700), so that user can reach ``pgdata``/``sock``/``postgres.log`` but can
neither list the directory nor read ``credentials``.

Ownership: several Conveyor processes may point at the same data directory
(e.g. ``conveyor serve`` plus a CLI command). Exactly one of them *owns* the
cluster and stops it on exit; the others just use it:

* ``start()`` tries a non-blocking exclusive ``flock`` on ``owner.lock``.
  Whoever gets it owns the cluster (initialising and starting it if needed)
  and keeps the lock open for as long as it owns it; ``stop()`` stops the
  cluster and releases the lock.
* If the cluster is already running and the lock can be taken, the previous
  owner is gone (it crashed or was killed without stopping the cluster): the
  new object *adopts* the cluster and will stop it.
* If the lock is held by another live process, the object only uses the
  cluster; its ``stop()`` is a no-op. If the cluster is not running yet (the
  owner is still starting it), ``start()`` waits for it, bounded.

flock locks belong to an open file description, so two objects in the same
process also exclude each other, and the lock dies with the process that holds
it (including on SIGKILL), which is what makes crash adoption safe. The lock
descriptor is not inherited across ``exec``; a plain ``os.fork()`` child shares
it, which keeps the cluster owned until both parent and child have exited.

Only the standard library and psycopg (readiness check, ``CREATE DATABASE``)
are used; the server is driven with ``initdb`` and ``pg_ctl``.
"""

from __future__ import annotations

import fcntl
import importlib.util
import logging
import os
import pwd
import random
import re
import secrets
import shutil
import socket
import stat
import subprocess
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

log = logging.getLogger(__name__)

ROLE = "conveyor"
DATABASE = "conveyor"
HOST = "127.0.0.1"
SYSTEM_PORT = 5432  # belongs to the machine's own PostgreSQL; never used
START_TIMEOUT = 30.0  # seconds for the server to accept connections
STOP_TIMEOUT = 60  # seconds for a fast shutdown (includes the final checkpoint)
REQUIRED_BINARIES = ("initdb", "pg_ctl", "postgres")
DEBIAN_ROOT = "/usr/lib/postgresql"  # Debian/Ubuntu keep server binaries here, off PATH
RUN_USERS = ("postgres", "nobody")
# Below Linux's default ephemeral range (32768-60999), so an outgoing
# connection is unlikely to grab our port while the server is down.
PORT_RANGE = (20000, 32767)
LOG_ROTATE_BYTES = 16 * 1024 * 1024
# sun_path is 108 bytes including the NUL; postgres appends "/.s.PGSQL.<port>".
MAX_SOCKET_DIR_BYTES = 107 - len("/.s.PGSQL.65535")

SERVER_SETTINGS = {
    "listen_addresses": HOST,
    "max_connections": 200,
    "shared_buffers": "128MB",
    "fsync": "on",  # durability is the product: never trade it for speed here
}
CONF_FILE = "conveyor.conf"
_SETTING_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?")
INCLUDE_LINE = f"include = '{CONF_FILE}'"


class EmbeddedError(Exception):
    """The embedded cluster could not be found, initialised, started or stopped."""


@dataclass(frozen=True)
class _RunUser:
    """The unprivileged account the cluster runs as when we are root."""

    name: str
    uid: int
    gid: int
    home: str


def default_data_dir() -> Path:
    """Where the embedded cluster lives unless the caller says otherwise.

    ``$CONVEYOR_DATA_DIR`` wins. Root gets ``/var/lib/conveyor`` because root's
    home is not traversable by the unprivileged user the server runs as; other
    users get the XDG data directory.
    """
    configured = os.environ.get("CONVEYOR_DATA_DIR")
    if configured:
        return Path(configured).expanduser()
    if os.geteuid() == 0:
        return Path("/var/lib/conveyor")
    xdg = os.environ.get("XDG_DATA_HOME")
    # The XDG spec says relative values must be ignored.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "conveyor"


def _missing_binaries(directory: Path) -> list[str]:
    """Names of the server binaries that ``directory`` lacks (empty: usable)."""
    return [
        name
        for name in REQUIRED_BINARIES
        if not ((directory / name).is_file() and os.access(directory / name, os.X_OK))
    ]


def _version_key(directory: Path) -> tuple[int, ...]:
    """Sort key for /usr/lib/postgresql/<version>/bin (non-numeric versions last)."""
    try:
        return tuple(int(part) for part in directory.parent.name.split("."))
    except ValueError:
        return (-1,)


def find_binaries() -> Path:
    """The directory holding initdb, pg_ctl and postgres.

    Debian-style installs keep the server binaries off PATH under
    /usr/lib/postgresql/<version>/bin, so PATH alone is not enough. An explicit
    ``$CONVEYOR_PG_BIN`` is trusted exclusively: silently falling back to other
    binaries would hide a misconfiguration.
    """
    configured = os.environ.get("CONVEYOR_PG_BIN")
    if configured:
        directory = Path(configured).expanduser()
        missing = _missing_binaries(directory)
        if not missing:
            return directory
        raise EmbeddedError(
            f"CONVEYOR_PG_BIN={configured} does not contain the PostgreSQL server "
            f"programs {', '.join(missing)}. Point CONVEYOR_PG_BIN at the directory "
            "holding initdb, pg_ctl and postgres (e.g. /usr/lib/postgresql/15/bin), "
            "unset it to search PATH and /usr/lib/postgresql/*/bin, or set "
            "DATABASE_URL to use an existing PostgreSQL server."
        )

    on_path = shutil.which("pg_ctl")
    if on_path:
        # Prefer the real directory: PATH often holds only symlinks to some of them.
        for directory in (Path(on_path).resolve().parent, Path(on_path).parent):
            if not _missing_binaries(directory):
                return directory

    installed = sorted(Path(DEBIAN_ROOT).glob("*/bin"), key=_version_key)
    for directory in reversed(installed):
        if not _missing_binaries(directory):
            return directory

    bundled = _pgserver_binaries()
    if bundled is not None and not _missing_binaries(bundled):
        return bundled

    path_result = f"pg_ctl at {on_path} but no initdb/postgres beside it" if on_path else "no pg_ctl"
    raise EmbeddedError(
        "Could not find the PostgreSQL server programs (initdb, pg_ctl, postgres) "
        "needed to run the embedded database. Searched: $CONVEYOR_PG_BIN (unset), "
        f"PATH ({path_result}), "
        "/usr/lib/postgresql/*/bin and the PyPI package pgserver. Install the PostgreSQL "
        "server (e.g. `apt-get install postgresql`, or `pip install 'conveyor[embedded]'` "
        "for binaries from PyPI), set "
        "CONVEYOR_PG_BIN to the directory holding those programs, or set "
        "DATABASE_URL to use an existing PostgreSQL server."
    )


def _pgserver_binaries() -> Path | None:
    """The PostgreSQL binaries shipped inside the PyPI package ``pgserver`` (the
    ``embedded`` extra), if installed. Only its binaries are used, driven like any
    other installation; its own Python wrapper (unix socket only, and it creates a
    system user when run as root) is never imported."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "pginstall" / "bin"


def _run_user() -> _RunUser | None:
    """The account to run the server as: None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in RUN_USERS:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        return _RunUser(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)
    raise EmbeddedError(
        "Conveyor is running as root, and PostgreSQL refuses to run as root, but "
        f"none of the users {', '.join(RUN_USERS)} exists to run it as. Create a "
        "'postgres' system user, run Conveyor as an unprivileged user, or set DATABASE_URL."
    )


def _port_is_free(port: int) -> bool:
    """Whether the server could bind 127.0.0.1:port right now.

    SO_REUSEADDR mirrors what postgres does, so lingering TIME_WAIT
    connections from a previous run do not make the port look taken.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True


def _pick_free_port() -> int:
    """A port on 127.0.0.1 that is free now and is not the system cluster's."""
    for _ in range(50):
        port = random.randint(*PORT_RANGE)
        if port != SYSTEM_PORT and _port_is_free(port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def _conf_value(value: object) -> str:
    """A postgresql.conf literal: booleans as on/off, numbers bare, everything else single-quoted."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


def _write_private(path: Path, text: str, owner: _RunUser | None = None, *, replace: bool = True) -> bool:
    """Atomically write ``path`` as a 0600 file (chowned to ``owner`` if given).

    Readers never see a partial file. With ``replace=False`` an existing file
    wins (hard links cannot overwrite) and False is returned, so concurrent
    first starts agree on one generated secret.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            os.write(fd, text.encode())
            os.fsync(fd)
            if owner is not None:
                os.fchown(fd, owner.uid, owner.gid)
        finally:
            os.close(fd)
        if replace:
            os.replace(tmp, path)
            return True
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        tmp.unlink(missing_ok=True)


class EmbeddedPostgres:
    """A PostgreSQL cluster private to Conveyor, kept in ``data_dir``.

    See the module docstring for the directory layout and ownership rules.
    ``port`` forces a TCP port (otherwise the one remembered in ``data_dir``
    is reused while free); ``bin_dir`` overrides :func:`find_binaries`.
    ``settings`` are extra server settings written to ``conveyor.conf`` on every
    start, added to (and overriding) :data:`SERVER_SETTINGS`, e.g.
    ``{"shared_preload_libraries": "pg_cron", "cron.database_name": "conveyor"}``.
    They take effect at the next start of the cluster, not while it runs. The port
    and the socket directory are not among them: use ``port``.
    """

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        port: int | None = None,
        bin_dir: Path | None = None,
        settings: Mapping[str, str | int | bool] | None = None,
    ) -> None:
        if port == SYSTEM_PORT:
            raise EmbeddedError(
                f"port {SYSTEM_PORT} is reserved for the machine's own PostgreSQL; "
                "choose another port for the embedded cluster"
            )
        self.data_dir = Path(data_dir if data_dir is not None else default_data_dir()).absolute()
        self._requested_port = port
        self._bin_dir = Path(bin_dir) if bin_dir is not None else None
        self._settings = dict(settings or {})
        for key in self._settings:
            if key in ("port", "unix_socket_directories") or not _SETTING_NAME.fullmatch(key):
                raise EmbeddedError(
                    f"cannot set {key!r} through settings: it must be a PostgreSQL setting name, and "
                    "neither port (use the port argument) nor unix_socket_directories (always sock/)"
                )
        self._run_as = _run_user()
        self._lock_fd: int | None = None
        self._port: int | None = None
        self._password: str | None = None

    # ----------------------------------------------------------------- paths

    @property
    def pgdata(self) -> Path:
        return self.data_dir / "pgdata"

    @property
    def socket_dir(self) -> Path:
        return self.data_dir / "sock"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "postgres.log"

    @property
    def credentials_file(self) -> Path:
        return self.data_dir / "credentials"

    @property
    def port_file(self) -> Path:
        return self.data_dir / "port"

    @property
    def lock_file(self) -> Path:
        return self.data_dir / "owner.lock"

    @property
    def bin_dir(self) -> Path:
        """Resolved lazily so that merely constructing the object never fails."""
        if self._bin_dir is None:
            self._bin_dir = find_binaries()
        return self._bin_dir

    @property
    def owns_cluster(self) -> bool:
        """True while this object holds owner.lock, i.e. will stop the cluster."""
        return self._lock_fd is not None

    @property
    def port(self) -> int | None:
        """The TCP port of the cluster, if known (after start, or from a previous run)."""
        return self._port if self._port is not None else self._saved_port()

    @property
    def dsn(self) -> str:
        """Connection URL for the ``conveyor`` database as superuser ``conveyor``."""
        port = self.port
        password = self._password or self._read_password()
        if port is None or password is None:
            raise EmbeddedError(f"the embedded cluster in {self.data_dir} has not been started yet")
        quoted = urllib.parse.quote(password, safe="")
        return f"postgresql://{ROLE}:{quoted}@{HOST}:{port}/{DATABASE}"

    # ------------------------------------------------------------- lifecycle

    def start(self) -> str:
        """Make sure the cluster is running and accepting connections; return the DSN.

        Idempotent. Initialises the cluster on first use. Becomes the owner if
        nobody else is (see module docstring); otherwise waits, bounded, for
        the owner's cluster to be up.
        """
        _ = self.bin_dir  # fail early, with the helpful message, if PostgreSQL is missing
        self._prepare_data_dir()
        newly_owned = False
        deadline = time.monotonic() + START_TIMEOUT
        while not self.owns_cluster:
            if self._try_lock():
                newly_owned = True
                break
            if self.is_running():
                log.info("using embedded PostgreSQL in %s owned by another process", self.pgdata)
                break
            if time.monotonic() > deadline:
                raise EmbeddedError(
                    f"the embedded PostgreSQL in {self.pgdata} is owned by another process "
                    f"(it holds {self.lock_file}) but did not start within {START_TIMEOUT:.0f} s" + self._log_tail()
                )
            time.sleep(0.2)
        try:
            if self.owns_cluster:
                self._start_as_owner()
            self._port = self._running_port()
            self._wait_until_accepting()
            self._ensure_database()
        except BaseException:
            if newly_owned:  # leave neither a half-started cluster nor a held lock behind
                try:
                    self.stop()
                except EmbeddedError:
                    log.exception("could not stop the embedded PostgreSQL after a failed start")
            raise
        return self.dsn

    def stop(self) -> None:
        """Stop the cluster if this object owns it; otherwise leave it to its owner."""
        if not self.owns_cluster:
            log.debug("not stopping embedded PostgreSQL in %s: not its owner", self.pgdata)
            return
        try:
            if self.is_running():
                log.info("stopping embedded PostgreSQL in %s", self.pgdata)
                self._pg_ctl("stop", "-w", "-t", str(STOP_TIMEOUT), "-m", "fast", timeout=STOP_TIMEOUT + 10)
        finally:
            self._release_lock()

    def restart(self) -> None:
        """Bounce the server (fast shutdown, then start); used by fault tests.

        Starts it instead if it is not running. The port is kept: the server
        releases it only for the moment of the restart.
        """
        if not self.is_running():
            self.start()
            return
        self._prepare_data_dir()  # loads the password, should this object not have started it
        log.info("restarting embedded PostgreSQL in %s", self.pgdata)
        self._pg_ctl(
            "restart",
            *self._wait_args(),
            "-m",
            "fast",
            "-l",
            str(self.log_file),
            timeout=STOP_TIMEOUT + START_TIMEOUT + 10,
        )
        self._port = self._running_port()
        self._wait_until_accepting()

    def is_running(self) -> bool:
        """Whether a postmaster is serving pgdata.

        Asks ``pg_ctl status``, which checks that the PID in postmaster.pid is
        alive, so a stale postmaster.pid left by a crash reads as not running.
        A single-user backend (which is what initdb runs while bootstrapping)
        also makes pg_ctl status succeed, but it serves no connections and its
        postmaster.pid names the default port 5432, so it does not count.
        """
        if not (self.pgdata / "PG_VERSION").exists():
            return False
        result = self._pg_ctl("status", check=False, timeout=30)
        if result.returncode == 4:
            log.warning("pg_ctl status cannot access %s: %s", self.pgdata, result.stderr.strip())
        return result.returncode == 0 and "single-user" not in result.stdout

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"EmbeddedPostgres({str(self.data_dir)!r}, port={self.port}, owner={self.owns_cluster})"

    # ------------------------------------------------------- owner: starting

    def _start_as_owner(self) -> None:
        """We hold the lock: adopt a running cluster, or initialise and start one."""
        if self.is_running():
            log.info("adopting running embedded PostgreSQL in %s", self.pgdata)
            return
        self._initdb_if_needed()
        self._check_version()
        self._prepare_runtime_files()
        # A port found free can be taken before postgres binds it; try a fresh one once.
        for attempt in (1, 2):
            port = self._choose_port(force_new=attempt > 1)
            self._write_server_config(port)
            log.info("starting embedded PostgreSQL in %s on %s:%d", self.pgdata, HOST, port)
            offset = self.log_file.stat().st_size
            result = self._pg_ctl(
                "start", *self._wait_args(), "-l", str(self.log_file), check=False, timeout=START_TIMEOUT + 10
            )
            if result.returncode == 0:
                return
            new_log = self._read_log_from(offset)
            if attempt == 1 and self._requested_port is None and "could not bind" in new_log:
                log.warning("port %d was taken before the server could bind it; picking another", port)
                continue
            raise EmbeddedError(
                f"pg_ctl start failed (exit {result.returncode}) for {self.pgdata}: "
                f"{(result.stderr or result.stdout).strip()}\nserver log:\n{new_log[-3000:]}"
            )

    def _initdb_if_needed(self) -> None:
        """Create the cluster on first use; the superuser password comes from credentials."""
        if (self.pgdata / "PG_VERSION").exists():
            return
        if self.pgdata.exists() and any(self.pgdata.iterdir()):
            raise EmbeddedError(
                f"{self.pgdata} exists, is not empty and is not a PostgreSQL cluster; "
                "move it away (or choose another CONVEYOR_DATA_DIR) and start again"
            )
        self.pgdata.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.pgdata, 0o700)  # initdb insists on 0700/0750, whatever the umask
        self._give_to_run_user(self.pgdata)
        pwfile = self.data_dir / ".initdb-pwfile"
        assert self._password is not None  # set by _prepare_data_dir before the first start
        _write_private(pwfile, self._password + "\n", owner=self._run_as)
        try:
            failures = []
            # C.UTF-8 gives UTF-8 character semantics; not every platform has it.
            for locale in ("C.UTF-8", "C"):
                initdb = [str(self.bin_dir / "initdb"), "-D", str(self.pgdata), "-U", ROLE, f"--pwfile={pwfile}"]
                initdb += ["--auth=scram-sha-256", "-E", "UTF8", f"--locale={locale}"]
                result = self._run(initdb, check=False, timeout=300)
                if result.returncode == 0:
                    log.info("initialised embedded PostgreSQL cluster in %s (locale %s)", self.pgdata, locale)
                    return
                failures.append(f"--locale={locale}: {(result.stderr or result.stdout).strip()}")
                if any(self.pgdata.iterdir()):  # initdb did not clean up; do not pile on
                    break
            raise EmbeddedError(f"initdb failed for {self.pgdata}:\n" + "\n".join(failures))
        finally:
            pwfile.unlink(missing_ok=True)

    def _check_version(self) -> None:
        """Refuse to start a cluster with binaries of another major version."""
        cluster = (self.pgdata / "PG_VERSION").read_text().strip()
        out = self._run([str(self.bin_dir / "postgres"), "--version"], timeout=30).stdout
        match = re.search(r"\(PostgreSQL\)\s+(\d+)(?:\.(\d+))?", out)
        if not match:
            return  # unknown format: let postgres itself complain if it must
        major = int(match.group(1))
        binaries = str(major) if major >= 10 else f"{major}.{match.group(2)}"
        if binaries != cluster:
            raise EmbeddedError(
                f"the embedded cluster in {self.pgdata} was created by PostgreSQL {cluster}, "
                f"but the binaries in {self.bin_dir} are PostgreSQL {binaries}. Set "
                f"CONVEYOR_PG_BIN to a PostgreSQL {cluster} bin directory, or upgrade the "
                "cluster with pg_upgrade."
            )

    def _choose_port(self, *, force_new: bool = False) -> int:
        """The remembered port if still free, else a new free one (remembered)."""
        if self._requested_port is not None:
            port = self._requested_port
            if not _port_is_free(port):
                raise EmbeddedError(f"port {port} on {HOST} is already in use")
        else:
            saved = self._saved_port()
            if saved is not None and not force_new and saved != SYSTEM_PORT and _port_is_free(saved):
                port = saved
            else:
                port = _pick_free_port()
                if saved is not None:
                    log.info("port %d is no longer free; the embedded cluster moves to %d", saved, port)
        if port != self._saved_port():
            _write_private(self.port_file, f"{port}\n")
        return port

    def _write_server_config(self, port: int) -> None:
        """(Re)write conveyor.conf, included from postgresql.conf, before every start.

        Rewriting on every start keeps port and socket path right even if the
        port changed or the data directory was moved.
        """
        settings = {**SERVER_SETTINGS, **self._settings, "port": port, "unix_socket_directories": str(self.socket_dir)}
        lines = ["# Written by conveyor.db.embedded before every start; edits are overwritten."]
        lines += [f"{key} = {_conf_value(value)}" for key, value in settings.items()]
        _write_private(self.pgdata / CONF_FILE, "\n".join(lines) + "\n", owner=self._run_as)
        main_conf = self.pgdata / "postgresql.conf"
        if INCLUDE_LINE not in main_conf.read_text().splitlines():
            with main_conf.open("a") as handle:
                handle.write(f"\n# Added by conveyor.db.embedded: Conveyor's settings.\n{INCLUDE_LINE}\n")

    # --------------------------------------------------------------- layout

    def _prepare_data_dir(self) -> None:
        """Create data_dir with safe permissions, check reachability, load the password."""
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = self.data_dir.stat()
        if info.st_uid != os.geteuid():
            raise EmbeddedError(
                f"{self.data_dir} belongs to uid {info.st_uid}, not to the current user; "
                "choose another directory with CONVEYOR_DATA_DIR"
            )
        if self._run_as is None:
            os.chmod(self.data_dir, 0o700)
        else:
            # Traversable by the run user's group only: it reaches its own files
            # but cannot list the directory or read credentials.
            os.chown(self.data_dir, -1, self._run_as.gid)
            os.chmod(self.data_dir, 0o710)
            self._check_traversable(self._run_as)
        if len(os.fsencode(self.socket_dir)) > MAX_SOCKET_DIR_BYTES:
            raise EmbeddedError(
                f"the data directory path {self.data_dir} is too long for a unix socket "
                f"inside it (at most {MAX_SOCKET_DIR_BYTES - len('/sock')} bytes); "
                "choose a shorter CONVEYOR_DATA_DIR"
            )
        self._password = self._read_password() or self._create_password()

    def _check_traversable(self, user: _RunUser) -> None:
        """As root, fail clearly if the run user cannot reach data_dir (e.g. under /root)."""
        for directory in [self.data_dir, *self.data_dir.parents]:
            info = directory.stat()
            if info.st_uid == user.uid:
                ok = info.st_mode & stat.S_IXUSR
            elif info.st_gid == user.gid:  # subprocesses run with no supplementary groups
                ok = info.st_mode & stat.S_IXGRP
            else:
                ok = info.st_mode & stat.S_IXOTH
            if not ok:
                raise EmbeddedError(
                    f"PostgreSQL cannot run as root, so the embedded cluster runs as user "
                    f"{user.name!r}, which cannot traverse {directory} (mode "
                    f"{stat.filemode(info.st_mode)}). Put the data directory where every user "
                    "can reach it, e.g. CONVEYOR_DATA_DIR=/var/lib/conveyor or "
                    f"CONVEYOR_DATA_DIR=/tmp/conveyor, or make {directory} traversable (chmod o+x)."
                )

    def _read_password(self) -> str | None:
        try:
            password = self.credentials_file.read_text().strip()
        except FileNotFoundError:
            return None
        return password or None

    def _create_password(self) -> str:
        """Generate the superuser password once; it is useless without the cluster it set up."""
        if (self.pgdata / "PG_VERSION").exists():
            raise EmbeddedError(
                f"{self.credentials_file} is missing, so the password of role {ROLE!r} in the "
                f"existing cluster {self.pgdata} is unknown; restore the file or remove "
                f"{self.pgdata} to start from an empty database"
            )
        password = secrets.token_urlsafe(32)
        if _write_private(self.credentials_file, password + "\n", replace=False):
            return password
        existing = self._read_password()  # another process created it first: use theirs
        if existing is None:
            raise EmbeddedError(f"{self.credentials_file} exists but is empty; remove it and start again")
        return existing

    def _saved_port(self) -> int | None:
        try:
            return int(self.port_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def _prepare_runtime_files(self) -> None:
        """Socket dir and log file must exist and be writable by the run user."""
        self.socket_dir.mkdir(mode=0o700, exist_ok=True)
        self._give_to_run_user(self.socket_dir)
        try:
            if self.log_file.stat().st_size > LOG_ROTATE_BYTES:
                os.replace(self.log_file, self.log_file.with_name(self.log_file.name + ".1"))
        except FileNotFoundError:
            pass
        os.close(os.open(self.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
        self._give_to_run_user(self.log_file)

    def _give_to_run_user(self, path: Path) -> None:
        if self._run_as is not None:
            os.chown(path, self._run_as.uid, self._run_as.gid)

    # ------------------------------------------------------------ ownership

    def _try_lock(self) -> bool:
        """Try to become the owner; True if we now hold owner.lock."""
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())  # for humans debugging; not relied upon
        self._lock_fd = fd
        return True

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    # -------------------------------------------------------------- running

    def _running_port(self) -> int:
        """The port the live postmaster actually uses (line 4 of postmaster.pid)."""
        port: int | None
        try:
            lines = (self.pgdata / "postmaster.pid").read_text().splitlines()
            # A negative PID on line 1 marks a single-user backend: not a server.
            port = int(lines[3]) if int(lines[0]) > 0 else None
        except (FileNotFoundError, IndexError, ValueError):
            port = None
        if port is None:
            port = self._saved_port()
        if port is None:
            raise EmbeddedError(f"cannot tell which port the cluster in {self.pgdata} uses")
        return port

    def _connect(self, dbname: str, timeout: float) -> psycopg.Connection[Any]:
        """Log in over TCP; refuses the system cluster's port as a last line of defence."""
        if self._port is None or self._port == SYSTEM_PORT:
            raise EmbeddedError(
                f"refusing to connect to port {self._port}: the embedded cluster never uses "
                f"{SYSTEM_PORT}, which belongs to the machine's own PostgreSQL"
            )
        return psycopg.connect(
            host=HOST,
            port=self._port,
            user=ROLE,
            password=self._password,
            dbname=dbname,
            connect_timeout=max(1, int(timeout)),
            autocommit=True,
        )

    def _wait_until_accepting(self) -> None:
        """pg_ctl -w reports 'ready', but only a real login proves auth and TCP work."""
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                with self._connect("postgres", timeout=min(5.0, START_TIMEOUT)):
                    return
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise EmbeddedError(
                        f"embedded PostgreSQL on {HOST}:{self._port} did not accept "
                        f"connections within {START_TIMEOUT:.0f} s: {exc}" + self._log_tail()
                    ) from exc
            time.sleep(0.1)

    def _ensure_database(self) -> None:
        """Create database ``conveyor`` on first start (tolerating a concurrent creator)."""
        with self._connect("postgres", timeout=10) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone()
            if exists:
                return
            try:
                conn.execute(f'CREATE DATABASE "{DATABASE}"')
                log.info("created database %s in the embedded cluster", DATABASE)
            except (psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
                pass  # a concurrent start created it between our check and CREATE

    # ----------------------------------------------------------- processes

    @staticmethod
    def _wait_args() -> tuple[str, ...]:
        """Make pg_ctl wait (bounded) until the server reports ready, so start() returns a usable server."""
        return ("-w", "-t", str(int(START_TIMEOUT)))

    def _pg_ctl(self, *args: str, check: bool = True, timeout: float) -> subprocess.CompletedProcess[str]:
        return self._run([str(self.bin_dir / "pg_ctl"), *args, "-D", str(self.pgdata)], check=check, timeout=timeout)

    def _run(self, argv: list[str], *, check: bool = True, timeout: float) -> subprocess.CompletedProcess[str]:
        """Run a PostgreSQL program, as the run user when we are root.

        The environment is stripped of PG* variables so that a user's PGDATA,
        PGPORT etc. cannot redirect the programs at another cluster.
        """
        env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
        options: dict[str, Any] = {}
        if self._run_as is not None:
            env.update(HOME=self._run_as.home, USER=self._run_as.name, LOGNAME=self._run_as.name)
            options = dict(user=self._run_as.uid, group=self._run_as.gid, extra_groups=[])
        try:
            result = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                env=env,
                cwd="/",  # the run user may not be able to reach our working directory
                timeout=timeout,
                check=False,
                **options,
            )
        except subprocess.TimeoutExpired as exc:
            raise EmbeddedError(f"{' '.join(argv)} did not finish within {timeout:.0f} s" + self._log_tail()) from exc
        except OSError as exc:
            raise EmbeddedError(f"could not run {argv[0]}: {exc}") from exc
        if check and result.returncode != 0:
            raise EmbeddedError(
                f"{' '.join(argv)} failed (exit {result.returncode}): "
                f"{(result.stderr or result.stdout).strip()}" + self._log_tail()
            )
        return result

    def _read_log_from(self, offset: int) -> str:
        try:
            with self.log_file.open("rb") as handle:
                handle.seek(offset)
                return handle.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def _log_tail(self, size: int = 3000) -> str:
        """The end of the server log, appended to error messages to save a trip."""
        try:
            offset = max(0, self.log_file.stat().st_size - size)
        except FileNotFoundError:
            return ""
        tail = self._read_log_from(offset).strip()
        return f"\nlast lines of {self.log_file}:\n{tail}" if tail else ""
