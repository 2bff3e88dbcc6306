"""Detection and quality metrics of the paper's evaluation.

Detection: AUROC and the ROC curve from torchmetrics, TPR at a fixed FPR read off that curve.
Scores are z-scores, which can be any real number: torchmetrics would squash scores outside
[0, 1] through a sigmoid, so both metrics are built with ``normalization=None``. In torchmetrics
1.9.0 ``BinaryROC`` takes that argument directly and ``BinaryAUROC`` forwards it through its
``**kwargs`` to the precision-recall-curve base class; ``thresholds=None`` keeps every distinct
score as a threshold (exact, no binning).

Quality: perplexity of a continuation given its prompt under an oracle LM, trigram entropy
(Ent-3) and semantic entropy (Sem-Ent: k-means over the oracle's last hidden states). Entropies
use the natural logarithm. (The decisions at a stated alpha are in ``evaluation.scoring``.)
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

# Lower-cased words and single punctuation marks: a tokenizer-independent unit for n-gram
# statistics, so Ent-3 and bigram overlap do not depend on which LM's tokenizer is loaded.
_WORD = re.compile(r"\w+|[^\w\s]")


def words(text: str) -> list[str]:
    """Lower-cased word and punctuation tokens of ``text``."""
    return _WORD.findall(text.lower())


# ---------------------------------------------------------------------- detection


def _as_tensors(
    scores: Sequence[float], labels: Sequence[int], device: str | torch.device = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    preds = torch.as_tensor(list(scores), dtype=torch.float64, device=device)
    target = torch.as_tensor(list(labels), dtype=torch.long, device=device)
    if preds.shape != target.shape or preds.ndim != 1:
        raise ValueError(
            f"scores and labels must be equal-length 1-d, got {preds.shape} {target.shape}"
        )
    if not torch.isfinite(preds).all():
        raise ValueError("scores must be finite (map a missing score to a low finite value)")
    if target.sum() == 0 or target.sum() == len(target):
        raise ValueError("AUROC needs at least one positive and one negative")
    return preds, target


def auroc(
    scores: Sequence[float], labels: Sequence[int], device: str | torch.device = "cpu"
) -> float:
    """Area under the ROC curve; label 1 = watermarked. Tied scores count one half.
    ``device``: where torchmetrics computes it."""
    from torchmetrics.classification import BinaryAUROC

    preds, target = _as_tensors(scores, labels, device)
    metric = BinaryAUROC(thresholds=None, normalization=None).to(preds.device)
    metric.update(preds, target)
    return float(metric.compute())


def roc_curve(
    scores: Sequence[float], labels: Sequence[int], device: str | torch.device = "cpu"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(fpr, tpr, thresholds)``, one point per distinct score, thresholds descending.

    A point at threshold ``t`` calls every text with score ``>= t`` watermarked. Tied scores
    share one threshold, so positives and negatives with equal scores move together: a tie
    never yields a point that separates them. ``device``: where torchmetrics computes it.
    """
    from torchmetrics.classification import BinaryROC

    preds, target = _as_tensors(scores, labels, device)
    metric = BinaryROC(thresholds=None, normalization=None).to(preds.device)
    metric.update(preds, target)
    fpr, tpr, thresholds = metric.compute()
    return fpr.cpu().numpy(), tpr.cpu().numpy(), thresholds.cpu().numpy()


def tpr_at_fpr(fpr: np.ndarray, tpr: np.ndarray, max_fpr: float) -> float:
    """The highest TPR among ROC points whose FPR is at most ``max_fpr``.

    No interpolation between points: a threshold is only counted if it really achieves the FPR
    bound on these negatives. With ``n`` negatives the attainable FPRs are multiples of
    ``1 / n``, so with fewer than 100 negatives "TPR at 1%" means "TPR at zero false positives".
    """
    ok = np.asarray(fpr) <= max_fpr + 1e-12
    return float(np.max(np.asarray(tpr)[ok])) if ok.any() else 0.0


def pairwise_auroc(scores: Sequence[float], labels: Sequence[int]) -> np.ndarray:
    """The positive x negative matrix whose mean is the AUROC: 1 if the positive scores higher,
    1/2 on a tie, 0 otherwise (the Mann-Whitney form of the area under the ROC)."""
    preds, target = _as_tensors(scores, labels)
    pos = preds[target == 1].numpy()[:, None]
    neg = preds[target == 0].numpy()[None, :]
    return (pos > neg) + 0.5 * (pos == neg)


