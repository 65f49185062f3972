"""boto3 SNS clients for both wire protocols, and small helpers of the SNS tests.

Today's botocore speaks SNS's Query protocol. For the JSON protocol (``X-Amz-Target:
AmazonSNS.<Action>``, JSON in and out), this module derives a JSON-protocol service model
from botocore's own: the protocol switched, the target prefix set, the outputs unwrapped,
and ``awsQueryCompatible`` so that botocore reads the Query error code from
``x-amzn-query-error`` — as it does for SQS since SQS moved to JSON. boto3 then serialises
and parses with its own, independent code.
"""

from __future__ import annotations

import copy
import functools
import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import boto3
import botocore.config
import botocore.session
import httpx

ACCOUNT = "000000000000"
REGION = "us-east-1"


def _json_model(query_model: dict) -> dict:
    model = copy.deepcopy(query_model)
    meta = model["metadata"]
    meta.update({"protocol": "json", "protocols": ["json"], "jsonVersion": "1.0", "targetPrefix": "AmazonSNS",
                 "awsQueryCompatible": {}})
    meta.pop("xmlNamespace", None)
    for op in model["operations"].values():
        if "output" in op:
            op["output"].pop("resultWrapper", None)
    return model


@functools.cache
def _json_data_path() -> str:
    loader = botocore.session.get_session().get_component("data_loader")
    query_model = loader.load_service_model("sns", "service-2")
    root = Path(tempfile.mkdtemp(prefix="conveyor-sns-json-model-"))
    target = root / "sns" / "2010-03-31"
    target.mkdir(parents=True)
    (target / "service-2.json").write_text(json.dumps(_json_model(query_model)))
    return str(root)


def sns_client(endpoint_url: str, protocol: str = "query", region: str = REGION, secret_key: str = "secret",
               access_key: str = "AKIDCONVEYORTEST", **config: object) -> Any:
    """A boto3 SNS client speaking ``protocol`` ("query", botocore's default, or "json")."""
    session = botocore.session.get_session()
    if protocol == "json":
        session.get_component("data_loader").search_paths.insert(0, _json_data_path())
    elif protocol != "query":
        raise ValueError(protocol)
    client = boto3.Session(botocore_session=session).client(
        "sns", endpoint_url=endpoint_url, region_name=region, aws_access_key_id=access_key,
        aws_secret_access_key=secret_key, config=botocore.config.Config(retries={"max_attempts": 0}, **config))
    assert client.meta.service_model.protocol == protocol
    return client


def error_code(exc: Exception) -> str:
    return exc.response["Error"]["Code"]  # type: ignore[attr-defined]


def status_code(exc: Exception) -> int:
    return exc.response["ResponseMetadata"]["HTTPStatusCode"]  # type: ignore[attr-defined]


def unique(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def receive_all(sqs: Any, url: str, expected: int, timeout: float = 5.0) -> list[dict[str, Any]]:
    """Receive until ``expected`` messages arrived (or the timeout), deleting none."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(got) < expected and time.monotonic() < deadline:
        got += sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1,
                                   MessageAttributeNames=["All"], AttributeNames=["All"]).get("Messages", [])
    return got


def metric(url: str, name: str, **labels: str) -> float:
    """One sample of a server's /metrics (0 if absent)."""
    text = httpx.get(url + "/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        if series == (f"{name}{{{want}}}" if want else name):
            return float(value)
    return 0.0


def subscribe_http(sns: Any, topic: str, endpoint: Any, **attributes: str) -> str:
    """Subscribe ``endpoint`` as SNS has it done: Subscribe, then the endpoint confirms by
    fetching the SubscribeURL of the SubscriptionConfirmation it received (which is then
    taken off its list). Returns the subscription's ARN."""
    arn = sns.subscribe(TopicArn=topic, Protocol="http", Endpoint=endpoint.url, Attributes=attributes,
                        ReturnSubscriptionArn=True)["SubscriptionArn"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with endpoint.lock:
            found = [r for r in endpoint.received if r.headers.get("x-amz-sns-message-type") == "SubscriptionConfirmation"
                     and json.loads(r.body)["TopicArn"] == topic]
            for r in found:
                endpoint.received.remove(r)
        if found:
            httpx.get(json.loads(found[-1].body)["SubscribeURL"]).raise_for_status()
            return str(arn)
        time.sleep(0.02)
    raise AssertionError("no SubscriptionConfirmation arrived")
