"""conveyor.crypto: AES-256-GCM sealing, key rings and tampering."""

from __future__ import annotations

import base64

import pytest

from conveyor import crypto, errors
from conveyor.settings import Settings


def ring(*kids: str) -> crypto.Keyring:
    return crypto.Keyring.parse(",".join(crypto.Keyring.generate(k) for k in kids))


def test_seal_and_open_keep_body_and_content_type():
    keys = ring("k1")
    body, marker = keys.seal("héllo {\"a\": 1}", "application/json")
    assert "héllo" not in body and marker == f"{crypto.SEALED}; kid=k1; type=application/json"
    assert keys.open(body, marker) == ("héllo {\"a\": 1}", "application/json")
    again, _ = keys.seal("héllo {\"a\": 1}", "application/json")
    assert again != body  # a fresh nonce each time
    assert keys.open("plain", None) == ("plain", None)  # what was never sealed passes through
    assert keys.open(*keys.seal("x", None)) == ("x", None)


def test_rotation_opens_with_any_key_and_seals_with_the_first():
    old = ring("old")
    sealed = old.seal("secret", None)
    both = crypto.Keyring.parse(crypto.Keyring.generate("new") + "," + ",".join(
        f"old:{base64.b64encode(b'x' * 32).decode()}" for _ in [0]))
    assert both.active == "new"
    with pytest.raises(errors.InternalError):  # same id, another key: authentication fails
        both.open(*sealed)
    assert crypto.sealed_kid(both.seal("s", None)[1]) == "new"
    with pytest.raises(errors.Unavailable, match="'old'"):
        ring("new").open(*sealed)


def test_tampering_is_detected():
    keys = ring("k1")
    body, marker = keys.seal("amount=10", None)
    raw = bytearray(base64.b64decode(body))
    raw[-1] ^= 1
    with pytest.raises(errors.InternalError, match="altered"):
        keys.open(base64.b64encode(bytes(raw)).decode(), marker)
    with pytest.raises(errors.InternalError):  # the marker is authenticated too
        keys.open(body, marker.replace("type=", "type=application/json"))
    text = keys.seal_text('{"n": 1}')
    assert keys.open_text(text) == '{"n": 1}' and keys.text_kid(text) == "k1"
    with pytest.raises(errors.InternalError):
        keys.open_text(text[:-4] + ("AAAA" if not text.endswith("AAAA") else "BBBB"))


@pytest.mark.parametrize("spec, message", [
    ("", "no encryption key"),
    ("nokid", "KEY_ID:BASE64"),
    ("k:not-base64!", "not base64"),
    (f"k:{base64.b64encode(b'short').decode()}", "32 bytes"),
    (f"k:{base64.b64encode(b'x' * 32).decode()},k:{base64.b64encode(b'y' * 32).decode()}", "twice"),
])
def test_bad_keys_are_refused_at_start(spec, message):
    with pytest.raises(ValueError, match=message):
        crypto.Keyring.parse(spec)


def test_settings_read_the_key_inline_or_from_a_file(tmp_path):
    entry = crypto.Keyring.generate("disk")
    (tmp_path / "key").write_text(entry + "\n")
    from_file = Settings.from_env({"CONVEYOR_ENCRYPTION_KEY": f"@{tmp_path / 'key'}"}).encryption_keys
    assert crypto.Keyring.of(from_file).active == "disk"
    assert Settings.from_env({"CONVEYOR_ENCRYPTION_KEY": entry}).encryption_keys == from_file
    assert Settings.from_env({}).encryption_keys == ()
