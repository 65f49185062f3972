"""REST handlers for event streams: /v1/streams[/{name}[/events|/consumers|/batches|
/dead-letters|/stats]].

Units: every interval is seconds as a JSON number, in requests and responses alike;
timestamps are ISO 8601 strings with an offset (as everywhere in the REST API).
Payloads: events carry no content type, so a payload is stored and returned as text: a
JSON string exactly as given, any other JSON value as its compact JSON text."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from conveyor import errors, tracing, types
from conveyor.core import streams
from conveyor.protocols.rest import models, render
from conveyor.protocols.rest import request as req
from conveyor.protocols.rest.context import broker

_INTERVAL_OPTIONS = ("rotation_period", "ticker_max_lag", "ticker_idle_period", "event_ttl")
_STREAM_NAME = re.compile(models.STREAM_NAME_PATTERN)
_CONSUMER_NAME = re.compile(models.CONSUMER_NAME_PATTERN)


# -- rendering -------------------------------------------------------------------------

def _seconds(value: dt.timedelta | None) -> float | None:
    return None if value is None else value.total_seconds()


def _stream(s: types.Stream) -> dict[str, Any]:
    return {
        "name": s.name, "rotation_period": _seconds(s.rotation_period), "ticker_max_count": s.ticker_max_count,
        "ticker_max_lag": _seconds(s.ticker_max_lag), "ticker_idle_period": _seconds(s.ticker_idle_period),
        "ticker_paused": s.ticker_paused, "max_retries": s.max_retries, "event_ttl": _seconds(s.event_ttl),
        "cur_table": s.cur_table, "switch_time": s.switch_time, "created_at": s.created_at,
        "consumers": s.consumers, "channel": s.channel,
    }


def _stats(st: types.StreamStats) -> dict[str, Any]:
    return {
        "stream": st.stream, "depth": st.depth, "oldest_event_age": _seconds(st.oldest_event_age),
        "consumers": st.consumers,
        "events_per_sec": None if st.events_per_sec is None else float(st.events_per_sec),
        "cur_table": st.cur_table, "rotation_age": _seconds(st.rotation_age),
        "rotation_period": _seconds(st.rotation_period), "ticker_paused": st.ticker_paused,
        "last_tick_time": st.last_tick_time, "last_tick_id": st.last_tick_id, "dead_letters": st.dead_letters,
        "pending_retries": st.pending_retries, "delayed": st.delayed,
    }


def _consumer_stats(c: types.ConsumerStats) -> dict[str, Any]:
    return {
        "name": c.consumer, "lag": _seconds(c.lag), "pending_events": c.pending_events, "last_seen": c.last_seen,
        "batch_active": c.batch_active, "batch_id": c.batch_id, "batch_age": _seconds(c.batch_age),
    }


def _event(e: types.StreamEvent) -> dict[str, Any]:
    return {
        "id": e.id, "type": e.type, "payload": e.payload, "retry_count": e.retry_count,
        "created_at": e.created_at, "extra1": e.extra1, "extra2": e.extra2, "extra3": e.extra3,
        "extra4": e.extra4, **({"traceparent": e.traceparent} if e.traceparent else {}),
    }


def _dead_letter(d: types.StreamDeadLetter) -> dict[str, Any]:
    return {
        "id": d.id, "consumer": d.consumer, "dead_at": d.dead_at, "reason": d.reason,
        "event": {"id": d.ev_id, "type": d.ev_type, "payload": d.ev_data, "retry_count": d.ev_retry,
                  "created_at": d.ev_time, "extra1": d.ev_extra1, "extra2": d.ev_extra2,
                  "extra3": d.ev_extra3, "extra4": d.ev_extra4,
                  **({"traceparent": d.ev_traceparent} if d.ev_traceparent else {})},
    }


# -- path values -----------------------------------------------------------------------

def _stream_name(request: Request) -> str:
    name = str(request.path_params["name"])
    if not _STREAM_NAME.fullmatch(name):
        raise errors.InvalidInput(f"invalid stream name {name[:100]!r} in the path: "
                                  "use 1 to 80 characters of A-Z, a-z, 0-9, hyphen and underscore")
    return name


def _consumer_name(request: Request) -> str:
    name = str(request.path_params["consumer"])
    if not _CONSUMER_NAME.fullmatch(name):
        raise errors.InvalidInput(f"invalid consumer name {name[:100]!r} in the path: "
                                  "use 1 to 80 characters of A-Z, a-z, 0-9 and _ . : -")
    return name


# -- options ---------------------------------------------------------------------------

def _options(given: Mapping[str, Any]) -> dict[str, Any]:
    """Validated REST options (intervals in seconds) as timedeltas."""
    return {k: dt.timedelta(seconds=v) if k in _INTERVAL_OPTIONS and v is not None else v
            for k, v in given.items()}


def _sql_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Options as the SQL API's JSON object: intervals as interval text."""
    return {k: f"{v.total_seconds():.6f} seconds" if isinstance(v, dt.timedelta) else v
            for k, v in options.items()}


