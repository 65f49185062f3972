"""One local SparkSession for the whole test run (a JVM takes seconds to start), with
task retries on (``local[2,3]``: two threads, a task may fail twice) so that the
retried-task write test can fail a task on purpose; and one Spark standalone cluster.
Under xdist, each worker that runs Spark tests has its own of both (session scope)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

MASTER = "local[2,3]"


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``spark://127.0.0.1:<port>`` of a master with two one-core workers (free ports,
    logs and work directories under this worker's temporary directory)."""
    from conveyor.spark import standalone

    with standalone.standalone(tmp_path_factory.mktemp("spark-cluster"), workers=2) as url:
        yield url


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from conveyor.pipeline import session

    # getOrCreate: tests/pipeline asks for the same session and gets this one
    yield session.build(MASTER, {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
                        app_name="conveyor-tests")
