"""``conveyor streams``: event streams from the shell — create and configure them, append,
subscribe consumers, receive and acknowledge batches, retry, dead letters, and the ticker
and maintenance that a server would otherwise run.

JSON shows durations (periods, ages, lags) as seconds and rates as numbers."""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

import click

from conveyor import types
from conveyor.cli import context, output
from conveyor.cli.output import Column
from conveyor.core import streams as ops

# option name -> stream option; intervals are given in seconds, the database checks ranges
_INTERVAL_OPTIONS = ("rotation_period", "ticker_max_lag", "ticker_idle_period", "event_ttl")
_COUNT_OPTIONS = ("ticker_max_count", "max_retries")


# -- JSON and formatting -------------------------------------------------------------------

def seconds(value: dt.timedelta) -> int | float:
    """A duration as seconds: whole when it is, else to the millisecond."""
    s = value.total_seconds()
    return int(s) if s == int(s) else round(s, 3)


def _plain(value: Any) -> Any:
    if isinstance(value, dt.timedelta):
        return seconds(value)
    if isinstance(value, Decimal):
        return float(value)
    return value


def data(value: Any, *, drop: Sequence[str] = ()) -> dict[str, Any]:
    """A stream value type as a JSON object: durations as seconds, numerics as numbers."""
    return {k: _plain(v) for k, v in output.to_data(value).items() if k not in drop}


def _duration(value: dt.timedelta) -> str:
    return output.duration(value.total_seconds())


def _rate(value: Any) -> str:
    return f"{float(value):.1f}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


# -- columns -------------------------------------------------------------------------------

_LIST_COLUMNS = [
    Column("NAME", "name"),
    Column("ROTATION", "rotation_period", _duration, right=True),
    Column("MAX COUNT", "ticker_max_count"),
    Column("MAX LAG", "ticker_max_lag", _duration, right=True),
    Column("IDLE", "ticker_idle_period", _duration, right=True),
    Column("MAX RETRIES", "max_retries"),
    Column("EVENT TTL", "event_ttl", _duration, right=True),
    Column("PAUSED", "ticker_paused"),
    Column("CONSUMERS", "consumers"),
    Column("CREATED AT", "created_at"),
]

_CONSUMER_COLUMNS = [
    Column("CONSUMER", "consumer"),
    Column("LAG", "lag", _duration, right=True),
    Column("PENDING", "pending_events"),
    Column("LAST SEEN", "last_seen"),
    Column("OPEN BATCH", "batch_id", right=True),
    Column("BATCH AGE", "batch_age", _duration, right=True),
]

_EVENT_COLUMNS = [
    Column("BATCH", "batch_id"),
    Column("ID", "id"),
    Column("TYPE", "type"),
    Column("RETRIES", "retry_count", right=True),
    Column("CREATED AT", "created_at"),
    Column("PAYLOAD", "payload", output.preview),
]

_DEAD_LETTER_COLUMNS = [
    Column("ID", "id"),
    Column("CONSUMER", "consumer"),
    Column("DEAD AT", "dead_at"),
    Column("EVENT", "ev_id"),
    Column("RETRIES", "ev_retry", right=True),
    Column("TYPE", "ev_type"),
    Column("REASON", "reason", lambda r: output.preview(r, 40)),
    Column("PAYLOAD", "ev_data", output.preview),
]

_HEALTH_COLUMNS = [Column("STREAM", "stream"), Column("CHECK", "check"), Column("STATUS", "status"),
                   Column("DETAIL", "detail")]

_MAINT_COLUMNS = [Column("STREAM", "stream"), Column("OPERATION", "operation"), Column("COUNT", "count")]


# -- options -------------------------------------------------------------------------------

