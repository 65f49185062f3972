"""SNS delivery policies of HTTP(S) subscriptions: read when set, applied by the webhook worker.

A topic's ``DeliveryPolicy`` attribute holds defaults under ``http``
(``defaultHealthyRetryPolicy``, ``defaultThrottlePolicy``, ``defaultRequestPolicy``,
``disableSubscriptionOverrides``); a subscription's holds its own ``healthyRetryPolicy``,
``throttlePolicy`` and ``requestPolicy``, which win unless the topic disables overrides.
Unset parts take SNS's defaults: three retries 20 s apart, no throttle,
``text/plain; charset=UTF-8``.

A retry policy has SNS's four phases: ``numNoDelayRetries`` at once, ``numMinDelayRetries``
``minDelayTarget`` apart, the backoff phase (the retries left over) rising from
``minDelayTarget`` to ``maxDelayTarget`` by ``backoffFunction``, then
``numMaxDelayRetries`` ``maxDelayTarget`` apart. SNS publishes the backoff functions only as
a chart; here retry ``i`` of the ``n`` in the backoff phase waits
``min + (max - min) * f(i / n)`` with ``f(x)`` = ``x`` (linear), ``x**2`` (arithmetic: the
step grows by a constant), ``x**3`` (geometric) and ``(2**(10x) - 1) / 1023``
(exponential: doubling), so each ends at ``maxDelayTarget``. No jitter: a schedule that can
be read off the policy is worth more here than spreading a fleet's retries.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

BACKOFF_FUNCTIONS = ("linear", "arithmetic", "geometric", "exponential")
MAX_RETRIES = 100
MAX_DELAY = 3600  # seconds: SNS's ceiling for a delay target and for the whole policy's retry time
DEFAULT_CONTENT_TYPE = "text/plain; charset=UTF-8"
_CONTENT_TYPE = re.compile(r"^[A-Za-z0-9!#$&^_.+-]+/[A-Za-z0-9!#$&^_.+-]+(\s*;\s*charset=[A-Za-z0-9_.:-]+)?$")
_RETRY_KEYS = {"minDelayTarget": "min_delay", "maxDelayTarget": "max_delay", "numRetries": "retries",
               "numNoDelayRetries": "no_delay_retries", "numMinDelayRetries": "min_delay_retries",
               "numMaxDelayRetries": "max_delay_retries", "backoffFunction": "backoff"}


class Invalid(ValueError):
    """A delivery policy SNS would refuse; the text follows ``DeliveryPolicy: ``."""


@dataclass(frozen=True)
class RetryPolicy:
    min_delay: int = 20
    max_delay: int = 20
    retries: int = 3
    no_delay_retries: int = 0
    min_delay_retries: int = 0
    max_delay_retries: int = 0
    backoff: str = "linear"

    @property
    def attempts(self) -> int:
        """The first try and every retry."""
        return self.retries + 1

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1 = the first retry)."""
        if retry <= self.no_delay_retries:
            return 0.0
        retry -= self.no_delay_retries
        if retry <= self.min_delay_retries:
            return float(self.min_delay)
        retry -= self.min_delay_retries
        backoff = self.retries - self.no_delay_retries - self.min_delay_retries - self.max_delay_retries
        if retry > backoff:
            return float(self.max_delay)
        x = retry / backoff
        shape = {"linear": x, "arithmetic": x ** 2, "geometric": x ** 3,
                 "exponential": (2 ** (10 * x) - 1) / 1023}[self.backoff]
        return round(self.min_delay + (self.max_delay - self.min_delay) * shape, 3)

    def total(self) -> float:
        return sum(self.delay(i) for i in range(1, self.retries + 1))

    def as_sns(self) -> dict[str, Any]:
        values = asdict(self)
        return {name: values[field] for name, field in _RETRY_KEYS.items()}


@dataclass(frozen=True)
class Effective:
    """What the worker applies to one subscription's deliveries."""

    retry: RetryPolicy = RetryPolicy()
    max_per_second: int | None = None  # throttlePolicy.maxReceivesPerSecond
    content_type: str = DEFAULT_CONTENT_TYPE
    overridable: bool = True  # the topic's disableSubscriptionOverrides, negated

    def subscription_json(self) -> str:
        """A subscription's EffectiveDeliveryPolicy, as SNS shows it."""
        return json.dumps({
            "healthyRetryPolicy": self.retry.as_sns(), "sicklyRetryPolicy": None,
            "throttlePolicy": None if self.max_per_second is None else {"maxReceivesPerSecond": self.max_per_second},
            "requestPolicy": {"headerContentType": self.content_type}, "guaranteed": False,
        }, separators=(",", ":"))

    def topic_json(self) -> str:
        """A topic's EffectiveDeliveryPolicy (its ``http`` defaults), as SNS shows it."""
        http: dict[str, Any] = {"defaultHealthyRetryPolicy": self.retry.as_sns(),
                                "disableSubscriptionOverrides": not self.overridable}
        if self.max_per_second is not None:
            http["defaultThrottlePolicy"] = {"maxReceivesPerSecond": self.max_per_second}
        http["defaultRequestPolicy"] = {"headerContentType": self.content_type}
        return json.dumps({"http": http}, separators=(",", ":"))


DEFAULT = Effective()


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise Invalid(f"{where} must be a JSON object")
    return value


