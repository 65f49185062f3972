"""Receipts (conveyor.core.receipts): keyed with HMAC-SHA256, checked without the database."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from conveyor.core.receipts import Keyring, Receipt


@pytest.mark.parametrize("size", [32, 64, 65, 200])
def test_the_tag_is_hmac_sha256_of_the_payload(size):
    """The keyed states made once give the tag hmac.new would (so receipts given out
    before this way of computing it stay valid), for keys shorter and longer than a block."""
    key = bytes(i % 256 for i in range(size))
    ring = Keyring(key)
    receipt = ring.encode("jobs", 42, 3)
    body, _, tag = receipt.partition(".")
    payload = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    expected = hmac.new(key, payload, hashlib.sha256).digest()[:16]
    assert base64.urlsafe_b64decode(tag + "=" * (-len(tag) % 4)) == expected
    assert ring.decode(receipt, "jobs") == Receipt("jobs", 42, 3)


def test_every_receipt_is_new_and_only_its_queue_and_key_accept_it():
    ring = Keyring(b"k" * 32)
    first, second = ring.encode("jobs", 7, 1), ring.encode("jobs", 7, 1)
    assert first != second
    assert ring.decode(first, "jobs") == ring.decode(second, "jobs") == Receipt("jobs", 7, 1)
    assert ring.decode(first, "other") is None
    assert Keyring(b"j" * 32).decode(first, "jobs") is None
    body, _, tag = first.partition(".")
    forged = base64.urlsafe_b64encode(b"jobs\x008\x001\x00nonce").decode().rstrip("=") + "." + tag
    assert ring.decode(forged, "jobs") is None
    assert ring.decode(body, "jobs") is None
    assert ring.decode("", "jobs") is None
    assert ring.decode("x" * 2000, "jobs") is None
