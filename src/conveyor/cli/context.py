"""Where CLI commands get their database: ``--database-url`` / ``DATABASE_URL``, else the
embedded cluster (started for the command if no server is running it, stopped after)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import click

from conveyor import errors
from conveyor.cli import output
from conveyor.db import embedded, pool
from conveyor.db import migrate as migrations
from conveyor.db import reach as reach_
from conveyor.settings import Settings

T = TypeVar("T")


def embedded_cluster(settings: Settings) -> embedded.EmbeddedPostgres:
    """The embedded cluster of ``settings`` (not started)."""
    return embedded.EmbeddedPostgres(Path(settings.data_dir) if settings.data_dir else None)


@contextlib.contextmanager
def database_url(settings: Settings) -> Iterator[str]:
    """The DSN to use, running the embedded cluster for the duration if needed."""
    if settings.database_url:
        yield settings.database_url
        return
    try:
        cluster = embedded_cluster(settings)
        dsn = cluster.start()
    except embedded.EmbeddedError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        yield dsn
    finally:
        cluster.stop()


def reach(dsn: str, log: logging.Logger, timeout: float = 30.0) -> None:
    """Connect once before anything is announced: a wrong URL fails at once with its
    cause; a database that is still starting is waited for, saying so."""

    said = [float("inf")]  # seconds left when last said: once at first, then every 10 s

    def waiting(failure: reach_.Failure, left: float) -> None:
        if said[0] - left >= 10:
            said[0] = left
            log.warning("waiting for the database at %s (%s); retrying for %.0f more seconds",
                        reach_.masked(dsn), failure.cause, left)

    try:
        asyncio.run(reach_.first_connection(dsn, timeout=timeout, on_retry=waiting))
    except errors.ConveyorError as exc:
        raise click.ClickException(exc.message) from None


def run(settings: Settings, action: Callable[[Any], Awaitable[T]], *, migrate: bool = True) -> T:
    """Run ``action(conn)`` on one connection, Conveyor errors shown as CLI errors."""

    async def go(dsn: str) -> T:
        async with pool.connect(dsn) as conn:
            if migrate and not settings.database_url:
                await migrations.migrate(conn, dialects=settings.dialects)
            return await action(conn)

    with database_url(settings) as dsn:
        try:
            return asyncio.run(go(dsn))
        except errors.ConveyorError as exc:
            raise click.ClickException(exc.message) from None


def remove(obj: Any, kind: str, name: str, *, find: Callable[[Any, str], Awaitable[Any]],
           remove_it: Callable[[Any, str], Awaitable[bool]], question: Callable[[Any], str], done: str,
           yes: bool) -> None:
    """The CLI's delete and drop commands: ``find`` fails for an unknown ``kind`` before
    anything is asked, the question (from what was found) is confirmed unless ``yes``, then
    ``remove_it``; the answer says ``done`` (deleted, dropped)."""
    async def action(conn: Any) -> bool:
        output.confirm(question(await find(conn, name)), yes)
        return await remove_it(conn, name)

    if not run(obj.settings(), action):
        raise click.ClickException(f"{kind} {name!r} does not exist")  # removed meanwhile
    output.emit({kind: name, done: True}, obj.as_json, f"{done} {kind} {name}")
