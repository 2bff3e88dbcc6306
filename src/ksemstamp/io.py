"""File input and output shared by every command: JSONL records and atomic writes.

* ``read_jsonl`` parses a user's input file; lines that are not JSON objects become error
  records instead of stopping the run.
* ``read_jsonl_objects`` reads a file this package wrote: a last line cut short by a killed
  writer is ignored (its record is redone), any other broken line is an error.
* ``ResumableWriter`` appends one record at a time and flushes, so a killed run loses at most the
  record it was working on; rerunning with the same output skips every input line already
  written. Records are keyed on their input line, not their ``id``: two lines may share an id
  and each is still done exactly once. A line whose stored ``id`` differs from the input's is
  refused (the input changed since the output was written).
* ``atomic_target`` and the ``write_*_atomic`` helpers write through a temporary file and a
  rename, so a reader never sees a half-written file and an interrupted write leaves the old one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
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
    """Parse a JSONL file line by line; blank lines are skipped, bad lines yield errors.

    A UTF-8 byte-order mark (what some editors put at the start of a file) is skipped.
    """
    with open(path, encoding="utf-8-sig", errors="replace") as handle:
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


def iter_jsonl_objects(
    path: str | Path, missing_ok: bool = False, skip_invalid: bool = False
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` of each JSON object of a JSONL file this package wrote.

    Blank lines are skipped. A last line that does not parse is a write cut short and is
    ignored; any other line that is not a JSON object raises ``ValueError`` naming it, unless
    ``skip_invalid``. With ``missing_ok`` a missing file has no records.
    """
    path = Path(path)
    if missing_ok and not path.exists():
        return
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines) or skip_invalid:
                continue
            raise ValueError(f"{path}:{number} is not valid JSON") from None
        if isinstance(row, dict):
            yield number, row
        elif not skip_invalid:
            raise ValueError(f"{path}:{number} is not a JSON object")


def read_jsonl_objects(
    path: str | Path, missing_ok: bool = False, skip_invalid: bool = False
) -> list[dict[str, Any]]:
    """The objects of ``iter_jsonl_objects``, in file order."""
    return [row for _, row in iter_jsonl_objects(path, missing_ok, skip_invalid)]


def drop_cut_last_line(path: str | Path) -> bytes:
    """Cut a half-written last line off ``path`` (so appends start on a fresh line) and return
    the file's remaining bytes; a missing file gives ``b""``."""
    path = Path(path)
    if not path.exists():
        return b""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        with open(path, "r+b") as handle:
            handle.truncate(len(data))
    return data


class ResumableWriter:
    """Appends records to a JSONL file, flushing each; knows which records are already there.

    Records written for input lines carry ``line`` (the input line number) and, when the input
    had one, ``id``; ``is_done`` matches on the line and checks the id. Records without a line
    (the evaluation's stage files) are found by ``has_id``.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.done_ids: set[str] = set()
        self.done_lines: dict[int, str] = {}  # input line -> its record's id, as JSON
        if self.path.exists():
            self._repair_and_scan()
        self._handle: TextIO = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    def _repair_and_scan(self) -> None:
        # A run killed mid-write leaves a partial last line: drop it, it is redone.
        data = drop_cut_last_line(self.path)
        for raw in data.decode("utf-8", errors="replace").splitlines():
            try:
                rec = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict):
                if rec.get("id") is not None:
                    self.done_ids.add(json.dumps(rec["id"]))
                if isinstance(rec.get("line"), int):
                    self.done_lines[rec["line"]] = json.dumps(rec.get("id"))

    def is_done(self, record: InputRecord) -> bool:
        """Whether the output already holds the record of this input line.

        Raises ``ValueError`` when it holds one for this line with another ``id``: the input
        is not the file the output was made from, and resuming would mix the two.
        """
        stored = self.done_lines.get(record.line)
        if stored is None:
            return False
        given = json.dumps(record.record_id)
        if stored != given:
            raise ValueError(
                f"{self.path}: the record of input line {record.line} has id {stored}, but that "
                f"line of the input now has id {given}; the input changed since the output was "
                "written. Use a new output file, or the input it was made from."
            )
        return True

    def has_id(self, record_id: Any) -> bool:
        """Whether a record with this ``id`` is already in the output."""
        return json.dumps(record_id) in self.done_ids

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


# ---------------------------------------------------------------------- atomic writes


@contextmanager
def atomic_target(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; renamed over ``path`` when the block ends
    without an error, removed when it raises. The temporary name keeps ``path``'s suffix, so
    writers that pick a format by suffix (``savefig``) still do."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.tmp{os.getpid()}{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    with atomic_target(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | Path, payload: object) -> None:
    """Write ``payload`` as indented JSON with sorted keys, atomically."""
    write_text_atomic(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")


def write_jsonl_atomic(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    """Write ``rows`` as JSONL (one object a line), atomically."""
    write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
