"""``conveyor topics``: topics, routing-key subscriptions, publishing and the webhook
outbox from the shell (docs/topics.md).

Subscriptions bind a routing-key pattern (``*`` one segment, ``#`` zero or more) to a
queue or an HTTP(S) endpoint; as in the REST API they deliver the raw message unless
``--envelope`` asks for the signed SNS envelope. Publishing signs envelopes with the
stored key (created on first use), as the server does."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import click

from conveyor import types
from conveyor.cli import context, output
from conveyor.cli.output import Column
from conveyor.core import filter_policy as filter_policy_ops
from conveyor.core import signing
from conveyor.core import topics as ops

_TOPIC_COLUMNS = [
    Column("NAME", "name"),
    Column("FIFO", "fifo"),
    Column("SUBSCRIPTIONS", "subscriptions"),
    Column("CREATED AT", "created_at"),
]

_SUBSCRIPTION_COLUMNS = [
    Column("ID", "id"),
    Column("PATTERN", "pattern"),
    Column("PROTOCOL", "protocol"),
    Column("TARGET", lambda s: s.queue if s.protocol == "sqs" else s.endpoint),
    Column("DELIVERY", lambda s: "raw" if s.raw_delivery else "envelope"),
    Column("FILTER", lambda s: None if s.filter_policy is None else json.dumps(s.filter_policy),
           lambda v: output.preview(v, 40)),
    Column("UUID", "uuid"),
]

_DELIVERY_COLUMNS = [
    Column("ID", "id"),
    Column("SUBSCRIPTION", "subscription_id"),
    Column("STATE", "state"),
    Column("ATTEMPTS", lambda d: f"{d.attempt}/{d.max_attempts}", right=True),
    Column("NEXT ATTEMPT", "next_attempt_at"),
    Column("ENDPOINT", "endpoint", lambda v: output.preview(v, 40)),
    Column("LAST ERROR", lambda d: d.held_reason or d.last_error, lambda v: output.preview(v, 50)),
]


def _pairs(items: Sequence[str], what: str) -> dict[str, str]:
    """``KEY=VALUE`` options as a dict."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint=what)
        out[key] = value
    return out


def _read_message(message: str | None) -> str:
    if message is not None and message != "-":
        return message
    if sys.stdin.isatty():
        output.note("reading the message from stdin (end with Ctrl-D)")
    return sys.stdin.read()



def _topic_pairs(t: types.Topic) -> list[tuple[str, Any]]:
    pairs: list[tuple[str, Any]] = [("name", t.name), ("fifo", t.fifo), ("subscriptions", t.subscriptions),
                                    ("created at", t.created_at)]
    pairs += [(f"attribute {k}", output.preview(str(v), 70)) for k, v in sorted(t.attributes.items())]
    pairs += [(f"tag {k}", v) for k, v in sorted(t.tags.items())]
    return pairs


def _subscription_pairs(s: types.Subscription) -> list[tuple[str, Any]]:
    return [("id", s.id), ("uuid", s.uuid), ("pattern", s.pattern), ("protocol", s.protocol),
            ("queue", s.queue), ("endpoint", s.endpoint),
            ("delivery", "raw" if s.raw_delivery else "envelope"),
            ("filter policy", None if s.filter_policy is None else json.dumps(s.filter_policy)),
            ("filter policy scope", s.filter_policy_scope), ("confirmed", s.confirmed),
            ("created at", s.created_at)]


@click.group()
def topics() -> None:
    """Topics and routing-key fan-out: subscribe queues and webhooks, publish, inspect
    webhook deliveries."""


# -- topics --------------------------------------------------------------------------------

@topics.command("list")
@click.option("--prefix", metavar="P", help="Only topics whose name starts with P.")
@output.json_option
@click.pass_obj
def list_(obj, prefix: str | None) -> None:  # noqa: ANN001
    """List topic objects (name order)."""
    found = context.run(obj.settings(), lambda conn: ops.list_all(conn, prefix=prefix))
    output.emit_rows(found, _TOPIC_COLUMNS, obj.as_json, empty="no topics")


@topics.command()
@click.argument("name")
@click.option("--attribute", "-a", "attributes", multiple=True, metavar="KEY=VALUE",
              help="A topic attribute (SNS names, e.g. DisplayName=Orders); repeatable.")
