"""AWS Signature Version 4, read and checked on the server side.

Two jobs, for the SQS and SNS wire protocols:

* ``parse_scope`` reads the credential scope (access key, date, region, service) from an
  ``Authorization`` header without checking anything. Queues and topics are scoped per
  region, as AWS scopes them, so the region is needed even when signatures are not verified.
* ``verify`` checks a request's signature against configured access key / secret pairs, for
  both forms AWS accepts: the ``Authorization`` header and the presigned query string
  (``X-Amz-Algorithm``, ``X-Amz-Credential``, ``X-Amz-Date``, ``X-Amz-SignedHeaders``,
  ``X-Amz-Signature``, ``X-Amz-Expires``). Failures raise ``SignatureError`` carrying the
  code, HTTP status and wording AWS itself answers with, so SDKs and the people reading
  their errors react as they would against AWS.

The canonical request follows AWS's rules for services other than S3, and is built the way
botocore's ``SigV4Auth`` builds it, so that what botocore signs verifies here:

* canonical URI: the raw (still percent-encoded) path, with dot segments and empty segments
  removed, percent-encoded once more (everything but ``/`` and unreserved characters). Since
  the client had already encoded the path once, this is AWS's "encode each segment twice".
* canonical query: each name and value decoded (``+`` as space, as the application will read
  it) and re-encoded per RFC 3986, sorted by encoded name, then value.
* canonical headers: the signed headers' names lowercased; each value trimmed with inner runs
  of whitespace collapsed to one space; repeated headers joined by commas, in arrival order.
* payload hash: the ``x-amz-content-sha256`` header if the request carries one (it must then
  be the body's SHA-256, or the literal ``UNSIGNED-PAYLOAD``), else the body's SHA-256.

Error codes, statuses and wording — what AWS's Query-protocol services (SQS, SNS, STS) send:

* ``MissingAuthenticationToken`` 403 "Request is missing Authentication Token" — STS's reply
  to an unsigned request (github.com/amzn/selling-partner-api-docs/issues/3081; the same text
  surfaces from the .NET SDK in github.com/aws/aws-sdk-net/issues/681).
* ``IncompleteSignature`` 400 for an ``Authorization`` header that cannot be parsed. 400 is
  what SES and Cloud9 answered on the wire (github.com/brendanhay/amazonka/issues/316,
  github.com/iann0036/cloud9-sync/issues/10) and what older Common Errors pages list
  (docs.aws.amazon.com/cloudsearch/latest/developerguide/CommonErrors.html); newer pages say
  403. Wording: "Authorization header requires 'Credential' parameter. ... Authorization=..."
  (amazonka#316, github.com/aws/aws-sdk-ruby/issues/317), "'...' not a valid key=value pair
  (missing equal-sign) in Authorization header: '...'." (cloud9-sync#10), "Credential must
  have exactly 5 slash-delimited elements, e.g. keyid/date/region/service/term, got '...'"
  (github.com/mhart/aws4/issues/97), "'Host' or ':authority' must be a 'SignedHeader' in the
  AWS Authorization." (github.com/aws/aws-sdk-php/issues/2469). The presigned-query and date-
  format wordings below follow the same pattern; no source quoting them was found.
* ``InvalidClientTokenId`` 403 "The security token included in the request is invalid." —
  SQS's reply for an unknown access key (github.com/ex-aws/ex_aws/issues/220).
* ``SignatureDoesNotMatch`` 403 "The request signature we calculated does not match ..." —
  SQS's reply to a wrong signature (an SQS ErrorResponse quoted at www.exchangetuts.com/
  how-do-i-generate-query-url-for-amazon-sqs-1761970802387870; docs.aws.amazon.com/IAM/latest/
  UserGuide/signature-v4-troubleshooting.html). A stated body hash that is not the body's is
  answered the same way: to the client it is a signature that does not match.
* Clock skew: AWS's Query services answer ``SignatureDoesNotMatch`` 403 with "Signature
  expired: <t> is now earlier than <t'> (<now> - 15 min.)" or "Signature not yet current: <t>
  is still later than <t'> (<now> + 15 min.)" — SQS in github.com/aws/aws-sdk-js/issues/401,
  STS in github.com/devsecops/bootcamp/issues/101, ELB in github.com/aws/aws-sdk-js/pull/142.
  (``RequestExpired`` is only listed in the Common Errors docs; ``RequestTimeTooSkewed`` is
  S3's; JSON-protocol services send the same text as ``InvalidSignatureException`` 400.)
* Credential scope: "Date in Credential scope does not match YYYYMMDD from ISO-8601 version of
  date from HTTP" (IAM troubleshooting page above) as ``SignatureDoesNotMatch`` 403, the code
  AWS gives its sibling "Credential should be scoped to a valid region"
  (github.com/cognitect-labs/aws-api/issues/27). The bad-terminator wording follows them; no
  source quoting it was found. A scope naming another service than the one called: SQS's
  ``SignatureDoesNotMatch`` 403 "Credential should be scoped to correct service: 'sqs'. " (an
  SQS ErrorResponse quoted in a public C# SQS client; the same words, for Batch, in
  github.com/cllunsford/aws-signing-proxy/issues/25). A signature is valid for one service
  only, as on AWS: a key's SNS signature is not an SQS one.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from urllib.parse import parse_qsl, quote, unquote_to_bytes

ALGORITHM = "AWS4-HMAC-SHA256"
TERMINATOR = "aws4_request"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
AMZ_DATE_FORMAT = "%Y%m%dT%H%M%SZ"
MAX_PRESIGNED_EXPIRES = 604800  # seven days, the longest AWS lets a presigned URL live

SIGNATURE_MISMATCH = (
    "The request signature we calculated does not match the signature you provided. "
    "Check your AWS Secret Access Key and signing method. "
    "Consult the service documentation for details."
)

_PRESIGN_REQUIRED = ("X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Signature",
                     "X-Amz-SignedHeaders", "X-Amz-Date")
_AUTH_TOKENS = re.compile(r"[,\s]+")
_CREDENTIAL = re.compile(r"(?:^|[,\s])Credential=([^,\s]*)")
_AMZ_DATE = re.compile(r"\d{8}T\d{6}Z")
_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")


@dataclass(frozen=True)
class Scope:
    """A credential scope: who signed, and for which day, region and service."""

    access_key: str
    date: str
    region: str
    service: str

    @property
    def credential_scope(self) -> str:
        """The scope as it appears in the string to sign (without the access key)."""
        return f"{self.date}/{self.region}/{self.service}/{TERMINATOR}"


@dataclass(frozen=True)
class Identity:
    """Who a verified request comes from, and the region and service it was signed for."""

    access_key: str
    region: str
    service: str


class SignatureError(Exception):
    """A request's authentication was absent or wrong; rendered by each protocol as AWS would."""

    def __init__(self, code: str, message: str, status: int) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status

    def __repr__(self) -> str:
        return f"SignatureError({self.code!r}, {self.message!r}, {self.status})"


