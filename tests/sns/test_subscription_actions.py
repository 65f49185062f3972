"""SNS subscription actions through boto3 in both wire protocols: Subscribe (sqs, http,
https; attributes; idempotence), Unsubscribe, ConfirmSubscription, ListSubscriptions and
ListSubscriptionsByTopic (paging), Get/SetSubscriptionAttributes — and SNS's errors; who may
unsubscribe, role by role, with and without credentials (the unsubscribe link's token)."""

from __future__ import annotations

import json

import botocore.exceptions
import httpx
import pytest

from support.server import ServerProcess
from support.sns_clients import (
    ACCOUNT,
    REGION,
    error_code,
    receive_all,
    sns_client,
    status_code,
    subscribe_http,
    unique,
)
from support.sqs_clients import client as sqs_client

pytestmark = pytest.mark.slow


def _fails(call, code: str, status: int = 400, message: str | None = None) -> None:
    with pytest.raises(botocore.exceptions.ClientError) as info:
        call()
    assert error_code(info.value) == code, info.value.response
    assert status_code(info.value) == status
    if message is not None:
        assert info.value.response["Error"]["Message"] == message


def test_subscribe_queue_and_endpoints(sns, make_topic, make_queue):
    topic = make_topic()
    _, queue_arn = make_queue()
    sub_q = sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)["SubscriptionArn"]
    sub_h = sns.subscribe(TopicArn=topic, Protocol="http", Endpoint="http://hooks.example.com/a")["SubscriptionArn"]
    sub_s = sns.subscribe(TopicArn=topic, Protocol="https", Endpoint="https://hooks.example.com/b",
                          ReturnSubscriptionArn=True)["SubscriptionArn"]
    assert sub_q.startswith(topic + ":") and sub_s.startswith(topic + ":")  # a queue's is confirmed at once
    assert sub_h == "pending confirmation"  # an endpoint confirms first, as on SNS
    listed = sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"]
    assert {(s["Protocol"], s["Endpoint"], s["SubscriptionArn"]) for s in listed} == {
        ("sqs", queue_arn, sub_q), ("http", "http://hooks.example.com/a", "PendingConfirmation"),
        ("https", "https://hooks.example.com/b", "PendingConfirmation")}
    assert all(s["TopicArn"] == topic and s["Owner"] == ACCOUNT for s in listed)
    attrs = sns.get_topic_attributes(TopicArn=topic)["Attributes"]
    assert attrs["SubscriptionsConfirmed"] == "1" and attrs["SubscriptionsPending"] == "2"


