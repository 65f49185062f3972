"""conveyor.db.reach: what a failed first connection says, and which failures are retried."""

from __future__ import annotations

import asyncio
import time

import pytest

from conftest import ADMIN_DSN, dsn_for
from conveyor import errors
from conveyor.db import reach
from support.server import free_port


@pytest.mark.parametrize(("dsn", "shown"), [
    ("postgresql://app:s3cret@db.example:5432/app", "postgresql://app:***@db.example:5432/app"),
    ("postgresql://app@db.example/app", "postgresql://app@db.example/app"),
    ("host=db user=app password=s3cret dbname=app", "host=db user=app password=*** dbname=app"),
    ("host=db password='a b c' dbname=app", "host=db password=*** dbname=app"),
    ("postgres//app:s3cret@x", "postgres//app:***@x"),
])
def test_passwords_are_masked(dsn, shown):
    assert reach.masked(dsn) == shown


@pytest.mark.parametrize(("dsn", "words"), [
    (dsn_for("conveyor_no_such_db"), 'database "conveyor_no_such_db" does not exist'),
    (ADMIN_DSN.replace("postgres@", "conveyor_no_such_role@"), 'role "conveyor_no_such_role" does not exist'),
    ("postgres//bad", "malformed database URL"),
    ("host=127.0.0.1 port=abc", 'invalid integer value "abc"'),
])
def test_permanent_failures_fail_at_once_with_the_cause(dsn, words):
    started = time.monotonic()
    with pytest.raises(errors.DatabaseRejected) as caught:
        asyncio.run(reach.first_connection(dsn, timeout=30))
    assert time.monotonic() - started < 5
    assert words in caught.value.message and reach.masked(dsn) in caught.value.message


def test_a_refused_connection_is_retried_until_the_timeout():
    dsn = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    retries: list[float] = []
    started = time.monotonic()
    with pytest.raises(errors.DatabaseUnreachable) as caught:
        asyncio.run(reach.first_connection(dsn, timeout=1.0, on_retry=lambda _f, left: retries.append(left)))
    assert 1.0 <= time.monotonic() - started < 4
    assert len(retries) >= 2 and "Connection refused" in caught.value.message and "within 1s" in caught.value.message


def test_an_answering_database_returns():
    asyncio.run(reach.first_connection(ADMIN_DSN, timeout=1))