@dataclass(frozen=True)
class _Claim:
    """What a request says about its own signature, before any of it is believed."""

    scope: Scope
    signed_headers: str
    signature: str
    timestamp: datetime
    expires: int | None  # presigned URLs only


# --- reading the credential scope -------------------------------------------------------------


def parse_scope(authorization: str | None) -> Scope | None:
    """The credential scope of a SigV4 ``Authorization`` header; None if absent or not SigV4.

    Never raises: it runs on every request, also when signatures are not verified, and a
    request it cannot read simply gets the server's default region.
    """
    if not authorization:
        return None
    algorithm, _, rest = authorization.strip().partition(" ")
    if algorithm != ALGORITHM:
        return None
    match = _CREDENTIAL.search(rest)  # = _auth_fields(rest).get("Credential"), without the dict
    if not match or not match[1]:
        return None
    credential = match[1]
    # one scope per key, day and region: the same on most requests, so remembered
    return _remembered_scope(credential) if len(credential) <= 256 else _scope_from_credential(credential)


def parse_query_scope(query_string: str) -> Scope | None:
    """The credential scope of a presigned SigV4 query string; None if there is none.

    The presigned counterpart of ``parse_scope``; never raises.
    """
    params = dict(parse_qsl(query_string, keep_blank_values=True))
    if params.get("X-Amz-Algorithm") != ALGORITHM:
        return None
    credential = params.get("X-Amz-Credential")
    return _scope_from_credential(credential) if credential else None


def _scope_from_credential(credential: str) -> Scope | None:
    parts = credential.split("/")
    if len(parts) != 5 or not all(parts) or parts[4] != TERMINATOR:
        return None
    return Scope(*parts[:4])


_remembered_scope = functools.lru_cache(maxsize=1024)(_scope_from_credential)


def _auth_fields(rest: str) -> dict[str, str]:
    """``Credential=..., SignedHeaders=..., Signature=...`` as a dict; skips tokens without "="."""
    fields: dict[str, str] = {}
    for token in _AUTH_TOKENS.split(rest.strip()):
        name, eq, value = token.partition("=")
        if eq and name not in fields:
            fields[name] = value
    return fields


# --- verification -----------------------------------------------------------------------------