def test_subscribe_is_idempotent_unless_attributes_differ(sns, make_topic, make_queue):
    topic = make_topic()
    _, queue_arn = make_queue()
    first = sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn,
                          Attributes={"RawMessageDelivery": "true"})["SubscriptionArn"]
    again = sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn,
                          Attributes={"RawMessageDelivery": "true"})["SubscriptionArn"]
    assert again == first
    policy = json.dumps({"kind": ["a", "b"], "n": [{"numeric": [">", 1]}]})
    _, other_queue = make_queue()
    filtered = sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=other_queue,
                             Attributes={"FilterPolicy": policy})["SubscriptionArn"]
    assert sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=other_queue,
                         Attributes={"FilterPolicy": policy})["SubscriptionArn"] == filtered
    assert sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)["SubscriptionArn"] == first  # no attributes
    _fails(lambda: sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn,
                                 Attributes={"RawMessageDelivery": "false"}), "InvalidParameter",
           message="Invalid parameter: Attributes Reason: Subscription already exists with different attributes")
    assert len(sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"]) == 2


def test_subscribe_errors(sns, make_topic, make_queue):
    topic = make_topic()
    missing = f"arn:aws:sns:{REGION}:{ACCOUNT}:{unique()}"
    _fails(lambda: sns.subscribe(TopicArn=missing, Protocol="http", Endpoint="http://x.example/"), "NotFound", 404)
    _fails(lambda: sns.subscribe(TopicArn=topic, Protocol="carrier-pigeon", Endpoint="x"), "InvalidParameter",
           message="Invalid parameter: Amazon SNS does not support this protocol string: carrier-pigeon")
    _fails(lambda: sns.subscribe(TopicArn=topic, Protocol="email", Endpoint="a@example.com"), "InvalidParameter")
    _fails(lambda: sns.subscribe(TopicArn=topic, Protocol="http"), "InvalidParameter",
           message="Invalid parameter: Endpoint")
    _fails(lambda: sns.subscribe(TopicArn=topic, Protocol="http", Endpoint="https://x.example/"),
           "InvalidParameter", message="Invalid parameter: Endpoint must match the specified protocol")
    _fails(lambda: sns.subscribe(TopicArn=topic, Protocol="https", Endpoint="https:///nohost"), "InvalidParameter")
    _fails(lambda: sns.subscribe(TopicArn=topic, Protocol="https", Endpoint="https://[::1/x"), "InvalidParameter",
           message="Invalid parameter: Endpoint Reason: not a valid URL")
    _fails(lambda: sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint="http://not-an-arn"), "InvalidParameter",
           message="Invalid parameter: SQS endpoint ARN")
    _fails(lambda: sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=f"arn:aws:sqs:{REGION}:{ACCOUNT}:bad name"),
           "InvalidParameter", message="Invalid parameter: SQS endpoint ARN")
    _, queue_arn = make_queue()
    _fails(lambda: sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn,
                                 Attributes={"Colour": "blue"}), "InvalidParameter")
    _fails(lambda: sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn,
                                 Attributes={"RawMessageDelivery": "maybe"}), "InvalidParameter")
    _fails(lambda: sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn,
                                 Attributes={"FilterPolicy": "{broken"}), "InvalidParameter")
    _fails(lambda: sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn,
                                 Attributes={"FilterPolicy": '{"a": ["b"]}', "FilterPolicyScope": "Elsewhere"}),
           "InvalidParameter")
    fifo = sns.create_topic(Name=unique() + ".fifo", Attributes={"FifoTopic": "true"})["TopicArn"]
    _fails(lambda: sns.subscribe(TopicArn=fifo, Protocol="https", Endpoint="https://x.example/"),
           "InvalidParameter")
    assert sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"] == []


def test_get_and_set_subscription_attributes(sns, make_topic, make_queue):
    topic = make_topic()
    sub = sns.subscribe(TopicArn=topic, Protocol="https", Endpoint="https://hooks.example.com/x",
                        ReturnSubscriptionArn=True)["SubscriptionArn"]
    attrs = sns.get_subscription_attributes(SubscriptionArn=sub)["Attributes"]
    assert attrs["SubscriptionArn"] == sub and attrs["TopicArn"] == topic and attrs["Protocol"] == "https"
    assert attrs["Endpoint"] == "https://hooks.example.com/x" and attrs["Owner"] == ACCOUNT
    assert attrs["PendingConfirmation"] == "true" and attrs["ConfirmationWasAuthenticated"] == "true"
    assert attrs["RawMessageDelivery"] == "false"
    assert json.loads(attrs["EffectiveDeliveryPolicy"])["healthyRetryPolicy"]["numRetries"] == 3  # SNS's default
    assert "FilterPolicy" not in attrs

    policy = {"store": ["example_corp"], "price": [{"numeric": [">=", 100]}]}
    for name, value in [("RawMessageDelivery", "true"), ("FilterPolicy", json.dumps(policy)),
                        ("FilterPolicyScope", "MessageBody"), ("DeliveryPolicy", '{"healthyRetryPolicy": {}}'),
                        ("RedrivePolicy", f'{{"deadLetterTargetArn": "arn:aws:sqs:{REGION}:{ACCOUNT}:dlq"}}')]:
        sns.set_subscription_attributes(SubscriptionArn=sub, AttributeName=name, AttributeValue=value)
    attrs = sns.get_subscription_attributes(SubscriptionArn=sub)["Attributes"]
    assert attrs["RawMessageDelivery"] == "true" and json.loads(attrs["FilterPolicy"]) == policy
    assert attrs["FilterPolicyScope"] == "MessageBody"
    assert attrs["DeliveryPolicy"] == '{"healthyRetryPolicy": {}}' and "dlq" in attrs["RedrivePolicy"]

    _fails(lambda: sns.set_subscription_attributes(SubscriptionArn=sub, AttributeName="Colour", AttributeValue="x"),
           "InvalidParameter", message="Invalid parameter: AttributeName")
    _fails(lambda: sns.set_subscription_attributes(SubscriptionArn=sub, AttributeName="RawMessageDelivery",
                                                   AttributeValue="yes"), "InvalidParameter")
    _fails(lambda: sns.set_subscription_attributes(SubscriptionArn=sub, AttributeName="FilterPolicy",
                                                   AttributeValue='{"a": [{"numeric": ["<>", 1]}]}'),
           "InvalidParameter")
    _fails(lambda: sns.set_subscription_attributes(SubscriptionArn=sub, AttributeName="FilterPolicyScope",
                                                   AttributeValue="Nowhere"), "InvalidParameter")


