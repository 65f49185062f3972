"""SigV4 verification against requests signed by botocore itself (no hand-made signatures).

Each request is signed with ``SigV4Auth`` / ``SigV4QueryAuth`` and then taken apart the way
an ASGI server would present it: method, raw path, raw query string, (name, value) header
pairs with lowercased names, and the body bytes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import boto3
import pytest
from botocore.auth import SigV4Auth, SigV4QueryAuth
from botocore.awsrequest import AWSRequest, AWSResponse
from botocore.credentials import Credentials
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor.protocols.aws.sigv4 import (
    SIGNATURE_MISMATCH,
    Identity,
    Scope,
    SignatureError,
    canonical_uri,
    parse_query_scope,
    parse_scope,
    verify,
)

KEY, SECRET = "AKIDCONVEYOR", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
SECRETS = {KEY: SECRET, "AKIDOTHER": "another-secret"}
REGION, SERVICE = "eu-west-1", "sqs"
ENDPOINT = "https://sqs.eu-west-1.amazonaws.com"
IDENTITY = Identity(KEY, REGION, SERVICE)


@dataclass
class Wire:
    """A request as an ASGI application sees it."""

    method: str
    path: str
    query: str
    headers: list[tuple[str, str]]
    body: bytes
    signed_at: datetime

    def verify(self, secrets=SECRETS, **kwargs) -> Identity:
        return verify(self.method, self.path, self.query, self.headers, self.body, secrets,
                      **{"service": SERVICE, **kwargs})

    def header(self, name: str) -> str:
        return next(v for k, v in self.headers if k == name)

    def replace_header(self, name: str, value: str) -> Wire:
        headers = [(k, value if k == name else v) for k, v in self.headers]
        return Wire(self.method, self.path, self.query, headers, self.body, self.signed_at)

    def drop_header(self, name: str) -> Wire:
        headers = [(k, v) for k, v in self.headers if k != name]
        return Wire(self.method, self.path, self.query, headers, self.body, self.signed_at)


def to_wire(request: AWSRequest) -> Wire:
    """Split a signed AWSRequest as an HTTP client sends it and an ASGI server delivers it."""
    prepared = request.prepare()
    url = urlsplit(prepared.url)
    body = prepared.body or b""
    if isinstance(body, str):
        body = body.encode()
    # request.headers keeps repeated headers; the HTTP client adds Host and Content-Length.
    headers = [(name.lower(), value) for name, value in request.headers.items()]
    if not any(name == "host" for name, _ in headers):
        headers.insert(0, ("host", url.netloc))
    if body:
        headers.append(("content-length", str(len(body))))
    signed_at = datetime.strptime(request.context["timestamp"], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    return Wire(request.method, url.path or "/", url.query, headers, body, signed_at)


def signed(method="POST", url=ENDPOINT + "/", *, data=None, headers=None, params=None,
           key=KEY, secret=SECRET) -> Wire:
    request = AWSRequest(method=method, url=url, data=data, headers=headers, params=params)
    SigV4Auth(Credentials(key, secret), SERVICE, REGION).add_auth(request)
    return to_wire(request)


def presigned(url=ENDPOINT + "/", *, params=None, expires=3600, key=KEY, secret=SECRET) -> Wire:
    request = AWSRequest(method="GET", url=url, params=params or {})
    SigV4QueryAuth(Credentials(key, secret), SERVICE, REGION, expires=expires).add_auth(request)
    return to_wire(request)


def query_post() -> Wire:
    return signed(data="Action=SendMessage&MessageBody=hello+world&Version=2012-11-05",
                  headers={"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"})


def rejected(wire: Wire, **kwargs) -> SignatureError:
    with pytest.raises(SignatureError) as caught:
        wire.verify(**kwargs)
    return caught.value


# --- botocore-signed requests verify ------------------------------------------------------------


def test_form_encoded_query_protocol_post():
    wire = query_post()
    assert wire.verify() == IDENTITY


def test_json_post_with_target():
    wire = signed(data=b'{"QueueName": "orders"}',
                  headers={"X-Amz-Target": "AmazonSQS.CreateQueue",
                           "Content-Type": "application/x-amz-json-1.0"})
    assert wire.verify() == IDENTITY


def test_post_to_a_queue_path():
    wire = signed(url=ENDPOINT + "/000000000000/my-queue.fifo", data="Action=ReceiveMessage",
                  headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert wire.path == "/000000000000/my-queue.fifo"
    assert wire.verify() == IDENTITY


@pytest.mark.parametrize("path", [
    "/000000000000/my%20queue",           # already encoded by the client
    "/000000000000/caf%C3%A9%2Fq%3Ax",    # UTF-8, an encoded slash, a colon
    "/000000000000/a:b@c!$'()*,;=",        # sub-delims the client left raw
    "/000000000000/./x/../my-queue",       # dot segments
    "/000000000000//my-queue/",            # empty segment, trailing slash
])
def test_paths_that_need_encoding(path):
    wire = signed(url=ENDPOINT + path, data="Action=GetQueueAttributes",
                  headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert wire.path == path
    assert wire.verify() == IDENTITY


def test_raw_non_ascii_path_as_asgi_decodes_it():
    # An ASGI server hands raw_path over as bytes; decoded as latin-1 they must still verify.
    wire = signed(url=ENDPOINT + "/000000000000/café", data="Action=GetQueueUrl",
                  headers={"Content-Type": "application/x-www-form-urlencoded"})
    wire.path = wire.path.encode("utf-8").decode("latin-1")
    assert wire.path == "/000000000000/cafÃ©"
    assert wire.verify() == IDENTITY


def test_canonical_uri_encodes_the_raw_path_again():
    # botocore: quote(remove_dot_segments(raw path), safe="/~"), i.e. "twice" for decoded text.
    assert canonical_uri("/000000000000/my%20queue") == "/000000000000/my%2520queue"
    assert canonical_uri("/a/./b/../c//d/") == "/a/c/d/"
    assert canonical_uri("") == "/"
    assert canonical_uri("/~user/a b") == "/~user/a%20b"


def test_request_with_a_query_string():
    wire = signed("GET", ENDPOINT + "/000000000000/q",
                  params={"Action": "ReceiveMessage", "b": "2", "a b": "c+d/~é", "empty": ""})
    assert "a+b=c%2Bd%2F~%C3%A9" in wire.query  # urlencode's form encoding: space as "+"
    assert wire.verify() == IDENTITY


def test_query_string_already_in_the_url():
    wire = signed("GET", ENDPOINT + "/?b=2&a=1&Action=ListQueues")
    assert wire.verify() == IDENTITY


def test_repeated_and_whitespace_laden_headers():
    request = AWSRequest(method="POST", url=ENDPOINT + "/", data=b"{}",
                         headers={"Content-Type": "application/x-amz-json-1.0"})
    request.headers["X-Amz-Target"] = "  AmazonSQS.ListQueues  "
    request.headers["X-Custom"] = "a   b\t c"
    request.headers["X-Custom"] = " second  value "  # HTTPMessage appends: a repeated header
    SigV4Auth(Credentials(KEY, SECRET), SERVICE, REGION).add_auth(request)
    wire = to_wire(request)
    assert [v for k, v in wire.headers if k == "x-custom"] == ["a   b\t c", " second  value "]
    assert wire.verify() == IDENTITY


def test_header_names_in_any_case():
    wire = query_post()
    wire.headers = [(name.title(), value) for name, value in wire.headers]
    assert wire.verify() == IDENTITY


def test_date_header_instead_of_x_amz_date():
    # With a Date header present, botocore signs with it (RFC 1123) and sends no X-Amz-Date.
    wire = signed(data="Action=ListQueues", headers={"Date": "placeholder",
                  "Content-Type": "application/x-www-form-urlencoded"})
    assert not any(k == "x-amz-date" for k, _ in wire.headers)
    assert wire.header("date").endswith(" -0000")  # email.utils.formatdate, RFC 2822 style
    assert wire.verify() == IDENTITY


def test_content_sha256_header():
    wire = signed(data=b'{"QueueName": "q"}', headers={
        "X-Amz-Content-SHA256": "a2a4bd9f0b36f1ea23b94ed5b88b3c4fd51e7b7a60e1d32fbd0ec4b1b8e4e5d8"})
    assert rejected(wire).code == "SignatureDoesNotMatch"  # stated hash is not the body's
    body = b'{"QueueName": "q"}'
    good = signed(data=body, headers={"X-Amz-Content-SHA256": hashlib.sha256(body).hexdigest()})
    assert good.verify() == IDENTITY
    unsigned = signed(data=body, headers={"X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD"})
    assert unsigned.verify() == IDENTITY


def test_real_boto3_client_requests():
    """What boto3's SQS client really sends (JSON protocol, its own headers) verifies."""
    captured: list[AWSRequest] = []

    class Raw:
        def stream(self, **_):
            yield b"{}"

    def capture(request, **_):
        captured.append(request)
        return AWSResponse(request.url, 200, {"x-amzn-RequestId": "r"}, Raw())

    client = boto3.client("sqs", region_name=REGION, endpoint_url="http://localhost:9324",
                          aws_access_key_id=KEY, aws_secret_access_key=SECRET)
    client.meta.events.register("before-send.sqs.*", capture)
    client.list_queues()
    client.purge_queue(QueueUrl="http://localhost:9324/000000000000/my-queue.fifo")
    assert len(captured) == 2
    for request in captured:
        url = urlsplit(request.url)
        headers = [("host", url.netloc)] + [(k.lower(), v if isinstance(v, str) else v.decode())
                                            for k, v in request.headers.items()]
        body = request.body or b""
        assert verify(request.method, url.path, url.query, headers, body, SECRETS, service=SERVICE) == IDENTITY


