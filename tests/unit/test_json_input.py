"""conveyor.json_input: one parser, one nesting limit, at or below what orjson writes back."""

from __future__ import annotations

import json

import orjson
import pytest

from conveyor import json_input
from conveyor.json_input import MAX_DEPTH


def arrays(levels: int, leaf: str = "1") -> str:
    return "[" * levels + leaf + "]" * levels


def test_the_limit_is_what_orjson_can_write_back_with_room_for_envelopes():
    written, beyond = json_input.encoder_depth()
    assert written >= MAX_DEPTH + 4 and beyond  # (the check relies on orjson refusing deeper values)
    deepest = json_input.loads(arrays(MAX_DEPTH))
    for envelope in range(4):  # a receive wraps a body in a few arrays and objects more
        orjson.dumps({"messages": [{"data": deepest}]} if envelope else deepest)


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 254, 255, 1024, 1025, 5000])
def test_deeper_values_are_refused_as_malformed_json(levels):
    with pytest.raises(json_input.TooDeep) as refused:
        json_input.loads(arrays(levels))
    assert isinstance(refused.value, orjson.JSONDecodeError) and isinstance(refused.value, ValueError)
    assert f"deeper than {MAX_DEPTH}" in refused.value.msg


def test_objects_count_like_arrays():
    text = '{"a":' * MAX_DEPTH + "1" + "}" * MAX_DEPTH
    assert json_input.depth(json_input.loads(text)) == MAX_DEPTH
    with pytest.raises(json_input.TooDeep):
        json_input.loads('{"a":' + text + "}")


def test_brackets_inside_strings_do_not_count():
    text = orjson.dumps({"body": "[" * 5000, "list": ["{" * 300]})
    assert json_input.loads(text) == {"body": "[" * 5000, "list": ["{" * 300]}


def test_wide_values_are_not_deep():
    wide = [[{"a": [i]}] for i in range(10000)]
    assert json_input.loads(orjson.dumps(wide)) == wide
    assert json_input.depth(wide) == 4


@pytest.mark.parametrize("value,expected", [(1, 0), ("x", 0), ([], 1), ({}, 1), ([[], [[{}]]], 4)])
def test_depth(value, expected):
    assert json_input.depth(value) == expected


def test_big_integers_only_when_asked_and_still_limited():
    huge = "1" * 400  # past a double: orjson refuses it
    with pytest.raises(orjson.JSONDecodeError):
        json_input.loads(huge)
    assert json_input.loads(huge, big_integers=True) == int(huge)
    assert json_input.loads(arrays(MAX_DEPTH, huge), big_integers=True) == json.loads(arrays(MAX_DEPTH, huge))
    with pytest.raises(json_input.TooDeep):
        json_input.loads(arrays(MAX_DEPTH + 1, huge), big_integers=True)
    with pytest.raises(json_input.TooDeep):  # the standard library's parser would recurse out
        json_input.loads("[" + huge + "," + arrays(1100) + "]", big_integers=True)
    with pytest.raises(orjson.JSONDecodeError) as malformed:
        json_input.loads("[1,", big_integers=True)
    assert not isinstance(malformed.value, json_input.TooDeep)


def test_check_without_the_text_walks_the_value():
    json_input.check(json.loads(arrays(MAX_DEPTH)))
    with pytest.raises(json_input.TooDeep):
        json_input.check(json.loads(arrays(MAX_DEPTH + 1)))


@pytest.mark.parametrize("text", ['{"n": 123456789012345678901234567890}', "[-9223372036854775809, 1.5]",
                                  '{"id": "0123456789012345678901", "n": 18446744073709551616}'])
def test_big_integers_keep_their_digits(text):
    """orjson reads an integer past 64 bits as a float without a word (past a float's
    range it refuses it): asked for big integers, the text is read by the standard
    library's parser, which keeps every digit."""
    assert repr(json_input.loads(text, big_integers=True)) == repr(json.loads(text))


@pytest.mark.parametrize("text", ["[NaN, 12345678901234567890]", '{"a": Infinity, "n": 12345678901234567890}',
                                  "[1234567890123456789012,"])
def test_what_orjson_refuses_is_refused_with_big_integers_too(text):
    with pytest.raises(orjson.JSONDecodeError):
        json_input.loads(text, big_integers=True)
