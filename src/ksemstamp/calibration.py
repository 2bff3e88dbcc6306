"""Calibration of the detector on human text, with detection power beside it.

Human-written text does not depend on the secret key, so the share of human texts a detector
flags at level ``alpha`` is its false-positive rate. One key gives one valid table and therefore
one draw of that rate; this module measures it over many keyed tables at once:

1. Human texts that the centroids never saw are cut into generation-sized pieces (consecutive
   sentences up to about 200 tokens): held-out news (``val`` and ``test`` splits; centroids are
   fitted on ``fit``), House of Commons speeches and health-news tweets, each labelled.
2. Every distinct sentence is embedded once; the detector then gives each text's regions and
   which transitions it scores (seed, repeats), exactly as ``Detector.detect_batch`` does.
3. Those transitions do not depend on the key. For each of ``num_keys`` keyed tables only the
   valid count changes, so both p-values of every text under every table come from one table
   look-up: the paper's normal tail of the z-score, and the exact key-randomisation p-value,
   whose null law (computed once per text) does not depend on the table at all.
4. Detection power is reported beside it, from real generations (``watermarked=(FILE.jsonl, ...)``
   written by ``watermark.py generate``) and, for k-means partitions, from *simulated* region
   sequences that move by the domain transition matrix restricted to each valid set (an ideal
   rejection sampler: no fallbacks, no margin).

Outputs (``write_outputs``): ``calibration.json`` (all numbers), ``report.md`` and ``pvalues.png``.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from .assets import cache_dir, encoder_fingerprint
from .corpora import (  # noqa: F401  (HumanText, make_windows, allocate: re-exported)
    SOURCE_LABELS,
    SOURCES,
    HumanText,
    allocate,
    human_texts,
    make_windows,
)
from .detector import Detector
from .encoding import embed
from .io import atomic_target, read_jsonl, write_json_atomic, write_text_atomic
from .keys import valid_table
from .scheme import WatermarkScheme
from .stats import normal_sf, null_count_pmf, paper_z

ALPHAS = (0.001, 0.01, 0.05)
STATS = ("paper", "exact")
# The randomised exact p-value breaks ties uniformly; under the null it is exactly uniform, so
# its distance from uniform checks the null law itself. The detector reports the plain one.
DIAGNOSTIC = "exact_randomised"
# ---------------------------------------------------------------------- embeddings


class CachedEncoder:
    """Wraps a sentence encoder so that each distinct sentence is embedded only once.

    ``prefill`` embeds new sentences in chunks (with a progress bar); ``encode`` answers from
    the cache, embedding whatever is missing. Embeddings are unit vectors, as ``embed`` returns.

    With ``store`` (a ``.pt`` file, one per encoder: name it by the encoder's fingerprint) the
    cache starts from the file's embeddings and ``prefill`` writes it back when it embedded
    something new, so a second calibration of the same texts embeds nothing.
    """

    def __init__(self, encoder, batch_size: int = 64, store: str | Path | None = None) -> None:
        self.encoder = encoder
        self.batch_size = batch_size
        self.cache: dict[str, torch.Tensor] = {}
        self.store = Path(store) if store is not None else None
        if self.store is not None and self.store.is_file():
            saved = torch.load(self.store, weights_only=True)
            self.cache.update(zip(saved["sentences"], saved["embeddings"], strict=True))

    def get_embedding_dimension(self) -> int:
        return self.encoder.get_embedding_dimension()

    def prefill(self, sentences: Sequence[str], progress: bool = False, chunk: int = 512) -> None:
        """Embed every sentence not yet in the cache."""
        todo = sorted({s for s in sentences if s not in self.cache})
        bar = tqdm(total=len(todo), unit="sent", desc="embed", disable=not progress)
        for start in range(0, len(todo), chunk):
            part = todo[start : start + chunk]
            vectors = embed(self.encoder, part, batch_size=self.batch_size)
            self.cache.update(zip(part, vectors, strict=True))
            bar.update(len(part))
        bar.close()
        if todo and self.store is not None:
            saved = {
                "sentences": list(self.cache),
                "embeddings": torch.stack(list(self.cache.values())),
            }
            with atomic_target(self.store) as tmp:  # an interrupted save leaves the old file
                torch.save(saved, tmp)

    def encode(self, sentences, batch_size=None, convert_to_tensor=True, show_progress_bar=False):
        self.prefill(sentences)
        return torch.stack([self.cache[s] for s in sentences])


def with_cached_encoder(
    scheme: WatermarkScheme, store: str | Path | None = None
) -> WatermarkScheme:
    """A shallow copy of ``scheme`` whose encoder embeds each distinct sentence once (and keeps
    the embeddings in ``store``, see ``CachedEncoder``)."""
    if isinstance(scheme.encoder, CachedEncoder):
        return scheme
    cached = copy.copy(scheme)
    cached.encoder = CachedEncoder(scheme.encoder, scheme.encode_batch_size, store)
    return cached


def embedding_store(encoder) -> Path | None:
    """Where calibration keeps ``encoder``'s sentence embeddings: one file per weights
    fingerprint and maximum sequence length (``None`` for an encoder that is not a module)."""
    if not isinstance(encoder, torch.nn.Module):
        return None
    length = getattr(encoder, "max_seq_length", None)
    return cache_dir() / "embeddings" / f"{encoder_fingerprint(encoder)}-len{length}.pt"


# ---------------------------------------------------------------------- key-free scoring


@dataclass
class ScoredTexts:
    """What the detector scores in each text, independent of the key.

    Attributes:
        labels: source label of each text.
        counts: ``(N, K, K)`` counts of scored transitions ``(previous region, region)``.
        num_scored: ``(N,)`` scored sentences ``T``.
        survival: ``(N, Tmax + 2)``; ``survival[i, s]`` is ``P(S >= s)`` for text ``i`` over
            uniformly random valid tables (zero past ``T``), i.e. its exact p-value at count ``s``.
        pmf: ``(N, Tmax + 1)``; ``pmf[i, s] = P(S = s)`` under the same law.
        too_short: how many texts had nothing to score (left out of ``counts``).
    """

    labels: list[str]
    counts: np.ndarray
    num_scored: np.ndarray
    survival: np.ndarray
    pmf: np.ndarray
    too_short: dict[str, int]

    def __len__(self) -> int:
        return len(self.labels)

    def select(self, label: str) -> np.ndarray:
        """Indices of the texts with ``label``."""
        return np.array([i for i, x in enumerate(self.labels) if x == label], dtype=np.int64)


def score_texts(
    scheme: WatermarkScheme,
    texts: Sequence[str],
    labels: Sequence[str],
    prompts: Sequence[str | None] | None = None,
    progress: bool = False,
    batch: int = 256,
) -> ScoredTexts:
    """Run the detector's scoring rules once and keep each text's key-free transition counts.

    Regions, seeding by the prompt and the repeat rule are the detector's own scoring plans
    (``Detector.plan_batch``), which do not depend on the key.
    """
    scheme = with_cached_encoder(scheme)
    prompts = list(prompts) if prompts is not None else [None] * len(texts)
    splitter = scheme.splitter
    sentences = [s for t in texts for s in splitter.split(t)]
    sentences += [s for p in prompts if p for s in splitter.split(p)[-1:]]
    scheme.encoder.prefill(sentences, progress=progress)

    detector = Detector(scheme, statistic="exact")
    k = scheme.num_regions
    size = int(scheme.table[0].sum())
    kept_labels, counts, num_scored, laws = [], [], [], []
    too_short: dict[str, int] = {}
    bar = tqdm(total=len(texts), unit="text", desc="score", disable=not progress)
    for start in range(0, len(texts), batch):
        chunk = slice(start, start + batch)
        plans = detector.plan_batch(list(texts[chunk]), prompts[chunk])
        for label, plan in zip(labels[chunk], plans, strict=True):
            bar.update()
            if plan.error is not None or plan.num_scored == 0:
                too_short[label] = too_short.get(label, 0) + 1
                continue
            matrix = plan.transition_counts(k)
            kept_labels.append(label)
            counts.append(matrix)
            num_scored.append(plan.num_scored)
            laws.append(null_count_pmf(matrix, size))
    bar.close()
    pmf, survival = _tail_arrays(laws)
    return ScoredTexts(
        labels=kept_labels,
        counts=np.stack(counts) if counts else np.zeros((0, k, k), dtype=np.int64),
        num_scored=np.array(num_scored, dtype=np.int64),
        survival=survival,
        pmf=pmf,
        too_short=too_short,
    )


def _tail_arrays(laws: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Pad per-text laws into ``pmf`` ``(N, Tmax + 1)`` and ``survival`` ``(N, Tmax + 2)``."""
    width = max((len(law) for law in laws), default=1)
    pmf = np.zeros((len(laws), width))
    for i, law in enumerate(laws):
        pmf[i, : len(law)] = law
    # survival[:, s] = sum_{j >= s} pmf[:, j]; one extra zero column for counts past T.
    tail = np.cumsum(pmf[:, ::-1], axis=1)[:, ::-1]
    survival = np.concatenate([tail, np.zeros((len(laws), 1))], axis=1)
    return pmf, np.minimum(survival, 1.0)


def p_values(
    scored: ScoredTexts, table: np.ndarray, gamma: float, rng: np.random.Generator | None = None
) -> dict[str, np.ndarray]:
    """Every text's p-values under one valid ``table``: ``paper``, ``exact`` and, with ``rng``,
    the tie-randomised exact p-value (a diagnostic that is exactly uniform under the null)."""
    observed = np.einsum("nij,ij->n", scored.counts, np.asarray(table, dtype=np.int64))
    rows = np.arange(len(scored))
    out = {
        "paper": np.array(
            [
                normal_sf(paper_z(int(v), int(t), gamma))
                for v, t in zip(observed, scored.num_scored, strict=True)
            ]
        ),
        "exact": scored.survival[rows, observed],
    }
    if rng is not None:
        u = rng.random(len(scored))
        out[DIAGNOSTIC] = scored.survival[rows, observed + 1] + u * scored.pmf[rows, observed]
    return out


def calibration_tables(num_regions: int, gamma: float, num_keys: int, seed: int) -> list:
    """``num_keys`` keyed valid tables built exactly as real keys build them (HMAC ranking)."""
    return [
        valid_table(num_regions, gamma, f"calibration|{seed}|{i}").numpy() for i in range(num_keys)
    ]


# ---------------------------------------------------------------------- summaries


def ks_distance(p: np.ndarray) -> tuple[float, float]:
    """Distance of p-values from uniform: ``(sup |F(u) - u|, sup (F(u) - u))``.

    The second, one-sided number is what matters for false positives: how far the share of
    p-values at or below some ``u`` exceeds ``u``. A conservative test has it near zero even
    when its two-sided distance is large.
    """
    p = np.sort(np.asarray(p, dtype=np.float64))
    n = len(p)
    if n == 0:
        return float("nan"), float("nan")
    # ECDF just after each ties block minus u, and u minus the ECDF just before each block.
    values, first = np.unique(p, return_index=True)
    after = np.append(first[1:], n) / n
    before = first / n
    above = float(np.max(after - values))
    below = float(np.max(values - before))
    return max(above, below, 0.0), max(above, 0.0)


def spread(values: Sequence[float]) -> dict[str, float]:
    """Mean, standard deviation, min, 5th/95th percentiles and max over keys."""
    v = np.asarray(values, dtype=np.float64)
    return {
        "mean": float(v.mean()),
        "sd": float(v.std(ddof=1)) if len(v) > 1 else 0.0,
        "min": float(v.min()),
        "q05": float(np.percentile(v, 5)),
        "q95": float(np.percentile(v, 95)),
        "max": float(v.max()),
    }


def tpr_at_fpr(alt_p: np.ndarray, null_p: np.ndarray, fpr: float) -> float:
    """Share of ``alt_p`` flagged by the best threshold that flags at most ``fpr`` of ``null_p``.

    Texts are flagged when their p-value is below the smallest null p-value whose inclusion
    would push the null's flagged share above ``fpr``; ties with it stay unflagged.
    """
    null_p = np.sort(np.asarray(null_p, dtype=np.float64))
    if len(null_p) == 0:
        return float("nan")
    values = np.unique(null_p)
    rates = np.searchsorted(null_p, values, side="right") / len(null_p)
    over = values[rates > fpr]
    cut = float(over.min()) if len(over) else float("inf")
    return float(np.mean(np.asarray(alt_p) < cut))


def summarise_null(
    per_key: list[dict[str, np.ndarray]], index: np.ndarray, alphas: Sequence[float]
) -> dict[str, Any]:
    """False-positive rates and distance from uniform over keys for the texts in ``index``."""
    out: dict[str, Any] = {"texts": int(len(index))}
    for stat in (*STATS, DIAGNOSTIC):
        fpr = {}
        for alpha in alphas:
            rates = [float(np.mean(p[stat][index] <= alpha)) for p in per_key]
            fpr[str(alpha)] = {
                **spread(rates),
                "keys_above_alpha": float(np.mean([r > alpha for r in rates])),
            }
        dists = [ks_distance(p[stat][index]) for p in per_key]
        pooled = ks_distance(np.concatenate([p[stat][index] for p in per_key]))
        out[stat] = {
            "fpr": fpr,
            "ks": spread([d[0] for d in dists]),
            "ks_excess": spread([d[1] for d in dists]),
            "ks_pooled": pooled[0],
            "ks_excess_pooled": pooled[1],
        }
    return out


def simulate_watermarked(
    transition: np.ndarray,
    table: np.ndarray,
    lengths: Sequence[int],
    rng: np.random.Generator,
) -> np.ndarray:
    """``(N, K, K)`` scored-transition counts of simulated watermarked texts.

    The first region is drawn from the domain's region frequencies; each next region from the
    domain's transitions out of the previous region, restricted to its valid set (uniform over
    the valid set if the domain never made such a move). One text per entry of ``lengths``,
    each with that many scored sentences.
    """
    transition = np.asarray(transition, dtype=np.float64)
    k = transition.shape[0]
    start = transition.sum(axis=1) + 1e-12
    start /= start.sum()
    moves = []
    for q in range(k):
        w = transition[q] * table[q]
        if w.sum() <= 0:
            w = table[q].astype(np.float64)
        moves.append(w / w.sum())
    out = np.zeros((len(lengths), k, k), dtype=np.int64)
    for i, length in enumerate(lengths):
        q = rng.choice(k, p=start)
        for _ in range(int(length)):
            nxt = rng.choice(k, p=moves[q])
            out[i, q, nxt] += 1
            q = nxt
    return out


def scored_from_counts(counts: np.ndarray, size: int, label: str) -> ScoredTexts:
    """``ScoredTexts`` for given ``(N, K, K)`` transition counts (no text behind them)."""
    pmf, survival = _tail_arrays([null_count_pmf(c, size) for c in counts])
    return ScoredTexts(
        labels=[label] * len(counts),
        counts=counts,
        num_scored=counts.sum(axis=(1, 2)),
        survival=survival,
        pmf=pmf,
        too_short={},
    )


def power_summary(
    alt: list[dict[str, np.ndarray]],
    null: list[dict[str, np.ndarray]],
    alphas: Sequence[float],
    empirical_fprs: Sequence[float] = (0.01, 0.001),
) -> dict[str, Any]:
    """True-positive rates over keys: at the nominal ``alphas``, and at thresholds set so that
    the human texts scored under the same key are flagged at most at ``empirical_fprs``."""
    out: dict[str, Any] = {}
    for stat in STATS:
        nominal = {str(a): spread([float(np.mean(p[stat] <= a)) for p in alt]) for a in alphas}
        empirical = {}
        for fpr in empirical_fprs:
            rates = [tpr_at_fpr(a[stat], h[stat], fpr) for a, h in zip(alt, null, strict=True)]
            empirical[str(fpr)] = spread(rates)
        out[stat] = {"tpr_at_alpha": nominal, "tpr_at_empirical_fpr": empirical}
    return out


# ---------------------------------------------------------------------- the run


@dataclass
class CalibrationSettings:
    """What to measure. ``max_texts`` human texts, ``num_keys`` keyed tables."""

    sources: tuple[str, ...] = SOURCES
    max_texts: int = 3000
    num_keys: int = 50
    window_words: int = 150
    simulated_per_key: int = 200
    seed: int = 0
    alphas: tuple[float, ...] = ALPHAS
    watermarked: tuple[str, ...] = ()
    """JSONL files written by ``generate`` under the configured key (real power)."""
    reuse_embeddings: bool = True
    """Keep sentence embeddings on disk (``embedding_store``) and reuse them in later runs."""

    def __post_init__(self) -> None:
        problems = []
        if self.max_texts < 1:
            problems.append(f"max_texts must be >= 1, got {self.max_texts}")
        if self.num_keys < 2:
            problems.append(f"num_keys must be >= 2 (spread over keys), got {self.num_keys}")
        if self.window_words < 1:
            problems.append(f"window_words must be >= 1, got {self.window_words}")
        if self.simulated_per_key < 0:
            problems.append(f"simulated_per_key must be >= 0, got {self.simulated_per_key}")
        if not self.sources:
            problems.append("sources must name at least one source")
        if problems:
            raise ValueError("invalid calibration settings:\n  " + "\n  ".join(problems))


def _read_watermarked(path: str, fingerprint: str) -> tuple[list[str], list[str | None], dict]:
    """Texts and prompts of usable records, and counts of what was skipped and what it cost."""
    texts, prompts = [], []
    skipped = {"not_ok": 0, "other_key": 0}
    cost = {"sentences": 0, "candidates": 0, "fallbacks": 0}
    for rec in read_jsonl(path):
        data = rec.data or {}
        if rec.error or data.get("status", "ok") != "ok" or not isinstance(data.get("text"), str):
            skipped["not_ok"] += 1
        elif data.get("key_fingerprint") not in (None, fingerprint):
            skipped["other_key"] += 1
        else:
            texts.append(data["text"])
            prompt = data.get("prompt")
            prompts.append(prompt if isinstance(prompt, str) else None)
            for name, field in (("sentences", "num_sentences"), ("candidates", "candidates")):
                cost[name] += int(data.get(field) or 0)
            cost["fallbacks"] += int(data.get("fallbacks") or 0)
    return texts, prompts, {"skipped": skipped, "cost": cost}


def run_calibration(
    scheme: WatermarkScheme,
    settings: CalibrationSettings,
    describe: dict[str, Any] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Measure false-positive rates on human text over many keys, and power beside them.

    Args:
        scheme: encoder, partition and (for real generations) the key they were made with.
        settings: what to measure.
        describe: extra fields recorded as they are (command line, watermark settings).
        progress: show progress bars.

    Returns:
        A JSON-ready dict of numbers (see ``write_outputs`` for the files made from it).
    """
    started = time.perf_counter()
    gamma, k = scheme.gamma, scheme.num_regions
    size = int(scheme.table[0].sum())
    texts, available = human_texts(
        scheme.splitter, settings.sources, settings.max_texts, settings.window_words, settings.seed
    )
    store = embedding_store(scheme.encoder) if settings.reuse_embeddings else None
    scheme = with_cached_encoder(scheme, store)
    human = score_texts(
        scheme, [t.text for t in texts], [t.source for t in texts], progress=progress
    )
    if len(human) == 0:
        raise ValueError("no human text could be scored; check the sources")

    tables = calibration_tables(k, gamma, settings.num_keys, settings.seed)
    rng = np.random.default_rng(settings.seed)
    per_key = [
        p_values(human, table, gamma, rng)
        for table in tqdm(tables, desc="keys", unit="key", disable=not progress)
    ]
    sources = [s for s in settings.sources if len(human.select(s))]
    null = {s: summarise_null(per_key, human.select(s), settings.alphas) for s in sources}
    null["overall"] = summarise_null(per_key, np.arange(len(human)), settings.alphas)

    pooled = {s: np.concatenate([p[s] for p in per_key]) for s in (*STATS, DIAGNOSTIC)}
    edges = np.linspace(0.0, 1.0, 21)
    histogram = {
        "edges": edges.tolist(),
        **{s: np.histogram(v, bins=edges, density=True)[0].tolist() for s, v in pooled.items()},
    }
    curve_alphas = np.logspace(-4, 0, 41)
    curve = {
        "alphas": curve_alphas.tolist(),
        **{s: [float(np.mean(pooled[s] <= a)) for a in curve_alphas] for s in STATS},
    }

    news_index = human.select("news")
    length_pool = human.num_scored[news_index if len(news_index) else slice(None)]
    power: dict[str, Any] = {}
    if scheme.transition is not None and settings.simulated_per_key > 0:
        sims = []
        for table in tqdm(tables, desc="simulate", unit="key", disable=not progress):
            lengths = rng.choice(length_pool, size=settings.simulated_per_key)
            counts = simulate_watermarked(scheme.transition.numpy(), table, lengths, rng)
            sims.append(p_values(scored_from_counts(counts, size, "simulated"), table, gamma))
        sim_null = [{s: p[s][news_index] for s in STATS} if len(news_index) else p for p in per_key]
        power["simulated"] = {
            "what": (
                "simulated region sequences, not generated text: the first region from the "
                "domain's region frequencies, each next one from the domain transition matrix "
                "(centroid file) restricted to the valid set; no fallbacks, no margin"
            ),
            "texts_per_key": settings.simulated_per_key,
            "lengths": "scored counts drawn from the human news pieces",
            "empirical_fpr_reference": f"{len(sim_null[0]['exact'])} human pieces "
            f"({'news' if len(news_index) else 'all sources'}) under the same key",
            **power_summary(sims, sim_null, settings.alphas),
        }
    configured = {"key_fingerprint": scheme.key_fingerprint}
    own = p_values(human, scheme.table.numpy(), gamma)
    configured["human_fpr"] = {
        stat: {str(a): float(np.mean(own[stat] <= a)) for a in settings.alphas} for stat in STATS
    }
    own_news = {s: own[s][news_index] for s in STATS} if len(news_index) else own
    for path in settings.watermarked:
        wm_texts, wm_prompts, info = _read_watermarked(path, scheme.key_fingerprint)
        skipped, cost = info["skipped"], info["cost"]
        if not wm_texts:
            raise ValueError(
                f"{path}: no usable watermarked record (skipped {skipped}); records must "
                "have status ok and the key fingerprint of the configured key"
            )
        real = score_texts(
            scheme, wm_texts, ["watermarked"] * len(wm_texts), wm_prompts, progress=progress
        )
        real_p = p_values(real, scheme.table.numpy(), gamma)
        distinct = (real.counts > 0).sum(axis=(1, 2))
        diagonal = np.trace(real.counts, axis1=1, axis2=2)
        power[f"generated: {Path(path).name}"] = {
            "what": f"real generations read from {Path(path).name}, detected with the "
            "configured key (one key: no spread)",
            "file": str(path),
            "texts": len(real),
            "too_short": real.too_short.get("watermarked", 0),
            "skipped": skipped,
            "candidates_per_sentence": cost["candidates"] / max(1, cost["sentences"]),
            "fallbacks": cost["fallbacks"],
            "num_scored_mean": float(real.num_scored.mean()),
            # A text that only repeats one transition carries little evidence for the exact test.
            "distinct_transitions_mean": float(distinct.mean()),
            "one_region_share": float(np.mean((distinct == 1) & (diagonal == real.num_scored))),
            "empirical_fpr_reference": f"{len(own_news['exact'])} human pieces "
            f"({'news' if len(news_index) else 'all sources'}) under the configured key",
            **power_summary([real_p], [own_news], settings.alphas),
        }

    stay = [
        float(np.trace(human.counts[idx].sum(axis=0)) / max(1, human.counts[idx].sum()))
        for idx in (human.select(s) for s in sources)
    ]
    return {
        **(describe or {}),
        "calibration": {
            "num_keys": settings.num_keys,
            "keys": f"keyed tables of the keys 'calibration|{settings.seed}|i', i < num_keys",
            "alphas": list(settings.alphas),
            "window_words": settings.window_words,
            "seed": settings.seed,
            "num_regions": k,
            "gamma": gamma,
        },
        "sources": {
            s: {
                "description": SOURCE_LABELS[s],
                "available_pieces": available[s],
                "texts": int(len(human.select(s))),
                "too_short": human.too_short.get(s, 0),
                "scored_mean": float(human.num_scored[human.select(s)].mean()),
                "same_region_share": stay[i],
            }
            for i, s in enumerate(sources)
        },
        "texts_total": len(human),
        "null": null,
        "histogram": histogram,
        "fpr_curve": curve,
        "configured_key": configured,
        "power": power,
        "seconds": round(time.perf_counter() - started, 1),
    }


# ---------------------------------------------------------------------- outputs


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%" if x < 0.1 else f"{100 * x:.1f}%"


def render_report(result: dict[str, Any]) -> str:
    """The markdown report of a calibration result."""
    cal = result["calibration"]
    null = result["null"]
    alphas = cal["alphas"]
    lines = [
        "# Detector calibration on human text",
        "",
        "Human-written text does not depend on the watermark key, so the share of human texts",
        "the detector flags at level alpha is its false-positive rate (FPR). One key is one",
        f"draw of that rate, so every number below is over {cal['num_keys']} keyed valid tables",
        "(mean, with the spread over keys). Made by:",
        "",
        "```bash",
        result.get("command", "(command not recorded)"),
        "```",
        "",
        f"Partition: K = {cal['num_regions']} regions, gamma = {cal['gamma']}; "
        + ", ".join(f"{k} `{v}`" for k, v in result.get("settings", {}).items())
        + ".",
        f"Run time {result['seconds']:.0f} s.",
        "",
        "## Headline",
        "",
    ]
    overall = null["overall"]
    for stat in STATS:
        for a in alphas:
            f = overall[stat]["fpr"][str(a)]
            lines.append(
                f"- `{stat}` at nominal {a}: {_pct(f['mean'])} of {overall['texts']} human texts "
                f"flagged (sd over keys {_pct(f['sd'])}, worst key {_pct(f['max'])})."
            )
    for name, p in result["power"].items():
        for stat in STATS:
            tpr = p[stat]["tpr_at_alpha"].get("0.01")
            emp = p[stat]["tpr_at_empirical_fpr"].get("0.01")
            if tpr and emp:
                lines.append(
                    f"- power on {name}: `{stat}` flags {_pct(tpr['mean'])} at nominal 0.01, "
                    f"{_pct(emp['mean'])} at the threshold that flags 1% of human news text "
                    "under the same key."
                )
    lines += [
        "",
        "## Human texts",
        "",
        f"{result['texts_total']} texts, each a run of consecutive sentences of one document "
        f"cut at about {cal['window_words']} words (~200 tokens, a generation's length). No",
        "prompt: each text's first sentence only seeds. None of these texts was used to fit the",
        "centroids (fitted on the news `fit` split).",
        "",
        "| source | what | texts | too short | mean scored sentences | same region as previous |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in result["sources"].items():
        lines.append(
            f"| {name} | {s['description']} | {s['texts']} (of {s['available_pieces']}) | "
            f"{s['too_short']} | {s['scored_mean']:.1f} | {_pct(s['same_region_share'])} |"
        )
    lines += [
        "",
        f"With independent regions, a sentence would share its predecessor's region about "
        f"{_pct(1 / cal['num_regions'])} of the time (1/K for equally likely regions).",
        "",
        "## False-positive rate at nominal alpha",
        "",
        "Mean over keys, then [5th, 95th percentile] over keys; last column: share of keys whose",
        "FPR exceeds alpha. The exact test's promise is over the key: a human text is flagged",
        "with probability at most alpha when the key is drawn at random, so the mean over keys",
        "stays at or below alpha. Under one fixed key, texts that share regions are flagged or",
        "cleared together, so one key's rate on a corpus can exceed alpha.",
        "",
        "| texts | statistic | alpha | FPR mean | sd | [q05, q95] | max | keys over alpha |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for group in [*result["sources"], "overall"]:
        for stat in STATS:
            for a in alphas:
                f = null[group][stat]["fpr"][str(a)]
                lines.append(
                    f"| {group} ({null[group]['texts']}) | {stat} | {a} | **{_pct(f['mean'])}** | "
                    f"{_pct(f['sd'])} | [{_pct(f['q05'])}, {_pct(f['q95'])}] | {_pct(f['max'])} | "
                    f"{_pct(f['keys_above_alpha'])} |"
                )
    lines += [
        "",
        "## Distance from uniform",
        "",
        "`KS` is the largest gap between the p-values' distribution function and the uniform",
        "one; `excess` counts only gaps where too many p-values are small (what causes false",
        "positives). *Per key*: the texts of one key move together (texts that share regions",
        "share the table's verdict on them), so a single key's distribution can sit far from",
        "uniform even for a valid test. *Pooled*: all keys together, the distribution a text",
        "gets over random keys, which is what a p-value promises. The exact test's p-values",
        "are discrete and conservative (many texts get p = 1), so its KS is large while its",
        "excess is near zero. `exact_randomised` breaks ties at random and is exactly uniform",
        "under the null law, so its pooled KS checks that law.",
        "",
        "| texts | statistic | KS per key, mean [q05, q95] | excess per key, mean [q05, q95] "
        "| KS pooled | excess pooled |",
        "|---|---|---|---|---|---|",
    ]
    for group in [*result["sources"], "overall"]:
        for stat in (*STATS, DIAGNOSTIC):
            row = null[group][stat]
            ks, ex = row["ks"], row["ks_excess"]
            lines.append(
                f"| {group} | {stat} | {ks['mean']:.3f} [{ks['q05']:.3f}, {ks['q95']:.3f}] | "
                f"{ex['mean']:.3f} [{ex['q05']:.3f}, {ex['q95']:.3f}] | "
                f"{row['ks_pooled']:.3f} | {row['ks_excess_pooled']:.3f} |"
            )
    lines += [
        "",
        "![p-value histograms](pvalues.png)",
        "",
        "Left and middle: histograms of the human texts' p-values pooled over keys (uniform",
        "would be flat at 1). Right: FPR against nominal alpha; a calibrated test stays on or",
        "below the diagonal.",
        "",
        "## Detection power beside it",
        "",
    ]
    lines += [
        "True-positive rates (TPR): the share of watermarked texts flagged. Simulated texts are",
        "scored under every key above; real generations only under the key they were made with,",
        "so they are one draw, and with n texts each text moves a rate by 100/n points.",
        "",
    ]
    power = result["power"]
    if not power:
        lines.append("No power measurement in this run.")
    for name, p in power.items():
        lines += [f"### {name}", "", p["what"][0].upper() + p["what"][1:] + ".", ""]
        if name.startswith("generated"):
            skipped = p["skipped"]
            lines.append(
                f"{p['texts']} texts ({p['too_short']} too short; skipped: {skipped['not_ok']} "
                f"failed records, {skipped['other_key']} of another key), "
                f"{p['num_scored_mean']:.1f} scored sentences and "
                f"{p['distinct_transitions_mean']:.1f} distinct region transitions on average; "
                f"{_pct(p['one_region_share'])} never leave one region. Generation drew "
                f"{p['candidates_per_sentence']:.1f} candidates per sentence, with "
                f"{p['fallbacks']} fallbacks."
            )
        else:
            lines.append(f"{p['texts_per_key']} texts per key; lengths: {p['lengths']}.")
        lines += [
            f"Empirical-FPR thresholds come from the {p['empirical_fpr_reference']}.",
            "",
            "| statistic | TPR at nominal alpha 0.01 | TPR at nominal 0.05 | TPR at empirical "
            "FPR 1% | TPR at empirical FPR 0.1% |",
            "|---|---|---|---|---|",
        ]
        for stat in STATS:
            nominal, emp = p[stat]["tpr_at_alpha"], p[stat]["tpr_at_empirical_fpr"]
            cells = [
                _pct(nominal[key]["mean"]) if key in nominal else "-" for key in ("0.01", "0.05")
            ]
            cells += [_pct(emp[key]["mean"]) if key in emp else "-" for key in ("0.01", "0.001")]
            lines.append(f"| {stat} | " + " | ".join(cells) + " |")
        lines.append("")
    conf = result["configured_key"]
    lines += [
        "## The configured key",
        "",
        f"Under the configured key (fingerprint `{conf['key_fingerprint']}`"
        + (f", {result['key']}" if result.get("key") else "")
        + "), one draw among the keys above, the human texts were flagged at:",
        "",
        "| statistic | " + " | ".join(f"alpha {a}" for a in alphas) + " |",
        "|---|" + "---|" * len(alphas),
    ]
    for stat in STATS:
        cells = [_pct(conf["human_fpr"][stat][str(a)]) for a in alphas]
        lines.append(f"| {stat} | " + " | ".join(cells) + " |")
    lines.append("")
    return "\n".join(lines)


def plot_pvalues(result: dict[str, Any], path: str | Path) -> None:
    """Write the p-value histograms and the FPR-against-alpha curve as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hist, curve = result["histogram"], result["fpr_curve"]
    edges = np.asarray(hist["edges"])
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, stat, title in zip(
        axes[:2], STATS, ("paper: normal tail of z", "exact: key randomisation"), strict=True
    ):
        ax.stairs(hist[stat], edges, fill=True, alpha=0.6, label=stat)
        if stat == "exact":
            ax.stairs(hist[DIAGNOSTIC], edges, color="black", label="exact, ties randomised")
        ax.axhline(1.0, color="grey", linestyle="--", label="uniform")
        ax.set_title(title)
        ax.set_xlabel("p-value of human text")
        ax.set_ylabel("density")
        ax.legend(fontsize=8)
    ax = axes[2]
    a = np.asarray(curve["alphas"])
    for stat in STATS:
        # A zero rate has no place on a log axis: the line stops where nothing is flagged.
        rate = np.asarray(curve[stat], dtype=np.float64)
        ax.loglog(a, np.where(rate > 0, rate, np.nan), label=stat)
    ax.loglog(a, a, color="grey", linestyle="--", label="nominal")
    ax.set_xlabel("nominal alpha")
    ax.set_ylabel("share of human texts flagged (0 not drawn)")
    ax.set_title("false-positive rate")
    ax.legend(fontsize=8)
    n, keys = result["texts_total"], result["calibration"]["num_keys"]
    fig.suptitle(f"{n} human texts x {keys} keys")
    fig.tight_layout()
    with atomic_target(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)


def write_outputs(result: dict[str, Any], output_dir: str | Path) -> dict[str, Path]:
    """Write ``calibration.json``, ``report.md`` and ``pvalues.png`` into ``output_dir``."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out / "calibration.json",
        "report": out / "report.md",
        "png": out / "pvalues.png",
    }
    write_json_atomic(paths["json"], result)
    write_text_atomic(paths["report"], render_report(result))
    plot_pvalues(result, paths["png"])
    return paths