def config_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The stream options (shared by create and config)."""
    options = [
        click.option("--rotation-period", type=int, metavar="SECONDS",
                     help="How often the event tables rotate (at least 1; default 7200 = 2 hours)."),
        click.option("--ticker-max-count", type=int, metavar="N",
                     help="Tick once this many events are waiting (1-1000000; default 500)."),
        click.option("--ticker-max-lag", type=int, metavar="SECONDS",
                     help="Tick when events have waited this long (default 3)."),
        click.option("--ticker-idle-period", type=int, metavar="SECONDS",
                     help="Tick this often even without events (default 60)."),
        click.option("--max-retries", type=int, metavar="N",
                     help="Retries of an event before a nack dead-letters it (0-1000; default 5)."),
        click.option("--event-ttl", type=int, metavar="SECONDS",
                     help="Events older than this are no longer delivered (default: no limit)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _options(given: dict[str, Any]) -> dict[str, Any]:
    """The stream options the user set, as the database takes them."""
    chosen: dict[str, Any] = {k: f"{given[k]} seconds" for k in _INTERVAL_OPTIONS if given.get(k) is not None}
    chosen.update({k: given[k] for k in _COUNT_OPTIONS if given.get(k) is not None})
    return chosen


def _differs(s: types.Stream, given: dict[str, Any]) -> list[str]:
    """Options given that ``s`` does not have (create returns an existing stream as is)."""
    wanted = {k: dt.timedelta(seconds=given[k]) for k in _INTERVAL_OPTIONS if given.get(k) is not None}
    wanted.update({k: given[k] for k in _COUNT_OPTIONS if given.get(k) is not None})
    return [k for k, v in wanted.items() if getattr(s, k) != v]


# -- describing a stream -------------------------------------------------------------------

def _config_pairs(s: types.Stream) -> list[tuple[str, Any]]:
    return [
        ("name", s.name),
        ("rotation period", _duration(s.rotation_period)),
        ("ticker max count", s.ticker_max_count),
        ("ticker max lag", _duration(s.ticker_max_lag)),
        ("ticker idle period", _duration(s.ticker_idle_period)),
        ("ticker paused", s.ticker_paused),
        ("max retries", s.max_retries),
        ("event ttl", _duration(s.event_ttl) if s.event_ttl is not None else None),
        ("current table", s.cur_table),
        ("last rotation", s.switch_time),
        ("created at", s.created_at),
        ("consumers", s.consumers),
    ]


def _stats_pairs(st: types.StreamStats) -> list[tuple[str, Any]]:
    return [
        ("depth", st.depth),
        ("oldest event age", _duration(st.oldest_event_age) if st.oldest_event_age is not None else None),
        ("events/s", _rate(st.events_per_sec) if st.events_per_sec is not None else None),
        ("rotation age", _duration(st.rotation_age)),
        ("last tick", st.last_tick_id),
        ("last tick at", st.last_tick_time),
        ("dead letters", st.dead_letters),
        ("pending retries", st.pending_retries),
        ("delayed", st.delayed),
    ]


def _emit_stream(obj: Any, s: types.Stream) -> None:
    output.emit(data(s), obj.as_json, lambda: output.record(_config_pairs(s)))


def _consumer_rows(found: list[types.ConsumerStats], name: str) -> list[types.ConsumerStats]:
    return [c for c in found if c.stream == name]



def _read_payload(payload: str | None) -> str:
    if payload is not None and payload != "-":
        return payload
    if sys.stdin.isatty():
        output.note("reading the event payload from stdin (end with Ctrl-D)")
    return sys.stdin.read()


# -- streams -------------------------------------------------------------------------------

@click.group()
def streams() -> None:
    """Event streams: append, subscribe consumers, receive batches, dead letters.

    Events become visible to consumers at ticks: a server runs the ticker, or run
    `conveyor streams tick` (and `maint`, which moves due retries) yourself."""


@streams.command("list")
@output.json_option
@click.pass_obj
def list_(obj) -> None:  # noqa: ANN001
    """List streams (name order) with their configuration."""
    found = context.run(obj.settings(), ops.list_all)
    output.emit_rows(found, _LIST_COLUMNS, obj.as_json, empty="no streams", data=data)


@streams.command()
@click.argument("name")
@config_options
@output.json_option
@click.pass_obj
def create(obj, name: str, **options: Any) -> None:  # noqa: ANN001
    """Create stream NAME (options left out take their defaults).

    If the stream exists it is left as it is (change it with `conveyor streams config`)."""
    s = context.run(obj.settings(), lambda conn: ops.create(conn, name, _options(options)))
    if differing := _differs(s, options):
        output.note(f"stream {name} already exists with other {', '.join(differing)}; left unchanged "
                    f"(use conveyor streams config)")
    _emit_stream(obj, s)


@streams.command()
@click.argument("name")
@output.json_option
@click.pass_obj
def show(obj, name: str) -> None:  # noqa: ANN001
    """Show stream NAME: its configuration, statistics and consumers.

    Statistics: depth (events its slowest consumer has yet to finish), oldest event age,
    events per second over the last two ticks, rotation age, last tick, dead letters,
    pending retries and delayed events."""

    async def action(conn: Any) -> tuple[types.Stream, types.StreamStats | None, list[types.ConsumerStats]]:
        s = await ops.get(conn, name)
        stats = next((st for st in await ops.stats(conn) if st.stream == name), None)
        return s, stats, _consumer_rows(await ops.consumer_stats(conn), name)

    s, stats, consumers = context.run(obj.settings(), action)

    def text() -> str:
        pairs = _config_pairs(s) + (_stats_pairs(stats) if stats is not None else [])
        table = output.table(consumers, _CONSUMER_COLUMNS) if consumers else "no consumers"
        return f"{output.record(pairs)}\n\n{table}"

    output.emit({"stream": data(s), "stats": data(stats, drop=("stream",)) if stats is not None else None,
                 "consumers": [data(c, drop=("stream",)) for c in consumers]}, obj.as_json, text)


@streams.command()
@click.argument("name")
@config_options
@click.option("--pause/--resume", "paused", default=None,
              help="Stop ticking the stream (consumers get nothing new), or start again.")
@output.json_option
@click.pass_obj
def config(obj, name: str, paused: bool | None, **options: Any) -> None:  # noqa: ANN001
    """Change the configuration of stream NAME; options not given keep their value."""
    chosen = _options(options)
    if paused is not None:
        chosen["ticker_paused"] = paused
    if not chosen:
        raise click.UsageError("nothing to change: give at least one option")
    _emit_stream(obj, context.run(obj.settings(), lambda conn: ops.configure(conn, name, chosen)))


@streams.command()
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@output.json_option
@click.pass_obj
def drop(obj, name: str, yes: bool) -> None:  # noqa: ANN001
    """Drop stream NAME with all its events, consumers and dead letters."""
    context.remove(obj, "stream", name, find=ops.get, remove_it=ops.drop, done="dropped", yes=yes,
                   question=lambda _s: f"Drop stream {name!r} with all its events and consumers?")


# -- producing -----------------------------------------------------------------------------

@streams.command()
@click.argument("name")
@click.argument("payload", required=False)
@click.option("--type", "type_", default="default", show_default=True, metavar="T", help="The event type.")
@click.option("--extra1", metavar="V", help="Free-form extra field 1.")
@click.option("--extra2", metavar="V", help="Free-form extra field 2.")
@click.option("--extra3", metavar="V", help="Free-form extra field 3.")
@click.option("--extra4", metavar="V", help="Free-form extra field 4.")
@output.json_option
@click.pass_obj
def append(obj, name: str, payload: str | None, type_: str, **extras: str | None) -> None:  # noqa: ANN001
    """Append an event to stream NAME and print its id.

    The payload is PAYLOAD, or standard input (read as is) when PAYLOAD is - or left out.
    Consumers see the event after the next tick."""
    event = types.StreamEventIn(payload=_read_payload(payload), type=type_, **extras)
    [event_id] = context.run(obj.settings(), lambda conn: ops.append(conn, name, [event]))
    output.emit({"stream": name, "id": event_id}, obj.as_json, str(event_id))


# -- consumers -----------------------------------------------------------------------------

@streams.command()
@click.argument("name")
@click.argument("consumer")
@output.json_option
@click.pass_obj
def subscribe(obj, name: str, consumer: str) -> None:  # noqa: ANN001
    """Subscribe CONSUMER to stream NAME: it gets the events after the latest tick.

    Subscribing again changes nothing (the consumer keeps its position)."""
    new = context.run(obj.settings(), lambda conn: ops.subscribe(conn, name, consumer))
    output.emit({"stream": name, "consumer": consumer, "subscribed": new}, obj.as_json,
                f"subscribed {consumer} to {name}" if new else f"{consumer} was already subscribed to {name}")


@streams.command()
@click.argument("name")
@click.argument("consumer")
@output.json_option
@click.pass_obj
def unsubscribe(obj, name: str, consumer: str) -> None:  # noqa: ANN001
    """Unsubscribe CONSUMER from stream NAME, dropping its position and pending retries."""
    if not context.run(obj.settings(), lambda conn: ops.unsubscribe(conn, name, consumer)):
        raise click.ClickException(f"consumer {consumer!r} is not subscribed to stream {name!r}")
    output.emit({"stream": name, "consumer": consumer, "unsubscribed": True}, obj.as_json,
                f"unsubscribed {consumer} from {name}")


@streams.command()
@click.argument("name")
@output.json_option
@click.pass_obj
def consumers(obj, name: str) -> None:  # noqa: ANN001
    """List the consumers of stream NAME with their lag.

    Lag: the age of the last tick a consumer finished; pending: events after it."""

    async def action(conn: Any) -> list[types.ConsumerStats]:
        await ops.get(conn, name)
        return _consumer_rows(await ops.consumer_stats(conn), name)

    output.emit_rows(context.run(obj.settings(), action), _CONSUMER_COLUMNS, obj.as_json,
                     empty="no consumers", data=data)


@streams.command()
@click.argument("name")
@click.argument("consumer")
@click.option("--max", "max_events", type=click.IntRange(1, 100000), default=1000, show_default=True,
              metavar="N", help="Show up to this many events of the batch.")
@click.option("--ack", is_flag=True, help="Acknowledge the batch after printing it.")
@output.json_option
@click.pass_obj
def receive(obj, name: str, consumer: str, max_events: int, ack: bool) -> None:  # noqa: ANN001
    """Receive CONSUMER's next batch of stream NAME and print its events.

    The batch stays open (receiving again returns it again) until acknowledged with
    --ack or `conveyor streams ack BATCH_ID`. Acknowledging finishes the whole batch, also
    events beyond --max: --ack refuses to skip them."""

    async def action(conn: Any) -> None:
        found = await ops.receive(conn, name, consumer, max_events)
        output.emit_rows(found, _EVENT_COLUMNS, obj.as_json, empty="no events", data=data)
        if not found:
            return
        batch_id = found[0].batch_id
        more = len(found) == max_events and len(await ops.batch_events(conn, batch_id)) > max_events
        if more and ack:
            raise click.ClickException(f"batch {batch_id} holds more than {max_events} events; not "
                                       f"acknowledged (raise --max, or ack {batch_id} to skip the rest)")
        if more:
            output.note(f"batch {batch_id} holds more than {max_events} events: acknowledging it "
                        f"finishes them all")
        if ack:
            await ops.ack(conn, batch_id)
            output.note(f"acknowledged batch {batch_id}")

    context.run(obj.settings(), action)


@streams.command("ack")
@click.argument("batch_id", type=int)
@output.json_option
@click.pass_obj
def ack_(obj, batch_id: int) -> None:  # noqa: ANN001
    """Acknowledge batch BATCH_ID: its consumer moves on to the next batch."""
    context.run(obj.settings(), lambda conn: ops.ack(conn, batch_id))
    output.emit({"batch_id": batch_id, "acked": True}, obj.as_json, f"acknowledged batch {batch_id}")


@streams.command()
@click.argument("batch_id", type=int)
@click.argument("event_id", type=int)
@click.option("--retry-after", type=click.IntRange(min=0), default=60, show_default=True, metavar="SECONDS",
              help="Deliver the event again to this consumer after this long.")
@click.option("--reason", metavar="TEXT", help="Why it failed (kept with the dead letter).")
@output.json_option
@click.pass_obj
def nack(obj, batch_id: int, event_id: int, retry_after: int, reason: str | None) -> None:  # noqa: ANN001
    """Fail event EVENT_ID of open batch BATCH_ID: retry it later, or dead-letter it.

    The event comes back to the same consumer after --retry-after (once maintenance has
    moved it and a tick has passed), or goes to the dead letters once it has been
    retried max-retries times. Acknowledge the batch afterwards as usual."""
    result = context.run(obj.settings(), lambda conn: ops.nack(
        conn, batch_id, event_id, dt.timedelta(seconds=retry_after), reason))
    text = (f"event {event_id} will be retried in {output.duration(retry_after)}" if result == "retry"
            else f"event {event_id} moved to the dead letters")
    output.emit({"batch_id": batch_id, "event_id": event_id, "result": result}, obj.as_json, text)


# -- dead letters --------------------------------------------------------------------------

@streams.command("dead-letters")
@click.argument("name")
@click.option("--max", "max_rows", type=click.IntRange(1, 10000), default=100, show_default=True, metavar="N",
              help="Show up to this many dead letters (oldest first).")
@output.json_option
@click.pass_obj
def dead_letters(obj, name: str, max_rows: int) -> None:  # noqa: ANN001
    """List the dead letters of stream NAME: events consumers gave up on."""
    found = context.run(obj.settings(), lambda conn: ops.dead_letters(conn, name, max_rows))
    output.emit_rows(found, _DEAD_LETTER_COLUMNS, obj.as_json, empty="no dead letters", data=data)


@streams.command()
@click.argument("dead_letter_id", type=int)
@output.json_option
@click.pass_obj
def replay(obj, dead_letter_id: int) -> None:  # noqa: ANN001
    """Append dead letter DEAD_LETTER_ID to its stream again; print the new event id.

    The replayed event is new: every consumer of the stream gets it."""
    event_id = context.run(obj.settings(), lambda conn: ops.replay_dead_letter(conn, dead_letter_id))
    output.emit({"dead_letter_id": dead_letter_id, "id": event_id}, obj.as_json, str(event_id))


@streams.command("replay-all")
@click.argument("name")
@output.json_option
@click.pass_obj
def replay_all(obj, name: str) -> None:  # noqa: ANN001
    """Append every dead letter of stream NAME to it again, as new events (in one
    transaction: all of them or none)."""

    async def action(conn: Any) -> int:
        await ops.get(conn, name)
        waiting = next((s.dead_letters for s in await ops.stats(conn) if s.stream == name), None)
        with output.Progress(f"replaying the dead letters of {name}", waiting) as bar:
            n = await ops.replay_dead_letters(conn, name)
            bar.update(n)
        return n

    n = context.run(obj.settings(), action)
    output.emit({"stream": name, "replayed": n}, obj.as_json, f"replayed {_plural(n, 'dead letter')}")


@streams.command("purge-dead-letters")
@click.argument("name")
@click.option("--older-than", type=click.IntRange(min=0), default=0, metavar="SECONDS",
              help="Only dead letters older than this (default: all).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@output.json_option
@click.pass_obj
def purge_dead_letters(obj, name: str, older_than: int, yes: bool) -> None:  # noqa: ANN001
    """Delete dead letters of stream NAME for good."""

    async def action(conn: Any) -> int:
        await ops.get(conn, name)
        which = f"older than {output.duration(older_than)} " if older_than else ""
        output.confirm(f"Delete the dead letters {which}of stream {name!r}?", yes)
        return await ops.purge_dead_letters(conn, name, dt.timedelta(seconds=older_than))

    n = context.run(obj.settings(), action)
    output.emit({"stream": name, "deleted": n}, obj.as_json, f"deleted {_plural(n, 'dead letter')}")


# -- ticker, maintenance, health -----------------------------------------------------------

@streams.command()
@click.argument("name", required=False)
@output.json_option
@click.pass_obj
def tick(obj, name: str | None) -> None:  # noqa: ANN001
    """Run the ticker once: tick every stream that needs it, or stream NAME now.

    Consumers see events appended before a tick. A running server ticks by itself; this
    is for working without one (or not waiting for it)."""
    if name is None:
        n = context.run(obj.settings(), ops.ticker)
        output.emit({"ticks": n}, obj.as_json, f"made {_plural(n, 'tick')}")
    else:
        tick_id = context.run(obj.settings(), lambda conn: ops.force_tick(conn, name))
        output.emit({"stream": name, "tick_id": tick_id}, obj.as_json, f"ticked {name}: tick {tick_id}")


@streams.command()
@output.json_option
@click.pass_obj
def maint(obj) -> None:  # noqa: ANN001
    """Run one round of stream maintenance and print what it did.

    It rotates event tables when due, moves due retries and delayed events into their
    streams, and drops old ticks. A running server does this by itself."""
    done = [{"stream": s, "operation": op, "count": n} for s, op, n in context.run(obj.settings(), ops.maint)]
    output.emit_rows(done, _MAINT_COLUMNS, obj.as_json, empty="nothing to do")


@streams.command()
@output.json_option
@click.pass_obj
def health(obj) -> None:  # noqa: ANN001
    """Check every stream: ticker, consumer lag, rotation and dead letters.

    Each check is ok, warning or critical, with a detail."""
    found = [{"stream": s, "check": c, "status": st, "detail": d}
             for s, c, st, d in context.run(obj.settings(), ops.health)]
    found.sort(key=lambda r: (r["stream"], r["check"]))
    output.emit_rows(found, _HEALTH_COLUMNS, obj.as_json, empty="no streams")
