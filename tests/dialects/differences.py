"""The committed list of expected differences between a dialect and its real peer
(tests/dialects/expected_differences.toml), and the check that holds the side-by-side
tests to it.

Each entry is ``"<scope>:<step>"`` (optionally ``@<variant>``) = the reason, under the
peer's table. A side-by-side run must differ exactly where the list says: a difference not
listed fails (a regression, or a new difference to document), and so does a listed one
that no longer differs (it was fixed: take it off the list). So the list only shrinks
unless someone adds to it on purpose, with a reason, in review.
"""

from __future__ import annotations

import dataclasses
import tomllib
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

FILE = Path(__file__).with_name("expected_differences.toml")


def expected(peer: str, scope: str, variant: str | None = None) -> dict[str, str]:
    """The listed differences of one scope: step -> reason (entries for this variant
    or for every variant)."""
    listed = tomllib.loads(FILE.read_text("utf-8")).get(peer, {})
    out: dict[str, str] = {}
    for key, reason in listed.items():
        where, _, step = key.partition(":")
        step, _, only = step.partition("@")
        if where == scope and (not only or only == variant):
            out[step] = reason
    return out


def check(peer: str, scope: str, ours: dict[str, Any], theirs: dict[str, Any], variant: str | None = None) -> None:
    """Both runs answered step by step; they must differ exactly at the listed steps."""
    assert ours.keys() == theirs.keys(), "both sides must run the same steps"
    listed = expected(peer, scope, variant)
    differing = {step for step in ours if ours[step] != theirs[step]}
    unlisted = {s: (ours[s], theirs[s]) for s in sorted(differing - listed.keys())}
    fixed = sorted(listed.keys() - differing)
    report = "\n".join(f"  {s}:\n    dialect: {o!r}\n    peer:    {t!r}" for s, (o, t) in unlisted.items())
    assert not unlisted, f"{peer}/{scope}{'@' + variant if variant else ''}: differences not listed in {FILE.name}:\n{report}"
    assert not fixed, (f"{peer}/{scope}{'@' + variant if variant else ''}: listed in {FILE.name} but the same now "
                       f"(take them off the list): {fixed}")


def plain(value: Any) -> Any:
    """A result made comparable across databases: timestamps become "ts", dataclasses
    dicts, containers recursively so."""
    if isinstance(value, datetime):
        return "ts"
    if isinstance(value, timedelta):
        return "interval"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def failure(exc: BaseException) -> tuple[str, str, str]:
    """An exception as comparable data: its class and the first line of its message."""
    lines = str(exc).strip().splitlines() or [""]
    return ("error", type(exc).__name__, lines[0])
