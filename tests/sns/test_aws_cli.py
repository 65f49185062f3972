"""The real AWS CLI (v1, from PyPI's ``awscli``) running ``aws sns ...`` against a running
Conveyor server, with an isolated configuration (dummy credentials, empty config files,
``HOME`` under ``tmp_path``). Each CLI start costs about half a second, so the checks that
are not about the CLI (reading the queue back) use boto3."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support.server import ServerProcess
from support.sns_clients import ACCOUNT, REGION, receive_all, sns_client, unique
from support.sqs_clients import client as sqs_client

pytestmark = pytest.mark.slow


class AwsCli:
    def __init__(self, endpoint: str, home: Path) -> None:
        self.endpoint = endpoint
        home.mkdir(parents=True, exist_ok=True)
        (home / "config").write_text("")
        (home / "credentials").write_text("")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        self.env.update({
            "HOME": str(home), "AWS_CONFIG_FILE": str(home / "config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(home / "credentials"),
            "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            "AWS_DEFAULT_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_RETRY_MODE": "standard", "AWS_MAX_ATTEMPTS": "1",
        })

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "awscli", "sns", *args, "--endpoint-url", self.endpoint, "--output", "json"]
        proc = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise AssertionError(f"{args[0]} exited {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}")
        return proc

    def __call__(self, *args: str) -> dict[str, Any]:
        out = self.run(*args).stdout.strip()
        return json.loads(out) if out else {}


@pytest.fixture(scope="module")
def aws(server: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> AwsCli:
    return AwsCli(server.url, tmp_path_factory.mktemp("aws-home"))


def test_topic_subscribe_publish_and_back(aws: AwsCli, server: ServerProcess) -> None:
    name = unique()
    arn = aws("create-topic", "--name", name, "--attributes", "DisplayName=Orders",
              "--tags", "Key=team,Value=core")["TopicArn"]
    assert arn == f"arn:aws:sns:{REGION}:{ACCOUNT}:{name}"
    assert aws("get-topic-attributes", "--topic-arn", arn)["Attributes"]["DisplayName"] == "Orders"
    sns = sns_client(server.url)
    assert sns.list_tags_for_resource(ResourceArn=arn)["Tags"] == [{"Key": "team", "Value": "core"}]

    sqs = sqs_client(server.url)
    queue = unique("q")
    url = sqs.create_queue(QueueName=queue)["QueueUrl"]
    sub = aws("subscribe", "--topic-arn", arn, "--protocol", "sqs", "--notification-endpoint",
              f"arn:aws:sqs:{REGION}:{ACCOUNT}:{queue}", "--attributes", '{"RawMessageDelivery": "true"}',
              "--return-subscription-arn")["SubscriptionArn"]
    assert aws("list-subscriptions-by-topic", "--topic-arn", arn)["Subscriptions"][0]["SubscriptionArn"] == sub

    sent = aws("publish", "--topic-arn", arn, "--message", "from the CLI", "--message-attributes",
               '{"kind": {"DataType": "String", "StringValue": "cli"}}')
    [msg] = receive_all(sqs, url, 1)
    assert msg["Body"] == "from the CLI" and msg["MessageAttributes"]["kind"]["StringValue"] == "cli"
    assert sent["MessageId"]

    assert aws("set-subscription-attributes", "--subscription-arn", sub, "--attribute-name", "FilterPolicy",
               "--attribute-value", '{"kind": ["nope"]}') == {}
    attributes = sns.get_subscription_attributes(SubscriptionArn=sub)["Attributes"]
    assert json.loads(attributes["FilterPolicy"]) == {"kind": ["nope"]}
    assert aws("unsubscribe", "--subscription-arn", sub) == {}
    assert aws("delete-topic", "--topic-arn", arn) == {}

    proc = aws.run("get-topic-attributes", "--topic-arn", arn, check=False)
    assert proc.returncode != 0 and proc.stdout == ""
    assert "NotFound" in proc.stderr and "Topic does not exist" in proc.stderr, proc.stderr
