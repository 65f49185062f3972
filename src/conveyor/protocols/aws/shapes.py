"""Shapes: the structure of AWS requests and responses, enough to read both wire formats.

AWS's JSON protocol carries typed JSON; its Query protocol flattens the same structures
into form fields (``Attribute.1.Name=...``) and answers in XML. A shape says how: which
members a structure has, under which wire names, whether a list or map is "flattened"
(its entries repeat the member's name) or wrapped (``Name.member.1``, ``Name.entry.1``).
The same description drives three walks:

- ``from_query``: form fields -> typed Python values (a dict per structure),
- ``from_json``: JSON values -> the same typed values (checking types on the way),
- ``to_xml``: typed values -> XML elements for a Query-protocol response.

Handlers only ever see the typed values, so they do not know which protocol was used.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from xml.sax.saxutils import escape

MAX_LIST_ENTRIES = 1000  # a bound on how far a form's numbered entries are read


class ShapeError(ValueError):
    """A value does not fit its shape; ``path`` names the offending parameter."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class Shape:
    pass


@dataclass(frozen=True)
class Scalar(Shape):
    kind: str  # string | integer | long | boolean | blob


STRING = Scalar("string")
INTEGER = Scalar("integer")
LONG = Scalar("long")
BOOLEAN = Scalar("boolean")
BLOB = Scalar("blob")


@dataclass(frozen=True)
class ListOf(Shape):
    member: Shape
    member_name: str | None = None
    flattened: bool = False


@dataclass(frozen=True)
class MapOf(Shape):
    value: Shape
    key_name: str = "key"
    value_name: str = "value"
    flattened: bool = False


@dataclass(frozen=True)
class Member:
    shape: Shape
    wire: str | None = None  # the member's name on the wire (AWS "locationName")


@dataclass(frozen=True)
class Struct(Shape):
    members: Mapping[str, Member | Shape] = field(default_factory=dict)

    @functools.cached_property
    def _normalised(self) -> dict[str, Member]:
        return {name: m if isinstance(m, Member) else Member(m) for name, m in self.members.items()}

    def member(self, name: str) -> Member:
        return self._normalised[name]


# -- Query form -> values ----------------------------------------------------------------

def from_query(shape: Struct, form: Mapping[str, str]) -> dict[str, Any]:
    """Read a structure from Query-protocol form fields."""
    return _read_struct(shape, _Form(form), "")


class _Form:
    """Form fields, with the dotted prefixes of their names indexed (on first need), so
    that asking whether anything lies under a name is a set lookup, not a scan of every
    field: a scan per list entry made a large form cost fields x entries (a 3.5 MB form
    held the event loop for 40 s)."""

    __slots__ = ("_parents", "fields")

    def __init__(self, fields: Mapping[str, str]) -> None:
        self.fields = fields
        self._parents: set[str] | None = None

    def has_children(self, key: str) -> bool:
        if self._parents is None:
            parents = set()
            for name in self.fields:
                dot = name.find(".")
                while dot != -1:
                    parents.add(name[:dot])
                    dot = name.find(".", dot + 1)
            self._parents = parents
        return key in self._parents

    def present(self, key: str) -> bool:
        return key in self.fields or self.has_children(key)


