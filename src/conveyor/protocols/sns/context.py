"""Who is asking, where, and how SNS names map onto Conveyor topics.

SNS scopes topics per region (taken from the request's SigV4 credential scope) and per
account. As for SQS queues, Conveyor has one account (configurable id) and stores a topic
of a region other than the server's default under the name ``<region>:<name>``; topics of
the default region keep their plain names across SNS, REST, SQL and the CLI. A topic's
stored name is also the routing key a Publish uses and the pattern a Subscribe binds.

ARNs: ``arn:aws:sns:<region>:<account>:<topic>`` for topics and
``<topic ARN>:<subscription uuid>`` for subscriptions. A topic ARN must be of the
request's region (SNS answers "Invalid parameter: TopicArn" otherwise). An SQS
subscription names its queue by the queue's ARN ``arn:aws:sqs:<region>:<account>:<queue>``,
resolved as the SQS layer resolves it, or by its queue URL (``http://host/<account>/<queue>``,
as seed 000 subscribes queues), normalised to the same queue.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from conveyor import types
from conveyor.protocols.aws.service import RegionScope
from conveyor.protocols.broker import Broker
from conveyor.protocols.sns.errors import NO_SUBSCRIPTION, SnsError, invalid, not_found
from conveyor.protocols.sqs import context as sqs_context
from conveyor.protocols.sqs.context import is_valid_name as is_valid_queue_name

_TOPIC_NAME = re.compile(r"^[A-Za-z0-9_-]{1,256}$")
_FIFO_TOPIC_NAME = re.compile(r"^[A-Za-z0-9_-]{1,251}\.fifo$")
_ARN_TOPIC_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,256}$")  # any routing key (topics made over REST too)
_ARN = re.compile(r"^arn:aws[a-z-]*:(sns|sqs):([a-z0-9-]{1,32}):(\d{12}):(.+)$")
_QUEUE_URL = re.compile(r"^https?://[^/?#\s]+/[^?#\s]*$", re.IGNORECASE)


@dataclass(frozen=True)
class Context(RegionScope):
    broker: Broker
    action: str
    base_url: str
    request_id: str
    trace_header: str | None = None  # X-Amzn-Trace-Id: AWSTraceHeader of what a publish puts in queues

    @property
    def urls(self) -> types.TopicUrls:
        """What the topics engine needs to write ARNs and URLs into envelopes."""
        return types.TopicUrls(region=self.default_region, account_id=self.account_id, base_url=self.base_url)

    # -- names -----------------------------------------------------------------------

    def topic_arn(self, internal_name: str) -> str:
        return self.urls.topic_arn(internal_name)

    def subscription_arn(self, subscription: types.Subscription) -> str:
        return self.urls.subscription_arn(subscription.pattern, subscription.uuid)

    # -- resolving what clients send -------------------------------------------------

    def _parse(self, arn: str | None, service: str, parameter: str) -> tuple[str, str]:
        """(region, resource) of an ARN of this account; SNS's errors otherwise."""
        if arn is None:
            raise invalid(parameter)
        elements = len(arn.split(":"))
        if elements < 6:  # SNS's words for what is no ARN at all
            raise invalid(parameter, f"An ARN must have at least 6 elements, not {elements}")
        match = _ARN.match(arn)
        if not match or match[1] != service:
            raise invalid(parameter)
        _, region, account, resource = match.groups()
        if account != self.account_id:
            raise SnsError("AuthorizationErrorException",
                           f"User: arn:aws:iam::{self.account_id}:root is not authorized to perform: "
                           f"SNS:{self.action} on resource: {arn}")
        return region, resource

    def topic_from_arn(self, arn: str | None, parameter: str = "TopicArn") -> str:
        """The stored name of the topic an ARN names (not checked for existence). A topic
        of another region than the request's is refused, as SNS refuses it: a client
        reaches the topics of its own region only."""
        region, name = self._parse(arn, "sns", parameter)
        if not _ARN_TOPIC_NAME.match(name) or region != self.region:
            raise invalid(parameter)
        return self.internal(name)

    def subscription_from_arn(self, arn: str | None, parameter: str = "SubscriptionArn") -> tuple[str, uuid.UUID]:
        """(topic, subscription uuid) of a subscription ARN."""
        region, resource = self._parse(arn, "sns", parameter)
        name, sep, key = resource.rpartition(":")
        if not sep or not name:
            raise invalid("SubscriptionId")  # a topic's ARN, not a subscription's: SNS's words
        try:
            return self.internal(name, region), uuid.UUID(key)
        except ValueError:
            raise invalid("SubscriptionId") from None

    def queue_from_endpoint(self, endpoint: str | None) -> str:
        """The stored name of the SQS queue an SQS subscription's Endpoint names: its ARN
        (SNS's way) or its queue URL (seed 000's way; SNS refuses URLs)."""
        if endpoint and _QUEUE_URL.match(endpoint):
            return self._queue_from_url(endpoint)
        if not endpoint or not _ARN.match(endpoint):
            raise invalid("SQS endpoint ARN")
        region, name = self._parse(endpoint, "sqs", "SQS endpoint ARN")
        if not is_valid_queue_name(name):
            raise invalid("SQS endpoint ARN")
        return self.internal(name, region)

    def _queue_from_url(self, url: str) -> str:
        """A queue URL, ``http(s)://<any host>/<account>/<queue>`` (or a region's,
        ``.../queue/<region>/<account>/<queue>``) — the server's own or SQS's — resolved
        as the SQS layer resolves a QueueUrl: by its path, in the request's region unless
        the path names one."""
        try:
            path = urlsplit(url).path
        except ValueError:  # a malformed IPv6 host
            raise invalid("SQS endpoint ARN") from None
        resolved = sqs_context.resolve_path(tuple(unquote(p) for p in path.split("/") if p))
        if resolved is None:
            raise invalid("SQS endpoint ARN")
        region, account, name = resolved
        if account != self.account_id:
            raise SnsError("AuthorizationErrorException",
                           f"User: arn:aws:iam::{self.account_id}:root is not authorized to perform: "
                           f"SNS:{self.action} on resource: {url}")
        return self.internal(name, region)

    def check_subscription_topic(self, subscription: types.Subscription | None, topic: str) -> types.Subscription:
        """A subscription found by uuid belongs to the topic its ARN names, or is not found."""
        if subscription is None or subscription.pattern != topic:
            raise not_found(NO_SUBSCRIPTION)
        return subscription


def is_valid_topic_name(name: str) -> bool:
    return bool(_TOPIC_NAME.match(name) or _FIFO_TOPIC_NAME.match(name))
