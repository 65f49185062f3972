"""Prometheus labels never take values a client can vary without bound: requests naming
queues that do not exist, and publishes to made-up routing keys, add no series."""

from __future__ import annotations

import uuid

import botocore.exceptions
import httpx
import pytest

from support.sqs_clients import client

AUTH = {"Authorization": "x"}


def test_made_up_names_add_no_series(server):
    made_up = [f"nosuch-{uuid.uuid4().hex[:12]}" for _ in range(5)]
    sqs = client(server.url, "json")
    for name in made_up:
        with pytest.raises(botocore.exceptions.ClientError):
            sqs.send_message(QueueUrl=f"{server.url}/000000000000/{name}", MessageBody="x")
        with pytest.raises(botocore.exceptions.ClientError):
            sqs.receive_message(QueueUrl=f"{server.url}/000000000000/{name}")
        assert httpx.post(f"{server.url}/v1/queues/{name}/messages", json={"message": "x"},
                          headers=AUTH).status_code == 404
        assert httpx.post(f"{server.url}/v1/events/{name}.created", json={"message": "x"},
                          headers=AUTH).status_code == 201
        assert httpx.get(f"{server.url}/v1/{name}", headers=AUTH).status_code == 404
    text = httpx.get(server.url + "/metrics").text
    for name in made_up:
        assert name not in text
    assert 'topic_messages_published_total{topic="_routing_keys"}' in text
