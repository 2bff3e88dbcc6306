"""Exploratory fine-tuning of the sentence encoder itself (research only): full weights or a
low-rank adapter, with the alignment-and-decorrelation objective of ``head`` on training units.

Writes ``runs/robust/ft-NAME/`` (a sentence-transformers folder, adapter merged) and its centroid
file (K = 64, mean and components refitted on ``fit`` news sentences), which ``bounds
--features ft:NAME`` reads.
"""

from __future__ import annotations

import argparse
import math
import random

import torch
import torch.nn.functional as F
from torch import nn

from ksemstamp.assets import load_encoder
from ksemstamp.centroids import CentroidFile, fit_centroid_file

from .common import DEFAULT_CENTROIDS, RUNS, cache_path, read_jsonl
from .head import align_loss, batch_tensors, contrastive_loss, unit_features


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        self.base = base
        for p in self.base.parameters():
            p.requires_grad_(False)
        self.a = nn.Parameter(torch.randn(rank, base.in_features) / math.sqrt(base.in_features))
        self.b = nn.Parameter(torch.zeros(base.out_features, rank))
        self.scale = alpha / rank

    def forward(self, x):
        return self.base(x) + (x @ self.a.T @ self.b.T) * self.scale

    def merged(self) -> nn.Linear:
        with torch.no_grad():
            self.base.weight += (self.b @ self.a) * self.scale
        return self.base


TARGETS = ("query", "key", "value", "attention.output.dense", "intermediate.dense", "output.dense")


def add_lora(model, rank: int, alpha: float) -> list[str]:
    for p in model.parameters():
        p.requires_grad_(False)
    names = []
    for name, mod in list(model.named_modules()):
        for child_name, child in list(mod.named_children()):
            full = f"{name}.{child_name}"
            if (
                isinstance(child, nn.Linear)
                and any(full.endswith(t) for t in TARGETS)
                and ".layer." in full
            ):
                setattr(mod, child_name, LoRALinear(child, rank, alpha))
                names.append(full)
    return names


def merge_lora(model) -> None:
    for _, mod in list(model.named_modules()):
        for child_name, child in list(mod.named_children()):
            if isinstance(child, LoRALinear):
                setattr(mod, child_name, child.merged())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--name", required=True)
    p.add_argument("--lora", type=int, default=8)
    p.add_argument("--alpha", type=float, default=16)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=6)
    p.add_argument("--loss", default="align")
    p.add_argument("--decor", type=float, default=10.0)
    p.add_argument("--temp", type=float, default=0.05)
    p.add_argument("--windows", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--whiten", type=int, default=64)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = load_encoder("all-minilm-l6-v2")
    model.max_seq_length = 128
    if a.lora:
        names = add_lora(model, a.lora, a.alpha)
        print("lora on", len(names), "linears")
    model.train()
    fitted = CentroidFile.load(DEFAULT_CENTROIDS)
    mean = fitted.mean.float()
    comp = torch.linalg.qr(fitted.components[: a.whiten].float().T).Q.T if a.whiten else None
    windows = read_jsonl(RUNS / "train-units.jsonl")
    if a.windows:
        windows = windows[: a.windows]
    params = [q for q in model.parameters() if q.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.01)
    total = a.epochs * (len(windows) // a.batch)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / (0.1 * total + 1)) * max(0.0, 1 - s / total)
    )
    rng = random.Random(0)
    step = 0
    for epoch in range(a.epochs):
        order = windows[:]
        rng.shuffle(order)
        for start in range(0, len(order) - a.batch + 1, a.batch):
            part = order[start : start + a.batch]
            sents = sorted(
                {s for w in part for u in w["units"] for s in u["a"] + u["b"]}
                | {s for w in part for s in w["sentences"]}
            )
            index = {s: i for i, s in enumerate(sents)}
            feats = model.preprocess(sents)
            E = model(feats)["sentence_embedding"]
            u = F.normalize(E, dim=-1) - mean
            if a.whiten:
                u = u - (u @ comp.T) @ comp
            u = F.normalize(u, dim=-1)
            ar, ao, br, bo, sr, neg_b, neg_s, n = batch_tensors(part, index, E, None)
            one = torch.ones(len(sents), 1)
            fa = unit_features(u[ar], one[ar], ao, n)
            fb = unit_features(u[br], one[br], bo, n)
            fs = u[sr]
            if a.loss == "align":
                loss = align_loss(fa, fb, fs, neg_b, neg_s, a.decor)
            else:
                loss = contrastive_loss(fa, fb, fs, neg_b, neg_s, a.temp)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            if step % 10 == 0:
                print(f"epoch {epoch} step {step}/{total} loss {float(loss):.4f}", flush=True)
    if a.lora:
        merge_lora(model)
    model.eval()
    out = RUNS / f"ft-{a.name}"
    model.save(str(out))
    cache_path(str(out)).unlink(missing_ok=True)  # embeddings of an earlier model of this name
    fitted = fit_centroid_file(str(out), k=64, max_sentences=6000, progress=False)
    fitted.save(out / "centroids-k64.pt")
    print(out)


if __name__ == "__main__":
    main()
