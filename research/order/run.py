"""Run the order study: simulate texts per design and key, edit them, score, and count.

    python -m research.order.run --designs chain,self,self:tau=0.1 --keys 10

A design spec is ``context[:tau=T][:k=K]`` (context ``chain``, ``self`` or ``both``; the soft
context temperature, default 0.05; the number of regions, default 64, from the shipped file or
``research/study/data/centroids``). Generated texts are kept per design and key in ``--cache`` so
that statistics can be compared on the same texts. The flags are ``RunSettings``'s fields, also
read from ``--config FILE`` (YAML, ``null_keys: 100``); ``--print-config`` prints them.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from scipy.stats import norm

from ksemstamp.assets import load_encoder
from ksemstamp.calibration import CachedEncoder, embedding_store
from ksemstamp.centroids import CentroidFile
from ksemstamp.config import DEFAULT_CENTROIDS
from ksemstamp.evaluation.edits import EDITS, apply_edit, needs_human
from ksemstamp.keys import keyed_directions
from ksemstamp.settings_flags import SettingsGroup
from ksemstamp.text.corpora import make_windows, news_articles
from ksemstamp.text.splitter import get_splitter
from research import cli
from research.study.ingredients import load_ingredients

from . import sim

DATA = Path("research/study/data")


@dataclass(frozen=True)
class Design:
    context: str
    tau: float = 0.05
    k: int = 64
    pcs: int = 0
    """Top principal components of the domain's centred embeddings removed from the vectors."""
    source: str = "domain"
    """Where the components come from: ``domain`` (news fit split) or ``pool`` (in-sample)."""
    alpha: float = 1.0
    """Power of the whitening: components scaled by eigenvalue ** (-alpha / 2) instead."""

    @classmethod
    def parse(cls, spec: str) -> Design:
        context, *opts = spec.split(":")
        kw = dict(o.split("=") for o in opts)
        return cls(
            context=context,
            tau=float(kw.get("tau", 0.05)),
            k=int(kw.get("k", 64)),
            pcs=int(kw.get("pcs", 0)),
            alpha=float(kw.get("alpha", 1.0)),
            source=kw.get("source", "domain"),
        )

    @property
    def name(self) -> str:
        extra = f":pcs={self.pcs}" if self.pcs else ""
        extra += f":alpha={self.alpha:g}" if self.pcs < 0 else ""
        extra += ":pool" if self.pcs and self.source == "pool" else ""
        return f"{self.context}:tau={self.tau:g}:k={self.k}{extra}"


PROJECTIONS: dict = {}
DOMAIN_EMBEDDER = None


def projection(design: Design, emb, mean):
    """The design's map of centred embeddings: remove the top ``pcs`` principal components of
    the pool's centred embeddings (``pcs > 0``), or whiten partially (``pcs < 0``: every
    component scaled by eigenvalue ** (-alpha / 2))."""
    import torch

    if design.pcs == 0:
        return None
    key = (design.pcs, design.alpha, design.source)
    if key not in PROJECTIONS:
        if design.source == "domain":
            from ksemstamp.text.corpora import domain_sentences

            emb = DOMAIN_EMBEDDER.emb([s for doc in domain_sentences(20000) for s in doc])
        centred = emb.double() - mean.double()
        cov = centred.T @ centred / len(centred)
        evals, evecs = torch.linalg.eigh(cov)
        evals, evecs = evals.flip(0), evecs.flip(1)
        if design.pcs > 0:
            top = evecs[:, : design.pcs]
            PROJECTIONS[key] = (torch.eye(len(cov), dtype=torch.float64) - top @ top.T).float()
        else:
            scale = evals.clamp_min(evals[0] * 1e-4) ** (-design.alpha / 2)
            PROJECTIONS[key] = (evecs * scale) @ evecs.T
            PROJECTIONS[key] = PROJECTIONS[key].float()
    return PROJECTIONS[key]


def centroid_file(k: int) -> CentroidFile:
    if k == 64:
        return CentroidFile.load(DEFAULT_CENTROIDS["all-minilm-l6-v2"])
    if k == 1:  # one context for every sentence: a single keyed direction
        base = CentroidFile.load(DEFAULT_CENTROIDS["all-minilm-l6-v2"])
        base.centroids = torch.nn.functional.normalize(base.mean[None].float(), dim=-1)
        return base
    if k == 8:
        path = Path("src/ksemstamp/data/centroids-all-minilm-l6-v2-k8.pt")
        fitted = CentroidFile.load(path)
        fitted.mean = CentroidFile.load(DEFAULT_CENTROIDS["all-minilm-l6-v2"]).mean
        return fitted
    fitted = CentroidFile.load(DATA / "centroids" / f"centroids-all-minilm-l6-v2-k{k}.pt")
    if fitted.mean is None:
        fitted.mean = CentroidFile.load(DEFAULT_CENTROIDS["all-minilm-l6-v2"]).mean
    return fitted


