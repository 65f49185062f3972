"""The driver JVM's class data sharing archive (pipeline.cds): where it lives, which Java
and Spark it belongs to, that it is put in place only whole, and that a session starts
when the archive is unusable."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import conveyor
from conveyor.pipeline import cds, session

_SRC = str(Path(conveyor.__file__).resolve().parents[1])


def test_the_archive_lives_in_the_user_cache_unless_told_otherwise(tmp_path):
    assert cds.directory({"HOME": "/h"}) == Path.home() / ".cache" / "conveyor" / "spark-cds"
    assert cds.directory({"XDG_CACHE_HOME": "/c"}) == Path("/c/conveyor/spark-cds")
    assert cds.directory({cds.ENV: str(tmp_path)}) == tmp_path
    assert cds.directory({cds.ENV: ""}) is None
    assert cds.prepare({cds.ENV: ""}) is None


def test_the_archive_is_named_for_one_java_build_and_one_spark_installation(tmp_path):
    java = tmp_path / "java"
    java.write_bytes(b"17")
    spark = tmp_path / "spark"
    (spark / "jars").mkdir(parents=True)
    (spark / "jars" / "spark-core.jar").write_bytes(b"4.0")
    first = cds.name(java, spark)
    assert first == cds.name(java, spark)
    (spark / "jars" / "spark-core.jar").write_bytes(b"4.1.0")
    assert cds.name(java, spark) != first
    second = cds.name(java, spark)
    java.write_bytes(b"21.0")
    assert cds.name(java, spark) != second


def test_the_first_jvm_creates_the_archive_and_the_next_ones_use_it(tmp_path):
    env = {cds.ENV: str(tmp_path), "PATH": os.environ["PATH"]}
    first = cds.prepare(env)
    assert first is not None and first.creating is not None and not first.path.exists()
    assert first.options()[0] == f"-XX:ArchiveClassesAtExit={first.creating}"
    first.path.write_bytes(b"archive")
    again = cds.prepare(env)
    assert again == cds.Archive(first.path)
    assert again.options()[0] == f"-XX:SharedArchiveFile={first.path}"


def test_left_over_temporary_files_of_ended_processes_are_deleted(tmp_path):
    env = {cds.ENV: str(tmp_path), "PATH": os.environ["PATH"]}
    archive = cds.prepare(env)
    assert archive is not None
    stem = archive.path.stem
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = tmp_path / f"{stem}.{ended.stdout.strip()}.tmp"
    alive = tmp_path / f"{stem}.{os.getpid()}.tmp"
    dead.write_bytes(b"half")
    alive.write_bytes(b"half")
    cds.prepare(env)
    assert not dead.exists() and alive.exists()


# a JVM stand-in: waits for its stdin to close (as PythonGatewayServer does), writes the file
# named by -XX:ArchiveClassesAtExit (or not), exits with the code given
_JVM = textwrap.dedent("""
    import sys
    sys.stdin.read()
    if sys.argv[2] == "write":
        open(sys.argv[1], "wb").write(b"classes")
    sys.exit(int(sys.argv[3]))
""")


def _jvm(archive: cds.Archive, write: str, code: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", _JVM, str(archive.creating), write, str(code)],
                            stdin=subprocess.PIPE)


def test_the_archive_is_put_in_place_only_after_the_jvm_wrote_it_and_exited_cleanly(tmp_path):
    old = tmp_path / "spark-driver-0000000000000000.jsa"  # another Java's or Spark's
    old.write_bytes(b"old")
    archive = cds.Archive(tmp_path / "spark-driver-1111111111111111.jsa",
                          creating=tmp_path / "spark-driver-1111111111111111.42.tmp")
    assert not archive.finish(_jvm(archive, "write", 1))  # crashed after writing: not trusted
    assert not archive.path.exists() and not archive.creating.exists()
    assert not archive.finish(_jvm(archive, "none", 0))
    assert not archive.path.exists()
    assert archive.finish(_jvm(archive, "write", 0))
    assert archive.path.read_bytes() == b"classes"
    assert not archive.creating.exists() and not old.exists()


# a session through session.Lazy, its own process (the test run's JVM is running already)
_SESSION = textwrap.dedent("""
    from conveyor.pipeline import session
    lazy = session.Lazy("local[1]", progress=print)
    assert lazy.get().range(5).count() == 5
    used = lazy.archive is not None and lazy.archive.creating is None
    lazy.stop()
    print("archive used" if used else "no archive used")
""")


def _session(tmp_path: Path, archives: Path) -> subprocess.CompletedProcess[str]:
    # the JVM writing the archive at its exit takes tens of seconds, minutes on a busy machine
    proc = subprocess.run([sys.executable, "-c", _SESSION], capture_output=True, text=True, timeout=1500,
                          cwd=tmp_path,  # where a crashed JVM leaves its hs_err file
                          env={**os.environ, cds.ENV: str(archives), "PYTHONPATH": _SRC})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture
def archive_dir(tmp_path: Path) -> Iterator[Path]:
    """Where the test's archives go: in memory (/dev/shm) where there is one, so that the
    ~180 MB the JVM writes at its exit are not flushed to the disk under the other tests'
    PostgreSQL clusters (whose commits would wait behind them)."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path / "cds"
        return
    made = Path(tempfile.mkdtemp(prefix="conveyor-cds-", dir=shm))
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


@pytest.mark.long(120)
def test_a_session_creates_the_archive_uses_it_and_starts_without_a_broken_one(tmp_path, archive_dir):
    first = _session(tmp_path, archive_dir)
    archives = list(archive_dir.glob("*.jsa"))
    assert len(archives) == 1 and not list(archive_dir.glob("*.tmp"))
    assert "saving the JVM's classes" in first.stdout and "[cds" not in first.stdout
    assert _session(tmp_path, archive_dir).stdout.splitlines()[-1] == "archive used"
    # a truncated archive crashes a JVM that maps it: the session starts again without it
    with archives[0].open("r+b") as f:
        f.truncate(1 << 20)
    broken = _session(tmp_path, archive_dir)
    assert broken.stdout.splitlines()[-1] == "no archive used"
    assert not archives[0].exists()


def test_a_short_local_driver_compiles_quickly_and_the_users_java_options_win():
    lazy = session.Lazy("local[1]", short=True)
    lazy.archive = cds.Archive(Path("/cache/a.jsa"))
    options = lazy._options()
    assert options == ["-XX:SharedArchiveFile=/cache/a.jsa", cds.QUIET, *session.SHORT]
    assert session.Lazy("spark://127.0.0.1:7077", short=True)._options() == []  # short: local drivers only
    assert session.Lazy("local[1]")._options() == []
    given = session.settings("local[1]", {session.JAVA_OPTIONS: "-XX:TieredStopAtLevel=4"}, options)
    assert given[session.JAVA_OPTIONS].split() == [*options, "-XX:TieredStopAtLevel=4"]  # the last one counts
    assert session.JAVA_OPTIONS not in session.settings("local[1]", {})