def verify(
    method: str,
    path: str,
    query_string: str,
    headers: Sequence[tuple[str, str]],
    body: bytes,
    secrets: Mapping[str, str],
    *,
    service: str,
    now: datetime | None = None,
    max_skew: timedelta = timedelta(minutes=15),
) -> Identity:
    """Check a request's SigV4 signature (header or presigned query); raise SignatureError if bad.

    ``path`` is the raw path as sent (ASGI ``raw_path``, decoded as latin-1), ``query_string``
    the raw query string, ``headers`` (name, value) pairs in arrival order, names in any case.
    ``secrets`` maps access key ids to secret keys; ``service`` is the signing name of the
    service called (``sqs``, ``sns``), which the credential scope must name. Checks run
    cheapest and least secret first: the request's shape, its scope and dates, then the
    key, the body hash and the signature.
    """
    header_map = _header_map(headers)
    authorization = _first(header_map, "authorization")
    presigned = authorization is None
    if authorization is not None:
        claim = _claim_from_header(authorization, header_map)
    else:
        claim = _claim_from_query(query_string)
    _check_host_signed(claim)
    _check_scope_service(claim, service)
    _check_scope_date(claim)
    _check_time(claim, _utc(now), max_skew)

    secret = secrets.get(claim.scope.access_key)
    if secret is None:
        raise SignatureError("InvalidClientTokenId",
                             "The security token included in the request is invalid.", 403)
    canonical = canonical_request(
        method, path, _without_signature(query_string) if presigned else query_string,
        header_map, claim.signed_headers, _payload_hash(header_map, body))
    expected = hmac.new(signing_key(secret, claim.scope), string_to_sign(
        claim.timestamp, claim.scope, canonical).encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected.encode(), claim.signature.encode()):
        raise _mismatch()
    return Identity(claim.scope.access_key, claim.scope.region, claim.scope.service)


def _claim_from_header(authorization: str, header_map: Mapping[str, list[str]]) -> _Claim:
    """Parse an ``Authorization`` header, raising IncompleteSignature the way AWS words it."""
    amz_date, http_date = _first(header_map, "x-amz-date"), _first(header_map, "date")
    algorithm, _, rest = authorization.strip().partition(" ")
    fields: dict[str, str] = {}
    if algorithm == ALGORITHM:
        for token in filter(None, _AUTH_TOKENS.split(rest.strip())):
            name, eq, value = token.partition("=")
            if not eq:
                raise _incomplete(f"'{token}' not a valid key=value pair (missing equal-sign) "
                                  f"in Authorization header: '{authorization}'.")
            fields.setdefault(name, value)
    missing = [f"Authorization header requires '{name}' parameter."
               for name in ("Credential", "Signature", "SignedHeaders") if not fields.get(name)]
    if amz_date is None and http_date is None:
        missing.append("Authorization header requires existence of either a 'X-Amz-Date' "
                       "or a 'Date' header.")
    if missing:
        raise _incomplete(" ".join(missing) + f" Authorization={authorization}")
    return _Claim(scope=_checked_scope(fields["Credential"]),
                  signed_headers=fields["SignedHeaders"], signature=fields["Signature"],
                  timestamp=_request_time(amz_date, http_date), expires=None)


def _claim_from_query(query_string: str) -> _Claim:
    """Read a presigned query string's X-Amz-* parameters; no Authorization at all if absent."""
    params: dict[str, str] = {}
    for name, value in parse_qsl(query_string, keep_blank_values=True):
        params.setdefault(name, value)
    if not any(name in params for name in _PRESIGN_REQUIRED):
        raise SignatureError("MissingAuthenticationToken",
                             "Request is missing Authentication Token", 403)
    missing = [f"AWS query-string parameters must include '{name}'."
               for name in _PRESIGN_REQUIRED if not params.get(name)]
    if missing:
        raise _incomplete(" ".join(missing) + " Re-examine the query-string parameters.")
    if params["X-Amz-Algorithm"] != ALGORITHM:
        raise _incomplete(f"Unsupported AWS 'algorithm': '{params['X-Amz-Algorithm']}'. "
                          f"X-Amz-Algorithm only supports '{ALGORITHM}'.")
    return _Claim(scope=_checked_scope(params["X-Amz-Credential"]),
                  signed_headers=params["X-Amz-SignedHeaders"],
                  signature=params["X-Amz-Signature"],
                  timestamp=_parse_amz_date(params["X-Amz-Date"]),
                  expires=_parse_expires(params.get("X-Amz-Expires")))


