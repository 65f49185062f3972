"""The one funnel between Conveyor and psycopg.

Every query runs through here: looked up by name, parameters adapted, rows mapped onto
Conveyor's value types, and every psycopg error turned into a ``conveyor.errors`` error
by SQLSTATE. Nothing above this module sees a psycopg exception.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import re
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar, overload

import orjson
import psycopg
import psycopg_pool
from psycopg import generators, pq
from psycopg.abc import Transformer as TransformerABC
from psycopg.adapt import PyFormat, Transformer
from psycopg.pq.abc import PGresult
from psycopg.types.json import Jsonb, set_json_loads

from conveyor import errors, json_input, types
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


def _json_loads(data: str | bytes) -> Any:
    """A json or jsonb value from PostgreSQL, by orjson (8 us against the standard
    library's 21 for a Queen pop's ten messages), or by the standard library's parser where
    an integer could lose its exactness in orjson (``json_input.may_hold_long_integers``)."""
    if not json_input.may_hold_long_integers(data):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)


set_json_loads(_json_loads)  # every connection of the process, pools and tests alike


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


def _rows(res: PGresult, tx: TransformerABC, row: type[Any] | None) -> list[Any]:
    """The rows of a result, as tuples or as ``row`` instances built from the columns it has
    fields for (extra columns, e.g. from a newer schema, are ignored)."""
    if not res.nfields:
        return []  # a command without rows
    tx.set_pgresult(res)
    values: list[Any] = tx.load_rows(0, res.ntuples, tuple)
    if row is None:
        return values
    maker = _row_maker(row, tuple((res.fname(i) or b"").decode() for i in range(res.nfields)))
    return [maker(v) for v in values]


# -- the statements -------------------------------------------------------------------------
#
# A named query runs straight on libpq through psycopg's own pieces (its adapters, its
# generators, the connection's lock and wait), without a cursor: a cursor's bookkeeping
# (query conversion, prepare manager, result cursor state) cost more Python per call than
# the rest of a broker's request around it. Each named query's placeholders are turned into
# $n once; a statement (query and parameter types: psycopg picks an integer's type by its
# size) that a connection runs a second time is prepared on it (psycopg prepares at the
# fifth) and run by name from then on.

# The connections the named queries run on leave preparing to them: psycopg's own (a
# statement its cursors ran five times) would also, at the connection's next ROLLBACK,
# drop every prepared statement of the connection (DEALLOCATE ALL), these included, and a
# named query in a transaction after that would fail (outside one it is made again). A
# connection that psycopg prepares on (a caller's own, passed to the client's
# ``send(..., conn=...)`` to send in its transaction) gets no prepared statement of ours.
CONNECT: dict[str, Any] = {"prepare_threshold": None}

_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%|%")
_PREPARE_AT = 2  # the run of a statement, on one connection, that prepares it
_PREPARED_MAX = 512  # named statements per connection (beyond: run unnamed)


@dataclasses.dataclass(frozen=True, slots=True)
class _Query:
    sql: bytes  # with $1, $2... for the named placeholders
    names: tuple[str, ...]  # the parameter of each $n


@functools.cache
def _query(name: str) -> _Query:
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(0) == "%%":
            return "%"
        if match.group(1) is None:
            raise ValueError(f"query {name!r}: only %(name)s placeholders and %% are allowed")
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return _Query(_PLACEHOLDER.sub(number, queries.get(name)).encode(), tuple(names))


@dataclasses.dataclass(slots=True)
class _Prepared:
    """What one connection has prepared: statement key -> its name, and how often each
    key not prepared yet ran."""
    names: dict[tuple[str, tuple[int, ...]], bytes] = dataclasses.field(default_factory=dict)
    runs: dict[tuple[str, tuple[int, ...]], int] = dataclasses.field(default_factory=dict)


_AUTO = PyFormat.AUTO
_SQLSTATE = pq.DiagnosticField.SQLSTATE
# an earlier prepare of this statement on this connection that was not recorded (its
# request was cancelled while it ran): the statement is there to run
_ALREADY_PREPARED = b"42P05"
_NOT_PREPARED = b"26000"
_IDLE = pq.TransactionStatus.IDLE
_TUPLES_OK = pq.ExecStatus.TUPLES_OK
_COMMAND_OK = pq.ExecStatus.COMMAND_OK


def _statement_gen(conn: Connection, query: _Query, values: Any, types: Any, formats: Any,
                   name: bytes | None, prepare: bool) -> Any:
    """The libpq exchange of one statement (a psycopg generator: ``conn.wait`` runs it):
    prepared first if ``prepare``, then run by ``name``, or unnamed. On a connection that is
    not autocommit, a transaction is begun first if none is open, as psycopg's cursor does.
    Returns the statement's result, and whether it was prepared here (a prepared statement
    outlives a failed run and a rolled back transaction)."""
    pgconn = conn.pgconn
    if not conn.autocommit:
        yield from conn._start_query()
    if name is not None and prepare:
        pgconn.send_prepare(name, query.sql, param_types=types)
        results = yield from generators.execute(pgconn)
        if results[-1].status != _COMMAND_OK and results[-1].error_field(_SQLSTATE) != _ALREADY_PREPARED:
            return results[-1], False
    if name is not None:
        pgconn.send_query_prepared(name, values, param_formats=formats)
    else:
        pgconn.send_query_params(query.sql, values, param_formats=formats, param_types=types)
    results = yield from generators.execute(pgconn)
    return results[-1], prepare


async def _run(conn: Connection, name: str, params: Mapping[str, Any] | None,
               retry: bool = True) -> tuple[PGresult, TransformerABC]:
    query = _query(name)
    given = params or {}
    try:
        args = [_adapt(given[k]) for k in query.names]
    except KeyError as exc:
        raise errors.InternalError(f"query {name} needs parameter {exc.args[0]!r}") from None
    tx: TransformerABC = Transformer(conn)
    values = tx.dump_sequence(args, [_AUTO] * len(args))
    types, formats = tx.types or (), tx.formats
    key = (name, types)
    prepared = getattr(conn, "_conveyor_prepared", None)
    if prepared is None:
        prepared = conn._conveyor_prepared = _Prepared()  # type: ignore[attr-defined]
    statement = prepared.names.get(key)
    prepare = False
    if statement is None and conn.prepare_threshold is None:  # (see CONNECT: a caller's own runs unnamed)
        runs = prepared.runs[key] = prepared.runs.get(key, 0) + 1
        if runs >= _PREPARE_AT and len(prepared.names) < _PREPARED_MAX:
            statement = _statement_name(key)
            prepare = True
    async with conn.lock:
        if conn.closed:
            raise psycopg.OperationalError("the connection is closed")
        res, was_prepared = await conn.wait(_statement_gen(conn, query, values, types, formats, statement, prepare))
    if was_prepared:
        assert statement is not None
        prepared.names[key] = statement
        prepared.runs.pop(key, None)
    if res.status not in (_TUPLES_OK, _COMMAND_OK):
        if res.error_field(_SQLSTATE) == _NOT_PREPARED and statement is not None:
            # the connection's statements were dropped (DISCARD ALL, DEALLOCATE): nothing
            # ran; outside a transaction the call is made again, preparing afresh
            prepared.names.clear()
            if retry and conn.pgconn.transaction_status == _IDLE:
                return await _run(conn, name, params, retry=False)
        raise psycopg.errors.error_from_result(res, encoding=conn.info.encoding)
    return res, tx


_STATEMENT_NAMES: dict[tuple[str, tuple[int, ...]], bytes] = {}


def _statement_name(key: tuple[str, tuple[int, ...]]) -> bytes:
    """The name a statement (query and parameter types) is prepared under: a digest of the
    key, the same on every connection and in every thread; short, as PostgreSQL keeps the
    first 63 bytes of a name."""
    name = _STATEMENT_NAMES.get(key)
    if name is None:
        digest = hashlib.blake2b(repr(key).encode(), digest_size=12).hexdigest()
        name = _STATEMENT_NAMES[key] = f"cv_{digest}".encode()
    return name


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
        res, tx = await _run(conn, name, params)
        return _rows(res, tx, row)


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