# -- streams ---------------------------------------------------------------------------

async def list_streams(request: Request) -> Response:
    async with broker(request).connection() as conn:
        found = await streams.list_all(conn)
    return render.json([_stream(s) for s in found])


async def create_stream(request: Request) -> Response:
    spec = await req.body(request, models.StreamCreate)
    wanted = _options(spec.model_dump(exclude_unset=True, exclude={"name"}))
    async with broker(request).connection() as conn:
        s = await streams.create(conn, spec.name, _sql_options(wanted))
    differing = [f"{k} is {_seconds(getattr(s, k)) if k in _INTERVAL_OPTIONS else getattr(s, k)!r}"
                 for k, v in wanted.items() if getattr(s, k) != v]
    if differing:
        raise errors.Conflict(f"stream {s.name!r} already exists with other options ({', '.join(differing)}); "
                              f"change them with PATCH /v1/streams/{s.name}")
    return render.json(_stream(s), 201, headers={"Location": f"/v1/streams/{s.name}"})


async def get_stream(request: Request) -> Response:
    name = _stream_name(request)
    async with broker(request).connection() as conn:
        s = await streams.get(conn, name)
        stats = [st for st in await streams.stats(conn) if st.stream == name]
        consumers = [c for c in await streams.consumer_stats(conn) if c.stream == name]
    if not stats:  # dropped meanwhile
        raise errors.StreamNotFound(f"stream {name!r} does not exist")
    return render.json({**_stream(s), "stats": _stats(stats[0]),
                        "consumer_stats": [_consumer_stats(c) for c in consumers]})


async def alter_stream(request: Request) -> Response:
    name = _stream_name(request)
    options = _options((await req.body(request, models.StreamOptions)).model_dump(exclude_unset=True))
    async with broker(request).connection() as conn:
        s = await streams.configure(conn, name, _sql_options(options))
    return render.json(_stream(s))


async def delete_stream(request: Request) -> Response:
    name = _stream_name(request)
    async with broker(request).connection() as conn:
        dropped = await streams.drop(conn, name)
    if not dropped:
        raise errors.StreamNotFound(f"stream {name!r} does not exist")
    return Response(status_code=204)


async def stream_stats(request: Request) -> Response:
    name = _stream_name(request)
    async with broker(request).connection() as conn:
        stats = [st for st in await streams.stats(conn) if st.stream == name]
        if not stats:
            raise errors.StreamNotFound(f"stream {name!r} does not exist")
        health = [h for h in await streams.health(conn) if h[0] == name]
    return render.json({**_stats(stats[0]),
                        "health": [{"check": check, "status": status, "detail": detail}
                                   for _, check, status, detail in health]})


# -- producers -------------------------------------------------------------------------

def _event_in(e: models.EventIn) -> types.StreamEventIn:
    payload = e.payload if isinstance(e.payload, str) else orjson.dumps(e.payload).decode()
    return types.StreamEventIn(payload=payload, type=e.type, extra1=e.extra1, extra2=e.extra2,
                               extra3=e.extra3, extra4=e.extra4,
                               traceparent=tracing.current_traceparent())  # the request's trace, when traced


async def append_events(request: Request) -> Response:
    name = _stream_name(request)
    raw = await request.body()
    data = req.parse(raw) if raw else None
    if not isinstance(data, (dict, list)):
        raise errors.InvalidInput("invalid request: the body must be an event object or an array of event objects")
    single = isinstance(data, dict)
    events = [req.validate(models.EventIn, data)] if single else req.validate(models.EventBatch, data).root
    async with broker(request).connection() as conn:
        ids = await streams.append(conn, name, [_event_in(e) for e in events])
    return render.json({"id": ids[0]} if single else {"ids": ids}, 201)


# -- consumers -------------------------------------------------------------------------

async def _consumers_of(conn: Any, name: str) -> list[types.ConsumerStats]:
    found = [c for c in await streams.consumer_stats(conn) if c.stream == name]
    if not found:
        await streams.get(conn, name)  # raises StreamNotFound for an unknown stream
    return found


