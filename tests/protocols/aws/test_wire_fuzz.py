"""Fuzzing the SQS and SNS wire, both protocols, against a real server and database.

Requests come from botocore's own service models: every operation the server implements
(and, now and then, one it does not), members filled with plausible values chosen by
member name (the queues and topics under test, real receipt handles and subscription ARNs
taken from earlier answers, attribute names and values SQS and SNS know) or by type, and
now and then a value of the wrong type or from the awkward end (NUL and other characters
XML cannot carry, long strings, a message body over 256 KiB, integers past 64 bits). For the Query protocol the form
botocore serialises is mangled further: fields dropped, stray indexed fields added.

Each answer must be a success or an error in that protocol's own format, never a 5xx, and
a canary queue that the fuzzer never names must keep its messages whatever happened
around it. ``CONVEYOR_FUZZ_EXAMPLES=N`` runs N fresh random examples per protocol instead
of the fixed ones CI runs.
"""

from __future__ import annotations

import base64
import json
import os
import random
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import botocore.model
import botocore.serialize
import botocore.session
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conveyor.protocols.sns.dispatch import HANDLERS as SNS_ACTIONS
from conveyor.protocols.sqs.dispatch import HANDLERS as SQS_ACTIONS
from support.server import ServerProcess
from support.sns_clients import _json_model as sns_json_model
from support.sns_clients import sns_client
from support.sqs_clients import _query_model as sqs_query_model
from support.sqs_clients import client as sqs_client

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("CONVEYOR_FUZZ_EXAMPLES", "0")) or 300
DERANDOMIZE = "CONVEYOR_FUZZ_EXAMPLES" not in os.environ
FUZZ = f"fuzz-{uuid.uuid4().hex[:8]}"  # the queues and topics the fuzzer works on
ACCOUNT = "000000000000"
SIGNED = "AWS4-HMAC-SHA256 Credential=AKIDFUZZ/20260101/us-east-1/{service}/aws4_request, " \
         "SignedHeaders=host, Signature=0"


def _models() -> dict[tuple[str, str], botocore.model.ServiceModel]:
    loader = botocore.session.get_session().get_component("data_loader")
    sqs = loader.load_service_model("sqs", "service-2")
    sns = loader.load_service_model("sns", "service-2")
    return {("sqs", "json"): botocore.model.ServiceModel(sqs, "sqs"),
            ("sqs", "query"): botocore.model.ServiceModel(sqs_query_model(sqs), "sqs"),
            ("sns", "query"): botocore.model.ServiceModel(sns, "sns"),
            ("sns", "json"): botocore.model.ServiceModel(sns_json_model(sns), "sns")}


MODELS = _models()
IMPLEMENTED = {"sqs": set(SQS_ACTIONS), "sns": set(SNS_ACTIONS)}

# -- values ---------------------------------------------------------------------------------

AWKWARD_TEXT = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", " ", "\x00", "\x01", "\x08", "\ud7ff", "\uffff", "-1", "0", "1e400", "NaN", "true",
                     "99999999999999999999", "String", "Number", "Binary", "Number.x", "String.",
                     "All", ".", "..", "a" * 81, "x.fifo", "{", "[]", "null", '{"a": ', "a" * 5000]),
)
ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | AWKWARD_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(AWKWARD_TEXT, inner, max_size=4),
    max_leaves=8)

QUEUE_ARN = f"arn:aws:sqs:us-east-1:{ACCOUNT}:{FUZZ}"
TOPIC_ARN = f"arn:aws:sns:us-east-1:{ACCOUNT}:{FUZZ}"
SECONDS = st.sampled_from(["0", "1", "30", "900", "43200", "43201", "-1", "x", "1209600", "60"])
POLICIES = st.sampled_from([
    "", "{}", "[]", '{"a": ["x"]}', '{"a": [{"numeric": [">", 1]}]}', '{"a": [{"prefix": "x"}]}',
    '{"a": {"b": ["x"]}}', '{"$or": [{"a": ["x"]}, {"b": ["y"]}]}', '{"a": [{"anything-but": ["x"]}]}',
    '{"a": [{"exists": false}]}', '{"a": [' + '"x", ' * 200 + '"x"]}', '{"a": [{"cidr": "10.0.0.0/8"}]}',
    '{"a": [{"wildcard": "*x*"}]}', '{"a": [{"numeric": [">", "x"]}]}', '{"a": [[["x"]]]}'])
