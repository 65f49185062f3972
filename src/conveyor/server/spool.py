"""The failover spool: writes accepted while PostgreSQL is unreachable (seed 004's disk
buffer), journalled on local disk and replayed in order once the database is back.

- **Journal.** Records (one per accepted request: a queue send or a partitioned-queue
  push) are appended to segment files ``<slot>/<time_ns>.spool`` as ``length | crc32 |
  JSON``, and fsynced before the client gets its answer; concurrent appends share one
  fsync (group commit). A torn tail (a crash mid-write) is found by its length or CRC and
  ignored: it was never acknowledged.
- **Slots.** Each server process takes a slot directory of its own under
  ``CONVEYOR_SPOOL_DIR`` with an exclusive ``flock`` (the first free one), so several
  processes share a spool directory and a restarted server takes over whatever a killed
  one left behind.
- **Replay, exactly once.** Records are replayed in journal order, a page per
  transaction; each record's key (slot, segment, offset) is inserted into
  ``conveyor.spool_replays`` in the same transaction as its messages, and a key already
  there is skipped, so a replay cut by a crash stores nothing twice. A segment is deleted
  once every record in it is replayed.
- **Order.** While anything is waiting in the spool, new spoolable writes go to the spool
  too, behind it: per queue (and per FIFO group or partition) messages reach the database
  in the order they were acknowledged.
- **Bounded.** Beyond ``CONVEYOR_SPOOL_MAX_BYTES`` an append is refused (503): the spool
  says it is full rather than grow without limit.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from conveyor import errors

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">II")  # payload length, crc32 of the payload
MAX_SLOTS = 256


@dataclass(frozen=True, slots=True)
class Record:
    key: str  # "<slot>/<segment>/<offset>": unique for ever
    segment: Path
    body: dict[str, Any]


def _read_segment(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(offset, record) of every whole record of a segment, stopping at a torn tail."""
    data = path.read_bytes()
    at = 0
    while at + _HEADER.size <= len(data):
        length, crc = _HEADER.unpack_from(data, at)
        payload = data[at + _HEADER.size:at + _HEADER.size + length]
        if len(payload) < length or zlib.crc32(payload) != crc:
            if at + _HEADER.size + length < len(data):
                log.error("spool segment %s is damaged at byte %d; the rest of it is skipped", path, at)
            return
        yield at, orjson.loads(payload)
        at += _HEADER.size + length


class Spool:
    """One process's slot of the spool directory."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.root = directory
        self.max_bytes = max_bytes
        self.slot_dir, self._lock_fd = self._take_slot(directory)
        self.slot = self.slot_dir.name
        self._segment: Path | None = None
        self._file: Any = None
        self._pending: list[tuple[bytes, asyncio.Future[str]]] = []
        self._writer: asyncio.Task[None] | None = None
        self._io = threading.Lock()  # the segment file: written in a thread, sealed by the replay
        self.size = sum(p.stat().st_size for p in self.segments())
        self.waiting = sum(1 for _ in self.records())  # records not replayed yet

    @staticmethod
    def _take_slot(root: Path) -> tuple[Path, int]:
        root.mkdir(parents=True, exist_ok=True)
        for n in range(MAX_SLOTS):
            fd = os.open(root / f"slot-{n}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            slot = root / f"slot-{n}"
            slot.mkdir(exist_ok=True)
            return slot, fd
        raise RuntimeError(f"every spool slot under {root} is taken ({MAX_SLOTS} processes)")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        os.close(self._lock_fd)

    def segments(self) -> list[Path]:
        return sorted(self.slot_dir.glob("*.spool"), key=lambda p: int(p.stem))

    def sealed_segments(self) -> list[Path]:
        """The segments no append goes to any more (the one being written is left for the
        next round: records may still be added to it)."""
        with self._io:
            return [s for s in self.segments() if s != self._segment]

    def records(self) -> Iterator[Record]:
        """Every record waiting, oldest first."""
        for segment in self.segments():
            yield from self.records_of(segment)

    def records_of(self, segment: Path) -> Iterator[Record]:
        for offset, body in _read_segment(segment):
            yield Record(f"{self.prefix(segment)}{offset}", segment, body)

    def prefix(self, segment: Path) -> str:
        """The keys of a segment's records start with this."""
        return f"{self.slot}/{segment.stem}/"

    def reject(self, record: Record, reason: str) -> None:
        """Set aside a record the database refused, with why (``rejected.jsonl``), so that
        an operator can see and redo it; it is not replayed again."""
        with open(self.slot_dir / "rejected.jsonl", "ab") as out:
            out.write(orjson.dumps({"key": record.key, "reason": reason, "record": record.body}) + b"\n")
            out.flush()
            os.fsync(out.fileno())

    # -- appending ---------------------------------------------------------------------

    async def append(self, body: dict[str, Any]) -> str:
        """Journal one record, durably (fsynced) before returning its key."""
        payload = orjson.dumps(body)
        frame = _HEADER.pack(len(payload), zlib.crc32(payload)) + payload
        if self.size + len(frame) > self.max_bytes:
            raise errors.Unavailable(f"the failover spool is full ({self.max_bytes} bytes, CONVEYOR_SPOOL_MAX_BYTES) "
                                     "and the database is unreachable: retry later")
        self.size += len(frame)
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._pending.append((frame, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_pending())
        return await future

    async def _write_pending(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                keys = await asyncio.to_thread(self._write_sync, [frame for frame, _ in batch])
            except Exception as exc:  # noqa: BLE001 - every waiting request must get an answer
                for frame, future in batch:
                    self.size -= len(frame)
                    future.set_exception(errors.Unavailable(f"the failover spool cannot be written: {exc}"))
                continue
            self.waiting += len(batch)
            for (_, future), key in zip(batch, keys, strict=True):
                if not future.done():
                    future.set_result(key)

    def _write_sync(self, frames: list[bytes]) -> list[str]:
        with self._io:
            return self._write_locked(frames)

    def _write_locked(self, frames: list[bytes]) -> list[str]:
        if self._file is None:
            self._segment = self.slot_dir / f"{time.time_ns()}.spool"
            self._file = open(self._segment, "ab")  # noqa: SIM115 - kept open across appends
            _fsync_dir(self.slot_dir)
        assert self._segment is not None
        keys = []
        for frame in frames:
            keys.append(f"{self.prefix(self._segment)}{self._file.tell()}")
            self._file.write(frame)
        self._file.flush()
        os.fsync(self._file.fileno())
        return keys

    # -- after a replay -------------------------------------------------------------------

    def replayed(self, count: int) -> None:
        self.waiting -= count

    def seal_segment(self) -> None:
        """Start a new segment with the next append (the current one can then be removed
        once replayed). Waits for a write in progress to finish."""
        with self._io:
            if self._file is not None:
                self._file.close()
                self._file = None
                self._segment = None

    def remove(self, segment: Path) -> None:
        if segment == self._segment:
            self.seal_segment()
        with self._io:
            self.size -= segment.stat().st_size
        segment.unlink()
        _fsync_dir(self.slot_dir)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
