"""``conveyor send``, ``receive`` and ``peek``: messages from the shell."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from conveyor import types
from conveyor.cli import context, output
from conveyor.cli.output import Column
from conveyor.core import messages as ops

_COLUMNS = [
    Column("ID", "id"),
    Column("RECEIVES", "receive_count"),
    Column("SENT AT", "sent_at"),
    Column("VISIBLE AT", "vt"),
    Column("BODY", "body", output.preview),
]


def _emit_messages(obj: Any, found: list[types.Message]) -> None:
    # full bodies in JSON, previews in the table
    output.emit_rows(found, _COLUMNS, obj.as_json, empty="no messages")


def _parse_header(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> dict[str, str] | None:
    headers: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}")
        headers[key] = value
    return headers or None


def _read_body(body: str | None) -> str:
    if body is not None and body != "-":
        return body
    stdin = sys.stdin
    if stdin.isatty():
        output.note("reading the message body from stdin (end with Ctrl-D)")
    return stdin.read()


@click.command()
@click.argument("queue")
@click.argument("body", required=False)
@click.option("--header", "headers", multiple=True, metavar="KEY=VALUE", callback=_parse_header,
              help="A message header (repeatable); values are strings.")
@click.option("--delay", type=int, metavar="SECONDS", help="Hide the message this long (default: the queue's delay).")
@click.option("--group-id", metavar="ID", help="FIFO queues: the message group.")
@click.option("--dedup-id", metavar="ID", help="FIFO queues: the deduplication id.")
@click.option("--json-body", is_flag=True, help="The body is JSON: check that it parses, send it as application/json.")
@output.json_option
@click.pass_obj
def send(obj, queue: str, body: str | None, headers: dict[str, str] | None, delay: int | None,  # noqa: ANN001
         group_id: str | None, dedup_id: str | None, json_body: bool) -> None:
    """Send a message to QUEUE and print its id.

    The body is BODY, or standard input (read as is) when BODY is - or left out."""
    text = _read_body(body)
    if json_body:
        try:
            json.loads(text)
        except ValueError as exc:
            raise click.BadParameter(f"the body is not valid JSON: {exc}", param_hint="BODY") from None
    message = types.OutgoingMessage(body=text, headers=headers, delay=delay,
                                    content_type=types.JSON_CONTENT_TYPE if json_body else None,
                                    group_id=group_id, dedup_id=dedup_id)
    message_id = context.run(obj.settings(), lambda conn: ops.send(conn, queue, message))
    output.emit({"queue": queue, "id": message_id}, obj.as_json, str(message_id))


@click.command()
@click.argument("queue")
@click.option("--max", "qty", type=click.IntRange(1, 1000), default=1, show_default=True, metavar="N",
              help="Receive up to this many messages.")
@click.option("--vt", type=int, metavar="SECONDS",
              help="Hide received messages this long (default: the queue's visibility timeout).")
@click.option("--wait", type=click.IntRange(0, 60), default=0, show_default=True, metavar="SECONDS",
              help="Poll in the database up to this long while the queue is empty.")
@click.option("--delete", is_flag=True, help="Delete the messages after printing them.")
@output.json_option
@click.pass_obj
def receive(obj, queue: str, qty: int, vt: int | None, wait: int, delete: bool) -> None:  # noqa: ANN001
    """Receive (claim) messages from QUEUE.

    They stay hidden from other receivers for the visibility timeout, then come back
    unless deleted (--delete)."""

    async def action(conn: Any) -> None:
        found = await ops.receive(conn, queue, qty=qty, vt=vt, wait=wait)
        # print first: if printing fails the messages are not lost, they come back
        _emit_messages(obj, found)
        if delete and found:
            gone = await ops.delete(conn, queue, [m.id for m in found])
            output.note(f"deleted {len(gone)} message{'s' if len(gone) != 1 else ''}")

    context.run(obj.settings(), action)


@click.command()
@click.argument("queue")
@click.option("--max", "qty", type=click.IntRange(1, 10000), default=10, show_default=True, metavar="N",
              help="Show up to this many messages.")
@output.json_option
@click.pass_obj
def peek(obj, queue: str, qty: int) -> None:  # noqa: ANN001
    """Show messages of QUEUE without receiving them.

    The oldest first, visible or not; nothing about them changes."""
    found = context.run(obj.settings(), lambda conn: ops.peek(conn, queue, qty=qty))
    _emit_messages(obj, found)