@click.option("--tag", "-t", "tags", multiple=True, metavar="KEY=VALUE", help="A tag; repeatable.")
@output.json_option
@click.pass_obj
def create(obj, name: str, attributes: tuple[str, ...], tags: tuple[str, ...]) -> None:  # noqa: ANN001
    """Create topic NAME (FIFO if it ends in .fifo), or show it if it exists."""
    attrs, tag_map = _pairs(attributes, "--attribute"), _pairs(tags, "--tag")
    t = context.run(obj.settings(), lambda conn: ops.create(conn, name, attrs, tag_map))
    output.emit(t, obj.as_json, lambda: output.record(_topic_pairs(t)))


@topics.command()
@click.argument("name")
@output.json_option
@click.pass_obj
def show(obj, name: str) -> None:  # noqa: ANN001
    """Show topic NAME and the subscriptions bound to its name."""

    async def action(conn: Any) -> tuple[types.Topic, list[types.Subscription]]:
        return await ops.get(conn, name), await ops.subscriptions_list(conn, pattern=name)

    t, subs = context.run(obj.settings(), action)

    def text() -> str:
        table = output.table(subs, _SUBSCRIPTION_COLUMNS) if subs else "no subscriptions"
        return f"{output.record(_topic_pairs(t))}\n\n{table}"

    output.emit({"topic": t, "subscriptions": subs}, obj.as_json, text)


@topics.command()
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@output.json_option
@click.pass_obj
def delete(obj, name: str, yes: bool) -> None:  # noqa: ANN001
    """Delete topic NAME and the subscriptions bound to its name."""

    context.remove(obj, "topic", name, find=ops.get, remove_it=ops.delete, done="deleted", yes=yes,
                   question=lambda t: f"Delete topic {name!r} and its {t.subscriptions} subscription(s)?")


# -- publishing ----------------------------------------------------------------------------

@topics.command()
@click.argument("routing_key")
@click.argument("message", required=False)
@click.option("--subject", metavar="TEXT", help="The envelope's Subject.")
@click.option("--attribute", "-a", "attributes", multiple=True, metavar="NAME=VALUE",
              help="A String message attribute (filter policies see it); repeatable.")
@click.option("--group-id", metavar="G", help="FIFO routing keys (ending in .fifo): the message group.")
@click.option("--dedup-id", metavar="D", help="FIFO routing keys: the deduplication id.")
@click.option("--delay", type=click.IntRange(0, 900), metavar="SECONDS",
              help="Seconds before the queue copies become visible.")
@output.json_option
@click.pass_obj
def publish(obj, routing_key: str, message: str | None, subject: str | None, attributes: tuple[str, ...],  # noqa: ANN001
            group_id: str | None, dedup_id: str | None, delay: int | None) -> None:
    """Publish MESSAGE to ROUTING_KEY: into every matching queue, and into the webhook
    outbox for every matching endpoint. The message is MESSAGE, or standard input when
    MESSAGE is - or left out."""
    attrs = {k: {"DataType": "String", "StringValue": v} for k, v in _pairs(attributes, "--attribute").items()}
    publication = types.Publication(body=_read_message(message), subject=subject, attributes=attrs or None,
                                    group_id=group_id, dedup_id=dedup_id, delay=delay)
    settings = obj.settings()
    urls = ops.urls(settings)

    async def action(conn: Any) -> types.Published:
        signer = await signing.load_or_create(conn)
        return await ops.publish(conn, routing_key, publication, signer=signer, urls=urls)

    p = context.run(settings, action)
    output.emit(p, obj.as_json, lambda: (
        f"published {p.message_id} to {len(p.queues)} queue(s)"
        + (f" ({', '.join(p.queues)})" if p.queues else "") + f" and {p.endpoints} endpoint(s)"))


# -- subscriptions -------------------------------------------------------------------------