REDRIVE = st.sampled_from([
    "", "{}", f'{{"deadLetterTargetArn": "{QUEUE_ARN}", "maxReceiveCount": 1}}',
    f'{{"deadLetterTargetArn": "{QUEUE_ARN}.fifo", "maxReceiveCount": "3"}}',
    '{"deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:nope", "maxReceiveCount": 1}',
    f'{{"deadLetterTargetArn": "{QUEUE_ARN}", "maxReceiveCount": 0}}',
    '{"redrivePermission": "allowAll"}', '{"redrivePermission": "byQueue", "sourceQueueArns": []}'])
QUEUE_ATTRIBUTES: dict[str, st.SearchStrategy[str]] = {
    "DelaySeconds": SECONDS, "MaximumMessageSize": st.sampled_from(["1024", "262144", "1023", "262145", "x"]),
    "MessageRetentionPeriod": SECONDS, "ReceiveMessageWaitTimeSeconds": st.sampled_from(["0", "21", "-1", "x"]),
    "VisibilityTimeout": SECONDS, "RedrivePolicy": REDRIVE, "RedriveAllowPolicy": REDRIVE,
    "FifoQueue": st.sampled_from(["true", "false", "x"]), "ContentBasedDeduplication": st.sampled_from(["true", "x"]),
    "DeduplicationScope": st.sampled_from(["queue", "messageGroup", "x"]),
    "FifoThroughputLimit": st.sampled_from(["perQueue", "perMessageGroupId", "x"]),
    "Policy": st.sampled_from(["", "{}", "{", '{"Version": "2012-10-17", "Statement": []}']),
    "SqsManagedSseEnabled": st.sampled_from(["true", "false"]), "KmsMasterKeyId": st.text(max_size=5),
    "RawMessageDelivery": st.sampled_from(["true", "false", "x"]), "FilterPolicy": POLICIES,
    "FilterPolicyScope": st.sampled_from(["MessageAttributes", "MessageBody", "x"]),
    "DisplayName": st.text(max_size=10), "DeliveryPolicy": POLICIES,
    "All": st.just(""), "ApproximateNumberOfMessages": st.just("1"), "QueueArn": st.just(QUEUE_ARN),
}
ATTRIBUTE_NAMES = st.sampled_from([*QUEUE_ATTRIBUTES, "ApproximateReceiveCount", "SentTimestamp", "SenderId",
                                   "MessageGroupId", "SequenceNumber", "AWSTraceHeader", ".*", "a.*", "a.b"])
DATA_TYPES = st.sampled_from(["String", "Number", "Binary", "String.x", "Number.int", "Binary.b", "Strin",
                              "", "String.", "StringList"])
MESSAGE_ATTRIBUTE = st.fixed_dictionaries({"DataType": DATA_TYPES}, optional={
    "StringValue": st.sampled_from(["1", "-1.5e3", "1e400", "x", "", "\x00"]) | st.text(max_size=20),
    "BinaryValue": st.binary(max_size=20), "StringListValues": st.lists(st.text(max_size=3), max_size=2)})
ATTRIBUTE_KEY = st.sampled_from(["a", "b", "color", "AWS.x", ".a", "a..b", "a" * 257, "Amazon.x", "é"])


