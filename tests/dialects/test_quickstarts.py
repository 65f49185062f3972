"""The quick start of each SQL dialect's page (docs/dialects/<dialect>.md, the block marked
<!-- quickstart -->), pasted into psql as the page says, against a fresh database migrated
with every dialect: it must run without an error and answer what the page shows."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import create_database, drop_database, unique_name
from conveyor.db import migrate, pool

DOCS = Path(__file__).parents[2] / "docs" / "dialects"

# what each quick start's output must show
EXPECTED = {
    "pgmq": ['{"hello": "world"}', "tasks      |            0 |              1"],
    "pgque": ["order.created", '{"id": 1}', " 1\n"],
    "pgq": ["created | id=1"],
}


@pytest.fixture
def migrated(template_db: str) -> Iterator[str]:
    name = unique_name("conveyor_quickstart")
    dsn = create_database(name, template=template_db)

    async def install() -> None:
        async with pool.connect(dsn) as conn:
            await migrate.migrate(conn, dialects=("pgmq", "pgque", "pgq"))

    asyncio.run(install())
    yield dsn
    drop_database(name)


def quickstart(dialect: str) -> str:
    found = re.search(r"<!-- quickstart -->\s*```sql\n(.*?)```", (DOCS / f"{dialect}.md").read_text("utf-8"), re.S)
    assert found, f"docs/dialects/{dialect}.md has no quick start"
    return found.group(1)


@pytest.mark.parametrize("dialect", list(EXPECTED))
def test_the_quick_start_runs_in_psql_as_written(migrated: str, dialect: str) -> None:
    psql = shutil.which("psql")
    assert psql, "psql (PostgreSQL's client) is needed"
    done = subprocess.run([psql, migrated, "-X", "-v", "ON_ERROR_STOP=1"], input=quickstart(dialect),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "ERROR" not in done.stderr
    for shown in EXPECTED[dialect]:
        assert shown in done.stdout, (shown, done.stdout)
