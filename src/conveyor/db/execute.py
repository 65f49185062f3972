"""The one funnel between Conveyor and psycopg.

Every query runs through here: looked up by name, parameters adapted, rows mapped onto
Conveyor's value types, and every psycopg error turned into a ``conveyor.errors`` error
by SQLSTATE. Nothing above this module sees a psycopg exception.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

import psycopg
import psycopg_pool
from psycopg.types.json import Jsonb

from conveyor import errors, types
from conveyor.db import queries

log = logging.getLogger(__name__)

T = TypeVar("T")
Connection = psycopg.AsyncConnection

# SQLSTATE classes that mean "the database is not there right now".
_UNAVAILABLE_CLASSES = ("08", "53", "57", "58")


def translate(exc: BaseException) -> errors.ConveyorError:
    """Map a driver or pool exception onto Conveyor's error tree."""
    if isinstance(exc, errors.ConveyorError):
        return exc
    if isinstance(exc, psycopg_pool.TooManyRequests):
        return errors.Throttled("too many requests are waiting for a database connection")
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return errors.Unavailable("no database connection available in time")
    if isinstance(exc, psycopg.Error):
        state = exc.sqlstate
        cls = errors.ConveyorError.for_sqlstate(state)
        if cls is not None:
            primary = exc.diag.message_primary if exc.diag else None
            return cls(primary or str(exc))
        if state and state.startswith(_UNAVAILABLE_CLASSES) or isinstance(exc, psycopg.OperationalError):
            return errors.Unavailable("the database is unavailable")
        if isinstance(exc, psycopg.DataError) and state is None:
            # raised while dumping parameters, e.g. a NUL character in text
            return errors.InvalidInput(str(exc))
    log.error("unexpected database error", exc_info=exc)
    return errors.InternalError("database error")


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Re-raise any driver error inside the block as a Conveyor error."""
    try:
        yield
    except errors.ConveyorError:
        raise
    except (psycopg.Error, psycopg_pool.PoolTimeout, psycopg_pool.TooManyRequests) as exc:
        raise translate(exc) from exc


def _adapt(value: Any) -> Any:
    if isinstance(value, Mapping):
        return Jsonb(value)
    if isinstance(value, (list, tuple)) and any(isinstance(v, Mapping) for v in value):
        return [Jsonb(v) if isinstance(v, Mapping) else v for v in value]
    return value


def _params(params: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: _adapt(v) for k, v in (params or {}).items()}


@functools.cache
def _row_maker(cls: type, columns: tuple[str, ...]) -> Any:
    fields = tuple(types.field_names(cls))
    if columns == fields:  # the common case: the query selects the fields, in order
        return lambda values: cls(*values)
    wanted = set(fields)
    keep = [(i, name) for i, name in enumerate(columns) if name in wanted]
    return lambda values: cls(**{name: values[i] for i, name in keep})


def dataclass_row(cls: type[T]) -> Any:
    """A psycopg row factory building ``cls`` from the columns it has fields for
    (extra columns, e.g. from a newer schema, are ignored)."""

    def factory(cursor: Any) -> Any:
        # the column names straight from the result: building ``cursor.description`` (a
        # Column object per column) costs more than the query's other Python work
        res = cursor.pgresult
        if res is None or not res.nfields:
            return None if cursor.description is None else _row_maker(cls, ())
        return _row_maker(cls, tuple(res.fname(i).decode() for i in range(res.nfields)))

    return factory


async def fetch_all(conn: Connection, name: str, params: Mapping[str, Any] | None = None,
                    row: type[T] | None = None) -> list[Any]:
    """Run the named query and return all rows (as ``row`` instances if given)."""
    with translated():
        factory = dataclass_row(row) if row is not None else psycopg.rows.tuple_row
        async with conn.cursor(row_factory=factory) as cur:
            await cur.execute(queries.get(name), _params(params))
            return await cur.fetchall()


async def fetch_one(conn: Connection, name: str, params: Mapping[str, Any] | None = None,
                    row: type[T] | None = None) -> Any:
    rows = await fetch_all(conn, name, params, row)
    return rows[0] if rows else None


async def fetch_value(conn: Connection, name: str, params: Mapping[str, Any] | None = None) -> Any:
    """The first column of the first row (None if there is no row)."""
    rows = await fetch_all(conn, name, params)
    return rows[0][0] if rows else None


async def fetch_column(conn: Connection, name: str, params: Mapping[str, Any] | None = None) -> list[Any]:
    """The first column of every row."""
    return [r[0] for r in await fetch_all(conn, name, params)]
