"""Unsubscribe-link tokens: made per subscription by the database's key, checked in constant
time, and added to an envelope's UnsubscribeURL only (never to text a publisher wrote)."""

from __future__ import annotations

import json
import uuid

import pytest

from conveyor.core import unsubscribe_links
from conveyor.types import TopicUrls

URLS = TopicUrls(base_url="http://sns.test:9324")
SUB = uuid.UUID("2bcfbf39-05c3-41de-beaa-fcfcc21c8f55")
LINKS = unsubscribe_links.Links(b"k" * 32)


def envelope(message: str, subscription: uuid.UUID = SUB, attributes: str | None = None) -> str:
    """An envelope as conveyor._envelope_parts writes it (fields one a line, ' : ')."""
    arn = URLS.subscription_arn("orders", subscription)
    fields = [("Type", "Notification"), ("Message", message), ("UnsubscribeURL", URLS.unsubscribe_url_prefix + arn)]
    text = ",\n  ".join(f"{json.dumps(k)} : {json.dumps(v, ensure_ascii=False)}" for k, v in fields)
    if attributes is not None:
        text += f',\n  "MessageAttributes" : {attributes}'
    return "{\n  " + text + "\n}"


def test_tokens_are_per_subscription_and_per_key():
    token = LINKS.token(SUB)
    assert len(token) == 22 and LINKS.valid(SUB, token)
    assert not LINKS.valid(uuid.uuid4(), token)
    assert not unsubscribe_links.Links(b"x" * 32).valid(SUB, token)
    for wrong in (None, "", token[:-1], token + "A", "é" * 22, "\udcff"):
        assert not LINKS.valid(SUB, wrong)
    with pytest.raises(ValueError, match="32 bytes"):
        unsubscribe_links.Links(b"short")


def test_stamp_completes_the_envelopes_link_and_nothing_else():
    # a message that looks like the link, even with the field's own line in it, is left alone
    bait = f'SubscriptionArn={URLS.subscription_arn("orders", SUB)}\n  "UnsubscribeURL" : "x'
    original = envelope(bait, attributes=json.dumps({"a": {"Type": "String", "Value": str(SUB)}}))
    stamped = json.loads(LINKS.stamp(original, SUB))
    assert stamped["UnsubscribeURL"] == f"{URLS.unsubscribe_url_prefix}{URLS.subscription_arn('orders', SUB)}" \
                                       f"&Token={LINKS.token(SUB)}"
    assert stamped["Message"] == bait and stamped["MessageAttributes"]["a"]["Value"] == str(SUB)
    # another subscription's envelope, an envelope without the field, text that is not one
    other = envelope("hi", uuid.UUID(int=1))
    assert LINKS.stamp(other, SUB) == other
    no_link = '{\n  "Type" : "Notification",\n  "Message" : "hi"\n}'
    assert LINKS.stamp(no_link, SUB) == no_link
    broken = '{\n  "UnsubscribeURL" : "unterminated'
    assert LINKS.stamp(broken, SUB) == broken
