"""SNS subscription actions: Subscribe, Unsubscribe, ConfirmSubscription, ListSubscriptions,
ListSubscriptionsByTopic, GetSubscriptionAttributes, SetSubscriptionAttributes.

Protocols: ``sqs`` (the Endpoint is the queue's ARN, or its URL; the queue need not exist
yet: what is published for it waits, held in the outbox, until it is created), ``http``
and ``https``. An SQS subscription is confirmed at once, as on SNS; an HTTP(S) one waits
for its endpoint to confirm it (``conveyor.protocols.sns.confirmation``): Subscribe answers
"pending confirmation" unless ReturnSubscriptionArn is set, and ListSubscriptions shows
it as "PendingConfirmation" until then. Whether an endpoint may be reached is decided at
delivery time by the egress allowlist: subscribing to a disallowed endpoint succeeds, and
its deliveries (its confirmation first) are held.

Unsubscribing: the Unsubscribe action needs credentials of the admin role (as the REST
API's DELETE of a subscription). Without credentials, only the link delivered to an HTTP(S)
endpoint (``UnsubscribeURL``, its token made by ``core.unsubscribe_links``) unsubscribes,
and only its own subscription: an ARN, which readers list, is not enough. Subscriptions that
AWS calls "authenticate on unsubscribe" refuse even the link: every queue subscription (a
queue is the account's own, and whoever may browse its messages sees their links), and an
HTTP(S) subscription confirmed with ``AuthenticateOnUnsubscribe=true``.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any
from urllib.parse import urlsplit

from conveyor import errors, json_input, types
from conveyor.core import delivery_policy, topics
from conveyor.protocols.sns import confirmation, topic_actions
from conveyor.protocols.sns.context import Context
from conveyor.protocols.sns.errors import NO_SUBSCRIPTION, SnsError, invalid, not_found

PROTOCOLS = ("sqs", "http", "https")
_SQS_ARN = re.compile(r"^arn:aws[a-z-]*:sqs:[a-z0-9-]{1,32}:\d{12}:[A-Za-z0-9_.-]{1,80}$")
OTHER_SNS_PROTOCOLS = ("email", "email-json", "sms", "lambda", "application", "firehose")
# subscription attributes kept as given (Conveyor stores and returns them)
KEPT = frozenset({"DeliveryPolicy", "RedrivePolicy", "SubscriptionRoleArn", "ReplayPolicy"})
JSON_VALUED = frozenset({"DeliveryPolicy", "RedrivePolicy", "ReplayPolicy", "FilterPolicy"})
SETTABLE = KEPT | {"RawMessageDelivery", "FilterPolicy", "FilterPolicyScope"}
MAX_ENDPOINT = 2048
PAGE = topic_actions.PAGE
AUTHENTICATE_ON_UNSUBSCRIBE = "AuthenticateOnUnsubscribe"  # kept in the subscription's attributes


# -- reading what clients send ---------------------------------------------------------------

def _bool(name: str, value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise invalid("Attributes", f"{name}: Invalid value [{value}]. Must be true or false.")
    return value.lower() == "true"


def _attribute_error(name: str, reason: str) -> SnsError:
    """SNS's words for a subscription attribute's bad value: "Invalid parameter: <Name>: <reason>"."""
    return SnsError("InvalidParameterException", f"Invalid parameter: {name}: {reason}")


def _check_json(name: str, value: str) -> dict[str, Any] | None:
    if value == "":
        return None
    try:
        parsed = json_input.loads(value, big_integers=True)
    except ValueError as exc:
        raise _attribute_error(name, f"failed to parse JSON. {exc}") from None
    if not isinstance(parsed, dict):
        raise _attribute_error(name, "must be a JSON object")
    return parsed


def _check_redrive(policy: dict[str, Any] | None, fifo_subscription: bool) -> None:
    """A subscription's RedrivePolicy names an SQS queue by ARN; a FIFO subscription (a FIFO
    queue of a FIFO topic) needs a FIFO dead-letter queue."""
    if policy is None:
        return
    target = policy.get("deadLetterTargetArn")
    if not isinstance(target, str) or not _SQS_ARN.match(target):
        raise _attribute_error("RedrivePolicy", "deadLetterTargetArn is an invalid arn")
    if fifo_subscription and not target.endswith(".fifo"):
        raise _attribute_error("RedrivePolicy", "must use a FIFO queue as DLQ for a FIFO Subscription to a "
                               "FIFO Topic.")


def _changes(given: dict[str, str], *, one: bool = False, fifo_subscription: bool = False) -> dict[str, Any]:
    """Subscription attributes (Subscribe's map, or ``one`` of SetSubscriptionAttributes)
    as the topics engine's changes."""
    changes: dict[str, Any] = {}
    kept: dict[str, str | None] = {}
    for name, value in given.items():
        if name not in SETTABLE:
            raise invalid("AttributeName") if one else invalid("Attributes", f"Unknown attribute {name}")
        if name in JSON_VALUED:
            parsed = _check_json(name, value)
            if name == "RedrivePolicy":
                _check_redrive(parsed, fifo_subscription)
            elif name == "DeliveryPolicy":
                try:
                    delivery_policy.subscription(value)
                except delivery_policy.Invalid as exc:
                    raise _attribute_error(name, str(exc)) from None
        if name == "RawMessageDelivery":
            changes["raw_delivery"] = _bool(name, value)
        elif name == "FilterPolicy":
            changes["filter_policy"] = value or None
            kept[name] = value or None  # the text as given, which GetSubscriptionAttributes returns
        elif name == "FilterPolicyScope":
            changes["filter_policy_scope"] = value
        else:
            kept[name] = value or None
    if kept:
        changes["attributes"] = kept
    return changes


def _check_endpoint(protocol: str, endpoint: str | None) -> str:
    if not endpoint:
        raise invalid("Endpoint")
    try:
        parts = urlsplit(endpoint)  # raises for a malformed IPv6 host ("https://[::1")
    except ValueError:
        raise invalid("Endpoint", "not a valid URL") from None
    if parts.scheme.lower() != protocol:
        raise invalid("Endpoint must match the specified protocol")
    try:
        parts.port  # noqa: B018 - raises for a port out of range
    except ValueError:
        raise invalid("Endpoint", "the port is not valid") from None
    if not parts.hostname or len(endpoint) > MAX_ENDPOINT or any(c.isspace() for c in endpoint):
        raise invalid("Endpoint", "not a valid URL")
    return endpoint


def _check_protocol(protocol: str | None) -> str:
    if not protocol:
        raise invalid("Protocol")
    if protocol in PROTOCOLS:
        return protocol
    if protocol in OTHER_SNS_PROTOCOLS:
        raise invalid("Protocol", f"Conveyor delivers to {', '.join(PROTOCOLS)} endpoints only, not {protocol}")
    raise invalid(f"Amazon SNS does not support this protocol string: {protocol}")


# -- answers -----------------------------------------------------------------------------------

def endpoint_of(ctx: Context, s: types.Subscription) -> str:
    return ctx.queue_arn(s.queue) if s.protocol == "sqs" and s.queue else (s.endpoint or "")


def summary(ctx: Context, s: types.Subscription) -> dict[str, str]:
    arn = ctx.subscription_arn(s) if s.confirmed else "PendingConfirmation"  # as SNS lists them
    return {"SubscriptionArn": arn, "Owner": ctx.account_id, "Protocol": s.protocol,
            "Endpoint": endpoint_of(ctx, s), "TopicArn": ctx.topic_arn(s.pattern)}


def attributes_of(ctx: Context, s: types.Subscription, topic: types.Topic | None = None) -> dict[str, str]:
    """GetSubscriptionAttributes; ``topic`` (None once deleted) gives an HTTP(S)
    subscription's delivery-policy defaults."""
    out = {
        **summary(ctx, s),
        "SubscriptionArn": ctx.subscription_arn(s),
        "ConfirmationWasAuthenticated": "true",
        "PendingConfirmation": "false" if s.confirmed else "true",
        "RawMessageDelivery": "true" if s.raw_delivery else "false",
        "SubscriptionPrincipal": f"arn:aws:iam::{ctx.account_id}:root",
    }
    if s.protocol in ("http", "https"):
        out["EffectiveDeliveryPolicy"] = delivery_policy.effective(
            str((topic.attributes or {}).get("DeliveryPolicy") or "") if topic else None,
            str((s.attributes or {}).get("DeliveryPolicy") or "")).subscription_json()
    if s.filter_policy is not None:
        out["FilterPolicy"] = filter_policy_text(s)
        out["FilterPolicyScope"] = s.filter_policy_scope
    out.update({k: str(v) for k, v in (s.attributes or {}).items() if k in KEPT and v is not None})
    return out


def filter_policy_text(s: types.Subscription) -> str:
    """The policy as the caller gave it over SNS (kept beside the parsed policy), unless
    the policy was changed since by another door (REST), which gives no text."""
    given = (s.attributes or {}).get("FilterPolicy")
    if isinstance(given, str):
        try:
            if json_input.loads(given, big_integers=True) == s.filter_policy:
                return given
        except ValueError:
            pass
    return json.dumps(s.filter_policy, separators=(",", ":"))


# -- actions -----------------------------------------------------------------------------------

async def _find(conn: Any, spec: types.NewSubscription) -> types.Subscription | None:
    for s in await topics.subscriptions_list(conn, pattern=spec.pattern):
        if s.protocol == spec.protocol and s.queue == spec.queue and (spec.queue is not None
                                                                      or s.endpoint == spec.endpoint):
            return s
    return None


def _same(existing: types.Subscription, given: dict[str, str]) -> bool:
    """Whether a repeated Subscribe asks for nothing the subscription does not have: only
    the attributes it names are compared (none, or a subset, name the same subscription)."""
    for name, value in given.items():
        if name == "RawMessageDelivery":
            same = existing.raw_delivery == (value.lower() == "true")
        elif name == "FilterPolicy":
            same = (existing.filter_policy or None) == (json.loads(value) if value else None)
        elif name == "FilterPolicyScope":
            same = existing.filter_policy_scope == value
        else:
            same = existing.attributes.get(name) == (value or None)
        if not same:
            return False
    return True


def _spec(ctx: Context, topic: str, p: dict[str, Any]) -> types.NewSubscription:
    """What a Subscribe asks for, checked. An SQS queue need not exist (SNS subscribes any
    well-formed queue ARN): until it is created, what is published for it waits."""
    protocol = _check_protocol(p.get("Protocol"))
    queue = endpoint = None
    if protocol == "sqs":
        queue = ctx.queue_from_endpoint(p.get("Endpoint"))
    else:
        endpoint = _check_endpoint(protocol, p.get("Endpoint"))
    fifo = topic.endswith(".fifo") and queue is not None and queue.endswith(".fifo")
    changes = _changes(p.get("Attributes") or {}, fifo_subscription=fifo)
    policy = changes.get("filter_policy")
    return types.NewSubscription(
        pattern=topic, protocol=protocol, queue=queue, endpoint=endpoint,
        raw_delivery=changes.get("raw_delivery", False),
        filter_policy=json_input.loads(policy, big_integers=True) if policy else None,
        filter_policy_scope=changes.get("filter_policy_scope", "MessageAttributes"),
        attributes={k: v for k, v in changes.get("attributes", {}).items() if v is not None},
        queue_must_exist=False,
        confirmed=protocol == "sqs",  # an HTTP(S) endpoint confirms first
    )


async def subscribe(ctx: Context, p: dict[str, Any]) -> dict[str, Any]:
    """The topic's existence is checked before anything else of the call, as SNS does: a
    missing topic is NotFound, whatever the protocol and endpoint."""
    topic = ctx.topic_from_arn(p.get("TopicArn"))
    async with ctx.broker.connection() as conn:
        found = await topic_actions.get_topic(ctx, conn, topic)
        spec = _spec(ctx, topic, p)
        _check_fit(found, spec)
        existing = await _find(conn, spec)
        if existing is not None:
            if not _same(existing, p.get("Attributes") or {}):
                raise invalid("Attributes", "Subscription already exists with different attributes")
            created = existing
        else:
            created = await _create(conn, spec)
    if not created.confirmed:  # asked again while pending: SNS sends the confirmation again
        await confirmation.send(ctx, found, created)
        if not p.get("ReturnSubscriptionArn"):
            return {"SubscriptionArn": "pending confirmation"}
    return {"SubscriptionArn": ctx.subscription_arn(created)}


async def _create(conn: Any, spec: types.NewSubscription) -> types.Subscription:
    try:
        return await topics.subscribe(conn, spec)
    except errors.InvalidInput as exc:  # the filter policy: as Subscribe's Attributes words it
        prefix = "Invalid parameter: "
        if exc.message.startswith(prefix + "FilterPolicy"):
            raise SnsError("InvalidParameterException",
                           f"{prefix}Attributes Reason: {exc.message[len(prefix):]}") from None
        raise


def _check_fit(topic: types.Topic, spec: types.NewSubscription) -> None:
    """FIFO topics deliver to SQS queues only; a FIFO queue takes only a FIFO topic."""
    if topic.fifo and spec.protocol != "sqs":
        raise invalid("Protocol", f"Invalid protocol type: {spec.protocol}. FIFO topics deliver to SQS queues only")
    if spec.queue is not None and spec.queue.endswith(".fifo") and not topic.fifo:
        # SNS's wording, "Invalid parameter: " doubled and all
        raise invalid("Invalid parameter: Endpoint", "FIFO SQS Queues can not be subscribed to standard SNS topics")


async def _subscription(ctx: Context, conn: Any, arn: str | None) -> types.Subscription:
    topic, key = ctx.subscription_from_arn(arn)
    try:
        found = await topics.subscription_get(conn, key)
    except errors.SubscriptionNotFound:
        found = None
    return ctx.check_subscription_topic(found, topic)


async def unsubscribe(ctx: Context, p: dict[str, Any]) -> None:
    """Unsubscribing twice succeeds (the subscription is gone either way)."""
    topic, key = ctx.subscription_from_arn(p.get("SubscriptionArn"))
    async with ctx.broker.connection() as conn:
        try:
            found = await topics.subscription_get(conn, key)
        except errors.SubscriptionNotFound:
            return None
        if found.pattern == topic:
            await topics.unsubscribe(conn, key)
    return None


def needs_authentication(s: types.Subscription) -> bool:
    """Whether only an authenticated Unsubscribe may remove the subscription, not its link."""
    return s.protocol == "sqs" or (s.attributes or {}).get(AUTHENTICATE_ON_UNSUBSCRIBE) == "true"


async def unsubscribe_by_link(ctx: Context, p: dict[str, Any], token: str | None) -> None:
    """The credential-free link: refused unless its token is the subscription's. A valid
    link of a subscription gone already succeeds, as Unsubscribe does."""
    arn = p.get("SubscriptionArn")
    topic, key = ctx.subscription_from_arn(arn)
    if not ctx.broker.unsubscribe_links.valid(key, token):
        raise SnsError("AuthorizationErrorException", "This unsubscribe link is not valid: without credentials, "
                       "only the UnsubscribeURL delivered to a subscription's HTTP(S) endpoint (with its Token) "
                       "unsubscribes it; otherwise call Unsubscribe with credentials.")
    async with ctx.broker.connection() as conn:
        try:
            found = await topics.subscription_get(conn, key)
        except errors.SubscriptionNotFound:
            return None
        if found.pattern != topic:
            return None
        if needs_authentication(found):
            raise SnsError("AuthorizationErrorException", f"Subscription {arn} requires authentication to "
                           "unsubscribe: call Unsubscribe with credentials.")
        await topics.unsubscribe(conn, key)
    return None


def _authenticate_on_unsubscribe(value: str | None) -> bool:
    if value is None or value.lower() in ("", "false"):
        return False
    if value.lower() != "true":
        raise invalid("AuthenticateOnUnsubscribe")
    return True


async def confirm_subscription(ctx: Context, p: dict[str, Any]) -> dict[str, Any]:
    """The token a SubscriptionConfirmation carried confirms its subscription (and only on
    the topic it names); a made-up one is SNS's "Invalid parameter: Token", a malformed
    one its "Invalid token"."""
    topic = ctx.topic_from_arn(p.get("TopicArn"))
    token = p.get("Token")
    if not token:
        raise invalid("Token")
    locked = _authenticate_on_unsubscribe(p.get("AuthenticateOnUnsubscribe"))
    key = confirmation.subscription_of(ctx, token)
    async with ctx.broker.connection() as conn:
        try:
            found = await topics.subscription_get(conn, key)
        except errors.SubscriptionNotFound:
            raise invalid("Token") from None
        if found.pattern != topic:
            raise invalid("Token")
        if locked and not needs_authentication(found):  # as on AWS, a confirmation can only lock it
            found = await topics.subscription_set_attributes(
                conn, found.uuid, {"confirmed": True, "attributes": {AUTHENTICATE_ON_UNSUBSCRIBE: "true"}})
        elif not found.confirmed:
            found = await topics.confirm(conn, found.uuid)
    return {"SubscriptionArn": ctx.subscription_arn(found)}


def _after_id(token: str | None) -> int:
    raw = topic_actions.decode_token(token)
    if raw and not raw.isdigit():
        raise invalid("NextToken")
    return int(raw or 0)


async def _page(ctx: Context, pattern: str | None, token: str | None) -> dict[str, Any]:
    after = _after_id(token)
    found: list[types.Subscription] = []
    async with ctx.broker.connection() as conn:
        while len(found) <= PAGE:
            page = await topics.subscriptions_list(conn, pattern=pattern, after_id=after, limit=PAGE * 2)
            found += [s for s in page if ctx.visible(s.pattern)]
            if len(page) < PAGE * 2:
                break
            after = page[-1].id
    out: dict[str, Any] = {"Subscriptions": [summary(ctx, s) for s in found[:PAGE]]}
    if len(found) > PAGE:
        out["NextToken"] = topic_actions.encode_token(str(found[PAGE - 1].id))
    return out


async def list_subscriptions(ctx: Context, p: dict[str, Any]) -> dict[str, Any]:
    return await _page(ctx, None, p.get("NextToken"))


async def list_subscriptions_by_topic(ctx: Context, p: dict[str, Any]) -> dict[str, Any]:
    topic = ctx.topic_from_arn(p.get("TopicArn"))
    async with ctx.broker.connection() as conn:
        await topic_actions.get_topic(ctx, conn, topic)
    return await _page(ctx, topic, p.get("NextToken"))


async def get_subscription_attributes(ctx: Context, p: dict[str, Any]) -> dict[str, Any]:
    async with ctx.broker.connection() as conn:
        found = await _subscription(ctx, conn, p.get("SubscriptionArn"))
        topic = None
        if found.protocol in ("http", "https"):
            with contextlib.suppress(errors.TopicNotFound):
                topic = await topics.get(conn, found.pattern)
    return {"Attributes": attributes_of(ctx, found, topic)}


async def set_subscription_attributes(ctx: Context, p: dict[str, Any]) -> None:
    name = p.get("AttributeName")
    if not name:
        raise invalid("AttributeName")
    async with ctx.broker.connection() as conn:
        found = await _subscription(ctx, conn, p.get("SubscriptionArn"))
        fifo = found.pattern.endswith(".fifo") and found.queue is not None and found.queue.endswith(".fifo")
        changes = _changes({name: p.get("AttributeValue") or ""}, one=True, fifo_subscription=fifo)
        try:
            await topics.subscription_set_attributes(conn, found.uuid, changes)
        except errors.SubscriptionNotFound:
            raise not_found(NO_SUBSCRIPTION) from None