def _plausible(base: str) -> dict[str, st.SearchStrategy[Any]]:
    """Values by member name: what a real client would send, right or slightly wrong."""
    queue_urls = [f"{base}/{ACCOUNT}/{FUZZ}", f"{base}/{ACCOUNT}/{FUZZ}.fifo",
                  f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/{FUZZ}", f"{base}/{ACCOUNT}/nope", FUZZ,
                  f"http://[::1/{ACCOUNT}/{FUZZ}"]
    topics = [TOPIC_ARN, f"{TOPIC_ARN}.fifo", f"{TOPIC_ARN}-gone", QUEUE_ARN, "arn:aws:sns:x"]
    short = st.sampled_from(["a", "b", "g1", "g2", "", "x" * 129, "bad id!"])
    return {
        "QueueUrl": st.sampled_from(queue_urls), "QueueName": st.sampled_from([FUZZ, f"{FUZZ}.fifo", "a/b", ""]),
        "QueueNamePrefix": st.sampled_from(["fuzz", "", "%", "_"]),
        "TopicArn": st.sampled_from(topics), "TargetArn": st.sampled_from(topics),
        "ResourceArn": st.sampled_from(topics), "SourceArn": st.sampled_from([QUEUE_ARN, f"{QUEUE_ARN}.fifo", "x"]),
        "DestinationArn": st.sampled_from([QUEUE_ARN, f"{QUEUE_ARN}.fifo", "x"]),
        "Name": st.sampled_from([FUZZ, f"{FUZZ}.fifo", "", "a" * 257, "a b"]),
        "MessageBody": st.text(min_size=1, max_size=50) | st.sampled_from(["", "a" * 262_145]),
        "Message": st.text(min_size=1, max_size=50) | st.sampled_from(['{"default": "x"}', '{"sqs": "y"}', "{", ""]),
        "MessageStructure": st.sampled_from(["json", "raw", ""]), "Subject": st.text(max_size=20),
        "MessageGroupId": short, "MessageDeduplicationId": short, "Id": short, "Label": short,
        "DelaySeconds": st.sampled_from([0, 1, 900, 901, -1]), "VisibilityTimeout": st.sampled_from([0, 30, 43201, -1]),
        "WaitTimeSeconds": st.sampled_from([0, 0, 0, 21, -1]), "MaxNumberOfMessages": st.integers(-1, 11),
        "MaxResults": st.integers(-1, 1001), "MaxNumberOfMessagesPerSecond": st.integers(-1, 501),
        "NextToken": st.sampled_from(["", "x", "MQ==", "eyJhIjogMX0="]),
        "Attributes": st.lists(st.sampled_from(sorted(QUEUE_ATTRIBUTES)), max_size=3, unique=True).flatmap(
            lambda names: st.fixed_dictionaries({n: QUEUE_ATTRIBUTES[n] for n in names}))
        | st.dictionaries(ATTRIBUTE_KEY, st.text(max_size=5), max_size=2),
        "AttributeName": st.sampled_from(["RawMessageDelivery", "FilterPolicy", "DisplayName", "Policy", "x"]),
        "AttributeValue": st.sampled_from(["true", "false", "x", ""]) | POLICIES,
        "AttributeNames": st.lists(ATTRIBUTE_NAMES, max_size=3),
        "MessageAttributeNames": st.lists(ATTRIBUTE_NAMES | ATTRIBUTE_KEY, max_size=3),
        "MessageSystemAttributeNames": st.lists(ATTRIBUTE_NAMES, max_size=3),
        "MessageAttributes": st.dictionaries(ATTRIBUTE_KEY, MESSAGE_ATTRIBUTE, max_size=3),
        "MessageSystemAttributes": st.dictionaries(st.sampled_from(["AWSTraceHeader", "x"]), MESSAGE_ATTRIBUTE,
                                                   max_size=1),
        "Protocol": st.sampled_from(["sqs", "http", "https", "email", "lambda", "application", "x"]),
        "Endpoint": st.sampled_from([QUEUE_ARN, f"{QUEUE_ARN}.fifo", "http://127.0.0.1:9/hook", "https://[::1",
                                     "http://example.invalid/x", "x"]),
        "ReturnSubscriptionArn": st.booleans(), "Token": short,
        "Tags": st.dictionaries(ATTRIBUTE_KEY, st.text(max_size=5), max_size=3) |
        st.lists(st.fixed_dictionaries({"Key": ATTRIBUTE_KEY, "Value": st.text(max_size=5)}), max_size=3),
        "TagKeys": st.lists(ATTRIBUTE_KEY, max_size=3), "AWSAccountIds": st.lists(short, max_size=2),
        "Actions": st.lists(st.sampled_from(["SendMessage", "*", "x"]), max_size=2),
        "ActionName": st.lists(st.sampled_from(["Publish", "x"]), max_size=2),
        "DataProtectionPolicy": POLICIES,
    }


