"""The two bounds of the direction mark, measured: effective sentences per text and retention.

``python -m research.robust.bounds --features base`` prints and writes
``runs/robust/bounds-<features>.json``:

* effective number of independent sentences per text (``N^2 / sum k``) on held-out human news
  (``val`` split, 9-sentence windows, one per article) and on the design pool's plain
  continuations, and on texts a watermark selected from the pool (best of 32 per sentence under
  random keys), with what drives it: the mean cross term of the contexts alone (``a . a'``),
  of the vectors alone (``u . u'``), and of their product;
* retention of a sentence's score under each held-out attack (Gemma-3-270M, the evaluation's
  attacker; SmolLM2 and WordNet pairs of the study) and the selected sentences' mean score.
"""

from __future__ import annotations

import argparse
import json
import random

import numpy as np
import torch

from ksemstamp.text.corpora import news_articles
from ksemstamp.text.splitter import get_splitter

from .common import (
    RUNS,
    EmbeddingCache,
    kernel,
    read_jsonl,
    retention,
    summary,
    summed_retention,
)
from .features import encoder_of, load_features

POOL = "research/study/data/pool.jsonl"
STUDY_PAIRS = "research/study/data/pairs.jsonl"


def human_texts(count: int = 300, length: int = 9) -> list[list[str]]:
    splitter = get_splitter()
    out = []
    for art in news_articles("val"):
        sents = [s for s in splitter.split(art.text) if len(s.split()) >= 4]
        if len(sents) >= length + 1:
            out.append(sents[1 : length + 1])
        if len(out) >= count:
            break
    return out


def pool_docs() -> list[dict]:
    return read_jsonl(POOL)


def cross_terms(feats) -> dict:
    u, a = feats
    n = len(u)
    off = ~torch.eye(n, dtype=torch.bool)
    aa, uu = (a @ a.T)[off], (u @ u.T)[off]
    return {"aa": float(aa.mean()), "uu": float(uu.mean()), "k": float((aa * uu).mean())}


def neff_of(feats) -> float:
    k = kernel(feats, feats)
    return float(len(k) ** 2 / k.sum())


def text_stats(texts, emb, feat) -> dict:
    neffs, ns, terms = [], [], []
    for sents in texts:
        f = feat(emb(sents))
        neffs.append(neff_of(f))
        ns.append(len(sents))
        terms.append(cross_terms(f))
    return {
        "n": summary(ns),
        "neff": summary(neffs),
        "neff_share": summary(np.array(neffs) / np.array(ns)),
        "cross_aa": float(np.mean([t["aa"] for t in terms])),
        "cross_uu": float(np.mean([t["uu"] for t in terms])),
        "cross_k": float(np.mean([t["k"] for t in terms])),
    }


def selected_texts(docs, emb, feat, keys: int = 10, dim_seed: int = 0):
    """Texts a watermark would write from the pool: per key, at each context the best-scoring
    of its candidates. Returns (texts, chosen scores)."""
    texts, scores = [], []
    for key in range(keys):
        g = torch.Generator().manual_seed(1000 + key)
        directions = None
        for d in docs:
            chosen, best = [], []
            for c in d["contexts"]:
                cands = [t for t, _ in c["candidates"] if t]
                if not cands:
                    continue
                u, a = feat(emb(cands))
                if directions is None:
                    directions = torch.randn(
                        a.shape[1], u.shape[1], generator=g, dtype=torch.float64
                    )
                s = ((a @ directions) * u).sum(-1)
                i = int(s.argmax())
                chosen.append(cands[i])
                best.append(float(s[i]))
            texts.append(chosen)
            scores.append(best)
    return texts, scores


def text_z(texts, scores, emb, feat) -> list[float]:
    """The exact whole-text z of each selected text under the key that selected it."""
    out = []
    for sents, s in zip(texts, scores, strict=True):
        f = feat(emb(sents))
        out.append(float(sum(s) / kernel(f, f).sum().sqrt()))
    return out


