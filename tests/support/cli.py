"""Running ``conveyor`` commands in-process through click's runner, for the CLI tests."""

from __future__ import annotations

import json

from click.testing import CliRunner, Result

from conveyor.cli import main

main._register()
CLI = main.cli


def run(dsn: str, *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(CLI, ["--database-url", dsn, *args], input=input, prog_name="conveyor")


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.output, result.exception)
    return result.stdout


def ok_json(result: Result) -> object:
    return json.loads(ok(result))


def failed(result: Result, code: int = 1) -> str:
    """The command failed cleanly (a click error, not a crash); returns its stderr."""
    assert result.exit_code == code, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result.stderr


def rows(text: str) -> list[list[str]]:
    """A table's data rows, split on whitespace (header dropped)."""
    return [line.split() for line in text.splitlines()[1:]]
