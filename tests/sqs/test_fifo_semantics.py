"""SQS FIFO semantics as AWS's (issue 27, items 1-4): receives filled group by group, a
group's lock following its messages' visibility, deduplication per message group, deletes
with an expired receipt handle, purges clearing the deduplication window. The expected
answers are those recorded against AWS (LocalStack's validated snapshots, AWS's API
reference); each test runs through boto3 in both wire protocols (JSON and Query)."""

from __future__ import annotations

import time

import botocore.exceptions
import pytest

from support.sqs_clients import error_code


def _fifo(make_queue, **attributes: str) -> str:
    return make_queue(".fifo", FifoQueue="true", ContentBasedDeduplication="true", **attributes)


def _send(sqs, url: str, *messages: str) -> None:
    """Messages named <group>-<n>: each goes to the group its name starts with."""
    for body in messages:
        sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=body.split("-")[0])


def _receive(sqs, url: str, qty: int = 10, **kwargs) -> list[dict]:
    return sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=qty, **kwargs).get("Messages", [])


# -- item 1: a receive is filled from one group before the next ----------------------------------

def test_a_receive_returns_a_group_together_in_order(sqs, make_queue):
    url = _fifo(make_queue)
    _send(sqs, url, "g1-m1", "g2-m1", "g1-m2", "g1-m3")
    assert [m["Body"] for m in _receive(sqs, url)] == ["g1-m1", "g1-m2", "g1-m3", "g2-m1"]


def test_groups_come_in_the_order_they_became_receivable(sqs, make_queue):
    """AWS's recorded answer: groups released by a receive with VisibilityTimeout 0 queue up
    behind a group that was never received."""
    url = _fifo(make_queue)
    _send(sqs, url, "g1-m1", "g2-m1", "g2-m2", "g3-m1", "g1-m2")
    assert [m["Body"] for m in _receive(sqs, url, 3, VisibilityTimeout=0)] == ["g1-m1", "g1-m2", "g2-m1"]
    assert [m["Body"] for m in _receive(sqs, url, VisibilityTimeout=0)] == [
        "g3-m1", "g1-m1", "g1-m2", "g2-m1", "g2-m2"]


def test_a_receive_with_a_qty_below_the_group_takes_its_oldest(sqs, make_queue):
    url = _fifo(make_queue)
    _send(sqs, url, "g1-m1", "g1-m2", "g1-m3", "g1-m4", "g2-m1", "g3-m1")
    assert [m["Body"] for m in _receive(sqs, url, 2)] == ["g1-m1", "g1-m2"]
    assert [m["Body"] for m in _receive(sqs, url, 1)] == ["g2-m1"]  # g1 waits for its first two


# -- item 2: a group is blocked by its messages in flight only -----------------------------------

def test_a_message_made_visible_again_reopens_its_group_up_to_the_next_in_flight(sqs, make_queue):
    url = _fifo(make_queue, VisibilityTimeout="30")
    _send(sqs, url, "g1-m1", "g1-m2", "g2-m1")
    first = _receive(sqs, url, 2)
    assert [m["Body"] for m in first] == ["g1-m1", "g1-m2"]
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=first[0]["ReceiptHandle"], VisibilityTimeout=0)
    # g1-m1 is receivable again (g2 became receivable before it); g1-m2, still in flight, is not
    assert [m["Body"] for m in _receive(sqs, url, 3)] == ["g2-m1", "g1-m1"]


def test_a_message_kept_in_flight_blocks_the_messages_after_it_only(sqs, make_queue):
    url = _fifo(make_queue, VisibilityTimeout="1")
    _send(sqs, url, "g1-foo", "g1-bar", "g1-baz")
    got = _receive(sqs, url)
    assert [m["Body"] for m in got] == ["g1-foo", "g1-bar", "g1-baz"]
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=got[1]["ReceiptHandle"], VisibilityTimeout=30)
    time.sleep(1.3)  # foo and baz are visible again, bar is not
    assert [m["Body"] for m in _receive(sqs, url, VisibilityTimeout=0)] == ["g1-foo"]


def test_a_group_is_receivable_again_with_all_its_messages_once_their_timeout_ran_out(sqs, make_queue):
    url = _fifo(make_queue)
    _send(sqs, url, "g1-m1", "g1-m2", "g1-m3", "g2-m1")
    assert [m["Body"] for m in _receive(sqs, url, 2, VisibilityTimeout=1)] == ["g1-m1", "g1-m2"]
    assert [m["Body"] for m in _receive(sqs, url, VisibilityTimeout=1)] == ["g2-m1"]
    time.sleep(1.3)
    assert [m["Body"] for m in _receive(sqs, url)] == ["g1-m1", "g1-m2", "g1-m3", "g2-m1"]


# -- item 3: deduplication per message group ------------------------------------------------------

def _send_ids(sqs, url: str, body: str, group: str, dedup: str = "same-dedup") -> str:
    return sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=group,
                            MessageDeduplicationId=dedup)["MessageId"]


