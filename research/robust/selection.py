"""Can the selection pick candidates whose score survives a paraphrase?

Generation keeps, of a context's candidates, the one scoring highest under the key. After the
evaluation's paraphrase a chosen sentence keeps about half its score (the reword retention).
The detector's null holds whatever rule picks the candidate, so the selection is free to rank
candidates by a *prediction* of their score after an attack instead, if one predicts it better
than the clean score does. This measures three families of such predictions, none fitted on
the evaluation's attacker:

* ``self``: the candidate's score plus the score of the generator's own rewording of it
  (SmolLM2-135M-Instruct under a training chat style of ``trainpairs``, never the evaluation's
  prompts), or the smaller of the two: what a generator could compute by rewording its
  candidates itself;
* ``linear``: the score of ``mu + (x - mu) W``, the embedding a paraphrase is expected to
  produce, with ``W`` ridge-regressed toward the identity on the study's SmolLM2, bigram and
  WordNet pairs (``research/study/data/pairs.jsonl``, other sentences than the contexts here);
* ``oracle``: the attacked sentence's own score, the ceiling no rule reaches.

Data (``attack``): every candidate of ``--contexts`` contexts of the design pool (``val``
prompts), reworded by SmolLM2 as above and by the evaluation's attacker (Gemma-3-270M, the
``reword`` prompt, best of 4 as the evaluation picks it: held-out measurement only).
Measurement (``measure``): per key and context, the chosen candidate's clean and attacked score
under each rule, averaged over keys and contexts (the default's features and soft contexts),
and what a candidate's retention under the attack goes with.

    python -m research.robust.selection attack --contexts 6
    python -m research.robust.selection measure
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from .common import RUNS, BaseFeatures, EmbeddingCache, read_jsonl, retention
from .heldout import POOL, attack_sentences

OUT = RUNS / "selection"
STUDY_PAIRS = Path("research/study/data/pairs.jsonl")


def pool_contexts(count: int) -> list[dict]:
    """``count`` contexts of the pool, spread over its documents (round robin, in order), each
    ``{"id", "candidates": [text]}`` with its non-empty candidates."""
    docs = read_jsonl(POOL)
    out = []
    for depth in range(max(len(d["contexts"]) for d in docs)):
        for d in docs:
            if len(out) == count:
                return out
            if depth < len(d["contexts"]):
                cands = [t for t, _ in d["contexts"][depth]["candidates"] if t]
                out.append({"id": f"{d['id']}:{depth}", "candidates": cands})
    return out


def attack(contexts: int, threads: int) -> None:
    """Reword every candidate of the first ``contexts`` contexts by both models."""
    from ksemstamp.assets import load_encoder, load_lm
    from ksemstamp.paraphrase import LMParaphraser

    from .trainpairs import STYLES

    torch.set_num_threads(threads)
    OUT.mkdir(parents=True, exist_ok=True)
    rows = [
        {"id": f"{c['id']}:{i}", "text": t}
        for c in pool_contexts(contexts)
        for i, t in enumerate(c["candidates"])
    ]
    sim = load_encoder("all-mpnet-base-v2")
    smol = LMParaphraser(
        lm=load_lm("smollm2-135m-instruct"),
        prompts=STYLES[0],
        num_candidates=3,
        batch_size=48,
        seed=0,
        max_new_tokens=64,
    )
    attack_sentences(rows, OUT / "smollm2.jsonl", smol, sim, chunk=16, desc="smollm2")
    gemma = LMParaphraser(
        lm=load_lm("gemma3-270m"), prompts="reword", num_candidates=4, batch_size=32, seed=0
    )
    attack_sentences(rows, OUT / "gemma.jsonl", gemma, sim, chunk=16, desc="gemma reword")


def toward_identity(x: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor:
    """``W = I + argmin_D |x (I + D) - y|^2 + lam n v |D|^2`` (``v`` the mean variance of ``x``):
    the linear map from a sentence's centred embedding to its paraphrase's, shrunk toward
    leaving the embedding as it is."""
    eye = torch.eye(x.shape[1], dtype=x.dtype)
    ridge = lam * len(x) * x.var(0).mean()
    return eye + torch.linalg.solve(x.T @ x + ridge * eye, x.T @ (y - x))


def study_pairs() -> tuple[list[str], list[str]]:
    """The study's non-Gemma pairs (SmolLM2 reword and bigram reword, WordNet)."""
    a, b = [], []
    for row in read_jsonl(STUDY_PAIRS):
        for name in ("lm-paraphrase", "lm-bigram", "wordnet"):
            if row["attacks"].get(name):
                a.append(row["text"])
                b.append(row["attacks"][name][0])
    return a, b


def rule_scores(clean, own, linear, attacked) -> dict[str, np.ndarray]:
    """What each rule ranks the candidates of one context by (rows: candidates)."""
    return {
        "clean score (shipped)": clean,
        "self: clean + own rewording": clean + own,
        "self: min(clean, own rewording)": np.minimum(clean, own),
        **{f"linear, lam {lam:g}": s for lam, s in linear.items()},
        "oracle: the attacked score": attacked,
    }


def unit_score(directions: torch.Tensor, feats) -> np.ndarray:
    """Each sentence's score under the key's ``directions`` in units of its null sd."""
    u, a = feats
    null_var = (a * a).sum(-1) * (u * u).sum(-1)
    return (((a @ directions) * u).sum(-1) / null_var.sqrt()).numpy()


