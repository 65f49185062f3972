"""Message attributes: AWS's validation rules, how they are stored, and their MD5 digests.

Attributes are kept in the message's ``headers`` in their typed form
(``{"DataType": "String", "StringValue": "..."}``, binary values as base64), so a message
sent through SQS shows its attributes to REST consumers and the other way round: a plain
REST header becomes a String attribute (a number a Number attribute, anything else its
JSON text). System attributes (``AWSTraceHeader``) live in ``system_attributes``.

The digests are computed exactly as AWS does, over the UTF-8 body and over the attributes
sorted by name, each as length-prefixed name, type, a transport byte (1 string, 2 binary)
and length-prefixed value; SDKs that check them reject any difference.
"""

from __future__ import annotations

import base64
import hashlib
import re
import struct
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson

from conveyor.protocols.sqs.errors import SqsError

MAX_ATTRIBUTES = 10
SYSTEM_ATTRIBUTES = ("AWSTraceHeader",)
_NAME = re.compile(r"^[\w\-.]{1,256}$")  # letters of any script (attr.1øßä), digits, _ - .
_TYPE = re.compile(r"^(String|Number|Binary)(\.[^\s]{1,250})?$")
# the characters a message may contain (#x9 | #xA | #xD | #x20-#xD7FF | #xE000-#xFFFD | #x10000-#x10FFFF)
_INVALID = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
INVALID_CHARACTERS = ("Invalid characters found. Valid unicode characters are #x9 | #xA | #xD | "
                      "#x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF")


def check_characters(text: str, kind: str = "InvalidMessageContents") -> None:
    """A body with characters a message may not contain is ``InvalidMessageContents``; an
    attribute value with them is ``InvalidParameterValue``, as AWS answers each."""
    if _INVALID.search(text):
        raise SqsError(kind, INVALID_CHARACTERS)


# -- validation and storage ----------------------------------------------------------------

def _invalid(message: str) -> SqsError:
    return SqsError("InvalidParameterValue", message)


def _check_name(name: str, what: str) -> None:
    if not _NAME.match(name) or name.startswith(".") or name.endswith(".") or ".." in name:
        raise _invalid(f"{what} name '{name}' is invalid. A name can contain alphanumeric characters, "
                       "hyphens, underscores and periods, up to 256 characters, and must not start or end "
                       "with a period nor contain two periods in a row.")
    if name.lower().startswith(("aws.", "amazon.")):
        raise _invalid(f"{what} name '{name}' is reserved for use by Amazon.")


def _stored_value(name: str, value: Mapping[str, Any]) -> dict[str, str]:
    data_type = value.get("DataType")
    if not data_type:
        raise _invalid(f"The message attribute '{name}' must contain non-empty message attribute type.")
    if not _TYPE.match(data_type):
        raise _invalid(f"The type of message (user) attribute '{name}' is invalid. You must use only the "
                       "following supported type prefixes: Binary, Number, String.")
    if value.get("StringListValues") or value.get("BinaryListValues"):
        raise SqsError("UnsupportedOperation", "Message attribute list values in SendMessage operation are not supported.")
    if data_type.startswith("Binary"):
        raw = value.get("BinaryValue")
        if not raw:
            raise _invalid(f"The message attribute '{name}' with type 'Binary' must use field 'Binary'.")
        return {"DataType": data_type, "BinaryValue": base64.b64encode(raw).decode()}
    text = value.get("StringValue")
    if text is None or text == "":
        raise _invalid(f"The message attribute '{name}' must contain non-empty message attribute value "
                       f"for message attribute type '{data_type.split('.')[0]}'.")
    check_characters(text, "InvalidParameterValue")
    if data_type.startswith("Number"):
        _check_number(name, text)
    return {"DataType": data_type, "StringValue": text}


def _check_number(name: str, text: str) -> None:
    try:
        number = Decimal(text.strip())
    except InvalidOperation:
        raise _invalid(f"Can't convert the value of message attribute '{name}' to a number.") from None
    if not number.is_finite() or len(number.as_tuple().digits) > 38:
        raise _invalid(f"The value of message attribute '{name}' is not a number of at most 38 digits.")