# --- presigned URLs ---------------------------------------------------------------------------


def test_presigned_url():
    wire = presigned(params={"Action": "GetQueueUrl", "QueueName": "my queue/1"})
    assert "X-Amz-Signature=" in wire.query and not any(k == "authorization" for k, _ in wire.headers)
    assert wire.verify() == IDENTITY


def test_presigned_url_on_a_queue_path():
    wire = presigned(ENDPOINT + "/000000000000/my-queue.fifo", params={"Action": "ReceiveMessage"})
    assert wire.verify() == IDENTITY
    assert parse_query_scope(wire.query) == Scope(KEY, wire.signed_at.strftime("%Y%m%d"), REGION, SERVICE)


def test_presigned_url_expires():
    wire = presigned(params={"Action": "ListQueues"}, expires=60)
    assert wire.verify(now=wire.signed_at + timedelta(seconds=59)) == IDENTITY
    error = rejected(wire, now=wire.signed_at + timedelta(seconds=61))
    assert (error.code, error.status) == ("SignatureDoesNotMatch", 403)
    assert error.message.startswith("Signature expired: ")
    assert "(" in error.message and "- 1 min.)" in error.message


def test_presigned_url_from_the_future():
    wire = presigned(params={"Action": "ListQueues"})
    error = rejected(wire, now=wire.signed_at - timedelta(minutes=16))
    assert error.message.startswith("Signature not yet current: ")


