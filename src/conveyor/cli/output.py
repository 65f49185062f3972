"""Printing for every command: plain-text tables and records for people, JSON for scripts.

Tables have a header row, left-aligned text, right-aligned numbers and ``-`` for missing
values. JSON is the value types of ``conveyor.types`` as dicts (``dataclasses.asdict``),
datetimes as ISO strings. Everything goes to stdout; notices go to stderr (``note``)
so that ``conveyor --json ... | jq`` never sees them.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import click

MISSING = "-"
BODY_PREVIEW = 60


# -- the --json flag -----------------------------------------------------------------------

def _set_json(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    # Users type --json at the end as often as before the subcommand: a local flag only
    # switches on the group's setting, so commands read one place (``obj.as_json``).
    if value and ctx.obj is not None:
        ctx.obj.as_json = True


json_option = click.option("--json", "as_json", is_flag=True, expose_value=False, callback=_set_json,
                           help="Print JSON instead of tables (same as conveyor --json).")


# -- JSON ----------------------------------------------------------------------------------

def to_data(value: Any) -> Any:
    """Dataclasses (also inside lists and dicts) as plain dicts, ready for ``json.dumps``."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, Mapping):
        return {k: to_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_data(v) for v in value]
    return value


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def print_json(value: Any, *, compact: bool = False) -> None:
    click.echo(json.dumps(to_data(value), default=_json_default, indent=None if compact else 2,
                          ensure_ascii=False))


class Progress:
    """A progress line on standard error for a long operation (drawn only on a terminal,
    so scripts and --json output stay clean): ``with Progress("replaying", total) as p:
    p.update(done)``."""

    def __init__(self, label: str, total: int | None) -> None:
        self.label, self.total, self.done = label, total, 0
        self._tty = sys.stderr.isatty()

    def update(self, done: int) -> None:
        self.done = done
        if self._tty:
            of = f"/{self.total}" if self.total is not None else ""
            bar = ""
            if self.total:
                filled = int(30 * min(done, self.total) / self.total)
                bar = "[" + "#" * filled + "-" * (30 - filled) + "] "
            click.echo(f"\r{self.label} {bar}{done}{of}", nl=False, err=True)

    def __enter__(self) -> Progress:
        self.update(0)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._tty:
            click.echo("", err=True)


def confirm(question: str, yes: bool) -> None:
    """Abort (exit 1) unless --yes was given or the user agrees."""
    if not yes:
        click.confirm(question, abort=True, err=True)


def note(message: str) -> None:
    """A remark for the person at the terminal, kept off stdout."""
    click.echo(message, err=True)


# -- formatting single values --------------------------------------------------------------

def duration(seconds: int | float | None) -> str:
    """Seconds as ``12s``, ``3m04s``, ``2h01m``, ``4d00h``."""
    if seconds is None:
        return MISSING
    s = max(int(seconds), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def preview(text: str | None, width: int = BODY_PREVIEW) -> str:
    """One line at most ``width`` columns wide: control characters escaped (a newline in
    a body would break the table), the rest cut with ``...``."""
    if text is None:
        return MISSING
    flat = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    if _width(flat) <= width:
        return flat
    kept, used = [], 0
    for c in flat:
        used += _width(c)
        if used > width - 3:
            break
        kept.append(c)
    return "".join(kept) + "..."


def cell(value: Any) -> str:
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    return str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _width(text: str) -> int:
    # East Asian wide characters take two terminal columns
    return sum(2 if unicodedata.east_asian_width(c) in ("W", "F") else 1 for c in text)


def _pad(text: str, width: int, right: bool) -> str:
    fill = " " * (width - _width(text))
    return fill + text if right else text + fill


# -- tables and records --------------------------------------------------------------------

@dataclass(frozen=True)
class Column:
    """A table column: ``get`` picks the value from a row (an attribute or key name, or a
    function); ``fmt`` turns it into text (default ``cell``). Numbers align right, as does
    any column with ``right=True`` (e.g. durations, which ``fmt`` has made text)."""

    header: str
    get: str | Callable[[Any], Any]
    fmt: Callable[[Any], str] | None = None
    right: bool = False

    def value(self, row: Any) -> Any:
        if callable(self.get):
            return self.get(row)
        if isinstance(row, Mapping):
            return row.get(self.get)
        return getattr(row, self.get)

    def text(self, value: Any) -> str:
        if self.fmt is not None and value is not None:
            return self.fmt(value)
        return cell(value)


def table(rows: Iterable[Any], columns: Sequence[Column]) -> str:
    """Rows as an aligned plain-text table with a header line."""
    values = [[c.value(r) for c in columns] for r in rows]
    texts = [[c.text(v) for c, v in zip(columns, row, strict=False)] for row in values]
    right = [c.right or (any(_is_number(row[i]) for row in values)
                         and all(v is None or _is_number(v) for v in (row[i] for row in values)))
             for i, c in enumerate(columns)]
    widths = [max([_width(c.header)] + [_width(t[i]) for t in texts]) for i, c in enumerate(columns)]
    lines = [[c.header for c in columns], *texts]
    return "\n".join(
        "  ".join(_pad(t, widths[i], right[i]) for i, t in enumerate(line)).rstrip()
        for line in lines)


def record(pairs: Sequence[tuple[str, Any]]) -> str:
    """One object as ``label  value`` lines, labels aligned."""
    width = max((_width(label) for label, _ in pairs), default=0)
    return "\n".join(f"{_pad(label, width, False)}  {cell(value)}".rstrip() for label, value in pairs)


def emit_rows(rows: Sequence[Any], columns: Sequence[Column], as_json: bool, *,
              empty: str, data: Callable[[Any], Any] = to_data) -> None:
    """A list of rows: JSON list, or a table (``empty`` when there are none)."""
    if as_json:
        print_json([data(r) for r in rows])
    elif rows:
        click.echo(table(rows, columns))
    else:
        click.echo(empty)


def emit(value: Any, as_json: bool, text: str | Callable[[], str]) -> None:
    """One result: ``value`` as JSON, or ``text`` (a string or a function making it)."""
    if as_json:
        print_json(value)
    else:
        click.echo(text() if callable(text) else text)