def stored_attributes(attributes: Mapping[str, Mapping[str, Any]] | None) -> dict[str, dict[str, str]] | None:
    """Validate MessageAttributes as AWS does; return them in their stored form."""
    if not attributes:
        return None
    if len(attributes) > MAX_ATTRIBUTES:
        raise _invalid(f"Number of message attributes [{len(attributes)}] exceeds the allowed maximum "
                       f"[{MAX_ATTRIBUTES}].")
    out = {}
    for name, value in attributes.items():
        _check_name(name, "Message attribute")
        out[name] = _stored_value(name, value)
    return out


def stored_system_attributes(attributes: Mapping[str, Mapping[str, Any]] | None) -> dict[str, dict[str, str]] | None:
    if not attributes:
        return None
    out = {}
    for name, value in attributes.items():
        if name not in SYSTEM_ATTRIBUTES:
            raise _invalid(f"Message system attribute name '{name}' is invalid.")
        stored = _stored_value(name, value)
        if stored["DataType"] != "String":
            raise _invalid(f"Message system attribute '{name}' must be of type String.")
        out[name] = stored
    return out


def size(stored: Mapping[str, Mapping[str, str]] | None) -> int:
    """Bytes the attributes count for against the maximum message size (name, type, value)."""
    total = 0
    for name, value in (stored or {}).items():
        total += len(name.encode()) + len(value["DataType"].encode())
        if "BinaryValue" in value:
            total += len(base64.b64decode(value["BinaryValue"]))
        else:
            total += len(value["StringValue"].encode())
    return total


# -- reading back ----------------------------------------------------------------------------

def _typed(value: Any) -> dict[str, str]:
    if isinstance(value, dict) and isinstance(value.get("DataType"), str) and \
            ("StringValue" in value or "BinaryValue" in value):
        return value
    if isinstance(value, bool) or value is None or isinstance(value, (dict, list)):
        return {"DataType": "String", "StringValue": orjson.dumps(value).decode()}
    if isinstance(value, (int, float)):
        return {"DataType": "Number", "StringValue": str(value)}
    return {"DataType": "String", "StringValue": str(value)}


def from_headers(headers: Mapping[str, Any] | None) -> dict[str, dict[str, str]]:
    """A stored message's headers as SQS message attributes."""
    return {name: _typed(value) for name, value in (headers or {}).items()}


def select(attributes: Mapping[str, dict[str, str]], names: Iterable[str] | None) -> dict[str, dict[str, str]]:
    """The attributes a receive asked for: names, ``All`` (or ``*``, ``.*``), or ``prefix.*``
    (every name that starts with ``prefix``)."""
    wanted = list(names or [])
    if not wanted:
        return {}
    if "All" in wanted or ".*" in wanted or "*" in wanted:
        return dict(attributes)
    prefixes = tuple(n[:-2] for n in wanted if n.endswith(".*"))  # "Hel.*": Hello and Help.Me
    exact = set(wanted)
    return {k: v for k, v in attributes.items() if k in exact or (prefixes and k.startswith(prefixes))}


def to_wire(attributes: Mapping[str, dict[str, str]]) -> dict[str, dict[str, Any]]:
    """Stored form -> the wire form (binary values as bytes, rendered by the codec)."""
    out = {}
    for name, value in attributes.items():
        if "BinaryValue" in value:
            out[name] = {"DataType": value["DataType"], "BinaryValue": base64.b64decode(value["BinaryValue"])}
        else:
            out[name] = {"DataType": value["DataType"], "StringValue": value["StringValue"]}
    return out


# -- digests -----------------------------------------------------------------------------------

def md5_of_body(body: str) -> str:
    return hashlib.md5(body.encode("utf-8"), usedforsecurity=False).hexdigest()


def _length_prefixed(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def md5_of_attributes(attributes: Mapping[str, Mapping[str, str]] | None) -> str | None:
    """AWS's MD5OfMessageAttributes (and MD5OfMessageSystemAttributes) over stored-form
    attributes; None when there are none."""
    if not attributes:
        return None
    digest = hashlib.md5(usedforsecurity=False)
    for name in sorted(attributes):
        value = attributes[name]
        digest.update(_length_prefixed(name.encode("utf-8")))
        digest.update(_length_prefixed(value["DataType"].encode("utf-8")))
        if "BinaryValue" in value:
            digest.update(b"\x02" + _length_prefixed(base64.b64decode(value["BinaryValue"])))
        else:
            digest.update(b"\x01" + _length_prefixed(value["StringValue"].encode("utf-8")))
    return digest.hexdigest()
