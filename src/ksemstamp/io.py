"""Writing the files every command makes: strict JSON lines, resumable outputs, atomic writes.

* ``json_line`` is the one way records are written: strict JSON (no ``NaN``), with lone
  surrogates escaped so that any string read can be written back.
* ``ResumableWriter`` appends one record at a time and flushes, so a killed run loses at most the
  record it was working on; rerunning with the same output skips every input line already
  written. Records are keyed on their input line, not their ``id``: two lines may share an id
  and each is still done exactly once. A line whose stored ``id`` differs from the input's is
  refused (the input changed since the output was written); ``earlier_output_problem`` checks
  a whole existing output against the input before any work. An error record whose input line
  changed since (a broken line fixed) is taken out and redone (``redo``, ``input_changed``),
  and ``in_input_order`` puts the redone records back in their places.
  The writer holds an exclusive lock on the file, so a second run on the same output stops at
  once.
* ``atomic_target`` and the ``write_*_atomic`` helpers write through a temporary file and a
  rename, so a reader never sees a half-written file and an interrupted write leaves the old one.

Reading JSONL (a user's input, ``InputRecord``, and the files written here) is ``jsonl``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from .jsonl import InputRecord, read_jsonl_objects

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; outputs are not locked there
    fcntl = None  # type: ignore[assignment]

_ESCAPED = re.compile("[\ud800-\udfff\x85\u2028\u2029]")
logger = logging.getLogger(__name__)


def make_folder_for(path: str | Path) -> None:
    """Create the folder ``path`` goes in when it is missing, and say so (a mistyped
    ``--output`` folder shows up at once instead of a tree made in silence)."""
    parent = Path(path).parent
    if not parent.exists():
        parent.mkdir(parents=True, exist_ok=True)
        logger.warning("created the folder %s for %s", parent, Path(path).name)


def output_problem(path: str | Path) -> str | None:
    """Why records cannot be written to ``path`` (checked before any model loads), or
    ``None``: a folder, or a device that is neither a terminal nor a pipe (``/dev/null`` keeps
    nothing, ``/dev/full`` takes nothing), where no record could be kept or read back."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except OSError:
        return None  # a new file (or one that cannot be reached: opening it says why)
    if stat.S_ISDIR(mode):
        return f"{path}: Is a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        try:
            with open(path, "rb", buffering=0) as handle:
                terminal = os.isatty(handle.fileno())
        except OSError:
            terminal = False
        if not terminal:
            return (
                f"--output {path} is a device, not a file: the records written there would "
                "not be kept, nor could a rerun resume from them. Give a file"
            )
    return None


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
    tail dropped. ``redo(record)``, when given, picks the records to take out of the file (after
    ``accept``, atomically): their input lines count as not done, and are done again.
    """

    def __init__(
        self,
        path: str | Path,
        accept: Callable[[list[Any], bytes], None] | None = None,
        redo: Callable[[dict[str, Any]], bool] | None = None,
    ) -> None:
        self.path = Path(path)
        make_folder_for(self.path)
        self.done_ids: set[str] = set()
        self.done_lines: dict[int, str] = {}  # input line -> its record's id, as JSON
        self.done_status: dict[int, Any] = {}  # input line -> its record's status
        self.redone: set[int] = set()  # input lines whose records ``redo`` took out
        self._handle: TextIO = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._regular = self.path.is_file()
        try:
            _lock(self._handle, self.path)
            # A device or a pipe (/dev/stdout) holds no earlier records and cannot be cut.
            if self.path.is_file():
                rows, tail = self._scan()
                if accept is not None:
                    accept(rows, tail)
                # A run killed mid-write leaves a partial last line: drop it, it is redone.
                drop_cut_last_line(self.path)
                if redo is not None:
                    self._take_out([r for r in rows if isinstance(r, dict) and redo(r)])
        except BaseException:
            self._handle.close()
            raise

    def _take_out(self, records: list[dict[str, Any]]) -> None:
        """Rewrite the file without ``records`` (through a temporary file and a rename, then
        locked again) and count their input lines as not done."""
        lines = {r["line"] for r in records if isinstance(r.get("line"), int)}
        if not lines:
            return
        kept = []
        for raw in self.path.read_bytes().splitlines(keepends=True):
            try:
                row = json.loads(raw)
            except (ValueError, RecursionError):
                row = None
            if not (isinstance(row, dict) and row.get("line") in lines):
                kept.append(raw)
        with atomic_target(self.path) as tmp:
            tmp.write_bytes(b"".join(kept))
        handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        try:
            _lock(handle, self.path)
        except BaseException:
            handle.close()
            raise
        self._handle.close()
        self._handle = handle
        for line in lines:
            self.done_lines.pop(line, None)
            self.done_status.pop(line, None)
        self.redone |= lines

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
                    self.done_status[rec["line"]] = rec.get("status")
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
            if self._regular:  # a pipe or a terminal (/dev/stdout) cannot be synced
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
    never writes), unless it is an error record of a line that changed since (``input_changed``:
    a broken line fixed), which the run redoes. ``tail`` must be empty or the start of a record
    a killed run was writing:
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
    redone = {"line", "status", "error"}  # an error record of a changed line: redone, not read
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            return f"its line {number} is not a JSON object"
        source = by_line.get(row.get("line")) if isinstance(row.get("line"), int) else None
        if (
            source is not None
            and redone <= row.keys()
            and input_changed(row, source, content_field)
        ):
            continue
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


def input_changed(row: dict[str, Any], source: InputRecord, content_field: str) -> bool:
    """Whether ``row``, an error record of input line ``source.line``, was written for another
    content of that line (its ``id`` or ``content_field`` differ: the line was fixed since), so
    that a rerun redoes it. A record that is no error is never redone."""
    if row.get("status") != "error":
        return False
    data = source.data or {}
    return any(row.get(name) != data.get(name) for name in ("id", content_field))


# ---------------------------------------------------------------------- atomic writes


def in_input_order(path: str | Path) -> None:
    """Put the records of ``path`` back in input order (redone ones were appended), atomically."""
    rows = read_jsonl_objects(path, skip_invalid=True)
    write_jsonl_atomic(path, sorted(rows, key=lambda r: r.get("line", 0)))


@contextmanager
def atomic_target(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; renamed over ``path`` when the block ends
    without an error, removed when it raises. The temporary name keeps ``path``'s suffix, so
    writers that pick a format by suffix (``savefig``) still do."""
    path = Path(path)
    make_folder_for(path)
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
