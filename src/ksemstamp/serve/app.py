"""The FastAPI application: the page, and a JSON API for detection, batches and generation.

``create_app`` loads the models once; every request reuses them. The key stays in the
``WatermarkScheme`` (as its table) and in a log filter that blanks it out: responses, error
pages and log lines carry only its fingerprint.

Length (~450 lines): one route per API endpoint with its request model and checks; the
presentation of results is in ``present.py``, the generation queue in ``jobs.py``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import PurePath
from typing import Any

import anyio
from fastapi import FastAPI, File, HTTPException, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..config import WatermarkConfig, build_detector, build_scheme, build_watermarker
from ..detector import DetectionResult, Detector
from ..keys import DEMO_KEY, key_fingerprint, num_valid, resolve_key
from ..prompts import plan_prompt
from .jobs import GenerationQueue, JobFailed, QueueFull
from .present import (
    ERROR_FIELDS,
    Limits,
    check_record,
    decision,
    detection_view,
    parse_jsonl,
)

log = logging.getLogger("ksemstamp.serve")
STATIC = resources.files("ksemstamp.serve") / "static"
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
TEXT_SUFFIXES = (".txt", ".text", ".md")


class DetectRequest(BaseModel):
    """Body of ``POST /api/detect``."""

    text: str
    prompt: str | None = None


class GenerateRequest(BaseModel):
    """Body of ``POST /api/generate``."""

    prompt: str
    max_new_tokens: int | None = None


class RedactKey(logging.Filter):
    """Replaces the key by ``***`` in a record's message and traceback, wherever it came from."""

    def __init__(self, secret: str | None) -> None:
        super().__init__()
        self.secret = secret

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secret:
            return True
        message = record.getMessage()
        if self.secret in message:
            record.msg, record.args = message.replace(self.secret, "***"), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text and self.secret in record.exc_text:
            record.exc_text = record.exc_text.replace(self.secret, "***")
        return True


def install_redaction(redact: RedactKey, logger_names: tuple[str, ...] = ()) -> None:
    """Put ``redact`` on the named loggers and on every handler they and the root logger have
    (handler filters also see records propagated from other loggers)."""
    names = ("ksemstamp.serve", "uvicorn", "uvicorn.error", "uvicorn.access", *logger_names)
    loggers = [logging.getLogger(), *(logging.getLogger(n) for n in names)]
    for logger in loggers:
        if redact not in logger.filters:
            logger.addFilter(redact)
        for handler in logger.handlers:
            if redact not in handler.filters:
                handler.addFilter(redact)