def _typed(shape: botocore.model.Shape, name: str, plausible: dict, junk: bool, depth: int = 1
           ) -> st.SearchStrategy[Any]:
    """A value for member ``name`` of ``shape``: plausible by name where one is known, else
    by type; with ``junk``, one time in five anything at all."""
    if depth > 5:
        return st.none()
    kind = shape.type_name
    if name in plausible:
        right = plausible[name]
    elif kind == "structure":
        right = _struct(shape, plausible, junk, depth)
    elif kind == "list":
        right = st.lists(_typed(shape.member, "", plausible, junk, depth + 1), max_size=11)
    elif kind == "map":
        right = st.dictionaries(ATTRIBUTE_KEY, _typed(shape.value, "", plausible, junk, depth + 1), max_size=3)
    elif kind in ("integer", "long"):
        right = st.integers(-2**31, 2**31) | st.sampled_from([0, 1, 10, 11, -1, 2**63, 2**70])
    elif kind == "boolean":
        right = st.booleans()
    elif kind in ("double", "float"):
        right = st.floats(allow_nan=False, allow_infinity=False)
    elif kind == "blob":
        right = st.binary(max_size=64)
    elif kind == "timestamp":
        right = st.integers(0, 2**33)
    else:
        right = st.sampled_from(shape.enum) if shape.enum else AWKWARD_TEXT
    return st.one_of(right, right, right, right, ANY_JSON | AWKWARD_TEXT) if junk else right


def _struct(shape: botocore.model.StructureShape, plausible: dict, junk: bool, depth: int) -> st.SearchStrategy[dict]:
    """Its required members, and optional ones: without ``junk`` only those with plausible
    values (an optional member filled at random mostly earns an early error)."""
    members = {n: _typed(m, n, plausible, junk, depth + 1) for n, m in shape.members.items()}
    required = set(shape.required_members)
    return st.fixed_dictionaries({n: members[n] for n in required}, optional={
        n: s for n, s in members.items() if n not in required and (junk or n in plausible)})


def _operation(service: str, protocol: str, base: str) -> st.SearchStrategy[tuple[str, dict]]:
    """An operation (one the server implements nine times in ten) and its input: two times
    in three plausible throughout, else with values of any type among them."""
    model = MODELS[service, protocol]
    plausible = _plausible(base)
    implemented = sorted(IMPLEMENTED[service] & set(model.operation_names))
    others = sorted(set(model.operation_names) - IMPLEMENTED[service])
    actions = st.sampled_from(implemented) if not others else st.one_of(*[st.sampled_from(implemented)] * 9,
                                                                        st.sampled_from(others))

    def call(action: str) -> st.SearchStrategy[tuple[str, dict]]:
        shape = model.operation_model(action).input_shape
        if shape is None:
            return st.just((action, {}))
        clean, dirty = _struct(shape, plausible, False, 0), _struct(shape, plausible, True, 0)
        return st.tuples(st.just(action), st.one_of(clean, clean, dirty))

    return actions.flatmap(call)


