"""Encryption at rest through every protocol, against real servers: REST, SQS (boto3),
topic fan-out and Queen's API seal bodies with the server's key; PostgreSQL's tables hold
no plaintext (read directly); MD5s, filter policies and FIFO deduplication still work;
keys rotate with ``conveyor queues reencrypt``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import boto3
import httpx
import psycopg
import pytest
from click.testing import CliRunner

from conveyor import crypto
from conveyor.server.brokers.base import QUEUE_CACHE_SECONDS
from support.cli import CLI
from support.server import ServerProcess

SECRET = "card 4111-1111-1111-1111"
KEY1 = crypto.Keyring.generate("k1")
KEY2 = crypto.Keyring.generate("k2")


@pytest.fixture(scope="module")
def sealed_server(module_dsn: str) -> Iterator[ServerProcess]:
    proc = ServerProcess(module_dsn, env={"CONVEYOR_ENCRYPTION_KEY": KEY1}).start()
    yield proc
    proc.kill()


@pytest.fixture
def rest(sealed_server: ServerProcess) -> Iterator[httpx.Client]:
    with sealed_server.client() as client:
        yield client


@pytest.fixture
def sqs(sealed_server: ServerProcess):
    return boto3.client("sqs", endpoint_url=sealed_server.url, region_name="us-east-1",
                        aws_access_key_id="x", aws_secret_access_key="y")


def stored(dsn: str, sql: str, *params: object) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def queue_rows(dsn: str, queue: str) -> list[tuple[str, str | None]]:
    return stored(dsn, "SELECT m.body, m.content_type FROM conveyor.messages m JOIN conveyor.queues q "
                       "ON q.id = m.queue_id WHERE q.name = %s ORDER BY m.id", queue)


def test_rest_queue_bodies_are_sealed_in_the_table(rest, module_dsn, queue_name):
    created = rest.post("/v1/queues", json={"name": queue_name, "encrypted": True})
    assert created.status_code == 201 and created.json()["encrypted"] is True
    rest.post(f"/v1/queues/{queue_name}/messages", json={"message": {"secret": SECRET}, "headers": {"k": "v"}})
    rest.post(f"/v1/queues/{queue_name}/messages", json={"message": SECRET})
    [(body1, type1), (body2, type2)] = queue_rows(module_dsn, queue_name)
    assert SECRET not in body1 + body2 and "4111" not in body1 + body2
    assert crypto.sealed_kid(type1) == "k1" and crypto.sealed_kid(type2) == "k1"
    got = rest.get(f"/v1/queues/{queue_name}/messages", params={"max": 10}).json()
    assert [m["message"] for m in got] == [{"secret": SECRET}, SECRET]  # JSON stays JSON
    assert got[0]["headers"] == {"k": "v"}  # metadata is not sealed
    # a plain queue stays plain
    plain = queue_name + "-plain"
    rest.post("/v1/queues", json={"name": plain})
    rest.post(f"/v1/queues/{plain}/messages", json={"message": SECRET})
    assert queue_rows(module_dsn, plain) == [(SECRET, None)]


def test_sqs_sse_queues_are_sealed_and_digests_hold(sqs, module_dsn, queue_name):
    url = sqs.create_queue(QueueName=queue_name, Attributes={"SqsManagedSseEnabled": "true"})["QueueUrl"]
    sent = sqs.send_message(QueueUrl=url, MessageBody=SECRET,
                            MessageAttributes={"kind": {"DataType": "String", "StringValue": "payment"}})
    [(body, _)] = queue_rows(module_dsn, queue_name)
    assert SECRET not in body
    [m] = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"])["Messages"]  # boto3 checks MD5s
    assert m["Body"] == SECRET and m["MD5OfBody"] == sent["MD5OfMessageBody"]
    assert m["MessageAttributes"]["kind"]["StringValue"] == "payment"
    # FIFO content-based deduplication compares the plaintext, not the (ever different) ciphertext
    fifo = sqs.create_queue(QueueName=queue_name + ".fifo", Attributes={
        "FifoQueue": "true", "ContentBasedDeduplication": "true", "KmsMasterKeyId": "alias/aws/sqs"})["QueueUrl"]
    first = sqs.send_message(QueueUrl=fifo, MessageBody=SECRET, MessageGroupId="g")
    again = sqs.send_message(QueueUrl=fifo, MessageBody=SECRET, MessageGroupId="g")
    assert first["MessageId"] == again["MessageId"]
    assert len(queue_rows(module_dsn, queue_name + ".fifo")) == 1
    # SSE turned off: new messages are stored plain, sealed ones still open
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"SqsManagedSseEnabled": "false"})
    time.sleep(QUEUE_CACHE_SECONDS + 0.2)  # a server reads a queue's settings anew every 2 s
    sqs.send_message(QueueUrl=url, MessageBody="public")
    assert queue_rows(module_dsn, queue_name)[-1] == ("public", None)


def test_topic_fan_out_into_an_encrypted_queue_with_a_body_filter(rest, module_dsn, queue_name):
    rest.post("/v1/queues", json={"name": queue_name, "encrypted": True})
    key = queue_name.replace("_", ".")
    rest.post(f"/v1/events/{key}/subscriptions", json={
        "queue_name": queue_name, "filter_policy_scope": "MessageBody",
        "filter_policy": {"kind": ["payment"]}})
    sent = rest.post(f"/v1/events/{key}", json={"message": {"kind": "payment", "card": SECRET}})
    assert sent.status_code == 201, sent.text
    skipped = rest.post(f"/v1/events/{key}", json={"message": {"kind": "refund", "card": SECRET}})
    assert sent.json()["queues_matched"] == 1 and skipped.json()["queues_matched"] == 0
    [copy] = sent.json()["messages"]
    [(body, content_type)] = queue_rows(module_dsn, queue_name)
    assert SECRET not in body and crypto.is_sealed(content_type)
    [got] = rest.get(f"/v1/queues/{queue_name}/messages").json()
    assert got["id"] == copy["id"] and SECRET in json.dumps(got["message"])


def test_queen_payloads_are_sealed(rest, module_dsn, queue_name):
    configured = rest.post("/api/v1/configure", json={"queue": queue_name, "options": {"encryptionEnabled": True,
                                                                                        "retryLimit": 0}})
    assert configured.json()["options"]["encryptionEnabled"] is True
    pushed = rest.post("/api/v1/push", json={"items": [{"queue": queue_name, "payload": {"card": SECRET}}]})
    assert pushed.status_code == 201
    [(payload, is_encrypted)] = stored(module_dsn, "SELECT m.payload::text, m.is_encrypted FROM "
                                       "conveyor.partition_messages m JOIN conveyor.partitions p ON p.id = "
                                       "m.partition_id JOIN conveyor.pqueues q ON q.id = p.queue_id WHERE q.name = %s",
                                       queue_name)
    assert SECRET not in payload and is_encrypted
    popped = rest.get(f"/api/v1/pop/queue/{queue_name}", params={"batch": 1}).json()
    [message] = popped["messages"]
    assert message["data"] == {"card": SECRET} and "encrypted" not in message
    failed = rest.post("/api/v1/ack", json={"transactionId": message["transactionId"],
                                            "partitionId": message["partitionId"], "leaseId": popped["leaseId"],
                                            "status": "failed", "error": "boom"})
    assert failed.status_code == 200
    dead = rest.get("/api/v1/dlq", params={"queue": queue_name}).json()["messages"]
    assert [d["data"] for d in dead] == [{"card": SECRET}]
    found = rest.get(f"/api/v1/messages/{message['partitionId']}/{message['transactionId']}").json()
    assert found["payload"] == {"card": SECRET}


def test_without_a_key_encryption_is_refused_not_faked(server, http, queue_name):
    refused = http.post("/v1/queues", json={"name": queue_name, "encrypted": True})
    assert refused.status_code == 400 and "CONVEYOR_ENCRYPTION_KEY" in refused.json()["error"]
    queen = http.post("/api/v1/configure", json={"queue": queue_name, "options": {"encryptionEnabled": True}})
    assert queen.status_code == 400


def test_a_server_without_the_key_refuses_sealed_messages(rest, module_dsn, queue_name):
    rest.post("/v1/queues", json={"name": queue_name, "encrypted": True})
    rest.post(f"/v1/queues/{queue_name}/messages", json={"message": SECRET})
    keyless = ServerProcess(module_dsn).start()
    try:
        with keyless.client() as http:
            sent = http.post(f"/v1/queues/{queue_name}/messages", json={"message": "x"})
            assert sent.status_code == 503 and "encryption key" in sent.json()["error"]
            read = http.get(f"/v1/queues/{queue_name}/messages")
            assert read.status_code == 503
    finally:
        keyless.kill()
    # nothing was lost: the keyed server still reads it
    assert [m["message"] for m in rest.get(f"/v1/queues/{queue_name}/messages", params={"max": 10}).json()] == [SECRET]


def test_reencrypt_rotates_to_the_first_key(rest, module_dsn, queue_name):
    rest.post("/v1/queues", json={"name": queue_name, "encrypted": True})
    for i in range(3):
        rest.post(f"/v1/queues/{queue_name}/messages", json={"message": f"{SECRET} #{i}"})
    # a queue that turned encryption on after it had messages: reencrypt seals those too
    late = queue_name + "-late"
    rest.post("/v1/queues", json={"name": late})
    rest.post(f"/v1/queues/{late}/messages", json={"message": SECRET})
    assert rest.patch(f"/v1/queues/{late}", json={"encrypted": True}).json()["encrypted"] is True
    result = CliRunner().invoke(CLI, ["--database-url", module_dsn, "queues", "reencrypt", "--json"],
                                env={"CONVEYOR_ENCRYPTION_KEY": f"{KEY2},{KEY1}"}, prog_name="conveyor")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["messages"] >= 4
    for name in (queue_name, late):
        rows = queue_rows(module_dsn, name)
        assert rows and all(crypto.sealed_kid(t) == "k2" and SECRET not in b for b, t in rows)
    rotated = ServerProcess(module_dsn, env={"CONVEYOR_ENCRYPTION_KEY": KEY2}).start()  # the old key is gone
    try:
        with rotated.client() as http:
            got = http.get(f"/v1/queues/{queue_name}/messages", params={"max": 10}).json()
            assert sorted(m["message"] for m in got) == [f"{SECRET} #{i}" for i in range(3)]
            assert [m["message"] for m in http.get(f"/v1/queues/{late}/messages").json()] == [SECRET]
    finally:
        rotated.kill()
