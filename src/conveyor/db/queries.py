"""Named SQL queries, loaded once from ``conveyor/sql/queries/*.sql``.

A file holds blocks that each start with a ``-- name: <entity>_<verb>`` line; the SQL up to
the next such line is the query. Python never builds SQL from data: it looks queries up
here by name and passes values as parameters.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*([a-z0-9_]+)\s*$", re.MULTILINE)


def parse(text: str) -> dict[str, str]:
    """Split one queries file into {name: sql}."""
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=False):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        queries[name] = body.strip()
    return queries


@functools.cache
def all_queries() -> dict[str, str]:
    queries: dict[str, str] = {}
    folder = resources.files("conveyor") / "sql" / "queries"
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".sql"):
            for name, sql in parse(entry.read_text("utf-8")).items():
                if name in queries:
                    raise ValueError(f"query {name!r} is defined in two files")
                queries[name] = sql
    return queries


def get(name: str) -> str:
    try:
        return all_queries()[name]
    except KeyError:
        raise KeyError(f"no SQL query named {name!r}") from None