class Pools:
    """Receipt handles and subscription ARNs from earlier answers, so that requests that
    name one can name a real one."""

    KEYS = ("ReceiptHandle", "SubscriptionArn", "TaskHandle")

    def __init__(self) -> None:
        self.found: dict[str, list[str]] = {key: [] for key in self.KEYS}

    def learn(self, text: str) -> None:
        for key in self.KEYS:
            for chunk in text.split(key)[1:6]:  # JSON "Key":"v" or XML <Key>v</Key>
                value = chunk.lstrip('">:').split('"')[0].split("<")[0]
                if value and len(self.found[key]) < 200:
                    self.found[key].append(value)

    def realise(self, value: Any, rng: random.Random) -> Any:
        if isinstance(value, dict):
            return {k: (rng.choice(self.found[k]) if k in self.found and self.found[k] and rng.random() < 0.8
                        else self.realise(v, rng)) for k, v in value.items()}
        if isinstance(value, list):
            return [self.realise(v, rng) for v in value]
        return value


# -- requests -------------------------------------------------------------------------------

def _json_body(params: dict) -> bytes:
    def plain(value: Any) -> Any:
        if isinstance(value, bytes):
            return base64.b64encode(value).decode()
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value
    return json.dumps(plain(params)).encode()  # not orjson: integers past 64 bits are wanted


def _query_form(op: botocore.model.OperationModel, params: dict, data: st.DataObject) -> str:
    """The form botocore's own Query serialiser writes (or, for values it refuses, one
    flattened by hand), with some fields dropped (one time in four) and up to three stray
    fields added."""
    try:
        body = botocore.serialize.create_serializer("query", include_validation=False) \
            .serialize_to_request(params, op)["body"]
        fields = list(body.items())
    except Exception:  # noqa: BLE001 - ill-typed values the serialiser refuses
        fields = [("Action", op.name), ("Version", op.metadata["apiVersion"]), *_flatten("", params)]
    if data.draw(st.integers(0, 3), label="drop some") == 0:
        fields = [f for f in fields if f[0] == "Action" or not data.draw(st.booleans(), label="drop")]
    for _ in range(data.draw(st.integers(0, 3), label="stray fields")):
        fields.append((data.draw(STRAY_KEYS, label="key"), data.draw(AWKWARD_TEXT, label="value")))
    return urlencode(fields)


