"""Building the Spark session the jobs run in: ``local[*]`` by default, any ``--master``
otherwise, with Spark settings passed through (``--conf key=value``).

Executors run this interpreter (``PYSPARK_PYTHON``). A local session binds to loopback
and runs without the web UI; on a cluster those defaults are left alone, and the
``conveyor`` package is shipped to the executors (they still need the ``pipeline``
extra's dependencies installed, as any PySpark job's libraries).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import conveyor
import conveyor.spark

DEFAULT_MASTER = "local[*]"

COMMON = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}
LOCAL = {
    "spark.ui.enabled": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.showConsoleProgress": "false",
}


def parse_conf(pairs: Sequence[str]) -> dict[str, str]:
    """``["spark.executor.memory=2g", ...]`` -> {key: value}; ValueError names a bad one."""
    conf: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"Spark settings look like key=value, got {pair!r}")
        conf[key.strip()] = value
    return conf


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def settings(master: str, conf: Mapping[str, str]) -> dict[str, str]:
    """Every setting the session gets: the defaults for its master, then ``conf``."""
    return {**COMMON, **(LOCAL if is_local(master) else {}), **conf}


def build(master: str = DEFAULT_MASTER, conf: Mapping[str, str] | None = None,
          app_name: str = "conveyor-pipeline") -> Any:
    """The session (an existing one is reused, as SparkSession.getOrCreate does), with
    the ``conveyor`` data source registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if is_local(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings(master, conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    if not is_local(master):
        spark.sparkContext.addPyFile(str(_package_zip()))
    conveyor.spark.register(spark)
    return spark


class Lazy:
    """A session started on first use (``get``): the archive needs Spark only for a
    micro-batch too large for the driver to write alone, and a JVM takes seconds to start."""

    def __init__(self, master: str = DEFAULT_MASTER, conf: Mapping[str, str] | None = None,
                 on_start: Callable[[str], None] = lambda _: None) -> None:
        self.master, self.conf, self.on_start = master, dict(conf or {}), on_start
        self.session: Any = None

    def get(self) -> Any:
        if self.session is None:
            self.on_start(f"starting Spark ({self.master})")
            self.session = build(self.master, self.conf)
        return self.session

    def stop(self) -> None:
        if self.session is not None:
            self.session.stop()
            self.session = None


def _package_zip() -> Path:
    """The ``conveyor`` package as a zip for the executors' Python path."""
    root = Path(conveyor.__file__).resolve().parent
    target = Path(tempfile.mkdtemp(prefix="conveyor-spark-")) / "conveyor.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in root.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                zf.write(path, Path("conveyor") / path.relative_to(root))
    return target
