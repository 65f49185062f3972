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
from conveyor.pipeline import cds

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


JAVA_OPTIONS = "spark.driver.extraJavaOptions"
SHORT = ["-XX:TieredStopAtLevel=1"]  # the quick compiler only: for a driver whose work is small (Lazy)


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


def settings(master: str, conf: Mapping[str, str], java_options: Sequence[str] = ()) -> dict[str, str]:
    """Every setting the session gets: the defaults for its master, then ``conf``;
    ``java_options`` (the driver JVM's) go before any ``conf`` gives, so those win."""
    every = {**COMMON, **(LOCAL if is_local(master) else {}), **conf}
    if java_options:
        every[JAVA_OPTIONS] = " ".join([*java_options, every.get(JAVA_OPTIONS, "")]).strip()
    return every


def build(master: str = DEFAULT_MASTER, conf: Mapping[str, str] | None = None,
          app_name: str = "conveyor-pipeline", java_options: Sequence[str] = ()) -> Any:
    """The session (an existing one is reused, as SparkSession.getOrCreate does), with
    the ``conveyor`` data source registered; ``java_options``: the driver JVM's (settings)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if is_local(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings(master, conf or {}, java_options).items():
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
    micro-batch too large for the driver to write alone, and a JVM takes seconds to start.

    The driver JVM it starts uses the class data sharing archive (``cds``), or creates it:
    then ``stop`` ends the JVM and waits while it writes the archive (once, a few
    seconds). A JVM that cannot start with the archive is started again without it, and
    the archive deleted.

    ``short``: the work is small (a report over a small lake), so a local driver JVM
    compiles with the quick compiler only (SHORT): the optimizing one spends more CPU on
    a cold JVM than its code saves in a job of seconds."""

    def __init__(self, master: str = DEFAULT_MASTER, conf: Mapping[str, str] | None = None,
                 progress: Callable[[str], None] = lambda _: None, short: bool = False) -> None:
        self.master, self.conf, self.progress = master, dict(conf or {}), progress
        self.short = short
        self.session: Any = None
        self.archive: cds.Archive | None = None
        self.java_options: list[str] = []  # the last JVM's

    def get(self) -> Any:
        if self.session is None:
            from pyspark import SparkContext

            self.progress(f"starting Spark ({self.master})")
            # a JVM already running (another session in this process) keeps its options
            self.archive = cds.prepare() if SparkContext._gateway is None else None
            try:
                self.session = build(self.master, self.conf, java_options=self._options())
            except Exception:
                if self.archive is None or self.archive.creating is not None:
                    raise
                self.archive.discard()
                self.archive = None
                self.session = build(self.master, self.conf, java_options=self._options())
        return self.session

    def _options(self) -> list[str]:
        self.java_options = [*(self.archive.options() if self.archive else []),
                             *(SHORT if self.short and is_local(self.master) else [])]
        return self.java_options

    def stop(self) -> None:
        if self.session is None:
            return
        self.session.stop()
        self.session = None
        if self.archive is not None and self.archive.creating is not None:
            from pyspark import SparkContext

            gateway = SparkContext._gateway
            if gateway is not None:  # the JVM ends now: a later session in this process starts its own
                gateway.shutdown()
                SparkContext._gateway, SparkContext._jvm = None, None
                self.progress("saving the JVM's classes for the next start (once)")
                self.archive.finish(getattr(gateway, "proc", None))
        self.archive = None


def _package_zip() -> Path:
    """The ``conveyor`` package as a zip for the executors' Python path."""
    root = Path(conveyor.__file__).resolve().parent
    target = Path(tempfile.mkdtemp(prefix="conveyor-spark-")) / "conveyor.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in root.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                zf.write(path, Path("conveyor") / path.relative_to(root))
    return target
