"""Conveyor's error tree: the one vocabulary every layer speaks.

    ConveyorError
    ├── NotFound                 404 — the named thing does not exist
    │   ├── QueueNotFound          (SQLSTATE CVQ01)
    │   ├── MessageNotFound
    │   ├── MoveTaskNotFound       (CVT01)
    │   ├── StreamNotFound         (CVS01)
    │   ├── ConsumerNotFound       (CVS02)
    │   ├── BatchNotFound          (CVS03)
    │   ├── DeadLetterNotFound     (CVS04)
    │   ├── ScheduleNotFound       (CVC01)
    │   ├── TopicNotFound          (CVN01)
    │   ├── SubscriptionNotFound   (CVN02)
    │   ├── DeliveryNotFound       (CVN03)
    │   ├── PartitionedQueueNotFound (CVK01)
    │   └── PartitionMessageNotFound (CVK03)
    ├── Conflict                 409 — the request contradicts what is stored
    │   ├── QueueAlreadyExists     (CVQ02)
    │   ├── ScheduleAlreadyExists  (CVC02)
    │   ├── MessageNotInFlight     (CVM02)
    │   ├── StaleReceipt           — the message was delivered again since this receipt
    │   ├── BatchPartlyReceived    (CVS05) — a stream batch was not handed out whole
    │   ├── CooperativeConsumer    (CVS06) — a cooperative consumer's batches go to its members
    │   ├── StagedRowsMissing      (CVP01) — a Spark write's staged rows were lost; nothing published
    │   └── LeaseNotHeld           (CVK02) — a partition's lease expired, was released or is another's
    ├── InvalidInput             400 — the request is malformed or out of range (CVV01)
    │   ├── DataException          (SQLSTATE class 22: bad encodings, numbers out of range)
    │   └── MessageTooLarge      413 (CVM01)
    ├── PermissionDenied         403 — the caller's role may not do this (42501)
    │   └── QueueLimitReached      (CVK04) — a push would create queues beyond what it may
    ├── Unauthorized             401 — no or unknown credentials (AWS protocols: their own codes)
    ├── Unavailable              503 — the database cannot be reached right now
    │   ├── DatabaseUnreachable    — and the request never reached it (nothing was done)
    │   ├── Throttled              — too much is waiting already: retry later
    │   ├── DatabaseRejected       — the database refused the connection for good (wrong URL,
    │   │                              database, role or password): retrying will not help
    │   ├── SchemaMismatch         — a migration applied to the database differs from this build's
    │   └── SchemaMissing          (3F000) — the Conveyor schema is not installed
    │       └── SchemaOutdated     (42883) — it lacks a function this code needs
    └── InternalError            500 — anything else; details go to the log, not the client

Errors raised by the database enter Python in one place (``conveyor.db.execute``) and are
looked up here by SQLSTATE; each protocol renders them at its edge through one table.
"""

from __future__ import annotations

from typing import ClassVar


