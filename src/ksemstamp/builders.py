"""The builders that turn ``WatermarkConfig`` settings into objects: the scheme (encoder,
partition, key), the ``Watermarker`` (with its LM and sampler) and the ``Detector``.

Models and files are loaded here, when a builder is called; importing this module loads none.
"""

from __future__ import annotations

from .settings import WatermarkConfig

SAMPLING_SETTINGS = ("temperature", "repetition_penalty", "top_k", "top_p", "max_sentence_tokens")
"""Settings that pass to ``SamplingConfig`` under their own names."""
WATERMARKER_SETTINGS = (
    "max_candidates",
    "candidate_batch",
    "adaptive_batch",
    "max_new_tokens",
    "novelty_patience",
    "margin_patience",
    "threshold",
    "selection",
    "seed",
    "sentence_time_budget",
    "chat",
    "max_prompt_tokens",
)
"""Settings that pass to ``Watermarker`` under their own names."""


def _pick(cfg: WatermarkConfig, names: tuple[str, ...]) -> dict:
    """``cfg``'s values of the settings ``names``, by name."""
    return {name: getattr(cfg, name) for name in names}


def load_scheme_encoder(cfg: WatermarkConfig):
    """The sentence encoder of ``cfg`` on ``cfg.device``: the checkpoint's, or ``cfg.encoder``."""
    from .assets import load_encoder
    from .checkpoint import load_checkpoint_encoder

    if cfg.checkpoint:
        return load_checkpoint_encoder(cfg.checkpoint, cfg.device)
    return load_encoder(cfg.encoder, cfg.device)


def load_centroids(cfg: WatermarkConfig):
    """The ``CentroidFile`` of ``cfg`` (its checkpoint's or its file), checked to hold what
    ``cfg.mark`` needs (for the direction mark, ``cfg.whiten`` principal components)."""
    from .centroids import CentroidFile
    from .checkpoint import REFIT, checkpoint_centroids

    whiten = cfg.whiten if cfg.mark == "direction" else 0
    if cfg.checkpoint:
        fitted = checkpoint_centroids(cfg.checkpoint)
        fitted.require(cfg.mark, f"checkpoint {cfg.checkpoint}", refit=REFIT, whiten=whiten)
    else:
        path = cfg.centroid_path()
        fitted = CentroidFile.load(path)
        fitted.require(cfg.mark, f"centroid file {path}", whiten=whiten)
    return fitted


def build_scheme(cfg: WatermarkConfig, encoder=None):
    """Encoder + partition + keyed table, checked for consistency (no LM needed)."""
    from .keys import check_key, resolve_key
    from .partition import KMeansPartition, LSHPartition
    from .scheme import WatermarkScheme
    from .splitter import get_splitter

    # The key first, then the centroids: a weak key or a centroid file the mark cannot use is
    # refused before any model is loaded.
    key = resolve_key(cfg.key) if cfg.valid_mode == "keyed" else None
    if key is not None:
        check_key(key, cfg.allow_weak_key)
    fitted = load_centroids(cfg) if cfg.partition == "kmeans" else None
    given = encoder is not None
    encoder = encoder if given else load_scheme_encoder(cfg)
    transition = center = components = None
    direction = cfg.mark == "direction"
    if fitted is not None:
        # Checked against the file's fingerprint; a file that carries an adapter adapts the
        # encoder (a copy of one the caller passed in).
        encoder = fitted.adapted(encoder, cfg.checkpoint or cfg.encoder, copy=given)
        partition = KMeansPartition(fitted.centroids, cfg.margin)
        transition = fitted.transition
        center = fitted.mean
        if direction and cfg.whiten:
            components = fitted.components[: cfg.whiten]
    else:
        partition = LSHPartition(
            encoder.get_embedding_dimension(), cfg.lsh_bits, cfg.margin, cfg.lsh_seed
        )
    return WatermarkScheme(
        encoder,
        partition.to(cfg.device),
        cfg.gamma,
        key,
        get_splitter(),
        valid_mode=cfg.valid_mode,
        transition=transition,
        mark=cfg.mark,
        center=center,
        context_temperature=(
            cfg.context_temperature if direction and cfg.partition == "kmeans" else 0.0
        ),
        context=cfg.context if direction else "previous",
        components=components,
    )


def apply_threads(cfg: WatermarkConfig) -> None:
    """Set torch's intra-op threads from ``cfg.threads`` (``None`` leaves them alone)."""
    if cfg.threads is not None:
        import torch

        torch.set_num_threads(cfg.threads)


def build_watermarker(cfg: WatermarkConfig, scheme=None, lm=None):
    """A ready ``Watermarker``; pass ``lm=(model, tokenizer)`` to reuse a loaded LM (used as it
    is: ``lm_dtype`` applies only to an LM loaded here)."""
    from .assets import load_lm
    from .pruning import PruneRule
    from .sampler import CandidateSampler, SamplingConfig
    from .sequential import SequentialCandidateSampler
    from .watermarker import Watermarker

    apply_threads(cfg)
    scheme = scheme or build_scheme(cfg)
    model, tokenizer = lm or load_lm(cfg.lm, cfg.device, cfg.lm_dtype)
    sampling = SamplingConfig(**_pick(cfg, SAMPLING_SETTINGS))
    strategy = (
        SequentialCandidateSampler if cfg.sampler_strategy == "sequential" else CandidateSampler
    )
    sampler = strategy(model, tokenizer, scheme.splitter, sampling)
    prune = None
    if cfg.prune_tokens is not None:
        prune = PruneRule(cfg.prune_tokens, cfg.prune_keep, cfg.prune_margin)
    return Watermarker(
        scheme,
        sampler,
        **_pick(cfg, WATERMARKER_SETTINGS),
        prune=prune,
        max_prompt_chars=cfg.max_text_chars,
    )


def build_detector(cfg: WatermarkConfig, scheme=None):
    """A ``Detector`` for the scheme of ``cfg``."""
    from .detector import Detector

    apply_threads(cfg)
    return Detector(
        scheme or build_scheme(cfg),
        statistic=cfg.statistic,
        alpha=cfg.alpha,
        max_chars=cfg.max_text_chars,
        scan=cfg.scan,
    )
