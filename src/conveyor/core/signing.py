"""The SNS signing key: RSA signatures over SNS's canonical string — SignatureVersion 1
(SHA1, AWS's default) or 2 (SHA256) — and the self-signed certificate clients verify them
with.

The key is stored in ``conveyor.signing_keys`` (readable only by ``conveyor_admin`` and
the definer functions) so every server process of one database signs with the same key
and the certificate a client fetched stays valid across restarts. ``load_or_create``
generates a key only when none is stored; two processes starting at once both try to
insert and both read back whichever row won.

The canonical string is what SNS documents for verifying a message: the fields that a
message type signs, in byte order of their names, each as ``Name\\nValue\\n``. A
Notification signs Message, MessageId, Subject (only if present), Timestamp, TopicArn and
Type; a SubscriptionConfirmation or UnsubscribeConfirmation signs Message, MessageId,
SubscribeURL, Timestamp, Token, TopicArn and Type.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

from conveyor import errors
from conveyor.db import execute as db

Connection = db.Connection

SIGNATURE_VERSION = "2"  # what the engine signs with unless told otherwise (SNS topics say 1 or 2)
SIGNATURE_VERSIONS = ("1", "2")
KEY_BITS = 2048
CERTIFICATE_DAYS = 3650
SUBJECT = "sns.conveyor.local"

NOTIFICATION_FIELDS = ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type")
CONFIRMATION_FIELDS = ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type")
CONFIRMATION_TYPES = ("SubscriptionConfirmation", "UnsubscribeConfirmation")


def signed_fields(message_type: str) -> tuple[str, ...]:
    """The names a message of this Type signs, in canonical (byte) order."""
    if message_type == "Notification":
        return NOTIFICATION_FIELDS
    if message_type in CONFIRMATION_TYPES:
        return CONFIRMATION_FIELDS
    raise errors.InvalidInput(f"cannot sign an SNS message of Type {message_type!r}")


def canonical_string(fields: Mapping[str, str]) -> str:
    """SNS's string to sign: each signed field present, ``Name\\nValue\\n``, in name order.
    Subject is skipped when absent (None); every other signed field must be present."""
    out = []
    for name in signed_fields(fields.get("Type", "")):
        value = fields.get(name)
        if value is None:
            if name == "Subject":
                continue
            raise errors.InvalidInput(f"an SNS {fields['Type']} needs the field {name}")
        out.append(f"{name}\n{value}\n")
    return "".join(out)


@dataclass(frozen=True)
class Signer:
    """Signs SNS messages with the stored key. ``certificate_pem`` verifies them."""

    private_key: rsa.RSAPrivateKey
    certificate_pem: str

    def sign(self, fields: Mapping[str, str], version: str = SIGNATURE_VERSION) -> str:
        """The base64 RSA (PKCS#1 v1.5) signature of ``canonical_string(fields)``, with
        SHA1 for SignatureVersion 1 and SHA256 for 2."""
        data = canonical_string(fields).encode("utf-8")
        return base64.b64encode(self.private_key.sign(data, padding.PKCS1v15(), _hash(version))).decode()

    @property
    def digest(self) -> str:
        """The certificate's name in SigningCertURL (``SimpleNotificationService-<digest>.pem``,
        as AWS names its certificates): it changes when the key does."""
        return self.digest_of(self.certificate_pem)

    @staticmethod
    def digest_of(certificate_pem: str) -> str:
        return hashlib.md5(certificate_pem.encode(), usedforsecurity=False).hexdigest()

    @classmethod
    def from_pem(cls, private_key_pem: str, certificate_pem: str) -> Signer:
        key = serialization.load_pem_private_key(private_key_pem.encode(), password=None)
        if not isinstance(key, rsa.RSAPrivateKey):
            raise errors.InternalError("the stored SNS signing key is not an RSA key")
        return cls(key, certificate_pem)


def _hash(version: str) -> hashes.HashAlgorithm:
    if version not in SIGNATURE_VERSIONS:
        raise errors.InvalidInput(f"SignatureVersion must be 1 or 2, not {version!r}")
    return hashes.SHA1() if version == "1" else hashes.SHA256()  # SNS's SignatureVersion 1 is SHA1


def verify(certificate_pem: str, fields: Mapping[str, str]) -> bool:
    """Whether ``fields["Signature"]`` is a valid signature of the message, of the
    SignatureVersion it states (1 or 2), by the certificate's key (what an SNS client does
    with SigningCertURL)."""
    version = fields.get("SignatureVersion", SIGNATURE_VERSION)
    if version not in SIGNATURE_VERSIONS:
        return False
    try:
        signature = base64.b64decode(fields.get("Signature") or "", validate=True)
        data = canonical_string(fields).encode("utf-8")
        cert = x509.load_pem_x509_certificate(certificate_pem.encode())
        public_key = cert.public_key()
        if not isinstance(public_key, rsa.RSAPublicKey):
            return False
        public_key.verify(signature, data, padding.PKCS1v15(), _hash(version))
    except (InvalidSignature, ValueError, binascii.Error, errors.InvalidInput):
        return False
    return True


def generate() -> tuple[str, str]:
    """A new RSA-2048 key and a self-signed certificate for it, both PEM."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=KEY_BITS)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SUBJECT),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Conveyor")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(name).issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=CERTIFICATE_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(SUBJECT)]), critical=False)
            .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    return key_pem, cert.public_bytes(serialization.Encoding.PEM).decode()


async def load_or_create(conn: Connection) -> Signer:
    """The stored signing key, generated and stored first if there is none yet. Safe when
    several processes start at once: every one ends with the same stored key."""
    row = await db.fetch_one(conn, "signing_key_get")
    if row is None:
        key_pem, cert_pem = generate()
        row = await db.fetch_one(conn, "signing_key_create", {"private_key": key_pem, "certificate": cert_pem})
    if row is None:
        raise errors.InternalError("the SNS signing key could not be stored")
    return Signer.from_pem(row[0], row[1])


async def certificate(conn: Connection) -> str | None:
    """The stored certificate (PEM), or None if no key was created yet."""
    return await db.fetch_optional(conn, "signing_key_certificate", None, str)
