"""JWT authentication (CONVEYOR_AUTH=jwt): HS256, RS256 and EdDSA tokens with keys from
configuration, expiry and not-before enforced, roles from a configurable claim, applied to
REST and the AWS endpoints alike; the verified sub is stamped on what a request sends and
a client cannot set it."""

from __future__ import annotations

import time
import uuid

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from support.server import ServerProcess

SECRET = "a-shared-secret-of-enough-length-for-hs256"


def _pem(private) -> tuple[str, str]:
    priv = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption()).decode()
    pub = private.public_key().public_bytes(serialization.Encoding.PEM,
                                            serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return priv, pub


RSA_PRIVATE, RSA_PUBLIC = _pem(rsa.generate_private_key(public_exponent=65537, key_size=2048))
ED_PRIVATE, ED_PUBLIC = _pem(ed25519.Ed25519PrivateKey.generate())


def token(key: str, alg: str, *, role="admin", sub="alice", claim="role", exp=300, nbf=None, **extra) -> str:
    now = int(time.time())
    claims = {"sub": sub, claim: role, "exp": now + exp, **extra}
    if nbf is not None:
        claims["nbf"] = now + nbf
    return jwt.encode(claims, key, algorithm=alg)


@pytest.fixture(scope="module")
def hs_server(module_dsn):
    proc = ServerProcess(module_dsn, env={"CONVEYOR_AUTH": "jwt", "CONVEYOR_JWT_SECRET": SECRET}).start()
    yield proc
    proc.kill()


@pytest.fixture(scope="module")
def key_servers(module_dsn, tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    (folder / "rsa.pem").write_text(RSA_PUBLIC)
    servers = {
        "RS256": ServerProcess(module_dsn, env={"CONVEYOR_AUTH": "jwt",
                                                "CONVEYOR_JWT_PUBLIC_KEY": f"@{folder / 'rsa.pem'}"}).start(),
        "EdDSA": ServerProcess(module_dsn, env={
            "CONVEYOR_AUTH": "jwt", "CONVEYOR_JWT_PUBLIC_KEY": ED_PUBLIC, "CONVEYOR_JWT_ROLE_CLAIM": "access.level",
            "CONVEYOR_JWT_ROLES": "viewer:read,producer:write,operator:admin"}).start(),
    }
    yield servers
    for proc in servers.values():
        proc.kill()


def _get(server, bearer):
    return httpx.get(server.url + "/v1/queues", headers={"Authorization": f"Bearer {bearer}"})


def test_hs256_roles_expiry_and_not_before(hs_server, queue_name):
    url = hs_server.url
    assert _get(hs_server, token(SECRET, "HS256")).status_code == 200
    for bad, why in ((token(SECRET, "HS256", exp=-60), "expired"),
                     (token(SECRET, "HS256", nbf=120), "not valid yet"),
                     (token("another-secret-of-enough-length-xxxxxx", "HS256"), "invalid JWT"),
                     (token(SECRET, "HS256", role="superuser"), "names no role"),
                     (jwt.encode({"sub": "a", "role": "admin"}, SECRET, algorithm="HS256"), "exp"),
                     (jwt.encode({"sub": "a", "role": "admin", "exp": time.time() + 60}, None, algorithm="none"),
                      "not accepted"),
                     ("not.a.jwt", "malformed")):
        r = _get(hs_server, bad)
        assert r.status_code == 401 and why in r.json()["error"], (why, r.text)
        assert r.headers["www-authenticate"] == 'Bearer realm="conveyor", error="invalid_token"'
    reader, writer = token(SECRET, "HS256", role="read-only"), token(SECRET, "HS256", role="read-write", sub="bob")
    admin = token(SECRET, "HS256")
    h = lambda t: {"Authorization": f"Bearer {t}"}  # noqa: E731
    assert httpx.post(url + "/v1/queues", json={"name": queue_name}, headers=h(writer)).status_code == 403
    assert httpx.post(url + "/v1/queues", json={"name": queue_name}, headers=h(admin)).status_code == 201
    q = f"{url}/v1/queues/{queue_name}"
    assert httpx.post(q + "/messages", json={"message": "x"}, headers=h(reader)).status_code == 403
    # the verified sub is stamped on the message; what a client sends cannot change it
    r = httpx.post(q + "/messages", json={"message": "x", "headers": {"sender_id": "mallory"}}, headers=h(writer))
    assert r.status_code == 201
    [m] = httpx.get(q + "/messages", headers=h(writer)).json()
    assert m["sender_id"] == "bob"
    r = httpx.post(q + "/messages", json={"message": "y", "sender_id": "mallory"}, headers=h(writer))
    assert r.status_code == 400  # not a field a client may send


def test_times_must_be_numeric_dates(hs_server):
    """``"exp": "9999999999"`` (a string) was accepted as an expiry in 2286: PyJWT compares
    int(exp). exp, nbf and iat must be JSON numbers; anything else is an invalid token,
    refused as such on REST and on the AWS endpoints."""
    far = int(time.time()) + 300
    sqs = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.ListQueues"}
    for claims in ({"exp": str(far)}, {"exp": "9999999999"}, {"exp": far, "nbf": "0"},
                   {"exp": far, "iat": str(far - 600)}, {"exp": far, "nbf": True}):
        bad = jwt.encode({"sub": "a", "role": "admin", **claims}, SECRET, algorithm="HS256")
        r = _get(hs_server, bad)
        assert r.status_code == 401 and r.json()["code"] == "Unauthorized", (claims, r.text)
        assert r.json()["error"].startswith("invalid JWT: "), (claims, r.text)
        r = httpx.post(hs_server.url + "/", content=b"{}", headers={**sqs, "Authorization": f"Bearer {bad}"})
        assert r.status_code == 403 and r.json()["__type"].endswith("InvalidClientTokenId"), (claims, r.text)
    # numbers, fractions included (RFC 7519's NumericDate may have them), are fine
    good = jwt.encode({"sub": "a", "role": "admin", "exp": far + 0.5, "nbf": far - 600, "iat": far - 300.25},
                      SECRET, algorithm="HS256")
    assert _get(hs_server, good).status_code == 200


def test_rs256_and_eddsa_with_a_configured_role_claim(key_servers):
    assert _get(key_servers["RS256"], token(RSA_PRIVATE, "RS256")).status_code == 200
    # an HS256 token signed with the public key as its secret: the classic confusion, refused
    forged = jwt.encode({"sub": "x", "role": "admin", "exp": time.time() + 60}, "x" * 40, algorithm="HS256")
    assert _get(key_servers["RS256"], forged).status_code == 401
    ed = key_servers["EdDSA"]
    good = token(ED_PRIVATE, "EdDSA", claim="access", role=None, access={"level": ["viewer", "operator"]})
    assert _get(ed, good).status_code == 200
    assert _get(ed, token(RSA_PRIVATE, "RS256")).status_code == 401  # not the configured algorithm
    reader = token(ED_PRIVATE, "EdDSA", claim="access", role=None, access={"level": "viewer"})
    r = httpx.post(ed.url + "/v1/queues", json={"name": f"q{uuid.uuid4().hex[:6]}"},
                   headers={"Authorization": f"Bearer {reader}"})
    assert r.status_code == 403 and r.json()["code"] == "PermissionDenied"


def test_the_aws_endpoints_take_the_same_tokens(hs_server):
    name = f"jwt-{uuid.uuid4().hex[:8]}"
    headers = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.CreateQueue"}
    r = httpx.post(hs_server.url + "/", json={"QueueName": name},
                   headers={**headers, "Authorization": f"Bearer {token(SECRET, 'HS256', exp=-5)}"})
    assert r.status_code == 403 and r.json()["__type"].endswith("InvalidClientTokenId")
    r = httpx.post(hs_server.url + "/", json={"QueueName": name},
                   headers={**headers, "Authorization": f"Bearer {token(SECRET, 'HS256')}"})
    assert r.status_code == 200, r.text
    queue_url = r.json()["QueueUrl"]
    writer = {"Authorization": f"Bearer {token(SECRET, 'HS256', role='write', sub='svc-orders')}"}
    sent = httpx.post(hs_server.url + "/", json={"QueueUrl": queue_url, "MessageBody": "hi"},
                      headers={**headers, "X-Amz-Target": "AmazonSQS.SendMessage", **writer})
    assert sent.status_code == 200, sent.text
    got = httpx.post(hs_server.url + "/", json={"QueueUrl": queue_url, "AttributeNames": ["SenderId"]},
                     headers={**headers, "X-Amz-Target": "AmazonSQS.ReceiveMessage", **writer}).json()
    assert got["Messages"][0]["Attributes"]["SenderId"] == "svc-orders"


def test_queen_pushes_carry_the_verified_sub_as_producer_sub(hs_server):
    """Queen's producerSub is the verified sub; a client's own producerSub is dropped,
    and Queen's roles follow the token's (read-only cannot push)."""
    queue = f"jwt-pq-{uuid.uuid4().hex[:6]}"
    h = lambda t: {"Authorization": f"Bearer {t}"}  # noqa: E731
    writer = token(SECRET, "HS256", role="read-write", sub="svc-billing")
    reader = token(SECRET, "HS256", role="read-only", sub="viewer")
    item = {"queue": queue, "payload": {"n": 1}, "producerSub": "mallory"}
    assert httpx.post(hs_server.url + "/api/v1/push", json={"items": [item]}, headers=h(reader)).status_code == 403
    pushed = httpx.post(hs_server.url + "/api/v1/push", json={"items": [item]}, headers=h(writer))
    assert pushed.status_code == 201, pushed.text
    popped = httpx.get(f"{hs_server.url}/api/v1/pop/queue/{queue}", headers=h(writer)).json()
    [message] = popped["messages"]
    assert message["producerSub"] == "svc-billing" and message["data"] == {"n": 1}
