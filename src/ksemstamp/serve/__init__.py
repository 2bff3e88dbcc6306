"""A local web page for the detector and the generator: ``ksemstamp serve``.
May import: ksemstamp core modules and generation, detection, scheme, settings, text; never cli.

``create_app`` builds the FastAPI app (models loaded once); ``serve`` runs it with uvicorn and
prints the address. The page and its script are package data under ``static/``: nothing is
fetched from elsewhere, so it works offline.
"""

from __future__ import annotations

import logging
import socket

from ..settings.watermark import WatermarkSettings
from .app import create_app
from .guard import install_redaction
from .present import Limits

__all__ = ["Limits", "create_app", "free_port", "serve"]

logger = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def serve(
    settings: WatermarkSettings,
    host: str = "127.0.0.1",
    port: int = 8000,
    limits: Limits | None = None,
    generation: bool = True,
    log_level: str = "info",
) -> None:
    """Load the models, log the address, and serve until interrupted (``port=0``: any free)."""
    import uvicorn

    logger.info("loading models ...")
    app = create_app(settings, limits=limits, generation=generation, host=host)
    port = port or free_port(host)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level)
    # uvicorn sets up its loggers in Config: blank the key in them too.
    install_redaction(app.state.redact)
    shown = f"[{host}]" if ":" in host else host
    logger.info(
        "ksemstamp: serving on http://%s:%d/ (key fingerprint %s); Ctrl+C stops",
        shown,
        port,
        app.state.key_fingerprint,
    )
    uvicorn.Server(config).run()