def _checked_scope(credential: str) -> Scope:
    """The scope of a credential being verified; a malformed date is left to the date check."""
    parts = credential.split("/")
    if len(parts) != 5 or not all(parts[:4]):
        raise _incomplete("Credential must have exactly 5 slash-delimited elements, "
                          f"e.g. keyid/date/region/service/term, got '{credential}'")
    if parts[4] != TERMINATOR:
        raise SignatureError("SignatureDoesNotMatch", "Credential should be scoped with a valid "
                             f"terminator: '{TERMINATOR}', not '{parts[4]}'.", 403)
    return Scope(*parts[:4])


def _request_time(amz_date: str | None, http_date: str | None) -> datetime:
    """AWS looks for ``X-Amz-Date`` first and falls back to ``Date``."""
    if amz_date is not None:
        return _parse_amz_date(amz_date)
    return _parse_http_date(http_date or "")


def _parse_http_date(raw: str) -> datetime:
    """A ``Date`` header standing in for ``X-Amz-Date``: ISO 8601 basic, or RFC 1123 as
    botocore writes it when the request it signs already carries a ``Date`` header."""
    if _AMZ_DATE.fullmatch(raw.strip()):
        return _parse_amz_date(raw.strip())
    try:
        parsed = parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        parsed = None
    if parsed is None:
        raise _bad_date(raw)
    return _utc(parsed)


