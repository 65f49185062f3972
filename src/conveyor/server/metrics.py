"""Prometheus metrics with seed 000's families (http_*, queue_*, db_pool_*), streams,
consumers and consumer groups, one registry per app so that several apps in one process
(tests) do not collide.

With several server processes (``--workers N``) every process writes its series to the
shared ``PROMETHEUS_MULTIPROC_DIR`` (prometheus-client's multiprocess mode, set up by
``conveyor.server.run``) and ``/metrics``, answered by any of them, adds the counters and
histograms of all; gauges say how they combine (``multiprocess_mode``): requests in
flight add up (``livesum``). The database's figures (depths, lags: ``_Figures``) are not
such gauges: one process reads them and shares them through a file of that directory,
each refresh replacing the last whole."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from conveyor import types

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

ROUTING_KEYS = "_routing_keys"  # the topic label of publishes by routing key (/v1/events/{key})

_HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_DB_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_AGE_BUCKETS = (0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)
_BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
_WEBHOOK_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _PoolCollector:
    def __init__(self, stats: Callable[[], object]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:  # the prometheus_client collector protocol
        s = self._stats()
        for name, doc, value in (("db_pool_size", "Database connections (idle + active)", s.size),
                                 ("db_pool_idle", "Idle database connections", s.idle),
                                 ("db_pool_active", "Checked-out database connections", s.active)):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            yield g
        c = CounterMetricFamily("db_pool_acquire_timeouts", "Pool exhaustion errors")
        c.add_metric([], s.acquire_timeouts)
        yield c


# The database's figures of the depth scrape: name -> (help, label names). Their label sets
# come and go with queues, streams, consumers and groups, so each refresh replaces a
# family's series wholesale: a dropped queue leaves no series behind.
_FIGURES: dict[str, tuple[str, tuple[str, ...]]] = {
    "queue_depth": ("Visible messages (refreshed by the depth scrape)", ("queue",)),
    "queue_in_flight": ("Received, not yet visible again", ("queue",)),
    "queue_delayed": ("Sent with a delay that has not run out", ("queue",)),
    "stream_depth": ("Events not yet consumed by every consumer", ("stream",)),
    "stream_dead_letters": ("Dead letters kept", ("stream",)),
    "stream_consumer_lag_seconds": ("Age of the last tick a consumer finished", ("stream", "consumer")),
    "stream_consumer_pending_events": ("Events a consumer has still to receive", ("stream", "consumer")),
    "pqueue_group_lag_messages": ("Messages a consumer group of a partitioned queue has still to consume",
                                  ("queue", "group")),
    "pqueue_group_partitions_behind": ("Partitions with messages a consumer group has not consumed",
                                       ("queue", "group")),
}
Rows = list[tuple[tuple[str, ...], float]]


class _Figures:
    """The database's figures (``_FIGURES``), as the depth scrape last read them.

    Not prometheus-client gauges: in multiprocess mode a gauge's series live in the
    processes' files and ``clear()`` cannot remove them, so a dropped queue's depth stayed
    in /metrics until the server stopped. One process (the first worker) reads the
    figures; with several, it also writes them to ``FILE`` in the shared
    ``PROMETHEUS_MULTIPROC_DIR`` (replaced whole, atomically), which every process's
    /metrics reads."""

    FILE = "conveyor_database_figures.json"

    def __init__(self) -> None:
        self._rows: dict[str, Rows] = {}

    def replace(self, families: dict[str, Rows]) -> None:
        self._rows.update(families)
        folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if folder:
            path = os.path.join(folder, self.FILE)
            partial = f"{path}.{os.getpid()}"
            with open(partial, "wb") as f:
                f.write(orjson.dumps(self._rows))
            os.replace(partial, path)

    def _current(self) -> dict[str, Rows]:
        folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if not folder:
            return self._rows
        try:
            with open(os.path.join(folder, self.FILE), "rb") as f:
                return {name: [(tuple(labels), value) for labels, value in rows]
                        for name, rows in orjson.loads(f.read()).items()}
        except FileNotFoundError:
            return {}  # no depth scrape yet

    def collect(self) -> Iterator[Metric]:  # the prometheus_client collector protocol
        rows = self._current()
        for name, (doc, labels) in _FIGURES.items():
            family = GaugeMetricFamily(name, doc, labels=list(labels))
            for values, value in rows.get(name, ()):
                family.add_metric(list(values), value)
            yield family


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._series: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._own: list[Any] = []  # collectors of this process's own state (not in the multiprocess files)
        r = self.registry
        self.http_requests = Counter("http_requests_total", "Requests completed",
                                     ["method", "path", "status"], registry=r)
        self.http_duration = Histogram("http_request_duration_seconds", "Request latency",
                                       ["method", "path"], buckets=_HTTP_BUCKETS, registry=r)
        self.http_active = Gauge("http_connections_active", "Requests in flight", registry=r,
                                 multiprocess_mode="livesum")
        self.sent = Counter("queue_messages_sent_total", "Messages enqueued", ["queue"], registry=r)
        self.received = Counter("queue_messages_received_total", "Messages delivered", ["queue"], registry=r)
        self.deleted = Counter("queue_messages_deleted_total", "Messages acknowledged (deleted or archived)",
                               ["queue"], registry=r)
        self.redelivered = Counter("queue_messages_redelivered_total",
                                   "Messages delivered again after a visibility timeout ran out", ["queue"], registry=r)
        self.send_duration = Histogram("queue_message_send_duration_seconds", "Send latency (database)",
                                       ["queue"], buckets=_DB_BUCKETS, registry=r)
        self.receive_duration = Histogram("queue_message_receive_duration_seconds", "Receive latency (database)",
                                          ["queue"], buckets=_DB_BUCKETS, registry=r)
        self.delete_duration = Histogram("queue_message_delete_duration_seconds", "Delete latency (database)",
                                         ["queue"], buckets=_DB_BUCKETS, registry=r)
        self.age_at_receive = Histogram("queue_message_age_at_receive_seconds", "Age at first delivery",
                                        ["queue"], buckets=_AGE_BUCKETS, registry=r)
        self.fusion_batch = Histogram("queue_coalescer_flush_batch_size", "Messages per fused send",
                                      buckets=_BATCH_BUCKETS, registry=r)
        same = {"registry": r, "multiprocess_mode": "livemax"}  # a database figure: the same in every process
        self.long_pollers = Gauge("queue_long_pollers", "Receives waiting for messages", registry=r,
                                  multiprocess_mode="livesum")
        # the queues', streams', consumers' and consumer groups' figures of the depth scrape
        self.figures = _Figures()
        self._own.append(self.figures)
        r.register(self.figures)
        self.pqueues_created = Counter("pqueue_queues_created_on_push_total", "Partitioned queues created by a "
                                       "push that named them (Queen's create-on-push)", registry=r)
        # topics: publishes and webhook deliveries (server/webhooks.py)
        self.published = Counter("topic_messages_published_total", "Messages published to a topic",
                                 ["topic"], registry=r)
        self.fanned_out = Counter("topic_fanout_total", "Copies a publish made: queue messages and "
                                  "webhook deliveries queued", ["topic", "kind"], registry=r)
        self.delivery_attempts = Counter("queue_delivery_attempts_total", "HTTP webhook delivery attempts",
                                         ["outcome"], registry=r)
        self.delivery_duration = Histogram("queue_delivery_attempt_duration_seconds", "Webhook round-trip latency",
                                           ["outcome"], buckets=_WEBHOOK_BUCKETS, registry=r)
        self.delivery_exhausted = Counter("queue_delivery_exhausted_total",
                                          "Deliveries abandoned after their last attempt", registry=r)
        self.delivery_held = Counter("queue_delivery_held_total",
                                     "Deliveries held, never attempted: destination not allowed", registry=r)
        self.delivery_outbox = Gauge("queue_delivery_outbox", "Webhook outbox rows by state (refreshed by the "
                                     "delivery worker)", ["state"], **same)
        for outcome in ("success", "failure"):  # both series exist from the start, at zero
            self.delivery_attempts.labels(outcome)
        # schedules (server/scheduler.py)
        self.schedule_fires = Counter("schedule_fires_total", "Scheduled occurrences fired (messages sent or "
                                      "published by the scheduler)", registry=r)
        self.schedule_failures = Counter("schedule_failures_total", "Scheduler steps that failed for a schedule",
                                         registry=r)
        self.schedule_pauses = Counter("schedule_pauses_total", "Schedules paused after failure_threshold "
                                       "consecutive failures", registry=r)

        # admission control (server/middleware.py Admission, server/fusion.py)
        self.admission_refused = Counter("conveyor_admission_refused_total", "Requests refused by admission "
                                         "control (answered with the protocol's throttling error)", ["stage"],
                                         registry=r)
        self.connections_closed = Counter("conveyor_connections_closed_total", "Connections the server closed "
                                          "(server/connections.py): idle (no request within "
                                          "CONVEYOR_HTTP_IDLE_TIMEOUT), headers (unfinished after "
                                          "CONVEYOR_HTTP_HEADER_TIMEOUT), pushed_out or refused (beyond "
                                          "CONVEYOR_MAX_CONNECTIONS)", ["reason"], registry=r)
        self.request_timeouts = Counter("conveyor_request_timeouts_total", "Requests cancelled and answered 408 "
                                        "after CONVEYOR_REQUEST_TIMEOUT (server/deadline.py)", registry=r)
        # the failover spool (server/spool.py)
        self.spooled = Counter("conveyor_spooled_total", "Messages acknowledged from the failover spool while "
                               "the database was unreachable", registry=r)
        self.spool_replayed = Counter("conveyor_spool_replayed_total", "Spool records replayed into the database",
                                      registry=r)
        self.spool_rejected = Counter("conveyor_spool_rejected_total", "Spool records the database refused at "
                                      "replay (set aside in the slot's rejected.jsonl)", registry=r)
        self.spool_damaged = Counter("conveyor_spool_damaged_total", "Damaged stretches of spool segments "
                                     "(unreadable records) found at replay: set aside in the slot's rejected.jsonl, "
                                     "the segment kept as .damaged", registry=r)
        # background workers (server/supervisor.py)
        self.worker_up = Gauge("conveyor_worker_up", "1 while the background worker runs, 0 while it waits "
                               "to be started again after a failure (with several processes: the lowest)",
                               ["worker"], registry=r, multiprocess_mode="livemin")
        self.worker_restarts = Counter("conveyor_worker_restarts_total", "Background worker failures "
                                       "(each followed by a restart)", ["worker"], registry=r)

    def series(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, looked up once: on the hot path prometheus_client's
        lookup costs more than the update itself. For counters and histograms only, whose
        series are never removed (the database's figures are ``_Figures``)."""
        key = (id(metric), labels)
        child = self._series.get(key)
        if child is None:
            child = self._series[key] = metric.labels(*labels)
        return child

    def watch_pool(self, stats: Callable[[], object]) -> None:
        collector = _PoolCollector(stats)
        self._own.append(collector)
        self.registry.register(collector)

    def record_received(self, queue: str, received: list[types.Message]) -> None:
        if not received:
            return
        self.series(self.received, queue).inc(len(received))
        now = time.time()
        redelivered = sum(m.receive_count > 1 for m in received)
        if redelivered:
            self.series(self.redelivered, queue).inc(redelivered)
        if redelivered < len(received):
            ages = self.series(self.age_at_receive, queue)
            for m in received:
                if m.receive_count <= 1:
                    ages.observe(max(now - m.sent_at.timestamp(), 0.0))

    def set_depths(self, rows: Sequence[types.QueueMetrics | types.QueueDepth]) -> None:
        self.figures.replace({
            "queue_depth": [((m.queue_name,), m.queue_length) for m in rows],
            "queue_in_flight": [((m.queue_name,), m.in_flight) for m in rows],
            "queue_delayed": [((m.queue_name,), m.delayed) for m in rows]})

    def record_published(self, topic: str | None, published: types.Published) -> None:
        """Count a publish under its SNS topic (topics exist before they are published to),
        or, for a REST routing key, under the one label ``ROUTING_KEYS``: a label never
        takes a value a client can vary without bound."""
        label = topic or ROUTING_KEYS
        self.series(self.published, label).inc()
        if published.queues:
            self.series(self.fanned_out, label, "queue").inc(len(published.queues))
        if published.endpoints:
            self.series(self.fanned_out, label, "webhook").inc(published.endpoints)

    def record_delivery_attempt(self, ok: bool, seconds: float) -> None:
        outcome = "success" if ok else "failure"
        self.delivery_attempts.labels(outcome).inc()
        self.delivery_duration.labels(outcome).observe(seconds)

    def record_delivery_exhausted(self) -> None:
        self.delivery_exhausted.inc()

    def record_delivery_held(self) -> None:
        self.delivery_held.inc()

    def set_delivery_states(self, stats: types.DeliveryStats) -> None:
        for state in ("pending", "held", "exhausted"):
            self.delivery_outbox.labels(state).set(getattr(stats, state))

    def set_streams(self, stats: list[types.StreamStats], consumers: list[types.ConsumerStats],
                    groups: list[types.ConsumerGroupLag]) -> None:
        self.figures.replace({
            "stream_depth": [((s.stream,), s.depth) for s in stats],
            "stream_dead_letters": [((s.stream,), s.dead_letters) for s in stats],
            "stream_consumer_lag_seconds": [((c.stream, c.consumer), c.lag.total_seconds())
                                            for c in consumers if c.lag is not None],
            "stream_consumer_pending_events": [((c.stream, c.consumer), c.pending_events) for c in consumers],
            "pqueue_group_lag_messages": [((g.queue, g.consumer_group), g.lag) for g in groups],
            "pqueue_group_partitions_behind": [((g.queue, g.consumer_group), g.partitions_behind)
                                               for g in groups]})

    def render(self) -> bytes:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # several processes: what all of them wrote
            combined = CollectorRegistry()
            multiprocess.MultiProcessCollector(combined)
            for collector in self._own:  # this process's pool
                combined.register(collector)
            return generate_latest(combined)
        return generate_latest(self.registry)
