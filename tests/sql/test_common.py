"""The SQL helpers every part shares (src/conveyor/sql/functions/05_common.sql)."""

from __future__ import annotations

import random
import uuid

import psycopg
import pytest

UUID_REGEX = "^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$"


def _texts() -> list[str]:
    """UUIDs in every form the regex takes, and near misses: a character changed, added,
    dropped or turned into a hyphen, hyphens moved, braces."""
    rng = random.Random(26)
    texts = ["", "-", "{" + str(uuid.uuid4()) + "}", "urn:uuid:" + str(uuid.uuid4())]
    for _ in range(300):
        plain = uuid.uuid4().hex
        groups = [plain[:8], plain[8:12], plain[12:16], plain[16:20], plain[20:]]
        text = groups[0] + "".join(rng.choice(["-", ""]) + g for g in groups[1:])
        text = text.upper() if rng.random() < 0.2 else text
        texts.append(text)
        at = rng.randrange(len(text))
        texts += [text[:at] + rng.choice("-gG0 ") + text[at + 1:], text[:at] + "-" + text[at:],
                  text[:at] + text[at + 1:], text + rng.choice("0-")]
    return texts


async def test_is_uuid_says_what_the_regex_says(conn):
    texts = _texts()
    cur = await conn.execute(f"SELECT t, conveyor._is_uuid(t), t ~* '{UUID_REGEX}' FROM unnest(%s::text[]) t",
                             (texts,))
    rows = await cur.fetchall()
    assert len(rows) == len(texts)
    assert [r for r in rows if r[1] != r[2]] == []
    assert 300 <= sum(1 for r in rows if r[1]) < len(rows)  # both kinds are there
    cur = await conn.execute("SELECT conveyor._is_uuid(NULL)")
    assert (await cur.fetchone())[0] is None


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
