"""The driver JVM's class data sharing archive: the classes a Spark driver loads (about
ten thousand: Spark's, Scala's, Hadoop's), already parsed and verified, mapped from one
file instead of read from the jars. It roughly halves the time from ``java`` to a
running session and to the first SQL job of a cold JVM.

The archive is created the first time, by the JVM itself (a dynamic archive,
``-XX:ArchiveClassesAtExit``), and used from then on (``-XX:SharedArchiveFile``). It is
valid for one Java build and one Spark installation only, so its name is a digest of
both (a Java or Spark upgrade makes a new one and deletes the old). It lives in
``$CONVEYOR_SPARK_CDS_DIR``, by default ``$XDG_CACHE_HOME/conveyor/spark-cds`` (about
180 MB); ``CONVEYOR_SPARK_CDS_DIR=`` (empty) turns it off.

Safety: a JVM that maps a truncated archive crashes, so one is never seen half-written.
The JVM writes it at its exit under a name of its own (``*.tmp``), and the session's
owner renames it into place (atomically) once the JVM has exited cleanly
(``finish``). An archive the JVM cannot use for another reason (other Java flags) is
ignored by the JVM with a warning, silenced here; one it cannot start with is deleted
by the caller (``discard``) and the session started without it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ENV = "CONVEYOR_SPARK_CDS_DIR"
EXIT_TIMEOUT = 600.0  # seconds for the JVM to write the archive and exit (tens on a quiet machine)
QUIET = "-Xlog:cds*=off"  # the JVM's notes on archives (on stdout, where --json goes)


def directory(environ: Mapping[str, str] | None = None) -> Path | None:
    """Where archives live (None: off)."""
    env = os.environ if environ is None else environ
    if ENV in env:
        return Path(env[ENV]) if env[ENV].strip() else None
    cache = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "conveyor" / "spark-cds"


def java(environ: Mapping[str, str] | None = None) -> Path | None:
    """The ``java`` that spark-submit runs: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    env = os.environ if environ is None else environ
    found = str(Path(env["JAVA_HOME"]) / "bin" / "java") if env.get("JAVA_HOME") else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def spark_home() -> Path:
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home()).resolve()


def name(java_binary: Path, spark: Path) -> str:
    """The archive's file name for this Java build and this Spark installation (the
    binary's path, size and time; Spark's jars, their names and sizes)."""
    digest = hashlib.sha256()
    stat = java_binary.stat()
    digest.update(f"{java_binary}\0{stat.st_size}\0{stat.st_mtime_ns}\0{spark}\0".encode())
    for jar in sorted((spark / "jars").glob("*.jar")):
        digest.update(f"{jar.name}\0{jar.stat().st_size}\0".encode())
    return f"spark-driver-{digest.hexdigest()[:16]}.jsa"


@dataclass(frozen=True)
class Archive:
    path: Path  # the archive for this Java and Spark
    creating: Path | None = None  # where the JVM writes it at exit, when there is none yet

    def options(self) -> list[str]:
        """The driver JVM's options."""
        if self.creating is not None:
            return [f"-XX:ArchiveClassesAtExit={self.creating}", QUIET]
        return [f"-XX:SharedArchiveFile={self.path}", QUIET]

    def finish(self, jvm: subprocess.Popen[bytes] | None) -> bool:
        """After the session is stopped, when creating: ends the JVM (its stdin closed, it
        exits as when Python does), waits while it writes the archive, and puts the
        archive in place. True if it did."""
        if self.creating is None or jvm is None:
            return False
        try:
            if jvm.stdin is not None:
                jvm.stdin.close()
            code = jvm.wait(EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            jvm.kill()
            jvm.wait()
            code = -1
        if code == 0 and self.creating.is_file() and self.creating.stat().st_size > 0:
            os.replace(self.creating, self.path)
            for old in self.path.parent.glob("spark-driver-*.jsa"):  # other Java or Spark builds'
                if old != self.path:
                    old.unlink(missing_ok=True)
            return True
        self.creating.unlink(missing_ok=True)
        return False

    def discard(self) -> None:
        """The archive could not be used: deleted (the next session creates it again)."""
        for path in (self.path, self.creating):
            if path is not None:
                path.unlink(missing_ok=True)


def prepare(environ: Mapping[str, str] | None = None) -> Archive | None:
    """The archive to use or to create for the next driver JVM (None: off, or no Java,
    or no place to keep it)."""
    where = directory(environ)
    binary = java(environ)
    if where is None or binary is None:
        return None
    try:
        where.mkdir(parents=True, exist_ok=True)
        path = where / name(binary, spark_home())
    except OSError:
        return None
    if path.is_file() and path.stat().st_size > 0:
        return Archive(path)
    with contextlib.suppress(OSError):  # leftovers of JVMs that never finished writing
        for stale in where.glob(f"{path.stem}.*.tmp"):
            if not _alive(stale):
                stale.unlink(missing_ok=True)
    return Archive(path, creating=where / f"{path.stem}.{os.getpid()}.tmp")


def _alive(tmp: Path) -> bool:
    """Whether the process that named ``tmp`` (``<stem>.<pid>.tmp``) still runs."""
    try:
        os.kill(int(tmp.suffixes[-2].lstrip(".")), 0)
    except (ValueError, IndexError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True
