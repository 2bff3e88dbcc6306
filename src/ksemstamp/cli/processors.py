"""What ``generate --input`` and ``detect --input`` do to each record (``PROCESSORS``), for
the JSONL loop of ``records``: built in this process, or as ``RecordJob`` in each process of a
run spread over devices."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..builders import build_detector, build_watermarker
from ..detection.detectable import length_note
from ..detection.inputs import detection_row, identity_fields, record_problem, record_prompts
from ..records import ERROR_FIELDS, JsonlFiles, RecordProcessor, process_jsonl
from ..settings.watermark import WatermarkSettings

if TYPE_CHECKING:
    from ..parallel import Job


@dataclass
class RecordJob:
    """Builds a command's ``RecordProcessor`` in a process of its own, on that process's
    device (picklable: settings, not models, cross to ``ddp_spawn`` processes)."""

    command: str
    settings: dict[str, Any]
    """``WatermarkSettings.to_dict()`` and the key (it stays in memory)."""
    option: bool = False
    """``generate``: no watermark; ``detect``: progress bars."""

    def __call__(self, device) -> Job:
        from ..parallel import Job

        data = dict(self.settings)
        data["model"] = {**data["model"], "device": str(device)}
        processor = PROCESSORS[self.command](WatermarkSettings.from_dict(data), self.option)
        return Job(processor.rows, processor.models)


def _generate_processor(settings: WatermarkSettings, no_watermark: bool = False) -> RecordProcessor:
    watermarker = build_watermarker(settings)
    fingerprint = None if no_watermark else watermarker.scheme.key_fingerprint
    # What a detector must share with the generator goes into every watermarked record.
    identity = {} if no_watermark else identity_fields(watermarker.scheme.identity)

    def check(data: dict) -> str | None:
        prompt = data.get("prompt")
        if prompt is None:
            return "missing field 'prompt'"
        if not isinstance(prompt, str):
            return f"'prompt' must be a string, got {type(prompt).__name__}"
        return None

    def process(datas: list[dict]) -> list[dict]:
        results = watermarker.generate([d["prompt"] for d in datas], watermark=not no_watermark)
        # A text too short to be detected says so (``detectable``): not for plain sampling.
        notes = [None if no_watermark else length_note(res, settings) for res in results]
        return [
            {**res.to_record(), **(note or {}), "key_fingerprint": fingerprint, **identity}
            for res, note in zip(results, notes, strict=True)
        ]

    models = _models(watermarker.scheme, watermarker)
    return RecordProcessor(check, process, ERROR_FIELDS["generate"], models)


def _models(scheme, watermarker=None) -> dict[str, Any]:
    """The models a scheme (and a watermarker's LM) sit on, for device checks."""
    models = {"encoder": scheme.encoder, "partition": scheme.partition}
    model = None if watermarker is None else watermarker.engine.model
    return models | ({"lm": model} if model is not None else {})


def _detect_processor(settings: WatermarkSettings, progress: bool = False) -> RecordProcessor:
    detector = build_detector(settings)
    fingerprint, identity = detector.scheme.key_fingerprint, detector.scheme.identity

    def check(data: dict) -> str | None:
        return record_problem(data, fingerprint, identity, settings.detection.strict)

    def process(datas: list[dict]) -> list[dict]:
        prompts = record_prompts(datas, settings.chat)
        results = detector.detect_batch([d["text"] for d in datas], prompts, progress=progress)
        return [detection_row(d, r, identity) for d, r in zip(datas, results, strict=True)]

    return RecordProcessor(check, process, ERROR_FIELDS["detect"], _models(detector.scheme))


PROCESSORS: dict[str, Callable[[WatermarkSettings, bool], RecordProcessor]] = {
    "generate": _generate_processor,
    "detect": _detect_processor,
}


def run_records(
    files: JsonlFiles, settings: WatermarkSettings, name: str, unit: str, batch: int, option: bool
) -> int:
    """``generate --input`` and ``detect --input``: ``process_jsonl`` with this module's
    processors (``PROCESSORS``, looked up at run time) and ``RecordJob``."""
    return process_jsonl(
        files,
        settings,
        name=name,
        unit=unit,
        batch_size=batch,
        option=option,
        processors=PROCESSORS,
        job=RecordJob,
    )