def auroc_interval(
    scores: Sequence[float],
    labels: Sequence[int],
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile interval of the AUROC under a stratified bootstrap.

    Positives and negatives are resampled separately (their counts stay fixed), so the
    interval reflects how much the area would move with other texts from the same sources.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    wins = pairwise_auroc(scores, labels)
    n_pos, n_neg = wins.shape
    rng = np.random.default_rng(seed)
    areas = np.empty(resamples)
    for b in range(resamples):
        rows = rng.integers(0, n_pos, n_pos)
        cols = rng.integers(0, n_neg, n_neg)
        areas[b] = wins[rows][:, cols].mean()
    tail = (1.0 - level) / 2
    low, high = np.quantile(areas, [tail, 1.0 - tail])
    return float(low), float(high)


def detection_metrics(scores: Sequence[float], labels: Sequence[int]) -> dict:
    """AUROC with its 95% bootstrap interval, TPR at FPR 1% and 5%, and the ROC points."""
    fpr, tpr, _ = roc_curve(scores, labels)
    return {
        "auroc": auroc(scores, labels),
        "auroc_ci95": list(auroc_interval(scores, labels)),
        "tpr_at_fpr_1": tpr_at_fpr(fpr, tpr, 0.01),
        "tpr_at_fpr_5": tpr_at_fpr(fpr, tpr, 0.05),
        "positives": int(sum(labels)),
        "negatives": int(len(labels) - sum(labels)),
        "roc": {"fpr": fpr.tolist(), "tpr": tpr.tolist()},
    }


# ---------------------------------------------------------------------- quality


def ngram_entropy(texts: Sequence[str], n: int = 3) -> float:
    """Entropy (nats) of the n-gram distribution pooled over all ``texts`` (Ent-3 for n = 3).

    n-grams are taken within each text over ``words``; a text shorter than ``n`` adds none.
    """
    counts: Counter[tuple[str, ...]] = Counter()
    for text in texts:
        tokens = words(text)
        counts.update(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))
    total = sum(counts.values())
    if total == 0:
        return 0.0
    return -sum(c / total * math.log(c / total) for c in counts.values())


TEXTS_PER_CLUSTER = 5
"""Sem-Ent uses at most one cluster per this many texts: with as many clusters as texts every
text is its own cluster and the entropy is ``log(n)`` whatever the texts say."""


def semantic_entropy(embeddings: np.ndarray, k: int = 50, seed: int = 0) -> tuple[float, int]:
    """Entropy (nats) of the k-means cluster shares of ``embeddings``; returns ``(entropy, k)``.

    ``k`` is lowered to one cluster per ``TEXTS_PER_CLUSTER`` texts when there are fewer (the
    paper uses k = 50 over hundreds of texts), and at least 1 (entropy 0).
    """
    from sklearn.cluster import KMeans

    embeddings = np.asarray(embeddings, dtype=np.float64)
    k = max(1, min(k, len(embeddings) // TEXTS_PER_CLUSTER))
    if k < 2:
        return 0.0, k
    labels = KMeans(n_clusters=k, n_init=10, random_state=seed).fit_predict(embeddings)
    shares = np.bincount(labels, minlength=k) / len(labels)
    shares = shares[shares > 0]
    return float(-(shares * np.log(shares)).sum()), k


@dataclass
class OracleScore:
    """Perplexity of one continuation and the mean of the oracle's last hidden states over it."""

    perplexity: float | None
    num_tokens: int
    embedding: list[float]


class Oracle:
    """Scores continuations with a (larger) causal LM: perplexity and a pooled hidden state.

    Args:
        model, tokenizer: a causal LM, e.g. from ``assets.load_lm``.
        batch_size: texts per forward pass.
    """

    def __init__(self, model, tokenizer, batch_size: int = 4) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size

    @torch.no_grad()
    def score(self, prompts: Sequence[str], texts: Sequence[str]) -> list[OracleScore]:
        """One ``OracleScore`` per text, conditioned on its prompt.

        Only the continuation's tokens count: perplexity is ``exp`` of their mean negative
        log-likelihood, the embedding the mean of the last layer's hidden states over them.
        """
        out: list[OracleScore] = []
        for start in range(0, len(texts), self.batch_size):
            out += self._score_batch(
                prompts[start : start + self.batch_size], texts[start : start + self.batch_size]
            )
        return out

    def _score_batch(self, prompts: Sequence[str], texts: Sequence[str]) -> list[OracleScore]:
        tok = self.tokenizer
        rows, starts = [], []
        for prompt, text in zip(prompts, texts, strict=True):
            head = tok(prompt.strip(), add_special_tokens=True)["input_ids"]
            tail = tok(" " + text.strip(), add_special_tokens=False)["input_ids"]
            rows.append(head + tail)
            starts.append(len(head))
        width = max(len(r) for r in rows)
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        # Right padding: positions then match an unpadded pass, and masked rows are ignored.
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
        device = next(self.model.parameters()).device
        result = self.model(
            input_ids=ids.to(device), attention_mask=mask.to(device), output_hidden_states=True
        )
        logprobs = torch.log_softmax(result.logits.float(), dim=-1).cpu()
        hidden = result.hidden_states[-1].float().cpu()
        scores = []
        for i, (row, start) in enumerate(zip(rows, starts, strict=True)):
            n = len(row) - start
            if n <= 0:
                scores.append(OracleScore(None, 0, []))
                continue
            # Token t is predicted by position t - 1.
            targets = torch.tensor(row[start:])
            nll = -logprobs[i, start - 1 : len(row) - 1].gather(1, targets[:, None]).mean()
            embedding = hidden[i, start : len(row)].mean(0)
            scores.append(OracleScore(float(torch.exp(nll)), n, embedding.tolist()))
        return scores