def pair_sets() -> dict[str, list[tuple[str, str]]]:
    sets: dict[str, list[tuple[str, str]]] = {}
    for row in read_jsonl(STUDY_PAIRS):
        for name, value in row["attacks"].items():
            if value:
                sets.setdefault(f"smollm2-{name}" if name != "wordnet" else "wordnet", []).append(
                    (row["text"], value[0])
                )
    held = RUNS / "heldout"
    for name in ("reword", "few-shot"):
        path = held / f"{name}.jsonl"
        if path.exists():
            sets[f"gemma-{name}"] = [
                (r["text"], r["attack"]) for r in read_jsonl(path) if r["attack"]
            ]
    path = held / "rewrite.jsonl"
    if path.exists():
        sets["gemma-rewrite"] = [
            (" ".join(r["sentences"]), r["rewrite"]) for r in read_jsonl(path) if r["rewrite"]
        ]
    return sets


def window_retention(emb, feat) -> dict:
    """Retention of a window's summed score under the rewrite: the correlation over keys of
    the sum of the original sentences' scores and the sum of the rewrite's."""
    path = RUNS / "heldout" / "rewrite.jsonl"
    if not path.exists():
        return {}
    vals = []
    for r in read_jsonl(path):
        if not r["rewrite"]:
            continue
        vals.append(summed_retention(feat(emb(r["sentences"])), feat(emb(r["rewrite_sentences"]))))
    return summary(vals)


def structural_retention(docs, emb, feat) -> dict:
    """Retention of the summed score of two neighbouring sentences when they are merged into one
    (the evaluation's ``merge`` edit), and of a long sentence's score when it is split in two
    (``split``), on the pool's plain continuations."""
    from ksemstamp.evaluation.edits import merge_pair, split_sentence

    out = {}
    merged, split = [], []
    for d in docs:
        sents = [c["candidates"][c["chosen"]][0] for c in d["contexts"]]
        sents = [x for x in sents if x]
        for i in range(0, len(sents) - 1, 2):
            merged.append((sents[i : i + 2], [merge_pair(sents[i], sents[i + 1])]))
        for x in sents:
            parts = split_sentence(x)
            if len(parts) == 2:
                split.append(([x], parts))
    for name, units in (("merge", merged), ("split", split)):
        vals = []
        for a, b in units:
            vals.append(summed_retention(feat(emb(a)), feat(emb(b))))
        out[name] = summary(vals)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--features", default="base")
    p.add_argument("--keys", type=int, default=10)
    a = p.parse_args()
    emb = EmbeddingCache(encoder_of(a.features))
    feat = load_features(a.features)
    out: dict = {"features": a.features}
    docs = pool_docs()
    plain = [
        [c["candidates"][c["chosen"]][0] for c in d["contexts"] if c["candidates"][c["chosen"]][0]]
        for d in docs
    ]
    out["human"] = text_stats(human_texts(), emb, feat)
    out["plain"] = text_stats(plain, emb, feat)
    sel, scores = selected_texts(docs, emb, feat, a.keys)
    out["selected"] = text_stats(sel, emb, feat)
    out["selected"]["score"] = summary([s for ss in scores for s in ss])
    out["selected"]["z"] = summary(text_z(sel, scores, emb, feat))
    out["retention"] = {}
    for name, pairs in pair_sets().items():
        f1 = feat(emb([x for x, _ in pairs]))
        f2 = feat(emb([y for _, y in pairs]))
        out["retention"][name] = summary(retention(f1, f2).tolist())
    out["retention"]["gemma-rewrite-window-sum"] = window_retention(emb, feat)
    out["retention"].update(structural_retention(docs, emb, feat))
    z = out["selected"]["z"]["median"]
    out["merit"] = {name: z * r["median"] for name, r in out["retention"].items() if r}
    path = RUNS / f"bounds-{a.features.replace(':', '-').replace('/', '_').replace(';', '-')}.json"
    path.write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    random.seed(0)
    main()
