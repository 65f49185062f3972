"""Synchronous connections, for processes without an event loop: Spark's executors and
the pipeline's driver code (``conveyor.spark``, ``conveyor.pipeline``).

The same named queries and the same error funnel as ``execute`` (errors leave as
``conveyor.errors`` classes by SQLSTATE); only the calls are blocking. Large reads
stream through server-side cursors in batches, bulk writes go through COPY.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import psycopg

from conveyor.db import execute, queries

Connection = psycopg.Connection
FETCH_SIZE = 5000


@contextlib.contextmanager
def connect(dsn: str, *, application_name: str = "conveyor-pipeline") -> Iterator[Connection]:
    """One autocommit connection (each call its own transaction unless inside ``transaction``)."""
    with execute.translated():
        conn = psycopg.Connection.connect(dsn, autocommit=True, application_name=application_name)
    try:
        yield conn
    finally:
        conn.close()


@contextlib.contextmanager
def transaction(conn: Connection) -> Iterator[None]:
    with execute.translated(), conn.transaction():
        yield


def fetch_all(conn: Connection, name: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
    with execute.translated(), conn.cursor() as cur:
        cur.execute(queries.get(name), execute._params(params))
        return cur.fetchall() if cur.description is not None else []


def fetch_one(conn: Connection, name: str, params: Mapping[str, Any] | None = None) -> tuple[Any, ...] | None:
    rows = fetch_all(conn, name, params)
    return rows[0] if rows else None


def fetch_record(conn: Connection, name: str, params: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The first row as a dict of column name to value (None if there is no row)."""
    with execute.translated(), conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        cur.execute(queries.get(name), execute._params(params))
        return cur.fetchone()


def fetch_value(conn: Connection, name: str, params: Mapping[str, Any] | None = None) -> Any:
    row = fetch_one(conn, name, params)
    return row[0] if row else None


def fetch_batches(conn: Connection, name: str, params: Mapping[str, Any] | None = None,
                  size: int = FETCH_SIZE) -> Iterator[list[tuple[Any, ...]]]:
    """The rows of a named query in batches of at most ``size``, from a server-side
    cursor (one transaction; memory bounded by the batch whatever the result's size)."""
    with execute.translated(), conn.transaction(), conn.cursor(name="conveyor_read") as cur:
        cur.itersize = size
        cur.execute(queries.get(name), execute._params(params))
        while rows := cur.fetchmany(size):
            yield rows


def cursor_batches(conn: Connection, open_name: str, fetch_name: str,
                   params: Mapping[str, Any] | None = None) -> Iterator[list[tuple[Any, ...]]]:
    """Rows from a cursor a SQL function opens (``open_name``), fetched with the named
    FETCH (``fetch_name``) until it is exhausted, in one transaction."""
    with execute.translated(), conn.transaction(), conn.cursor() as cur:
        cur.execute(queries.get(open_name), execute._params(params))
        fetch = queries.get(fetch_name)
        while True:
            cur.execute(fetch)
            rows = cur.fetchall()
            if not rows:
                return
            yield rows


def copy_rows(conn: Connection, name: str, rows: Iterable[Sequence[Any]]) -> int:
    """COPY rows into the table of a named ``COPY ... FROM STDIN`` (in the caller's
    transaction, if any); returns how many."""
    n = 0
    with execute.translated(), conn.cursor() as cur, cur.copy(queries.get(name)) as copy:
        for row in rows:
            copy.write_row([execute._adapt(v) for v in row])
            n += 1
    return n
