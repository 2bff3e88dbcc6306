"""Resumable JSONL input and output.

Input lines that are not JSON objects become error records instead of stopping the run.
Output is appended one record at a time and flushed, so a killed run loses at most the record
it was working on; rerunning with the same output skips every record already written (by
``id``, or by input line number for records without one).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO


@dataclass
class InputRecord:
    """One input line: its 1-based number and the parsed object, or why it could not be read."""

    line: int
    data: dict[str, Any] | None
    error: str | None = None

    @property
    def record_id(self) -> Any:
        return None if self.data is None else self.data.get("id")


def read_jsonl(path: str | Path) -> Iterator[InputRecord]:
    """Parse a JSONL file line by line; blank lines are skipped, bad lines yield errors."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                data = json.loads(raw)
            except json.JSONDecodeError as err:
                yield InputRecord(number, None, f"line {number} is not valid JSON: {err.msg}")
                continue
            if not isinstance(data, dict):
                yield InputRecord(number, None, f"line {number} is not a JSON object")
                continue
            yield InputRecord(number, data)


class ResumableWriter:
    """Appends records to a JSONL file, flushing each; knows which records are already there."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.done_ids: set[str] = set()
        self.done_lines: set[int] = set()
        if self.path.exists():
            self._repair_and_scan()
        self._handle: TextIO = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    def _repair_and_scan(self) -> None:
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            # A run killed mid-write leaves a partial last line: drop it, it is redone.
            data = data[: data.rfind(b"\n") + 1]
            with open(self.path, "r+b") as handle:
                handle.truncate(len(data))
        for raw in data.decode("utf-8", errors="replace").splitlines():
            try:
                rec = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict):
                if rec.get("id") is not None:
                    self.done_ids.add(json.dumps(rec["id"]))
                if isinstance(rec.get("line"), int):
                    self.done_lines.add(rec["line"])

    def is_done(self, record: InputRecord) -> bool:
        if record.record_id is not None:
            return json.dumps(record.record_id) in self.done_ids
        return record.line in self.done_lines

    def write(self, record: dict[str, Any]) -> None:
        self._handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> ResumableWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
