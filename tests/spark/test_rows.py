"""Rows to Arrow for the partitioned-queue reader: sealed payloads opened with the keys the
driver resolved (conveyor.crypto), clear ones untouched, and a sealed one without keys
refused rather than handed to Spark as ciphertext."""

from __future__ import annotations

import datetime as dt

import pytest

from conveyor import crypto, errors, settings
from conveyor.spark import rows, schemas

FIELDS = schemas.PARTITIONED_MESSAGES


def _row(seq: int, payload: str, sealed: bool) -> tuple:
    return ("p", "00000000-0000-0000-0000-000000000001", seq, "id", f"tx{seq}", None, payload, sealed, None,
            dt.datetime(2026, 1, 1, tzinfo=dt.UTC))


def test_sealed_payloads_are_opened_with_the_keys_given():
    old, new = crypto.Keyring.generate("old"), crypto.Keyring.generate("new")
    keys = settings.encryption_keys(f"{new},{old}")
    sealed_old = crypto.Keyring.parse(old).seal_text('{"a": 1}')
    got = rows.opened(FIELDS, [_row(1, '"clear"', False), _row(2, sealed_old, True)], keys)
    batch = rows.to_batch(FIELDS, "orders", got)
    assert batch.column(batch.schema.get_field_index("payload")).to_pylist() == ['"clear"', '{"a": 1}']
    assert batch.column(batch.schema.get_field_index("encrypted")).to_pylist() == [False, True]


def test_clear_rows_need_no_keys_and_sealed_ones_do():
    clear = [_row(1, "1", False)]
    assert rows.opened(FIELDS, clear, ()) is clear
    sealed = crypto.Keyring.parse(crypto.Keyring.generate("k1")).seal_text("2")
    with pytest.raises(errors.Unavailable, match="has no CONVEYOR_ENCRYPTION_KEY"):
        rows.opened(FIELDS, [_row(1, sealed, True)], ())
    other = settings.encryption_keys(crypto.Keyring.generate("k2"))
    with pytest.raises(errors.Unavailable, match="encryption key 'k1'"):
        rows.opened(FIELDS, [_row(1, sealed, True)], other)