def _flatten(prefix: str, value: Any) -> Iterator[tuple[str, str]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _flatten(f"{prefix}.{k}" if prefix else str(k), v)
    elif isinstance(value, list):
        for i, v in enumerate(value, 1):
            yield from _flatten(f"{prefix}.member.{i}", v)
    else:
        yield prefix, value if isinstance(value, str) else json.dumps(value, default=str)


STRAY_KEYS = st.sampled_from([
    "Attribute.1.Name", "Attribute.1.Value", "Attribute.0.Name", "Attribute.99999999999999999999.Name",
    "Attribute.x.Value", "Attribute.2.Value", "MessageAttribute.1.Name", "MessageAttribute.1.Value.DataType",
    "MessageAttribute.1.Value.StringValue", "MessageAttribute.1.Value.BinaryValue",
    "MessageAttribute.1.Value.StringListValue.1", "MessageAttributes.entry.1.key",
    "MessageAttributes.entry.1.value.DataType", "MessageAttributes.entry.1.Value.StringValue",
    "SendMessageBatchRequestEntry.1.Id", "SendMessageBatchRequestEntry.1.MessageBody",
    "SendMessageBatchRequestEntry.2", "SendMessageBatchRequestEntry.11.Id",
    "DeleteMessageBatchRequestEntry.1.ReceiptHandle", "AttributeName.1", "AttributeNames.member.1",
    "AttributeName.2", "Tag.1.Key", "Tags.member.1.Value", "Tags.member.2", "Entries.member.1.Id",
    "PublishBatchRequestEntries.member.1.Message", "PublishBatchRequestEntries.member.2",
    "Attributes.entry.1.key", "Attributes.entry.1.value", "Attributes.entry.2.value",
    "Version", "Action", "QueueUrl", "TopicArn", "Message", "MessageBody", "Subject", "Endpoint", "Protocol",
    "ReceiptHandle", "VisibilityTimeout", "MaxNumberOfMessages", "DelaySeconds", "Signature", "X-Amz-Date"])


def _check(response: httpx.Response, protocol: str, call: str) -> None:
    what = f"{call} -> {response.status_code} {response.text[:500]!r}"
    assert response.status_code < 500, what
    assert response.headers.get("x-amzn-RequestId"), what
    if protocol == "json":
        assert response.headers["content-type"] == "application/x-amz-json-1.0", what
        try:
            body = response.json()
        except ValueError as exc:
            raise AssertionError(f"{what}: {exc}") from None
        assert isinstance(body, dict), what
        if response.status_code >= 400:
            assert isinstance(body.get("__type"), str) and body["__type"], what
            assert isinstance(body.get("message", ""), str), what
        return
    assert response.headers["content-type"].startswith("text/xml"), what
    try:
        root = ET.fromstring(response.content)
    except ET.ParseError as exc:
        raise AssertionError(f"{what}: {exc}") from None
    if response.status_code >= 400:
        assert root.tag.endswith("}ErrorResponse"), what
        assert next(el for el in root.iter() if el.tag.endswith("}Code")).text, what
    else:
        assert root.tag.endswith("Response"), what


# -- the tests --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def canary(server: ServerProcess) -> Iterator[None]:
    """A queue the fuzzer never names, holding messages that must come through untouched."""
    sqs = sqs_client(server.url)
    url = sqs.create_queue(QueueName=f"canary-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    bodies = [f"canary {i} ✓" for i in range(5)]
    for body in bodies:
        sqs.send_message(QueueUrl=url, MessageBody=body)
    yield
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0)["Messages"]
    assert sorted(m["Body"] for m in got) == bodies, "the fuzzing changed nothing it was not pointed at"


@pytest.fixture(scope="module")
def wire(server: ServerProcess) -> Iterator[httpx.Client]:
    sqs, sns = sqs_client(server.url), sns_client(server.url)
    for name in (FUZZ, f"{FUZZ}.fifo"):  # something to work on: a queue and a topic of each kind
        fifo = name.endswith(".fifo")
        sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true"} if fifo else {})
        sns.create_topic(Name=name, Attributes={"FifoTopic": "true"} if fifo else {})
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


@pytest.mark.parametrize(("service", "protocol"), sorted(MODELS))
def test_every_answer_is_a_success_or_an_error_in_the_protocols_format(server, wire, canary, service, protocol):
    model = MODELS[service, protocol]
    headers = {"Authorization": SIGNED.format(service=service)}
    target = "AmazonSQS" if service == "sqs" else "AmazonSNS"
    pools = Pools()

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=DERANDOMIZE, database=None,
              suppress_health_check=list(HealthCheck))
    @given(call=_operation(service, protocol, server.url), data=st.data())
    def fuzz(call: tuple[str, dict], data: st.DataObject) -> None:
        action, params = call
        params = pools.realise(params, random.Random(data.draw(st.integers(0, 2**32 - 1), label="seed")))
        if protocol == "json":
            r = wire.post("/", content=_json_body(params), headers={
                **headers, "Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": f"{target}.{action}"})
        else:
            r = wire.post("/", content=_query_form(model.operation_model(action), params, data), headers={
                **headers, "Content-Type": "application/x-www-form-urlencoded; charset=utf-8"})
        _check(r, protocol, f"{protocol} {action} {str(params)[:300]}")
        if r.status_code == 200:
            pools.learn(r.text)

    fuzz()
    assert wire.get("/livez").status_code == 200
    assert _pool_settles(wire), "every request gave its database connection back"


def _pool_settles(wire: httpx.Client, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        text = wire.get("/metrics").text
        active = next(float(line.split()[1]) for line in text.splitlines() if line.startswith("db_pool_active "))
        if active == 0:
            return True
        time.sleep(0.2)
    return False
