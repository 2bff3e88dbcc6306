"""The detection routes: one text (``POST /api/detect``) and an uploaded file (``/api/batch``)."""

from __future__ import annotations

import time
from pathlib import PurePath
from typing import Any

from fastapi import APIRouter, Depends, File, HTTPException, Request, UploadFile
from pydantic import BaseModel
from starlette.datastructures import UploadFile as StarletteUpload

from ..detection.inputs import detection_row, record_problem, record_prompts
from ..detector import DetectionResult
from ..io import json_line
from ..jsonl import TooManyRecords, parse_jsonl
from .lanes import SMALL_CHARS
from .present import ERROR_FIELDS, decision
from .state import ServeState, serve_state

router = APIRouter()
STATE = Depends(serve_state)
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
TEXT_SUFFIXES = (".txt", ".text", ".md")
BATCH_CHUNK = 64
"""Records of an uploaded file detected in one ``detect_batch`` call (one encoder pass)."""


class DetectRequest(BaseModel):
    """Body of ``POST /api/detect``."""

    text: str
    prompt: str | None = None


@router.post("/api/detect")
async def detect(body: DetectRequest, state: ServeState = STATE) -> dict[str, Any]:
    """Score one text; the answer says which sentences carry the mark and what p means."""
    state.check_size("text", body.text)
    state.check_size("prompt", body.prompt)
    if not body.text.strip():
        raise HTTPException(422, "the text is empty: paste the text to check")
    heavy = len(body.text) + len(body.prompt or "") > SMALL_CHARS
    return await state.in_pool(detect_one, state, body.text, body.prompt, heavy=heavy)


def detect_one(state: ServeState, text: str, prompt: str | None) -> dict[str, Any]:
    start = time.perf_counter()
    # Under chat settings a prompt is an instruction: it seeds no sentence of the answer.
    result = state.detector.detect(text, None if state.settings.chat else prompt or None)
    return state.view(result, text, time.perf_counter() - start)


@router.post("/api/batch")
async def batch(
    request: Request,
    file: UploadFile = File(...),  # noqa: B008
    state: ServeState = STATE,
) -> dict[str, Any]:
    """Score an uploaded .txt (one text) or .jsonl (``ksemstamp detect --input``): one file
    a request (a second one is refused, not ignored)."""
    limits = state.limits
    uploads = [v for _, v in (await request.form()).multi_items() if isinstance(v, StarletteUpload)]
    if len(uploads) > 1:
        raise HTTPException(
            422, f"the request holds {len(uploads)} files; upload one file a request"
        )
    name = PurePath(file.filename or "upload").name
    suffix = PurePath(name).suffix.lower()
    if suffix not in JSONL_SUFFIXES + TEXT_SUFFIXES:
        raise HTTPException(415, f"upload a .txt or .jsonl file, not {name!r}")
    raw = await file.read(limits.max_upload_bytes + 1)
    if len(raw) > limits.max_upload_bytes:
        raise HTTPException(
            413, f"the file is larger than the limit of {limits.max_upload_bytes:,} bytes"
        )
    # Decoding and parsing up to max_upload_bytes take a while: in the pool, never on the
    # event loop, where they would hold every other request of the page meanwhile.
    return await state.in_pool(read_and_score, state, name, raw, heavy=True)


def read_and_score(state: ServeState, name: str, raw: bytes) -> dict[str, Any]:
    """An upload read and scored in one go, in the heavy lane."""
    return score_batch(state, name, read_upload(state, name, raw))


def read_upload(state: ServeState, name: str, raw: bytes) -> list[tuple[int, Any, str | None]]:
    """``(line, data, error)`` of each record of an upload (a .txt is one record); raises the
    ``HTTPException`` of an upload that cannot be read, counting records as it reads."""
    limits = state.limits
    try:
        content = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise HTTPException(
            400, f"{name} is not valid UTF-8 (byte {err.start}): save it as UTF-8 text"
        ) from None
    if not content.strip():
        raise HTTPException(422, f"{name} is empty")
    if PurePath(name).suffix.lower() in TEXT_SUFFIXES:
        state.check_size("text", content)
        return [(1, {"file": name, "text": content}, None)]
    try:
        parsed = parse_jsonl(content, max_records=limits.max_records)
    except TooManyRecords:
        raise HTTPException(
            413,
            f"{name} has more than {limits.max_records:,} records; the limit is "
            f"{limits.max_records:,} records (lines) per file",
        ) from None
    if all(p.data is None for p in parsed):
        first = parsed[0].error if parsed else "no records"
        raise HTTPException(
            422,
            f"{name}: no line is a JSON object ({first}); expected JSONL as for "
            '`ksemstamp detect --input`: one {"text": ...} object per line',
        )
    return [(p.line, p.data, p.error) for p in parsed]


def score_batch(state: ServeState, name: str, lines: list) -> dict[str, Any]:
    """Detect the valid records of an upload; one output row per input line, as
    ``ksemstamp detect --input`` writes them, with counts per status."""
    errors = {
        line: error
        or record_problem(
            data,
            state.fingerprint,
            state.scheme.identity,
            state.settings.detection.strict,
            state.limits.max_chars,
        )
        for line, data, error in lines
    }
    ready = [(line, data) for line, data, _ in lines if errors[line] is None]
    start = time.perf_counter()
    results: dict[int, DetectionResult] = {}
    for i in range(0, len(ready), BATCH_CHUNK):
        chunk = ready[i : i + BATCH_CHUNK]
        prompts = record_prompts([d for _, d in chunk], state.settings.chat)
        scored = state.detector.detect_batch([d["text"] for _, d in chunk], prompts)
        results.update({line: res for (line, _), res in zip(chunk, scored, strict=True)})
    rows = []
    for line, data, _ in lines:
        row = {**(data or {}), "line": line}
        if line in results:
            row |= detection_row(data, results[line], state.scheme.identity)
        else:
            row |= {**ERROR_FIELDS, "status": "error", "error": errors[line]}
        rows.append(row)
    counts = {"ok": 0, "too_short": 0, "unsupported": 0, "error": 0, "watermarked": 0}
    for line, _, _ in lines:
        res = results.get(line)
        counts[res.status if res else "error"] += 1
        counts["watermarked"] += bool(res and decision(res) == "watermarked")
    return {
        "file": name,
        "output_name": f"{PurePath(name).stem}.detections.jsonl",
        "records": rows,
        "summary": counts,
        "seconds": round(time.perf_counter() - start, 3),
        "key_fingerprint": state.fingerprint,
        "jsonl": "".join(json_line(r) + "\n" for r in rows),
    }
