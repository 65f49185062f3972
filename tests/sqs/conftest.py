"""SQS fixtures: boto3 clients of both wire protocols against the module's server."""

from __future__ import annotations

import uuid

import pytest

from support.sqs_clients import client


@pytest.fixture(params=["json", "query"])
def protocol(request) -> str:
    return request.param


@pytest.fixture
def sqs(server, protocol):
    return client(server.url, protocol)


@pytest.fixture
def make_queue(sqs):
    """Create a queue with a unique name; returns its URL."""

    def make(suffix: str = "", **attributes: str) -> str:
        name = f"q-{uuid.uuid4().hex[:10]}{suffix}"
        return sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]

    return make
