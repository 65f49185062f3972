"""Helpers for the pgmq dialect tests: databases with Conveyor's pgmq dialect or with the
real pgmq (its plain-SQL install, as the `pgmq` Python package ships it), and the
normalisation that lets the two be compared call by call."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

import psycopg

from conveyor.db import migrate, pool

JS_DIR = Path(__file__).parent / "pgmq_js"


def real_pgmq_sql() -> str:
    """pgmq's own SQL (the version the pinned `pgmq` client ships: pgmq/sql/pgmq.sql)."""
    return (resources.files("pgmq") / "sql" / "pgmq.sql").read_text("utf-8")


def install_dialect(dsn: str) -> None:
    async def run() -> None:
        async with pool.connect(dsn) as conn:
            await migrate.migrate(conn, dialects=("pgmq",))

    asyncio.run(run())


def install_core(dsn: str) -> None:
    """Conveyor's own schema only (as `conveyor db migrate` without dialects)."""
    async def run() -> None:
        async with pool.connect(dsn) as conn:
            await migrate.migrate(conn)

    asyncio.run(run())


def install_real_pgmq(dsn: str) -> None:
    """pgmq's SQL, with pg_partman (Debian's postgresql-<major>-partman, installed by
    .ci/run) for its partitioned queues."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS partman")
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_partman SCHEMA partman")
        conn.execute(real_pgmq_sql().encode())


def outcome(conn: psycopg.Connection, sql: str, params: tuple[Any, ...] = ()) -> Any:
    """What a statement answers, comparable across databases: its rows with timestamps
    reduced to "ts" (or None), or its error as (SQLSTATE, primary message)."""
    try:
        rows = conn.execute(sql.encode(), params).fetchall()
    except psycopg.Error as exc:
        return ("error", exc.sqlstate, exc.diag.message_primary)
    return [tuple(_plain(v) for v in row) for row in rows]


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return "ts"
    return value


def npm_ci() -> None:
    """Install pgmq-js (package-lock.json) unless node_modules is there already."""
    if (JS_DIR / "node_modules" / "pgmq-js").is_dir():
        return
    npm = shutil.which("npm")
    assert npm, "npm is needed for the pgmq-js test (node 20 is installed on this machine)"
    subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=JS_DIR, check=True, timeout=300,
                   capture_output=True)


def run_js(dsn: str, queue: str) -> dict[str, Any]:
    """Runs pgmq_js/scenario.js (pgmq-js through its public API) against ``dsn``."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    config = {"host": info.get("host", "127.0.0.1"), "port": int(info.get("port", 5432)),
              "database": info["dbname"], "user": info.get("user", "postgres"), "queue": queue}
    node = shutil.which("node")
    assert node, "node is needed for the pgmq-js test"
    done = subprocess.run([node, "scenario.js", json.dumps(config)], cwd=JS_DIR, capture_output=True,
                          text=True, timeout=60, env={**os.environ})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]
