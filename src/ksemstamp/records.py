"""Commands that turn a JSONL file of input records into a JSONL file of results.

``generate --input`` and ``detect --input`` share the loop here (``process_jsonl``): every
input line gives one output line (the input's fields, ``line``, and the result or an error),
the run resumes where an earlier one stopped, and records may be spread over devices
(``parallel``). What a command does to a record is its ``RecordProcessor``
(``cli.processors``), built from the settings in this process or in each process of a spread
run.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .builders import checked_key
from .detection.inputs import refused
from .io import (
    ResumableWriter,
    earlier_output_problem,
    in_input_order,
    input_changed,
    json_line,
    output_problem,
    same_file,
)
from .jsonl import InputRecord, read_jsonl, read_jsonl_objects
from .plots import progress_bar
from .settings.devices import DeviceSettings
from .settings.identity import shown
from .settings.watermark import WatermarkSettings

# ``parallel`` (Lightning) is imported where records are spread over devices: a weak key or an
# unusable output is refused before it loads.

logger = logging.getLogger(__name__)


@dataclass
class JsonlFiles:
    """Where ``generate --input`` and ``detect --input`` read and write, and how."""

    input: str
    output: str | None
    parallel: DeviceSettings = dataclasses.field(default_factory=DeviceSettings)
    """Devices the records are spread over (none requested: this process)."""
    quiet: bool = False
    """No progress bars."""
    mixed: bool = False
    """``generate``: go on with an ``output`` that holds records made under another key or other
    identity settings (refused otherwise)."""


@dataclass
class RecordProcessor:
    """What ``generate --input`` and ``detect --input`` do to input records.

    ``check(data)`` returns why a record cannot be processed (or ``None``); ``process(datas)``
    returns one output dict per valid record; ``models`` are the models it uses (checked for
    their device when records are spread over devices).
    """

    check: Callable[[dict], str | None]
    process: Callable[[list[dict]], list[dict]]
    error_fields: dict[str, Any]
    models: dict[str, Any] = dataclasses.field(default_factory=dict)

    def rows(self, chunk: list[InputRecord]) -> list[dict]:
        """One output line per input line: the input fields, ``line``, and the result or
        ``status: error`` with ``error``."""
        errors = {r.line: r.error or self.check(r.data) for r in chunk}
        ready = [r for r in chunk if errors[r.line] is None]
        results = self.process([r.data for r in ready]) if ready else []
        by_line = {r.line: res for r, res in zip(ready, results, strict=True)}
        rows = []
        for rec in chunk:
            row = {**(rec.data or {}), "line": rec.line}
            if errors[rec.line] is None:
                row |= by_line[rec.line]
            else:
                row |= {**self.error_fields, "status": "error", "error": errors[rec.line]}
            rows.append(row)
        return rows


ERROR_FIELDS: dict[str, dict[str, Any]] = {
    "generate": {},
    "detect": {"z_score": None, "p_value": None, "num_scored": 0, "num_valid": 0},
}
"""The result fields an error record of each command carries (set to "no result")."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a run over an ``--input`` file; the message says what was written and
    how to go on (the command prints it as its one line)."""


def _shard_place(output: str) -> tuple[Path, str]:
    """Where ``parallel.run_jsonl`` puts the shards of ``output``: its folder and name."""
    return Path(output).parent, Path(output).name


def _interrupted(written: int, where: str, done: int, total: int) -> Interrupted:
    return Interrupted(
        f"{written} record{'' if written == 1 else 's'} written to {where} ({done:,} of "
        f"{total:,} input lines done); rerun the same command to resume"
    )


def process_jsonl(
    args: JsonlFiles,
    cfg: WatermarkSettings,
    *,
    name: str,
    unit: str,
    batch_size: int,
    option: bool,
    processors: dict[str, Callable[[WatermarkSettings, bool], RecordProcessor]],
    job: Callable[[str, dict[str, Any], bool], Callable],
) -> int:
    """The JSONL loop shared by ``generate`` and ``detect``, resumable through ``ResumableWriter``.

    Before any model loads, the key must be strong (``builders.checked_key``), and the output
    must not be the input, nor an existing file other than an earlier output of this command
    on this input (``io.earlier_output_problem``), nor locked by another run. Records already
    in ``args.output`` are skipped; the rest go in input order, in chunks of ``batch_size``,
    through the command's ``RecordProcessor``: in this process, or spread over devices with
    ``Trainer.predict`` when ``args.parallel`` asks for it (``parallel.run_jsonl``). An error
    record of an input line that changed since (a broken line fixed) is redone in place.
    Returns the exit status over the whole output (``exit_status``): 0 every line done, 3 some
    lines failed, 1 every line failed. ``processors[name]`` builds the processor from the
    settings and ``option``; ``job(name, settings, option)`` builds it in a process of its own.
    """
    if not args.output:
        raise ValueError(f"{name}: --input needs --output")
    problem = output_problem(args.output)
    if problem:
        raise ValueError(problem)
    if same_file(args.input, args.output):
        raise ValueError(
            f"--output {args.output} is the --input file: the results would be written into "
            "the input. Give another file for --output"
        )
    run = _Run(args, name, list(read_jsonl(args.input)))
    # A weak key is refused before the output is opened and before any process starts (not
    # by each process once started); resolved once, the demo key's warning shows once.
    key = checked_key(cfg)
    if key is not None:
        cfg = dataclasses.replace(cfg, key=key)
    if name == "generate" and not option:  # watermarked: resumed only under the same mark
        run.made_as = made_under(cfg, key)
    if args.parallel.requested():
        run.spread(lambda: job(name, {**cfg.to_dict(), "key": cfg.key}, option), batch_size)
    else:
        run.here(lambda: processors[name](cfg, option), unit, batch_size)
    statuses, short, skipped = run.statuses, run.short, run.skipped
    failures = statuses.count("error")
    successes = len(statuses) - failures
    counted_as_ok = "ok" if name == "generate" else "scored"
    logger.info(
        "%s: %d %s, %d failed, %d already done", name, successes, counted_as_ok, failures, skipped
    )
    if short:
        logger.warning(
            "warning: %d text%s too short to be detected: fewer scored %ss than detection "
            "typically needs (each record says: scored_units, units_needed, warning)",
            short,
            "s are" if short > 1 else " is",
            cfg.unit,
        )
    for row in run.refused:
        logger.warning(
            "refused: line %s (id %s): %s", row.get("line"), json_line(row.get("id")), row["error"]
        )
    if run.mismatched:
        logger.warning(
            "warning: %d record%s made under other identity settings than they were scored "
            "with (%s), and scored all the same: their p-values are exact, but part of the "
            "evidence their generator put in is lost. Detect with the generator's settings; "
            "--strict refuses such records (each says: identity_mismatch)",
            len(run.mismatched),
            "s were" if len(run.mismatched) > 1 else " was",
            run.mismatched[0],
        )
    return exit_status([*run.earlier, *statuses])


@dataclass
class _Run:
    """One run of ``process_jsonl`` over the ``records`` of ``args.input``: what an existing
    output must be, the records' way through this process or over devices, and what they gave
    (``statuses`` of the records written now, ``short`` of them too short to be detected,
    ``skipped`` input lines done before, ``earlier`` statuses of the output's other records)."""

    args: JsonlFiles
    name: str
    records: list[InputRecord]
    statuses: list = dataclasses.field(default_factory=list)
    short: int = 0
    mismatched: list = dataclasses.field(default_factory=list)
    """The ``identity_differences`` of the records scored under other identity settings."""
    refused: list = dataclasses.field(default_factory=list)
    """The records refused for them (``detection.strict``)."""
    skipped: int = 0
    earlier: list = dataclasses.field(default_factory=list)
    made_as: dict[str, Any] | None = None
    """``generate``: the key fingerprint and identity settings this run writes its records
    under (``made_under``); an output's records made otherwise are not resumed into."""

    def __post_init__(self) -> None:
        self.content_field = "prompt" if self.name == "generate" else "text"
        self.by_line = {r.line: r for r in self.records}

    def accept(self, rows: list, tail: bytes) -> None:
        """Refuse an output that is not an earlier output of this command on this input."""
        fields = ERROR_FIELDS[self.name]
        problem = earlier_output_problem(rows, self.records, self.content_field, fields, tail)
        if problem is None and self.made_as is not None and not self.args.mixed:
            other = made_otherwise(rows, self.made_as)
            if other:
                raise ValueError(
                    f"--output {self.args.output} holds records made under {other}: resuming "
                    "would mix them in one file. Give a new --output, or --mixed true to go on"
                )
        if problem:
            raise ValueError(
                f"--output {self.args.output} exists and is not an earlier output of "
                f"`{self.name}` on {self.args.input}: {problem}. Give a new --output, or move "
                "that file away to start over (rerunning with the same input and output resumes "
                "a run)"
            )

    def redo(self, row: dict) -> bool:
        """Whether ``row`` is an error record of an input line fixed since."""
        line = row.get("line")
        source = self.by_line.get(line) if isinstance(line, int) else None
        return source is not None and input_changed(row, source, self.content_field)

    def spread(self, make_job: Callable[[], Callable], batch_size: int) -> None:
        """The records spread over devices by ``parallel.run_jsonl``, each process running the
        job ``make_job`` gives; Ctrl-C raises ``Interrupted``, counting what the shards hold."""
        from .parallel import read_records, run_jsonl, shard_paths

        args = self.args
        with ResumableWriter(args.output, accept=self.accept, redo=self.redo):
            pass  # the checks above, before any process starts; fixed lines' errors taken out
        spawned = make_job()
        try:
            rows, self.skipped = run_jsonl(
                args.input, args.output, spawned, args.parallel, batch_size, not args.quiet
            )
        except KeyboardInterrupt:
            # Each process's finished batches are in its shard; a rerun merges them first.
            written = sum(len(read_records(p)) for p in shard_paths(*_shard_place(args.output)))
            done = written + len(read_records(args.output))
            where = f"the shards beside {args.output}"
            raise _interrupted(written, where, done, len(self.records)) from None
        self.statuses = [row["status"] for row in rows]
        self.short = sum("units_needed" in row for row in rows)
        self.mismatched = [r["identity_differences"] for r in rows if "identity_mismatch" in r]
        self.refused = [r for r in rows if refused(r.get("error"))]
        new, kept = {row.get("line") for row in rows}, read_records(args.output)
        self.earlier = [r.get("status") for r in kept if r.get("line") not in new]

    def here(self, build: Callable[[], RecordProcessor], unit: str, batch_size: int) -> None:
        """The records not yet done through the processor ``build()`` gives, in this process,
        each row written as it comes; Ctrl-C raises ``Interrupted``, counting what the output
        holds."""
        args, records = self.args, self.records
        interrupted = False
        with ResumableWriter(args.output, accept=self.accept, redo=self.redo) as out:
            pending = [r for r in records if not out.is_done(r)]
            self.skipped = skipped = len(records) - len(pending)
            self.earlier = [out.done_status[r.line] for r in records if r.line in out.done_status]
            redone = bool(out.redone)
            if out.redone:
                logger.info("redoing %d failed records whose input lines changed", len(out.redone))
            if skipped:
                logger.info("resuming: %d records already in %s", skipped, args.output)
            bar = None
            try:
                processor = build() if pending else None
                bar = progress_bar(
                    total=len(pending), unit=unit, desc=self.name, disable=args.quiet
                )
                for start in range(0, len(pending), batch_size):
                    for row in processor.rows(pending[start : start + batch_size]):
                        out.write(row)
                        self.statuses.append(row["status"])
                        self.short += "units_needed" in row
                        if "identity_mismatch" in row:
                            self.mismatched.append(row["identity_differences"])
                        if refused(row.get("error")):
                            self.refused.append(row)
                        bar.update()
            except KeyboardInterrupt:
                interrupted = True
            finally:
                if bar is not None:
                    bar.close()
        if interrupted:
            # Every record is flushed as it is written: nothing done is lost. Ctrl-C can land
            # after a record reached the file and before it was counted, so the closed file says
            # how many are done (a pipe or device, which cannot be read back: the count).
            done = skipped + len(self.statuses)
            if Path(args.output).is_file():
                done = len(read_jsonl_objects(args.output, missing_ok=True, skip_invalid=True))
            raise _interrupted(done - skipped, args.output, done, len(records)) from None
        if redone and Path(args.output).is_file():
            in_input_order(args.output)


def made_under(cfg: WatermarkSettings, key: str | None) -> dict[str, Any]:
    """The key fingerprint and the identity settings (those the settings alone give, without
    loading the encoder or the centroids) that ``cfg`` writes its records under."""
    from .keys import key_fingerprint
    from .settings.identity import identity_of

    mark = cfg.mark if cfg.partition.kind == "kmeans" else cfg.mark.without_centroids()
    identity = identity_of(dataclasses.replace(cfg, mark=mark), "", None)
    identity.pop("encoder")
    if cfg.partition.kind == "kmeans":
        identity.pop("partition.lsh_bits"), identity.pop("partition.lsh_seed")
    return {"key_fingerprint": key and key_fingerprint(key), "identity": identity}


def made_otherwise(rows: list[dict], made_as: dict[str, Any]) -> str | None:
    """What the generated ``rows`` of an output were made under that ``made_as`` (``made_under``)
    is not, in words (``None``: every record agrees, or says nothing)."""
    said = []
    for row in rows:
        theirs = row.get("key_fingerprint")
        if theirs and theirs != made_as["key_fingerprint"]:
            said.append(
                f"another key (fingerprint {theirs}; this run's: {made_as['key_fingerprint']})"
            )
        recorded = row.get("identity")
        if isinstance(recorded, dict):
            names = [
                n for n, v in made_as["identity"].items() if n in recorded and recorded[n] != v
            ]
            said += [
                f"{n} {shown(recorded[n])} (this run's: {shown(made_as['identity'][n])})"
                for n in names
            ]
        if said:
            return f"line {row.get('line')}: " + ", ".join(said)
    return None


EXIT_OK, EXIT_ALL_FAILED, EXIT_SOME_FAILED = 0, 1, 3
"""``generate --input`` and ``detect --input`` exit with 0 when every line of the output is a
result, 3 when some lines failed (their records have ``status: error`` and say why; fix those
input lines and rerun the same command to redo just them) and 1 when every line failed."""


def exit_status(statuses: list[Any]) -> int:
    """The exit status of a run whose output's records have ``statuses`` (``EXIT_OK``, ...)."""
    failures = statuses.count("error")
    if not failures:
        return EXIT_OK
    return EXIT_ALL_FAILED if failures == len(statuses) else EXIT_SOME_FAILED
