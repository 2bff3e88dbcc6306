"""Measure how well an encoder and its centroids keep paraphrases in one region.

    ksemstamp agreement --encoder all-minilm-l6-v2 --pairs data/pairs/news-val.jsonl \
        --fit_sentences 20000 --k 8
    ksemstamp agreement --encoder checkpoints/encoder-news \
        --centroids checkpoints/centroids-encoder-news-k64.pt --pairs data/pairs/news-val.jsonl

Reports, over held-out pairs (overall and per paraphrase method):

* ``region_agreement``: share of pairs whose text and paraphrase share a k-means region;
* ``region_agreement_margin``: the same among texts that pass the generation margin ``m``
  (the watermark only ever emits such sentences, so this is the share that matters for it);
* ``region_agreement_top``: the same among the ``--top_share`` of texts farthest from a region
  boundary (largest gap between the two nearest centroids), with ``top_margin`` the margin
  that keeps that share. The margin ``m`` is a cosine threshold, and fine-tuning changes the
  scale of cosines, so one ``m`` rejects different shares of candidates for different
  encoders; at a fixed share the comparison is at equal sampling cost;
* ``chance_agreement``: agreement if the paraphrase's region were an independent draw from the
  texts' region frequencies (sum of squared shares), the level a useless encoder reaches;
* ``region_kappa``: agreement beyond chance, ``(agreement - chance) / (1 - chance)`` (Cohen's
  kappa with the texts' shares for both sides). Raw agreement also rises when regions merely
  become unequal in size; kappa does not reward that;
* ``cos_gap``: cos(text, own paraphrase) minus cos(text, hardest other paraphrase) within
  consecutive batches of ``--batch_size`` pairs, as logged during validation;
* ``pos_cos``: mean cos(text, own paraphrase).
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Iterable, Sequence
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from ..io import write_json_atomic
from ..jsonl import read_jsonl_objects
from ..plots import pyplot_for, save_figure
from ..scheme.centroids import DEFAULT_REGIONS
from ..settings.checks import Range
from ..settings.groups import RegionSearch

if TYPE_CHECKING:
    import torch

# torch, Lightning and the partition are imported where they are used: the ``agreement``
# command's options are read without them.


def agreement_report(
    text_emb: torch.Tensor,
    para_emb: torch.Tensor,
    centroids: torch.Tensor,
    margin: float = RegionSearch.margin,
    batch_size: int = 32,
    top_share: float = 0.7,
) -> dict[str, float]:
    """Region agreement (all, margin-passing, top share by margin), chance level, cosine gap."""
    import torch

    from ..scheme.partition import kmeans_gap, kmeans_regions
    from .loss import cosine_gap

    text_regions, text_ok = kmeans_regions(text_emb, centroids, margin)
    para_regions, _ = kmeans_regions(para_emb, centroids, 0.0)
    same = (text_regions == para_regions).float()
    _, gap = kmeans_gap(text_emb, centroids)
    keep = max(1, round(top_share * len(gap)))
    top = torch.topk(gap, keep).indices
    shares = torch.bincount(text_regions, minlength=centroids.shape[0]).double() / len(text_regions)
    gaps = [
        cosine_gap(text_emb[i : i + batch_size], para_emb[i : i + batch_size])
        for i in range(0, len(text_emb), batch_size)
        if len(text_emb[i : i + batch_size]) >= 2
    ]
    chance = float((shares**2).sum())
    return {
        "pairs": len(same),
        "region_agreement": float(same.mean()),
        "region_kappa": (float(same.mean()) - chance) / (1.0 - chance) if chance < 1 else 0.0,
        "region_agreement_margin": float(same[text_ok].mean()) if text_ok.any() else float("nan"),
        "margin_pass_rate": float(text_ok.float().mean()),
        "region_agreement_top": float(same[top].mean()),
        "top_share": keep / len(gap),
        "top_margin": float(gap[top].min()),
        "chance_agreement": chance,
        "cos_gap": float(torch.cat(gaps).mean()) if gaps else float("nan"),
        "pos_cos": float(torch.nn.functional.cosine_similarity(text_emb, para_emb).mean()),
    }


def evaluate(
    encoder_spec: str,
    pairs: str | Path | Sequence[str | Path],
    centroids_file: str | None = None,
    fit_sentences: int = 20000,
    k: int = DEFAULT_REGIONS,
    seeds: Sequence[int] = (0,),
    margin: float = RegionSearch.margin,
    batch_size: int = 32,
    top_share: float = 0.7,
) -> dict:
    """Embed the pairs and report agreement overall and per ``method`` of the pair file(s).

    Several pair files are read one after the other; a pair whose text already appeared is
    skipped, so a text counts once.

    With ``centroids_file`` the file's centroids are used (after a fingerprint check); otherwise
    centroids are fitted once per k-means seed in ``seeds``, the domain sentences embedded once,
    and the report adds the mean and spread of region agreement over seeds.
    """
    from ..assets import encoder_fingerprint, load_encoder
    from ..scheme.centroids import CentroidFile, fit_kmeans
    from ..scheme.encoding import embed
    from ..text.corpora import domain_sentences

    encoder = load_encoder(encoder_spec)
    files = [pairs] if isinstance(pairs, str | Path) else list(pairs)
    rows = _distinct_pairs(files)
    text_emb = embed(encoder, [r["text"] for r in rows])
    para_emb = embed(encoder, [r["paraphrase"] for r in rows])
    groups = _method_groups(rows)

    def report_for(centroids: torch.Tensor) -> dict:
        """Agreement under ``centroids``, for every group of pairs."""
        return {
            name: agreement_report(
                text_emb[idx], para_emb[idx], centroids, margin, batch_size, top_share
            )
            for name, idx in groups.items()
        }

    head = {"encoder": encoder_spec, "pair_files": [str(f) for f in files]}
    if centroids_file:
        loaded = CentroidFile.load(centroids_file)
        loaded.check_encoder(encoder_fingerprint(encoder), encoder_spec)
        return {
            **head,
            "centroids": centroids_file,
            "margin": margin,
            **report_for(loaded.centroids),
        }
    # The same recipe as KMeansCallback and `ksemstamp centroids`.
    docs = domain_sentences(max_sentences=fit_sentences)
    flat = [s for doc in docs for s in doc]
    domain = embed(encoder, flat, progress=True)
    per_seed = {seed: report_for(fit_kmeans(domain, k=k, seed=seed)) for seed in seeds}
    report = {
        **head,
        "centroids": f"fitted on {len(flat)} news fit-split sentences, seed {seeds[0]}",
        "margin": margin,
        **per_seed[seeds[0]],
    }
    if len(seeds) > 1:
        report["over_seeds"] = {"seeds": list(seeds), **_over_seeds(per_seed, seeds, groups)}
    return report


def _distinct_pairs(files: Sequence[str | Path]) -> list[dict]:
    """The pairs of ``files``, read one after the other, each text once (its first pair)."""
    from .data import distinct_texts

    return distinct_texts(
        [row for path in files for row in read_jsonl_objects(path)], itemgetter("text")
    )


def _method_groups(rows: list[dict]) -> dict[str, torch.Tensor]:
    """Indices of the pairs reported together: ``all``, and each paraphrase ``method`` with at
    least two pairs."""
    import torch

    groups = {"all": torch.arange(len(rows))}
    for method in sorted({r.get("method", "unknown") for r in rows}):
        idx = [i for i, r in enumerate(rows) if r.get("method", "unknown") == method]
        if len(idx) >= 2:
            groups[method] = torch.tensor(idx)
    return groups


def _over_seeds(
    per_seed: dict[int, dict], seeds: Sequence[int], groups: Iterable[str]
) -> dict[str, dict[str, float]]:
    """Mean, spread and range over the k-means ``seeds`` of each group's region agreement and
    kappa, by ``group/statistic``."""
    import torch

    summary = {}
    for name in groups:
        for key in (
            "region_agreement",
            "region_agreement_margin",
            "region_agreement_top",
            "region_kappa",
        ):
            values = torch.tensor([per_seed[s][name][key] for s in seeds])
            summary[f"{name}/{key}"] = {
                "mean": float(values.mean()),
                "sd": float(values.std()),
                "min": float(values.min()),
                "max": float(values.max()),
            }
    return summary


def plot_agreement(reports: dict[str, dict], path: str | Path) -> None:
    """Bar charts per pair group (all, and each paraphrase method), one bar per report: region
    agreement over all pairs, agreement beyond chance (kappa) and agreement among the top share
    of texts by boundary gap, the last two when every report has them. Whiskers span the k-means
    seeds when a report has several."""
    plt = pyplot_for(path)
    if plt is None:
        return

    first = next(iter(reports.values()))
    groups = [g for g, v in first.items() if isinstance(v, dict) and "region_agreement" in v]
    groups = [g for g in groups if all(isinstance(r.get(g), dict) for r in reports.values())]
    width = 0.8 / len(reports)
    panels = {"region_agreement": "region agreement, all pairs"}
    if all("region_kappa" in r[groups[0]] for r in reports.values()):
        panels["region_kappa"] = "agreement beyond chance (kappa)"
    if all("region_agreement_top" in r[groups[0]] for r in reports.values()):
        share = first[groups[0]]["top_share"]
        panels["region_agreement_top"] = f"agreement, {share:.0%} of texts farthest from a boundary"
    fig, axes = plt.subplots(
        1, len(panels), figsize=(1.0 + 3.4 * len(panels), 3.9), sharey=True, squeeze=False
    )
    lowest = 1.0
    for ax, (key, title) in zip(axes[0], panels.items(), strict=True):
        for j, (label, report) in enumerate(reports.items()):
            x = [i + (j - (len(reports) - 1) / 2) * width for i in range(len(groups))]
            heights, low, high = [], [], []
            for g in groups:
                seeds = report.get("over_seeds", {}).get(f"{g}/{key}")
                mean = seeds["mean"] if seeds else report[g][key]
                heights.append(mean)
                low.append(mean - seeds["min"] if seeds else 0.0)
                high.append(seeds["max"] - mean if seeds else 0.0)
                lowest = min(lowest, mean - low[-1])
            ax.bar(x, heights, width, yerr=[low, high], capsize=3, label=label)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([f"{g}\n({first[g]['pairs']} pairs)" for g in groups], fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    # Differences between encoders are a few points: start the axis near the lowest bar.
    axes[0][0].set_ylim(max(0.0, math.floor(lowest * 10) / 10 - 0.1), 1.0)
    axes[0][0].set_ylabel("share of held-out pairs")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(reports), fontsize=8, frameon=False)
    fig.suptitle("Text and paraphrase in one k-means region", fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def _default(name: str):
    """``evaluate``'s default of ``name``: the command's flags default to it."""
    return inspect.signature(evaluate).parameters[name].default


def agreement(
    encoder: str,
    pairs: list[str],
    centroids: str | None = None,
    fit_sentences: Annotated[int, Range(1, 10_000_000)] = _default("fit_sentences"),
    k: Annotated[int, Range(2, 4096)] = _default("k"),
    seeds: list[int] | None = None,
    margin: float = _default("margin"),
    batch_size: Annotated[int, Range(1, 4096)] = _default("batch_size"),
    top_share: float = _default("top_share"),
    output: str | None = None,
    compare: list[str] | None = None,
    label: str | None = None,
    plot: str | None = None,
) -> int:
    """Measure how well an encoder and its centroids keep a text and its paraphrase in one region.

    Args:
        encoder: encoder spec (alias, folder, Hub id).
        pairs: JSONL pair files, held out from training (a,b or the flag again).
        centroids: the centroid file of this encoder (else they are fitted here).
        fit_sentences: sentences the centroids are fitted on, when they are fitted here.
        k: regions, when the centroids are fitted here (the default mark's K; paper: 8).
        seeds: k-means seeds when fitting centroids (default: 0).
        margin: the generation margin (the region mark's).
        batch_size: pairs per batch for the cosine gap.
        top_share: share of texts farthest from a boundary for region_agreement_top, (0, 1].
        output: also write the report as JSON here.
        compare: earlier reports to plot beside this one, as LABEL=REPORT.json.
        label: this encoder's label in the plot (default: the encoder).
        plot: write a bar chart of region agreement (PNG) here.
    """
    if not 0.0 < top_share <= 1.0:
        raise ValueError(f"top_share must be in (0, 1], got {top_share}")
    earlier = {}
    for item in compare or []:
        name, sep, path = item.partition("=")
        if not sep:
            raise ValueError(f"compare takes LABEL=REPORT.json, got {item!r}")
        earlier[name] = json.loads(Path(path).read_text())
    report = evaluate(
        encoder,
        pairs,
        centroids,
        fit_sentences,
        k,
        seeds or [0],
        margin,
        batch_size,
        top_share,
    )
    print(json.dumps(report, indent=2))
    if output:
        write_json_atomic(output, report)
    if plot:
        plot_agreement({**earlier, label or encoder: report}, plot)
        print(f"wrote {plot}")
    return 0
