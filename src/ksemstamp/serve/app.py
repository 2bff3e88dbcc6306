"""The FastAPI application: the page, and a JSON API for detection, batches and generation.

``create_app`` loads the models once; every request reuses them (``state.ServeState``, kept as
``app.state.serve``). The key stays in the ``WatermarkScheme`` (as its table) and in a log
filter that blanks it out: responses, error pages and log lines carry only its fingerprint.

The routes are in routers: ``routes_detect`` (one text, an uploaded file) and
``routes_generate`` (the generation queue and its progress); the page and ``/api/info`` are
here. What every request passes through (host and origin checks, security headers, errors, key
redaction) is in ``guard.py``, the presentation of results in ``present.py``, the generation
queue in ``jobs.py``. Routes never hold a thread while they wait: detections and batches run on
a small pool of their own, and progress streams wait on the event loop, so the page's other
requests are answered however many detections and streams are open.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..builders import as_settings, build_detector, build_scheme, build_watermarker
from ..keys import DEMO_KEY, key_fingerprint, resolve_key
from ..scheme.core import WatermarkScheme
from ..settings.watermark import WatermarkSettings
from .guard import (
    RedactKey,
    StrictJSONResponse,
    describe_validation,
    install_guards,
    install_redaction,
    problem,
)
from .jobs import GenerationQueue
from .lanes import EncoderGate, Lanes, fair_embed
from .present import Limits
from .routes_detect import DetectRequest
from .routes_detect import router as detect_routes
from .routes_generate import GenerateRequest
from .routes_generate import router as generate_routes
from .state import ServeState, serve_state

__all__ = ["DetectRequest", "GenerateRequest", "create_app"]

log = logging.getLogger("ksemstamp.serve")
STATIC = resources.files("ksemstamp.serve") / "static"
DETECT_WORKERS = 2
"""Threads of each lane that detections and batches wait in (the encoder runs one pass at a
time anyway; the second keeps a batch's bookkeeping from waiting behind it)."""


def create_app(
    settings: WatermarkSettings,
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
        settings: the watermark settings (key, model, partition, mark, detection, ...), as
            for every other command.
        limits: input limits (text size, upload size, queue length); the text size defaults
            to ``settings.limits.max_text_chars``, and a given one replaces it, so the page
            and the detector refuse the same texts.
        encoder: an already loaded sentence encoder to reuse (tests share one).
        lm: an already loaded ``(model, tokenizer)`` to reuse.
        generation: load the LM and offer the Generate tab.
        host: the address the server is bound to: requests naming another host are refused
            (``guard``). ``None``: no check (a test client's host).
        jobs: a generation queue to use instead of one running the watermarker (tests).
    """
    settings = as_settings(settings)
    if limits is None:
        limits = Limits(max_chars=settings.limits.max_text_chars)
    settings = settings.updated({"limits": {"max_text_chars": limits.max_chars}})
    secret = resolve_key(settings.key) if settings.mark.keyed else None
    if secret is not None:  # resolved once: the demo-key warning is given once
        settings = dataclasses.replace(settings, key=secret)
    redact = RedactKey(secret)
    install_redaction(redact)
    state = _load_state(settings, limits, secret, encoder, lm, generation, jobs)
    # From here on the key lives only in `settings` (whose repr and to_dict leave it out), the
    # scheme's table and the log filter; nothing below puts it in a response.
    del secret
    app = _application(state, redact)
    _add_routes(app, limits, host)
    return app


def _load_state(
    settings: WatermarkSettings,
    limits: Limits,
    secret: str | None,
    encoder: Any,
    lm: Any,
    generation: bool,
    jobs: GenerationQueue | None,
) -> ServeState:
    """The models, loaded once for every request (``create_app``'s arguments), and what the
    page shows of the key: its fingerprint and whether it is the demo key (``secret``)."""
    scheme = _one_encoder_pass_at_a_time(build_scheme(settings, encoder=encoder))
    fingerprint = scheme.key_fingerprint
    return ServeState(
        settings=settings,
        scheme=scheme,
        detector=build_detector(settings, scheme),
        watermarker=build_watermarker(settings, scheme, lm=lm) if generation else None,
        limits=limits,
        fingerprint=fingerprint,
        demo_key=secret is not None and fingerprint == key_fingerprint(DEMO_KEY),
        generation=generation,
        # Detections and batches wait here, not in the server's thread pool, which stays free
        # for everything else: small ones apart from large ones (``lanes``).
        lanes=Lanes(DETECT_WORKERS),
        jobs=jobs,
    )


def _application(state: ServeState, redact: RedactKey) -> FastAPI:
    """The FastAPI app over ``state`` (kept as ``app.state.serve``), which closes the generation
    queue and the detection pool when the server stops; no routes yet."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        state.jobs.close()
        state.lanes.shutdown()

    app = FastAPI(
        title="ksemstamp",
        description="Detect and generate k-SemStamp / SemStamp watermarks on this machine.",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lifespan,
        default_response_class=StrictJSONResponse,
    )
    app.state.serve = state
    app.state.jobs = state.jobs
    app.state.detector = state.detector
    app.state.limits = state.limits
    app.state.key_fingerprint = state.fingerprint
    app.state.redact = redact
    return app


def _one_encoder_pass_at_a_time(scheme: WatermarkScheme) -> WatermarkScheme:
    """``scheme`` with one encoder pass at a time (the encoder's tokenizer is not safe to call
    from two threads at once: the generation worker and detection requests), small passes
    before the pieces of large ones (``lanes``)."""
    scheme.embed = fair_embed(scheme.embed, EncoderGate())  # type: ignore[method-assign]
    return scheme


def _add_routes(app: FastAPI, limits: Limits, host: str | None) -> None:
    """The guards, error handlers, page, static files and API routes of the app."""
    install_guards(app, limits, host)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_api_route("/", index, methods=["GET", "HEAD"], include_in_schema=False)
    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")
    app.add_api_route("/api/info", info, methods=["GET"])
    app.include_router(detect_routes)
    app.include_router(generate_routes)


async def on_validation(request: Request, err: RequestValidationError) -> JSONResponse:
    kind = request.headers.get("content-type", "")
    if request.method == "POST" and request.url.path == "/api/detect" and "json" not in kind:
        # FastAPI reads a body without a JSON content type as text and says only that it is
        # not a dictionary: say what the request lacks.
        said = f"'{kind}'" if kind else "none"
        return problem(
            415,
            f"send the text as JSON with the header Content-Type: application/json (this "
            f'request\'s content type: {said}); the body is {{"text": "...", "prompt": "..."}}',
        )
    return problem(422, describe_validation(err))


async def on_http(_: Request, err: StarletteHTTPException) -> JSONResponse:
    return problem(err.status_code, str(err.detail))


async def index() -> FileResponse:
    return FileResponse(str(STATIC / "index.html"), media_type="text/html")


async def info(state: ServeState = Depends(serve_state)) -> dict[str, Any]:  # noqa: B008
    """Settings in force (never the key), limits and what the server offers."""
    scheme, detector, settings, limits = state.scheme, state.detector, state.settings, state.limits
    described = detector.mark.describe(detector.scan)
    return {
        "key_fingerprint": state.fingerprint,
        "demo_key": state.demo_key,
        "mark": described["kind"],
        "mark_summary": described["short"],
        "mark_settings": described["settings"],
        "prompt_seeds": not detector.mark.scores_first,
        "scan": detector.scan,
        "statistic": detector.statistic,
        "alpha": detector.alpha,
        "num_regions": scheme.num_regions,
        "partition": settings.partition.kind,
        "encoder": settings.model.checkpoint or settings.model.encoder,
        "lm": settings.model.lm if state.generation else None,
        "generation": state.generation,
        "max_new_tokens": settings.sampling.max_new_tokens,
        "max_chars": limits.max_chars,
        "max_upload_bytes": limits.max_upload_bytes,
        "max_streams": limits.max_streams,
    }
