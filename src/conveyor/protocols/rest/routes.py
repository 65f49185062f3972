"""The REST endpoint table: one row per operation, used for routing, role checks and the
OpenAPI document alike."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from conveyor.protocols.endpoints import guarded
from conveyor.protocols.rest import events, messages, models, openapi, queues, render, schedules, streams
from conveyor.protocols.sns import certificate

Handler = Callable[[Request], Awaitable[Response]]


@dataclasses.dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    handler: Handler
    role: str
    summary: str
    responses: dict[int, type[BaseModel] | None]
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    body_required: bool = True


Q = "/queues/{name}"
MSG = Q + "/messages/{id}"
S = "/streams/{name}"
CONSUMER = S + "/consumers/{consumer}"
BATCH = S + "/batches/{batch_id}"
DL = S + "/dead-letters"
SCHED = "/schedules/{name}"
EV_SUBS = "/events/{pattern}/subscriptions"

ENDPOINTS = [
    Endpoint("GET", "/queues", queues.list_queues, "read", "List queues (optionally by name prefix)",
             {200: models.Queue}),
    Endpoint("POST", "/queues", queues.create_queue, "admin",
             "Create a queue (returns the existing one if every given attribute matches)",
             {201: models.Queue, 404: models.Error, 409: models.Error}, body=models.QueueCreate),
    Endpoint("GET", Q, queues.get_queue, "read", "A queue's attributes and metrics",
             {200: models.QueueDetail, 404: models.Error}),
    Endpoint("PATCH", Q, queues.alter_queue, "admin", "Change a queue's attributes (null resets one)",
             {200: models.Queue, 404: models.Error}, body=models.QueueAttributes),
    Endpoint("DELETE", Q, queues.delete_queue, "admin", "Delete a queue and its messages",
             {204: None, 404: models.Error}),
    Endpoint("POST", Q + "/purge", queues.purge_queue, "admin", "Delete every message of a queue",
             {200: models.Purged, 404: models.Error}),
    Endpoint("POST", Q + "/messages", messages.send, "write",
             "Send one message (object) or a batch (array); answered after commit",
             {201: models.Sent, 404: models.Error, 413: models.Error}, body=models.MessageIn),
    Endpoint("GET", Q + "/messages", messages.receive, "write",
             "Receive messages, hiding them for vt seconds; wait long-polls",
             {200: models.Message, 404: models.Error}, query=models.ReceiveQuery),
    Endpoint("DELETE", Q + "/messages", messages.delete_batch, "write",
             "Delete deliveries by receipt (or messages by id)",
             {200: models.Deleted, 404: models.Error}, body=models.DeleteBatch),
    Endpoint("DELETE", MSG, messages.delete_one, "write", "Delete one message (at the delivery ?receipt= names)",
             {204: None, 404: models.Error, 409: models.Error}, query=models.ReceiptQuery),
    Endpoint("PATCH", MSG, messages.change_visibility, "write", "Change a message's visibility timeout",
             {200: models.VisibilityChanged, 404: models.Error, 409: models.Error}, body=models.Visibility,
             query=models.ReceiptQuery),
    Endpoint("POST", MSG + "/complete", messages.complete, "write",
             "Complete a message: move it to the archive", {204: None, 404: models.Error, 409: models.Error},
             query=models.ReceiptQuery),
    Endpoint("POST", MSG + "/fail", messages.fail, "write",
             "Fail a message: to the dead-letter queue, else to the archive as failed",
             {204: None, 404: models.Error, 409: models.Error}, body=models.Fail, body_required=False,
             query=models.ReceiptQuery),
    # -- streams -------------------------------------------------------------------------
    Endpoint("GET", "/streams", streams.list_streams, "read", "List streams", {200: models.Stream}),
    Endpoint("POST", "/streams", streams.create_stream, "admin",
             "Create a stream (returns the existing one if every given option matches); intervals in seconds",
             {201: models.Stream, 409: models.Error}, body=models.StreamCreate),
    Endpoint("GET", S, streams.get_stream, "read", "A stream's options, stats and consumers",
             {200: models.StreamDetail, 404: models.Error}),
    Endpoint("PATCH", S, streams.alter_stream, "admin",
             "Change a stream's options (ticker_paused pauses its ticker); event_ttl null: no limit",
             {200: models.Stream, 404: models.Error}, body=models.StreamOptions),
    Endpoint("DELETE", S, streams.delete_stream, "admin", "Delete a stream, its events and consumers",
             {204: None, 404: models.Error}),
    Endpoint("GET", S + "/stats", streams.stream_stats, "read", "A stream's stats and health checks",
             {200: models.StreamStatsReport, 404: models.Error}),
    Endpoint("POST", S + "/events", streams.append_events, "write",
             "Append one event (object) or a batch (array); answered after commit",
             {201: models.Sent, 404: models.Error, 413: models.Error}, body=models.EventIn),
    Endpoint("GET", S + "/consumers", streams.list_consumers, "read", "A stream's consumers and their lag",
             {200: models.ConsumerStats, 404: models.Error}),
    Endpoint("POST", S + "/consumers", streams.subscribe, "write",
             "Subscribe a consumer from now on: 201, or 200 if it already is",
             {200: models.Consumer, 201: models.Consumer, 404: models.Error}, body=models.Subscription),
    Endpoint("DELETE", CONSUMER, streams.unsubscribe, "write", "Unsubscribe a consumer",
             {204: None, 404: models.Error}),
    Endpoint("GET", CONSUMER + "/batch", streams.receive_batch, "write",
             "The consumer's next batch (the open one again until acknowledged), a page of max events "
             "at a time; wait long-polls",
             {200: models.ReceivedBatch, 404: models.Error}, query=models.StreamReceiveQuery),
    Endpoint("POST", BATCH + "/ack", streams.ack_batch, "write",
             "Acknowledge a batch once every page of it was received (409 BatchPartlyReceived before)",
             {204: None, 404: models.Error, 409: models.Error}),
    Endpoint("POST", BATCH + "/nack", streams.nack_event, "write",
             "Retry one event of a batch for this consumer later, or dead-letter it past max_retries",
             {200: models.Nacked, 404: models.Error}, body=models.Nack),
    Endpoint("POST", BATCH + "/dead-letter", streams.dead_letter_event, "write",
             "Move one event of a batch to the dead letters", {204: None, 404: models.Error},
             body=models.DeadLetterRequest),
    Endpoint("GET", DL, streams.list_dead_letters, "read", "A stream's dead letters, oldest first",
             {200: models.DeadLetter, 404: models.Error}, query=models.DeadLettersQuery),
    Endpoint("DELETE", DL, streams.purge_dead_letters, "admin", "Delete dead letters older than older_than seconds",
             {200: models.DeadLettersPurged, 404: models.Error}, query=models.PurgeQuery),
    Endpoint("POST", DL + "/replay", streams.replay_dead_letters, "admin",
             "Append every dead letter to the stream again", {200: models.ReplayedAll, 404: models.Error}),
    Endpoint("POST", DL + "/{id}/replay", streams.replay_dead_letter, "admin",
             "Append one dead letter to the stream again (every consumer sees it)",
             {200: models.Replayed, 404: models.Error}),
    # -- topics ------------------------------------------------------------------------------
    Endpoint("GET", "/cert", certificate.certificate, "read",
             "The PEM certificate that verifies SNS envelope signatures (as /SimpleNotificationService.pem)",
             {200: None}),
    # -- events (routing-key fan-out; docs/topics.md) -----------------------------------------
    Endpoint("POST", "/events/{routing_key}", events.publish_event, "write",
             "Publish to a routing key: into every matching queue and webhook, in one transaction",
             {201: models.Published, 413: models.Error}, body=models.PublishIn),
    Endpoint("GET", EV_SUBS, events.list_event_subscriptions, "read",
             "The subscriptions of a pattern (write # as %23)",
             {200: models.EventSubscription}, query=models.SubscriptionsQuery),
    Endpoint("POST", EV_SUBS, events.create_event_subscription, "admin",
             "Subscribe a queue or an HTTP(S) endpoint to a pattern (* one segment, # zero or more); "
             "returns the existing subscription for the same target",
             {201: models.EventSubscription, 404: models.Error}, body=models.EventSubscriptionIn),
    Endpoint("GET", EV_SUBS + "/{id}", events.get_event_subscription, "read", "One subscription of a pattern",
             {200: models.EventSubscription, 404: models.Error}),
    Endpoint("DELETE", EV_SUBS + "/{id}", events.delete_event_subscription, "admin",
             "Unsubscribe (pending webhook deliveries go too)", {204: None, 404: models.Error}),
    Endpoint("GET", Q + "/subscriptions", events.list_queue_subscriptions, "read",
             "The subscriptions delivering into a queue",
             {200: models.EventSubscription, 404: models.Error}, query=models.SubscriptionsQuery),
    # -- schedules (docs/schedules.md) ------------------------------------------------------
    Endpoint("GET", "/schedules", schedules.list_schedules, "read",
             "List schedules by name (filters: status, target_kind, name_prefix; at most 1000)",
             {200: models.ScheduleList}, query=models.ScheduleListQuery),
    Endpoint("POST", "/schedules", schedules.create_schedule, "admin",
             "Create a schedule (strict: 409 if the name is taken)",
             {201: models.Schedule, 409: models.Error}, body=models.ScheduleCreate),
    Endpoint("GET", SCHED, schedules.get_schedule, "read",
             "A schedule, its description in words and its next fire times", {200: models.Schedule, 404: models.Error}),
    Endpoint("PUT", SCHED, schedules.put_schedule, "admin",
             "Create or replace a schedule's configuration: 201 created, 200 replaced (idempotent)",
             {200: models.Schedule, 201: models.Schedule}, body=models.ScheduleIn),
    Endpoint("PATCH", SCHED, schedules.patch_schedule, "admin",
             "Change some fields; {\"status\": \"paused\"} pauses, \"active\" resumes",
             {200: models.Schedule, 404: models.Error}, body=models.SchedulePatch),
    Endpoint("DELETE", SCHED, schedules.delete_schedule, "admin", "Delete a schedule (204 whether it existed or not)",
             {204: None}),
    Endpoint("POST", SCHED + "/runs", schedules.run_schedule, "write",
             "Fire a schedule once now, out of band (its next fire time does not move)",
             {202: models.ScheduleRun, 404: models.Error, 413: models.Error}),
    Endpoint("POST", "/previews", schedules.preview, "read",
             "Dry-run an expression: its canonical form, a description and its next fire times",
             {200: models.Preview}, body=models.PreviewIn),
]


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "NotFound", 405: "MethodNotAllowed", 413: "RequestTooLarge"}.get(exc.status_code, "HTTPError")
    return render.json({"error": exc.detail, "code": code}, exc.status_code)


async def _openapi(request: Request) -> Response:
    return render.json(openapi.document(ENDPOINTS, request.app.state.version))


def app(broker: object, version: str) -> Starlette:
    """The /v1 sub-application."""
    routes = [Route(e.path, guarded(e.handler, e.role, render.error), methods=[e.method]) for e in ENDPOINTS]
    routes.append(Route("/openapi.json", _openapi, methods=["GET"]))
    sub = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    sub.state.broker = broker
    sub.state.version = version
    return sub
