"""``conveyor db url`` / ``conveyor db psql``: finding the database the CLI uses, and quiet
commands (the embedded cluster's INFO lines only with -v)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.cli import failed, ok, run


def conveyor(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    return subprocess.run([sys.executable, "-m", "conveyor", *args], env={**environ, **env},
                          capture_output=True, text=True, timeout=120)


def test_url_prints_database_url(dsn):
    assert ok(run(dsn, "db", "url")).strip() == dsn


def test_psql_runs_on_database_url(dsn):
    done = conveyor("db", "psql", "-tA", "-c", "select current_database()", DATABASE_URL=dsn)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == dsn.split("dbname=")[1].split()[0]


def test_psql_passes_on_its_exit_code(dsn):
    done = conveyor("db", "psql", "-v", "ON_ERROR_STOP=1", "-c", "select nonsense", DATABASE_URL=dsn)
    assert done.returncode != 0 and "nonsense" in done.stderr


@pytest.fixture
def data_dir() -> Iterator[str]:
    """Under /tmp, traversable by the user the cluster runs as when the tests run as root."""
    base = Path(tempfile.mkdtemp(prefix="conveyor-dburl-", dir="/tmp"))
    os.chmod(base, 0o755)
    yield str(base / "data")
    shutil.rmtree(base, ignore_errors=True)


def test_embedded_url_and_psql(data_dir):
    never = conveyor("db", "url", CONVEYOR_DATA_DIR=data_dir)
    assert never.returncode == 1 and "was never started" in never.stderr and "Traceback" not in never.stderr

    done = conveyor("db", "psql", "-tA", "-c", "select 40 + 2", CONVEYOR_DATA_DIR=data_dir)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "42"
    assert "INFO" not in done.stderr  # the cluster started and stopped quietly

    shown = conveyor("db", "url", CONVEYOR_DATA_DIR=data_dir)
    assert shown.returncode == 0 and shown.stdout.startswith("postgresql://conveyor:")
    assert "is not running" in shown.stderr  # nothing serves it now: said, not hidden

    loud = conveyor("-v", "queues", "list", CONVEYOR_DATA_DIR=data_dir)
    assert loud.returncode == 0 and "INFO conveyor.db.embedded: starting embedded PostgreSQL" in loud.stderr


def test_url_of_an_unstarted_embedded_cluster_is_a_clean_error(data_dir):
    assert "was never started" in failed(run("", "--data-dir", data_dir, "db", "url"))
