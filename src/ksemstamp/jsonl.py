"""Reading JSONL: a user's input file or upload, and the files this package wrote.

* ``read_jsonl`` parses a user's input file, and ``parse_jsonl`` an upload (the web page's
  batch), with one rule: lines are cut at ``\n``, ``\r\n`` or ``\r`` only (never at U+2028 or
  U+0085, which JSON strings may hold), and a line that is blank or not a JSON object of at
  most ``MAX_DEPTH`` levels, with finite numbers of at most ``MAX_INT_DIGITS`` digits, becomes
  an error record (an ``InputRecord`` with its ``error``) instead of stopping the run.
* ``read_jsonl_objects`` reads a file this package wrote: a last line cut short by a killed
  writer is ignored (its record is redone), any other broken line is an error.

Writing records (``json_line``, ``ResumableWriter``, the atomic writes) is ``io``.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

MAX_DEPTH = 64
"""Most levels of nested arrays and objects in an input line; deeper lines are error records
(Python's JSON reader would otherwise run out of stack on them)."""
MAX_INT_DIGITS = 4300
"""Longest integer an input line may hold, in digits (Python's own limit for reading one)."""


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


def json_error(err: json.JSONDecodeError) -> str:
    """What is wrong with a line and where, in full: ``Invalid control character at column 17``
    (the reader's own ``msg`` stops at "at", its place given apart)."""
    at = "" if err.msg.endswith(" at") else " at"
    return f"{err.msg}{at} column {err.colno}"


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
        return refuse(f"is not valid JSON: {json_error(err)}")
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
