"""JSON entering Conveyor: one parser with one nesting limit, for every protocol.

orjson reads values nested up to 1024 arrays and objects deep but writes back at most 254,
so a body of 300 levels taken on a send could never be answered by a receive (every
receive of it failed: a poison message), and one past 1024 was an error of the parser
that some entries answered 500. Everything that reads JSON from a client (REST, Queen
and hq bodies, the AWS JSON protocol's bodies, the JSON documents inside SQS and SNS
attributes, filter policies) goes through ``loads``, which refuses values nested deeper
than ``MAX_DEPTH`` with ``TooDeep``: an ``orjson.JSONDecodeError``, so every entry that
already answers malformed JSON in its protocol's format answers this the same way.

``MAX_DEPTH`` is 127, the deepest hq's parser (serde_json, whose default recursion limit
is 128) takes; far below what orjson writes back, with room for the envelopes a receive
wraps around a body (REST's array of messages, Queen's ``{"messages": [{"data": ...}]}``).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

MAX_DEPTH = 127
_NESTED = (dict, list)


class TooDeep(orjson.JSONDecodeError):
    """A JSON value nested deeper than ``MAX_DEPTH`` arrays and objects."""

    def __init__(self, doc: str = "") -> None:
        super().__init__(f"nested deeper than {MAX_DEPTH} arrays and objects", doc, 0)


# Digits as "0", everything else as " ": a run of 19 zeros is then 19 digits in a row.
_DIGITS_ONLY = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_LONG_RUN = b"0" * 19


def may_hold_long_integers(data: bytes | bytearray | memoryview | str) -> bool:
    """Whether the JSON text has 19 digits in a row: an integer orjson may not read exactly
    (one past 64 bits it reads as a float, silently; one past a float's range not at all).
    A translation and a search, at C speed (a regex for the run cost more than a parse)."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    return _LONG_RUN in raw.translate(_DIGITS_ONLY)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads(data: bytes | bytearray | memoryview | str, *, big_integers: bool = False) -> Any:
    """``orjson.loads(data)``, or ``TooDeep``; with ``big_integers``, a text that may hold
    integers orjson does not read exactly (past 64 bits) is read by the standard library's
    parser instead, which keeps them as they are written (and refuses ``NaN`` and
    ``Infinity``, as orjson does)."""
    if big_integers and may_hold_long_integers(data):
        try:
            value = json.loads(bytes(data) if isinstance(data, memoryview) else data,
                               parse_constant=_refuse_constant)
        except RecursionError:
            raise TooDeep() from None
        except ValueError as exc:
            orjson.loads(data)  # malformed: orjson's error, as for any other text, or
            raise orjson.JSONDecodeError(str(exc), "", 0) from None  # what only this parser refuses
    else:
        try:
            value = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            if exc.msg.startswith("depth limit exceeded"):  # orjson's own, past 1024
                raise TooDeep() from None
            raise
    check(value, data)
    return value


def check(value: Any, data: bytes | bytearray | memoryview | str | None = None) -> None:
    """``TooDeep`` if ``value`` nests deeper than ``MAX_DEPTH``. ``data``, the text it was
    read from, lets the usual case pass at the cost of counting brackets: a text with no
    more than ``MAX_DEPTH`` opening brackets in all cannot nest deeper."""
    if data is not None and _brackets(data) <= MAX_DEPTH:
        return
    # orjson's encoder refuses values nested deeper than it writes: wrapped in as many
    # arrays as that is beyond MAX_DEPTH, the value is written (and discarded) at C speed
    # iff it nests MAX_DEPTH deep at most; a Python walk cost 5-20x as much
    wrapped = value
    for _ in range(_ENCODER_DEPTH - MAX_DEPTH):
        wrapped = [wrapped]
    try:
        orjson.dumps(wrapped)
        return
    except orjson.JSONEncodeError as exc:
        if str(exc) == _TOO_DEEP_TO_WRITE:
            raise TooDeep() from None
    if depth(value) > MAX_DEPTH:  # what orjson cannot write otherwise: integers past 64 bits
        raise TooDeep()


def _brackets(data: bytes | bytearray | memoryview | str) -> int:
    if isinstance(data, str):
        return data.count("[") + data.count("{")
    raw = bytes(data) if isinstance(data, memoryview) else data
    return raw.count(b"[") + raw.count(b"{")


def depth(value: Any) -> int:
    """Arrays and objects nested in ``value`` (0 for a scalar), stopping once it is past
    ``MAX_DEPTH``; iterative, so no Python recursion limit is involved."""
    deepest = 0
    stack = [(value, 1)] if isinstance(value, _NESTED) else []
    while stack:
        node, level = stack.pop()
        if level > deepest:
            deepest = level
            if deepest > MAX_DEPTH:
                break
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, level + 1) for child in children if isinstance(child, _NESTED))
    return deepest


def _nest(levels: int) -> Any:
    value: Any = None
    for _ in range(levels):
        value = [value]
    return value


def encoder_depth() -> tuple[int, str]:
    """The deepest nesting orjson.dumps writes, and what it says beyond (found by trying,
    once at import: it is orjson's constant, not an option)."""
    lo, hi = 1, 4096
    while lo < hi:
        mid = (lo + hi + 1) // 2
        try:
            orjson.dumps(_nest(mid))
            lo = mid
        except orjson.JSONEncodeError:
            hi = mid - 1
    try:
        orjson.dumps(_nest(lo + 1))
    except orjson.JSONEncodeError as exc:
        return lo, str(exc)
    return lo, ""


_ENCODER_DEPTH, _TOO_DEEP_TO_WRITE = encoder_depth()
