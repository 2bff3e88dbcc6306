"""What clause units should give, predicted from the kernel before any generation (research only).

    python -m research.robust.clauses [--clause-words 4] [--keys 100]

Two measurements, written to ``runs/robust/clauses.json``:

* **evidence per sentence** on the held-out Gemma rewordings (``heldout/reword.jsonl``): a
  sentence scored whole keeps ``g r`` of a chosen score ``g`` after the attack (``r`` its
  retention), in null standard deviations. Scored clause by clause, with every clause chosen at
  the same ``g``, the clean sum is ``g n`` over a null sd of ``sqrt(1' K 1)`` (``K`` the clauses'
  null correlations), and after the attack the reworded sentence's clauses (cut afresh) keep
  their expected sum given the clean scores, ``1' K_ac K^-1 g 1``, over their own null sd. Both
  are given per sentence (``g = 2``, about the best of 32), summed over all pairs as one text.
* **selection gain**: whether a clause, shorter than a sentence, still gives a best-of-N
  selection as much to choose from. Over the design pool's contexts (32 candidates each) and
  random keys, the mean best score of the whole candidates and of their first clauses.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from ksemstamp.text.splitter import clauses

from .bounds import pool_docs
from .common import RUNS, BaseFeatures, EmbeddingCache, kernel, read_jsonl, retention
from .selection import unit_score

CHOSEN = 2.0


def _correlations(k: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    return k / rows.sqrt()[:, None] / cols.sqrt()[None, :]


def evidence(pairs: list[dict], emb, feat, words: int) -> dict:
    """Clean and attacked evidence per sentence, scored whole and clause by clause."""
    whole = whole_var = part_clean = part_var = part_att = part_att_var = 0.0
    units, units_att = [], []
    for pair in pairs:
        x, y = pair["text"], pair["attack"]
        whole += CHOSEN * float(retention(feat(emb([x])), feat(emb([y])))[0])
        whole_var += 1.0
        cx, cy = clauses(x, words), clauses(y, words)
        units.append(len(cx))
        units_att.append(len(cy))
        fx, fy = feat(emb(cx)), feat(emb(cy))
        kxx, kyy, kyx = kernel(fx, fx), kernel(fy, fy), kernel(fy, fx)
        dx, dy = kxx.diagonal(), kyy.diagonal()
        kxx, kyy = _correlations(kxx, dx, dx), _correlations(kyy, dy, dy)
        kyx = _correlations(kyx, dy, dx)
        chosen = torch.full((len(cx),), CHOSEN, dtype=kxx.dtype)
        expected = kyx @ torch.linalg.solve(kxx + 1e-6 * torch.eye(len(cx)), chosen)
        part_clean += CHOSEN * len(cx)
        part_var += float(kxx.sum())
        part_att += float(expected.sum())
        part_att_var += float(kyy.sum())
    n = len(pairs)
    return {
        "pairs": n,
        "clauses_per_sentence": float(np.mean(units)),
        "clauses_per_attacked_sentence": float(np.mean(units_att)),
        "sentence_units": {"clean": CHOSEN, "attacked": whole / np.sqrt(whole_var * n)},
        "clause_units": {
            "clean": part_clean / np.sqrt(part_var * n),
            "attacked": part_att / np.sqrt(part_att_var * n),
        },
    }


def selection_gain(emb, feat, words: int, keys: int) -> dict:
    """Mean best score over the pool's contexts: whole candidates and their first clauses."""
    contexts = [[t for t, _ in c["candidates"] if t] for d in pool_docs() for c in d["contexts"]]
    firsts = [[clauses(t, words)[0] for t in c] for c in contexts]
    texts = sorted({t for c in contexts + firsts for t in c})
    where = {t: i for i, t in enumerate(texts)}
    u, a = feat(emb(texts))
    generator = torch.Generator().manual_seed(0)
    best = {"sentences": [], "first_clauses": []}
    for _ in range(keys):
        directions = torch.randn(a.shape[1], u.shape[1], generator=generator, dtype=u.dtype)
        score = unit_score(directions, (u, a))
        for name, sets in (("sentences", contexts), ("first_clauses", firsts)):
            best[name].append(np.mean([score[[where[t] for t in c]].max() for c in sets]))
    words_of = {
        n: [len(t.split()) for c in s for t in c] for n, s in (("s", contexts), ("c", firsts))
    }
    return {
        "contexts": len(contexts),
        "keys": keys,
        "mean_best_sentence": float(np.mean(best["sentences"])),
        "mean_best_first_clause": float(np.mean(best["first_clauses"])),
        "distinct_first_clauses": float(np.mean([len(set(f)) / len(f) for f in firsts])),
        "words": {
            "sentence": float(np.mean(words_of["s"])),
            "clause": float(np.mean(words_of["c"])),
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clause-words", type=int, default=4)
    p.add_argument("--keys", type=int, default=100)
    args = p.parse_args()
    emb, feat = EmbeddingCache(), BaseFeatures()
    pairs = [r for r in read_jsonl(RUNS / "heldout" / "reword.jsonl") if r.get("attack")]
    out = {
        "clause_words": args.clause_words,
        "evidence_per_sentence": evidence(pairs, emb, feat, args.clause_words),
        "selection_gain": selection_gain(emb, feat, args.clause_words, args.keys),
    }
    (RUNS / "clauses.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
