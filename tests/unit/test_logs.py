"""conveyor.logs: JSON lines carry the record's fields, its extras and its traceback."""

from __future__ import annotations

import logging

import orjson
import pytest

from conveyor import logs


def _record(**extra: object) -> logging.LogRecord:
    record = logging.LogRecord("conveyor.test", logging.WARNING, __file__, 1, "sent %d to %s", (3, "jobs"), None)
    for k, v in extra.items():
        setattr(record, k, v)
    return record


def test_json_line():
    line = orjson.loads(logs.JsonFormatter().format(_record(queue="jobs")))
    assert line["message"] == "sent 3 to jobs" and line["level"] == "warning"
    assert line["logger"] == "conveyor.test" and line["queue"] == "jobs"
    assert line["ts"].endswith("Z") and isinstance(line["pid"], int)


def test_json_line_with_traceback():
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    line = orjson.loads(logs.JsonFormatter().format(record))
    assert "ValueError: boom" in line["exception"]


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match="log format"):
        logs.configure("yaml")
