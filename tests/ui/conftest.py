"""A real server with real data in every engine, and Debian's chromium driven by
playwright (no browser download: the apt package, which .ci/run installs)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.server import ServerProcess
from ui.browser import ADMIN, READER, chromium_or_fail, seed


@pytest.fixture(scope="module")
def ui_server(module_dsn) -> Iterator[ServerProcess]:
    """Each test module has its own server and database (the actions change the data)."""
    server = ServerProcess(module_dsn, env={
        "CONVEYOR_AUTH": "token", "CONVEYOR_AUTH_TOKENS": f"{ADMIN}:admin,{READER}:read",
        "CONVEYOR_HISTORY_INTERVAL": "0.5", "CONVEYOR_STREAM_TICK_INTERVAL": "0.2",
        "CONVEYOR_WEBHOOK_ALLOW": "none"}).start()
    try:
        seed(server.url)
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="module")
def browser(ui_server) -> Iterator[object]:
    path = chromium_or_fail()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, headless=True, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()