def _retry(value: Any, where: str, base: RetryPolicy = RetryPolicy()) -> RetryPolicy:
    given = _object(value, where)
    fields: dict[str, Any] = asdict(base)
    for name, raw in given.items():
        if name not in _RETRY_KEYS:
            raise Invalid(f"{where}: unknown key {name}")
        if name == "backoffFunction":
            if not isinstance(raw, str) or raw.lower() not in BACKOFF_FUNCTIONS:
                raise Invalid(f"{where}.backoffFunction must be one of {', '.join(BACKOFF_FUNCTIONS)}")
            fields["backoff"] = raw.lower()
        elif isinstance(raw, bool) or not isinstance(raw, int):
            raise Invalid(f"{where}.{name} must be an integer")
        else:
            fields[_RETRY_KEYS[name]] = raw
    policy = RetryPolicy(**fields)
    if not 0 <= policy.retries <= MAX_RETRIES:
        raise Invalid(f"{where}.numRetries must be between 0 and {MAX_RETRIES}")
    if not 1 <= policy.min_delay <= policy.max_delay:
        raise Invalid(f"{where}.minDelayTarget must be at least 1 and at most maxDelayTarget")
    if policy.max_delay > MAX_DELAY:
        raise Invalid(f"{where}.maxDelayTarget must be at most {MAX_DELAY}")
    phases = (policy.no_delay_retries, policy.min_delay_retries, policy.max_delay_retries)
    if min(phases) < 0:
        raise Invalid(f"{where}: numNoDelayRetries, numMinDelayRetries and numMaxDelayRetries must be 0 or more")
    if sum(phases) > policy.retries:
        raise Invalid(f"{where}: numNoDelayRetries + numMinDelayRetries + numMaxDelayRetries "
                      "must be at most numRetries")
    if policy.total() > MAX_DELAY:
        raise Invalid(f"{where}: the retries take {policy.total():g} s in all, more than {MAX_DELAY} s")
    return policy


def _throttle(value: Any, where: str) -> int:
    rate = _object(value, where).get("maxReceivesPerSecond")
    if isinstance(rate, bool) or not isinstance(rate, int) or rate < 1:
        raise Invalid(f"{where}.maxReceivesPerSecond must be an integer of at least 1")
    return rate


def _content_type(value: Any, where: str) -> str:
    kind = _object(value, where).get("headerContentType", DEFAULT_CONTENT_TYPE)
    if not isinstance(kind, str) or not _CONTENT_TYPE.match(kind):
        raise Invalid(f"{where}.headerContentType must be a content type such as application/json")
    return kind


def _parse(text: str | None) -> Mapping[str, Any]:
    if not text:
        return {}
    try:
        parsed = json.loads(text)
    except ValueError:
        raise Invalid("failed to parse JSON") from None
    return _object(parsed, "the policy")


def topic(text: str | None) -> Effective:
    """A topic's DeliveryPolicy text (or None) as the defaults of its HTTP(S) subscriptions."""
    policy = _parse(text)  # sections for other protocols are SNS's own endpoints: not read here
    http = _object(policy.get("http", {}), "http")
    known = {"defaultHealthyRetryPolicy", "defaultThrottlePolicy", "defaultRequestPolicy",
             "disableSubscriptionOverrides", "defaultSicklyRetryPolicy"}
    for name in http:
        if name not in known:
            raise Invalid(f"http: unknown key {name}")
    overrides = http.get("disableSubscriptionOverrides", False)
    if not isinstance(overrides, bool):
        raise Invalid("http.disableSubscriptionOverrides must be true or false")
    return Effective(
        retry=_retry(http["defaultHealthyRetryPolicy"], "http.defaultHealthyRetryPolicy")
        if "defaultHealthyRetryPolicy" in http else RetryPolicy(),
        max_per_second=_throttle(http["defaultThrottlePolicy"], "http.defaultThrottlePolicy")
        if "defaultThrottlePolicy" in http else None,
        content_type=_content_type(http["defaultRequestPolicy"], "http.defaultRequestPolicy")
        if "defaultRequestPolicy" in http else DEFAULT_CONTENT_TYPE,
        overridable=not overrides)


def subscription(text: str | None, defaults: Effective = DEFAULT) -> Effective:
    """A subscription's DeliveryPolicy text (or None) over its topic's ``defaults``."""
    policy = _parse(text)
    for name in policy:
        if name not in ("healthyRetryPolicy", "throttlePolicy", "requestPolicy", "sicklyRetryPolicy"):
            raise Invalid(f"unknown key {name}")
    if not policy or not defaults.overridable:
        return defaults
    return Effective(
        retry=_retry(policy["healthyRetryPolicy"], "healthyRetryPolicy")
        if "healthyRetryPolicy" in policy else defaults.retry,
        max_per_second=_throttle(policy["throttlePolicy"], "throttlePolicy")
        if "throttlePolicy" in policy else defaults.max_per_second,
        content_type=_content_type(policy["requestPolicy"], "requestPolicy")
        if "requestPolicy" in policy else defaults.content_type,
        overridable=defaults.overridable)


def effective(topic_text: str | None, subscription_text: str | None) -> Effective:
    """What applies to a subscription's deliveries; a policy stored before it was checked
    that no longer reads counts as unset (SNS's defaults), never as an error at delivery."""
    try:
        defaults = topic(topic_text)
    except Invalid:
        defaults = DEFAULT
    try:
        return subscription(subscription_text, defaults)
    except Invalid:
        return defaults
