"""Which encoder the mark should read, measured without letting the attack's judge favour one.

The evaluation's attacker keeps, of its sampled rewrites, the one most similar to the original
under all-mpnet-base-v2 (the judge). A mark that reads the judge's own encoder would be measured
on the rewrites that encoder finds closest, which flatters its retention. This study keeps every
Gemma-3-270M candidate of held-out sentences (the evaluation's ``reword`` prompt, ``val`` split
pool sentences, as ``research.robust.heldout``), and measures the clause-sum retention of each
mark's features on the candidate chosen by each judge: all-mpnet-base-v2, all-MiniLM-L6-v2, or
a random differing candidate (no judge). Nothing trains on these rewrites.

    python -m research.robust.judges attack --sentences 160
    python -m research.robust.judges measure --features base file:runs/robust/mpnet/centroids-k64.pt
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ksemstamp.assets import load_encoder, load_lm
from ksemstamp.evaluation.attacks import select_best
from ksemstamp.paraphrase import LMParaphraser

from .clauses import sum_retention
from .common import RUNS, EmbeddingCache, read_jsonl, summary
from .features import encoder_of, load_features
from .heldout import PAIRS, done, similarities

OUT = RUNS / "heldout" / "reword-candidates.jsonl"
JUDGES = {"mpnet": "all-mpnet-base-v2", "minilm": "all-minilm-l6-v2"}


def attack(count: int, out: Path = OUT, chunk: int = 8) -> None:
    """Append every Gemma reword candidate of the first ``count`` pool sentences, with each
    judge's similarity to the original (resumable)."""
    rows = [json.loads(line) for line in PAIRS.read_text().splitlines()][:count]
    have = done(out)
    todo = [r for r in rows if r["id"] not in have]
    if not todo:
        return
    para = LMParaphraser(
        lm=load_lm("gemma3-270m"), prompts="reword", num_candidates=4, batch_size=32, seed=1
    )
    judges = {name: load_encoder(spec) for name, spec in JUDGES.items()}
    with out.open("a") as f:
        for start in tqdm(range(0, len(todo), chunk), desc="gemma reword"):
            part = todo[start : start + chunk]
            texts = [r["text"] for r in part]
            cands = para.candidates(texts)
            sims = {name: similarities(enc, texts, cands) for name, enc in judges.items()}
            for i, (r, cs) in enumerate(zip(part, cands, strict=True)):
                rec = {"id": r["id"], "text": r["text"], "candidates": cs}
                rec["similarity"] = {name: s[i] for name, s in sims.items()}
                f.write(json.dumps(rec) + "\n")
            f.flush()


def chosen(rec: dict, judge: str) -> int | None:
    """The candidate a judge keeps: the most similar differing one, or (``random``) a differing
    one drawn by the sentence's id."""
    cs = rec["candidates"]
    if judge == "random":
        differ = [i for i, c in enumerate(cs) if c.strip() != rec["text"].strip()]
        return random.Random(rec["id"]).choice(differ) if differ else None
    return select_best(rec["text"], cs, rec["similarity"][judge])


def measure(specs: list[str], words: int) -> dict:
    """Median clause-sum retention of each feature map on each judge's choice, and the mean
    similarity (both judges) of what each judge chose."""
    recs = read_jsonl(OUT)
    out: dict = {"sentences": len(recs), "features": {}, "chosen_similarity": {}}
    picks = {j: [(r, chosen(r, j)) for r in recs] for j in (*JUDGES, "random")}
    picks = {j: [(r, k) for r, k in pairs if k is not None] for j, pairs in picks.items()}
    for judge, kept in picks.items():
        out["chosen_similarity"][judge] = {
            name: summary(r["similarity"][name][k] for r, k in kept)["mean"] for name in JUDGES
        }
    for spec in specs:
        emb, feat = EmbeddingCache(encoder_of(spec)), load_features(spec)
        out["features"][spec] = {
            judge: sum_retention(
                [([r["text"]], [r["candidates"][k]]) for r, k in kept], emb, feat, words
            )
            for judge, kept in picks.items()
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("attack")
    a.add_argument("--sentences", type=int, default=160)
    a.add_argument("--threads", type=int, default=2)
    m = sub.add_parser("measure")
    m.add_argument("--features", nargs="+", default=["base"])
    m.add_argument("--clause-words", type=int, default=4)
    m.add_argument("--output", default=str(RUNS / "judges.json"))
    args = p.parse_args()
    if args.cmd == "attack":
        torch.set_num_threads(args.threads)
        attack(args.sentences)
        return
    out = measure(args.features, args.clause_words)
    Path(args.output).write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
