"""File input and output shared by every command: JSONL records and atomic writes.

* ``read_jsonl`` parses a user's input file, and ``parse_jsonl`` an upload (the web page's
  batch), with one rule: lines are cut at ``\n``, ``\r\n`` or ``\r`` only (never at U+2028 or
  U+0085, which JSON strings may hold), and a line that is blank or not a JSON object of at
  most ``MAX_DEPTH`` levels, with finite numbers of at most ``MAX_INT_DIGITS`` digits, becomes
  an error record instead of stopping the run.
* ``json_line`` is the one way records are written: strict JSON (no ``NaN``), with lone
  surrogates escaped so that any string read can be written back.
* ``read_jsonl_objects`` reads a file this package wrote: a last line cut short by a killed
  writer is ignored (its record is redone), any other broken line is an error.
* ``ResumableWriter`` appends one record at a time and flushes, so a killed run loses at most the
  record it was working on; rerunning with the same output skips every input line already
  written. Records are keyed on their input line, not their ``id``: two lines may share an id
  and each is still done exactly once. A line whose stored ``id`` differs from the input's is
  refused (the input changed since the output was written); ``earlier_output_problem`` checks
  a whole existing output against the input before any work. The writer holds an exclusive
  lock on the file, so a second run on the same output stops at once.
* ``atomic_target`` and the ``write_*_atomic`` helpers write through a temporary file and a
  rename, so a reader never sees a half-written file and an interrupted write leaves the old one.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; outputs are not locked there
    fcntl = None  # type: ignore[assignment]

MAX_DEPTH = 64
"""Most levels of nested arrays and objects in an input line; deeper lines are error records
(Python's JSON reader would otherwise run out of stack on them)."""
MAX_INT_DIGITS = 4300
"""Longest integer an input line may hold, in digits (Python's own limit for reading one)."""
_ESCAPED = re.compile("[\ud800-\udfff\x85\u2028\u2029]")


@dataclass
class InputRecord:
    """One input line: its 1-based number and the parsed object, or why it could not be read."""

    line: int
    data: dict[str, Any] | None
    error: str | None = None

    @property
    def record_id(self) -> Any:
        return None if self.data is None else self.data.get("id")


def jsonl_lines(stream: TextIO) -> Iterator[tuple[int, str]]:
    """``(1-based number, line)`` of a text stream opened with ``newline=None``: lines end at
    ``\n``, ``\r\n`` or ``\r`` only. The command line and the web page read input with it."""
    yield from enumerate(stream, start=1)


def parse_jsonl_lines(lines: Iterable[tuple[int, str]]) -> Iterator[InputRecord]:
    """One ``InputRecord`` per line; a line that cannot be a record gets its error, a blank
    line too, so that every input line has its output line."""
    for number, raw in lines:
        if raw.strip():
            yield _parse_line(number, raw)
        else:
            yield InputRecord(number, None, f"line {number} is blank")


def read_jsonl(path: str | Path) -> Iterator[InputRecord]:
    """Parse a JSONL file line by line; bad lines, blank ones included, yield errors.

    A UTF-8 byte-order mark (what some editors put at the start of a file) is skipped; bytes
    that are not UTF-8 read as U+FFFD.
    """
    with open(path, encoding="utf-8-sig", errors="replace", newline=None) as handle:
        yield from parse_jsonl_lines(jsonl_lines(handle))


class TooManyRecords(ValueError):
    """JSONL text holds more records than allowed; reading stopped one record past the limit."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit:,} records")
        self.limit = limit


def parse_jsonl(text: str, max_records: int | None = None) -> list[InputRecord]:
    """The records of JSONL ``text`` (an upload), read exactly as ``read_jsonl`` reads a file.

    With ``max_records``, raises ``TooManyRecords`` as soon as a record past it is read: a
    flood of tiny lines costs no more than the limit's worth of parsing."""
    stream = io.StringIO(text.removeprefix("\ufeff"), newline=None)
    records: list[InputRecord] = []
    for record in parse_jsonl_lines(jsonl_lines(stream)):
        if max_records is not None and len(records) >= max_records:
            raise TooManyRecords(max_records)
        records.append(record)
    return records


class _Refused(ValueError):
    """An input value this reader does not take (the message says which)."""


def _no_constant(name: str) -> Any:
    raise _Refused(f"{name} is not a JSON number (JSON has no NaN or Infinity)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"the number {text[:20]}{'...' if len(text) > 20 else ''} is out of range")
    return value


def _bounded_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise _Refused(f"it holds an integer of {digits:,} digits (at most {MAX_INT_DIGITS:,})")
    return int(text)


def _depth_over(value: Any, limit: int) -> bool:
    """Whether ``value`` nests arrays and objects more than ``limit`` levels deep."""
    level, depth = [value], 0
    while level:
        containers = [item for item in level if isinstance(item, dict | list)]
        if not containers:
            return False
        depth += 1
        if depth > limit:
            return True
        level = [
            child
            for item in containers
            for child in (item.values() if isinstance(item, dict) else item)
        ]
    return False


def _parse_line(number: int, raw: str) -> InputRecord:
    def refuse(reason: str) -> InputRecord:
        return InputRecord(number, None, f"line {number} {reason}")

    try:
        data = json.loads(
            raw,
            parse_constant=_no_constant,
            parse_float=_finite_float,
            parse_int=_bounded_int,
        )
    except json.JSONDecodeError as err:
        return refuse(f"is not valid JSON: {err.msg}")
    except _Refused as err:
        return refuse(f"is not usable JSON: {err}")
    except RecursionError:
        return refuse(f"nests arrays or objects more than {MAX_DEPTH} levels deep")
    if not isinstance(data, dict):
        return refuse("is not a JSON object")
    if _depth_over(data, MAX_DEPTH):
        return refuse(f"nests arrays or objects more than {MAX_DEPTH} levels deep")
    return InputRecord(number, data)


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


class OutputLocked(ValueError):
    """Another run holds the output file's lock."""


def _lock(handle: TextIO, path: Path) -> None:
    if fcntl is None:
        return
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise OutputLocked(
            f"{path} is being written by another run right now (it holds the file's lock); "
            "wait for that run to end, or write to another file"
        ) from None


class ResumableWriter:
    """Appends records to a JSONL file, flushing each; knows which records are already there.

    Records written for input lines carry ``line`` (the input line number) and, when the input
    had one, ``id``; ``is_done`` matches on the line and checks the id. Records without a line
    (the evaluation's stage files) are found by ``has_id``.

    Opening takes an exclusive lock on the file (released on ``close`` or when the process
    ends, however it ends): a second writer on the same file raises ``OutputLocked`` at once.
    ``accept(rows, tail)``, when given, sees the whole existing content before anything in the
    file changes: its complete lines (each parsed object, or ``None`` for a line that is not
    one) and ``tail``, the bytes after the last line break (a line cut off by a crash, or
    whatever an unrelated file ends with); it may raise to refuse the file. Only then is the
    tail dropped.
    """

    def __init__(
        self, path: str | Path, accept: Callable[[list[Any], bytes], None] | None = None
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.done_ids: set[str] = set()
        self.done_lines: dict[int, str] = {}  # input line -> its record's id, as JSON
        self._handle: TextIO = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        try:
            _lock(self._handle, self.path)
            # A device or a pipe (/dev/stdout) holds no earlier records and cannot be cut.
            if self.path.is_file():
                rows, tail = self._scan()
                if accept is not None:
                    accept(rows, tail)
                # A run killed mid-write leaves a partial last line: drop it, it is redone.
                drop_cut_last_line(self.path)
        except BaseException:
            self._handle.close()
            raise

    def _scan(self) -> tuple[list[Any], bytes]:
        """The complete lines, parsed, and the bytes after the last line break."""
        data = self.path.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]
        rows: list[Any] = []
        for raw in complete.decode("utf-8", errors="replace").split("\n")[:-1]:
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except (ValueError, RecursionError):
                rows.append(None)
                continue
            rows.append(rec)
            if isinstance(rec, dict):
                if rec.get("id") is not None:
                    self.done_ids.add(json.dumps(rec["id"]))
                if isinstance(rec.get("line"), int):
                    self.done_lines[rec["line"]] = json.dumps(rec.get("id"))
        return rows, data[len(complete) :]

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
        try:
            self._handle.write(json_line(record) + "\n")
            self._handle.flush()
            os.fsync(self._handle.fileno())
        except OSError as err:  # a full disk: say which file
            raise OSError(err.errno, err.strerror, str(self.path)) from err

    def close(self) -> None:
        try:
            self._handle.close()
        except OSError as err:  # what a failed write left in the buffer cannot go either
            raise OSError(err.errno, err.strerror, str(self.path)) from err

    def __enter__(self) -> ResumableWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def json_line(record: Any) -> str:
    """``record`` as one line of strict JSON (RFC 8259): a ``NaN`` or infinite float is written
    as ``null``, and a lone surrogate (a string read from ``"\\ud800"``) as its ``\\u`` escape,
    so that whatever was read can be written back, and read again as it was. U+0085, U+2028
    and U+2029 are escaped too, so that readers that cut lines at them still see one record a
    line."""
    try:
        text = json.dumps(record, ensure_ascii=False, allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(record), ensure_ascii=False, allow_nan=False)
    return _ESCAPED.sub(lambda m: f"\\u{ord(m[0]):04x}", text)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one file (through links too); a missing path is no file."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def record_start(record: InputRecord) -> bytes:
    """The bytes every output record of input line ``record`` starts with, as written: the
    input's fields and ``line``, before the result's fields (``RecordProcessor.rows``)."""
    return json_line({**(record.data or {}), "line": record.line}).encode()[:-1]


def earlier_output_problem(
    rows: Sequence[Any],
    inputs: Sequence[InputRecord],
    content_field: str,
    required: Iterable[str],
    tail: bytes = b"",
) -> str | None:
    """Why an existing output (``rows``, its complete lines, and ``tail``, what follows its
    last line break; see ``ResumableWriter``) is not an earlier output of the command on
    ``inputs``, or ``None`` when resuming it, and so cutting ``tail``, is safe.

    Every line must be a record of an input line (an int ``line`` and a ``status``), carry the
    fields ``required`` of every record of this command, and agree with that input line on
    ``id`` and on ``content_field`` (the ``text`` or ``prompt`` the command reads, which it
    never writes). ``tail`` must be empty or the start of a record a killed run was writing:
    it begins as the record of some input line begins (``record_start``). A file with no line
    break at all is thereby judged by its whole content, not let through for want of lines."""
    if tail and not any(
        start.startswith(tail) or tail.startswith(start) for start in map(record_start, inputs)
    ):
        return (
            f"it ends in {len(tail):,} bytes without a line break that are not the start of a "
            "record of this input (a run cut short leaves only that)"
        )
    by_line = {r.line: r for r in inputs}
    need = set(required) | {"line", "status"}
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            return f"its line {number} is not a JSON object"
        if not isinstance(row.get("line"), int) or not need <= row.keys():
            missing = ", ".join(sorted(need - row.keys())) or "line"
            return (
                f"its record {number} has no {missing}, which every record this command writes has"
            )
        source = by_line.get(row["line"])
        if source is None:
            return f"it holds a record of input line {row['line']}, which the input does not have"
        data = source.data or {}
        for name in ("id", content_field):
            if row.get(name) != data.get(name):
                return (
                    f"its record of input line {row['line']} has another {name!r} than that line "
                    "of the input (the input changed since, or the output is of another file)"
                )
    return None


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
    write_text_atomic(path, "".join(json_line(r) + "\n" for r in rows))