def test_subscription_not_found_and_malformed_arns(sns, make_topic):
    topic = make_topic()
    sub = sns.subscribe(TopicArn=topic, Protocol="http", Endpoint="http://hooks.example.com/",
                        ReturnSubscriptionArn=True)["SubscriptionArn"]
    unknown = f"{topic}:00000000-0000-4000-8000-000000000000"
    _fails(lambda: sns.get_subscription_attributes(SubscriptionArn=unknown), "NotFound", 404,
           "Subscription does not exist")
    other_topic = sub.replace(topic, make_topic())  # the right id under the wrong topic
    _fails(lambda: sns.get_subscription_attributes(SubscriptionArn=other_topic), "NotFound", 404)
    _fails(lambda: sns.get_subscription_attributes(SubscriptionArn=f"{topic}:not-a-uuid"), "InvalidParameter",
           message="Invalid parameter: SubscriptionId")
    _fails(lambda: sns.set_subscription_attributes(SubscriptionArn="arn:nope", AttributeName="RawMessageDelivery",
                                                   AttributeValue="true"), "InvalidParameter")
    _fails(lambda: sns.unsubscribe(SubscriptionArn="pending confirmation"), "InvalidParameter")


def test_unsubscribe_and_confirm(sns, make_topic, make_queue, endpoint):
    topic = make_topic()
    assert sns.subscribe(TopicArn=topic, Protocol="http", Endpoint=endpoint.url)["SubscriptionArn"] == \
        "pending confirmation"
    [request] = endpoint.wait_for(1)
    assert request.headers["x-amz-sns-message-type"] == "SubscriptionConfirmation"
    token = json.loads(request.body)["Token"]
    missing = f"arn:aws:sns:{REGION}:{ACCOUNT}:{unique()}"
    _fails(lambda: sns.confirm_subscription(TopicArn=missing, Token=token), "InvalidParameter",
           message="Invalid parameter: Token")  # a token confirms on its own topic only
    sub = sns.confirm_subscription(TopicArn=topic, Token=token)["SubscriptionArn"]
    assert sub.startswith(topic + ":")
    assert sns.confirm_subscription(TopicArn=topic, Token=token)["SubscriptionArn"] == sub  # again: the same
    _, queue_arn = make_queue()
    sub_q = sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)["SubscriptionArn"]

    sns.unsubscribe(SubscriptionArn=sub)
    sns.unsubscribe(SubscriptionArn=sub)  # again: still fine
    assert [s["SubscriptionArn"] for s in sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"]] == [sub_q]
    _fails(lambda: sns.get_subscription_attributes(SubscriptionArn=sub), "NotFound", 404)
    empty = make_topic()
    _fails(lambda: sns.confirm_subscription(TopicArn=empty, Token=token), "InvalidParameter",
           message="Invalid parameter: Token")


def test_list_subscriptions_pages_of_100(server, protocol):
    region = f"xx-subs-{protocol}"  # only this test's subscriptions live in this region
    sns = sns_client(server.url, protocol, region=region)
    topic = sns.create_topic(Name=unique())["TopicArn"]
    arns = [sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=f"arn:aws:sqs:{region}:{ACCOUNT}:q{i}")[
        "SubscriptionArn"] for i in range(102)]
    first = sns.list_subscriptions()
    assert len(first["Subscriptions"]) == 100 and first["NextToken"]
    second = sns.list_subscriptions(NextToken=first["NextToken"])
    assert [s["SubscriptionArn"] for s in first["Subscriptions"] + second["Subscriptions"]] == arns
    assert "NextToken" not in second
    by_topic = [s for p in sns.get_paginator("list_subscriptions_by_topic").paginate(TopicArn=topic)
                for s in p["Subscriptions"]]
    assert [s["SubscriptionArn"] for s in by_topic] == arns
    _fails(lambda: sns.list_subscriptions(NextToken="abc"), "InvalidParameter")
    default = sns_client(server.url, protocol)
    assert not set(arns) & {s["SubscriptionArn"] for s in default.list_subscriptions()["Subscriptions"]}


