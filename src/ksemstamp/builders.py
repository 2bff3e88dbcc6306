"""The builders: ``WatermarkSettings`` in, ready objects out: the scheme (encoder, partition,
key, mark), the ``Watermarker`` (with its generation engine) and the ``Detector``.

Each builder takes loaded models as well as names: ``lm=(model, tokenizer)`` (a quantised, PEFT
or GPU model as it is; ``model.lm_dtype`` then does not apply) or ``lm="gpt2"``,
``encoder=SentenceTransformer(...)`` or ``encoder="all-mpnet-base-v2"``. What is not given is
loaded from the settings. Models and files are loaded when a builder is called; importing this
module loads none.

    from ksemstamp import WatermarkSettings, build_watermarker, build_detector

    settings = WatermarkSettings(key=my_key)
    text = build_watermarker(settings, lm=(model, tokenizer)).generate([prompt])[0].text
    result = build_detector(settings).detect(text, prompt)
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import TYPE_CHECKING, Any

from .settings.watermark import WatermarkSettings

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from .detector import Detector
    from .scheme.core import WatermarkScheme
    from .watermarker import Watermarker


def as_settings(settings: Any) -> WatermarkSettings:
    """``settings`` itself, checked to be ``WatermarkSettings`` (a clear error for anything else)."""
    if not isinstance(settings, WatermarkSettings):
        raise TypeError(f"expected WatermarkSettings, got {type(settings).__name__}")
    return settings


def load_scheme_encoder(settings: WatermarkSettings, encoder: Any = None):
    """The sentence encoder on ``model.device``: ``encoder`` when it is a loaded model, else the
    checkpoint's, or the one ``encoder`` (or ``model.encoder``) names."""
    from .assets import load_encoder
    from .scheme.checkpoint import load_checkpoint_encoder

    settings = as_settings(settings)
    if encoder is not None and not isinstance(encoder, str):
        return encoder
    if settings.model.checkpoint and encoder is None:
        return load_checkpoint_encoder(settings.model.checkpoint, settings.model.device)
    return load_encoder(encoder or settings.model.encoder, settings.model.device)


def load_centroids(settings: WatermarkSettings):
    """The ``CentroidFile`` of the settings (their checkpoint's or their file), checked to hold
    what the mark needs (``MarkSettings.domain_needs``)."""
    from .scheme.centroids import CentroidFile
    from .scheme.checkpoint import REFIT, checkpoint_centroids

    settings = as_settings(settings)
    mark = settings.mark
    who, needs = f"the {mark.kind} mark", mark.domain_needs()
    checkpoint = settings.model.checkpoint
    if checkpoint:
        fitted = checkpoint_centroids(checkpoint)
        fitted.require(who, f"checkpoint {checkpoint}", refit=REFIT, **needs)
    else:
        path = settings.centroid_path()
        fitted = CentroidFile.load(path)
        fitted.require(who, f"centroid file {path}", **needs)
    return fitted


def checked_key(settings: WatermarkSettings) -> str | None:
    """The key of a keyed mark (``keys.resolve_key``), refused when weak (``keys.check_key``);
    ``None`` for the paper's public table, which takes none. Cheap: no model loads."""
    from .keys import check_key, resolve_key

    settings = as_settings(settings)
    if not settings.mark.keyed:
        return None
    key = resolve_key(settings.key)
    check_key(key, settings.allow_weak_key)
    return key


def build_scheme(settings: WatermarkSettings, encoder: Any = None) -> WatermarkScheme:
    """Encoder + partition + key + mark, checked for consistency (no LM needed). ``encoder``: a
    loaded sentence encoder or a name (default: the settings')."""
    settings = as_settings(settings)
    mark = settings.mark
    # The key first, then the centroids: a weak key is refused before torch loads, a centroid
    # file the mark cannot use before any model is loaded.
    key = checked_key(settings)
    from .scheme.core import WatermarkScheme
    from .scheme.partition import KMeansPartition, LSHPartition
    from .text.splitter import get_splitter

    kmeans = settings.partition.kind == "kmeans"
    fitted = load_centroids(settings) if kmeans else None
    given = encoder is not None and not isinstance(encoder, str)
    encoder = load_scheme_encoder(settings, encoder)
    margin = mark.partition_margin(settings.search)
    transition = center = components = None
    if fitted is not None:
        # Checked against the file's fingerprint; a file that carries an adapter adapts the
        # encoder (a copy of one the caller passed in).
        name = settings.model.checkpoint or settings.model.encoder
        encoder = fitted.adapted(encoder, name, copy=given)
        partition = KMeansPartition(fitted.centroids, margin)
        transition, center = fitted.transition, fitted.mean
        components = fitted.components
    else:
        lsh = settings.partition
        dimension = encoder.get_embedding_dimension()
        partition = LSHPartition(dimension, lsh.lsh_bits, margin, lsh.lsh_seed)
        # Soft contexts need centroids: an LSH partition scores on the context's region.
        mark = mark.without_centroids()
    encoder = cast_encoder(encoder, settings.model.encoder_dtype, copy=given)
    scheme = WatermarkScheme(
        encoder,
        partition.to(settings.model.device),
        key,
        get_splitter(*mark.splitting()),
        mark=mark,
        transition=transition,
        center=center,
        components=components,
    )
    from .marks import build_mark
    from .settings.identity import identity_of

    build_mark(scheme)  # settings the mark cannot take (gamma * K not whole) refused now
    if fitted is not None:
        encoder_id, centroids_id = fitted.encoder_fingerprint, fitted.content_fingerprint()
    else:
        encoder_id, centroids_id = settings.model.checkpoint or settings.model.encoder, None
    used = dataclasses.replace(settings, mark=mark)
    scheme.identity = identity_of(used, encoder_id, centroids_id)
    return scheme