async def list_consumers(request: Request) -> Response:
    name = _stream_name(request)
    async with broker(request).connection() as conn:
        found = await _consumers_of(conn, name)
    return render.json([_consumer_stats(c) for c in found])


async def subscribe(request: Request) -> Response:
    name = _stream_name(request)
    spec = await req.body(request, models.Subscription)
    async with broker(request).connection() as conn:
        created = await streams.subscribe(conn, name, spec.name)
    return render.json({"stream": name, "name": spec.name}, 201 if created else 200)


async def unsubscribe(request: Request) -> Response:
    name, consumer = _stream_name(request), _consumer_name(request)
    async with broker(request).connection() as conn:
        removed = await streams.unsubscribe(conn, name, consumer)
    if not removed:
        raise errors.ConsumerNotFound(f"consumer {consumer!r} is not subscribed to stream {name!r}")
    return Response(status_code=204)


async def receive_batch(request: Request) -> Response:
    name, consumer = _stream_name(request), _consumer_name(request)
    q = req.query(request, models.StreamReceiveQuery)
    b = broker(request)
    got = await b.stream_receive(name, consumer, q.max, q.wait, q.after)
    complete = True
    if got:
        async with b.connection() as conn:
            complete = await streams.batch_read_all(conn, got[0].batch_id) is not False
    return render.json({"batch_id": got[0].batch_id if got else None, "events": [_event(e) for e in got],
                        "complete": complete})


# -- batches ---------------------------------------------------------------------------

async def _open_batch(conn: Any, name: str, batch_id: int) -> None:
    """Raise unless ``batch_id`` is an open batch of stream ``name`` (batch ids are
    unique across streams: one checked here can only be finished meanwhile, which the
    operation itself then reports)."""
    if await streams.stream_of_batch(conn, batch_id) == name:
        return
    await streams.get(conn, name)  # raises StreamNotFound for an unknown stream
    raise errors.BatchNotFound(f"batch {batch_id} of stream {name!r} does not exist or is finished")


async def ack_batch(request: Request) -> Response:
    name, batch_id = _stream_name(request), req.path_id(request, "batch_id", "batch id")
    async with broker(request).connection() as conn:
        await _open_batch(conn, name, batch_id)
        await streams.ack(conn, batch_id)
    return Response(status_code=204)


async def nack_event(request: Request) -> Response:
    name, batch_id = _stream_name(request), req.path_id(request, "batch_id", "batch id")
    spec = await req.body(request, models.Nack)
    async with broker(request).connection() as conn:
        await _open_batch(conn, name, batch_id)
        outcome = await streams.nack(conn, batch_id, spec.event_id, dt.timedelta(seconds=spec.retry_after),
                                     spec.reason)
    return render.json({"outcome": outcome})


async def dead_letter_event(request: Request) -> Response:
    name, batch_id = _stream_name(request), req.path_id(request, "batch_id", "batch id")
    spec = await req.body(request, models.DeadLetterRequest)
    async with broker(request).connection() as conn:
        await _open_batch(conn, name, batch_id)
        await streams.dead_letter(conn, batch_id, spec.event_id, spec.reason)
    return Response(status_code=204)


# -- dead letters ----------------------------------------------------------------------

async def list_dead_letters(request: Request) -> Response:
    name = _stream_name(request)
    q = req.query(request, models.DeadLettersQuery)
    async with broker(request).connection() as conn:
        found = await streams.dead_letters(conn, name, q.max)
    return render.json([_dead_letter(d) for d in found])


async def replay_dead_letter(request: Request) -> Response:
    name, dead_letter_id = _stream_name(request), req.path_id(request, "id", "dead letter id")
    async with broker(request).connection() as conn:
        await streams.get(conn, name)  # StreamNotFound before DeadLetterNotFound
        event_id = await streams.replay_dead_letter(conn, dead_letter_id, name)
    return render.json({"event_id": event_id})


async def replay_dead_letters(request: Request) -> Response:
    name = _stream_name(request)
    async with broker(request).connection() as conn:
        n = await streams.replay_dead_letters(conn, name)
    return render.json({"replayed": n})


async def purge_dead_letters(request: Request) -> Response:
    name = _stream_name(request)
    q = req.query(request, models.PurgeQuery)
    async with broker(request).connection() as conn:
        n = await streams.purge_dead_letters(conn, name, dt.timedelta(seconds=q.older_than))
    return render.json({"purged": n})