def test_filter_policy_and_booleans_as_given(sns, make_topic, make_queue):
    """FilterPolicy comes back as the very text given (SNS does not re-serialise it);
    RawMessageDelivery is read in any case."""
    topic = make_topic()
    _, queue_arn = make_queue()
    policy = '{"b": [ "x" ],\n "a":[{"numeric":[">=", 1.50]}]}'
    sub = sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn,
                        Attributes={"FilterPolicy": policy, "RawMessageDelivery": "True"})["SubscriptionArn"]
    attrs = sns.get_subscription_attributes(SubscriptionArn=sub)["Attributes"]
    assert attrs["FilterPolicy"] == policy and attrs["RawMessageDelivery"] == "true"
    # the same policy written otherwise is the same subscription
    assert sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn,
                         Attributes={"FilterPolicy": '{"a":[{"numeric":[">=",1.5]}],"b":["x"]}',
                                     "RawMessageDelivery": "TRUE"})["SubscriptionArn"] == sub
    other = '{ "c" : [ "y" ] }'
    sns.set_subscription_attributes(SubscriptionArn=sub, AttributeName="FilterPolicy", AttributeValue=other)
    sns.set_subscription_attributes(SubscriptionArn=sub, AttributeName="RawMessageDelivery", AttributeValue="FALSE")
    attrs = sns.get_subscription_attributes(SubscriptionArn=sub)["Attributes"]
    assert attrs["FilterPolicy"] == other and attrs["RawMessageDelivery"] == "false"
    sns.set_subscription_attributes(SubscriptionArn=sub, AttributeName="FilterPolicy", AttributeValue="")
    assert "FilterPolicy" not in sns.get_subscription_attributes(SubscriptionArn=sub)["Attributes"]


def test_sqs_endpoint_by_queue_url(sns, sqs, make_topic, make_queue):
    """An sqs subscription may name its queue by URL (as seed 000 does): the server's own
    queue URL or any http(s)://host/<account>/<queue>; it is the same subscription as by
    ARN, answered with the queue's ARN, and delivers the same."""
    topic = make_topic()
    url, queue_arn = make_queue()
    name = queue_arn.rpartition(":")[2]
    sub = sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=url,
                        Attributes={"RawMessageDelivery": "true"})["SubscriptionArn"]
    for same in (queue_arn, f"http://localhost/{ACCOUNT}/{name}",
                 f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/{name}"):
        assert sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=same,
                             Attributes={"RawMessageDelivery": "true"})["SubscriptionArn"] == sub
    listed = sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"]
    assert [(s["SubscriptionArn"], s["Endpoint"]) for s in listed] == [(sub, queue_arn)]
    sns.publish(TopicArn=topic, Message="by url")
    got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2)["Messages"]
    assert [m["Body"] for m in got] == ["by url"]
    for bad in (f"http://localhost/{ACCOUNT}", f"http://localhost/{ACCOUNT}/{name}/extra",
                f"http://localhost/{ACCOUNT}/bad%20name", "ftp://localhost/000000000000/q", "jobs"):
        _fails(lambda bad=bad: sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=bad), "InvalidParameter",
               message="Invalid parameter: SQS endpoint ARN")
    _fails(lambda: sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=f"http://localhost/123456789012/{name}"),
           "AuthorizationError", 403)


