"""Connection pools and single connections, with errors translated at the edge."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import NoReturn

import psycopg
import psycopg_pool

from conveyor import errors
from conveyor.db import execute, reach

log = logging.getLogger(__name__)

# psycopg_pool retries a lost connection with a delay that doubles without bound (1, 2, 4,
# 8, 16, 32 s...): with an endless retry a primary promoted 20 s into an outage was first
# tried at 31 s. A slot that cannot reconnect within this window is given up instead, and
# a new window begins at once (``_reconnect_failed``), so attempts stay at most ~2 s apart.
RECONNECT_WINDOW = 5.0
# At most one drain of the whole pool per this many seconds (see ``_drain_soon``).
DRAIN_INTERVAL = 1.0
# How long a request waits for a fresh connection once the idle ones it was given were all
# found closed (``Database._checked_out``): the database was probably shut down.
REPLACE_TIMEOUT = 1.0
# Reads of an idle connection's pending input at checkout (``_check_idle``): enough for a
# server's last message and the end of the stream.
IDLE_READS = 4


@dataclass(frozen=True, slots=True)
class PoolStats:
    size: int
    idle: int
    active: int
    acquire_timeouts: int


class Database:
    """A pool of autocommit connections: each SQL API call is its own transaction.

    When a call fails because the database went away, the pool is asked to check its
    idle connections in the background, so that stale ones are replaced before the next
    requests take them (recovery after a PostgreSQL restart needs nothing from outside).

    The database is then also known to be down (``down``): until a probe connects again
    (every ``probe_interval`` seconds), every call fails at once with ``errors.Unavailable``
    instead of waiting the pool's timeout, and the failover spool takes the writes it may.

    Failover: new connections, and the probe, go wherever the DSN leads (a multi-host URL
    with ``target_session_attrs=read-write`` finds the new primary; libpq checks every host).
    Connections to the old primary break and are replaced like after a restart. A server
    that still answers but refuses writes (SQLSTATE 25006: a demoted or draining primary,
    which pg_auto_failover marks ``default_transaction_read_only``) would keep its
    connections, so such an error drains the whole pool: every connection is reopened
    through the DSN.
    """

    def __init__(self, dsn: str, *, min_size: int = 2, max_size: int = 10, timeout: float = 10.0,
                 max_waiting: int = 0, application_name: str = "conveyor",
                 on_throttled: Callable[[], None] | None = None) -> None:
        """``max_waiting``: requests that may wait for a connection at once (0: any number);
        beyond it a request fails at once with ``errors.Throttled`` (and ``on_throttled`` is
        called, for the metrics)."""
        self._on_throttled = on_throttled
        self.dsn = dsn
        self._pool = psycopg_pool.AsyncConnectionPool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            timeout=timeout,
            max_waiting=max_waiting,
            open=False,
            kwargs={"autocommit": True, "application_name": application_name, **execute.CONNECT},
            reconnect_timeout=RECONNECT_WINDOW,
            reconnect_failed=self._reconnect_failed,
        )
        self._checking: asyncio.Task[None] | None = None
        self.down = False
        self.probe_interval = 0.5
        self._probing: asyncio.Task[None] | None = None
        self._draining: asyncio.Task[None] | None = None
        self._drained_at = float("-inf")

    async def open(self, wait: bool = False, timeout: float = 30.0) -> None:
        with execute.translated():
            await self._pool.open(wait=wait, timeout=timeout)

    async def close(self) -> None:
        if self._probing is not None:
            self._probing.cancel()
        await self._pool.close()

    def connection(self, timeout: float | None = None) -> contextlib.AbstractAsyncContextManager[execute.Connection]:
        """A pooled connection for the block (``async with``); errors translated, and the
        pool told what they say of the database."""
        return _Checkout(self, timeout)

    def _failed(self, exc: BaseException) -> BaseException | None:
        """What a failure in a checkout's block says of the database, acted on; the error to
        raise instead of ``exc``, if another."""
        cause = exc.__cause__
        if isinstance(cause, (psycopg.OperationalError, psycopg_pool.PoolTimeout)):
            self._check_soon()
        if _unreachable(cause) and not (isinstance(cause, psycopg_pool.PoolTimeout)
                                        and self.stats().size > 0):  # busy, not unreachable
            self._mark_down()
        if isinstance(cause, psycopg.errors.ReadOnlySqlTransaction):
            self._drain_soon()
        if isinstance(exc, errors.Throttled) and self._on_throttled is not None:
            self._on_throttled()
        if _never_ran(exc) and not isinstance(exc, errors.DatabaseUnreachable):
            told = cause if isinstance(cause, _FoundClosed) else exc
            unreachable = errors.DatabaseUnreachable(told.message if isinstance(told, errors.ConveyorError)
                                                     else str(told))
            unreachable.__cause__ = cause
            return unreachable
        return None

    async def _checked_out(self, timeout: float | None) -> execute.Connection:
        """A pooled connection that was not closed while it sat idle (``_check_idle``).

        One found closed goes back to the pool, which drops it, and another is taken: an
        idle connection cut by a proxy or ``idle_session_timeout`` is replaced without the
        request noticing. Once the idle ones are used up, a fresh one is waited for at most
        ``REPLACE_TIMEOUT``: a database that was shut down (every idle connection closed at
        once) is then reported unreachable within that time, nothing having been sent."""
        found_closed: _FoundClosed | None = None
        for _ in range(self._pool.max_size + 1):
            wait = timeout
            if found_closed is not None and not self._pool.get_stats().get("pool_available", 0):
                wait = min(timeout or REPLACE_TIMEOUT, REPLACE_TIMEOUT)
            try:
                conn = await self._pool.getconn(timeout=wait)
            except psycopg_pool.PoolTimeout as exc:
                if found_closed is not None:
                    raise found_closed from exc
                raise
            try:
                _check_idle(conn)
            except _FoundClosed as exc:
                await self._pool.putconn(conn)  # broken: the pool discards it and makes another
                found_closed = exc
                continue
            return conn
        assert found_closed is not None
        raise found_closed

    async def ping(self, timeout: float) -> None:
        """Raise unless a pooled connection answers within ``timeout`` seconds."""
        async with self.connection(timeout=timeout) as conn:
            with execute.translated():
                await conn.execute("SELECT 1")

    def _mark_down(self) -> None:
        if not self.down:
            log.warning("the database is unreachable: failing fast and probing every %.1f s", self.probe_interval)
        self.down = True
        if self._probing is None or self._probing.done():
            self._probing = asyncio.get_running_loop().create_task(self._probe())

    async def _probe(self) -> None:
        """Until a fresh connection answers; then the pool is checked and calls go through."""
        while True:
            await asyncio.sleep(self.probe_interval)
            try:
                conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True, connect_timeout=2)
                try:
                    await conn.execute("SELECT 1")
                finally:
                    await conn.close()
            except (psycopg.Error, OSError):  # still down
                continue
            log.warning("the database answers again")
            self.down = False
            self._check_soon()
            return

    def _check_soon(self) -> None:
        if self._checking is None or self._checking.done():
            self._checking = asyncio.get_running_loop().create_task(self._check())

    async def _check(self) -> None:
        try:
            await self._pool.check()
        except Exception:  # the check itself failing means the database is still down
            log.debug("pool check failed", exc_info=True)

    def _reconnect_failed(self, _pool: object) -> None:
        """A slot gave up reconnecting (``RECONNECT_WINDOW``): the check grows the pool
        again, whose first attempt is immediate."""
        self._check_soon()

    def _drain_soon(self) -> None:
        """Replace every connection, at most once per ``DRAIN_INTERVAL``: the requests
        that were already running on the read-only server fail the same way meanwhile,
        and must not close the fresh connections the first drain opened."""
        now = time.monotonic()
        if now - self._drained_at < DRAIN_INTERVAL:
            return
        self._drained_at = now
        log.warning("the database refused a write as read-only (a demoted primary?): "
                    "reconnecting every pooled connection")
        self._draining = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        try:
            await self._pool.drain()
        except Exception:  # closed meanwhile: nothing left to replace
            log.debug("pool drain failed", exc_info=True)

    def stats(self) -> PoolStats:
        s = self._pool.get_stats()
        size = s.get("pool_size", 0)
        idle = s.get("pool_available", 0)
        return PoolStats(size=size, idle=idle, active=max(size - idle, 0),
                         acquire_timeouts=s.get("requests_errors", 0))


_DOWN_STATES = {"57P01", "57P02", "57P03", "08000", "08001", "08003", "08004", "08006"}


def _unreachable(cause: BaseException | None) -> bool:
    """Whether a failure says the database cannot be reached (not that a statement
    failed): no connection to be had, a broken one, or a server shutting down or starting."""
    if isinstance(cause, psycopg_pool.TooManyRequests):  # admission control refused it: busy, not down
        return False
    if isinstance(cause, psycopg_pool.PoolTimeout):
        return True
    return isinstance(cause, psycopg.OperationalError) and (cause.sqlstate is None or cause.sqlstate in _DOWN_STATES)


def _never_ran(exc: BaseException) -> bool:
    """Whether a failure proves the database ran nothing of the request, so that the
    failover spool may take it without risk of storing it twice (``DatabaseUnreachable``):

    - no connection could be had (``PoolTimeout``, not admission control's refusal);
    - SQLSTATE 57P01, "terminating connection due to administrator command" (``pg_ctl stop
      -m fast``, ``pg_terminate_backend``): PostgreSQL raises it only at an interrupt check,
      as a FATAL error that aborts the transaction in progress; a COMMIT holds interrupts
      until it is done, so a statement that gets 57P01 was never committed. (An immediate
      shutdown or a crash says "terminating connection" as a warning, not this error: the
      client then only sees the connection close, which is ambiguous, below.)
    - the pooled connection was found closed before anything was sent on it (``_check_idle``).

    Anything else — above all a connection lost once the statement was sent ("server closed
    the connection unexpectedly") — may have committed, and stays ``Unavailable``."""
    cause = exc.__cause__
    if isinstance(cause, psycopg_pool.PoolTimeout):
        return not isinstance(exc, errors.Throttled)
    return isinstance(cause, (psycopg.errors.AdminShutdown, _FoundClosed))


_DRIVER_ERRORS = (psycopg.Error, psycopg_pool.PoolTimeout, psycopg_pool.TooManyRequests)


class _Checkout:
    """``Database.connection``'s block: a class rather than a generator-based context
    manager, as it is entered once per SQL API call."""

    __slots__ = ("conn", "db", "timeout")

    def __init__(self, db: Database, timeout: float | None) -> None:
        self.db, self.timeout = db, timeout
        self.conn: execute.Connection | None = None

    async def __aenter__(self) -> execute.Connection:
        db = self.db
        if db.down:
            raise errors.DatabaseUnreachable("the database is unreachable; calls fail at once until it answers again")
        try:
            conn = self.conn = await db._checked_out(self.timeout)
        except _DRIVER_ERRORS as exc:
            self._raise(execute.translate(exc), exc)
        except errors.ConveyorError as exc:
            self._raise(exc, exc.__cause__)
        return conn

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        conn, self.conn = self.conn, None
        try:
            if conn is not None:
                await self.db._pool.putconn(conn)
        except _DRIVER_ERRORS as put_failed:
            if exc is None:
                self._raise(execute.translate(put_failed), put_failed)
        if isinstance(exc, _DRIVER_ERRORS):
            self._raise(execute.translate(exc), exc)
        if isinstance(exc, Exception):
            instead = self.db._failed(exc)
            if instead is not None:
                raise instead from exc.__cause__

    def _raise(self, error: Exception, cause: BaseException | None) -> NoReturn:
        if error.__cause__ is None and cause is not error:
            error.__cause__ = cause
        instead = self.db._failed(error)
        raise (instead or error) from cause


class _FoundClosed(psycopg.OperationalError):
    """A pooled connection the server (or the network) closed while it sat idle."""


def _check_idle(conn: execute.Connection) -> None:
    """Raise ``_FoundClosed`` if the server closed this idle connection meanwhile.

    A fast shutdown sends each idle backend's "terminating connection" and closes the socket;
    a killed server or a dropped link just closes it. Either way it sits unread in the socket
    until the next statement is sent, which then fails as if the link broke under it. An
    idle connection has nothing to read unless something happened, so one ``poll`` (no round
    trip) tells: what is there is read (libpq reads once per call: the server's message,
    then the end of the stream), and a connection that is then broken is reported before
    any query goes out on it."""
    pgconn = conn.pgconn
    poller = select.poll()
    poller.register(pgconn.socket, select.POLLIN)
    for _ in range(IDLE_READS):
        if not poller.poll(0):
            return
        try:
            pgconn.consume_input()
        except psycopg.OperationalError as exc:
            raise _FoundClosed(f"the database closed this connection while it was idle (nothing was sent): "
                               f"{exc}") from exc
        if pgconn.status != psycopg.pq.ConnStatus.OK:
            raise _FoundClosed("the database closed this connection while it was idle (nothing was sent)")


async def vacuum(conn: execute.Connection, table: str) -> bool:
    """VACUUM one of Conveyor's tables (named by the schema itself, e.g. from
    conveyor.tables_to_vacuum(); quoted as an identifier all the same), on an autocommit
    connection. A table that another VACUUM (autovacuum's) holds is skipped, not waited
    for; False if the table is gone (a queue's own, dropped since it was listed)."""
    schema, _, name = table.partition(".")
    statement = psycopg.sql.SQL("VACUUM (SKIP_LOCKED) {}.{}").format(psycopg.sql.Identifier(schema),
                                                                     psycopg.sql.Identifier(name))
    try:
        await conn.execute(statement)
    except psycopg.errors.UndefinedTable:
        return False
    except psycopg.Error as exc:
        raise execute.translate(exc) from exc
    return True


@contextlib.asynccontextmanager
async def connect(dsn: str, *, autocommit: bool = True) -> AsyncIterator[execute.Connection]:
    """One connection outside any pool (CLI commands, migrations, LISTEN); a failure to
    connect says why, and where (conveyor.db.reach)."""
    try:
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=autocommit,
                                                     application_name="conveyor", **execute.CONNECT)
    except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:
        failure = reach.classify(exc)
        error = errors.DatabaseUnreachable if failure.transient else errors.DatabaseRejected
        raise error(f"cannot connect to the database at {reach.masked(dsn)}: {failure.cause}") from exc
    try:
        yield conn
    finally:
        await conn.close()