def _problem(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _describe_validation(err: RequestValidationError) -> str:
    # Pydantic's own messages quote the input back; name the field and the problem only.
    parts = []
    for item in err.errors():
        where = ".".join(str(p) for p in item.get("loc", ()) if p != "body")
        kind = item.get("type", "")
        if kind == "json_invalid":
            parts.append("the request body is not valid JSON")
        elif kind == "missing":
            parts.append(f"'{where}' is required")
        else:
            parts.append(f"'{where}': {item.get('msg', 'invalid value')}")
    return "; ".join(parts) or "invalid request"


def create_app(
    settings: WatermarkConfig,
    *,
    limits: Limits | None = None,
    encoder: Any = None,
    lm: Any = None,
    generation: bool = True,
) -> FastAPI:
    """The web app for ``settings``, with the models loaded now, once.

    Args:
        settings: the watermark settings (key, encoder, partition, gamma, statistic, ...), as
            for every other command.
        limits: input limits (text size, upload size, queue length); the text size defaults
            to ``settings.max_text_chars``, and a given one replaces it, so the page and the
            detector refuse the same texts.
        encoder: an already loaded sentence encoder to reuse (tests share one).
        lm: an already loaded ``(model, tokenizer)`` to reuse.
        generation: load the LM and offer the Generate tab.
    """
    if limits is None:
        limits = Limits(max_chars=settings.max_text_chars)
    settings = dataclasses.replace(settings, max_text_chars=limits.max_chars)
    secret = resolve_key(settings.key) if settings.valid_mode == "keyed" else None
    if secret is not None:  # resolved once: the demo-key warning is given once
        settings = dataclasses.replace(settings, key=secret)
    redact = RedactKey(secret)
    install_redaction(redact)
    scheme = build_scheme(settings, encoder=encoder)
    # The encoder's tokenizer is not safe to call from two threads at once (the generation
    # worker and a detection request): one lock around every encoder pass.
    encoder_lock = threading.Lock()
    unlocked_embed = scheme.embed

    def embed(sentences, progress=False):
        with encoder_lock:
            return unlocked_embed(sentences, progress=progress)

    scheme.embed = embed  # type: ignore[method-assign]
    detector: Detector = build_detector(settings, scheme)
    watermarker = build_watermarker(settings, scheme, lm=lm) if generation else None
    fingerprint = scheme.key_fingerprint
    valid_per_row = num_valid(scheme.num_regions, scheme.gamma) if scheme.mark == "region" else 0
    demo_key = secret is not None and fingerprint == key_fingerprint(DEMO_KEY)
    # From here on the key lives only in `settings` (whose repr and to_dict leave it out), the
    # scheme's table and the log filter; nothing below puts it in a response.
    del secret

    def view(result: DetectionResult, text: str, seconds: float) -> dict[str, Any]:
        out = detection_view(
            result,
            text,
            gamma=scheme.gamma,
            alpha=detector.alpha,
            valid_per_row=valid_per_row,
            num_regions=scheme.num_regions,
            mark=scheme.mark,
            soft_contexts=scheme.context_temperature > 0,
        )
        out["seconds"] = round(seconds, 4)
        out["key_fingerprint"] = fingerprint
        return out

    def run_generation(params: dict[str, Any], report: Callable[[dict], None]) -> dict:
        assert watermarker is not None
        watermarker.max_new_tokens = params["max_new_tokens"]

        def progress(p) -> None:
            report(
                {
                    "sentences": p.sentences,
                    "candidates": p.candidates,
                    "drawn_for_current": p.drawn_for_current,
                    "tokens": p.tokens,
                    "max_tokens": p.max_tokens,
                    "text": p.texts[0],
                }
            )

        res = watermarker.generate([params["prompt"]], on_progress=progress)[0]
        if res.status != "ok":
            raise JobFailed(res.error or "generation failed")
        start = time.perf_counter()
        result = detector.detect(res.text, res.prompt_for_detection)
        return {
            "prompt": params["prompt"],
            "text": res.text,
            "generation": {
                "num_sentences": res.num_sentences,
                "num_tokens": res.num_tokens,
                "candidates": res.candidates,
                "fallbacks": res.fallbacks,
                "seconds": round(res.seconds, 2),
                "key_fingerprint": fingerprint,
                "completion": res.completion,
                "prompt_dropped_chars": res.prompt_dropped_chars,
                "chat": res.chat,
            },
            "detection": view(result, res.text, time.perf_counter() - start),
        }

    jobs = GenerationQueue(run_generation, max_waiting=limits.max_waiting)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        jobs.close()

    app = FastAPI(
        title="ksemstamp",
        description="Detect and generate k-SemStamp / SemStamp watermarks on this machine.",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lifespan,
    )
    app.state.jobs = jobs
    app.state.detector = detector
    app.state.limits = limits
    app.state.key_fingerprint = fingerprint
    app.state.redact = redact

    # ------------------------------------------------------------------ errors
    @app.middleware("http")
    async def catch_everything(request: Request, call_next):
        # Refuse an oversized body before reading it (the limits below apply once it is read).
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limits.max_upload_bytes + 4 * limits.max_chars:
            return _problem(413, "the request is larger than this server accepts")
        # A bare 500 with no detail: an exception's message might hold anything.
        try:
            return await call_next(request)
        except Exception:
            log.exception("request %s %s failed", request.method, request.url.path)
            return _problem(500, "internal error; the server log has the details")

    @app.exception_handler(RequestValidationError)
    async def on_validation(_: Request, err: RequestValidationError) -> JSONResponse:
        return _problem(422, _describe_validation(err))

    @app.exception_handler(StarletteHTTPException)
    async def on_http(_: Request, err: StarletteHTTPException) -> JSONResponse:
        return _problem(err.status_code, str(err.detail))

    def check_size(name: str, value: str | None) -> None:
        if value is not None and len(value) > limits.max_chars:
            raise HTTPException(
                413,
                f"the {name} has {len(value):,} characters; the limit is {limits.max_chars:,}",
            )

    # ------------------------------------------------------------------ page
    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(str(STATIC / "index.html"), media_type="text/html")

    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")

    @app.get("/api/info")
    def info() -> dict[str, Any]:
        """Settings in force (never the key), limits and what the server offers."""
        return {
            "key_fingerprint": fingerprint,
            "demo_key": demo_key,
            "valid_mode": scheme.valid_mode,
            "mark": scheme.mark,
            "context_temperature": scheme.context_temperature,
            "statistic": detector.statistic,
            "alpha": detector.alpha,
            "gamma": scheme.gamma,
            "num_regions": scheme.num_regions,
            "partition": settings.partition,
            "encoder": settings.checkpoint or settings.encoder,
            "lm": settings.lm if generation else None,
            "generation": generation,
            "max_new_tokens": settings.max_new_tokens,
            "max_chars": limits.max_chars,
            "max_upload_bytes": limits.max_upload_bytes,
        }

    # ------------------------------------------------------------------ detect
    @app.post("/api/detect")
    def detect(body: DetectRequest) -> dict[str, Any]:
        """Score one text; the answer says which sentences carry the mark and what p means."""
        check_size("text", body.text)
        check_size("prompt", body.prompt)
        if not body.text.strip():
            raise HTTPException(422, "the text is empty: paste the text to check")
        start = time.perf_counter()
        # Under chat settings a prompt is an instruction: it seeds no sentence of the answer.
        result = detector.detect(body.text, None if settings.chat else body.prompt or None)
        return view(result, body.text, time.perf_counter() - start)

    @app.post("/api/batch")
    async def batch(file: UploadFile = File(...)) -> dict[str, Any]:  # noqa: B008
        """Score an uploaded .txt (one text) or .jsonl (``watermark.py detect --input``)."""
        name = PurePath(file.filename or "upload").name
        suffix = PurePath(name).suffix.lower()
        if suffix not in JSONL_SUFFIXES + TEXT_SUFFIXES:
            raise HTTPException(415, f"upload a .txt or .jsonl file, not {name!r}")
        raw = await file.read(limits.max_upload_bytes + 1)
        if len(raw) > limits.max_upload_bytes:
            raise HTTPException(
                413, f"the file is larger than the limit of {limits.max_upload_bytes:,} bytes"
            )
        try:
            content = raw.decode("utf-8-sig")
        except UnicodeDecodeError as err:
            raise HTTPException(
                400, f"{name} is not valid UTF-8 (byte {err.start}): save it as UTF-8 text"
            ) from None
        if not content.strip():
            raise HTTPException(422, f"{name} is empty")
        if suffix in TEXT_SUFFIXES:
            check_size("text", content)
            lines = [(1, {"file": name, "text": content}, None)]
        else:
            parsed = parse_jsonl(content)
            if len(parsed) > limits.max_records:
                raise HTTPException(
                    413, f"{name} has {len(parsed):,} records; the limit is {limits.max_records:,}"
                )
            if all(p.data is None for p in parsed):
                first = parsed[0].error if parsed else "no records"
                raise HTTPException(
                    422,
                    f"{name}: no line is a JSON object ({first}); expected JSONL as for "
                    '`watermark.py detect --input`: one {"text": ...} object per line',
                )
            lines = [(p.line, p.data, p.error) for p in parsed]
        return await anyio.to_thread.run_sync(score_batch, name, lines)

    def score_batch(name: str, lines: list) -> dict[str, Any]:
        errors = {
            line: error or check_record(data, fingerprint, limits.max_chars)
            for line, data, error in lines
        }
        ready = [(line, data) for line, data, _ in lines if errors[line] is None]
        start = time.perf_counter()
        results: dict[int, DetectionResult] = {}
        for i in range(0, len(ready), 64):
            chunk = ready[i : i + 64]
            # As `detect --input`: a chat answer is not seeded by its instruction.
            prompts = [
                None if settings.chat or d.get("chat") is True else d.get("prompt") or None
                for _, d in chunk
            ]
            scored = detector.detect_batch([d["text"] for _, d in chunk], prompts)
            results.update({line: res for (line, _), res in zip(chunk, scored, strict=True)})
        rows = []
        for line, data, _ in lines:
            row = {**(data or {}), "line": line}
            if line in results:
                row |= results[line].to_record()
            else:
                row |= {**ERROR_FIELDS, "status": "error", "error": errors[line]}
            rows.append(row)
        counts = {"ok": 0, "too_short": 0, "unsupported": 0, "error": 0, "watermarked": 0}
        for line, _, _ in lines:
            res = results.get(line)
            counts[res.status if res else "error"] += 1
            counts["watermarked"] += bool(res and decision(res) == "watermarked")
        stem = PurePath(name).stem
        return {
            "file": name,
            "output_name": f"{stem}.detections.jsonl",
            "records": rows,
            "summary": counts,
            "seconds": round(time.perf_counter() - start, 3),
            "key_fingerprint": fingerprint,
            "jsonl": "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
        }

    # ------------------------------------------------------------------ generate
    @app.post("/api/generate", status_code=202)
    def generate(body: GenerateRequest) -> dict[str, Any]:
        """Queue a watermarked continuation of ``prompt``; follow it at ``/api/jobs/{id}``."""
        if watermarker is None:
            raise HTTPException(503, "this server was started without a language model")
        check_size("prompt", body.prompt)
        # The generator's own rules for a prompt, checked now rather than after the queue.
        start = plan_prompt(
            body.prompt,
            scheme.splitter,
            watermarker.tokenizer,
            chat=watermarker.chat,
            budget=watermarker.prompt_budget,
            max_chars=watermarker.max_prompt_chars,
        )
        if start.error is not None:
            raise HTTPException(422, start.error)
        tokens = body.max_new_tokens or settings.max_new_tokens
        if not 1 <= tokens <= settings.max_new_tokens:
            raise HTTPException(
                422, f"max_new_tokens must be between 1 and {settings.max_new_tokens}"
            )
        try:
            return jobs.submit({"prompt": body.prompt, "max_new_tokens": tokens})
        except QueueFull as err:
            raise HTTPException(429, str(err)) from None

    @app.get("/api/jobs/{job_id}")
    def job(job_id: str) -> dict[str, Any]:
        """A generation's state: queued (with its place in line), running, done or error."""
        snap = jobs.snapshot(job_id)
        if snap is None:
            raise HTTPException(404, "no such generation (finished ones are kept for a while)")
        return snap

    @app.get("/api/jobs/{job_id}/events")
    async def job_events(job_id: str, request: Request) -> StreamingResponse:
        """Server-sent events: a snapshot each time the generation moves, until it ends."""
        if jobs.snapshot(job_id) is None:
            raise HTTPException(404, "no such generation")

        async def stream() -> AsyncIterator[str]:
            version = -1
            while True:
                snap = await anyio.to_thread.run_sync(jobs.wait, job_id, version, 10.0)
                if snap is None:
                    return
                if snap["version"] == version:
                    if jobs.closed:
                        return
                    yield ": still waiting\n\n"
                else:
                    version = snap["version"]
                    yield f"data: {json.dumps(snap)}\n\n"
                if snap["state"] in ("done", "error") or await request.is_disconnected():
                    return

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    return app
