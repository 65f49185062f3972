"""Tracing (conveyor.tracing) with an in-process exporter: a span per request under the
caller's trace (W3C traceparent, X-Ray header), the trace stored with the messages a
request sends and handed to consumers, spans for background jobs, sampling, and nothing
at all when tracing is off."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from starlette.testclient import TestClient

from conveyor import tracing
from conveyor.server.app import create_app
from conveyor.settings import Settings

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.fixture
def traced() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """Tracing on, every finished span kept in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    yield provider, exporter
    tracing.install(None)


@pytest.fixture
def spans(traced) -> InMemorySpanExporter:
    return traced[1]


@pytest.fixture
def provider(traced) -> TracerProvider:
    return traced[0]


@pytest.fixture
def client(dsn, spans) -> Iterator[TestClient]:
    app = create_app(Settings(auth_mode="header", maintenance_interval=0.2, fusion=False), dsn)
    with TestClient(app, headers={"Authorization": "x"}) as c:
        yield c


def _server_spans(exporter: InMemorySpanExporter) -> list:
    return [s for s in exporter.get_finished_spans() if s.kind == trace.SpanKind.SERVER]


def test_a_request_continues_the_callers_trace_and_its_messages_carry_it(client, spans):
    client.post("/v1/queues", json={"name": "traced"})
    spans.clear()
    sent = client.post("/v1/queues/traced/messages", json={"message": "m"}, headers={"traceparent": PARENT})
    assert sent.status_code == 201
    [span] = _server_spans(spans)
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert format(span.parent.span_id, "016x") == "00f067aa0ba902b7"
    assert span.name == "POST /v1/queues/{name}/messages"
    assert span.attributes["http.response.status_code"] == 201
    [got] = client.get("/v1/queues/traced/messages").json()
    stored = tracing.context_of(got["traceparent"])  # what a consumer continues
    carried = trace.get_current_span(stored).get_span_context()
    assert format(carried.trace_id, "032x") == TRACE_ID and carried.span_id == span.context.span_id


def test_an_sqs_request_continues_an_xray_trace_and_keeps_its_aws_trace_header(client, spans):
    url = client.post("/", data={"Action": "CreateQueue", "QueueName": "xray"}).text.split("<QueueUrl>")[1].split("<")[0]
    spans.clear()
    header = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
    client.post("/", data={"Action": "SendMessage", "QueueUrl": url, "MessageBody": "b",
                           "MessageSystemAttribute.1.Name": "AWSTraceHeader",
                           "MessageSystemAttribute.1.Value.DataType": "String",
                           "MessageSystemAttribute.1.Value.StringValue": header},
                headers={"X-Amzn-Trace-Id": header})
    [span] = _server_spans(spans)
    assert format(span.context.trace_id, "032x") == "5759e988bd862e3fe1be46a994272793"
    received = client.post("/", data={"Action": "ReceiveMessage", "QueueUrl": url,
                                      "MessageSystemAttributeName.1": "AWSTraceHeader"}).text
    assert header in received  # the client's own header, not replaced by the span's


def test_background_jobs_get_spans_of_their_own(client, spans):
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        names = {s.name for s in spans.get_finished_spans()}
        if "conveyor.maintenance" in names:
            break
        time.sleep(0.05)
    job = next(s for s in spans.get_finished_spans() if s.name == "conveyor.maintenance")
    assert job.parent is None and job.kind == trace.SpanKind.INTERNAL


def test_sampling_follows_the_rate_and_the_callers_decision(dsn):
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.0)))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        with TestClient(create_app(Settings(auth_mode="header"), dsn), headers={"Authorization": "x"}) as c:
            c.get("/v1/queues")
            assert _server_spans(exporter) == []  # rate 0: not sampled
            c.get("/v1/queues", headers={"traceparent": PARENT})  # the caller sampled it: followed
            assert len(_server_spans(exporter)) == 1
    finally:
        tracing.install(None)


def test_off_by_default_costs_nothing(dsn):
    assert not tracing.enabled()
    with TestClient(create_app(Settings(auth_mode="header"), dsn), headers={"Authorization": "x"}) as c:
        c.post("/v1/queues", json={"name": "plain"})
        c.post("/v1/queues/plain/messages", json={"message": "m"}, headers={"traceparent": PARENT})
        [got] = c.get("/v1/queues/plain/messages").json()
    assert "traceparent" not in got and tracing.current_traceparent() is None


