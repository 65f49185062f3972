"""The real AWS CLI (v1, from PyPI's ``awscli``) against a running Conveyor server.

Every call is ``python -m awscli sqs ... --endpoint-url SERVER --output json`` in a child
process whose AWS configuration is isolated from the machine's: dummy credentials in the
environment, empty config and credentials files and a ``HOME`` under ``tmp_path``, no
other ``AWS_*`` variable. Each CLI start costs about half a second, so the checks that are
not about the CLI itself (setting up a queue, confirming it is empty) use boto3.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from support.server import ServerProcess

pytestmark = pytest.mark.slow

ACCOUNT = "000000000000"


class AwsCli:
    """Runs ``aws sqs ...`` against one endpoint with an isolated configuration."""

    def __init__(self, endpoint: str, home: Path) -> None:
        self.endpoint = endpoint
        home.mkdir(parents=True, exist_ok=True)
        (home / "config").write_text("")
        (home / "credentials").write_text("")
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update({
            "HOME": str(home),
            "AWS_CONFIG_FILE": str(home / "config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(home / "credentials"),
            "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
            "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            # One attempt: an error case must fail at once, not after retries.
            "AWS_RETRY_MODE": "standard",
            "AWS_MAX_ATTEMPTS": "1",
        })
        self.env = env

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "awscli", "sqs", *args,
               "--endpoint-url", self.endpoint, "--output", "json"]
        proc = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(args[:1])} exited {proc.returncode}\n"
                                 f"stdout: {proc.stdout}\nstderr: {proc.stderr}")
        return proc

    def __call__(self, *args: str) -> dict[str, Any]:
        """Run a command that must succeed; its JSON output (``{}`` when it prints none)."""
        out = self.run(*args).stdout.strip()
        return json.loads(out) if out else {}


@pytest.fixture(scope="module")
def aws(server: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> AwsCli:
    return AwsCli(server.url, tmp_path_factory.mktemp("aws-home"))


@pytest.fixture(scope="module")
def boto_sqs(server: ServerProcess) -> Iterator[Any]:
    client = boto3.client("sqs", endpoint_url=server.url, region_name="us-east-1",
                          aws_access_key_id="x", aws_secret_access_key="y")
    yield client
    client.close()


def queue_url(server: ServerProcess, name: str) -> str:
    return f"{server.url}/{ACCOUNT}/{name}"


def counts(boto_sqs: Any, url: str) -> tuple[int, int, int]:
    attrs = boto_sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return (int(attrs["ApproximateNumberOfMessages"]),
            int(attrs["ApproximateNumberOfMessagesNotVisible"]),
            int(attrs["ApproximateNumberOfMessagesDelayed"]))


def md5_of_message_attributes(attributes: dict[str, dict[str, str]]) -> str:
    """SQS's MD5OfMessageAttributes, from attributes as the CLI prints them (binary in base64)."""

    def field(data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + data

    buf = b""
    for name in sorted(attributes):
        attr = attributes[name]
        buf += field(name.encode()) + field(attr["DataType"].encode())
        if "BinaryValue" in attr:
            buf += b"\x02" + field(base64.b64decode(attr["BinaryValue"]))
        else:
            buf += b"\x01" + field(attr["StringValue"].encode())
    return hashlib.md5(buf).hexdigest()


def test_create_get_list_and_queue_attributes(aws: AwsCli, server: ServerProcess,
                                              queue_name: str) -> None:
    created = aws("create-queue", "--queue-name", queue_name,
                  "--attributes", "VisibilityTimeout=45,MaximumMessageSize=2048,DelaySeconds=0")
    url = queue_url(server, queue_name)
    assert created == {"QueueUrl": url}

    assert aws("get-queue-url", "--queue-name", queue_name) == {"QueueUrl": url}
    assert aws("list-queues", "--queue-name-prefix", queue_name)["QueueUrls"] == [url]

    attrs = aws("get-queue-attributes", "--queue-url", url, "--attribute-names", "All")["Attributes"]
    assert attrs["VisibilityTimeout"] == "45"
    assert attrs["MaximumMessageSize"] == "2048"
    assert attrs["DelaySeconds"] == "0"
    assert attrs["QueueArn"] == f"arn:aws:sqs:us-east-1:{ACCOUNT}:{queue_name}"
    assert attrs["ApproximateNumberOfMessages"] == "0"

    assert aws("set-queue-attributes", "--queue-url", url,
               "--attributes", "VisibilityTimeout=60,ReceiveMessageWaitTimeSeconds=2") == {}
    attrs = aws("get-queue-attributes", "--queue-url", url, "--attribute-names",
                "VisibilityTimeout", "ReceiveMessageWaitTimeSeconds")["Attributes"]
    assert attrs == {"VisibilityTimeout": "60", "ReceiveMessageWaitTimeSeconds": "2"}


def test_send_receive_delete(aws: AwsCli, boto_sqs: Any, queue_name: str) -> None:
    url = boto_sqs.create_queue(QueueName=queue_name)["QueueUrl"]
    body = 'héllo wörld ✓ {"json": [1, 2]}'
    message_attributes = {
        "Color": {"DataType": "String", "StringValue": "blue"},
        "Count": {"DataType": "Number", "StringValue": "42"},
        "Blob": {"DataType": "Binary", "BinaryValue": "raw-bytes"},
    }
    sent = aws("send-message", "--queue-url", url, "--message-body", body,
               "--message-attributes", json.dumps(message_attributes))
    assert sent["MD5OfMessageBody"] == hashlib.md5(body.encode()).hexdigest()
    assert sent["MessageId"]

    got = aws("receive-message", "--queue-url", url, "--attribute-names", "All",
              "--message-attribute-names", "All", "--max-number-of-messages", "10")
    [msg] = got["Messages"]
    assert msg["MessageId"] == sent["MessageId"]
    assert msg["Body"] == body
    assert msg["MD5OfBody"] == hashlib.md5(body.encode()).hexdigest()
    assert msg["Attributes"]["ApproximateReceiveCount"] == "1"
    assert int(msg["Attributes"]["SentTimestamp"]) > 0
    received = msg["MessageAttributes"]
    assert received["Color"] == {"DataType": "String", "StringValue": "blue"}
    assert received["Count"] == {"DataType": "Number", "StringValue": "42"}
    # CLI v1 sends a blob argument's text as raw bytes and prints blobs in base64.
    assert received["Blob"]["DataType"] == "Binary"
    assert base64.b64decode(received["Blob"]["BinaryValue"]) == b"raw-bytes"
    assert msg["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert msg["MD5OfMessageAttributes"] == md5_of_message_attributes(received)

    assert counts(boto_sqs, url) == (0, 1, 0)
    assert aws("delete-message", "--queue-url", url, "--receipt-handle", msg["ReceiptHandle"]) == {}
    assert counts(boto_sqs, url) == (0, 0, 0)


def test_send_message_batch_and_purge(aws: AwsCli, boto_sqs: Any, queue_name: str) -> None:
    url = boto_sqs.create_queue(QueueName=queue_name)["QueueUrl"]
    entries = [
        {"Id": "a", "MessageBody": "first"},
        {"Id": "b", "MessageBody": "second",
         "MessageAttributes": {"K": {"DataType": "String", "StringValue": "v"}}},
        {"Id": "c", "MessageBody": "third"},
    ]
    result = aws("send-message-batch", "--queue-url", url, "--entries", json.dumps(entries))
    assert not result.get("Failed")
    ok = {e["Id"]: e for e in result["Successful"]}
    assert sorted(ok) == ["a", "b", "c"]
    for entry in entries:
        assert ok[entry["Id"]]["MD5OfMessageBody"] == hashlib.md5(entry["MessageBody"].encode()).hexdigest()
    assert "MD5OfMessageAttributes" in ok["b"]
    assert len({e["MessageId"] for e in ok.values()}) == 3

    attrs = aws("get-queue-attributes", "--queue-url", url, "--attribute-names",
                "ApproximateNumberOfMessages")["Attributes"]
    assert attrs == {"ApproximateNumberOfMessages": "3"}

    assert aws("purge-queue", "--queue-url", url) == {}
    assert counts(boto_sqs, url) == (0, 0, 0)
    assert boto_sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages", []) == []


def test_tags(aws: AwsCli, boto_sqs: Any, queue_name: str) -> None:
    url = boto_sqs.create_queue(QueueName=queue_name)["QueueUrl"]
    assert aws("tag-queue", "--queue-url", url, "--tags", "team=core,env=test,empty=") == {}
    assert aws("untag-queue", "--queue-url", url, "--tag-keys", "env") == {}
    assert aws("list-queue-tags", "--queue-url", url)["Tags"] == {"team": "core", "empty": ""}


def test_delete_queue_then_errors(aws: AwsCli, boto_sqs: Any, server: ServerProcess,
                                  queue_name: str) -> None:
    url = boto_sqs.create_queue(QueueName=queue_name)["QueueUrl"]
    assert aws("delete-queue", "--queue-url", url) == {}

    proc = aws.run("get-queue-url", "--queue-name", queue_name, check=False)
    assert proc.returncode != 0
    assert proc.stdout == ""
    assert "NonExistentQueue" in proc.stderr or "QueueDoesNotExist" in proc.stderr, proc.stderr
    assert "GetQueueUrl" in proc.stderr

    assert boto_sqs.list_queues(QueueNamePrefix=queue_name).get("QueueUrls", []) == []


def test_bare_queue_name_and_attribute_prefixes(aws: AwsCli, boto_sqs: Any, queue_name: str) -> None:
    """Issue 13: `--queue-url jobs` names the caller's queue, and `Hel.*` selects by prefix."""
    boto_sqs.create_queue(QueueName=queue_name)
    aws("send-message", "--queue-url", queue_name, "--message-body", "hi", "--message-attributes",
        json.dumps({name: {"DataType": "String", "StringValue": name} for name in ("Hello", "Help.Me", "Other")}))
    got = aws("receive-message", "--queue-url", queue_name, "--message-attribute-names", "Hel.*")["Messages"]
    assert [m["Body"] for m in got] == ["hi"]
    assert sorted(got[0]["MessageAttributes"]) == ["Hello", "Help.Me"]
