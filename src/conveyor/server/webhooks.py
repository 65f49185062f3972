"""The webhook delivery worker: POSTs the topics' HTTP(S) outbox rows to their endpoints.

Each round claims up to ``batch`` due rows (``topics.delivery_claim``: SKIP LOCKED, so any
number of server processes can run this worker on one database; a claim leases the rows
for a while, so a process that dies mid-delivery gives them back when the lease ends),
releases the database connection, POSTs them concurrently, then records the outcomes:

* a 2xx answer deletes the row (``delivery_succeeded``);
* anything else — another status (redirects are not followed), a timeout, a refused or
  reset connection, a failed DNS lookup — counts an attempt (``delivery_failed``): the next
  one follows the subscription's delivery policy (``core.delivery_policy``: its own
  DeliveryPolicy over its topic's, SNS's defaults otherwise: three retries 20 s apart), and
  once the attempts are used up the message goes to the subscription's dead-letter queue
  (RedrivePolicy) if that queue exists, else the row stays with its last error ("exhausted");
* rows over their subscription's ``maxReceivesPerSecond`` are not attempted this round:
  deferred (``delivery_defer``) without counting an attempt. The throttle is counted per
  server process: N processes deliver at most N times the rate;
* a destination the egress allowlist does not allow is never attempted: the row is held
  with the reason (``delivery_hold``).

The row carries the exact body (raw message or signed envelope, chosen at publish time)
and SNS's headers; the worker adds the policy's ``Content-Type`` (SNS's default
``text/plain; charset=UTF-8``),
and completes an envelope's ``UnsubscribeURL`` with the subscription's token
(``core.unsubscribe_links``: only the endpoint ever sees it). Connections go only to
addresses the allowlist checked (see ``egress``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import ssl
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import aiohttp.abc
import yarl

from conveyor import errors, tracing, types
from conveyor.core import delivery_policy, topics, unsubscribe_links
from conveyor.db.pool import Database
from conveyor.server import egress
from conveyor.server.metrics import Metrics

log = logging.getLogger(__name__)

USER_AGENT = "Amazon Simple Notification Service Agent"  # what SNS sends; some receivers check it
MAX_ERROR_BODY = 200  # characters of an error answer kept in last_error
STATS_INTERVAL = 15.0


@dataclass(frozen=True)
class Config:
    allowlist: egress.Allowlist
    timeout: float = 5.0
    batch: int = 50
    poll: float = 1.0
    tls: ssl.SSLContext | None = None  # None: verify HTTPS endpoints against the system's CAs
    region: str | None = None  # the server's region: how dead-letter queues' ARNs map to names

    @property
    def lease_seconds(self) -> int:
        """How long claimed rows stay with this worker: the POSTs run concurrently, so
        a round takes about one timeout; the margin covers recording the outcomes."""
        return max(30, math.ceil(self.timeout * 3))


@dataclass(frozen=True)
class Outcome:
    ok: bool
    error: str | None = None
    held: bool = False
    seconds: float = 0.0


class CheckingResolver(aiohttp.abc.AbstractResolver):
    """aiohttp's resolver, replaced: resolve, check every address, connect only to those."""

    def __init__(self, allowlist: egress.Allowlist) -> None:
        self.allowlist = allowlist

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[dict[str, Any]]:
        found = await egress.resolve(self.allowlist, host, port, family)
        return [{"hostname": host, "host": r.address, "port": port, "family": r.family, "proto": 0,
                 "flags": socket.AI_NUMERICHOST} for r in found]

    async def close(self) -> None:
        return None


def session(config: Config) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(resolver=CheckingResolver(config.allowlist), use_dns_cache=False,
                                     family=socket.AF_UNSPEC, limit=max(config.batch, 1),
                                     ssl=config.tls if config.tls is not None else True)
    return aiohttp.ClientSession(connector=connector, trust_env=False, auto_decompress=False,
                                 timeout=aiohttp.ClientTimeout(total=config.timeout),
                                 headers={"User-Agent": USER_AGENT})


def request_headers(delivery: types.Delivery, content_type: str = delivery_policy.DEFAULT_CONTENT_TYPE
                    ) -> dict[str, str]:
    headers = {k: str(v) for k, v in (delivery.headers or {}).items() if k.lower() != "content-type"}
    headers.setdefault("x-amz-sns-message-id", str(delivery.message_id))
    headers["Content-Type"] = content_type
    return headers


class Throttle:
    """Each subscription's ``maxReceivesPerSecond``, counted in one-second windows."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.windows: dict[int, tuple[float, int]] = {}  # subscription id -> (window start, sent in it)

    def admit(self, claimed: list[types.Delivery], policies: Mapping[int, delivery_policy.Effective]
              ) -> tuple[list[types.Delivery], dict[float, list[int]]]:
        """The rows to attempt now, and the others by how many seconds to defer them."""
        now = self.clock()
        now_rows: list[types.Delivery] = []
        later: dict[float, list[int]] = {}
        for d in claimed:
            rate = policies[d.id].max_per_second
            if rate is None:
                now_rows.append(d)
                continue
            start, sent = self.windows.get(d.subscription_id, (now, 0))
            if now - start >= 1.0:
                start, sent = now, 0
            if sent < rate:
                now_rows.append(d)
            else:
                wait = round(1.0 - (now - start) + (sent - rate) // rate, 3)
                later.setdefault(wait, []).append(d.id)
            self.windows[d.subscription_id] = (start, sent + 1)
        return now_rows, later


def body(delivery: types.Delivery, links: unsubscribe_links.Links) -> str:
    """What to POST: the stored body, an envelope's UnsubscribeURL with its token added."""
    headers = delivery.headers or {}
    if headers.get("x-amz-sns-rawdelivery") == "true":
        return delivery.payload  # the publisher's own text: no envelope, no link
    _, _, key = str(headers.get("x-amz-sns-subscription-arn", "")).rpartition(":")
    try:
        subscription = uuid.UUID(key)
    except ValueError:
        return delivery.payload
    return links.stamp(delivery.payload, subscription)


