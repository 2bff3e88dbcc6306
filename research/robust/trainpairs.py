"""Training units for the paraphrase-robust head, from the ``fit`` split and never from the
evaluation's attacker (Gemma-3-270M).

Each source is a window of three consecutive sentences of a ``fit`` article. A window yields
*units*: ``{"id", "doc", "a": [sentences], "b": [sentences], "method"}``, where ``b`` says what
``a`` says in other words or other sentence boundaries:

* ``lm``: one sentence reworded by the generator (SmolLM2-135M-Instruct) under one of several
  prompt styles written for training (chat instructions and few-shot examples that differ from
  the evaluation's), the candidate sharing the fewest words among those close in meaning;
* ``lm-window``: the whole window rewritten by the generator (sentences merged, split, moved);
* ``wordnet``: WordNet synonym substitution;
* ``merge``: two neighbouring sentences joined into one; ``split``: a long sentence cut in two;
* ``recursive``: an ``lm`` paraphrase paraphrased again.

"Close in meaning" is judged by all-mpnet-base-v2 (not the watermark's encoder): cosine in
[0.7, 0.98], word overlap at most 0.85. One JSONL line per window, appended; reruns resume.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ksemstamp.assets import load_encoder, load_lm
from ksemstamp.evaluation.attacks import embed_unit
from ksemstamp.evaluation.edits import merge_pair, split_sentence
from ksemstamp.paraphrase import LMParaphraser
from ksemstamp.text.corpora import news_articles
from ksemstamp.text.splitter import get_splitter
from ksemstamp.training.pairs import word_overlap
from ksemstamp.training.paraphrase import WordNetParaphraser

# Written for training only: none of these examples or instructions is the evaluation's.
_EXAMPLES = (
    (
        "The museum will close for renovations at the end of the month.",
        "At the end of this month the museum shuts its doors so it can be renovated.",
    ),
    (
        "Two people were injured when a truck hit a bus on the highway.",
        "A collision between a lorry and a bus on the motorway left two people hurt.",
    ),
    (
        "The senator said she would vote against the bill unless it was changed.",
        "Without changes to the bill, the senator plans to oppose it, she said.",
    ),
    (
        "Ticket prices for the festival have doubled since last year.",
        "Festival tickets now cost twice what they did a year ago.",
    ),
)
_WINDOW_EXAMPLES = (
    (
        "The school board met on Thursday. It decided to hire ten more teachers. The money will "
        "come from a state grant.",
        "Using a state grant, the school board agreed at its Thursday meeting to take on ten "
        "additional teachers.",
    ),
    (
        "Fans waited for hours outside the stadium. Many had travelled from abroad. The gates "
        "finally opened at noon.",
        "Some of the supporters had come from other countries. They queued outside the stadium "
        "for hours until the gates opened at midday.",
    ),
)
_SYSTEMS = (
    "Reword the user's sentence. Keep every fact, use different words and a different order. "
    "Answer with one sentence only.",
    "Say the user's sentence again in simpler, everyday words. Answer with one sentence only.",
    "Rewrite the user's sentence so that it begins in another way, for example in the passive "
    "voice. Answer with one sentence only.",
)


class ChatStyle:
    def __init__(self, system: str) -> None:
        self.system = system

    def shared(self, tokenizer=None) -> str:
        return ""

    def query(self, sentence: str, tokenizer=None) -> str:
        msgs = [{"role": "system", "content": self.system}]
        for a, b in _EXAMPLES[:2]:
            msgs += [{"role": "user", "content": a}, {"role": "assistant", "content": b}]
        msgs.append({"role": "user", "content": sentence})
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)

    def read(self, reply: str) -> str:
        return reply.strip().split("\n")[0].strip().strip('"').strip()


class FewShotStyle:
    def __init__(self, examples, first: str, second: str) -> None:
        self.examples, self.first, self.second = examples, first, second

    def shared(self, tokenizer=None) -> str:
        return "\n\n".join(f"{self.first}: {a}\n{self.second}: {b}" for a, b in self.examples)

    def query(self, sentence: str, tokenizer=None) -> str:
        return f"\n\n{self.first}: {sentence.strip()}\n{self.second}:"

    def read(self, reply: str) -> str:
        return reply.strip().split("\n")[0].strip()


STYLES = [ChatStyle(s) for s in _SYSTEMS] + [FewShotStyle(_EXAMPLES, "Sentence", "In other words")]
WINDOW_STYLE = FewShotStyle(_WINDOW_EXAMPLES, "Passage", "Rewritten passage")


def source_windows(count: int, seed: int = 0) -> list[dict]:
    splitter = get_splitter()
    out = []
    arts = news_articles("fit")
    random.Random(seed).shuffle(arts)
    for art in arts:
        sents = [s for s in splitter.split(art.text) if 6 <= len(s.split()) <= 45]
        for w in range(0, min(len(sents) - 2, 9), 3):  # up to three windows per article
            out.append(
                {
                    "id": f"{art.article_id}:{w}",
                    "doc": art.article_id,
                    "sentences": sents[w : w + 3],
                }
            )
        if len(out) >= count:
            break
    return out[:count]


def pick(source: str, cands: list[str], sims: list[float], lo=0.7, hi=0.98, overlap=0.85):
    best = None
    for c, s in zip(cands, sims, strict=True):
        if not c or c.strip() == source.strip() or not lo <= s <= hi:
            continue
        o = word_overlap(source, c)
        if o <= overlap and (best is None or o < best[1]):
            best = (c, o, s)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/robust/train-units.jsonl")
    p.add_argument("--windows", type=int, default=1200)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--chunk", type=int, default=8)
    p.add_argument(
        "--reverse",
        action="store_true",
        help="take the windows last first: a second process on another file meets the first",
    )
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    out = Path(a.out)
    have = set()
    if out.exists():
        have = {json.loads(x)["id"] for x in out.read_text().splitlines() if x.strip()}
    todo = [w for w in source_windows(a.windows) if w["id"] not in have]
    if a.reverse:
        todo.reverse()
    lm = load_lm("smollm2-135m-instruct")
    sim_enc = load_encoder("all-mpnet-base-v2")
    splitter = get_splitter()
    wordnet = WordNetParaphraser(rate=0.5)
    paras = [
        LMParaphraser(
            lm=lm, prompts=s, num_candidates=3, batch_size=48, seed=None, max_new_tokens=64
        )
        for s in STYLES
    ]
    windower = LMParaphraser(
        lm=lm, prompts=WINDOW_STYLE, num_candidates=2, batch_size=16, seed=None, max_new_tokens=160
    )
    with out.open("a") as f:
        for start in tqdm(range(0, len(todo), a.chunk), desc="train units"):
            part = todo[start : start + a.chunk]
            style = start // a.chunk % len(STYLES)
            # one sentence of each window goes to the LM (rotating), the others to WordNet only
            pos = [int(w["id"].rsplit(":", 1)[1]) // 3 % 3 for w in part]
            sents = [w["sentences"][t] for w, t in zip(part, pos, strict=True)]
            cands = paras[style].candidates(sents)
            wins = windower.candidates([" ".join(w["sentences"]) for w in part])
            # recursive: the first kept paraphrase of each window again, by the next style
            texts = sents + [c for cs in cands for c in cs]
            emb = embed_unit(sim_enc, texts)
            off, kept = len(sents), []
            for i, cs in enumerate(cands):
                sims = (emb[off : off + len(cs)] @ emb[i]).tolist()
                off += len(cs)
                kept.append(pick(sents[i], cs, sims))
            firsts = [k[0] if k else None for k in kept]
            rec_src = [x for x in firsts if x]
            rec = iter(paras[(style + 1) % len(STYLES)].candidates(rec_src) if rec_src else [])
            wemb = embed_unit(
                sim_enc, [" ".join(w["sentences"]) for w in part] + [c for cs in wins for c in cs]
            )
            woff = len(part)
            for j, w in enumerate(part):
                units = []
                rng = random.Random(w["id"])
                for t, s in enumerate(w["sentences"]):
                    k = kept[j] if t == pos[j] else None
                    if k:
                        units.append(
                            {"a": [s], "b": [k[0]], "method": f"lm{style}", "sim": round(k[2], 3)}
                        )
                    wn = wordnet.paraphrase(s, rng)
                    if wn and wn != s:
                        units.append({"a": [s], "b": [wn], "method": "wordnet"})
                units.append(
                    {
                        "a": w["sentences"][:2],
                        "b": [merge_pair(*w["sentences"][:2])],
                        "method": "merge",
                    }
                )
                sp = split_sentence(w["sentences"][2], min_words=12)
                if len(sp) == 2:
                    units.append({"a": [w["sentences"][2]], "b": sp, "method": "split"})
                wc = wins[j]
                sims = (wemb[woff : woff + len(wc)] @ wemb[j]).tolist()
                woff += len(wc)
                source = " ".join(w["sentences"])
                good = [
                    (c, s)
                    for c, s in zip(wc, sims, strict=True)
                    if 0.7 <= s <= 0.98
                    and word_overlap(source, c) <= 0.85
                    and len(c.split()) <= 1.5 * len(source.split())
                ]
                if good:
                    c, s = max(good, key=lambda x: x[1])
                    b = splitter.split(c)
                    if b and splitter.ends_sentence(b[-1]):
                        units.append(
                            {"a": w["sentences"], "b": b, "method": "lm-window", "sim": round(s, 3)}
                        )
                if firsts[j]:
                    rc = next(rec, [])
                    if rc:
                        src_idx = pos[j]
                        rs = embed_unit(sim_enc, [w["sentences"][src_idx], *rc])
                        r = pick(w["sentences"][src_idx], rc, (rs[1:] @ rs[0]).tolist())
                        if r:
                            units.append(
                                {"a": [w["sentences"][src_idx]], "b": [r[0]], "method": "recursive"}
                            )
                f.write(
                    json.dumps(
                        {
                            "id": w["id"],
                            "doc": w["doc"],
                            "sentences": w["sentences"],
                            "units": units,
                        }
                    )
                    + "\n"
                )
            f.flush()


if __name__ == "__main__":
    main()
