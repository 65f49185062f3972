"""JSON Web Tokens as bearer credentials (``CONVEYOR_AUTH=jwt``; seed 004's model).

Signatures by HS256 (a shared secret), RS256 or EdDSA (a public key in PEM), verified by
PyJWT; the algorithms a server accepts are fixed by its configuration, never by the
token's header (so "none", or an HMAC signed with a public key, is refused). ``exp`` is
required and, like ``nbf``, enforced (with ``leeway`` seconds of clock skew); ``exp``,
``nbf`` and ``iat`` must be NumericDates (JSON numbers, RFC 7519 section 2), as PyJWT
would otherwise take a string of digits; ``aud`` and ``iss`` are checked when configured. The role comes from a configurable claim (a dotted
path into the claims, e.g. ``realm_access.roles``; a string or a list of strings), its
values mapped onto Conveyor's roles read < write < admin (the highest one found wins);
the principal is the ``sub`` claim, which the server stamps on what the request writes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jwt

from conveyor import errors

# claim values Conveyor understands without configuration (seed 004's access levels)
DEFAULT_ROLES = {"read": "read", "read-only": "read", "readonly": "read", "write": "write",
                 "read-write": "write", "readwrite": "write", "admin": "admin"}
_RANK = {"read": 0, "write": 1, "admin": 2}
_TIME_CLAIMS = ("exp", "nbf", "iat")  # NumericDate claims (RFC 7519 section 4.1)


@dataclass(frozen=True)
class JwtConfig:
    secret: str | None = None  # HS256
    public_key: str | None = None  # PEM: RS256 (RSA) or EdDSA (Ed25519)
    algorithms: tuple[str, ...] = ()
    role_claim: str = "role"
    roles: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_ROLES))
    audience: str | None = None
    issuer: str | None = None
    leeway: float = 0.0

    def accepted_algorithms(self) -> list[str]:
        if self.algorithms:
            return list(self.algorithms)
        found = ["HS256"] if self.secret else []
        if self.public_key:
            found.append("EdDSA" if _is_ed25519(self.public_key) else "RS256")
        return found


def _is_ed25519(pem: str) -> bool:
    from cryptography.hazmat.primitives.asymmetric import ed25519
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    try:
        return isinstance(load_pem_public_key(pem.encode()), ed25519.Ed25519PublicKey)
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class Claims:
    role: str
    subject: str | None


class Verifier:
    def __init__(self, config: JwtConfig) -> None:
        if not config.secret and not config.public_key:
            raise ValueError("JWT authentication needs CONVEYOR_JWT_SECRET or CONVEYOR_JWT_PUBLIC_KEY")
        self.config = config
        self._algorithms = config.accepted_algorithms()
        unknown = set(self._algorithms) - {"HS256", "RS256", "EdDSA"}
        if unknown:
            raise ValueError(f"JWT algorithms must be HS256, RS256 or EdDSA, got {', '.join(sorted(unknown))}")
        self._keys = {"HS256": config.secret, "RS256": config.public_key, "EdDSA": config.public_key}
        for alg in self._algorithms:
            if not self._keys[alg]:
                raise ValueError(f"JWT algorithm {alg} needs "
                                 f"{'CONVEYOR_JWT_SECRET' if alg == 'HS256' else 'CONVEYOR_JWT_PUBLIC_KEY'}")

    def verify(self, token: str) -> Claims:
        """The token's role and subject, or ``errors.Unauthorized`` saying what is wrong."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise errors.Unauthorized("malformed bearer token") from None
        alg = header.get("alg")
        if alg not in self._algorithms:
            raise errors.Unauthorized(f"JWT algorithm {alg!r} is not accepted (accepted: "
                                      f"{', '.join(self._algorithms)})")
        key = self._keys[alg]
        assert key is not None  # checked in __init__ for every accepted algorithm
        try:
            claims = jwt.decode(token, key, algorithms=[alg], audience=self.config.audience,
                                issuer=self.config.issuer, leeway=self.config.leeway,
                                options={"require": ["exp"], "verify_aud": self.config.audience is not None})
        except jwt.ExpiredSignatureError:
            raise errors.Unauthorized("the JWT has expired") from None
        except jwt.ImmatureSignatureError:
            raise errors.Unauthorized("the JWT is not valid yet (nbf)") from None
        except jwt.PyJWTError as exc:
            raise errors.Unauthorized(f"invalid JWT: {exc}") from None
        _check_numeric_dates(claims)
        return Claims(self._role(claims), _subject(claims))

    def _role(self, claims: Mapping[str, Any]) -> str:
        value: Any = claims
        for part in self.config.role_claim.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        values: Sequence[Any] = value if isinstance(value, list) else [value]
        roles = [self.config.roles[v] for v in values if isinstance(v, str) and v in self.config.roles]
        if not roles:
            raise errors.Unauthorized(f"the JWT's claim {self.config.role_claim!r} names no role this server knows")
        return max(roles, key=_RANK.__getitem__)


def _check_numeric_dates(claims: Mapping[str, Any]) -> None:
    """RFC 7519 times are JSON numbers; PyJWT compares ``int(value)``, so ``"exp": "9999999999"``
    passed as a far-off expiry. Refused as any other invalid token is."""
    for name in _TIME_CLAIMS:
        value = claims.get(name)
        if name in claims and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise errors.Unauthorized(f"invalid JWT: the {name} claim must be a NumericDate (a JSON number)")


def _subject(claims: Mapping[str, Any]) -> str | None:
    sub = claims.get("sub")
    return str(sub)[:256] if sub is not None else None


def looks_like_jwt(token: str) -> bool:
    return token.count(".") == 2