def test_subscribe_checks_the_topic_before_the_endpoint(sns):
    """A missing topic is SNS's NotFound whatever the protocol and endpoint (a queue that
    does not exist either, a protocol Conveyor does not deliver to, a malformed endpoint)."""
    missing = f"arn:aws:sns:{REGION}:{ACCOUNT}:{unique()}"
    for protocol, endpoint in [("sqs", f"arn:aws:sqs:{REGION}:{ACCOUNT}:{unique('nope')}"), ("sms", "+1234567890"),
                               ("sqs", "not-an-arn"), ("http", "https://wrong.scheme/")]:
        _fails(lambda p=protocol, e=endpoint: sns.subscribe(TopicArn=missing, Protocol=p, Endpoint=e), "NotFound",
               404, "Topic does not exist")


# -- who may unsubscribe --------------------------------------------------------------------------

KEYS = {"read": ("AKIDREADER", "reader-secret"), "write": ("AKIDWRITER", "writer-secret"),
        "admin": ("AKIDADMIN", "admin-secret")}


@pytest.fixture(scope="module")
def roles_server(module_dsn):
    """Token mode, an AWS key per role, webhooks to loopback."""
    keys = ",".join(f"{key}:{secret}:{role}" for role, (key, secret) in KEYS.items())
    proc = ServerProcess(module_dsn, env={"CONVEYOR_AUTH": "token", "CONVEYOR_AUTH_TOKENS": "unused-token:read", "CONVEYOR_AWS_CREDENTIALS": keys,
                                          "CONVEYOR_WEBHOOK_ALLOW": "127.0.0.1/32", "CONVEYOR_WEBHOOK_POLL": "0.1"}).start()
    yield proc
    proc.kill()


def _as(server: ServerProcess, role: str, protocol: str = "query"):
    key, secret = KEYS[role]
    return sns_client(server.url, protocol, access_key=key, secret_key=secret)


