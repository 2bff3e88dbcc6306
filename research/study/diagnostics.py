"""Diagnostics of the study's ingredients, reported beside the sweep (``report["ingredients"]``
and the rest): what each partition and the direction mark work with before any design choice,
and how well the displacement model predicts real paraphrases.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .design import Design, centroid_path
from .runner import Sweep


def direction_ingredients(sweep: Sweep, k: int = 64, draws: int = 200, seed: int = 0) -> dict:
    """What the direction mark works with, on the ``k``-centroid file's centred vectors:

    * ``paraphrase_cosine``: per attack, mean cosine between an actually attacked sentence's
      vector and its paraphrase's (a paraphrase keeps this share of a score on average);
    * ``candidate_cosine``: mean cosine between two candidates of one context (the lower, the
      more a context's candidates differ along a random direction, and the more choosing the
      best of them gains);
    * ``best_of``: for ``n`` candidates of a context, the mean score of the best of them along
      random standard normal directions (a sentence's own score is N(0, 1) under the null).
    """
    ing = sweep.ing
    dv = sweep.view(Design(k=k))
    rng = np.random.default_rng(seed)
    out: dict = {"k": k, "paraphrase_cosine": {}}
    for name, src in ing.actual.items():
        if len(src):
            dst = ing.para_index[name][src]
            out["paraphrase_cosine"][name] = float(
                (dv.vectors[src] * dv.vectors[dst]).sum(1).mean()
            )
    cos, best = [], {n: [] for n in (1, 4, 8, 12, 16, 24)}
    width = ing.cand.shape[1]
    for c in range(len(ing.cand)):
        ids = ing.cand[c][ing.cand[c] >= 0]
        if len(ids) < 2:
            continue
        vec = dv.vectors[ids]
        gram = vec @ vec.T
        cos.append(float(gram[np.triu_indices(len(ids), 1)].mean()))
        directions = rng.standard_normal((draws // len(ing.cand) + 1, vec.shape[1]))
        scores = directions @ vec.T
        for n in best:
            pick = rng.integers(len(ids), size=(len(directions), min(n, width)))
            best[n].append(float(np.take_along_axis(scores, pick, axis=1).max(axis=1).mean()))
    out["candidate_cosine"] = float(np.mean(cos))
    out["best_of"] = {str(n): float(np.mean(v)) for n, v in best.items()}
    return out


def ingredient_stats(sweep: Sweep, ks: Sequence[int], pass_rates: Sequence[float]) -> list[dict]:
    """What each partition does before any design choice, per ``K`` and margin pass rate:

    * ``agreement``: share of actually attacked sentences whose paraphrase keeps their region
      (all sentences, and those passing the margin);
    * ``spread``: per context, distinct regions among its candidates, and the share of the
      context's most common region (1 = every candidate in one region);
    * ``human_self``: share of human transitions that stay in their region.
    """
    ing = sweep.ing
    rows = []
    for k in ks:
        base = Design(k=k)
        dv = sweep.view(base)
        usable = ing.cand >= 0
        distinct, top = [], []
        for c in range(len(ing.cand)):
            regs = dv.region[ing.cand[c][usable[c]]]
            if len(regs):
                counts = np.bincount(regs, minlength=k)
                distinct.append(int((counts > 0).sum()))
                top.append(float(counts.max() / counts.sum()))
        steps = [(a, b) for seq in ing.human for a, b in zip(seq[1:], seq[2:], strict=False)]
        self_share = float(np.mean([dv.region[a] == dv.region[b] for a, b in steps]))
        for rate in pass_rates:
            margin = sweep.margin_for(base, rate).margin
            row = {
                "k": k,
                "pass_rate": rate,
                "margin": margin,
                "distinct_regions_per_context": float(np.mean(distinct)),
                "top_region_share": float(np.mean(top)),
                "human_self_transition": self_share,
                "agreement": {},
            }
            for name, src in ing.actual.items():
                if len(src) == 0:
                    continue
                keep = dv.attacked[name][src] == dv.region[src]
                passing = dv.gap[src] > margin
                row["agreement"][name] = {
                    "all": float(keep.mean()),
                    "passing": float(keep[passing].mean()) if passing.any() else float("nan"),
                    "pairs": int(len(src)),
                }
            rows.append(row)
    return rows


def displacement_check(sweep: Sweep, ks: Sequence[int]) -> dict:
    """How well the displacement model predicts the region of an actual paraphrase: each
    attacked sentence's region after the move of its nearest *other* attacked sentence, against
    the region of its real paraphrase (and the no-move baseline: the sentence's own region)."""
    from .ingredients import displaced

    ing = sweep.ing
    out: dict = {}
    for name, src in ing.actual.items():
        if len(src) < 2:
            continue
        dst = ing.para_index[name][src]
        emb = ing.embeddings
        moved = displaced(emb[src], emb[src], emb[dst] - emb[src], exclude_self=True)
        out[name] = {}
        for k in ks:
            from ksemstamp.partition import kmeans_gap

            dv = sweep.view(Design(k=k))
            centroids = _centroids(sweep, k)
            pred = kmeans_gap(moved, centroids)[0].numpy()
            truth = dv.region[dst]
            out[name][str(k)] = {
                "model_agrees_on_kept": float(np.mean(pred == truth)),
                "no_move_agrees": float(np.mean(dv.region[src] == truth)),
                "model_keep_rate": float(np.mean(pred == dv.region[src])),
                "actual_keep_rate": float(np.mean(truth == dv.region[src])),
            }
    return out


def _centroids(sweep: Sweep, k: int) -> torch.Tensor:
    from ksemstamp.centroids import CentroidFile

    return CentroidFile.load(centroid_path(sweep.folder, sweep.ing.encoder, k)).centroids