class Embedder:
    """Sentences -> ``sim.Space`` under one design's centroids and temperature (cached)."""

    def __init__(self):
        enc = load_encoder("all-minilm-l6-v2")
        self.cached = CachedEncoder(enc, store=embedding_store(enc))

    def emb(self, sentences):
        self.cached.prefill(sentences)
        return self.cached.encode(list(sentences)).float()

    def space(self, sentences, fitted: CentroidFile, tau: float, project=None) -> sim.Space:
        return sim.make_space(
            sentences, self.emb(sentences), fitted.centroids, fitted.mean, tau, project
        )


def human_windows(count: int, words: int = 150) -> list[str]:
    """Held-out human news windows from the ``val`` split (the study never looks at ``test``)."""
    splitter = get_splitter()
    out: list[str] = []
    for article in news_articles("val")[20:]:
        out += make_windows(splitter.split(article.text), words, min_units=1, keep_tail=False)
        if len(out) >= count:
            break
    return out[:count]


def key_directions(k: int, dim: int, count: int) -> np.ndarray:
    return np.stack([keyed_directions(k, dim, f"order|{i}").double().numpy() for i in range(count)])


def texts_for(design: Design, ing, embedder, keys, n: int, cache: Path) -> dict:
    """``{key: {doc: [sentence, ...]}}`` simulated under ``design`` (cached on disk)."""
    path = cache / f"{design.name}-n{n}-keys{len(keys)}.json"
    if path.exists():
        return {
            int(k): {int(d): v for d, v in docs.items()}
            for k, docs in json.loads(path.read_text()).items()
        }
    fitted = centroid_file(design.k)
    proj = projection(design, ing.embeddings, fitted.mean)
    space = sim.make_space(
        ing.sentences, ing.embeddings, fitted.centroids, fitted.mean, design.tau, proj
    )
    out: dict = {}
    for k in range(len(keys)):
        rng = np.random.default_rng(1000 + k)
        out[k] = {}
        for doc in range(ing.num_docs):
            ids = sim.generate(
                design.context, space, ing.cand, ing.tokens, ing.doc_contexts[doc],
                int(ing.seeds[doc]), keys[k], rng, n=n,
            )  # fmt: skip
            out[k][doc] = [ing.sentences[i] for i in ids]
    cache.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out))
    return out


@dataclass(frozen=True)
class RunSettings:
    """What one run of the order study simulates, scores and writes."""

    designs: str = "chain,self,both"
    """Comma-separated design specs, ``context[:tau=T][:k=K][:pcs=M]`` (see ``Design.parse``)."""
    keys: int = 10
    """Keys per design; each key generates one text per pool document."""
    n: int = 32
    """Pool candidates each simulated sentence is the best of."""
    human: int = 300
    """Held-out human news windows (``val`` split) for the false-positive rates."""
    null_keys: int = 100
    """Keys each human window is scored under."""
    edits: str = ",".join(EDITS)
    """Comma-separated edits of ``ksemstamp.evaluation.edits`` (empty: none)."""
    statistics: str = "sum"
    """Comma-separated statistics of ``sim.statistic``."""
    cache: str = "runs/order"
    """Folder of the generated texts, per design and key."""
    out: str = "research/order/results.json"
    """Results JSON; rows of an existing file are kept and overwritten by name."""


SETTINGS = SettingsGroup(RunSettings, "order study")


def parse_args(argv: Sequence[str] | None = None) -> RunSettings:
    """The run's settings from the command line (``--help`` for the flags)."""
    p = cli.parser(__doc__, prog="python -m research.order.run")
    SETTINGS.add_to(p)
    return cli.build(p, SETTINGS, cli.parse_args(p, argv))


def main(argv: Sequence[str] | None = None) -> None:
    run(parse_args(argv))


