"""The first connection to a database, and what to say when it cannot be made.

A wrong ``DATABASE_URL`` must be reported at once, with its cause and the URL (password
masked), not retried for half a minute and then ended in a traceback. Only what can heal
is retried: PostgreSQL refusing connections or still starting (a server and its database
started together), a host that does not resolve yet, a timeout. Everything else (a
missing database or role, a wrong password, no pg_hba.conf entry, a malformed URL) stays
wrong until someone changes something, so it fails at once.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from conveyor import errors

# libpq's words for failures that end by themselves: the server is not (yet) listening,
# is starting or stopping, is out of connection slots, or the name or network is not there yet
_TRANSIENT = re.compile(
    r"connection refused|the database system is (starting up|shutting down|in recovery mode)|"
    r"too many clients|remaining connection slots|timeout expired|could not translate host name|"
    r"failed to resolve host|name or service not known|temporary failure in name resolution|"
    r"no such file or directory|network is unreachable|no route to host|server closed the connection",
    re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Failure:
    cause: str  # libpq's own words, first line, without psycopg's prefixes
    transient: bool


def masked(dsn: str) -> str:
    """``dsn`` fit to print: its password replaced by ``***`` (URL or key=value form, and
    a malformed URL too)."""
    shown = _URL_PASSWORD.sub(r"\1***@", dsn)
    return _KEY_PASSWORD.sub(r"\1***", shown)


_URL_PASSWORD = re.compile(r"(//[^:/@\s]*:)[^@\s]*@")
_KEY_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)")


def classify(exc: BaseException) -> Failure:
    """What a failed connection attempt says, and whether trying again can help."""
    text = str(exc).strip()
    for prefix in ("connection failed: ", "connection is bad: "):
        text = text.removeprefix(prefix)
    text = re.sub(r"\s+", " ", text.replace("FATAL: ", "")).strip()
    if isinstance(exc, psycopg.ProgrammingError):  # the URL itself does not parse
        return Failure(f"malformed database URL: {text}", transient=False)
    return Failure(text, transient=bool(_TRANSIENT.search(text)))


async def first_connection(dsn: str, *, timeout: float = 30.0,
                           on_retry: Callable[[Failure, float], None] | None = None) -> None:
    """Connect once (and close): return when the database answers; raise
    ``errors.DatabaseRejected`` at once for a failure that will not heal, or
    ``errors.DatabaseUnreachable`` once ``timeout`` seconds of retries have not helped.
    ``on_retry(failure, seconds_left)`` is called before each wait, to say what happens."""
    deadline = time.monotonic() + timeout
    delay = 0.25
    while True:
        try:
            conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True, connect_timeout=5,
                                                         application_name="conveyor")
            await conn.close()
            return
        except (psycopg.Error, OSError) as exc:
            failure = classify(exc)
        where = masked(dsn)
        if not failure.transient:
            raise errors.DatabaseRejected(f"cannot connect to the database at {where}: {failure.cause}")
        left = deadline - time.monotonic()
        if left <= 0:
            raise errors.DatabaseUnreachable(f"the database at {where} did not answer within {timeout:g}s: "
                                             f"{failure.cause}")
        if on_retry is not None:
            on_retry(failure, left)
        await asyncio.sleep(min(delay, left))
        delay = min(delay * 2, 2.0)
