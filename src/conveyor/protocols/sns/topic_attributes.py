"""SNS topic attributes: which ones a client may set, how they are checked, and what
GetTopicAttributes answers (the computed ones — TopicArn, Owner, Policy, counts,
EffectiveDeliveryPolicy — plus those stored with the topic).

Stored attributes keep SNS's names and string values. Conveyor keeps and returns the
access policies and the delivery-status settings but does not act on them: access is
governed by the server's authentication settings. The DeliveryPolicy is checked as SNS
checks it and applied to the topic's HTTP(S) deliveries (``core.delivery_policy``);
EffectiveDeliveryPolicy states it with SNS's defaults filled in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from conveyor import json_input, types
from conveyor.core import delivery_policy
from conveyor.protocols.sns.context import Context
from conveyor.protocols.sns.errors import invalid

_FEEDBACK = [f"{kind}{what}" for kind in ("Application", "HTTP", "Lambda", "SQS", "Firehose")
             for what in ("SuccessFeedbackRoleArn", "SuccessFeedbackSampleRate", "FailureFeedbackRoleArn")]
SETTABLE = frozenset({
    "DeliveryPolicy", "DisplayName", "Policy", "TracingConfig", "KmsMasterKeyId", "SignatureVersion",
    "ContentBasedDeduplication", "ArchivePolicy", "FifoThroughputScope", "DataProtectionPolicy", *_FEEDBACK,
})
CREATE_ONLY = frozenset({"FifoTopic"})
FIFO_ONLY = frozenset({"ContentBasedDeduplication", "ArchivePolicy", "FifoThroughputScope"})
JSON_VALUED = frozenset({"DeliveryPolicy", "Policy", "ArchivePolicy", "DataProtectionPolicy"})
BOOLEAN = frozenset({"ContentBasedDeduplication", "FifoTopic"})  # read in any case, stored as true/false
_CHOICES = {
    "TracingConfig": ("PassThrough", "Active"),
    "SignatureVersion": ("1", "2"),
    "FifoThroughputScope": ("Topic", "MessageGroup"),
}
MAX_DISPLAY_NAME = 100

def check(name: str, value: str, *, fifo: bool, creating: bool) -> None:
    """One attribute a client wants to set, checked as SNS checks it."""
    if name not in SETTABLE and not (creating and name in CREATE_ONLY):
        raise invalid("AttributeName")
    if name in FIFO_ONLY and not fifo:
        raise invalid("Attributes", f"{name} is only valid for FIFO topics")
    if name in BOOLEAN and value.lower() not in ("true", "false"):
        raise invalid("Attributes", f"Invalid value [{value}] for {name}: must be one of true, false")
    if name in _CHOICES and value not in _CHOICES[name]:
        raise invalid("Attributes", f"Invalid value [{value}] for {name}: must be one of "
                      f"{', '.join(_CHOICES[name])}")
    if name in JSON_VALUED and value != "":
        try:
            parsed = json_input.loads(value, big_integers=True)
        except ValueError:
            raise invalid(name, "failed to parse JSON") from None
        if not isinstance(parsed, dict):
            raise invalid(name, "must be a JSON object")
        if name == "DeliveryPolicy":
            try:
                delivery_policy.topic(value)
            except delivery_policy.Invalid as exc:
                raise invalid(name, str(exc)) from None
    if name == "DisplayName" and len(value) > MAX_DISPLAY_NAME:
        raise invalid("Attributes", "DisplayName")


def stored(name: str, value: str) -> str:
    """A checked value as it is kept: booleans as ``true``/``false`` (SNS reads "True" and
    "TRUE" too), everything else exactly as given (JSON policies are not re-serialised)."""
    return value.lower() if name in BOOLEAN else value


def for_create(name: str, given: Mapping[str, str]) -> dict[str, str]:
    """The attributes of a CreateTopic, checked; the topic's FIFO-ness must agree with its name."""
    fifo_name = name.endswith(".fifo")
    fifo = stored("FifoTopic", given.get("FifoTopic", "false")) == "true"
    for key, value in given.items():
        check(key, value, fifo=fifo, creating=True)
    if fifo != fifo_name:  # SNS's wording for either mismatch
        raise invalid("Topic Name")
    return {k: stored(k, v) for k, v in given.items() if k != "FifoTopic" and v != ""}


def default_policy(ctx: Context, topic: str) -> str:
    """The access policy SNS gives a new topic: its owner may do everything."""
    return json.dumps({
        "Version": "2008-10-17",
        "Id": "__default_policy_ID",
        "Statement": [{
            "Sid": "__default_statement_ID",
            "Effect": "Allow",
            "Principal": {"AWS": "*"},
            "Action": ["SNS:GetTopicAttributes", "SNS:SetTopicAttributes", "SNS:AddPermission",
                       "SNS:RemovePermission", "SNS:DeleteTopic", "SNS:Subscribe",
                       "SNS:ListSubscriptionsByTopic", "SNS:Publish"],
            "Resource": ctx.topic_arn(topic),
            "Condition": {"StringEquals": {"AWS:SourceOwner": ctx.account_id}},
        }],
    }, separators=(",", ":"))


def render(ctx: Context, topic: types.Topic, pending: int = 0) -> dict[str, str]:
    """GetTopicAttributes: what SNS returns for a topic (``pending``: its subscriptions
    waiting for confirmation)."""
    stored = {k: str(v) for k, v in (topic.attributes or {}).items() if v is not None}
    out = {
        "TopicArn": ctx.topic_arn(topic.name),
        "Owner": ctx.account_id,
        "Policy": default_policy(ctx, topic.name),
        "DisplayName": "",
        "SubscriptionsConfirmed": str(topic.subscriptions - pending),
        "SubscriptionsPending": str(pending),
        "SubscriptionsDeleted": "0",
        "EffectiveDeliveryPolicy": delivery_policy.effective(stored.get("DeliveryPolicy"), None).topic_json(),
    }  # SignatureVersion only when set, as SNS answers (unset, envelopes are signed with version 1)
    if topic.fifo:
        out["FifoTopic"] = "true"
        out["ContentBasedDeduplication"] = "false"
    out.update(stored)
    return out


def content_based_deduplication(topic: types.Topic) -> bool:
    return str((topic.attributes or {}).get("ContentBasedDeduplication", "false")).lower() == "true"


def signature_version(topic: types.Topic) -> str:
    """The SignatureVersion envelopes of this topic are signed with: the topic's, else 1
    (SHA1, SNS's default)."""
    return str((topic.attributes or {}).get("SignatureVersion") or "1")