class ConveyorError(Exception):
    """Base of every error Conveyor raises on purpose."""

    sqlstate: ClassVar[str | None] = None
    _by_sqlstate: ClassVar[dict[str, type[ConveyorError]]] = {}

    def __init_subclass__(cls, sqlstate: str | None = None, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if sqlstate:
            cls.sqlstate = sqlstate
            ConveyorError._by_sqlstate[sqlstate] = cls

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @classmethod
    def for_sqlstate(cls, sqlstate: str | None) -> type[ConveyorError] | None:
        """The error class registered for a SQLSTATE, or the class of its two-letter prefix."""
        if not sqlstate:
            return None
        return cls._by_sqlstate.get(sqlstate) or cls._by_sqlstate.get(sqlstate[:2])


class NotFound(ConveyorError):
    pass


class QueueNotFound(NotFound, sqlstate="CVQ01"):
    pass


class MessageNotFound(NotFound):
    pass


class MoveTaskNotFound(NotFound, sqlstate="CVT01"):
    pass


class StreamNotFound(NotFound, sqlstate="CVS01"):
    pass


class ConsumerNotFound(NotFound, sqlstate="CVS02"):
    pass


class BatchNotFound(NotFound, sqlstate="CVS03"):
    pass


class DeadLetterNotFound(NotFound, sqlstate="CVS04"):
    pass


class ScheduleNotFound(NotFound, sqlstate="CVC01"):
    pass


class TopicNotFound(NotFound, sqlstate="CVN01"):
    pass


class SubscriptionNotFound(NotFound, sqlstate="CVN02"):
    pass


class DeliveryNotFound(NotFound, sqlstate="CVN03"):
    pass


class PartitionedQueueNotFound(NotFound, sqlstate="CVK01"):
    pass


class PartitionMessageNotFound(NotFound, sqlstate="CVK03"):
    pass


class Conflict(ConveyorError):
    pass


class LeaseNotHeld(Conflict, sqlstate="CVK02"):
    """An acknowledgement under a lease that is no longer the caller's (fencing)."""


class QueueAlreadyExists(Conflict, sqlstate="CVQ02"):
    pass


class ScheduleAlreadyExists(Conflict, sqlstate="CVC02"):
    pass


class MessageNotInFlight(Conflict, sqlstate="CVM02"):
    pass


class StaleReceipt(Conflict):
    """A receipt for a delivery that is over: the message's visibility timeout ran out and
    it was received again, so only the newer receipt may act on it."""


class BatchPartlyReceived(Conflict, sqlstate="CVS05"):
    """A stream batch handed out in pages was acknowledged before its last page."""


class CooperativeConsumer(Conflict, sqlstate="CVS06"):
    """A consumer with cooperative members (or a member) asked for a batch the plain way:
    its batches are taken by its members (conveyor.stream_next_batch_coop)."""


class StagedRowsMissing(Conflict, sqlstate="CVP01"):
    """The rows a Spark task staged are gone (e.g. PostgreSQL crashed: the stage is
    unlogged); the job fails rather than publish part of its output."""


class InvalidInput(ConveyorError, sqlstate="CVV01"):
    pass


class DataException(InvalidInput, sqlstate="22"):
    """PostgreSQL's own data exceptions (bad encodings, out-of-range numbers)."""


class MessageTooLarge(InvalidInput, sqlstate="CVM01"):
    pass


class PermissionDenied(ConveyorError, sqlstate="42501"):
    pass


class QueueLimitReached(PermissionDenied, sqlstate="CVK04"):
    """A push would create partitioned queues its caller may not create: beyond its share
    per push, or past the number a server lets pushes create (docs/queen.md)."""


class Unauthorized(ConveyorError):
    """No or unknown credentials: "who are you?" (401 with a WWW-Authenticate challenge on
    REST, Queen's and hq's routes; seed 000 answered 403, which says "not allowed" and
    belongs to PermissionDenied). The AWS protocols answer in AWS's codes."""


class Unavailable(ConveyorError):
    pass


class DatabaseUnreachable(Unavailable):
    """The request never reached the database (no connection could be had, or the
    database is known to be down): nothing of it was done, so it may be taken elsewhere
    (the failover spool) without risk of doing it twice."""


class DatabaseRejected(Unavailable):
    """The database refused the connection for a reason that does not heal by waiting: a
    missing database or role, a wrong password, no pg_hba.conf entry, a malformed URL
    (conveyor.db.reach)."""


class Throttled(Unavailable):
    """Admission control refused the request: the server already has as much waiting as
    it accepts (see docs/operations.md, "Overload"). Safe to retry after a pause."""


class SchemaMismatch(Unavailable):
    """An applied migration's recorded checksum differs from this build's file: the database
    was migrated by a build whose migration said something else (conveyor.db.migrate)."""


class SchemaMissing(Unavailable, sqlstate="3F000"):
    """Raised for a missing schema or function: the database needs ``conveyor db migrate``."""

    def __init__(self, message: str) -> None:
        super().__init__(f"{message} (is the Conveyor schema installed? run `conveyor db migrate`)")


class SchemaOutdated(SchemaMissing, sqlstate="42883"):
    """A function the code needs is missing: the schema is older than the code."""


class InternalError(ConveyorError):
    pass