def measure(keys: int, lams: tuple[float, ...]) -> dict:
    """Per key and context, the candidate each rule keeps: its clean and attacked scores (means
    over keys and contexts), and its paired gain over the shipped rule with the standard error
    over contexts; ``lams`` are the ridge penalties of the linear rule."""
    emb, feat = EmbeddingCache(), BaseFeatures()
    smol = {r["id"]: r for r in read_jsonl(OUT / "smollm2.jsonl")}
    gemma = {r["id"]: r for r in read_jsonl(OUT / "gemma.jsonl")}
    by_context: dict[str, list[str]] = {}
    for i in gemma:
        if gemma[i]["attack"] and smol.get(i, {}).get("attack"):
            by_context.setdefault(i.rsplit(":", 1)[0], []).append(i)
    a, b = study_pairs()
    ea, eb = emb(a).double(), emb(b).double()
    mu = ea.mean(0)
    maps = {lam: toward_identity(ea - mu, eb - mu, lam) for lam in lams}

    ctx = []
    for ids in by_context.values():
        x = emb([gemma[i]["text"] for i in ids]).double()
        ctx.append(
            {
                "clean": feat(x),
                "own": feat(emb([smol[i]["attack"] for i in ids]).double()),
                "attacked": feat(emb([gemma[i]["attack"] for i in ids]).double()),
                "linear": {lam: feat(mu + (x - mu) @ w) for lam, w in maps.items()},
            }
        )
    gen = torch.Generator().manual_seed(20261127)
    totals: dict[str, list[tuple[float, float]]] = {}
    for _ in range(keys):
        u, a = ctx[0]["clean"]
        n = torch.randn(a.shape[1], u.shape[1], generator=gen, dtype=torch.float64)
        for c in ctx:
            clean, attacked = unit_score(n, c["clean"]), unit_score(n, c["attacked"])
            linear = {lam: unit_score(n, f) for lam, f in c["linear"].items()}
            own = unit_score(n, c["own"])
            for name, r in rule_scores(clean, own, linear, attacked).items():
                k = int(np.argmax(r))
                totals.setdefault(name, []).append((clean[k], attacked[k]))
    sizes = [len(ids) for ids in by_context.values()]
    shipped = np.array([t for _, t in totals["clean score (shipped)"]]).reshape(keys, len(ctx))
    rows = {}
    for name, v in totals.items():
        attacked = np.array([t for _, t in v]).reshape(keys, len(ctx))
        # the paired gain over the shipped rule, one mean per context: its spread over the
        # contexts is the uncertainty that matters (the candidates, not the keys, are few)
        gain = (attacked - shipped).mean(0)
        rows[name] = {
            "clean": float(np.mean([c for c, _ in v])),
            "attacked": float(attacked.mean()),
            "gain": float(gain.mean()),
            "gain_se": float(gain.std(ddof=1) / np.sqrt(len(gain))),
        }
    return {"contexts": len(sizes), "candidates": sizes, "keys": keys, "rules": rows}


def retention_drivers() -> dict[str, float]:
    """What a candidate's retention under the attacker goes with, over all candidates: the
    attacker's similarity, the candidate's length in words, and the generator's own rewording
    (its similarity and its retention)."""
    emb, feat = EmbeddingCache(), BaseFeatures()
    gemma = read_jsonl(OUT / "gemma.jsonl")
    smol = {r["id"]: r for r in read_jsonl(OUT / "smollm2.jsonl")}
    rows = [r for r in gemma if r["attack"] and smol.get(r["id"], {}).get("attack")]
    x = feat(emb([r["text"] for r in rows]).double())
    kept = retention(x, feat(emb([r["attack"] for r in rows]).double())).numpy()
    own = retention(x, feat(emb([smol[r["id"]]["attack"] for r in rows]).double())).numpy()

    def corr(values) -> float:
        return float(np.corrcoef(kept, np.asarray(values, dtype=float))[0, 1])

    return {
        "attacker's similarity": corr([r["similarity"] for r in rows]),
        "length in words": corr([len(r["text"].split()) for r in rows]),
        "generator's rewording: similarity": corr([smol[r["id"]]["similarity"] for r in rows]),
        "generator's rewording: retention": corr(own),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="job", required=True)
    a = sub.add_parser("attack")
    a.add_argument("--contexts", type=int, default=6)
    a.add_argument("--threads", type=int, default=2)
    m = sub.add_parser("measure")
    m.add_argument("--keys", type=int, default=400)
    args = p.parse_args()
    if args.job == "attack":
        attack(args.contexts, args.threads)
        return
    result = measure(args.keys, (0.1, 1.0, 10.0))
    result["retention_correlation"] = retention_drivers()
    (OUT / "measure.json").write_text(json.dumps(result, indent=2) + "\n")
    base = result["rules"]["clean score (shipped)"]["attacked"]
    print(
        f"{result['contexts']} contexts, {sum(result['candidates'])} candidates, {args.keys} keys"
    )
    print(
        "| rule | chosen: clean score | chosen: attacked score | attacked vs shipped "
        "| gain over shipped (se over contexts) |"
    )
    print("|---|---|---|---|---|")
    for name, r in result["rules"].items():
        print(
            f"| {name} | {r['clean']:.2f} | {r['attacked']:.2f} | {r['attacked'] / base:.2f} "
            f"| {r['gain']:+.3f} ({r['gain_se']:.3f}) |"
        )
    print("\nCorrelation of a candidate's retention under the attack with:")
    for name, value in result["retention_correlation"].items():
        print(f"  {name}: {value:.2f}")


if __name__ == "__main__":
    main()
