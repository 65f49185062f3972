"""Tracing with OpenTelemetry: a span for every request and every background job's run,
continuing the caller's trace, and the trace carried by the messages a request writes.

Off by default (``CONVEYOR_TRACING``); then nothing here runs but a check of one module
variable. On, spans go to an OTLP/HTTP collector (``CONVEYOR_TRACING_ENDPOINT``),
sampled at ``CONVEYOR_TRACING_SAMPLE_RATE`` (a caller's sampling decision is followed).

Where a trace comes from and goes:

- a request's W3C ``traceparent`` header (REST, Queen's API), or AWS's ``X-Amzn-Trace-Id``
  (SQS and SNS clients instrumented with X-Ray) is the parent of the request's span;
- each queue message a request sends carries its trace: SQS's ``AWSTraceHeader`` when the
  client set one, otherwise the request span's ``traceparent``, kept with the message
  (``system_attributes``); consumers read it back (REST ``traceparent``, SQS
  ``AWSTraceHeader``) and continue the trace with ``context_of``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()
_XRAY = re.compile(r"Root=1-([0-9a-f]{8})-([0-9a-f]{24})(?:;Parent=([0-9a-f]{16}))?(?:;Sampled=([01]))?", re.I)

_tracer: trace.Tracer | None = None


def install(provider: Any) -> None:
    """Trace with ``provider`` (an SDK TracerProvider); None turns tracing off."""
    global _tracer
    _tracer = provider.get_tracer("conveyor") if provider is not None else None


def enabled() -> bool:
    return _tracer is not None


def configure(enabled_: bool, endpoint: str, sample_rate: float, service: str = "conveyor") -> Any:
    """The server's tracer provider from its settings (None when tracing is off: what
    ``install`` set, if anything, stays)."""
    if not enabled_:
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(sample_rate)),
                              resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    install(provider)
    return provider


# -- where traces come from -----------------------------------------------------------------

def from_xray(header: str | None) -> Context | None:
    """An X-Ray trace header (``Root=1-...;Parent=...;Sampled=1``) as a parent context."""
    match = _XRAY.search(header or "")
    if not match or not match[3]:
        return None
    span = SpanContext(trace_id=int(match[1] + match[2], 16), span_id=int(match[3], 16), is_remote=True,
                       trace_flags=TraceFlags(TraceFlags.SAMPLED if match[4] != "0" else TraceFlags.DEFAULT))
    return trace.set_span_in_context(NonRecordingSpan(span))


def context_of(traceparent: str | None = None, aws_trace_header: str | None = None) -> Context | None:
    """The trace a message (or request) carries, to continue it: a W3C traceparent, or an
    X-Ray header. None when it carries none."""
    if traceparent:
        found = _PROPAGATOR.extract({"traceparent": traceparent})
        if trace.get_current_span(found).get_span_context().is_valid:
            return found
    return from_xray(aws_trace_header)


def _request_context(headers: Mapping[str, str]) -> Context | None:
    return context_of(headers.get("traceparent"), headers.get("x-amzn-trace-id"))


# -- spans -------------------------------------------------------------------------------------

@contextlib.contextmanager
def request_span(method: str, path: str, headers: Mapping[str, str]) -> Iterator[Any]:
    """The span of one HTTP request (a SERVER span under the caller's trace), or None."""
    if _tracer is None:
        yield None
        return
    with _tracer.start_as_current_span(f"{method} {path}", context=_request_context(headers), kind=SpanKind.SERVER,
                                       attributes={"http.request.method": method, "url.path": path}) as span:
        yield span


@contextlib.contextmanager
def job_span(name: str) -> Iterator[None]:
    """The span of one run of a background job (a new trace each run)."""
    if _tracer is None:
        yield
        return
    with _tracer.start_as_current_span(f"conveyor.{name}", context=Context(), kind=SpanKind.INTERNAL):
        yield


@contextlib.contextmanager
def consumer_span(name: str, traceparent: str | None) -> Iterator[None]:
    """A CONSUMER span under the trace a message carries (its sender's), for the work
    done on it; a new trace when it carries none. Tasks created inside inherit it."""
    if _tracer is None:
        yield
        return
    with _tracer.start_as_current_span(name, context=context_of(traceparent) or Context(), kind=SpanKind.CONSUMER):
        yield


def current_traceparent() -> str | None:
    """The W3C traceparent of the span now running, if tracing is on and one is."""
    if _tracer is None:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent")
