"""What every AWS service endpoint of Conveyor shares (SQS and SNS): its configuration,
authentication, reading a call in either protocol, the error kinds common to AWS's Query
services, and how names are scoped per region.

Each service keeps its own error table (``Kind`` rows added to ``COMMON_KINDS``), its own
``AwsError`` subclass and its handlers; this module holds the rest once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from starlette.requests import Request

from conveyor import errors
from conveyor.protocols import auth
from conveyor.protocols.aws import sigv4, wire
from conveyor.protocols.broker import Broker


@dataclass(frozen=True)
class Endpoint:
    """What the server tells an AWS endpoint about itself."""

    broker: Broker
    region: str
    account_id: str
    base_url: str | None
    policy: auth.Policy  # who may call (conveyor.protocols.auth), the same for every protocol


# -- errors --------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Kind:
    """An error as a service's model states it: the JSON ``__type`` name, the Query
    protocol's code (also JSON's ``x-amzn-query-error``), HTTP status and fault side.
    An error the service's model does not list is answered by AWS's front end in its own
    namespace (``json_type``, e.g. ``com.amazon.coral.service#InvalidParameterValueException``)."""

    name: str
    query_code: str
    status: int = 400
    sender: bool = True
    json_type: str = ""


# Errors of the protocol layer, the same in every AWS Query service
COMMON_KINDS = [
    Kind("InvalidAction", "InvalidAction"),
    Kind("SerializationException", "SerializationException"),
    Kind("InvalidSecurity", "InvalidSecurity", 403),
    Kind("AccessDenied", "AccessDenied", 403),
    Kind("MissingAuthenticationToken", "MissingAuthenticationToken", 403),
    Kind("IncompleteSignature", "IncompleteSignature"),
    Kind("InvalidClientTokenId", "InvalidClientTokenId", 403),
    Kind("SignatureDoesNotMatch", "SignatureDoesNotMatch", 403),
    Kind("RequestEntityTooLarge", "RequestEntityTooLarge", 413),
    Kind("ServiceUnavailable", "ServiceUnavailable", 503, sender=False),
    Kind("RequestTimeout", "RequestTimeout", 408, sender=False),  # SDKs retry it as transient
]


class AwsError(Exception):
    """An error answered in a service's own terms. Subclasses set ``KINDS`` (name → kind)
    and may map other names onto theirs with ``ALIASES``."""

    KINDS: ClassVar[dict[str, Kind]] = {}
    ALIASES: ClassVar[dict[str, str]] = {}
    ACCESS_DENIED: ClassVar[str] = "AccessDenied"  # the service's name for "your role may not"

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.kind = self.KINDS[self.ALIASES.get(name, name)]
        self.message = message

    def info(self) -> wire.ErrorInfo:
        return wire.ErrorInfo(self.kind.json_type or self.kind.name, self.kind.query_code, self.kind.status, self.kind.sender,
                              self.message)


def kinds(*tables: list[Kind]) -> dict[str, Kind]:
    return {k.name: k for table in tables for k in table}


# -- a request -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent an AWS request (``conveyor.protocols.auth``) and the SigV4 credential
    scope it carried, if any (its region scopes the request's names)."""

    identity: auth.Identity
    scope: sigv4.Scope | None = None


ANONYMOUS = Caller(auth.Identity("read"))  # SNS unsubscribe links; its handler checks the rest


def authenticate(endpoint: Endpoint, request: Request, body: bytes, error: type[AwsError],
                 signing_name: str) -> Caller:
    """The caller of an AWS request by the server's policy, or ``error`` as AWS would
    answer it: with AWS credentials configured, a SigV4 signature valid for one of them
    (header or presigned URL) and scoped to the service called (``signing_name``: sqs,
    sns); in token mode, that or a configured bearer token; in header mode some
    authentication must be present; in mode none, anyone may call. Only a verified
    signature makes its access key the caller's principal: an unverified scope names
    the region and nobody."""
    policy = endpoint.policy
    authorization = request.headers.get("authorization")
    query = query_string(request)
    scope = sigv4.parse_scope(authorization) or (sigv4.parse_query_scope(query) if query else None)
    if policy.takes_bearers and auth.is_bearer(authorization):
        try:
            return Caller(policy.bearer(authorization or ""), scope)
        except errors.Unauthorized as exc:
            raise error("InvalidClientTokenId", exc.message) from None
    if policy.verifies_signatures:
        try:
            verified = sigv4.verify(request.method, request.scope.get("raw_path", b"/").decode("latin-1"),
                                    query, [(k, v) for k, v in request.headers.items()], body, policy.aws_secrets,
                                    service=signing_name)
        except sigv4.SignatureError as exc:
            raise error(exc.code if exc.code in error.KINDS else "AccessDenied", exc.message) from None
        return Caller(auth.Identity(policy.aws_role(verified.access_key), verified.access_key), scope)
    if authorization is None and scope is None and policy.mode != "none":
        raise error("MissingAuthenticationToken", "Request is missing Authentication Token")
    if policy.takes_bearers:
        raise error("InvalidClientTokenId", "This server takes AWS requests signed with its configured "
                    "credentials (CONVEYOR_AWS_CREDENTIALS) or bearer tokens only.")
    return Caller(auth.ADMIN, scope)


def authorize(caller: Caller, needed: str, action: str, error: type[AwsError]) -> None:
    """Refuse, as AWS's AccessDenied, an action the caller's role does not cover."""
    if not caller.identity.may(needed):
        raise error(error.ACCESS_DENIED, f"The caller's role ({caller.identity.role}) is not authorized to perform "
                    f"{action}; it needs the {needed} role.")


def base_url(endpoint: Endpoint, request: Request) -> str:
    """The configured base URL, else the scheme and Host the client used."""
    if endpoint.base_url:
        return endpoint.base_url
    host = request.headers.get("host")
    return f"{request.scope['scheme']}://{host}" if host else f"{request.url.scheme}://{request.url.netloc}"


def query_string(request: Request) -> str:
    """The raw query string (as ``request.url.query``, without building the URL)."""
    raw: bytes = request.scope.get("query_string", b"")
    return raw.decode("latin-1")


def region(endpoint: Endpoint, scope: sigv4.Scope | None) -> str:
    return scope.region if scope and scope.region else endpoint.region


def protocol(request: Request) -> str:
    return wire.protocol(request.headers)


def read(service: wire.Service, request: Request, body: bytes, request_id: str) -> wire.Call:
    """JSON protocol by Content-Type (the action from X-Amz-Target); anything else is the
    Query protocol (the action from the form fields)."""
    if wire.is_json(request.headers):
        return wire.parse_json(service, request.headers.get("x-amz-target", ""), body, request_id)
    return wire.parse_query(service, wire.form_fields(body, query_string(request)), request_id,
                            wire.protocol(request.headers))


# -- names ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class RegionScope:
    """Names per region, as AWS scopes queues and topics. Conveyor has one account
    (configurable id) and stores a resource of a region other than the server's default
    as ``<region>:<name>``, so resources of the default region keep their plain names
    across the wire protocols, REST, SQL and the CLI."""

    region: str  # the request's
    default_region: str  # the server's
    account_id: str

    def internal(self, name: str, region: str | None = None) -> str:
        region = region or self.region
        return name if region == self.default_region else f"{region}:{name}"

    def visible(self, internal_name: str) -> bool:
        """Whether a stored resource belongs to this request's region."""
        region, sep, _ = internal_name.rpartition(":")
        return region == self.region if sep else self.region == self.default_region

    @staticmethod
    def bare(internal_name: str) -> str:
        return internal_name.rpartition(":")[2]

    def queue_arn(self, internal_queue: str) -> str:
        region, sep, name = internal_queue.rpartition(":")
        return f"arn:aws:sqs:{region if sep else self.default_region}:{self.account_id}:{name}"
