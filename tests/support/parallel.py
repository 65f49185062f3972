"""Running the suite on several pytest-xdist workers (``./bin/test`` does; see
docs/testing.md): which worker runs what, in what order, and which tests run alone.

* A test module is the unit of work: all of a module's tests run on one worker, in
  order, so its module-scoped fixtures (a ``conveyor serve`` process, a pg_cron
  cluster) are set up once, as in a serial run. The Spark modules go in two lanes
  (``LANES``), each run on one worker.
* Modules marked ``long`` are handed out first (longest-processing-time first: a module
  that takes minutes, started last, would make every other worker wait for it); the
  others follow in collection order.
* A test that needs a server where nothing else runs (stream rotation) is marked
  ``own_cluster``: its ``dsn`` is in a PostgreSQL cluster of its worker's own
  (tests/conftest.py), so it never waits for the other workers.

Every worker has its own session: its own template database (tests/conftest.py), Spark
session and Spark cluster, and picks free ports and fresh directories as a serial run
does, so nothing else is shared between workers but the machine's PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import pytest
from xdist.scheduler import LoadFileScheduling

# Modules that share a lane run one after the other on one worker: the Spark tests. Each
# starts JVMs and Python workers that must connect back to their JVM within 10 s (fixed
# in Spark: "Python worker failed to connect back"); four workers' worth of them at once
# on a busy 2-core machine miss that. The standalone cluster's module has a lane of its
# own, so at most two Spark drivers of this suite run at a time.
LANES = (
    ("tests/spark/test_cluster.py", "spark-cluster"),
    ("tests/spark/", "spark"),
    ("tests/pipeline/", "spark"),
)


class ModuleScheduling(LoadFileScheduling):
    """``--dist loadfile`` (a module is a unit of work, or a lane of modules: ``LANES``)
    in collection order (which puts ``long`` modules first), and a worker is given its
    next unit only when it is down to the last test of the current one, so that no unit
    waits behind a long test on one worker while another is idle."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False  # keep the collection's order

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return next((lane for prefix, lane in LANES if module.startswith(prefix)), module)

    def _reschedule(self, node: Any) -> None:
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        # a worker runs a test once it knows the next one (for teardown): one pending
        # test is the least it can be left with without standing still
        if self._pending_of(self.assigned_work[node]) > 1:
            return
        self._assign_work_unit(node)


def long_modules_first(items: list[pytest.Item]) -> None:
    """Reorders ``items`` in place: the modules with a ``long`` test first, the longest
    first (``pytest.mark.long(seconds)``: the module's time on a quiet machine, 60 if not
    given), the others after them in collection order; each module's tests kept together
    and in order."""
    modules: dict[str, float] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        mark = item.get_closest_marker("long")
        seconds = float(mark.args[0] if mark.args else 60) if mark is not None else 0.0
        modules[module] = max(modules.get(module, 0.0), seconds)
    rank = {module: (-seconds, n) for n, (module, seconds) in enumerate(modules.items())}
    items.sort(key=lambda item: rank[item.nodeid.split("::", 1)[0]])
