"""One authentication policy for every protocol: each auth mode, with and without AWS
credentials, against REST, Queen, hq (under /hq and on its own port), SQS (JSON and
Query) and SNS (JSON and Query), unsigned, wrongly signed and correctly signed; each refusal in the protocol's own terms. Plus the
holes this policy closed: an SNS "unsubscribe link" carrying another action, and AWS
requests in token mode with a wrong bearer token. The dashboard (/ui) is checked like
REST: its data under /ui/api, and the admin role for what it destroys."""

from __future__ import annotations

import asyncio
import uuid

import botocore
import botocore.exceptions
import httpx
import pytest
from queen import Queen

from support.server import ServerProcess, free_port
from support.sns_clients import sns_client
from support.sqs_clients import client as sqs_client

pytestmark = pytest.mark.long(30)  # seconds on a quiet machine: started first (tests/support/parallel.py)

TOKENS = "good-token:admin,reader-token:read"
CREDENTIALS = "AKIDCONVEYORTEST:good-secret,AKIDREADER:reader-secret:read"

# (mode, AWS credentials configured)
SERVERS = [("none", False), ("none", True), ("header", False), ("header", True), ("token", False), ("token", True)]
KINDS = ("unsigned", "wrong", "correct")
PROTOCOLS = ("rest", "queen", "hq", "hq-port", "ui", "sqs-json", "sqs-query", "sns-json", "sns-query")


@pytest.fixture(scope="module")
def servers(module_dsn):
    started = {}
    try:
        for mode, creds in SERVERS:
            env = {"CONVEYOR_AUTH": mode, "CONVEYOR_AUTH_TOKENS": TOKENS, "CONVEYOR_HQ_PORT": str(free_port())}
            if creds:
                env["CONVEYOR_AWS_CREDENTIALS"] = CREDENTIALS
            started[(mode, creds)] = ServerProcess(module_dsn, env=env).start()
        yield started
    finally:
        for proc in started.values():
            proc.kill()


def expected(protocol: str, mode: str, creds: bool, kind: str) -> str | None:
    """The refusal code a request gets, None if it is served."""
    if protocol in ("rest", "queen", "hq", "hq-port", "ui"):
        if mode == "none" or kind == "correct" or (mode == "header" and kind == "wrong"):
            return None
        return "Unauthorized"
    if creds:  # SigV4 verified in every mode
        return {"unsigned": "MissingAuthenticationToken", "wrong": "SignatureDoesNotMatch", "correct": None}[kind]
    if mode == "none":
        return None
    if mode == "header":
        return "MissingAuthenticationToken" if kind == "unsigned" else None
    return "MissingAuthenticationToken" if kind == "unsigned" else "InvalidClientTokenId"  # token, no keys


def _hq_url(server: ServerProcess) -> str:
    return f"http://127.0.0.1:{server.env['CONVEYOR_HQ_PORT']}"


def call(server: ServerProcess, protocol: str, kind: str) -> str | None:
    """One harmless call; the error code it got, None on success."""
    url = server.url
    paths = {"rest": url + "/v1/queues", "hq": url + "/hq/queues", "hq-port": _hq_url(server) + "/queues",
             "ui": url + "/ui/api/queues"}  # the dashboard's data (its page and static files are open)
    if protocol in paths:
        headers = {"unsigned": {}, "wrong": {"Authorization": "Bearer wrong"},
                   "correct": {"Authorization": "Bearer good-token"}}[kind]
        r = httpx.get(paths[protocol], headers=headers)
        return None if r.status_code == 200 else r.json()["code"]
    if protocol == "queen":  # Queen's own client, as its users configure it
        token = {"unsigned": None, "wrong": "wrong", "correct": "good-token"}[kind]
        return asyncio.run(_queen_call(url, token))
    service, wire = protocol.split("-")
    config = {"signature_version": botocore.UNSIGNED} if kind == "unsigned" else {}
    secret = "wrong-secret" if kind == "wrong" else "good-secret"
    if service == "sqs":
        c = sqs_client(url, wire, secret_key=secret, **config)
        action = c.list_queues
    else:
        c = sns_client(url, wire, secret_key=secret, **config)
        action = c.list_topics
    try:
        action()
    except botocore.exceptions.ClientError as exc:
        assert exc.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        return exc.response["Error"]["Code"]
    return None