def test_presigned_url_tampered_parameter():
    wire = presigned(params={"Action": "ListQueues", "QueueNamePrefix": "a"})
    wire.query = wire.query.replace("QueueNamePrefix=a", "QueueNamePrefix=b")
    assert rejected(wire).message == SIGNATURE_MISMATCH


def test_presigned_url_missing_and_bad_parameters():
    wire = presigned(params={"Action": "ListQueues"})
    without_sig = "&".join(p for p in wire.query.split("&") if not p.startswith("X-Amz-Signature="))
    with pytest.raises(SignatureError) as caught:
        verify("GET", "/", without_sig, wire.headers, b"", SECRETS, service=SERVICE)
    assert caught.value.code == "IncompleteSignature" and caught.value.status == 400
    assert "must include 'X-Amz-Signature'" in caught.value.message
    for bad in ("X-Amz-Expires=0", "X-Amz-Expires=604801", "X-Amz-Expires=soon"):
        query = "&".join(bad if p.startswith("X-Amz-Expires=") else p for p in wire.query.split("&"))
        with pytest.raises(SignatureError) as caught:
            verify("GET", "/", query, wire.headers, b"", SECRETS, service=SERVICE)
        assert caught.value.code == "IncompleteSignature"
    query = wire.query.replace("X-Amz-Algorithm=AWS4-HMAC-SHA256", "X-Amz-Algorithm=AWS4-ECDSA-P256-SHA256")
    with pytest.raises(SignatureError) as caught:
        verify("GET", "/", query, wire.headers, b"", SECRETS, service=SERVICE)
    assert caught.value.code == "IncompleteSignature"


