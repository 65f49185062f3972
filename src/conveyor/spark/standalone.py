"""A Spark standalone cluster on loopback, from the installed PySpark: a master and one-core
workers in JVMs of their own. The tests (tests/spark/test_cluster.py) and the pipeline
benchmark (bench/pipeline_bench.py) run the pipeline on it; it is not for production."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark

SPARK_HOME = Path(pyspark.__file__).parent
SPARK_CLASS = str(SPARK_HOME / "bin" / "spark-class")


def env(tmp: Path) -> dict[str, str]:
    """The environment for the daemons and for a driver submitted to them (logs under ``tmp``)."""
    return {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(tmp), "SPARK_WORKER_DIR": str(tmp / "work"),
            "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the Spark {what} exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the Spark {what} did not listen on {port} within {timeout} s")


@contextlib.contextmanager
def standalone(tmp: Path, workers: int = 2) -> Iterator[str]:
    """``spark://127.0.0.1:<port>`` once ``workers`` one-core workers have registered with
    the master; every daemon terminated on the way out. Their logs: ``tmp``/master.log,
    worker-<n>.log."""
    port = _port()
    daemon_env = env(tmp)
    logs = [open(tmp / name, "wb") for name in ("master.log", *(f"worker-{n}.log" for n in range(workers)))]  # noqa: SIM115
    procs = [subprocess.Popen([SPARK_CLASS, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(port), "--webui-port", str(_port())], env=daemon_env,
                              stdout=logs[0], stderr=subprocess.STDOUT)]
    try:
        _wait_port(port, procs[0], "master")
        url = f"spark://127.0.0.1:{port}"
        for n in range(workers):
            web = _port()
            procs.append(subprocess.Popen([SPARK_CLASS, "org.apache.spark.deploy.worker.Worker", url, "--host",
                                           "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port", str(web),
                                           "--work-dir", str(tmp / f"work-{n}")], env=daemon_env,
                                          stdout=logs[n + 1], stderr=subprocess.STDOUT))
            _wait_port(web, procs[-1], f"worker {n}")
        deadline = time.monotonic() + 60
        while (tmp / "master.log").read_text(errors="replace").count("Registering worker") < workers:
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not register with the master")
            time.sleep(0.2)
        yield url
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        for log in logs:
            log.close()