async def _queen_call(url: str, token: str | None) -> str | None:
    async with Queen(url, bearer_token=token, retry_attempts=1) as q:
        try:
            await q.admin.get_overview()
        except httpx.HTTPStatusError as exc:
            assert exc.response.status_code == 403
            return str(exc.response.json()["code"])
    return None


@pytest.mark.parametrize("mode,creds", SERVERS)
def test_every_protocol_in_every_mode(servers, mode, creds):
    server = servers[(mode, creds)]
    got = {(p, k): call(server, p, k) for p in PROTOCOLS for k in KINDS}
    want = {(p, k): expected(p, mode, creds, k) for p in PROTOCOLS for k in KINDS}
    assert got == want


def test_token_mode_refuses_a_wrong_bearer_on_the_aws_endpoints(servers):
    """Token mode protected only REST: an SQS request with a wrong bearer created a queue."""
    for creds in (False, True):
        url = servers[("token", creds)].url
        name = f"bearer-{uuid.uuid4().hex[:8]}"
        headers = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.CreateQueue"}
        r = httpx.post(url + "/", json={"QueueName": name}, headers={**headers, "Authorization": "Bearer wrong"})
        assert r.status_code == 403 and r.json()["__type"].endswith("InvalidClientTokenId"), r.text
        form = httpx.post(url + "/", data={"Action": "CreateQueue", "QueueName": name},
                          headers={"Authorization": "Bearer wrong"})
        assert form.status_code == 403 and "<Code>InvalidClientTokenId</Code>" in form.text
        # a configured token is accepted on every protocol, with its role
        r = httpx.post(url + "/", json={"QueueName": name}, headers={**headers, "Authorization": "Bearer good-token"})
        assert r.status_code == 200, r.text
        r = httpx.post(url + "/", json={"QueueName": name + "x"},
                       headers={**headers, "Authorization": "Bearer reader-token"})
        assert r.status_code == 403 and r.json()["__type"].endswith("AccessDenied"), r.text


def test_roles_of_aws_keys(servers):
    url = servers[("token", True)].url
    reader = sqs_client(url, "json", access_key="AKIDREADER", secret_key="reader-secret")
    reader.list_queues()
    with pytest.raises(botocore.exceptions.ClientError) as err:
        reader.create_queue(QueueName="not-for-readers")
    assert err.value.response["Error"]["Code"] == "AccessDenied"
    sns_reader = sns_client(url, "query", access_key="AKIDREADER", secret_key="reader-secret")
    sns_reader.list_topics()
    with pytest.raises(botocore.exceptions.ClientError) as err:
        sns_reader.create_topic(Name="not-for-readers")
    assert err.value.response["Error"]["Code"] == "AuthorizationError"


