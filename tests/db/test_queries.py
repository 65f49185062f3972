from __future__ import annotations

import re

import pytest

from conveyor.db import queries


def test_parse_blocks():
    text = "-- header comment\n\n-- name: a_b\nSELECT 1\n\n-- name: c_d\nSELECT 2;\n"
    assert queries.parse(text) == {"a_b": "SELECT 1", "c_d": "SELECT 2;"}
    with pytest.raises(ValueError, match="twice"):
        queries.parse("-- name: x\nSELECT 1\n-- name: x\nSELECT 2")


ENTITIES = ("queue|message|move_task|stream|topic|subscription|delivery|signing_key|schedule|pipeline|secret|pqueue|spool"
            "|history|lock|table")


def test_every_shipped_query_is_named_entity_first_and_parameterised():
    found = queries.all_queries()
    assert "message_send" in found and "queue_create" in found
    for name, sql in found.items():
        assert re.match(rf"^({ENTITIES})_[a-z_]+$", name), name
        assert "{" not in sql, "no string formatting placeholders in SQL"


def test_unknown_query_name():
    with pytest.raises(KeyError, match="nope"):
        queries.get("nope")
