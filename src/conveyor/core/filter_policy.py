"""SNS subscription filter policies: checked here before they are stored.

Matching happens in SQL (``conveyor._filter_policy_matches``) so that a publish stays one
statement; this module checks a policy the way SNS does and returns it as a dict. The
rules (docs/topics.md, "Filter policies"):

- a JSON object of at most 256 KiB; each key maps to a list of match values, or, with
  scope MessageBody, to a nested object; ``"$or"`` maps to a list of two or more
  policies, any of which must match;
- a match value is a string, a number, true, false or null (exact match), or an object
  with one operator: ``prefix``, ``suffix``, ``equals-ignore-case``, ``anything-but``
  (a value, a list of values, or ``{"prefix"|"suffix"|"equals-ignore-case": ...}``),
  ``numeric`` (``["=", 5]``, ``[">", 0, "<=", 150]``), ``exists`` (true/false) or
  ``cidr``;
- at most five keys (attribute scope: every key; body scope: the top-level keys) and at
  most 150 combinations (the product of the number of values of each key, each times
  its depth in a nested policy).
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Mapping
from typing import Any

import orjson

from conveyor import errors, json_input, types

MAX_BYTES = 256 * 1024
MAX_KEYS = 5
MAX_COMBINATIONS = 150
MAX_NUMBER = 1e9
NUMERIC_OPS = ("=", "<", "<=", ">", ">=")
OPERATORS = ("prefix", "suffix", "equals-ignore-case", "anything-but", "numeric", "exists", "cidr")


def _invalid(detail: str) -> errors.InvalidInput:
    return errors.InvalidInput(f"Invalid parameter: FilterPolicy: {detail}")


def parse(policy: str | Mapping[str, Any]) -> dict[str, Any]:
    """The policy as a dict (from JSON text or a mapping), size-checked."""
    if isinstance(policy, Mapping):
        try:
            text = orjson.dumps(dict(policy))
        except TypeError as exc:  # orjson.JSONEncodeError is a TypeError (e.g. a 70-bit integer)
            raise _invalid(f"Filter policy is not valid JSON: {exc}") from None
    elif isinstance(policy, (str, bytes)):
        text = policy.encode() if isinstance(policy, str) else policy
    else:
        raise _invalid("must be a JSON object")
    if len(text) > MAX_BYTES:
        raise _invalid(f"Filter policy is too large: it must be at most {MAX_BYTES} bytes")
    try:
        value = json_input.loads(text)
    except orjson.JSONDecodeError as exc:
        raise _invalid(f"failed to parse JSON. {exc}") from None
    if not isinstance(value, dict):
        raise _invalid("Filter policy must be a JSON object")
    return value


def validate(policy: str | Mapping[str, Any], scope: str = "MessageAttributes") -> dict[str, Any]:
    """The policy as a dict, or errors.InvalidInput with an SNS-like message (invalid
    JSON, too many keys, too many combinations, bad operators, too large)."""
    if scope not in types.FILTER_POLICY_SCOPES:
        raise errors.InvalidInput(f"Invalid parameter: FilterPolicyScope: Invalid value [{scope}]. "
                                  "Please use either MessageBody or MessageAttributes")
    value = parse(policy)
    _check_object(value, nested_ok=scope == "MessageBody")
    keys = _top_keys(value) if scope == "MessageBody" else _all_keys(value)
    if len(keys) > MAX_KEYS:
        raise _invalid(f"Filter policy can not have more than {MAX_KEYS} keys")
    if combinations(value) > MAX_COMBINATIONS:
        raise _invalid("Filter policy is too complex")
    return value


def combinations(policy: Mapping[str, Any], depth: int = 1) -> int:
    """SNS's complexity measure: the product, over the keys, of the number of values of
    each times the depth of its key (1 at the top; AWS's example: four values three levels
    down and three values two levels down are 3 x 4 x 2 x 3 = 72); "$or" contributes the
    sum of its branches."""
    total = 1
    for key, rule in policy.items():
        if key == "$or":
            total *= sum(combinations(branch, depth) for branch in rule)
        elif isinstance(rule, Mapping):
            total *= combinations(rule, depth + 1)
        else:
            total *= len(rule) * depth
    return total


def _all_keys(policy: Mapping[str, Any]) -> set[str]:
    keys: set[str] = set()
    for key, rule in policy.items():
        if key == "$or":
            for branch in rule:
                keys |= _all_keys(branch)
        else:
            keys.add(key)
    return keys


def _top_keys(policy: Mapping[str, Any]) -> set[str]:
    keys: set[str] = set()
    for key, rule in policy.items():
        keys |= set().union(*(_top_keys(b) for b in rule)) if key == "$or" else {key}
    return keys


def _check_object(policy: Mapping[str, Any], nested_ok: bool) -> None:
    if not policy:
        return
    for key, rule in policy.items():
        if key == "$or":
            if not isinstance(rule, list) or len(rule) < 2 or not all(isinstance(b, dict) and b for b in rule):
                raise _invalid('"$or" must be a list of at least two filter policies')
            for branch in rule:
                _check_object(branch, nested_ok)
        elif isinstance(rule, dict):
            if not nested_ok:
                raise _invalid("Filter policy scope MessageAttributes does not support nested filter policy")
            if not rule:
                raise _invalid(f'"{key}" must not be an empty object')
            _check_object(rule, nested_ok)
        elif isinstance(rule, list):
            if not rule:
                raise _invalid(f'Empty arrays are not allowed: "{key}"')
            for value in rule:
                _check_value(key, value)
        else:
            raise _invalid(f'"{key}" must be an object or an array')


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_value(key: str, value: Any) -> None:
    if value is None or isinstance(value, (str, bool)):
        return
    if _is_number(value):
        _check_range(value)
        return
    if not isinstance(value, dict):
        raise _invalid("Match value must be String, number, true, false, or null")
    if len(value) != 1:
        raise _invalid(f'Match value of "{key}" must have exactly one operator')
    [(op, arg)] = value.items()
    check = _OPERATOR_CHECKS.get(op)
    if check is None:
        raise _invalid(f"Unrecognized match type {op}")
    check(arg)


def _check_range(number: float) -> None:
    if not -MAX_NUMBER <= number <= MAX_NUMBER:
        raise _invalid(f"Numeric values must be from -{MAX_NUMBER:.0f} to {MAX_NUMBER:.0f}, got {number}")


def _check_string(op: str) -> Any:
    def check(arg: Any) -> None:
        if not isinstance(arg, str):
            raise _invalid(f"{op} match pattern must be a string")
    return check


def _check_anything_but(arg: Any) -> None:
    if isinstance(arg, dict):
        if len(arg) != 1 or next(iter(arg)) not in ("prefix", "suffix", "equals-ignore-case"):
            raise _invalid("Unsupported anything-but pattern: use a value, a list of values, "
                           "or one of prefix, suffix, equals-ignore-case")
        [(op, inner)] = arg.items()
        values = inner if isinstance(inner, list) and op == "equals-ignore-case" else [inner]
        if not values or not all(isinstance(v, str) for v in values):
            raise _invalid(f"anything-but {op} match pattern must be a string")
        return
    values = arg if isinstance(arg, list) else [arg]
    if not values:
        raise _invalid("Empty arrays are not allowed: anything-but")
    if not (all(isinstance(v, str) for v in values) or all(_is_number(v) for v in values)):
        raise _invalid("Inside anything but list, start|null|boolean is not supported. "
                       "Use strings or numbers, not both")
    for v in values:
        if _is_number(v):
            _check_range(v)


def _check_numeric(arg: Any) -> None:
    if not isinstance(arg, list) or len(arg) not in (2, 4):
        raise _invalid('Value of numeric must be an array of one or two [operator, number] pairs, '
                       'e.g. [">", 0, "<=", 150]')
    ops, numbers = arg[0::2], arg[1::2]
    for op, number in zip(ops, numbers, strict=False):
        if op not in NUMERIC_OPS:
            raise _invalid(f"Unrecognized numeric range operator: {op}")
        if not _is_number(number):
            raise _invalid(f"Value of {op} must be numeric")
        _check_range(number)
    if len(arg) == 4:
        if ops[0] not in (">", ">=") or ops[1] not in ("<", "<="):
            raise _invalid("Bad numeric range operator: a range is a lower bound (> or >=) then an upper (< or <=)")
        if numbers[0] >= numbers[1]:
            raise _invalid("Bottom must be less than top")


def _check_exists(arg: Any) -> None:
    if not isinstance(arg, bool):
        raise _invalid("exists match pattern must be either true or false.")


def _check_cidr(arg: Any) -> None:
    try:
        if "/" not in arg:
            raise ValueError(arg)
        ipaddress.ip_network(arg, strict=False)
    except (TypeError, ValueError):
        raise _invalid(f"Malformed CIDR, one '/' required: {arg}") from None


_OPERATOR_CHECKS = {
    "prefix": _check_string("prefix"),
    "suffix": _check_string("suffix"),
    "equals-ignore-case": _check_string("equals-ignore-case"),
    "anything-but": _check_anything_but,
    "numeric": _check_numeric,
    "exists": _check_exists,
    "cidr": _check_cidr,
}
