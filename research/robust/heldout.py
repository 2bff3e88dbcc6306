"""Held-out attacker data: what the evaluation's attacker does to sentences it never trained on.

The evaluation attacks with Gemma-3-270M (``ksemstamp.evaluation``). No training pair may come
from it; this module builds the *held-out* side only, on generated sentences of the design
study's pool (``val`` split prompts, so never the evaluation's ``test`` prompts):

* ``reword``: the evaluation's sentence paraphrase (the ``reword`` prompt, 4 samples, the one
  most similar under all-mpnet-base-v2 that differs from the original);
* ``few-shot``: the same model under another prompt (``few-shot`` examples), a second attacker
  that the design is not tuned on;
* ``rewrite``: the evaluation's document-level rewrite of 2-4 sentence windows, over every window
  of the pool's plain continuations (a window with no qualifying candidate is dropped, not kept).

One JSONL line per unit, appended as each chunk finishes; a rerun resumes.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ksemstamp.assets import load_encoder, load_lm
from ksemstamp.evaluation.attacks import embed_unit, select_best
from ksemstamp.evaluation.rewrite import select_window, windows
from ksemstamp.paraphrase import LMParaphraser
from ksemstamp.text.splitter import PunktSplitter

POOL = Path("research/study/data/pool.jsonl")
PAIRS = Path("research/study/data/pairs.jsonl")


def done(path: Path) -> set[str]:
    if not path.exists():
        return set()
    return {json.loads(line)["id"] for line in path.read_text().splitlines() if line.strip()}


def similarities(encoder, originals: list[str], cands: list[list[str]]) -> list[list[float]]:
    """Cosine under ``encoder`` of each candidate to its original, in one encoder pass."""
    emb = embed_unit(encoder, originals + [c for cs in cands for c in cs])
    out, off = [], len(originals)
    for i, cs in enumerate(cands):
        out.append((emb[off : off + len(cs)] @ emb[i]).tolist() if cs else [])
        off += len(cs)
    return out


def attack_sentences(
    rows: list[dict], out: Path, para, sim_encoder, chunk: int = 8, desc=""
) -> None:
    """Append ``{"id", "text", "attack", "similarity"}`` for each row of ``rows`` (``id``,
    ``text``) not yet in ``out``: of ``para``'s candidates, the one most similar under
    ``sim_encoder`` that differs from the text (``select_best``, as the evaluation picks)."""
    have = done(out)
    todo = [r for r in rows if r["id"] not in have]
    with out.open("a") as f:
        for start in tqdm(range(0, len(todo), chunk), desc=desc):
            part = todo[start : start + chunk]
            texts = [r["text"] for r in part]
            cands = para.candidates(texts)
            for r, cs, sims in zip(
                part, cands, similarities(sim_encoder, texts, cands), strict=True
            ):
                k = select_best(r["text"], cs, sims)
                rec = {
                    "id": r["id"],
                    "text": r["text"],
                    "attack": None if k is None else cs[k],
                    "similarity": None if k is None else sims[k],
                }
                f.write(json.dumps(rec) + "\n")
            f.flush()


def sentence_attacks(out: Path, count: int, prompts: str, lm, sim_encoder, chunk: int = 8) -> None:
    rows = [json.loads(line) for line in PAIRS.read_text().splitlines()][:count]
    para = LMParaphraser(lm=lm, prompts=prompts, num_candidates=4, batch_size=32, seed=0)
    attack_sentences(rows, out, para, sim_encoder, chunk, desc=f"gemma {prompts}")


def window_rewrites(out: Path, lm, sim_encoder, splitter) -> None:
    pool = [json.loads(line) for line in POOL.read_text().splitlines()]
    units = []
    for d in pool:
        sents = [c["candidates"][c["chosen"]][0] for c in d["contexts"]]
        sents = [s for s in sents if s]
        for a, b in windows(len(sents), random.Random(f"rewrite|{d['id']}"), 2, 4):
            units.append({"id": f"{d['id']}:{a}-{b}", "doc": d["id"], "sentences": sents[a:b]})
    have = done(out)
    todo = [u for u in units if u["id"] not in have]
    para = LMParaphraser(
        lm=lm, prompts="rewrite", num_candidates=4, batch_size=16, max_new_tokens=200, seed=0
    )
    with out.open("a") as f:
        for start in tqdm(range(0, len(todo), 4), desc="gemma rewrite"):
            part = todo[start : start + 4]
            originals = [" ".join(u["sentences"]) for u in part]
            cands = para.candidates(originals)
            sims_of = similarities(sim_encoder, originals, cands)
            for i, (u, cs, sims) in enumerate(zip(part, cands, sims_of, strict=True)):
                complete = [
                    bool(splitter.split(c)) and splitter.ends_sentence(splitter.split(c)[-1])
                    for c in cs
                ]
                k = select_window(originals[i], cs, sims, complete)
                u = dict(
                    u,
                    rewrite=None if k is None else cs[k],
                    rewrite_sentences=None if k is None else splitter.split(cs[k]),
                    similarity=None if k is None else sims[k],
                )
                f.write(json.dumps(u) + "\n")
            f.flush()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", default="runs/robust/heldout")
    p.add_argument("--sentences", type=int, default=600)
    p.add_argument("--jobs", default="reword,rewrite,few-shot")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lm = load_lm("gemma3-270m")
    sim = load_encoder("all-mpnet-base-v2")
    for job in a.jobs.split(","):
        if job == "rewrite":
            window_rewrites(out / "rewrite.jsonl", lm, sim, PunktSplitter())
        else:
            sentence_attacks(out / f"{job}.jsonl", a.sentences, job, lm, sim)


if __name__ == "__main__":
    main()