def _arns(client, topic: str) -> set[str]:
    return {s["SubscriptionArn"] for s in client.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"]}


def _link(server: ServerProcess, url: str) -> httpx.Response:
    """An unsubscribe link followed as a mail client or a scanner follows it: no credentials."""
    assert url.startswith(server.url + "/?Action=Unsubscribe&SubscriptionArn=")
    return httpx.get(url)


@pytest.mark.parametrize("protocol", ["query", "json"])
def test_a_reader_cannot_unsubscribe_and_only_the_endpoint_holds_its_link(roles_server, endpoint, protocol):
    """Issue 25: a read-only caller listed the subscription ARNs, then followed the
    credential-free link GET /?Action=Unsubscribe&SubscriptionArn=<arn>, and fan-out stopped
    silently. The link's capability is now a token delivered to the endpoint alone."""
    url = roles_server.url
    reader, writer, admin = (_as(roles_server, role, protocol) for role in ("read", "write", "admin"))
    sqs = sqs_client(url, "json", access_key=KEYS["admin"][0], secret_key=KEYS["admin"][1])
    topic = admin.create_topic(Name=unique())["TopicArn"]
    queue = unique("q")
    queue_url = sqs.create_queue(QueueName=queue)["QueueUrl"]
    sub_q = admin.subscribe(TopicArn=topic, Protocol="sqs",
                            Endpoint=f"arn:aws:sqs:{REGION}:{ACCOUNT}:{queue}")["SubscriptionArn"]
    sub_h = subscribe_http(admin, topic, endpoint)  # confirmed by the endpoint, as on AWS
    assert _arns(reader, topic) == {sub_q, sub_h}  # a reader lists them (as on AWS)

    for arn in (sub_q, sub_h):
        for extra in ({}, {"Token": ""}, {"Token": "A" * 22}):  # the ARN alone, or a made-up token
            r = httpx.get(url + "/", params={"Action": "Unsubscribe", "SubscriptionArn": arn, **extra})
            assert r.status_code == 403 and "<Code>AuthorizationError</Code>" in r.text, r.text
        for caller in (reader, writer):  # the Unsubscribe action needs admin, as REST's DELETE
            _fails(lambda c=caller, a=arn: c.unsubscribe(SubscriptionArn=a), "AuthorizationError", 403)
    assert _arns(admin, topic) == {sub_q, sub_h}

    admin.publish(TopicArn=topic, Message="fan-out goes on")  # both still get it
    [request] = endpoint.wait_for(1)
    [message] = receive_all(sqs, queue_url, 1)
    endpoint_link = json.loads(request.body)["UnsubscribeURL"]
    queue_link = json.loads(message["Body"])["UnsubscribeURL"]
    token = endpoint_link.partition("&Token=")[2]
    assert token and "Token=" not in queue_link  # what a queue holds, readers may browse: no token
    # a token opens its own subscription only; a queue's link needs credentials
    assert _link(roles_server, f"{queue_link}&Token={token}").status_code == 403
    assert _link(roles_server, queue_link).status_code == 403
    assert _arns(admin, topic) == {sub_q, sub_h}

    # the endpoint's own link unsubscribes it, without credentials (and again: gone is gone)
    for _ in range(2):
        r = _link(roles_server, endpoint_link)
        assert r.status_code == 200 and "UnsubscribeResponse" in r.text, r.text
    assert _arns(admin, topic) == {sub_q}
    admin.unsubscribe(SubscriptionArn=sub_q)  # the admin's Unsubscribe, as on AWS
    assert _arns(admin, topic) == set()


def test_authenticate_on_unsubscribe_locks_the_endpoints_link(roles_server, endpoint):
    """ConfirmSubscription's AuthenticateOnUnsubscribe=true: from then on only an
    authenticated Unsubscribe removes the subscription, not the link it was delivered."""
    writer, admin = _as(roles_server, "write"), _as(roles_server, "admin")
    topic = admin.create_topic(Name=unique())["TopicArn"]
    sub = admin.subscribe(TopicArn=topic, Protocol="http", Endpoint=endpoint.url,
                          ReturnSubscriptionArn=True)["SubscriptionArn"]
    [confirmation] = endpoint.wait_for(1)  # the SubscriptionConfirmation and its token
    token = json.loads(confirmation.body)["Token"]
    with endpoint.lock:
        endpoint.received.clear()
    _fails(lambda: writer.confirm_subscription(TopicArn=topic, Token=token, AuthenticateOnUnsubscribe="maybe"),
           "InvalidParameter")
    assert writer.confirm_subscription(TopicArn=topic, Token=token,
                                       AuthenticateOnUnsubscribe="true")["SubscriptionArn"] == sub
    admin.publish(TopicArn=topic, Message="locked")
    [request] = endpoint.wait_for(1)
    r = _link(roles_server, json.loads(request.body)["UnsubscribeURL"])
    assert r.status_code == 403 and "requires authentication to unsubscribe" in r.text, r.text
    # confirming again without the flag does not unlock it (as on AWS)
    writer.confirm_subscription(TopicArn=topic, Token=token, AuthenticateOnUnsubscribe="false")
    assert _link(roles_server, json.loads(request.body)["UnsubscribeURL"]).status_code == 403
    assert _arns(admin, topic) == {sub}
    admin.unsubscribe(SubscriptionArn=sub)
    assert _arns(admin, topic) == set()
