"""Who is asking, where, and how SQS names map onto Conveyor queues.

SQS scopes queues per region (taken from the request's SigV4 credential scope) and per
account; ``conveyor.protocols.aws.service.RegionScope`` says how Conveyor stores them.

Queue URLs carry their region: ``{base_url}/queue/{region}/{account_id}/{name}`` (the
path form LocalStack also serves), except that a queue of the server's default region
keeps the short form ``{base_url}/{account_id}/{name}`` that Conveyor has always answered.
Without a configured base URL the scheme and Host the client used build it, so URLs work
behind any name or port. A QueueUrl in a request is resolved by its path and, for AWS's
own host names (``sqs.<region>.amazonaws.com``, ``<region>.queue.amazonaws.com``), by the
region its host names; a short-form URL on any other host is a queue of the request's
region. A bare queue name (``QueueUrl="jobs"``) is a queue of the caller's account and
region, as AWS takes it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from conveyor.protocols.aws.service import RegionScope
from conveyor.protocols.broker import Broker
from conveyor.protocols.sqs.errors import NO_QUEUE, SqsError, invalid_value

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
_FIFO_NAME = re.compile(r"^[A-Za-z0-9_-]{1,75}\.fifo$")
_ARN = re.compile(r"^arn:aws[a-z-]*:sqs:([a-z0-9-]{1,32}):(\d{12}):(.+)$")
_REGION = re.compile(r"^[a-z0-9-]{1,32}$")
# AWS's SQS host names, which say the queue's region: sqs.<region>.amazonaws.com (also
# .com.cn), <region>.queue.amazonaws.com
_AWS_HOST = re.compile(r"^(?:sqs\.([a-z0-9-]{1,32})\.amazonaws\.com(?:\.cn)?|([a-z0-9-]{1,32})\.queue\.amazonaws\.com)"
                       r"(?::\d+)?$", re.IGNORECASE)


@dataclass(frozen=True)
class Context(RegionScope):
    broker: Broker
    base_url: str
    sender_id: str
    request_id: str
    path_queue_url: str | None = None  # set when the request came to /{account}/{queue}
    trace_header: str | None = None  # X-Amzn-Trace-Id: what a send stores as AWSTraceHeader

    def url(self, internal_name: str) -> str:
        region, sep, name = internal_name.rpartition(":")
        if not sep:
            return f"{self.base_url}/{self.account_id}/{name}"
        return f"{self.base_url}/queue/{region}/{self.account_id}/{name}"

    # -- resolving what clients send -------------------------------------------------

    def queue_from_url(self, queue_url: str | None) -> str:
        """The internal name of the queue a QueueUrl names (its path, and its host's region)."""
        queue_url = queue_url or self.path_queue_url
        if not queue_url:
            raise SqsError("MissingParameter", "The request must contain the parameter QueueUrl.")
        host_region, parts = _url_parts(queue_url)
        if len(parts) == 1 and "://" not in queue_url and is_valid_name(parts[0]):
            return self.internal(parts[0])  # a bare queue name, as AWS takes it: the caller's account
        resolved = resolve_path(parts, host_region)
        if resolved is None:
            raise SqsError("QueueDoesNotExist", NO_QUEUE)
        region, account, name = resolved
        if account != self.account_id:
            raise SqsError("QueueDoesNotExist", NO_QUEUE)
        return self.internal(name, region)

    def queue_from_arn(self, arn: str, parameter: str) -> str:
        match = _ARN.match(arn or "")
        if not match or not is_valid_name(match[3]):
            raise invalid_value(parameter, arn, "Invalid ARN")
        region, account, name = match.groups()
        if account != self.account_id:
            raise SqsError("QueueDoesNotExist", NO_QUEUE)
        return self.internal(name, region)


def resolve_path(parts: tuple[str, ...], host_region: str | None = None) -> tuple[str | None, str, str] | None:
    """(region, account, name) of a queue URL's path segments: ``queue/<region>/<account>/<name>``
    or ``<account>/<name>`` (region: the host's, else None for the request's); None if
    the path names no queue."""
    if len(parts) == 4 and parts[0] == "queue" and _REGION.match(parts[1]):
        region: str | None = parts[1]
        parts = parts[2:]
    elif len(parts) == 2:
        region = host_region
    else:
        return None
    account, name = parts
    return (region, account, name) if is_valid_name(name) else None


def _url_parts(queue_url: str) -> tuple[str | None, tuple[str, ...]]:
    """The region an AWS host name says (or None) and the decoded, non-empty segments of
    a queue URL's path. Clients send the same few URLs over and over, so they are
    remembered (those of a sane length only)."""
    return _remembered_url_parts(queue_url) if len(queue_url) <= 512 else _split_url(queue_url)


def _split_url(queue_url: str) -> tuple[str | None, tuple[str, ...]]:
    try:
        split = urlsplit(queue_url) if "://" in queue_url else None
    except ValueError:  # a malformed IPv6 host ("http://[::1/..."): names no queue
        return None, ()
    path = split.path if split else queue_url
    host = _AWS_HOST.match(split.netloc) if split else None
    region = (host[1] or host[2]).lower() if host else None
    return region, tuple(unquote(p) for p in path.split("/") if p)


_remembered_url_parts = functools.lru_cache(maxsize=4096)(_split_url)


def is_valid_name(name: str) -> bool:
    return bool(_NAME.match(name) or _FIFO_NAME.match(name))