# --- rejections -------------------------------------------------------------------------------


def test_no_authentication_at_all():
    wire = query_post().drop_header("authorization")
    error = rejected(wire)
    assert (error.code, error.status, error.message) == (
        "MissingAuthenticationToken", 403, "Request is missing Authentication Token")


def test_body_tampered():
    wire = query_post()
    wire.body = wire.body.replace(b"hello", b"HELLO")
    error = rejected(wire)
    assert (error.code, error.status, error.message) == ("SignatureDoesNotMatch", 403, SIGNATURE_MISMATCH)


def test_signed_header_changed():
    wire = signed(data=b"{}", headers={"X-Amz-Target": "AmazonSQS.ListQueues",
                                      "Content-Type": "application/x-amz-json-1.0"})
    assert rejected(wire.replace_header("x-amz-target", "AmazonSQS.DeleteQueue")).code == "SignatureDoesNotMatch"
    assert rejected(wire.replace_header("host", "evil.example")).code == "SignatureDoesNotMatch"


def test_signed_header_missing():
    wire = signed(data=b"{}", headers={"X-Amz-Target": "AmazonSQS.ListQueues"})
    assert rejected(wire.drop_header("x-amz-target")).code == "SignatureDoesNotMatch"


def test_unsigned_header_may_change():
    wire = query_post()
    wire.headers.append(("user-agent", "anything"))  # botocore never signs User-Agent
    assert wire.verify() == IDENTITY


def test_wrong_secret():
    wire = signed(data="Action=ListQueues", secret="not-the-secret")
    assert rejected(wire).code == "SignatureDoesNotMatch"


def test_unknown_access_key():
    wire = signed(data="Action=ListQueues", key="AKIDUNKNOWN")
    error = rejected(wire)
    assert (error.code, error.status, error.message) == (
        "InvalidClientTokenId", 403, "The security token included in the request is invalid.")


def test_method_query_and_path_are_signed():
    wire = signed("GET", ENDPOINT + "/000000000000/q?Action=ReceiveMessage")
    assert wire.verify() == IDENTITY
    for change in ({"method": "DELETE"}, {"path": "/000000000000/other"},
                   {"query": "Action=DeleteQueue"}):
        altered = Wire(**{**wire.__dict__, **change})
        assert rejected(altered).code == "SignatureDoesNotMatch"


@pytest.mark.parametrize(("authorization", "expected"), [
    ("AWS4-HMAC-SHA256 Credential=AKID/20261122/eu-west-1/sqs/aws4_request, SignedHeaders=host;x-amz-date",
     "Authorization header requires 'Signature' parameter."),
    ("AWS4-HMAC-SHA256 Credential=AKID/20261122/eu-west-1/sqs/aws4_request, Signature=abc",
     "Authorization header requires 'SignedHeaders' parameter."),
    ("AWS4-HMAC-SHA256 SignedHeaders=host, Signature=abc",
     "Authorization header requires 'Credential' parameter."),
    ("AWS4-HMAC-SHA256 Credential= AKID/20261122/eu-west-1/sqs/aws4_request, SignedHeaders=host, Signature=abc",
     "not a valid key=value pair (missing equal-sign) in Authorization header"),
    ("AWS4-HMAC-SHA256 Credential=AKID/eu-west-1/sqs/aws4_request, SignedHeaders=host, Signature=abc",
     "Credential must have exactly 5 slash-delimited elements"),
    ("AWS AKID:c2lnbmF0dXJl", "Authorization header requires 'Credential' parameter."),
    ("Bearer token", "Authorization=Bearer token"),
    ("AWS4-HMAC-SHA512 Credential=AKID/20261122/eu-west-1/sqs/aws4_request, SignedHeaders=host, Signature=abc",
     "Authorization header requires 'Signature' parameter."),
    ("AWS4-HMAC-SHA256", "Authorization header requires 'Credential' parameter."),
])
def test_malformed_authorization(authorization, expected):
    wire = query_post().replace_header("authorization", authorization)
    error = rejected(wire)
    assert (error.code, error.status) == ("IncompleteSignature", 400)
    assert expected in error.message


