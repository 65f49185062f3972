"""SNS delivery policies (core.delivery_policy): SNS's defaults, the four phases of a retry
policy and its backoff functions, a topic's defaults under a subscription's own, and the
policies SNS refuses."""

from __future__ import annotations

import json
import re

import pytest

from conveyor.core import delivery_policy as dp


def test_unset_is_sns_default_three_retries_twenty_seconds_apart():
    effective = dp.effective(None, None)
    assert effective.retry.attempts == 4 and [effective.retry.delay(i) for i in (1, 2, 3)] == [20, 20, 20]
    assert effective.content_type == "text/plain; charset=UTF-8" and effective.max_per_second is None
    assert json.loads(effective.topic_json())["http"]["defaultHealthyRetryPolicy"] == {
        "minDelayTarget": 20, "maxDelayTarget": 20, "numRetries": 3, "numNoDelayRetries": 0,
        "numMinDelayRetries": 0, "numMaxDelayRetries": 0, "backoffFunction": "linear"}


def test_the_four_phases_in_order():
    retry = dp.subscription('{"healthyRetryPolicy": {"numRetries": 9, "numNoDelayRetries": 2, "minDelayTarget": 10,'
                            ' "maxDelayTarget": 50, "numMinDelayRetries": 2, "numMaxDelayRetries": 1}}').retry
    delays = [retry.delay(i) for i in range(1, 10)]
    assert delays[:2] == [0, 0] and delays[2:4] == [10, 10] and delays[-1] == 50
    assert delays[4:8] == [20, 30, 40, 50]  # four linear steps from 10 to 50


@pytest.mark.parametrize("function", dp.BACKOFF_FUNCTIONS)
def test_every_backoff_function_rises_from_min_to_max(function: str):
    retry = dp.subscription(json.dumps({"healthyRetryPolicy": {
        "numRetries": 8, "minDelayTarget": 2, "maxDelayTarget": 100, "backoffFunction": function}})).retry
    delays = [retry.delay(i) for i in range(1, 9)]
    assert delays == sorted(delays) and 2 <= delays[0] < 100 and delays[-1] == 100


def test_the_topic_gives_defaults_the_subscription_overrides_unless_forbidden():
    topic = '{"http": {"defaultHealthyRetryPolicy": {"numRetries": 1}, "defaultThrottlePolicy": {"maxReceivesPerSecond": 3}}}'
    own = '{"healthyRetryPolicy": {"numRetries": 6}, "requestPolicy": {"headerContentType": "application/xml"}}'
    merged = dp.effective(topic, own)
    assert (merged.retry.retries, merged.max_per_second, merged.content_type) == (6, 3, "application/xml")
    assert dp.effective(topic, None).retry.retries == 1
    locked = topic[:-2] + ', "disableSubscriptionOverrides": true}}'
    assert dp.effective(locked, own).retry.retries == 1
    assert json.loads(dp.effective(locked, own).topic_json())["http"]["disableSubscriptionOverrides"] is True
    shown = json.loads(merged.subscription_json())
    assert shown["healthyRetryPolicy"]["numRetries"] == 6 and shown["throttlePolicy"] == {"maxReceivesPerSecond": 3}


@pytest.mark.parametrize(("policy", "says"), [
    ("[]", "must be a JSON object"),
    ("{", "failed to parse JSON"),
    ('{"healthyRetryPolicy": {"numRetries": 101}}', "numRetries must be between 0 and 100"),
    ('{"healthyRetryPolicy": {"numRetries": "3"}}', "numRetries must be an integer"),
    ('{"healthyRetryPolicy": {"minDelayTarget": 30, "maxDelayTarget": 20}}', "at most maxDelayTarget"),
    ('{"healthyRetryPolicy": {"minDelayTarget": 0}}', "at least 1"),
    ('{"healthyRetryPolicy": {"maxDelayTarget": 3601, "minDelayTarget": 1, "numRetries": 0}}', "at most 3600"),
    ('{"healthyRetryPolicy": {"numRetries": 2, "numNoDelayRetries": 3}}', "at most numRetries"),
    ('{"healthyRetryPolicy": {"numRetries": 100, "minDelayTarget": 60, "maxDelayTarget": 60}}', "more than 3600"),
    ('{"healthyRetryPolicy": {"backoffFunction": "cubic"}}', "backoffFunction must be one of"),
    ('{"healthyRetryPolicy": {"retries": 3}}', "unknown key retries"),
    ('{"throttlePolicy": {"maxReceivesPerSecond": 0}}', "maxReceivesPerSecond must be an integer of at least 1"),
    ('{"requestPolicy": {"headerContentType": "json please"}}', "headerContentType must be a content type"),
    ('{"retryPolicy": {}}', "unknown key retryPolicy"),
])
def test_policies_sns_refuses(policy: str, says: str):
    with pytest.raises(dp.Invalid, match=re.escape(says)):
        dp.subscription(policy)


def test_a_stored_policy_that_no_longer_reads_counts_as_unset():
    assert dp.effective('{"http": {"defaultHealthyRetryPolicy": {"numRetries": 500}}}', "{") == dp.DEFAULT
