"""Every fixed advisory-lock key of Conveyor names one thing. A server holds the stream
ticker's and the vacuum's keys for as long as it runs, so a transaction-level lock of
another job on the same key would never be granted (the storage upkeep once shared the
ticker's key and so never ran beside a server)."""

from __future__ import annotations

import collections
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "conveyor"
SQL_KEY = re.compile(r"pg_(?:try_)?advisory(?:_xact)?_lock\(\s*(\d+)\s*\)")
PY_KEY = re.compile(r"^\w*LOCK_KEY\s*=\s*(\d+)", re.MULTILINE)


def test_each_fixed_key_is_used_for_one_thing_only():
    uses: dict[int, list[str]] = collections.defaultdict(list)
    for path in SRC.rglob("*.sql"):
        if "migrations" in path.parts:  # landed migrations: their functions are redefined in functions/
            continue
        for key in SQL_KEY.findall(path.read_text()):
            uses[int(key)].append(str(path.relative_to(SRC)))
    for path in SRC.rglob("*.py"):
        for key in PY_KEY.findall(path.read_text()):
            uses[int(key)].append(str(path.relative_to(SRC)))
    assert len(uses) >= 5, uses  # migrate, ticker, plans, storage, vacuum
    assert {key: where for key, where in uses.items() if len(where) > 1} == {}