def test_missing_date():
    wire = query_post().drop_header("x-amz-date")
    error = rejected(wire)
    assert error.code == "IncompleteSignature"
    assert "requires existence of either a 'X-Amz-Date' or a 'Date' header" in error.message


def test_bad_date_format():
    error = rejected(query_post().replace_header("x-amz-date", "2026-11-22T10:00:00Z"))
    assert error.code == "IncompleteSignature" and "ISO-8601" in error.message


def test_bad_terminator():
    wire = query_post()
    auth = wire.header("authorization").replace("/aws4_request", "/aws5_request")
    error = rejected(wire.replace_header("authorization", auth))
    assert error.code == "SignatureDoesNotMatch" and "valid terminator" in error.message


def test_skewed_clock():
    wire = query_post()
    assert wire.verify(now=wire.signed_at + timedelta(minutes=14)) == IDENTITY
    assert wire.verify(now=wire.signed_at - timedelta(minutes=14)) == IDENTITY
    late = rejected(wire, now=wire.signed_at + timedelta(minutes=16))
    stamp = wire.signed_at.strftime("%Y%m%dT%H%M%SZ")
    now = (wire.signed_at + timedelta(minutes=16)).strftime("%Y%m%dT%H%M%SZ")
    earliest = (wire.signed_at + timedelta(minutes=1)).strftime("%Y%m%dT%H%M%SZ")
    assert (late.code, late.status) == ("SignatureDoesNotMatch", 403)
    assert late.message == f"Signature expired: {stamp} is now earlier than {earliest} ({now} - 15 min.)"
    early = rejected(wire, now=wire.signed_at - timedelta(minutes=16))
    assert early.message.startswith(f"Signature not yet current: {stamp} is still later than ")
    assert early.message.endswith(" + 15 min.)")
    naive = (wire.signed_at + timedelta(minutes=16)).replace(tzinfo=None)  # naive means UTC
    assert rejected(wire, now=naive).message == late.message
    assert wire.verify(now=wire.signed_at + timedelta(minutes=16), max_skew=timedelta(minutes=20)) == IDENTITY


def test_credential_scope_date_mismatch():
    wire = query_post()
    day_before = wire.signed_at - timedelta(days=1)
    moved = wire.replace_header("x-amz-date", day_before.strftime("%Y%m%dT%H%M%SZ"))
    error = rejected(moved, now=day_before)
    assert (error.code, error.status) == ("SignatureDoesNotMatch", 403)
    assert error.message.startswith(
        "Date in Credential scope does not match YYYYMMDD from ISO-8601 version of date from HTTP: "
        f"'{wire.signed_at:%Y%m%d}' != '{day_before:%Y%m%d}'")


def test_credential_scope_must_name_the_service_called():
    """A valid SQS signature is no SNS signature (and the other way round), header or presigned."""
    for wire in (query_post(), presigned(params={"Action": "ListQueues"})):
        assert wire.verify(service="sqs") == IDENTITY
        error = rejected(wire, service="sns")
        assert (error.code, error.status) == ("SignatureDoesNotMatch", 403)
        assert error.message == "Credential should be scoped to correct service: 'sns'. "


def test_host_must_be_signed():
    request = AWSRequest(method="POST", url=ENDPOINT + "/", data=b"{}")
    SigV4Auth(Credentials(KEY, SECRET), SERVICE, REGION).add_auth(request)
    wire = to_wire(request)
    auth = wire.header("authorization").replace("SignedHeaders=host;x-amz-date", "SignedHeaders=x-amz-date")
    error = rejected(wire.replace_header("authorization", auth))
    assert (error.code, error.status) == ("IncompleteSignature", 400)
    assert error.message == "'Host' or ':authority' must be a 'SignedHeader' in the AWS Authorization."


# --- parse_scope ------------------------------------------------------------------------------


