"""A small Celery app on kombu's SQS transport, for ``test_celery.py``.

The worker runs it as ``python -m celery -A celery_app worker ...`` (with this folder on
``PYTHONPATH``); the test process builds its own instance with :func:`create_app` to send
tasks. Both find the broker from the environment (or from arguments):

- ``CONVEYOR_CELERY_ENDPOINT``: the Conveyor server, e.g. ``http://127.0.0.1:8080``
- ``CONVEYOR_CELERY_PREFIX``: the SQS queue name prefix, so every run has its own queues

Tasks carry explicit names, so the sender and the worker agree on them whatever module
name each imported this file under. A task records what it did by appending a line to a
file whose path it is given: the test reads the file (there is no result backend).
"""

from __future__ import annotations

import json
import os
import time
from urllib.parse import urlsplit

from celery import Celery

ENDPOINT_ENV = "CONVEYOR_CELERY_ENDPOINT"
PREFIX_ENV = "CONVEYOR_CELERY_PREFIX"


def record_line(path: str, **fields: object) -> None:
    """Append one JSON line to ``path`` (one ``write`` of a short line with O_APPEND)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({**fields, "at": time.time(), "pid": os.getpid()}) + "\n")


def broker_settings(endpoint: str, prefix: str) -> dict[str, object]:
    """Celery settings that point kombu's SQS transport at ``endpoint`` over plain HTTP.

    kombu builds the SQS endpoint from the broker URL's host and port
    (``Channel.endpoint_url``), with ``http`` when the transport option ``is_secure`` is
    false; the credentials in the URL are dummies (Conveyor accepts any signature).
    """
    parts = urlsplit(endpoint)
    if parts.scheme != "http" or not parts.hostname or not parts.port:
        raise ValueError(f"expected http://HOST:PORT, got {endpoint!r}")
    return {
        "broker_url": f"sqs://x:y@{parts.hostname}:{parts.port}",
        "broker_transport_options": {
            "region": "us-east-1",
            "is_secure": False,
            "queue_name_prefix": prefix,
            # Short long polls and polling interval, so the worker picks up work (and
            # notices SIGTERM) quickly.
            "wait_time_seconds": 1,
            "polling_interval": 0.1,
            "visibility_timeout": 30,
        },
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": 3,
        "task_default_queue": "celery",
        "task_serializer": "json",
        "accept_content": ["json"],
        "worker_hijack_root_logger": False,
        "worker_prefetch_multiplier": 1,
        # Delete a task's message only once the task has finished (DeleteMessage after
        # success), as SQS users usually configure it.
        "task_acks_late": True,
    }


def create_app(endpoint: str | None = None, prefix: str | None = None) -> Celery:
    endpoint = endpoint or os.environ.get(ENDPOINT_ENV)
    prefix = prefix if prefix is not None else os.environ.get(PREFIX_ENV, "")
    app = Celery("conveyor_celery_e2e")
    if endpoint:
        app.conf.update(broker_settings(endpoint, prefix))

    @app.task(name="conveyor_e2e.record", shared=False)
    def record(path: str, value: object) -> object:
        record_line(path, task="record", value=value)
        return value

    @app.task(name="conveyor_e2e.flaky", bind=True, max_retries=3, shared=False)
    def flaky(self, path: str, key: str) -> str:  # type: ignore[no-untyped-def]
        """Fails on its first attempt (asking for a retry in 1 s) and succeeds on the next."""
        attempt = self.request.retries
        record_line(path, task="flaky", key=key, attempt=attempt)
        if attempt == 0:
            raise self.retry(countdown=1)
        record_line(path, task="flaky", key=key, done=True)
        return key

    return app


# The worker's app (``-A celery_app``), configured from the environment.
app = create_app()
