"""Exploratory training of a projection head on frozen base embeddings (research only).

The shipped head is trained by ``train.py fit``; this script explores objectives, sizes and
contexts fast, on cached base-encoder embeddings of the training units (``trainpairs``), and
reports the held-out bounds (``bounds``) of each variant.
"""

from __future__ import annotations

import argparse
import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ksemstamp.centroids import CentroidFile
from ksemstamp.scheme import soft_context_weights

from .common import DEFAULT_CENTROIDS, RUNS, EmbeddingCache, read_jsonl


class Head(nn.Module):
    def __init__(self, mean, comp, dim_out: int = 256, hidden: int = 0, init_whiten: bool = True):
        super().__init__()
        d = mean.numel()
        self.register_buffer("mean", mean.float())
        self.linear = nn.Linear(d, dim_out, bias=False)
        with torch.no_grad():
            if init_whiten and comp is not None:
                q = torch.linalg.qr(comp.float().T).Q  # (d, m)
                proj = torch.eye(d) - q @ q.T
                # start from the default's processing, keeping dim_out random directions of it
                g = torch.Generator().manual_seed(0)
                basis = torch.linalg.qr(proj @ torch.randn(d, dim_out, generator=g)).Q
                self.linear.weight.copy_(basis.T @ proj)
        self.mlp = None
        if hidden:
            self.mlp = nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, dim_out))
            nn.init.zeros_(self.mlp[2].weight)
            nn.init.zeros_(self.mlp[2].bias)

    def forward(self, emb):
        x = emb.float() - self.mean
        h = self.linear(x)
        if self.mlp is not None:
            h = h + self.mlp(emb.float())
        return F.normalize(h, dim=-1)


class HeadFeatures:
    """Features of a trained head: its unit vectors, and the base encoder's soft contexts."""

    def __init__(self, head, centroids, tau: float, regions: bool = True):
        self.head, self.centroids, self.tau, self.regions = head.eval(), centroids, tau, regions

    @torch.no_grad()
    def __call__(self, emb):
        u = self.head(emb).double()
        if not self.regions:
            return u, torch.ones(len(emb), 1, dtype=torch.float64)
        return u, soft_context_weights(emb, self.centroids, self.tau).double()


def unit_features(u, a, owner, count):
    """``(count, K*d)`` summed features ``sum_s a_s (x) u_s`` of the units owning each row."""
    phi = (a.unsqueeze(-1) * u.unsqueeze(1)).flatten(1)  # (S, K*d)
    out = torch.zeros(count, phi.shape[1], dtype=phi.dtype)
    return out.index_add(0, owner, phi)


def contrastive_loss(fa, fb, fs, neg_b, neg_s, tau):
    """InfoNCE of unit A_i against its B_i among every other unit's B and every sentence."""
    fa, fb, fs = F.normalize(fa, dim=-1), F.normalize(fb, dim=-1), F.normalize(fs, dim=-1)
    lb = fa @ fb.T / tau
    ls = fa @ fs.T / tau
    eye = torch.eye(len(fa), dtype=torch.bool)
    lb = lb.masked_fill(~(neg_b | eye), float("-inf"))
    ls = ls.masked_fill(~neg_s, float("-inf"))
    logits = torch.cat([lb, ls], dim=1)
    return F.cross_entropy(logits, torch.arange(len(fa)))


def align_loss(fa, fb, fs, neg_b, neg_s, weight):
    """Retention to 1 and cross-correlations to 0: ``mean(1 - corr(A_i, B_i)) + weight *
    mean(corr(x, y)^2)`` over every pair of units or sentences with no source in common."""
    fa, fb, fs = F.normalize(fa, dim=-1), F.normalize(fb, dim=-1), F.normalize(fs, dim=-1)
    pos = (fa * fb).sum(-1)
    cross_b = (fa @ fb.T)[neg_b]
    cross_s = (fa @ fs.T)[neg_s]
    ss = fs @ fs.T
    off = ~torch.eye(len(fs), dtype=torch.bool)
    cross = torch.cat([cross_b, cross_s, ss[off]])
    return (1 - pos).mean() + weight * (cross**2).mean()