def test_message_group_scope_deduplicates_per_group(sqs, make_queue):
    url = make_queue(".fifo", FifoQueue="true", DeduplicationScope="messageGroup",
                     FifoThroughputLimit="perMessageGroupId")
    first = _send_ids(sqs, url, "Test1", "group1")
    assert _send_ids(sqs, url, "Test1 again", "group1") == first  # the same group: a duplicate
    second = _send_ids(sqs, url, "Test2", "group2")
    assert second != first
    assert [m["Body"] for m in _receive(sqs, url)] == ["Test1", "Test2"]


def test_queue_scope_deduplicates_across_groups(sqs, make_queue):
    url = make_queue(".fifo", FifoQueue="true")
    first = _send_ids(sqs, url, "Test1", "group1")
    assert _send_ids(sqs, url, "Test2", "group2") == first
    assert [m["Body"] for m in _receive(sqs, url)] == ["Test1"]


def test_message_group_scope_with_content_based_deduplication(sqs, make_queue):
    url = make_queue(".fifo", FifoQueue="true", ContentBasedDeduplication="true", DeduplicationScope="messageGroup")
    sqs.send_message(QueueUrl=url, MessageBody="Test", MessageGroupId="group1")
    sqs.send_message(QueueUrl=url, MessageBody="Test", MessageGroupId="group2")
    sqs.send_message(QueueUrl=url, MessageBody="Test", MessageGroupId="group2")
    got = _receive(sqs, url, AttributeNames=["MessageGroupId"])
    assert [m["Attributes"]["MessageGroupId"] for m in got] == ["group1", "group2"]


def test_changing_the_scope_applies_to_the_sends_after_it(sqs, make_queue):
    url = make_queue(".fifo", FifoQueue="true", DeduplicationScope="queue")
    _send_ids(sqs, url, "Test1", "group1")
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"DeduplicationScope": "messageGroup",
                                                       "FifoThroughputLimit": "perMessageGroupId"})
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (attributes["DeduplicationScope"], attributes["FifoThroughputLimit"]) == ("messageGroup",
                                                                                       "perMessageGroupId")
    _send_ids(sqs, url, "Test2", "group2")
    assert [m["Body"] for m in _receive(sqs, url, VisibilityTimeout=0)] == ["Test1", "Test2"]
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"DeduplicationScope": "queue",
                                                       "FifoThroughputLimit": "perQueue"})
    third = _send_ids(sqs, url, "Test3", "group3", "other-dedup")
    assert _send_ids(sqs, url, "Test4", "group4", "other-dedup") == third  # per queue again
    assert [m["Body"] for m in _receive(sqs, url)] == ["Test1", "Test2", "Test3"]


# -- item 4: deletes with an expired handle; purges clear the deduplication window ----------------

EXPIRED = "Value {} for parameter ReceiptHandle is invalid. Reason: The receipt handle has expired."


def test_delete_with_an_expired_handle_is_refused_on_a_fifo_queue(sqs, make_queue):
    url = _fifo(make_queue, VisibilityTimeout="1")
    _send(sqs, url, "g1-m1", "g1-m2")
    [old, kept] = _receive(sqs, url)
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=kept["ReceiptHandle"], VisibilityTimeout=30)
    time.sleep(1.3)
    with pytest.raises(botocore.exceptions.ClientError) as err:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=old["ReceiptHandle"])
    assert error_code(err.value) == "InvalidParameterValue"
    assert err.value.response["Error"]["Message"] == EXPIRED.format(old["ReceiptHandle"])
    answer = sqs.delete_message_batch(QueueUrl=url, Entries=[
        {"Id": "old", "ReceiptHandle": old["ReceiptHandle"]}, {"Id": "kept", "ReceiptHandle": kept["ReceiptHandle"]}])
    assert [e["Id"] for e in answer["Successful"]] == ["kept"]  # extended in time: still its to delete
    [failed] = answer["Failed"]
    assert (failed["Id"], failed["Code"], failed["SenderFault"]) == ("old", "InvalidParameterValue", True)
    assert failed["Message"] == EXPIRED.format(old["ReceiptHandle"])
    assert [m["Body"] for m in _receive(sqs, url)] == ["g1-m1"]  # not deleted


def test_delete_with_an_expired_handle_still_deletes_on_a_standard_queue(sqs, make_queue):
    url = make_queue(VisibilityTimeout="1")
    sqs.send_message(QueueUrl=url, MessageBody="m")
    [m] = _receive(sqs, url)
    time.sleep(1.3)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    assert _receive(sqs, url) == []


def test_purge_clears_the_deduplication_window(sqs, make_queue):
    url = make_queue(".fifo", FifoQueue="true")
    first = _send_ids(sqs, url, "message-1", "g", "d")
    sqs.purge_queue(QueueUrl=url)
    assert _send_ids(sqs, url, "message-2", "g", "d") != first
    assert [m["Body"] for m in _receive(sqs, url)] == ["message-2"]