def test_parse_scope_of_a_signed_request():
    wire = query_post()
    assert parse_scope(wire.header("authorization")) == Scope(
        KEY, wire.signed_at.strftime("%Y%m%d"), REGION, SERVICE)


@pytest.mark.parametrize("authorization", [
    None, "", "Bearer abc", "AWS AKID:sig", "AWS4-HMAC-SHA256",
    "AWS4-HMAC-SHA256 SignedHeaders=host, Signature=abc",
    "AWS4-HMAC-SHA256 Credential=AKID/20261122/us-east-1/sqs, Signature=abc",
    "AWS4-HMAC-SHA256 Credential=AKID/20261122//sqs/aws4_request",
    "AWS4-HMAC-SHA256 Credential=AKID/20261122/us-east-1/sqs/aws5_request",
    "AWS4-HMAC-SHA256 Credential",
    "AWS4-HMAC-SHA256 ===,,,",
])
def test_parse_scope_rejects_without_raising(authorization):
    assert parse_scope(authorization) is None


def test_parse_scope_examples():
    header = ("AWS4-HMAC-SHA256 Credential=AKID/20261122/us-east-1/sqs/aws4_request, "
              "SignedHeaders=host;x-amz-date, Signature=abc")
    assert parse_scope(header) == Scope("AKID", "20261122", "us-east-1", "sqs")
    assert parse_scope(header.replace(", ", ",")).region == "us-east-1"
    assert parse_query_scope("Action=ListQueues") is None
    assert parse_query_scope("X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=A%2F20261122%2Fap-south-1"
                             "%2Fsns%2Faws4_request") == Scope("A", "20261122", "ap-south-1", "sns")


# -- whatever a client sends, the verifier answers with a SignatureError --------------------

_PART = st.sampled_from([
    "AWS4-HMAC-SHA256", "AWS4-HMAC-SHA1", "Credential=", f"Credential={KEY}/20260101/{REGION}/{SERVICE}/aws4_request",
    f"Credential={KEY}/2026x101/{REGION}/{SERVICE}/aws4_request", f"Credential={KEY}//{REGION}/{SERVICE}/aws4_request",
    "Credential=a/b/c/d/e/f", "SignedHeaders=host;x-amz-date", "SignedHeaders=", "SignedHeaders=;;",
    "Signature=" + "0" * 64, "Signature=zz", ",", " ", "=", "==", "\t"]) | st.text(max_size=12)
_DATE = st.sampled_from(["20260101T000000Z", "20261301T000000Z", "20260101T250000Z", "2026", "",
                         "Thu, 01 Jan 2026 00:00:00 GMT", "Fri, 31 Feb 2026 00:00:00 GMT"]) | st.text(max_size=20)
_QUERY = st.lists(st.tuples(st.sampled_from(["X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires",
                                             "X-Amz-SignedHeaders", "X-Amz-Signature", "Action"]) | st.text(max_size=5),
                            _DATE | _PART), max_size=7).map(lambda pairs: "&".join(f"{k}={v}" for k, v in pairs))


@settings(max_examples=400, deadline=None, derandomize=True)
@given(authorization=st.none() | st.lists(_PART, max_size=8).map(" ".join), amz_date=st.none() | _DATE,
       http_date=st.none() | _DATE, query=_QUERY, sha=st.none() | st.sampled_from(["UNSIGNED-PAYLOAD", "x", "0" * 64]),
       path=st.sampled_from(["/", "//a/../b", "/%zz", "/a b", ""]) | st.text(max_size=10))
def test_any_request_gets_an_identity_or_a_signature_error(authorization, amz_date, http_date, query, sha, path):
    headers = [("host", "sqs.eu-west-1.amazonaws.com")]
    for name, value in (("authorization", authorization), ("x-amz-date", amz_date), ("date", http_date),
                        ("x-amz-content-sha256", sha)):
        if value is not None:
            headers.append((name, value))
    try:
        verify("POST", path, query, headers, b"Action=ListQueues", SECRETS, service=SERVICE, now=datetime(2026, 1, 1, tzinfo=UTC))
    except SignatureError as exc:
        assert exc.code and exc.message
    parse_scope(authorization)
    parse_query_scope(query)