@topics.command()
@click.argument("pattern")
@click.option("--queue", "-q", metavar="NAME", help="Deliver into this queue.")
@click.option("--endpoint", "-e", metavar="URL", help="Deliver by POST to this http:// or https:// URL.")
@click.option("--envelope", is_flag=True, help="Deliver the signed SNS envelope instead of the raw message.")
@click.option("--filter-policy", metavar="JSON", help="An SNS filter policy (JSON object).")
@click.option("--filter-policy-scope", type=click.Choice(types.FILTER_POLICY_SCOPES),
              default="MessageAttributes", show_default=True, help="What the filter policy looks at.")
@output.json_option
@click.pass_obj
def subscribe(obj, pattern: str, queue: str | None, endpoint: str | None, envelope: bool,  # noqa: ANN001
              filter_policy: str | None, filter_policy_scope: str) -> None:
    """Subscribe a queue (--queue) or an HTTP(S) endpoint (--endpoint) to PATTERN.

    PATTERN is a routing key whose segments may be * (exactly one segment) or # (zero or
    more); quote it in the shell. Subscribing the same target again shows the existing
    subscription."""
    if (queue is None) == (endpoint is None):
        raise click.UsageError("give exactly one of --queue and --endpoint")
    protocol = "sqs" if queue is not None else str(endpoint).split(":", 1)[0].lower()

    async def action(conn: Any) -> types.Subscription:
        policy = filter_policy_ops.validate(filter_policy, filter_policy_scope) if filter_policy else None
        return await ops.subscribe(conn, types.NewSubscription(
            pattern=pattern, protocol=protocol, queue=queue, endpoint=endpoint, raw_delivery=not envelope,
            filter_policy=policy, filter_policy_scope=filter_policy_scope))

    s = context.run(obj.settings(), action)
    output.emit(s, obj.as_json, lambda: output.record(_subscription_pairs(s)))


@topics.command()
@click.argument("subscription")
@output.json_option
@click.pass_obj
def unsubscribe(obj, subscription: str) -> None:  # noqa: ANN001
    """Delete SUBSCRIPTION (its id or uuid) and its pending webhook deliveries."""
    if not context.run(obj.settings(), lambda conn: ops.unsubscribe(conn, subscription)):
        raise click.ClickException(f"subscription {subscription!r} does not exist")
    output.emit({"subscription": subscription, "deleted": True}, obj.as_json,
                f"deleted subscription {subscription}")


@topics.command()
@click.argument("pattern", required=False)
@click.option("--queue", "-q", metavar="NAME", help="Only subscriptions delivering into this queue.")
@output.json_option
@click.pass_obj
def subscriptions(obj, pattern: str | None, queue: str | None) -> None:  # noqa: ANN001
    """List subscriptions: all, those of PATTERN (exactly as written), or of --queue."""
    found = context.run(obj.settings(), lambda conn: ops.subscriptions_list(conn, pattern=pattern, queue=queue))
    output.emit_rows(found, _SUBSCRIPTION_COLUMNS, obj.as_json, empty="no subscriptions")


# -- the webhook outbox --------------------------------------------------------------------

@topics.command()
@click.option("--state", type=click.Choice(types.DELIVERY_STATES), help="Only deliveries in this state.")
@click.option("--subscription", "-s", metavar="ID", help="Only deliveries of this subscription (id or uuid).")
@click.option("--max", "limit", type=click.IntRange(1, 10000), default=100, show_default=True, metavar="N",
              help="List at most N deliveries (oldest first).")
@click.option("--retry", is_flag=True,
              help="First make the held and exhausted deliveries listed due again, with fresh attempts.")
@output.json_option
@click.pass_obj
def deliveries(obj, state: str | None, subscription: str | None, limit: int, retry: bool) -> None:  # noqa: ANN001
    """List webhook deliveries waiting in the outbox: pending (to be attempted), held
    (never attempted: destination not allowed) or exhausted (every attempt failed)."""

    async def action(conn: Any) -> list[types.Delivery]:
        found = await ops.delivery_list(conn, state, subscription, limit)
        if retry:
            stuck = [d.id for d in found if d.state != "pending"]
            n = await ops.delivery_retry(conn, stuck) if stuck else 0
            output.note(f"retrying {n} deliver{'y' if n == 1 else 'ies'}")
            found = await ops.delivery_list(conn, state, subscription, limit)
        return found

    found = context.run(obj.settings(), action)
    output.emit_rows(found, _DELIVERY_COLUMNS, obj.as_json, empty="no deliveries")
