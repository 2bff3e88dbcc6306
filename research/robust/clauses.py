"""What clause units should give, predicted from the kernel before any generation (research only).

    python -m research.robust.clauses [--clause-words 4] [--keys 100] [--features base]

Three measurements, written to ``runs/robust/clauses.json`` (``clauses-<features>.json`` for
another feature map, ``research.robust.features``):

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
* **the two bounds with clause units**: the retention of a sentence's clause sum under each
  held-out attack (both sides cut into clauses, each side scoring the sum of its clauses), the
  effective share of held-out human texts cut into clauses (``N^2 / sum k`` over clauses), and
  texts a watermark selects clause by clause from the pool (at each context the best-scoring
  first clause of its candidates under a key): their median z, and that z times the median
  Gemma reword retention, the evidence left after the evaluation's paraphrase.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from ksemstamp.text.splitter import clauses

from .bounds import human_texts, neff_of, pair_sets, pool_docs, selected_texts, text_z
from .common import (
    RUNS,
    EmbeddingCache,
    effective_n,
    kernel,
    read_jsonl,
    retention,
    summary,
    summed_retention,
)
from .features import encoder_of, load_features
from .selection import unit_score

CHOSEN = 2.0


def _correlations(k: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    return k / rows.sqrt()[:, None] / cols.sqrt()[None, :]


def evidence(pairs: list[dict], emb, feat, words: int) -> dict:
    """Clean and attacked evidence per sentence, scored whole and clause by clause."""
    whole = whole_var = part_clean = part_var = part_att = part_att_var = 0.0
    units, units_att = [], []
    emb([c for r in pairs for t in (r["text"], r["attack"]) for c in (t, *clauses(t, words))])
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


def sum_retention(pairs: list[tuple[str, str]], emb, feat, words: int) -> dict:
    """Retention of each pair's clause sum: the correlation over keys of the summed scores of
    the first text's clauses and of the second's."""
    values = []
    emb([c for x, y in pairs for s in (*x, *y) for c in clauses(s, words)])  # one pass, cached
    for x, y in pairs:
        fx = feat(emb([c for s in x for c in clauses(s, words)]))
        fy = feat(emb([c for s in y for c in clauses(s, words)]))
        values.append(summed_retention(fx, fy))
    return summary(values)


def clause_bounds(emb, feat, words: int) -> dict:
    """Both bounds with clause units: retention under every held-out attack, and the effective
    share of held-out human texts (``val`` news, 9 sentences each) cut into clauses."""
    out: dict = {"retention": {}}
    for name, pairs in pair_sets().items():
        out["retention"][name] = sum_retention([([x], [y]) for x, y in pairs], emb, feat, words)
    path = RUNS / "heldout" / "rewrite.jsonl"
    if path.exists():
        windows = [
            (r["sentences"], r["rewrite_sentences"]) for r in read_jsonl(path) if r["rewrite"]
        ]
        out["retention"]["gemma-rewrite-window-sum"] = sum_retention(windows, emb, feat, words)
    shares, counts = [], []
    texts = human_texts()
    emb([c for sents in texts for s in sents for c in clauses(s, words)])
    for sents in texts:
        units = [c for s in sents for c in clauses(s, words)]
        shares.append(effective_n(feat(emb(units))) / len(units))
        counts.append(len(units))
    out["human"] = {"clauses": summary(counts), "neff_share": summary(shares)}
    docs = first_clause_docs(pool_docs(), words)
    emb([t for d in docs for c in d["contexts"] for t, _ in c["candidates"] if t])
    sel, scores = selected_texts(docs, emb, feat, keys=10)
    z = summary(text_z(sel, scores, emb, feat))
    out["selected"] = {
        "z": z,
        "score": summary([x for xs in scores for x in xs]),
        "neff_share": summary([neff_of(feat(emb(t))) / len(t) for t in sel]),
    }
    reword = out["retention"].get("gemma-reword")
    if reword:
        out["merit"] = z["median"] * reword["median"]
    return out


def first_clause_docs(docs: list[dict], words: int) -> list[dict]:
    """The pool with every candidate cut to its first clause (a clause-unit selection)."""
    return [
        dict(
            d,
            contexts=[
                dict(
                    c,
                    candidates=[(clauses(t, words)[0] if t else t, x) for t, x in c["candidates"]],
                )
                for c in d["contexts"]
            ],
        )
        for d in docs
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clause-words", type=int, default=4)
    p.add_argument("--keys", type=int, default=100)
    p.add_argument("--features", default="base")
    args = p.parse_args()
    emb, feat = EmbeddingCache(encoder_of(args.features)), load_features(args.features)
    pairs = [r for r in read_jsonl(RUNS / "heldout" / "reword.jsonl") if r.get("attack")]
    out = {
        "features": args.features,
        "clause_words": args.clause_words,
        "evidence_per_sentence": evidence(pairs, emb, feat, args.clause_words),
        "selection_gain": selection_gain(emb, feat, args.clause_words, args.keys),
        "bounds": clause_bounds(emb, feat, args.clause_words),
    }
    name = "clauses" if args.features == "base" else f"clauses-{_slug(args.features)}"
    (RUNS / f"{name}.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


def _slug(spec: str) -> str:
    return spec.replace(":", "-").replace("/", "_").replace(";", "-")


if __name__ == "__main__":
    main()
