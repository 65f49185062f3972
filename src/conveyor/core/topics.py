"""Topic operations: topic objects, subscriptions, publish (fan-out), the webhook outbox.

A subscription binds a routing-key pattern (``*`` one segment, ``#`` zero or more) to a
queue or an HTTP(S) endpoint; a publish to a routing key lands in every matching queue
and writes one outbox row per matching endpoint, all in one SQL call inside the caller's
transaction. SNS topics are topic objects whose name is the routing key; an SNS Subscribe
binds the topic's name as the pattern. See docs/topics.md.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID

import orjson

from conveyor import crypto, errors, types
from conveyor.core import delivery_policy, filter_policy, messages, signing
from conveyor.db import execute as db
from conveyor.settings import Settings

Connection = db.Connection

SubscriptionRef = UUID | int | str  # a subscription's uuid, id, or either as text

# -- topics ---------------------------------------------------------------------------------


async def create(conn: Connection, name: str, attributes: Mapping[str, Any] | None = None,
                 tags: Mapping[str, str] | None = None) -> types.Topic:
    """Create a topic, or return it if it exists (given attributes and tags are merged in,
    as SNS's CreateTopic does for an existing topic with equal attributes)."""
    return await db.fetch_row(conn, "topic_create", {"name": name, "attributes": dict(attributes or {}),
                                                     "tags": dict(tags or {})}, row=types.Topic)


async def delete(conn: Connection, name: str) -> bool:
    """Delete a topic and every subscription whose pattern is its name; False if absent."""
    return bool(await db.fetch_value(conn, "topic_delete", {"name": name}))


async def get(conn: Connection, name: str) -> types.Topic:
    """A topic; raises errors.TopicNotFound."""
    return await db.fetch_row(conn, "topic_get", {"name": name}, row=types.Topic)


async def list_all(conn: Connection, prefix: str | None = None, after: str | None = None,
                   limit: int | None = None) -> list[types.Topic]:
    """Topics by name, optionally those starting with ``prefix`` and after the name
    ``after`` (for paging), at most ``limit``."""
    return await db.fetch_all(conn, "topic_list", {"prefix": prefix, "after": after, "limit": limit},
                              row=types.Topic)


async def set_attributes(conn: Connection, name: str, attributes: Mapping[str, Any]) -> types.Topic:
    """Merge attributes into the topic's (a None value removes one)."""
    return await db.fetch_row(conn, "topic_set_attributes", {"name": name, "attributes": dict(attributes)},
                              row=types.Topic)


async def tag(conn: Connection, name: str, tags: Mapping[str, str | None]) -> dict[str, str]:
    """Add or change tags (a None value removes the tag); returns all tags."""
    return await db.fetch_scalar(conn, "topic_tag", {"name": name, "tags": dict(tags)}, dict)


async def untag(conn: Connection, name: str, keys: Sequence[str]) -> dict[str, str]:
    return await db.fetch_scalar(conn, "topic_untag", {"name": name, "keys": list(keys)}, dict)


# -- subscriptions ----------------------------------------------------------------------------


async def subscribe(conn: Connection, spec: types.NewSubscription) -> types.Subscription:
    """Bind a pattern to a queue or endpoint. Subscribing the same (pattern, queue) or
    (pattern, endpoint) again returns the existing subscription unchanged. The filter
    policy is validated here (errors.InvalidInput with SNS-like messages). A queue that
    does not exist is errors.QueueNotFound, unless ``spec.queue_must_exist`` is False:
    then publishes wait for it in the outbox, held, and go into it once it is created."""
    policy = None
    if spec.filter_policy is not None:
        policy = filter_policy.validate(spec.filter_policy, spec.filter_policy_scope)
    return await db.fetch_row(conn, "subscription_create", {
        "pattern": spec.pattern,
        "protocol": spec.protocol,
        "queue": spec.queue,
        "endpoint": spec.endpoint,
        "raw_delivery": spec.raw_delivery,
        "filter_policy": policy,
        "filter_policy_scope": spec.filter_policy_scope,
        "attributes": dict(spec.attributes or {}),
        "confirmed": spec.confirmed,
        "queue_must_exist": spec.queue_must_exist,
    }, row=types.Subscription)


async def unsubscribe(conn: Connection, ref: SubscriptionRef) -> bool:
    """Delete a subscription (its pending webhook deliveries go with it); False if absent."""
    return bool(await db.fetch_value(conn, "subscription_delete", {"ref": _ref(ref)}))


async def subscription_get(conn: Connection, ref: SubscriptionRef) -> types.Subscription:
    """A subscription by uuid or id; raises errors.SubscriptionNotFound."""
    return await db.fetch_row(conn, "subscription_get", {"ref": _ref(ref)}, row=types.Subscription)


async def subscription_set_attributes(conn: Connection, ref: SubscriptionRef,
                                      changes: Mapping[str, Any]) -> types.Subscription:
    """Change a subscription. ``changes`` keys: ``raw_delivery`` (bool),
    ``filter_policy`` (a policy as JSON text or dict; None or {} removes it),
    ``filter_policy_scope`` ('MessageAttributes' | 'MessageBody'), ``confirmed`` (bool),
    ``attributes`` ({name: value}, merged; a None value removes one). The resulting
    policy is validated against the resulting scope."""
    changes = dict(changes)
    if "filter_policy" in changes or "filter_policy_scope" in changes:
        current = await subscription_get(conn, ref)
        scope = changes.get("filter_policy_scope", current.filter_policy_scope)
        policy = changes.get("filter_policy", current.filter_policy)
        if policy in (None, "", {}):
            policy = None
        elif scope not in types.FILTER_POLICY_SCOPES:
            raise errors.InvalidInput(f"Invalid parameter: FilterPolicyScope: Invalid value [{scope}]. "
                                      "Please use either MessageBody or MessageAttributes")
        else:
            policy = filter_policy.validate(policy, scope)
        if "filter_policy" in changes:
            changes["filter_policy"] = policy
    return await db.fetch_row(conn, "subscription_set_attributes", {"ref": _ref(ref), "changes": changes},
                              row=types.Subscription)


async def send_to_endpoint(conn: Connection, subscription: UUID, payload: str, headers: Mapping[str, str],
                           message_id: UUID) -> int:
    """Queue a message of the server's own making (SNS's SubscriptionConfirmation) for an
    HTTP(S) subscription's endpoint, delivered by the webhook worker as any delivery is;
    returns the outbox row's id."""
    return int(await db.fetch_value(conn, "delivery_send", {
        "subscription": subscription, "payload": payload, "headers": dict(headers), "message_id": message_id}))


async def confirm(conn: Connection, ref: SubscriptionRef) -> types.Subscription:
    """Mark a subscription confirmed (SNS ConfirmSubscription); returns it."""
    return await subscription_set_attributes(conn, ref, {"confirmed": True})


async def subscriptions_list(conn: Connection, *, pattern: str | None = None, queue: str | None = None,
                             after_id: int = 0, limit: int | None = None) -> list[types.Subscription]:
    """Subscriptions in id order: all, those of one pattern (exactly), or those
    delivering to one queue; ``after_id``/``limit`` page through them."""
    return await db.fetch_all(conn, "subscription_list", {"pattern": pattern, "queue": queue,
                                                          "after_id": after_id, "limit": limit},
                              row=types.Subscription)


def _ref(ref: SubscriptionRef) -> str:
    return str(ref)


# -- publish ------------------------------------------------------------------------------------


def timestamp(now: dt.datetime | None = None) -> str:
    """SNS's Timestamp: ISO 8601 UTC with milliseconds and a Z."""
    now = (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


def envelope_fields(routing_key: str, publication: types.Publication, message_id: UUID, ts: str,
                    urls: types.TopicUrls, body: str | None = None) -> dict[str, str]:
    """The signed fields of a Notification envelope (without the signature)."""
    fields = {"Type": "Notification", "MessageId": str(message_id), "TopicArn": urls.topic_arn(routing_key),
              "Message": publication.body if body is None else body, "Timestamp": ts}
    if publication.subject is not None:
        fields["Subject"] = publication.subject
    return fields


def publish_message(routing_key: str, publication: types.Publication, *, signer: signing.Signer | None,
                    urls: types.TopicUrls, now: dt.datetime | None = None) -> dict[str, Any]:
    """The JSON message ``conveyor.topic_publish`` takes: the publication plus what the
    envelope needs, signed once (per distinct body). Pure; ``publish`` sends it."""
    message_id = publication.message_id or uuid.uuid4()
    ts = timestamp(now)
    message: dict[str, Any] = {
        "body": publication.body,
        "subject": publication.subject,
        "attributes": publication.attributes or None,
        "group_id": publication.group_id,
        "dedup_id": publication.dedup_id,
        "delay": publication.delay,
        "message_id": str(message_id),
        "timestamp": ts,
        "content_type": publication.content_type,
        "topic_arn": urls.topic_arn(routing_key),
        "region": urls.region,
        "account_id": urls.account_id,
        "unsubscribe_url": urls.unsubscribe_url_prefix,
        "system_attributes": publication.system_attributes or None,
    }
    if publication.bodies:
        message["bodies"] = dict(publication.bodies)
    if signer is not None and publication.signed:
        version = publication.signature_version
        message["signature_version"] = version
        message["signing_cert_url"] = urls.signing_cert_url(signer.digest)
        message["signature"] = signer.sign(envelope_fields(routing_key, publication, message_id, ts, urls), version)
        if publication.bodies:
            message["signatures"] = {
                protocol: signer.sign(envelope_fields(routing_key, publication, message_id, ts, urls, body), version)
                for protocol, body in publication.bodies.items()}
    return {k: v for k, v in message.items() if v is not None}


def header_attribute(value: Any) -> dict[str, str]:
    """A header value (REST, schedules) as an SNS message attribute: a string as String, a
    number as Number, a list of strings and numbers as String.Array, anything else as its
    JSON text."""
    if isinstance(value, str):
        return {"DataType": "String", "StringValue": value}
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {"DataType": "Number", "StringValue": orjson.dumps(value).decode()}
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value):
        return {"DataType": "String.Array", "StringValue": orjson.dumps(value).decode()}
    return {"DataType": "String", "StringValue": orjson.dumps(value).decode()}


def urls(settings: Settings, base_url: str | None = None) -> types.TopicUrls:
    """ARNs and the URLs in SNS envelopes: CONVEYOR_BASE_URL if set, else the base URL a
    client used (``base_url``), else the server's own address (background work, the CLI)."""
    return types.TopicUrls(region=settings.region, account_id=settings.account_id,
                           base_url=settings.base_url or base_url or f"http://{settings.host}:{settings.port}")


async def publish(conn: Connection, routing_key: str, publication: types.Publication, *,
                  signer: signing.Signer | None, urls: types.TopicUrls,
                  keyring: crypto.Keyring | None = None) -> types.Published:
    """Fan a message out to every subscription whose pattern matches ``routing_key`` and
    whose filter policy accepts it: one insert per matching queue and one outbox row per
    matching endpoint, in one SQL call inside the caller's transaction (a rollback
    publishes nothing). ``signer`` None leaves envelopes unsigned. Queue waiters wake on
    commit as for any send. Copies for encrypted queues are sealed with ``keyring`` and
    sent in the same transaction (without one, such a publish is refused whole)."""
    if "\x00" in publication.body or any("\x00" in b for b in (publication.bodies or {}).values()):
        raise errors.InvalidInput("message bodies cannot contain NUL characters (U+0000)")
    message = publish_message(routing_key, publication, signer=signer, urls=urls)
    # one transaction with the sealed copies' sends: the caller's own (a connection not in
    # autocommit: publish is part of it), else one opened here
    async with conn.transaction() if conn.autocommit else contextlib.nullcontext():
        row = await db.fetch_one(conn, "topic_publish", {"routing_key": routing_key, "message": message})
        if row is None:
            raise errors.InternalError("topic_publish returned no row")
        queues, endpoints, sequence_number, stored, to_seal = row
        copies = tuple(types.StoredCopy(queue=c["queue"], id=int(c["id"]), message_uuid=UUID(c["message_id"]))
                       for c in stored or ())
        copies += await _send_sealed(conn, to_seal or [], keyring)
    return types.Published(message_id=UUID(message["message_id"]), timestamp=message["timestamp"],
                           queues=tuple(queues or ()), endpoints=int(endpoints), sequence_number=sequence_number,
                           messages=copies)


async def _send_sealed(conn: Connection, copies: list[dict[str, Any]],
                       keyring: crypto.Keyring | None) -> tuple[types.StoredCopy, ...]:
    """The copies topic_publish left for encrypted queues, sealed and sent."""
    done: list[types.StoredCopy] = []
    for copy in copies:
        if keyring is None:
            raise errors.Unavailable(f"queue {copy['queue']!r} is encrypted and this server has no encryption key "
                                     "(CONVEYOR_ENCRYPTION_KEY): nothing was published")
        body, content_type = keyring.seal(copy["body"], copy.get("content_type"))
        outgoing = types.OutgoingMessage(body=body, content_type=content_type, headers=copy.get("headers"),
                                         delay=copy.get("delay"), group_id=copy.get("group_id"),
                                         dedup_id=copy.get("dedup_id"),
                                         system_attributes=copy.get("system_attributes"))
        [sent] = await messages.send_batch(conn, copy["queue"], [outgoing])
        done.append(types.StoredCopy(queue=copy["queue"], id=sent.id, message_uuid=sent.message_uuid))
    return tuple(done)


# -- routing keys and patterns ----------------------------------------------------------------


async def pattern_matches(conn: Connection, pattern: str, routing_key: str) -> bool:
    """Whether a pattern matches a routing key (both validated; errors.InvalidInput)."""
    return bool(await db.fetch_value(conn, "topic_pattern_matches", {"pattern": pattern, "key": routing_key}))


async def filter_matches(conn: Connection, policy: Mapping[str, Any] | str, scope: str,
                         attributes: Mapping[str, Any] | None, body: str) -> bool:
    """Whether a (validated) filter policy accepts a message, as a publish decides it."""
    policy = filter_policy.validate(policy, scope)
    return bool(await db.fetch_value(conn, "topic_filter_matches", {
        "policy": policy, "scope": scope, "attributes": dict(attributes or {}), "body": body}))


# -- the webhook outbox -------------------------------------------------------------------------


async def delivery_claim(conn: Connection, limit: int, lease_seconds: int) -> list[types.Delivery]:
    """Claim up to ``limit`` due webhook deliveries (not held, not exhausted) with SKIP
    LOCKED, pushing each one's next_attempt_at ``lease_seconds`` ahead so that a worker
    that dies mid-delivery gives them back when the lease ends. Each claimed row's
    ``attempt`` is the number of attempts made before this one."""
    return await db.fetch_all(conn, "delivery_claim", {"limit": limit, "lease_seconds": lease_seconds},
                              row=types.Delivery)


async def delivery_succeeded(conn: Connection, ids: Sequence[int]) -> int:
    """Delivered (2xx): delete the rows; returns how many existed."""
    return int(await db.fetch_value(conn, "delivery_succeeded", {"ids": list(ids)}))


async def delivery_failed(conn: Connection, delivery_id: int, error: str, retry_in: float,
                          attempts: int, region: str | None = None) -> types.Delivery:
    """An attempt failed: count it and schedule the next one ``retry_in`` seconds later, out
    of ``attempts`` in all (its delivery policy's, ``core.delivery_policy``); a row that used
    its last attempt is answered ``state`` 'exhausted': it goes to its subscription's
    dead-letter queue (RedrivePolicy; queue names as in ``region``) if that queue exists,
    else it stays with the error. Raises errors.DeliveryNotFound if the row is gone."""
    return await db.fetch_row(conn, "delivery_failed", {"id": delivery_id, "error": error, "retry_in": retry_in,
                                                        "attempts": attempts, "region": region}, row=types.Delivery)


async def delivery_defer(conn: Connection, ids: Sequence[int], seconds: float) -> int:
    """Claimed rows not attempted (their subscription's throttle): due again ``seconds``
    later, no attempt counted."""
    return int(await db.fetch_value(conn, "delivery_defer", {"ids": list(ids), "seconds": seconds}))


async def delivery_policies(conn: Connection,
                            deliveries: Sequence[types.Delivery]) -> dict[int, delivery_policy.Effective]:
    """The effective delivery policy (``core.delivery_policy.Effective``) of each
    delivery's subscription, by delivery id: the subscription's DeliveryPolicy over its
    topic's (the topic the message was published to)."""
    wanted = {(d.subscription_id, _topic_of(d)) for d in deliveries}
    rows = await db.fetch_all(conn, "delivery_policies", {"subscription_ids": [s for s, _ in wanted],
                                                          "topics": [t for _, t in wanted]})
    found = {(sub, topic): delivery_policy.effective(topic_policy, sub_policy)
             for sub, topic, sub_policy, topic_policy in rows}
    return {d.id: found.get((d.subscription_id, _topic_of(d)), delivery_policy.DEFAULT) for d in deliveries}


def _topic_of(delivery: types.Delivery) -> str:
    """The topic a delivery's message was published to, from its SNS TopicArn header."""
    return str((delivery.headers or {}).get("x-amz-sns-topic-arn", "")).rpartition(":")[2]


async def delivery_hold(conn: Connection, delivery_id: int, reason: str) -> types.Delivery:
    """Hold a delivery that must not be attempted (e.g. its destination is not allowed):
    kept with the reason, never claimed again until released."""
    return await db.fetch_row(conn, "delivery_hold", {"id": delivery_id, "reason": reason},
                              row=types.Delivery)


async def delivery_retry(conn: Connection, ids: Sequence[int] | None = None) -> int:
    """Make held or exhausted deliveries due again with a fresh set of attempts (all of
    them when ``ids`` is None); returns how many."""
    return int(await db.fetch_value(conn, "delivery_retry", {"ids": None if ids is None else list(ids)}))


async def delivery_list(conn: Connection, state: str | None = None, subscription: SubscriptionRef | None = None,
                        limit: int = 100) -> list[types.Delivery]:
    """Outbox rows for inspection, oldest first: all, or those in ``state`` ('pending',
    'held', 'exhausted'), optionally of one subscription."""
    if state is not None and state not in types.DELIVERY_STATES:
        raise errors.InvalidInput(f"delivery state must be one of {', '.join(types.DELIVERY_STATES)}")
    return await db.fetch_all(conn, "delivery_list", {
        "state": state, "subscription": None if subscription is None else _ref(subscription), "limit": limit},
        row=types.Delivery)


async def deliveries_stats(conn: Connection) -> types.DeliveryStats:
    """Counts of the outbox by state, for metrics and status."""
    return await db.fetch_row(conn, "delivery_stats", None, row=types.DeliveryStats)