ENCODER_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def cast_encoder(encoder: Any, dtype: str, copy: bool = False) -> Any:
    """``encoder`` in ``dtype`` (``ModelSettings.encoder_dtype``), after its fingerprint was
    checked; ``copy``: cast a copy (an encoder the caller passed in stays as it was)."""
    import torch

    target = getattr(torch, ENCODER_DTYPES[dtype])
    weights = next(encoder.parameters(), None) if isinstance(encoder, torch.nn.Module) else None
    if weights is None or weights.dtype == target:
        return encoder
    if copy:
        import copy as copying

        encoder = copying.deepcopy(encoder)
    return encoder.to(target)


def apply_threads(settings: WatermarkSettings) -> None:
    """Set torch's intra-op threads from ``model.threads`` (``None`` leaves them alone), and
    say once per process when the machine is busy with other work (``busy_note``)."""
    import torch

    threads = as_settings(settings).model.threads
    if threads is not None:
        torch.set_num_threads(threads)
    global _NOTED
    if not _NOTED:
        _NOTED = True
        note = busy_note(machine_load(), usable_cores(), torch.get_num_threads())
        if note:
            logger.info(note)


_NOTED = False


def machine_load() -> float:
    """The machine's one-minute load average (0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def busy_note(load: float, cores: int, threads: int) -> str | None:
    """One line for a run about to use ``threads`` threads on ``cores`` cores while other work
    keeps ``load`` of them busy (the load average, before this run's own work), or ``None``
    when they fit."""
    if threads <= 1 or load < 0.9 or load + threads <= cores + 0.5:
        return None
    return (
        f"this machine is busy (load average {load:.1f} on {cores} cores): this run's "
        f"{threads} threads share them and it runs slower; --model.threads 1 keeps it to one"
    )


def build_watermarker(
    settings: WatermarkSettings,
    scheme: WatermarkScheme | None = None,
    lm: Any = None,
    encoder: Any = None,
) -> Watermarker:
    """A ready ``Watermarker``. ``scheme``: reuse a built scheme; ``lm``: a loaded
    ``(model, tokenizer)``, used as it is, or a name (default: ``model.lm`` in
    ``model.lm_dtype``); ``encoder``: as ``build_scheme`` takes it."""
    settings = as_settings(settings)
    scheme = scheme or build_scheme(settings, encoder)  # the key checked first, before torch
    apply_threads(settings)
    from .generation.engine import engine_class
    from .watermarker import Watermarker

    engine = engine_class(settings.sampling.engine).from_settings(settings, scheme.splitter, lm)
    from .assets import cache_dir
    from .marks import build_mark

    # One mark for the whole loop; one that steers (search.steer) sets up its bias for this
    # generator's vocabulary now (token vectors embedded as they are first needed, cached per
    # vocabulary, encoder and processing).
    mark = build_mark(scheme, settings.search)
    pieces = getattr(engine, "pieces", None)  # the vocabulary, decoded once per run
    if (
        getattr(settings.search, "steer", 0) > 0
        and settings.sampling.steer_plausible > 0
        and not getattr(engine, "steers_per_step", True)
    ):
        logger.warning(
            "the %s engine takes one logit bias per request (vLLM steers at each step only in "
            "this process with one worker), so it cannot steer among the entries plausible at "
            "each step (sampling.steer_plausible): not steered (the mark selects alone); "
            "--sampling.steer_plausible 0 steers every entry through a sparse bias, at more "
            "perplexity",
            settings.sampling.engine,
        )
    else:
        mark.steer(engine.tokenizer, engine.vocab_size, cache_dir() / "steering", pieces)
    return Watermarker(
        scheme,
        engine,
        settings.search,
        settings.sampling,
        settings.limits,
        chat=settings.chat,
        mark=mark,
    )


def build_detector(
    settings: WatermarkSettings, scheme: WatermarkScheme | None = None, encoder: Any = None
) -> Detector:
    """A ``Detector`` for the scheme of the settings (``scheme``: reuse a built one;
    ``encoder``: as ``build_scheme`` takes it)."""
    settings = as_settings(settings)
    scheme = scheme or build_scheme(settings, encoder)  # the key checked first, before torch
    apply_threads(settings)
    from .detector import Detector

    return Detector(
        scheme,
        statistic=settings.detection.statistic,
        alpha=settings.detection.alpha,
        max_chars=settings.limits.max_text_chars,
        scan=settings.detection.scan,
    )
