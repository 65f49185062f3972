"""Who is asking, where, and how SQS names map onto Conveyor queues.

SQS scopes queues per region (taken from the request's SigV4 credential scope) and per
account; ``conveyor.protocols.aws.service.RegionScope`` says how Conveyor stores them.

Queue URLs are ``{base_url}/{account_id}/{name}``; without a configured base URL the
scheme and Host the client used build it, so URLs work behind any name or port. A
QueueUrl in a request is resolved by its path alone, whatever its host, because
clients send ``https://sqs.us-east-1.amazonaws.com/...`` and the like. A bare queue name
(``QueueUrl="jobs"``) is a queue of the caller's account and region, as AWS takes it.
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


@dataclass(frozen=True)
class Context(RegionScope):
    broker: Broker
    base_url: str
    sender_id: str
    request_id: str
    path_queue_url: str | None = None  # set when the request came to /{account}/{queue}
    trace_header: str | None = None  # X-Amzn-Trace-Id: what a send stores as AWSTraceHeader

    def url(self, internal_name: str) -> str:
        return f"{self.base_url}/{self.account_id}/{self.bare(internal_name)}"

    # -- resolving what clients send -------------------------------------------------

    def queue_from_url(self, queue_url: str | None) -> str:
        """The internal name of the queue a QueueUrl names (its path: account and name)."""
        queue_url = queue_url or self.path_queue_url
        if not queue_url:
            raise SqsError("MissingParameter", "The request must contain the parameter QueueUrl.")
        parts = _url_parts(queue_url)
        if len(parts) == 1 and "://" not in queue_url and is_valid_name(parts[0]):
            return self.internal(parts[0])  # a bare queue name, as AWS takes it: the caller's account
        if len(parts) != 2:
            raise SqsError("QueueDoesNotExist", NO_QUEUE)
        account, name = parts
        if account != self.account_id or not is_valid_name(name):
            raise SqsError("QueueDoesNotExist", NO_QUEUE)
        return self.internal(name)

    def queue_from_arn(self, arn: str, parameter: str) -> str:
        match = _ARN.match(arn or "")
        if not match or not is_valid_name(match[3]):
            raise invalid_value(parameter, arn, "Invalid ARN")
        region, account, name = match.groups()
        if account != self.account_id:
            raise SqsError("QueueDoesNotExist", NO_QUEUE)
        return self.internal(name, region)


def _url_parts(queue_url: str) -> tuple[str, ...]:
    """The decoded, non-empty segments of a queue URL's path. Clients send the same few
    URLs over and over, so they are remembered (those of a sane length only)."""
    return _remembered_url_parts(queue_url) if len(queue_url) <= 512 else _split_url(queue_url)


def _split_url(queue_url: str) -> tuple[str, ...]:
    try:
        path = urlsplit(queue_url).path if "://" in queue_url else queue_url
    except ValueError:  # a malformed IPv6 host ("http://[::1/..."): names no queue
        return ()
    return tuple(unquote(p) for p in path.split("/") if p)


_remembered_url_parts = functools.lru_cache(maxsize=4096)(_split_url)


def is_valid_name(name: str) -> bool:
    return bool(_NAME.match(name) or _FIFO_NAME.match(name))
