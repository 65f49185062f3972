"""The SNS signing key: canonical strings, signatures verified with the certificate's
public key, and a key that persists (and is shared by processes racing to create it)."""

from __future__ import annotations

import asyncio
import base64

import psycopg
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding

from conveyor import errors
from conveyor.core import signing
from conveyor.db import pool

NOTIFICATION = {"Type": "Notification", "MessageId": "m-1", "TopicArn": "arn:aws:sns:us-east-1:000000000000:t",
                "Message": "hello\nworld", "Timestamp": "2024-01-01T00:00:00.000Z"}


def test_canonical_string_of_a_notification():
    assert signing.canonical_string(NOTIFICATION) == (
        "Message\nhello\nworld\nMessageId\nm-1\nTimestamp\n2024-01-01T00:00:00.000Z\n"
        "TopicArn\narn:aws:sns:us-east-1:000000000000:t\nType\nNotification\n")
    with_subject = signing.canonical_string({**NOTIFICATION, "Subject": "S", "UnsubscribeURL": "ignored"})
    assert "MessageId\nm-1\nSubject\nS\nTimestamp\n" in with_subject and "ignored" not in with_subject


def test_canonical_string_of_a_confirmation():
    fields = {"Type": "SubscriptionConfirmation", "MessageId": "m", "Token": "tok", "TopicArn": "arn",
              "Message": "confirm", "SubscribeURL": "http://x/?a=b", "Timestamp": "ts", "Subject": "not signed"}
    assert signing.canonical_string(fields) == (
        "Message\nconfirm\nMessageId\nm\nSubscribeURL\nhttp://x/?a=b\nTimestamp\nts\nToken\ntok\n"
        "TopicArn\narn\nType\nSubscriptionConfirmation\n")
    with pytest.raises(errors.InvalidInput, match="Token"):
        signing.canonical_string({k: v for k, v in fields.items() if k != "Token"})
    with pytest.raises(errors.InvalidInput, match="Type"):
        signing.canonical_string({**fields, "Type": "Other"})


async def test_signature_verifies_with_the_certificate_as_a_client_would(conn):
    signer = await signing.load_or_create(conn)
    signature = signer.sign(NOTIFICATION)
    # what an SNS client does: the public key of SigningCertURL's certificate, RSA-SHA256
    cert = x509.load_pem_x509_certificate(signer.certificate_pem.encode())
    cert.public_key().verify(base64.b64decode(signature), signing.canonical_string(NOTIFICATION).encode(),
                             padding.PKCS1v15(), hashes.SHA256())
    assert cert.public_key().key_size == 2048
    fields = {**NOTIFICATION, "Signature": signature, "SignatureVersion": "2"}
    assert signing.verify(signer.certificate_pem, fields)
    assert not signing.verify(signer.certificate_pem, {**fields, "Message": "hello world"})
    assert not signing.verify(signer.certificate_pem, {**fields, "SignatureVersion": "1"})
    assert not signing.verify(signer.certificate_pem, {**fields, "Signature": "not base64!"})
    other_pem = signing.generate()[1]
    assert not signing.verify(other_pem, fields)


async def test_the_key_persists(dsn, conn):
    assert await signing.certificate(conn) is None
    first = await signing.load_or_create(conn)
    async with pool.connect(dsn) as other:  # another process, later
        second = await signing.load_or_create(other)
    assert second.certificate_pem == first.certificate_pem
    assert second.sign(NOTIFICATION) == first.sign(NOTIFICATION)  # PKCS#1 v1.5 is deterministic
    assert await signing.certificate(conn) == first.certificate_pem


async def test_processes_racing_to_create_the_key_end_with_the_same(dsn):
    async def load() -> signing.Signer:
        async with pool.connect(dsn) as c:
            return await signing.load_or_create(c)

    signers = await asyncio.gather(*(load() for _ in range(4)))
    assert len({s.certificate_pem for s in signers}) == 1


async def test_only_admins_read_the_private_key(conn):
    await signing.load_or_create(conn)
    await conn.execute("SET ROLE conveyor_writer")
    with pytest.raises(errors.PermissionDenied):
        await signing.load_or_create(conn)
    assert (await signing.certificate(conn)).startswith("-----BEGIN CERTIFICATE-----")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        await conn.execute("SELECT * FROM conveyor.signing_keys")
    await conn.execute("RESET ROLE")
