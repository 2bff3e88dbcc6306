"""What every request to the web app passes through, apart from its route.

* **Host check** (DNS rebinding): a page on another site can resolve its own name to 127.0.0.1
  and then talk to this server as if it were that site. A server bound to one address answers
  only requests whose ``Host`` names that address (or, for a loopback address, ``localhost``);
  one bound to every address (``0.0.0.0``, ``::``) was exposed on purpose and takes any name.
* **Origin check** (cross-site requests): a request that changes something (anything but
  ``GET`` and ``HEAD``: detections, uploads, generations, cancellations) that comes from a
  browser page of another origin is refused. Requests without an ``Origin`` header (``curl``,
  scripts) are not browsers' cross-site requests and are served.
* **Size limit** (``BodyLimit``): a body declared larger than the limits allow is refused
  before it is read, and one sent without a ``Content-Length`` (``Transfer-Encoding:
  chunked``) as soon as what has streamed in passes them: the server never holds more of a
  body than the limits, however it is sent.
* **Security headers** on every answer: no sniffing of content types, no framing, no referrer,
  and a content security policy that lets the page load only its own files.
* **Errors**: one JSON shape, ``{"error": message}``; an unexpected exception is logged and
  answered with a bare 500 (its message might hold anything). ``RedactKey`` blanks the key out
  of every log line.

Answers are strict JSON (``StrictJSONResponse``): whatever a request held (a lone surrogate, a
``NaN`` from an uploaded line) is written as ``io.json_line`` writes records.
"""

from __future__ import annotations

import ipaddress
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..io import json_line
from .present import Limits

log = logging.getLogger("ksemstamp.serve")

SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data: blob:; object-src 'none'; base-uri 'none'; "
        "frame-ancestors 'none'; form-action 'self'"
    ),
}
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


class StrictJSONResponse(JSONResponse):
    """JSON answers written as the command line writes records (``io.json_line``)."""

    def render(self, content: object) -> bytes:
        return json_line(content).encode("utf-8")


def problem(status: int, message: str) -> JSONResponse:
    """An error answer: ``{"error": message}``."""
    return StrictJSONResponse({"error": message}, status_code=status)


def describe_validation(err: RequestValidationError) -> str:
    """A request's validation errors, naming each field and problem (never the input)."""
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


def allowed_hosts(host: str | None) -> frozenset[str] | None:
    """The host names a request may give for a server bound to ``host``; ``None`` when any
    name goes (no ``host`` given, or an address that listens on every interface)."""
    if host is None:
        return None
    name = host.strip("[]").lower()
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        address = None
    if address is not None and address.is_unspecified:
        return None
    names = {name}
    if name == "localhost" or (address is not None and address.is_loopback):
        names |= {"localhost", "127.0.0.1", "::1"}
    return frozenset(names)


def host_name(header: str) -> str:
    """The name in a ``Host`` header, without its port: ``[::1]:8000`` gives ``::1``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


TOO_LARGE = "the request is larger than this server accepts"


class BodyLimit:
    """ASGI middleware: a request whose body passes ``limit`` bytes gets a 413, whether its
    ``Content-Length`` says so (before any of it is read) or it streams in without one (as
    soon as the bytes received pass the limit: no more of it is read or kept).

    The refusal is raised from the body's stream as the ``HTTPException`` that FastAPI's
    body parsing passes on (and the app's handler answers); a route that has begun its
    answer before reading the whole body is answered as it began."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length", b"").decode("latin-1").strip()
        if declared.isdigit() and int(declared) > self.limit:
            await problem(413, TOO_LARGE)(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise HTTPException(413, TOO_LARGE)
            return message

        await self.app(scope, limited, send)


def install_guards(app: FastAPI, limits: Limits, host: str | None) -> None:
    """Put the checks of the module docstring in front of every route of ``app``."""
    hosts = allowed_hosts(host)
    # Inside the guard below, so that a refused body's answer carries the security headers.
    app.add_middleware(BodyLimit, limit=limits.max_upload_bytes + 4 * limits.max_chars)

    @app.middleware("http")
    async def guard(request: Request, call_next):
        given = request.headers.get("host", "")
        if hosts is not None and host_name(given) not in hosts:
            return _secured(
                problem(
                    400,
                    f"this server answers requests for {host} only, not for {given!r} "
                    "(a page of another site may be trying to reach it through its own name)",
                )
            )
        origin = request.headers.get("origin")
        if request.method not in SAFE_METHODS and origin is not None:
            own = f"{request.url.scheme}://{given}".lower()
            if origin.lower() != own:
                return _secured(
                    problem(403, "requests that change something are taken from this page only")
                )
        # A bare 500 with no detail: an exception's message might hold anything.
        try:
            response = await call_next(request)
        except Exception:
            log.exception("request %s %s failed", request.method, request.url.path)
            response = problem(500, "internal error; the server log has the details")
        return _secured(response)


def _secured(response):
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


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
