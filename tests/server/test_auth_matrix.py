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
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
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
            code = str(exc.response.json()["code"])
            assert exc.response.status_code == (401 if code == "Unauthorized" else 403), code
            return code
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
        assert r.status_code == 403 and r.json()["__type"].endswith("AccessDeniedException"), r.text


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


@pytest.mark.parametrize("mode,creds", SERVERS)
def test_a_bare_unsubscribe_link_needs_its_token_unless_anyone_may_call(servers, mode, creds):
    """The bare link took the subscription ARN (which every reader lists) as its capability.
    Now it needs the token delivered to the endpoint (tests/sns/test_subscription_actions.py),
    in every mode but the one where anyone may call anything as admin (none, no AWS keys)."""
    server = servers[(mode, creds)]
    admin = _admin_sns(server, mode, creds)
    topic = admin.create_topic(Name=f"links-{uuid.uuid4().hex[:8]}")["TopicArn"]
    sub = admin.subscribe(TopicArn=topic, Protocol="http", Endpoint="http://hooks.example.com/in",
                          ReturnSubscriptionArn=True)["SubscriptionArn"]
    r = httpx.get(server.url + "/", params={"Action": "Unsubscribe", "SubscriptionArn": sub})
    left = [s["Endpoint"] for s in admin.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"]]
    if mode == "none" and not creds:
        assert r.status_code == 200 and left == [], r.text
    else:
        assert r.status_code == 403 and "<Code>AuthorizationError</Code>" in r.text, r.text
        assert left == ["http://hooks.example.com/in"]


def _admin_sns(server: ServerProcess, mode: str, creds: bool):
    """An admin's boto3 SNS client; in token mode without AWS keys it sends the admin's
    bearer token in place of a signature."""
    client = sns_client(server.url, "query", secret_key="good-secret")
    if mode == "token" and not creds:
        def bearer(request, **_kwargs) -> None:
            request.headers["Authorization"] = "Bearer good-token"
        client.meta.events.register("before-send.sns", bearer)
    return client


def _signed_for(url: str, service: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    """A request signed by botocore with a valid key, its credential scope naming ``service``."""
    request = AWSRequest(method="POST", url=url + "/", data=body, headers=headers)
    SigV4Auth(Credentials("AKIDCONVEYORTEST", "good-secret"), service, "us-east-1").add_auth(request)
    return httpx.post(url + "/", content=body, headers=dict(request.headers.items()))


def test_a_signature_opens_only_the_service_its_scope_names(servers):
    """A valid SigV4 signature scoped to sns was accepted on SQS actions (and sqs on SNS's):
    the key derived for one service opened the other. AWS answers SignatureDoesNotMatch."""
    url = servers[("token", True)].url
    sqs_call = (b"{}", {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.ListQueues"})
    sns_call = (b"Action=ListTopics&Version=2010-03-31", {"Content-Type": "application/x-www-form-urlencoded"})
    assert _signed_for(url, "sqs", *sqs_call).status_code == 200
    assert _signed_for(url, "sns", *sns_call).status_code == 200
    wrong = _signed_for(url, "sns", *sqs_call)
    assert wrong.status_code == 403, wrong.text
    assert wrong.json()["__type"].endswith("SignatureDoesNotMatch")
    assert wrong.json()["message"] == "Credential should be scoped to correct service: 'sqs'. "
    wrong = _signed_for(url, "sqs", *sns_call)
    assert wrong.status_code == 403, wrong.text
    assert "<Code>SignatureDoesNotMatch</Code>" in wrong.text
    assert "Credential should be scoped to correct service: 'sns'. " in wrong.text


@pytest.mark.parametrize("mode,creds,authorization", [
    ("token", False, "Bearer good-token"), ("token", True, "Bearer good-token"), ("header", False, None)])
def test_sender_id_is_never_an_unverified_access_key(servers, mode, creds, authorization):
    """A credential scope nobody verified named the sender: a bearer-token caller adding
    X-Amz-Credential=AKIDADMIN/... to the URL (or, where any Authorization is accepted, an
    unverified SigV4 header) made consumers see SenderId=AKIDADMIN."""
    server = servers[(mode, creds)]
    scope = "AKIDADMIN/20260101/us-east-1/sqs/aws4_request"
    if authorization is None:  # an unverified SigV4 header (header mode takes any)
        authorization = f"AWS4-HMAC-SHA256 Credential={scope}, SignedHeaders=host, Signature=00"
        query = ""
    else:  # an unsigned presigned-URL scope beside the bearer token
        query = f"?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={scope.replace('/', '%2F')}"
    headers = {"Content-Type": "application/x-amz-json-1.0", "Authorization": authorization}

    def call(action: str, **params: object) -> dict:
        r = httpx.post(server.url + "/" + query, json=params, headers={**headers, "X-Amz-Target": f"AmazonSQS.{action}"})
        assert r.status_code == 200, r.text
        return r.json()

    queue_url = call("CreateQueue", QueueName=f"sender-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    call("SendMessage", QueueUrl=queue_url, MessageBody="who sent me?")
    [message] = call("ReceiveMessage", QueueUrl=queue_url, AttributeNames=["SenderId"])["Messages"]
    assert message["Attributes"]["SenderId"] == "000000000000"  # the account: nobody verified more


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
        assert r.status_code == 401 and "Bearer" in r.headers["www-authenticate"], (path, r.status_code)
    # hq's port: health and metrics as on every port, everything else hq's and covered
    for path in ("/livez", "/readyz", "/metrics"):
        assert httpx.get(_hq_url(server) + path).status_code == 200, path
    for path in ("/queues", "/queues/q/receive", "/v1/openapi.json", "/anything"):
        r = httpx.get(_hq_url(server) + path, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401, (path, r.status_code)


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
