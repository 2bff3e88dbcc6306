"""The FastAPI application: the page, and a JSON API for detection, batches and generation.

``create_app`` loads the models once; every request reuses them. The key stays in the
``WatermarkScheme`` (as its table) and in a log filter that blanks it out: responses, error
pages and log lines carry only its fingerprint.

One route per API endpoint with its request model and checks; what every request passes
through (host and origin checks, security headers, errors, key redaction) is in ``guard.py``,
the presentation of results in ``present.py``, the generation queue in ``jobs.py``. Routes
never hold a thread while they wait: detections and batches run on a small pool of their own,
and progress streams wait on the event loop, so the page's other requests are answered however
many detections and streams are open.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from functools import partial
from importlib import resources
from pathlib import PurePath
from typing import Any

from fastapi import FastAPI, File, HTTPException, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..config import WatermarkConfig, build_detector, build_scheme, build_watermarker
from ..detector import DetectionResult, Detector
from ..io import json_line, parse_jsonl
from ..keys import DEMO_KEY, key_fingerprint, num_valid, resolve_key
from ..prompts import plan_prompt
from .guard import (
    RedactKey,
    StrictJSONResponse,
    describe_validation,
    install_guards,
    install_redaction,
    problem,
)
from .jobs import FINISHED, GenerationQueue, JobFailed, QueueFull
from .present import (
    ERROR_FIELDS,
    Limits,
    check_record,
    decision,
    detection_view,
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


def create_app(
    settings: WatermarkConfig,
    *,
    limits: Limits | None = None,
    encoder: Any = None,
    lm: Any = None,
    generation: bool = True,
    host: str | None = None,
    jobs: GenerationQueue | None = None,
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
        host: the address the server is bound to: requests naming another host are refused
            (``guard``). ``None``: no check (a test client's host).
        jobs: a generation queue to use instead of one running the watermarker (tests).
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
            context=scheme.context,
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

    generates = watermarker is not None or jobs is not None
    jobs = jobs or GenerationQueue(run_generation, max_waiting=limits.max_waiting)
    # Detections and batches wait here, not in the server's thread pool, which stays free
    # for everything else; the encoder lock lets one pass run at a time anyway.
    work = ThreadPoolExecutor(max_workers=2, thread_name_prefix="ksemstamp-detect")
    streams = {"open": 0}

    async def in_pool(function: Callable, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(work, partial(function, *args))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        jobs.close()
        work.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(
        title="ksemstamp",
        description="Detect and generate k-SemStamp / SemStamp watermarks on this machine.",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lifespan,
        default_response_class=StrictJSONResponse,
    )
    app.state.jobs = jobs
    app.state.detector = detector
    app.state.limits = limits
    app.state.key_fingerprint = fingerprint
    app.state.redact = redact

    # ------------------------------------------------------------------ errors
    install_guards(app, limits, host)

    @app.exception_handler(RequestValidationError)
    async def on_validation(_: Request, err: RequestValidationError) -> JSONResponse:
        return problem(422, describe_validation(err))

    @app.exception_handler(StarletteHTTPException)
    async def on_http(_: Request, err: StarletteHTTPException) -> JSONResponse:
        return problem(err.status_code, str(err.detail))

    def check_size(name: str, value: str | None) -> None:
        if value is not None and len(value) > limits.max_chars:
            raise HTTPException(
                413,
                f"the {name} has {len(value):,} characters; the limit is {limits.max_chars:,}",
            )

    # ------------------------------------------------------------------ page
    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(str(STATIC / "index.html"), media_type="text/html")

    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")

    @app.get("/api/info")
    async def info() -> dict[str, Any]:
        """Settings in force (never the key), limits and what the server offers."""
        return {
            "key_fingerprint": fingerprint,
            "demo_key": demo_key,
            "valid_mode": scheme.valid_mode,
            "mark": scheme.mark,
            "context": scheme.context,
            "context_temperature": scheme.context_temperature,
            "whiten": 0 if scheme.components is None else len(scheme.components),
            "scan": detector.scan,
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
            "max_streams": limits.max_streams,
        }

    # ------------------------------------------------------------------ detect
    @app.post("/api/detect")
    async def detect(body: DetectRequest) -> dict[str, Any]:
        """Score one text; the answer says which sentences carry the mark and what p means."""
        check_size("text", body.text)
        check_size("prompt", body.prompt)
        if not body.text.strip():
            raise HTTPException(422, "the text is empty: paste the text to check")
        return await in_pool(detect_one, body.text, body.prompt)

    def detect_one(text: str, prompt: str | None) -> dict[str, Any]:
        start = time.perf_counter()
        # Under chat settings a prompt is an instruction: it seeds no sentence of the answer.
        result = detector.detect(text, None if settings.chat else prompt or None)
        return view(result, text, time.perf_counter() - start)

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
        return await in_pool(score_batch, name, lines)

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
            "jsonl": "".join(json_line(r) + "\n" for r in rows),
        }

    # ------------------------------------------------------------------ generate
    @app.post("/api/generate", status_code=202)
    async def generate(body: GenerateRequest) -> dict[str, Any]:
        """Queue a watermarked continuation of ``prompt``; follow it at ``/api/jobs/{id}``.
        ``max_new_tokens`` must be between 1 and the setting (``null``: the setting)."""
        if not generates:
            raise HTTPException(503, "this server was started without a language model")
        check_size("prompt", body.prompt)
        tokens = settings.max_new_tokens if body.max_new_tokens is None else body.max_new_tokens
        if not 1 <= tokens <= settings.max_new_tokens:
            raise HTTPException(
                422, f"max_new_tokens must be between 1 and {settings.max_new_tokens}"
            )
        if watermarker is not None:
            # The generator's own rules for a prompt, checked now rather than after the queue.
            start = await in_pool(
                partial(
                    plan_prompt,
                    body.prompt,
                    scheme.splitter,
                    watermarker.tokenizer,
                    chat=watermarker.chat,
                    budget=watermarker.prompt_budget,
                    max_chars=watermarker.max_prompt_chars,
                )
            )
            if start.error is not None:
                raise HTTPException(422, start.error)
        try:
            return jobs.submit({"prompt": body.prompt, "max_new_tokens": tokens})
        except QueueFull as err:
            raise HTTPException(429, str(err)) from None

    @app.get("/api/jobs/{job_id}")
    async def job(job_id: str) -> dict[str, Any]:
        """A generation's state: queued (with its place in line), running, done, error or
        cancelled."""
        snap = jobs.snapshot(job_id)
        if snap is None:
            raise HTTPException(404, "no such generation (finished ones are kept for a while)")
        return snap

    @app.delete("/api/jobs/{job_id}")
    async def cancel(job_id: str) -> dict[str, Any]:
        """Cancel a generation: a queued one at once, a running one at its next progress."""
        snap = jobs.cancel(job_id)
        if snap is None:
            raise HTTPException(404, "no such generation (finished ones are kept for a while)")
        return snap

    @app.get("/api/jobs/{job_id}/events")
    async def job_events(job_id: str, request: Request) -> StreamingResponse:
        """Server-sent events: a snapshot each time the generation moves, until it ends."""
        if jobs.snapshot(job_id) is None:
            raise HTTPException(404, "no such generation")
        if streams["open"] >= limits.max_streams:
            raise HTTPException(
                503, f"{limits.max_streams} progress streams are open; follow /api/jobs/{{id}}"
            )

        async def stream() -> AsyncIterator[str]:
            streams["open"] += 1
            try:
                version = -1
                while True:
                    snap = await jobs.wait_async(job_id, version, 10.0)
                    if snap is None:
                        return
                    if snap["version"] == version:
                        if jobs.closed:
                            return
                        yield ": still waiting\n\n"
                    else:
                        version = snap["version"]
                        yield f"data: {json_line(snap)}\n\n"
                    if snap["state"] in FINISHED or await request.is_disconnected():
                        return
            finally:
                streams["open"] -= 1

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    return app
