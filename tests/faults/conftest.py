"""Fault-test fixtures: a throwaway PostgreSQL cluster the test may stop and start."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.db import embedded


@pytest.fixture
def cluster() -> Iterator[embedded.EmbeddedPostgres]:
    data_dir = Path(tempfile.mkdtemp(prefix="conveyor-fault-", dir="/tmp"))
    os.chmod(data_dir, 0o755)
    pg = embedded.EmbeddedPostgres(data_dir)
    pg.start()
    yield pg
    pg.stop()
    shutil.rmtree(data_dir, ignore_errors=True)
