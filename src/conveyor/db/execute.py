"""The one funnel between Conveyor and psycopg.

Every query runs through here: looked up by name, parameters adapted, rows mapped onto
Conveyor's value types, and every psycopg error turned into a ``conveyor.errors`` error
by SQLSTATE. Nothing above this module sees a psycopg exception.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar, overload

import psycopg
import psycopg_pool
from psycopg.types.json import Jsonb

from conveyor import errors, types
from conveyor.db import queries

log = logging.getLogger(__name__)

T = TypeVar("T")
Connection = psycopg.AsyncConnection

# SQLSTATE classes that mean "the database is not there right now", and 25006
# (read_only_sql_transaction): a write reached a standby or a demoted primary during a
# failover, so the primary is elsewhere now (conveyor.db.pool reconnects).
_UNAVAILABLE_CLASSES = ("08", "53", "57", "58", "25006")


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
        if (state and state.startswith(_UNAVAILABLE_CLASSES)) or isinstance(exc, psycopg.OperationalError):
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


def jsonb(value: Any) -> Any:
    """A parameter passed as one jsonb value whatever it is (a list of objects would
    otherwise go as a jsonb[] array)."""
    return Jsonb(value)


def _adapt(value: Any) -> Any:
    if isinstance(value, Mapping):
        return Jsonb(value)
    if isinstance(value, (list, tuple)) and any(isinstance(v, Mapping) for v in value):
        return [Jsonb(v) if isinstance(v, Mapping) else v for v in value]
    return value


def _params(params: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: _adapt(v) for k, v in (params or {}).items()}


def _row_maker(cls: type[Any], columns: tuple[str, ...]) -> Any:
    """How to build ``cls`` from a row of these columns (remembered per class and columns)."""
    key = (cls, columns)
    maker = _ROW_MAKERS.get(key)
    if maker is None:
        maker = _ROW_MAKERS[key] = _new_row_maker(cls, columns)
    return maker


_ROW_MAKERS: dict[tuple[type[Any], tuple[str, ...]], Any] = {}


def _new_row_maker(cls: type[Any], columns: tuple[str, ...]) -> Any:
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
        row_type: type[Any] = cls
        if res is None or not res.nfields:
            return None if cursor.description is None else _row_maker(row_type, ())
        return _row_maker(row_type, tuple(res.fname(i).decode() for i in range(res.nfields)))

    return factory


@overload
async def fetch_all(conn: Connection, name: str, params: Mapping[str, Any] | None = None, *,
                    row: None = None) -> list[tuple[Any, ...]]: ...
@overload
async def fetch_all(conn: Connection, name: str, params: Mapping[str, Any] | None = None, *,
                    row: type[T]) -> list[T]: ...
async def fetch_all(conn: Connection, name: str, params: Mapping[str, Any] | None = None, *,
                    row: type[T] | None = None) -> list[T] | list[tuple[Any, ...]]:
    """Run the named query and return all rows (as ``row`` instances if given)."""
    with translated():
        factory = dataclass_row(row) if row is not None else psycopg.rows.tuple_row
        async with conn.cursor(row_factory=factory) as cur:
            await cur.execute(queries.get(name), _params(params))
            return await cur.fetchall()


@overload
async def fetch_one(conn: Connection, name: str, params: Mapping[str, Any] | None = None, *,
                    row: None = None) -> tuple[Any, ...] | None: ...
@overload
async def fetch_one(conn: Connection, name: str, params: Mapping[str, Any] | None = None, *,
                    row: type[T]) -> T | None: ...
async def fetch_one(conn: Connection, name: str, params: Mapping[str, Any] | None = None, *,
                    row: type[T] | None = None) -> T | tuple[Any, ...] | None:
    """The first row, None if there is none."""
    rows = await fetch_all(conn, name, params, row=row)
    return rows[0] if rows else None


async def fetch_row(conn: Connection, name: str, params: Mapping[str, Any] | None, row: type[T]) -> T:
    """The row of a query that always returns one (an SQL function that returns a row or
    raises); none at all is a bug, reported as ``InternalError``."""
    found = await fetch_one(conn, name, params, row=row)
    if found is None:
        raise _no_row(name)
    return found


async def fetch_value(conn: Connection, name: str, params: Mapping[str, Any] | None = None) -> Any:
    """The first column of the first row (None if there is no row), untyped."""
    rows = await fetch_all(conn, name, params)
    return rows[0][0] if rows else None


async def fetch_scalar(conn: Connection, name: str, params: Mapping[str, Any] | None, kind: type[T]) -> T:
    """The first column of the first row, which must be a ``kind`` (else ``InternalError``:
    the SQL API returned something this code does not expect)."""
    value = await fetch_value(conn, name, params)
    if not isinstance(value, kind):
        raise _no_row(name) if value is None else errors.InternalError(
            f"query {name} returned a {type(value).__name__}, not a {kind.__name__}")
    return value


async def fetch_optional(conn: Connection, name: str, params: Mapping[str, Any] | None,
                         kind: type[T]) -> T | None:
    """As ``fetch_scalar``, None allowed."""
    value = await fetch_value(conn, name, params)
    if value is not None and not isinstance(value, kind):
        raise errors.InternalError(f"query {name} returned a {type(value).__name__}, not a {kind.__name__}")
    return value


def _no_row(name: str) -> errors.InternalError:
    log.error("query %s returned no row", name)
    return errors.InternalError(f"query {name} returned no row")


async def fetch_column(conn: Connection, name: str, params: Mapping[str, Any] | None = None) -> list[Any]:
    """The first column of every row."""
    return [r[0] for r in await fetch_all(conn, name, params)]
