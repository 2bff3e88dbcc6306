"""The simulator's driver: ``Sweep`` runs design points on one set of ingredients, caching each
partition's view, and ``summarize`` reports per design (pooled over keys and documents, with the
spread over keys where it matters):

* cost: candidates per sentence (mean, 95th percentile over sentences), fallback share;
* evidence: scored sentences per text, share of texts with exact p <= 0.01 and <= 0.05, clean
  and after each attack (mean over keys, and the worst key);
* robustness: the share of accepted sentences whose attacked region is their own.

``sweep`` (the grid and its stages), ``diagnostics``, ``prune`` and ``validate`` build on it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .design import Design, DesignView, centroid_path, view
from .ingredients import Ingredients
from .simulate import SimText, human_p_values, key_material, simulate_text

ALPHAS = (0.01, 0.05)
PRUNE_CHECKPOINTS = tuple(range(8, 65, 8))
"""Partial lengths the simulator knows vectors for: pruned designs check every 8 tokens."""


def summarize(per_key: Sequence[Sequence[SimText]], attacks: Sequence[str]) -> dict:
    """Figures of one design from its simulated texts (one list of texts per key)."""
    texts = [t for key in per_key for t in key]
    cands = np.array([c for t in texts for c in t.candidates], dtype=np.float64)
    falls = np.array([f for t in texts for f in t.fallbacks], dtype=bool)
    out: dict = {
        "texts": len(texts),
        "keys": len(per_key),
        "sentences_per_text": float(np.mean([len(t.regions) for t in texts])),
        "scored_per_text": float(np.mean([t.scored for t in texts])),
        "tokens_per_text": float(np.mean([t.tokens for t in texts])),
        "candidates_mean": float(cands.mean()) if len(cands) else float("nan"),
        "candidates_p95": float(np.percentile(cands, 95)) if len(cands) else float("nan"),
        "fallback_share": float(falls.mean()) if len(falls) else float("nan"),
        "invalid_share": float(np.mean([not v for t in texts for v in t.valid]))
        if len(falls)
        else float("nan"),
        "valid_share": float(np.mean([t.valid_clean / max(t.scored, 1) for t in texts])),
    }
    decoded = [d for t in texts for d in t.decoded]
    if decoded:  # direction designs: what a sentence costs to decode
        out["decoded_per_sentence"] = float(np.mean(decoded))
        out["mean_best_score"] = float(np.mean([x for t in texts for x in t.scores]))
        dropped = [x for t in texts for x in t.best_dropped]
        if dropped:  # pruned designs: how often the rule stopped the would-be best row
            out["best_dropped_share"] = float(np.mean(dropped))
        out["step_cost_per_token"] = float(
            sum(c for t in texts for c in t.step_cost) / max(sum(t.tokens for t in texts), 1)
        )

    def power(get) -> dict:
        res = {}
        for alpha in ALPHAS:
            rates = [float(np.mean([get(t) <= alpha for t in key])) for key in per_key]
            res[str(alpha)] = {"mean": float(np.mean(rates)), "min": float(np.min(rates))}
        return res

    out["power"] = {"clean": power(lambda t: t.p_clean)}
    out["agreement"] = {}
    for name in attacks:
        out["power"][name] = power(lambda t, n=name: t.p_attacked[n])
        out["agreement"][name] = float(np.nanmean([t.agreement[name] for t in texts]))
    return out


class Sweep:
    """Simulates designs on one set of ingredients, caching each ``K``'s partition view."""

    def __init__(
        self,
        ing: Ingredients,
        centroid_folder: str | Path,
        num_keys: int = 20,
        max_new_tokens: int = 200,
        seed: int = 0,
    ) -> None:
        self.ing = ing
        self.folder = Path(centroid_folder)
        self.num_keys = num_keys
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self._views: dict[tuple, DesignView] = {}
        self._partial: dict[int, torch.Tensor] = {}

    def view(self, design: Design) -> DesignView:
        """The design's view of the ingredients: regions and vectors under its centroids, plus
        soft context weights at its temperature and partial vectors when it prunes."""
        from ksemstamp.centroids import CentroidFile
        from ksemstamp.scheme import soft_context_weights

        path = design.centroids or str(centroid_path(self.folder, self.ing.encoder, design.k))
        if path not in self._views:
            fitted = CentroidFile.load(path)
            if fitted.num_regions != design.k:
                raise ValueError(f"{path} has {fitted.num_regions} centroids, design K={design.k}")
            self._views[path] = view(self.ing, fitted.centroids, fitted.mean)
        base = self._views[path]
        tau = design.context_temperature if design.mark == "direction" else 0.0
        prune = design.prune_rule()
        if not tau and prune is None:
            return base
        key = (path, tau, prune is not None)
        if key not in self._views:
            extra: dict = {}
            if tau:
                extra["weights"] = soft_context_weights(self.ing.embeddings, base.centroids, tau)
                extra["attacked_weights"] = {
                    name: soft_context_weights(emb, base.centroids, tau).numpy()
                    for name, emb in self.ing.attacked.items()
                }
                extra["weights"] = extra["weights"].numpy()
            if prune is not None:
                center = 0.0 if base.center is None else base.center.double()
                extra["partial"] = {
                    n: F.normalize(emb.double() - center, dim=-1).numpy()
                    for n, emb in self.partial_embeddings().items()
                }
            self._views[key] = replace(base, **extra)
        return self._views[key]

    def partial_embeddings(self) -> dict[int, torch.Tensor]:
        """Embeddings of every sentence's first 8, 16, ..., 64 generator tokens (computed once;
        every pruned design here checks every 8 tokens)."""
        from .ingredients import partial_embeddings

        if not self._partial:
            self._partial = partial_embeddings(self.ing, PRUNE_CHECKPOINTS)
        return self._partial

    def margin_for(self, design: Design, pass_rate: float) -> Design:
        """``design`` with the margin that ``pass_rate`` of the pool's usable candidates pass."""
        from .design import margin_for_pass_rate

        dv = self.view(design)
        usable = np.unique(self.ing.cand[self.ing.cand >= 0])
        return replace(design, margin=round(margin_for_pass_rate(dv.gap[usable], pass_rate), 4))

    def run(self, design: Design, docs: Sequence[int] | None = None) -> dict:
        """Simulate ``design`` under every key for every document (or ``docs``) and summarise."""
        dv = self.view(design)
        docs = range(self.ing.num_docs) if docs is None else docs
        per_key = []
        human = []
        for i, table in enumerate(key_material(design, self.num_keys, self.seed, dv)):
            rng = np.random.default_rng([self.seed, i])
            per_key.append(
                [
                    simulate_text(design, dv, self.ing, d, table, rng, self.max_new_tokens)
                    for d in docs
                ]
            )
            human.extend(human_p_values(design, dv, self.ing, table))
        out = summarize(per_key, list(self.ing.attacked))
        out["human_fpr"] = {str(a): float(np.mean(np.array(human) <= a)) for a in ALPHAS}
        out["design"] = design.to_dict()
        out["label"] = design.label()
        return out

    def run_all(self, designs: Sequence[Design], progress: bool = True) -> list[dict]:
        return [self.run(d) for d in tqdm(designs, desc="designs", disable=not progress)]


def write_results(results: list[dict], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=1) + "\n")
    tmp.replace(path)