async def attempt(http: aiohttp.ClientSession, config: Config, delivery: types.Delivery,
                  links: unsubscribe_links.Links, content_type: str = delivery_policy.DEFAULT_CONTENT_TYPE
                  ) -> Outcome:
    """POST one delivery; never raises."""
    started = time.perf_counter()
    try:
        url = yarl.URL(delivery.endpoint)
        if url.scheme not in ("http", "https") or not url.host:
            return Outcome(False, f"not an http(s) URL: {delivery.endpoint}")
        egress.check_literal(config.allowlist, url.host)
        async with http.post(url, data=body(delivery, links).encode("utf-8"), headers=request_headers(delivery, content_type),
                             allow_redirects=False) as response:
            text = (await response.content.read(MAX_ERROR_BODY * 4)).decode("utf-8", "replace")
            elapsed = time.perf_counter() - started
            if 200 <= response.status < 300:
                return Outcome(True, seconds=elapsed)
            return Outcome(False, f"HTTP {response.status}: {text[:MAX_ERROR_BODY]}".rstrip(": "), seconds=elapsed)
    except egress.Denied as exc:
        return Outcome(False, str(exc), held=True)
    except TimeoutError:
        return Outcome(False, f"timed out after {config.timeout:g} s", seconds=time.perf_counter() - started)
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        return Outcome(False, _describe(exc), seconds=time.perf_counter() - started)


def _describe(exc: BaseException) -> str:
    cause = exc.__cause__ or exc
    return f"{type(exc).__name__}: {cause}"[:500]


async def record(database: Database, metrics: Metrics, claimed: list[types.Delivery],
                 outcomes: list[Outcome], policies: Mapping[int, delivery_policy.Effective],
                 region: str | None = None) -> None:
    """Store what happened to each claimed delivery."""
    async with database.connection() as conn:
        done = [d.id for d, o in zip(claimed, outcomes, strict=True) if o.ok]
        if done:
            await topics.delivery_succeeded(conn, done)
        for delivery, outcome in zip(claimed, outcomes, strict=True):
            if outcome.ok:
                continue
            try:
                if outcome.held:
                    await topics.delivery_hold(conn, delivery.id, outcome.error or "not allowed")
                    metrics.record_delivery_held()
                    continue
                retry = policies[delivery.id].retry
                made = delivery.attempt + 1  # attempts made, this one included
                after = await topics.delivery_failed(conn, delivery.id, outcome.error or "failed",
                                                     retry.delay(made) if made < retry.attempts else 0.0,
                                                     retry.attempts, region)
            except errors.DeliveryNotFound:
                continue  # unsubscribed meanwhile: the row went with its subscription
            if after.state == "exhausted":
                metrics.record_delivery_exhausted()
    for outcome in outcomes:
        if not outcome.held:
            metrics.record_delivery_attempt(outcome.ok, outcome.seconds)


async def step(database: Database, metrics: Metrics, http: aiohttp.ClientSession, config: Config,
               links: unsubscribe_links.Links | None = None, throttle: Throttle | None = None) -> int:
    """One round: claim, deliver, record. Returns how many deliveries were claimed.
    ``links``: the database's unsubscribe key, loaded now if not given (``run`` loads it once);
    ``throttle``: the subscriptions' rates so far (``run`` keeps one across rounds)."""
    async with database.connection() as conn:
        claimed = await topics.delivery_claim(conn, config.batch, config.lease_seconds)
        if not claimed:
            return 0
        links = links or await unsubscribe_links.load(conn)
        policies = await topics.delivery_policies(conn, claimed)
        now, later = (throttle or Throttle()).admit(claimed, policies)
        for seconds, ids in later.items():
            await topics.delivery_defer(conn, ids, seconds)
    with tracing.job_span("webhooks.deliver"):
        outcomes = await asyncio.gather(*(attempt(http, config, d, links, policies[d.id].content_type)
                                          for d in now))
        await record(database, metrics, now, list(outcomes), policies, config.region)
    return len(claimed)


async def _stats(database: Database, metrics: Metrics) -> None:
    async with database.connection() as conn:
        metrics.set_delivery_states(await topics.deliveries_stats(conn))


async def run(database: Database, metrics: Metrics, config: Config) -> None:
    """Deliver forever: a full batch is followed at once by the next round, anything less
    by a pause of ``config.poll`` seconds. Failures are logged, not fatal."""
    loop = asyncio.get_running_loop()
    next_stats = loop.time()
    links: unsubscribe_links.Links | None = None
    throttle = Throttle()
    async with session(config) as http:
        while True:
            claimed = 0
            try:
                if links is None:
                    async with database.connection() as conn:
                        links = await unsubscribe_links.load(conn)
                claimed = await step(database, metrics, http, config, links, throttle)
                if loop.time() >= next_stats:
                    await _stats(database, metrics)
                    next_stats = loop.time() + STATS_INTERVAL
            except errors.ConveyorError as exc:
                log.warning("webhook delivery failed: %s", exc)
            except Exception:
                log.exception("webhook delivery failed")
            if claimed < config.batch:
                await asyncio.sleep(config.poll)


def config_from(allow: Iterable[str], *, timeout: float, batch: int, poll: float, region: str | None = None) -> Config:
    return Config(allowlist=egress.Allowlist.parse(allow), timeout=timeout, batch=batch, poll=poll, region=region)
