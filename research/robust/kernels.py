"""Which kernel between sentences serves detection best (research only).

Any key-free feature map ``phi`` gives scores ``<N, phi(x)>`` that are exactly Gaussian over keys
with covariance ``k(x, y) = <phi(x), phi(y)>``, so a design can be judged by its kernel alone,
before any feature map is built:

* retention under the held-out attacker: ``k(x, x') / sqrt(k(x, x) k(x', x'))``;
* effective sentences per text ``N^2 / sum k`` (held-out human news, and generated texts);
* selection gain: the expected best of a context's 32 pool candidates, whose scores are jointly
  normal with covariance ``k`` among them (Monte Carlo).

``merit = gain * retention * sqrt(effective share)``: the paraphrased z of a text, up to its
length. Kernels compared: the default's ``(a . a')(u . u')`` and sharpened variants.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch

from ksemstamp.text.splitter import get_splitter

from .bounds import human_texts, pair_sets, pool_docs
from .common import RUNS, BaseFeatures, EmbeddingCache, read_jsonl

KERNELS = {
    "u (pcs64)": lambda f, g: f["u"] @ g["u"].T,
    "a*u (default)": lambda f, g: (f["a"] @ g["a"].T) * (f["u"] @ g["u"].T),
    "e raw": lambda f, g: f["e"] @ g["e"].T,
    "c (centred)": lambda f, g: f["c"] @ g["c"].T,
    "a*c": lambda f, g: (f["a"] @ g["a"].T) * (f["c"] @ g["c"].T),
    "a only": lambda f, g: f["a"] @ g["a"].T,
}
for beta in (2, 4, 8):
    KERNELS[f"exp{beta}(c)"] = lambda f, g, b=beta: torch.exp(b * (f["c"] @ g["c"].T - 1))
    KERNELS[f"exp{beta}(u)"] = lambda f, g, b=beta: torch.exp(b * (f["u"] @ g["u"].T - 1))
    KERNELS[f"a*exp{beta}(c)"] = lambda f, g, b=beta: (
        (f["a"] @ g["a"].T) * torch.exp(b * (f["c"] @ g["c"].T - 1))
    )
for p in (2, 3):
    KERNELS[f"c^{p}"] = lambda f, g, p=p: (f["c"] @ g["c"].T) ** p
    KERNELS[f"u^{p}"] = lambda f, g, p=p: (f["u"] @ g["u"].T) ** p


def feats(emb, base: BaseFeatures, base0: BaseFeatures):
    u, a = base(emb)
    c, _ = base0(emb)
    return {"u": u, "a": a, "e": torch.nn.functional.normalize(emb.double(), dim=-1), "c": c}


def neff(k):
    d = k.diagonal().sqrt()
    k = k / d[:, None] / d[None, :]
    return float(len(k) ** 2 / k.sum())


def main() -> None:
    emb = EmbeddingCache()
    base, base0 = BaseFeatures(), BaseFeatures(whiten=0)
    sets = pair_sets()
    pairs = sets["gemma-reword"]
    f1 = feats(emb([a for a, _ in pairs]), base, base0)
    f2 = feats(emb([b for _, b in pairs]), base, base0)
    humans = [feats(emb(t), base, base0) for t in human_texts(200)]
    splitter = get_splitter()
    gens = []
    for path in sys.argv[1:]:
        for r in read_jsonl(path):
            if r.get("status") == "ok":
                gens.append(feats(emb(splitter.split(r["text"])), base, base0))
    contexts = []
    for d in pool_docs():
        for c in d["contexts"][:6]:
            cands = [t for t, _ in c["candidates"] if t]
            if len(cands) >= 16:
                contexts.append(feats(emb(cands), base, base0))
    rng = np.random.default_rng(0)
    rows = []
    for name, kern in KERNELS.items():
        k12 = torch.stack(
            [
                kern(
                    {x: v[i : i + 1] for x, v in f1.items()},
                    {x: v[i : i + 1] for x, v in f2.items()},
                )[0, 0]
                for i in range(len(pairs))
            ]
        )
        k11 = torch.stack(
            [
                kern(
                    {x: v[i : i + 1] for x, v in f1.items()},
                    {x: v[i : i + 1] for x, v in f1.items()},
                )[0, 0]
                for i in range(len(pairs))
            ]
        )
        k22 = torch.stack(
            [
                kern(
                    {x: v[i : i + 1] for x, v in f2.items()},
                    {x: v[i : i + 1] for x, v in f2.items()},
                )[0, 0]
                for i in range(len(pairs))
            ]
        )
        ret = float((k12 / (k11 * k22).sqrt()).median())
        hn = float(np.median([neff(kern(h, h)) / len(h["u"]) for h in humans]))
        gn = (
            float(np.median([neff(kern(g, g)) / len(g["u"]) for g in gens]))
            if gens
            else float("nan")
        )
        gains = []
        for c in contexts:
            k = kern(c, c).numpy()
            d = np.sqrt(np.diag(k))
            k = k / d[:, None] / d[None, :]
            w, v = np.linalg.eigh(k)
            draws = rng.standard_normal((400, len(k))) @ (v * np.sqrt(np.clip(w, 0, None))).T
            gains.append(draws.max(axis=1).mean())
        gain = float(np.mean(gains))
        rows.append((name, ret, hn, gn, gain, gain * ret * np.sqrt(hn)))
    print("| kernel | retention (gemma) | neff share human | neff share generated | gain | merit |")
    print("|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: -r[-1]):
        print(f"| {r[0]} | {r[1]:.3f} | {r[2]:.3f} | {r[3]:.3f} | {r[4]:.2f} | {r[5]:.3f} |")
    (RUNS / "kernels.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