def test_settings():
    assert Settings.from_env({}).tracing is False
    s = Settings.from_env({"CONVEYOR_TRACING": "true", "CONVEYOR_TRACING_SAMPLE_RATE": "0.25"})
    assert s.tracing and s.tracing_sample_rate == 0.25
    with pytest.raises(ValueError):
        Settings(tracing_sample_rate=1.5)


async def test_a_worker_continues_the_senders_trace(dsn, spans):
    """The Python client's worker runs each handler in a CONSUMER span under the trace the
    message carries (sent by a traced request)."""
    from conveyor.client import AsyncClient, Worker
    from conveyor.core import queues
    from conveyor.db import pool

    async with pool.connect(dsn) as conn:
        await queues.create(conn, "traced-work")
    client = AsyncClient.sql(dsn)
    try:
        with TestClient(create_app(Settings(auth_mode="header"), dsn), headers={"Authorization": "x"}) as c:
            c.post("/v1/queues/traced-work/messages", json={"message": "m"}, headers={"traceparent": PARENT})
        worker = Worker(client, wait=0.2)
        handled = []

        @worker.handler("traced-work")
        async def handle(message) -> None:
            handled.append(trace.get_current_span().get_span_context().trace_id)
            worker.stop()

        await worker.run(install_signals=False)
    finally:
        await client.close()
    [consumer] = [s for s in spans.get_finished_spans() if s.kind == trace.SpanKind.CONSUMER]
    assert format(consumer.context.trace_id, "032x") == TRACE_ID and handled == [consumer.context.trace_id]


def test_stream_events_carry_the_trace_they_were_appended_under(client, spans, provider):
    """A stream event keeps the traceparent of the request that appended it (migration
    0013) and hands it to its consumers; an untraced append stores none."""
    client.post("/v1/streams", json={"name": "traced-stream", "ticker_max_lag": 0})
    client.post("/v1/streams/traced-stream/consumers", json={"name": "c"})
    spans.clear()
    sent = client.post("/v1/streams/traced-stream/events", json={"payload": {"n": 1}}, headers={"traceparent": PARENT})
    assert sent.status_code == 201
    [span] = _server_spans(spans)
    assert span.name == "POST /v1/streams/{name}/events" and format(span.context.trace_id, "032x") == TRACE_ID
    tracing.install(None)  # the next append comes from an untraced server
    try:
        client.post("/v1/streams/traced-stream/events", json={"payload": "plain"}, headers={"traceparent": PARENT})
    finally:
        tracing.install(provider)
    got = client.get("/v1/streams/traced-stream/consumers/c/batch", params={"wait": 5}).json()["events"]
    while len(got) < 2:
        got += client.get("/v1/streams/traced-stream/consumers/c/batch", params={"wait": 5}).json()["events"]
    first, second = got
    carried = trace.get_current_span(tracing.context_of(first["traceparent"])).get_span_context()
    assert format(carried.trace_id, "032x") == TRACE_ID and carried.span_id == span.context.span_id
    assert "traceparent" not in second


async def test_a_stream_consumer_continues_the_producers_trace(dsn, spans, provider):
    """The Python client's producer stamps the caller's current span on the events it
    appends; its Consumer runs each handler in a CONSUMER span under that trace."""
    from conveyor.client import Consumer, Producer
    from conveyor.core import streams
    from conveyor.db import pool

    async with pool.connect(dsn) as conn:
        await streams.create(conn, "traced-events")
        await streams.subscribe(conn, "traced-events", "worker")
    tracer = provider.get_tracer("test")
    async with Producer(dsn) as producer:
        with tracer.start_as_current_span("checkout") as sending:
            await producer.append("traced-events", {"order": 1})
        await producer.append("traced-events", {"order": 2})  # no span: no trace
    async with pool.connect(dsn) as conn:
        await streams.force_tick(conn, "traced-events")
    consumer = Consumer(dsn, "traced-events", "worker")
    handled = []

    @consumer.handler("default")
    def handle(event, ctx) -> None:  # a sync handler runs in a thread: the span goes with it
        handled.append((event.payload, trace.get_current_span().get_span_context().trace_id))

    await consumer.process_batch()
    consumers = [s for s in spans.get_finished_spans() if s.kind == trace.SpanKind.CONSUMER]
    assert [s.name for s in consumers] == ["process traced-events"] * 2
    first, second = consumers
    assert first.context.trace_id == sending.get_span_context().trace_id
    assert first.parent.span_id == sending.get_span_context().span_id
    assert second.parent is None and second.context.trace_id != first.context.trace_id
    assert handled == [('{"order":1}', first.context.trace_id), ('{"order":2}', second.context.trace_id)]