@pytest.mark.parametrize("creds", [False, True])
def test_only_a_bare_unsubscribe_link_skips_authentication(servers, creds):
    """GET /?Action=Unsubscribe was judged anonymous from its query string, and then ran
    whatever action its body or target header named."""
    server = servers[("header", creds)]
    admin = sns_client(server.url, "query", secret_key="good-secret")
    name = f"smuggled-{uuid.uuid4().hex[:8]}"
    link = {"Action": "Unsubscribe",
            "SubscriptionArn": "arn:aws:sns:us-east-1:000000000000:t:00000000-0000-4000-8000-000000000000"}
    smuggled = [
        httpx.request("GET", server.url + "/", params=link, data={"Action": "CreateTopic", "Name": name}),
        httpx.request("GET", server.url + "/", params=link, content=b'{"Name": "%s"}' % name.encode(),
                      headers={"X-Amz-Target": "AmazonSNS.CreateTopic",
                               "Content-Type": "application/x-amz-json-1.0"}),
        httpx.request("GET", server.url + "/", params=link, headers={"X-Amz-Target": "AmazonSNS.CreateTopic"}),
    ]
    for r in smuggled:
        assert r.status_code == 403, r.text
    assert name not in str(admin.list_topics()["Topics"])
    # the bare link still works without credentials
    topic = admin.create_topic(Name=f"links-{uuid.uuid4().hex[:8]}")["TopicArn"]
    sub = admin.subscribe(TopicArn=topic, Protocol="sqs",
                          Endpoint=f"arn:aws:sqs:us-east-1:000000000000:{_queue(server)}")["SubscriptionArn"]
    r = httpx.get(server.url + "/", params={"Action": "Unsubscribe", "SubscriptionArn": sub})
    assert r.status_code == 200, r.text
    assert admin.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"] == []


def _queue(server) -> str:
    name = f"links-{uuid.uuid4().hex[:8]}"
    sqs_client(server.url, "json", secret_key="good-secret").create_queue(QueueName=name)
    return name


def test_open_paths_stay_open_and_everything_else_is_covered(servers):
    server = servers[("token", True)]
    for path in ("/livez", "/readyz", "/metrics", "/v1/openapi.json", "/SimpleNotificationService.pem"):
        assert httpx.get(server.url + path).status_code == 200, path
    for path in ("/v1/queues", "/v1/nothing-here", "/api/v1/resources/queues", "/anything", "/hq/queues"):
        r = httpx.get(server.url + path, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 403, (path, r.status_code)
    # hq's port: health and metrics as on every port, everything else hq's and covered
    for path in ("/livez", "/readyz", "/metrics"):
        assert httpx.get(_hq_url(server) + path).status_code == 200, path
    for path in ("/queues", "/queues/q/receive", "/v1/openapi.json", "/anything"):
        r = httpx.get(_hq_url(server) + path, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 403, (path, r.status_code)


def test_queen_roles(servers):
    """Queen's access levels through the same tokens: read reads, only write pushes and
    pops, only admin configures."""
    url = servers[("token", False)].url
    reader = {"Authorization": "Bearer reader-token"}
    assert httpx.get(url + "/api/v1/resources/overview", headers=reader).status_code == 200
    for method, path, body in (("POST", "/api/v1/push", {"items": [{"queue": "ro", "payload": 1}]}),
                               ("GET", "/api/v1/pop/queue/ro", None),
                               ("POST", "/api/v1/configure", {"queue": "ro"})):
        r = httpx.request(method, url + path, json=body, headers=reader)
        assert r.status_code == 403 and r.json()["code"] == "PermissionDenied", (path, r.text)


def test_the_dashboard_page_is_open_and_its_actions_need_admin(servers):
    """/ui and its static files hold no data and load without credentials (the page asks
    for a token); everything under /ui/api is authenticated, and destructive actions
    need the admin role whatever the page shows."""
    url = servers[("token", False)].url
    assert httpx.get(url + "/ui/").status_code == 200
    assert httpx.get(url + "/ui/static/app.js").status_code == 200
    assert httpx.get(url + "/ui/api/whoami").json()["code"] == "Unauthorized"
    reader = httpx.get(url + "/ui/api/whoami", headers={"Authorization": "Bearer reader-token"}).json()
    assert reader["role"] == "read" and reader["may_admin"] is False
    r = httpx.post(url + "/ui/api/queues/anything/redrives", headers={"Authorization": "Bearer reader-token"})
    assert r.status_code == 403 and r.json()["code"] == "PermissionDenied"
    r = httpx.post(url + "/ui/api/queues/anything/redrives", headers={"Authorization": "Bearer good-token"})
    assert r.status_code == 404 and r.json()["code"] == "QueueNotFound"
