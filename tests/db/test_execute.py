"""Rows onto value types: by position when the columns are the fields in order, by name
otherwise (extra columns, e.g. from a newer schema, are ignored)."""

import uuid

from conveyor import types
from conveyor.db import execute


def test_columns_in_field_order_map_by_position():
    u = uuid.uuid4()
    assert execute._row_maker(types.Sent, ("id", "message_uuid"))((7, u)) == types.Sent(7, u)


def test_other_columns_map_by_name_and_extras_are_ignored():
    u = uuid.uuid4()
    make = execute._row_maker(types.Sent, ("message_uuid", "added_later", "id"))
    assert make((u, "x", 7)) == types.Sent(id=7, message_uuid=u)