def _parse_amz_date(raw: str) -> datetime:
    if not _AMZ_DATE.fullmatch(raw):
        raise _bad_date(raw)
    try:
        return datetime.strptime(raw, AMZ_DATE_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        raise _bad_date(raw) from None


def _parse_expires(raw: str | None) -> int | None:
    if raw is None:
        return None
    if not raw.isdigit() or not 0 < int(raw) <= MAX_PRESIGNED_EXPIRES:
        raise _incomplete("X-Amz-Expires must be a whole number of seconds from 1 to "
                          f"{MAX_PRESIGNED_EXPIRES} (seven days), got '{raw}'.")
    return int(raw)


def _check_host_signed(claim: _Claim) -> None:
    """AWS requires ``host`` to be signed: otherwise a signature could be replayed elsewhere."""
    if "host" not in claim.signed_headers.lower().split(";"):
        raise _incomplete("'Host' or ':authority' must be a 'SignedHeader' in the AWS "
                          "Authorization.")


def _check_scope_service(claim: _Claim, service: str) -> None:
    """A signature is for the service its scope names: the signing key is derived from it, so
    the key of one service must not open another (AWS checks it against the host's)."""
    if claim.scope.service != service:
        raise SignatureError("SignatureDoesNotMatch",
                             f"Credential should be scoped to correct service: '{service}'. ", 403)


def _check_scope_date(claim: _Claim) -> None:
    """The scope's day must be the request's day, or a day-old signing key would be reusable."""
    stamp = claim.timestamp.strftime(AMZ_DATE_FORMAT)
    if claim.scope.date != stamp[:8]:
        raise SignatureError(
            "SignatureDoesNotMatch",
            "Date in Credential scope does not match YYYYMMDD from ISO-8601 version of date "
            f"from HTTP: '{claim.scope.date}' != '{stamp[:8]}', from '{stamp}'.", 403)


def _check_time(claim: _Claim, now: datetime, max_skew: timedelta) -> None:
    """Reject requests from too far in the future, too old, or (presigned) past their expiry."""
    stamp = claim.timestamp
    if stamp > now + max_skew:
        raise _time_error(f"Signature not yet current: {_fmt(stamp)} is still later than "
                          f"{_fmt(now + max_skew)} ({_fmt(now)} + {_span(max_skew)})")
    window = max_skew if claim.expires is None else timedelta(seconds=claim.expires)
    if stamp < now - window:
        raise _time_error(f"Signature expired: {_fmt(stamp)} is now earlier than "
                          f"{_fmt(now - window)} ({_fmt(now)} - {_span(window)})")


def _payload_hash(header_map: Mapping[str, list[str]], body: bytes) -> str:
    """The payload line of the canonical request.

    A client may state the hash in ``x-amz-content-sha256``; the signature then covers the
    stated hash, not the body, so a stated hash must be the body's real one — else a signed
    request's body could be swapped. ``UNSIGNED-PAYLOAD`` is taken only when stated.
    """
    actual = hashlib.sha256(body).hexdigest()
    stated = _first(header_map, "x-amz-content-sha256")
    if stated is None:
        return actual
    stated = stated.strip()
    if stated == UNSIGNED_PAYLOAD:
        return stated
    if not _SHA256_HEX.fullmatch(stated) or stated.lower() != actual:
        raise _mismatch()
    return stated


# --- the signature itself ---------------------------------------------------------------------


def canonical_request(
    method: str,
    path: str,
    query_string: str,
    header_map: Mapping[str, list[str]],
    signed_headers: str,
    payload_hash: str,
) -> str:
    """AWS's canonical request for non-S3 services, as botocore's ``SigV4Auth`` builds it."""
    return "\n".join([
        method.upper(),
        canonical_uri(path),
        canonical_query(query_string),
        canonical_headers(header_map, signed_headers) + "\n",
        signed_headers,
        payload_hash,
    ])


def canonical_uri(path: str) -> str:
    """The raw path, dot and empty segments removed, percent-encoded once more.

    Matches botocore: ``quote(remove_dot_segments(path), safe='/~')`` on the path as sent.
    """
    raw = path.partition("?")[0]
    return quote(_to_bytes(_remove_dot_segments(raw)), safe="/~")


def canonical_query(query_string: str) -> str:
    """Names and values decoded (``+`` is a space), re-encoded per RFC 3986, then sorted."""
    pairs = []
    for item in query_string.split("&"):
        if not item:
            continue
        name, _, value = item.partition("=")
        pairs.append((_rfc3986(name), _rfc3986(value)))
    return "&".join(f"{name}={value}" for name, value in sorted(pairs))


def canonical_headers(header_map: Mapping[str, list[str]], signed_headers: str) -> str:
    """``name:value`` lines for the signed headers; repeats joined by commas, spaces collapsed.

    A signed header the request lacks is given an empty value, so the signature fails.
    """
    lines = []
    for name in signed_headers.split(";"):
        values = header_map.get(name.strip().lower(), [])
        lines.append(f"{name.strip().lower()}:" + ",".join(" ".join(v.split()) for v in values))
    return "\n".join(lines)


def string_to_sign(timestamp: datetime, scope: Scope, canonical: str) -> str:
    """Algorithm, request time, credential scope and the canonical request's SHA-256."""
    return "\n".join([ALGORITHM, timestamp.strftime(AMZ_DATE_FORMAT), scope.credential_scope,
                      hashlib.sha256(canonical.encode()).hexdigest()])


def signing_key(secret: str, scope: Scope) -> bytes:
    """The HMAC chain over date, region, service and ``aws4_request``, keyed by the secret."""
    key = f"AWS4{secret}".encode()
    for part in (scope.date, scope.region, scope.service, TERMINATOR):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


# --- small helpers ----------------------------------------------------------------------------


def _header_map(headers: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    """Lowercased header names to their values in arrival order (headers may repeat)."""
    mapping: dict[str, list[str]] = {}
    for name, value in headers:
        mapping.setdefault(name.lower(), []).append(value)
    return mapping


def _first(header_map: Mapping[str, list[str]], name: str) -> str | None:
    values = header_map.get(name)
    return values[0] if values else None


def _without_signature(query_string: str) -> str:
    """A presigned query string minus ``X-Amz-Signature``, which cannot sign itself."""
    kept = [item for item in query_string.split("&")
            if item and _rfc3986(item.partition("=")[0]) != "X-Amz-Signature"]
    return "&".join(kept)


def _rfc3986(component: str) -> str:
    return quote(unquote_to_bytes(component.replace("+", " ")), safe="-_.~")


def _to_bytes(text: str) -> bytes:
    """Back to the bytes sent: ASGI paths arrive as latin-1 text; other callers may use UTF-8."""
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        return text.encode("utf-8")


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 section 5.2.4, and also empty segments, as AWS (and botocore) do."""
    if not path:
        return "/"
    output: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if output:
                output.pop()
        elif segment and segment != ".":
            output.append(segment)
    first = "/" if path.startswith("/") else ""
    last = "/" if path.endswith("/") and output else ""
    return first + "/".join(output) + last


def _utc(moment: datetime | None) -> datetime:
    if moment is None:
        return datetime.now(UTC)
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _fmt(moment: datetime) -> str:
    return moment.strftime(AMZ_DATE_FORMAT)


def _span(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    return f"{seconds // 60} min." if seconds % 60 == 0 else f"{seconds} sec."


def _incomplete(message: str) -> SignatureError:
    return SignatureError("IncompleteSignature", message, 400)


def _mismatch() -> SignatureError:
    return SignatureError("SignatureDoesNotMatch", SIGNATURE_MISMATCH, 403)


def _time_error(message: str) -> SignatureError:
    return SignatureError("SignatureDoesNotMatch", message, 403)


def _bad_date(raw: str) -> SignatureError:
    return _incomplete(f"Date must be in ISO-8601 'basic format'. Got '{raw}'. "
                       "See http://en.wikipedia.org/wiki/ISO_8601")
