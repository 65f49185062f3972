"""The README's quick start and every docs page's examples run in order on a fresh server
(tests/docs/examples.py says how an example is run, and how a page marks one that cannot be)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support.docs_examples import ROOT, Example, Ports, Reader, examples
from support.server import ServerProcess, free_port

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "dialects").glob("*.md"))]
RUNNABLE = [p for p in PAGES if any(e.not_run is None for e in examples(p))]


def test_every_page_is_read():
    assert {p.name for p in PAGES} >= {"README.md", "sqs.md", "client.md", "schedules.md", "topics.md", "pgmq.md"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_examples_not_run_say_why(page: Path):
    for e in examples(page):
        assert e.not_run is None or len(e.not_run) >= 10, f"{e.where}: say why it is not run"


@pytest.fixture
def docs_server(dsn: str) -> Iterator[tuple[ServerProcess, Ports]]:
    ports = Ports(port=free_port(), queen_port=free_port(), hq_port=free_port())
    server = ServerProcess(dsn, args=["--queen-port", str(ports.queen_port), "--hq-port", str(ports.hq_port)],
                           env={"CONVEYOR_WEBHOOK_POLL": "3600"})  # no webhook traffic leaves the machine
    server.port, server.url = ports.port, f"http://127.0.0.1:{ports.port}"
    server.env["CONVEYOR_PORT"] = str(ports.port)
    yield server.start(), ports
    server.kill()


@pytest.mark.slow
@pytest.mark.parametrize("page", RUNNABLE, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_examples_run_in_order(page: Path, docs_server, dsn: str, tmp_path: Path):
    _server, ports = docs_server
    reader = Reader(tmp_path, ports, dsn)
    try:
        for example in examples(page):
            if example.not_run is None:
                _check(example, *reader.run(example))
    finally:
        reader.close()


def _check(example: Example, ok: bool, printed: str) -> None:
    assert ok, f"the example at {example.where} failed:\n{example.code}\n--- it printed:\n{printed}"
    for shown in example.prints:
        assert shown in printed, f"the example at {example.where} did not print {shown!r}:\n{printed}"
