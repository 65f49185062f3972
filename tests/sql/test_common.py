"""The SQL helpers every part shares (src/conveyor/sql/functions/05_common.sql)."""

from __future__ import annotations

import psycopg
import pytest


@pytest.mark.parametrize("text,ok", [
    ("c0a80121-7ac0-4e1c-9a2b-1f2e3d4c5b6a", True), ("C0A80121-7AC0-4E1C-9A2B-1F2E3D4C5B6A", True),
    ("c0a801217ac04e1c9a2b1f2e3d4c5b6a", True), ("c0a80121-7ac04e1c-9a2b1f2e3d4c5b6a", True),
    ("c0a80121-7ac0-4e1c-9a2b-1f2e3d4c5b6", False), ("c0a80121-7ac0-4e1c-9a2b-1f2e3d4c5b6ab", False),
    ("g0a80121-7ac0-4e1c-9a2b-1f2e3d4c5b6a", False), ("c0a8012--7ac0-4e1c-9a2b-1f2e3d4c5b6a", False),
    ("c0a80121--7ac0-4e1c-9a2b-1f2e3d4c5b6a", False), ("{c0a80121-7ac0-4e1c-9a2b-1f2e3d4c5b6a}", False),
    ("", False), (None, None)])
async def test_is_uuid_takes_the_forms_a_cast_reads(conn, text, ok):
    cur = await conn.execute("SELECT conveyor._is_uuid(%s::text), CASE WHEN conveyor._is_uuid(%s::text) "
                             "THEN %s::text::uuid END", (text, text, text))
    got, cast = await cur.fetchone()
    assert got is ok
    assert (cast is not None) == bool(ok)


@pytest.mark.parametrize("given,expected", [('{"n": 7}', 7), ('{"n": "8"}', 8), ('{}', 5), ('{"n": null}', 5),
                                            ('{"n": 7.0}', 7)])
async def test_int_option_takes_numbers_and_numeric_strings(conn, given, expected):
    cur = await conn.execute("SELECT conveyor._int_option(%s::jsonb, 'n', 1, 10, 5)", (given,))
    assert (await cur.fetchone())[0] == expected


@pytest.mark.parametrize("given", ['{"n": "x"}', '{"n": 11}', '{"n": 1.5}', '{"n": [1]}', '{"n": true}'])
async def test_int_option_refuses_the_rest(conn, given):
    with pytest.raises(psycopg.DatabaseError, match="option n must be") as refused:
        await conn.execute("SELECT conveyor._int_option(%s::jsonb, 'n', 1, 10, 5)", (given,))
    assert refused.value.sqlstate == "CVV01"  # Conveyor's own: the server answers it as bad input