def load_units(path, emb):
    windows = read_jsonl(path)
    sents = sorted(
        {s for w in windows for u in w["units"] for s in u["a"] + u["b"]}
        | {s for w in windows for s in w["sentences"]}
    )
    index = {s: i for i, s in enumerate(sents)}
    E = emb(sents)
    return windows, index, E


def batch_tensors(windows, index, E, feat_ctx):
    """Rows of a batch: units' A and B sentence rows, the windows' sentences, masks."""
    a_rows, a_own, b_rows, b_own, srcs = [], [], [], [], []
    for w in windows:
        for u in w["units"]:
            i = len(srcs)
            srcs.append({(w["id"], s) for s in u["a"]})
            for s in u["a"]:
                a_rows.append(index[s])
                a_own.append(i)
            for s in u["b"]:
                b_rows.append(index[s])
                b_own.append(i)
    s_rows = [index[s] for w in windows for s in w["sentences"]]
    s_keys = [(w["id"], s) for w in windows for s in w["sentences"]]
    n = len(srcs)
    neg_b = torch.tensor([[not (srcs[i] & srcs[j]) for j in range(n)] for i in range(n)])
    neg_s = torch.tensor([[k not in srcs[i] for k in s_keys] for i in range(n)])
    return (
        torch.tensor(a_rows),
        torch.tensor(a_own),
        torch.tensor(b_rows),
        torch.tensor(b_own),
        torch.tensor(s_rows),
        neg_b,
        neg_s,
        n,
    )


def train(args, emb, centroids, fitted):
    windows, index, E = load_units(RUNS / "train-units.jsonl", emb)
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    comp = fitted.components[: args.whiten_init] if args.whiten_init else None
    head = Head(fitted.mean, comp, args.dim, args.hidden)
    if args.regions:
        A = soft_context_weights(E, centroids, args.tau).float()
    else:
        A = torch.ones(len(E), 1)
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, weight_decay=args.wd)
    for epoch in range(args.epochs):
        order = windows[:]
        rng.shuffle(order)
        losses = []
        for start in range(0, len(order) - args.batch + 1, args.batch):
            part = order[start : start + args.batch]
            ar, ao, br, bo, sr, neg_b, neg_s, n = batch_tensors(part, index, E, None)
            rows = torch.cat([ar, br, sr])
            u = head(E[rows])
            a = A[rows]
            na, nb = len(ar), len(br)
            fa = unit_features(u[:na], a[:na], ao, n)
            fb = unit_features(u[na : na + nb], a[na : na + nb], bo, n)
            fs = (a[na + nb :].unsqueeze(-1) * u[na + nb :].unsqueeze(1)).flatten(1)
            if args.loss == "infonce":
                loss = contrastive_loss(fa, fb, fs, neg_b, neg_s, args.temp)
            else:
                loss = align_loss(fa, fb, fs, neg_b, neg_s, args.decor)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss))
        print(f"epoch {epoch}: loss {np.mean(losses):.4f}", flush=True)
    return head


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--name", required=True)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--hidden", type=int, default=0)
    p.add_argument("--regions", type=int, default=1)
    p.add_argument("--tau", type=float, default=0.1)
    p.add_argument("--temp", type=float, default=0.05)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--wd", type=float, default=0.01)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--whiten-init", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loss", default="infonce")
    p.add_argument("--decor", type=float, default=10.0)
    args = p.parse_args()
    emb = EmbeddingCache()
    fitted = CentroidFile.load(DEFAULT_CENTROIDS)
    head = train(args, emb, fitted.centroids.float(), fitted)
    path = RUNS / f"head-{args.name}.pt"
    torch.save({"state": head.state_dict(), "args": vars(args)}, path)
    print(path)


if __name__ == "__main__":
    main()
