"""The failover spool: writes accepted while PostgreSQL is unreachable (seed 004's disk
buffer), journalled on local disk and replayed in order once the database is back.

- **Journal.** Records (one per accepted request: a queue send or a partitioned-queue
  push) are appended to segment files ``<slot>/<time_ns>.spool``, each framed on its own
  (``_frame``: a marker, the length, the payload's CRC-32 and the header's own CRC-32),
  and fsynced before the client gets its answer; concurrent appends share one fsync (group
  commit). A write, flush or fsync that fails is cut off again (the file is truncated back
  to its last good length) before the waiting requests are answered 503, so nothing refused
  is ever replayed.
- **Damage.** A record whose bytes were damaged on disk fails its checksum: it is skipped
  and the reader finds the next record by its marker, so one bad byte costs one record,
  not the rest of the segment. Damage is set aside (a line per damaged stretch in the
  slot's ``rejected.jsonl``) and the segment is kept as ``<name>.spool.damaged`` instead of
  being deleted. A torn tail (a crash mid-write: a record cut short, or zeros) was never
  acknowledged and is ignored.
- **Previous format.** Segments written by earlier versions (``length | crc32 | JSON``,
  no marker) are recognised (``_OLD``) and replayed the same way; a damaged record in one
  is skipped by looking for the next offset where a whole record checks out.
- **Private.** A slot directory is 0700 and its files 0600 whatever the umask (tightened
  when a slot is taken, for files left by earlier versions); a spool directory the server
  creates is 0700, one that exists is left as it is (it may be shared).
- **Slots.** Each server process takes a slot directory of its own under
  ``CONVEYOR_SPOOL_DIR`` with an exclusive ``flock`` (the first free one), so several
  processes share a spool directory and a restarted server takes over whatever a killed
  one left behind.
- **Replay, exactly once.** Records are replayed in journal order, a page per
  transaction; each record's key (slot, segment, offset) is inserted into
  ``conveyor.spool_replays`` in the same transaction as its messages, and a key already
  there is skipped, so a replay cut by a crash stores nothing twice. A segment is deleted
  once every record in it is replayed (kept as ``.damaged`` if it had damage), and only
  then are its keys forgotten.
- **Order.** While anything is waiting in the spool, new spoolable writes go to the spool
  too, behind it: per queue (and per FIFO group or partition) messages reach the database
  in the order they were acknowledged.
- **Bounded.** Beyond ``CONVEYOR_SPOOL_MAX_BYTES`` an append is refused (503): the spool
  says it is full rather than grow without limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import stat
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from conveyor import errors

log = logging.getLogger(__name__)

MAX_SLOTS = 256
DAMAGED = ".damaged"  # suffix of a segment kept because it had damage
PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600


@dataclass(frozen=True, slots=True)
class Record:
    key: str  # "<slot>/<segment>/<offset>": unique for ever
    segment: Path
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Damage:
    """A stretch of a segment that holds no readable record (set aside, never replayed)."""

    key: str  # "<slot>/<segment>/<offset>" of its first byte
    offset: int
    length: int
    reason: str


@dataclass(frozen=True, slots=True)
class Contents:
    records: list[Record]
    damage: list[Damage]


# -- the frame -------------------------------------------------------------------------
# marker | payload length | crc32(payload) | crc32(the 12 bytes before): 16 bytes, then the
# payload (JSON). The marker starts with 0xFF, a byte UTF-8 (so JSON) never holds, so it is
# found again after damage; the header's own CRC says whether its length can be trusted.

MARKER = b"\xffCVS"
_HEADER = struct.Struct(">4sIII")
_OLD = struct.Struct(">II")  # the previous versions' frame: payload length, crc32(payload)


def _frame(payload: bytes) -> bytes:
    head = struct.pack(">4sII", MARKER, len(payload), zlib.crc32(payload))
    return head + struct.pack(">I", zlib.crc32(head)) + payload


@dataclass(frozen=True, slots=True)
class _Found:
    size: int  # of the whole frame
    payload: bytes | None  # None: the header is sound but the payload fails its checksum


def _frame_at(data: bytes, at: int) -> _Found | None:
    """The frame at ``at``, if a sound header is there whose frame ends within ``data``."""
    if data[at:at + 4] != MARKER or at + _HEADER.size > len(data):
        return None
    _, length, crc, head_crc = _HEADER.unpack_from(data, at)
    end = at + _HEADER.size + length
    if zlib.crc32(data[at:at + 12]) != head_crc or end > len(data):
        return None
    payload = data[at + _HEADER.size:end]
    return _Found(end - at, payload if zlib.crc32(payload) == crc else None)


def _next_frame(data: bytes, at: int) -> int | None:
    while (at := data.find(MARKER, at)) >= 0:
        if _frame_at(data, at) is not None:
            return at
        at += 1
    return None


def _torn(data: bytes, at: int) -> bool:
    """Whether the tail from ``at`` is what a crash mid-append leaves (never acknowledged):
    the start of a frame cut short, or zeros (a file extended without its data)."""
    tail = data[at:]
    if not tail.strip(b"\0"):
        return True
    if len(tail) < _HEADER.size:
        return tail[:4] == MARKER[:len(tail[:4])]
    _, length, _, head_crc = _HEADER.unpack_from(tail)
    return zlib.crc32(tail[:12]) == head_crc and _HEADER.size + length > len(tail)


def _old_frame_at(data: bytes, at: int) -> _Found | None:
    """A previous version's frame at ``at`` (no marker, no header check: only a payload
    whose checksum matches, and a JSON object, tells that it is one)."""
    if at + _OLD.size > len(data):
        return None
    length, crc = _OLD.unpack_from(data, at)
    end = at + _OLD.size + length
    if end > len(data) or data[at + _OLD.size:at + _OLD.size + 1] != b"{":  # before copying anything
        return None
    payload = data[at + _OLD.size:end]
    return _Found(end - at, payload) if zlib.crc32(payload) == crc else None


def _old_next_frame(data: bytes, at: int) -> int | None:
    while (brace := data.find(b"{", at + _OLD.size)) >= 0:  # a payload starts with "{"
        if _old_frame_at(data, brace - _OLD.size) is not None:
            return brace - _OLD.size
        at = brace - _OLD.size + 1
    return None


def _old_torn(data: bytes, at: int) -> bool:
    if len(data) - at < _OLD.size or not data[at:].strip(b"\0"):
        return True
    length, _ = _OLD.unpack_from(data, at)
    return at + _OLD.size + length > len(data)


@dataclass(frozen=True, slots=True)
class _Format:
    frame_at: Callable[[bytes, int], _Found | None]
    next_frame: Callable[[bytes, int], int | None]
    torn: Callable[[bytes, int], bool]


FRAMED = _Format(_frame_at, _next_frame, _torn)
OLD = _Format(_old_frame_at, _old_next_frame, _old_torn)


def _format_of(data: bytes) -> _Format:
    """A segment is of the current format if any frame in it is (the first one may be the
    damaged one); the previous versions' frames never hold the marker's 0xFF."""
    return FRAMED if _next_frame(data, 0) is not None else OLD


def _parse(data: bytes) -> tuple[list[tuple[int, int, bytes]], list[tuple[int, int, str]]]:
    """(offset, length, payload) of every readable record, and (offset, length, why) of
    every damaged stretch, in order; a torn tail is neither."""
    form = _format_of(data)
    records: list[tuple[int, int, bytes]] = []
    damage: list[tuple[int, int, str]] = []
    at = 0
    while at < len(data):
        found = form.frame_at(data, at)
        if found is not None:
            if found.payload is not None:
                records.append((at, found.size, found.payload))
            else:
                damage.append((at, found.size, "the record fails its checksum"))
            at += found.size
            continue
        after = form.next_frame(data, at + 1)
        if after is None:
            if not form.torn(data, at):
                damage.append((at, len(data) - at, "unreadable bytes at the end of the segment"))
            break
        damage.append((at, after - at, "unreadable bytes (a record's header is damaged)"))
        at = after
    return records, damage


def _read_segment(path: Path, prefix: str) -> Contents:
    records, damage = [], []
    found, damaged = _parse(path.read_bytes())
    for offset, length, payload in found:
        try:
            body = orjson.loads(payload)
        except orjson.JSONDecodeError:
            body = None
        if isinstance(body, dict):
            records.append(Record(f"{prefix}{offset}", path, body))
        else:  # the checksum matches, yet it is no record: not written by a spool
            damaged.append((offset, length, "the record is not a JSON object"))
    for offset, length, reason in sorted(damaged):
        damage.append(Damage(f"{prefix}{offset}", offset, length, reason))
    return Contents(records, damage)


class Spool:
    """One process's slot of the spool directory."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.root = directory
        self.max_bytes = max_bytes
        self.slot_dir, self._lock_fd = self._take_slot(directory)
        self.slot = self.slot_dir.name
        self._segment: Path | None = None
        self._fd: int | None = None  # the segment being appended to
        self._end = 0  # its length up to the last acknowledged record
        self._pending: list[tuple[bytes, asyncio.Future[str]]] = []
        self._writer: asyncio.Task[None] | None = None
        self._io = threading.Lock()  # the segment file: written in a thread, sealed by the replay
        self.size = sum(p.stat().st_size for p in self.segments())
        self.waiting = sum(1 for _ in self.records())  # records not replayed yet

    @staticmethod
    def _take_slot(root: Path) -> tuple[Path, int]:
        if not root.exists():
            root.mkdir(parents=True, exist_ok=True)
            os.chmod(root, PRIVATE_DIR)  # whatever the umask
        for n in range(MAX_SLOTS):
            fd = os.open(root / f"slot-{n}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         PRIVATE_FILE)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                return _private_slot(root / f"slot-{n}"), fd
            except BaseException:
                os.close(fd)
                raise
        raise RuntimeError(f"every spool slot under {root} is taken ({MAX_SLOTS} processes)")

    def close(self) -> None:
        self.seal_segment()
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
            yield from self.read(segment).records

    def read(self, segment: Path) -> Contents:
        """A segment's readable records, and the stretches of it that are damaged."""
        return _read_segment(segment, self.prefix(segment))

    def prefix(self, segment: Path) -> str:
        """The keys of a segment's records start with this."""
        return f"{self.slot}/{segment.stem}/"

    def reject(self, record: Record, reason: str) -> None:
        """Set aside a record the database refused, with why (``rejected.jsonl``), so that
        an operator can see and redo it; it is not replayed again."""
        self._set_aside([{"key": record.key, "reason": reason, "record": record.body}])

    def keep_damaged(self, segment: Path, damage: list[Damage]) -> Path:
        """Set aside a segment's damaged stretches (a line each in ``rejected.jsonl``) and
        keep the segment, as it was found, beside the journal instead of deleting it."""
        kept = segment.with_name(segment.name + DAMAGED)
        self._set_aside([{"key": d.key, "reason": f"damaged in the journal: {d.reason}", "segment": kept.name,
                          "offset": d.offset, "length": d.length} for d in damage])
        if segment == self._segment:
            self.seal_segment()
        with self._io:
            self.size -= segment.stat().st_size
        segment.rename(kept)
        _fsync_dir(self.slot_dir)
        return kept

    def _set_aside(self, lines: list[dict[str, Any]]) -> None:
        fd = _open_private(self.slot_dir / "rejected.jsonl")
        try:
            _write_all(fd, b"".join(orjson.dumps(line) + b"\n" for line in lines))
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- appending ---------------------------------------------------------------------

    async def append(self, body: dict[str, Any]) -> str:
        """Journal one record, durably (fsynced) before returning its key."""
        frame = _frame(orjson.dumps(body))
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
        """Append and fsync ``frames``; if any of it fails, cut the segment back to what
        it held before (nothing of a refused write may be replayed later) and raise."""
        if self._fd is None:
            self._open_segment()
        assert self._fd is not None and self._segment is not None
        start = self._end
        try:
            _write_all(self._fd, b"".join(frames))
            os.fsync(self._fd)
        except OSError:
            self._cut_back(start)
            raise
        keys, at = [], start
        for frame in frames:
            keys.append(f"{self.prefix(self._segment)}{at}")
            at += len(frame)
        self._end = at
        return keys

    def _open_segment(self) -> None:
        segment = self.slot_dir / f"{time.time_ns()}.spool"
        fd = _open_private(segment, exclusive=True)
        try:
            _fsync_dir(self.slot_dir)
        except OSError:
            os.close(fd)
            segment.unlink(missing_ok=True)
            raise
        self._segment, self._fd, self._end = segment, fd, 0

    def _cut_back(self, length: int) -> None:
        """Truncate the segment to ``length`` after a failed append. Should that fail too,
        the segment is sealed (no more appends to it) and the failure logged: a refused
        write might then be replayed, the one case where one is."""
        assert self._fd is not None
        try:
            os.ftruncate(self._fd, length)
            os.fsync(self._fd)
        except OSError:
            log.exception("the failover spool could not cut a failed write off %s (at byte %d): writes answered "
                          "503 may be replayed from it", self._segment, length)
            self._close_segment()

    def _close_segment(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._segment, self._end = None, None, 0

    # -- after a replay -------------------------------------------------------------------

    def replayed(self, count: int) -> None:
        self.waiting -= count

    def seal_segment(self) -> None:
        """Start a new segment with the next append (the current one can then be removed
        once replayed). Waits for a write in progress to finish."""
        with self._io:
            self._close_segment()

    def remove(self, segment: Path) -> None:
        if segment == self._segment:
            self.seal_segment()
        with self._io:
            self.size -= segment.stat().st_size
        segment.unlink()
        _fsync_dir(self.slot_dir)


def _private_slot(slot: Path) -> Path:
    """The slot directory, made private: 0700, and 0600 for what earlier versions left in
    it. It must be a directory of this user's, not a link: one planted by someone else
    could feed journals into the database."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(slot, PRIVATE_DIR)
    info = os.lstat(slot)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise RuntimeError(f"the spool slot {slot} is not a directory of this user's: refusing to use it")
    os.chmod(slot, PRIVATE_DIR)
    for entry in os.scandir(slot):
        if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mode & 0o077:
            os.chmod(entry.path, PRIVATE_FILE)
    return slot


def _open_private(path: Path, *, exclusive: bool = False) -> int:
    """A file opened for appending, created 0600 whatever the umask."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_EXCL if exclusive else 0)
    fd = os.open(path, flags, PRIVATE_FILE)
    os.fchmod(fd, PRIVATE_FILE)
    return fd


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