def _read_struct(shape: Struct, form: _Form, prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in shape.members:
        member = shape.member(name)
        value = _read(member.shape, form, prefix + (member.wire or name))
        if value is not None:
            out[name] = value
    return out


def _read(shape: Shape, form: _Form, key: str) -> Any:
    if isinstance(shape, Scalar):
        raw = form.fields.get(key)
        return None if raw is None else _scalar(shape, raw, key)
    if isinstance(shape, Struct):
        return _read_struct(shape, form, key + ".") if form.has_children(key) else None
    if isinstance(shape, ListOf):
        return _read_list(shape, form, key)
    if isinstance(shape, MapOf):
        return _read_map(shape, form, key)
    raise TypeError(shape)


def _list_base(shape: ListOf, key: str) -> str:
    if shape.flattened:
        if shape.member_name:  # the member's name replaces the last part of the key
            return ".".join([*key.split(".")[:-1], shape.member_name])
        return key
    return f"{key}.{shape.member_name or 'member'}"


def _read_list(shape: ListOf, form: _Form, key: str) -> list[Any] | None:
    base = _list_base(shape, key)
    items = []
    for i in range(1, MAX_LIST_ENTRIES + 1):
        entry = f"{base}.{i}"
        if not form.present(entry):
            break
        item = _read(shape.member, form, entry)
        if item is None:  # "List.member.2=x" where an entry is a structure, or only sub-keys of a scalar
            raise ShapeError(entry, "must be a structure" if isinstance(shape.member, Struct) else "missing")
        items.append(item)
    if not items:
        return [] if form.fields.get(key) == "" else None  # "Name=" is how Query says "empty list"
    return items


def _read_map(shape: MapOf, form: _Form, key: str) -> dict[str, Any] | None:
    base = key if shape.flattened else f"{key}.entry"
    out: dict[str, Any] = {}
    for i in range(1, MAX_LIST_ENTRIES + 1):
        entry = f"{base}.{i}"
        if not form.present(entry):
            break
        name = form.fields.get(f"{entry}.{shape.key_name}")
        if name is None:
            raise ShapeError(f"{entry}.{shape.key_name}", "missing")
        value = _read(shape.value, form, f"{entry}.{shape.value_name}")
        if value is None:
            raise ShapeError(f"{entry}.{shape.value_name}", "missing")
        out[name] = value
    return out or None


def _scalar(shape: Scalar, raw: str, path: str) -> Any:
    if shape.kind == "string":
        return raw
    if shape.kind in ("integer", "long"):
        if not re.fullmatch(r"\s*[-+]?\d+\s*", raw):
            raise ShapeError(path, f"{raw!r} is not an integer")
        return int(raw)
    if shape.kind == "boolean":
        if raw.lower() not in ("true", "false"):
            raise ShapeError(path, f"{raw!r} is not a boolean")
        return raw.lower() == "true"
    if shape.kind == "blob":
        return _b64(raw, path)
    raise TypeError(shape.kind)


def _b64(raw: str, path: str) -> bytes:
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise ShapeError(path, "is not valid base64") from None


# -- JSON -> values ----------------------------------------------------------------------

def from_json(shape: Shape, value: Any, path: str = "") -> Any:
    """Check a JSON-protocol value against its shape, decoding blobs."""
    try:
        return _from_json(shape, value)
    except _Misfit as exc:
        where = ".".join(part for part in (path, *reversed(exc.parts)) if part)
        raise ShapeError(where or "body", exc.reason) from None


class _Misfit(Exception):
    """A value that does not fit, on its way up: each level adds its name to ``parts``, so
    the error's path is only built when there is an error."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.parts: list[str] = []


def _from_json(shape: Shape, value: Any) -> Any:
    if value is None:
        return None
    if shape.__class__ is Scalar:
        if value.__class__ is str and shape.kind == "string":  # the common case first
            return value
        try:
            return _json_scalar(shape, value, "")
        except ShapeError as exc:
            raise _Misfit(exc.reason) from None
    if isinstance(shape, Struct):
        if not isinstance(value, dict):
            raise _Misfit("must be an object")
        out = {}
        members = shape._normalised
        for name, item in value.items():
            member = members.get(name)
            if member is None or item is None:
                continue
            try:
                converted = _from_json(member.shape, item)
            except _Misfit as exc:
                exc.parts.append(name)
                raise
            if converted is not None:
                out[name] = converted
        return out
    if isinstance(shape, ListOf):
        if not isinstance(value, list):
            raise _Misfit("must be a list")
        items = []
        for i, item in enumerate(value, 1):
            try:
                items.append(_not_null(shape.member, item))
            except _Misfit as exc:
                exc.parts.append(str(i))
                raise
        return items
    if isinstance(shape, MapOf):
        if not isinstance(value, dict):
            raise _Misfit("must be a map")
        entries = {}
        for key, item in value.items():
            try:
                entries[key] = _not_null(shape.value, item)
            except _Misfit as exc:
                exc.parts.append(key)
                raise
        return entries
    raise TypeError(f"not a shape: {shape!r}")


def _not_null(shape: Shape, value: Any) -> Any:
    """A list item or map value: null there is no "absent" but a value that does not fit."""
    if value is None:
        raise _Misfit("must not be null")
    return _from_json(shape, value)


def _json_scalar(shape: Scalar, value: Any, path: str) -> Any:
    if shape.kind == "string":
        if not isinstance(value, str):
            raise ShapeError(path, "must be a string")
        return value
    if shape.kind in ("integer", "long"):
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ShapeError(path, "must be an integer")
        return _scalar(shape, value, path) if isinstance(value, str) else value
    if shape.kind == "boolean":
        if isinstance(value, str):
            return _scalar(shape, value, path)
        if not isinstance(value, bool):
            raise ShapeError(path, "must be a boolean")
        return value
    if shape.kind == "blob":
        if not isinstance(value, str):
            raise ShapeError(path, "must be a base64 string")
        return _b64(value, path)
    raise TypeError(shape.kind)


# -- values -> XML -----------------------------------------------------------------------

def to_xml(shape: Struct, value: Mapping[str, Any]) -> str:
    """The members of a structure as XML elements (the caller writes the enclosing tag)."""
    parts = []
    for name in shape.members:
        item = value.get(name)
        if item is None:
            continue
        member = shape.member(name)
        parts.append(_xml(member.shape, member.wire or name, item))
    return "".join(parts)


def _xml(shape: Shape, tag: str, value: Any) -> str:
    if isinstance(shape, Scalar):
        return f"<{tag}>{xml_text(_text(shape, value))}</{tag}>"
    if isinstance(shape, Struct):
        return f"<{tag}>{to_xml(shape, value)}</{tag}>"
    if isinstance(shape, ListOf):
        if shape.flattened:
            name = shape.member_name or tag
            return "".join(_xml(shape.member, name, item) for item in value)
        name = shape.member_name or "member"
        return f"<{tag}>" + "".join(_xml(shape.member, name, item) for item in value) + f"</{tag}>"
    if isinstance(shape, MapOf):
        if shape.flattened:
            return "".join(f"<{tag}>{_entry(shape, k, v)}</{tag}>" for k, v in value.items())
        return f"<{tag}>" + "".join(f"<entry>{_entry(shape, k, v)}</entry>" for k, v in value.items()) + f"</{tag}>"
    raise TypeError(shape)


def _entry(shape: MapOf, key: str, value: Any) -> str:
    return f"<{shape.key_name}>{xml_text(key)}</{shape.key_name}>" + _xml(shape.value, shape.value_name, value)


def _text(shape: Scalar, value: Any) -> str:
    if shape.kind == "boolean":
        return "true" if value else "false"
    if shape.kind == "blob":
        return base64.b64encode(value).decode()
    return str(value)


# characters XML 1.0 allows nowhere, not even as character references
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_text(text: str) -> str:
    """Escape text for an XML element. A carriage return is written as a character
    reference: XML parsers turn a literal CR (and CRLF) into LF, which would change the
    message body that the client then checks against MD5OfBody. Characters XML cannot
    carry at all (stored messages never hold them, error messages may quote them from a
    request) become U+FFFD, so that the document still parses."""
    if not text.isprintable() and _NOT_XML.search(text):  # isprintable: a quick "none here" for most text
        text = _NOT_XML.sub("\ufffd", text)
    return escape(text).replace("\r", "&#xD;")
