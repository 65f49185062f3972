"""The archive's checkpoint: which offsets each micro-batch covers (``offsets/<id>``)
and which micro-batches are done (``commits/<id>``), in the files and format of Spark
Structured Streaming's checkpoint, so that a checkpoint written by earlier versions of
the archive (which ran a streaming query) goes on where it stopped, and the other way.

A micro-batch's end offset is written before any of its rows are; after a crash, the
last micro-batch without a commit is run again with the same offsets, hence the same
rows (the Delta table's application transaction tells whether it had reached the table).
Each file is written whole or not at all (a temporary file renamed into place).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conveyor import errors

VERSION = "v1"


@dataclass(frozen=True)
class Batch:
    id: int
    end: dict[str, Any]
    committed: bool


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def _ids(folder: Path) -> list[int]:
    return sorted(int(p.name) for p in folder.glob("[0-9]*") if p.name.isdigit()) if folder.is_dir() else []


class Log:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def offset(self, batch_id: int) -> dict[str, Any]:
        """The end offset of micro-batch ``batch_id`` (Spark's third line: the source's)."""
        path = self.folder / "offsets" / str(batch_id)
        lines = path.read_text().splitlines()
        if len(lines) < 3 or lines[0] != VERSION:
            raise errors.InvalidInput(f"{path} is not a checkpoint offset file of one source (Spark's format {VERSION})")
        value = json.loads(lines[2])
        if not isinstance(value, dict):
            raise errors.InvalidInput(f"{path} holds no offset of the conveyor source")
        return value

    def last(self) -> Batch | None:
        """The newest micro-batch planned, and whether it is done."""
        planned = _ids(self.folder / "offsets")
        if not planned:
            return None
        last = planned[-1]
        return Batch(last, self.offset(last), last in _ids(self.folder / "commits"))

    def plan(self, batch_id: int, end: dict[str, Any]) -> None:
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": int(time.time() * 1000), "conf": {}}
        _write(self.folder / "offsets" / str(batch_id), f"{VERSION}\n{json.dumps(meta)}\n{json.dumps(end)}")

    def commit(self, batch_id: int) -> None:
        _write(self.folder / "commits" / str(batch_id), f'{VERSION}\n{{"nextBatchWatermarkMs":0}}')
