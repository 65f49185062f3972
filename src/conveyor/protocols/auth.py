"""One authentication policy for every protocol the server speaks.

Who may call is decided here once, from ``CONVEYOR_AUTH`` (mode), ``CONVEYOR_AUTH_TOKENS``
(bearer tokens and their roles) and ``CONVEYOR_AWS_CREDENTIALS`` (SigV4 keys and their
roles); each protocol asks this policy and renders a refusal in its own format. The
rule that ties the protocols together: a request one protocol would refuse is refused
by all of them.

=========  =========================================  ==========================================
mode       REST, Queen API, hq (HTTP)                  SQS and SNS (AWS wire protocols)
=========  =========================================  ==========================================
none       anyone, as admin                            anyone, as admin; with AWS credentials
                                                       configured, a valid SigV4 signature
header     any ``Authorization`` header, as admin      with AWS credentials: a valid signature;
           (seed 000's rule)                           without: any Authorization (or presigned
                                                       URL), as admin
token      ``Bearer <token>`` of a configured token,   a valid SigV4 signature of a configured
           with its role                               key (its role), or a configured bearer
                                                       token; nothing else
=========  =========================================  ==========================================

Roles rank read < write < admin (the SQL roles conveyor_reader < writer < admin): read
looks, write sends/receives/acknowledges, admin creates, changes and deletes.
Secrets are compared in constant time: a token's digest against every configured
token's, so neither which token matched nor how much of one did shows in the timing.
See docs/operations.md, "Security model".
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from conveyor import errors
from conveyor.protocols import jwt_tokens

ROLES = ("read", "write", "admin")
RANK = {role: rank for rank, role in enumerate(ROLES)}


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a request comes from: its role, and the principal when one is known (an AWS
    access key id)."""

    role: str
    principal: str | None = None  # who: a JWT's sub, an AWS access key id (verified)

    def may(self, needed: str) -> bool:
        return RANK[self.role] >= RANK[needed]


ADMIN = Identity("admin")


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()


class Policy:
    def __init__(self, mode: str, tokens: Mapping[str, str] | None = None,
                 aws_credentials: Mapping[str, tuple[str, str]] | None = None,
                 jwt: jwt_tokens.JwtConfig | None = None) -> None:
        """``tokens``: token -> role; ``aws_credentials``: access key id -> (secret, role);
        ``jwt``: how JSON Web Tokens are verified (mode ``jwt``)."""
        self.mode = mode
        self._jwt = jwt_tokens.Verifier(jwt) if mode == "jwt" and jwt is not None else None
        if mode == "jwt" and self._jwt is None:
            raise ValueError("auth mode jwt needs a JWT configuration (CONVEYOR_JWT_SECRET or CONVEYOR_JWT_PUBLIC_KEY)")
        self._tokens = [(_digest(token), role) for token, role in (tokens or {}).items()]
        self._aws = dict(aws_credentials or {})
        self.aws_secrets = {key: secret for key, (secret, _) in self._aws.items()}

    @property
    def verifies_signatures(self) -> bool:
        """Whether AWS requests must carry a SigV4 signature valid for a configured key."""
        return bool(self._aws)

    @property
    def admits_anyone(self) -> bool:
        """Whether an AWS request without any credentials is served, as admin (mode none
        without AWS keys)."""
        return self.mode == "none" and not self.verifies_signatures

    def aws_role(self, access_key: str) -> str:
        return self._aws[access_key][1]

    def token_role(self, token: str) -> str | None:
        """The role of a configured token; every configured token is compared, always."""
        given = _digest(token)
        found = None
        for digest, role in self._tokens:
            if hmac.compare_digest(digest, given):
                found = role
        return found

    def http(self, authorization: str | None) -> Identity:
        """The identity of a plain HTTP request (REST, Queen, hq) from its Authorization
        header; ``errors.Unauthorized`` if the mode refuses it."""
        if self.mode == "none":
            return ADMIN
        if authorization is None:
            raise errors.Unauthorized("missing Authorization header")
        if self.mode == "header":
            return ADMIN
        return self.bearer(authorization)

    @property
    def takes_bearers(self) -> bool:
        """Whether a bearer token is a credential (modes token and jwt), on every protocol."""
        return self.mode in ("token", "jwt")

    def bearer(self, authorization: str) -> Identity:
        """The identity a ``Bearer <token>`` header proves, or ``errors.Unauthorized``."""
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise errors.Unauthorized("unknown or malformed bearer token")
        if self._jwt is not None and jwt_tokens.looks_like_jwt(token):
            claims = self._jwt.verify(token)
            return Identity(claims.role, claims.subject)
        role = self.token_role(token)
        if role is None:
            raise errors.Unauthorized("unknown or malformed bearer token")
        return Identity(role)


def is_bearer(authorization: str | None) -> bool:
    return authorization is not None and authorization[:7].lower() == "bearer "