def run(args: RunSettings) -> None:
    """Simulate, edit and score every design of ``args``, writing ``args.out`` after each."""
    ing = load_ingredients(DATA / "pool.jsonl", DATA / "pairs.jsonl")
    embedder = Embedder()
    global DOMAIN_EMBEDDER
    DOMAIN_EMBEDDER = embedder
    splitter = get_splitter()
    windows = human_windows(args.human)
    human_pool = [ing.sentences[s] for seq in ing.human for s in seq[1:]]
    edits = [e for e in args.edits.split(",") if e]
    results = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}

    for spec in args.designs.split(","):
        design = Design.parse(spec)
        fitted = centroid_file(design.k)
        proj = projection(design, ing.embeddings, fitted.mean)
        keys = key_directions(design.k, ing.embeddings.shape[1], args.keys)
        texts = texts_for(design, ing, embedder, keys, args.n, Path(args.cache))
        z: dict[str, dict[str, list[float]]] = {}

        def score(
            stat, sentences, seed, key_index, fitted=fitted, design=design, proj=proj, keys=keys
        ):
            sent = sim.dedupe(splitter.split(" ".join(sentences)) if sentences else [])
            if not sent:
                return None
            sp = embedder.space(sent, fitted, design.tau, proj)
            seed_w = None if seed is None else embedder.space([seed], fitted, design.tau).weights[0]
            return sim.statistic(stat, design.context, sp, seed_w, keys[key_index])

        for k, docs in texts.items():
            for doc, sentences in docs.items():
                text = " ".join(sentences)
                seed = ing.sentences[int(ing.seeds[doc])]
                others = [s for s in human_pool if s not in set(sentences)]
                random.Random(f"{k}|{doc}").shuffle(others)
                variants = {"clean": text}
                for name in edits:
                    human = others[: needs_human(name) * len(sentences)]
                    variants[name] = apply_edit(name, text, seed=f"{k}|{doc}", human=human)
                for stat in args.statistics.split(","):
                    for name, etext in variants.items():
                        value = score(stat, splitter.split(etext), seed, k)
                        if value is not None:
                            z.setdefault(stat, {}).setdefault(name, []).append(value)
                # paraphrase attacks, embedding-level (the study's displacement model)
                ids = [ing.sentences.index(s) for s in sentences]
                for att, emb in ing.attacked.items():
                    asp = sim.make_space(
                        ing.sentences, emb, fitted.centroids, fitted.mean, design.tau, proj
                    )
                    part = sim.Space([], None, asp.vec[ids], asp.weights[ids])
                    for stat in args.statistics.split(","):
                        value = sim.statistic(
                            stat, design.context, part, asp.weights[int(ing.seeds[doc])], keys[k]
                        )
                        z.setdefault(stat, {}).setdefault(att, []).append(value)
        human = {}
        null_keys = key_directions(design.k, ing.embeddings.shape[1], args.null_keys)
        for stat in args.statistics.split(","):
            hp = []
            for text in windows:
                sent = sim.dedupe(splitter.split(text))
                sp = embedder.space(sent, fitted, design.tau, proj)
                hp.append([sim.statistic(stat, design.context, sp, None, d) for d in null_keys])
            hp = np.array(hp, dtype=float)
            fpr = (norm.sf(hp) <= 0.01).mean(axis=0)
            human[stat] = {
                "fpr1_mean": float(fpr.mean()),
                "fpr1_worst": float(fpr.max()),
                "fpr01_mean": float((norm.sf(hp) <= 0.001).mean()),
            }
        for stat, rows in z.items():
            summary = {
                name: {
                    "tpr1": float((norm.sf(np.array(v)) <= 0.01).mean()),
                    "tpr5": float((norm.sf(np.array(v)) <= 0.05).mean()),
                    "median_z": float(np.median(v)),
                    "worst_key_tpr1": float(
                        min((norm.sf(np.array(v).reshape(len(keys), -1)) <= 0.01).mean(axis=1))
                    ),
                }
                for name, v in rows.items()
            }
            summary["human"] = human[stat]
            results[f"{design.name}|{stat}|n{args.n}"] = summary
        Path(args.out).write_text(json.dumps(results, indent=1))
        print_table(results)


def print_table(results: dict) -> None:
    names = [n for n in next(iter(results.values())) if n != "human"]
    cols = list(results)
    print("edit".ljust(14), *[c[:26].ljust(27) for c in cols])
    for n in names:
        cells = []
        for c in cols:
            s = results[c].get(n)
            cells.append(
                "-".ljust(27)
                if s is None
                else f"{s['tpr1']:.2f} w{s['worst_key_tpr1']:.2f} z{s['median_z']:.2f}".ljust(27)
            )
        print(n.ljust(14), *cells)
    print(
        "fpr1 mean/worst".ljust(14),
        *[
            f"{results[c]['human']['fpr1_mean']:.3f}/{results[c]['human']['fpr1_worst']:.3f}".ljust(
                27
            )
            for c in cols
        ],
    )


if __name__ == "__main__":
    main()
