"""The paper configuration's public valid-region table, measured on human text.

    python -m research.paper.valid_table --max-texts 3000

For ``configs/ksemstamp-paper.yaml`` (K = 8 k-means regions, gamma = 0.25) it compares three ways
of drawing the table: the reference code's (``valid_mode: paper``: ``torch.randperm`` on a CUDA
generator seeded with ``q * 15485863``, recomputed on the CPU), the same seeds on a CPU
``torch.Generator`` (what ``valid_mode: paper`` drew before the CUDA draw was reproduced), and
keyed tables (``valid_mode: keyed``, many keys). For each: how many regions are valid after
themselves (a random table has ``gamma * K`` = 2 on average), the share of human sentence
transitions that land in a valid region (gamma = 0.25 if regions were independent of the key's
table, which human text is), and the share of human texts each p-value flags at 1%.

Human texts: the calibration's held-out pieces (news ``val``/``test`` splits, House of Commons
speeches, health-news tweets; ``ksemstamp.text.corpora.human_texts``), scored exactly as the detector
scores them. Writes ``research/paper/valid-table.json`` and ``valid-table.md``.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jsonargparse import ArgumentParser

from ksemstamp.builders import build_scheme
from ksemstamp.calibration import embedding_store, p_values, score_texts, with_cached_encoder
from ksemstamp.keys import PAPER_PRIME, num_valid, valid_table
from ksemstamp.settings_files import load_watermark_settings
from ksemstamp.text.corpora import SOURCES, human_texts

ROOT = Path(__file__).resolve().parents[2]
OUTPUT = Path(__file__).resolve().parent / "valid-table.json"
ALPHA = 0.01


def cpu_seeded_table(num_regions: int, gamma: float) -> np.ndarray:
    """The reference seeding drawn by a CPU ``torch.Generator`` instead of a CUDA one."""
    table = np.zeros((num_regions, num_regions), dtype=bool)
    for q in range(num_regions):
        gen = torch.Generator().manual_seed(q * PAPER_PRIME)
        chosen = torch.randperm(num_regions, generator=gen)[: num_valid(num_regions, gamma)]
        table[q, chosen.numpy()] = True
    return table


def table_figures(
    table: np.ndarray, counts: np.ndarray, labels: Sequence[str], scored, gamma: float
) -> dict[str, Any]:
    """Self-valid regions, valid rate of human transitions (pooled; per source) and the share
    of texts flagged at ``ALPHA`` by each statistic, under one table."""
    valid = np.einsum("nij,ij->n", counts, table.astype(np.int64))
    total = counts.sum(axis=(1, 2))
    labels = np.asarray(labels)
    p = p_values(scored, table, gamma)
    return {
        "self_valid": int(np.trace(table)),
        "valid_rate": float(valid.sum() / total.sum()),
        "valid_rate_by_source": {
            s: float(valid[labels == s].sum() / total[labels == s].sum())
            for s in dict.fromkeys(labels)
        },
        "flagged": {stat: float(np.mean(v <= ALPHA)) for stat, v in p.items()},
    }


def measure(
    config: str, sources: Sequence[str], max_texts: int, num_keys: int, seed: int
) -> dict[str, Any]:
    """Every figure of the module docstring for ``config``'s partition and gamma."""
    started = time.perf_counter()
    cfg = load_watermark_settings([config], {"key": "valid-table-measurement"})
    scheme = build_scheme(cfg)
    k, gamma = scheme.num_regions, cfg.mark.gamma
    texts, available = human_texts(scheme.splitter, sources, max_texts, seed=seed)
    scheme = with_cached_encoder(scheme, embedding_store(scheme.encoder))
    scored = score_texts(scheme, [t.text for t in texts], [t.source for t in texts], progress=True)
    transitions = scored.counts.sum(axis=0)
    same_region = float(np.trace(transitions) / transitions.sum())

    def figures(table: np.ndarray) -> dict[str, Any]:
        return table_figures(table, scored.counts, scored.labels, scored, gamma)

    reference = valid_table(k, gamma, None, "paper").numpy()
    keyed = [
        figures(valid_table(k, gamma, f"valid-table|{seed}|{i}").numpy()) for i in range(num_keys)
    ]
    return {
        "command": "python -m research.paper.valid_table " + shlex.join(sys.argv[1:]),
        "config": str(Path(config).resolve().relative_to(ROOT)),
        "num_regions": k,
        "gamma": gamma,
        "texts": len(scored),
        "texts_by_source": {s: int(np.sum(np.asarray(scored.labels) == s)) for s in sources},
        "available_by_source": available,
        "scored_transitions": int(transitions.sum()),
        "human_same_region_share": same_region,
        "tables": {
            "paper": {
                "rows": [np.flatnonzero(r).tolist() for r in reference],
                **figures(reference),
            },
            "cpu_seeded": {
                "rows": [np.flatnonzero(r).tolist() for r in cpu_seeded_table(k, gamma)],
                **figures(cpu_seeded_table(k, gamma)),
            },
            "keyed": {
                "keys": num_keys,
                "self_valid_mean": float(np.mean([f["self_valid"] for f in keyed])),
                "valid_rate_mean": float(np.mean([f["valid_rate"] for f in keyed])),
                "valid_rate_range": [
                    float(min(f["valid_rate"] for f in keyed)),
                    float(max(f["valid_rate"] for f in keyed)),
                ],
                "flagged_mean": {
                    stat: float(np.mean([f["flagged"][stat] for f in keyed]))
                    for stat in keyed[0]["flagged"]
                },
            },
        },
        "seconds": round(time.perf_counter() - started, 1),
    }


def markdown(r: dict[str, Any]) -> str:
    """The table of ``measure``'s figures."""
    t = r["tables"]

    def row(name: str, f: dict[str, Any]) -> str:
        by = ", ".join(f"{s} {v:.1%}" for s, v in f["valid_rate_by_source"].items())
        return (
            f"| {name} | {f['self_valid']} of {r['num_regions']} | {f['valid_rate']:.1%} ({by}) "
            f"| {f['flagged']['paper']:.1%} | {f['flagged']['exact']:.1%} |"
        )

    keyed = t["keyed"]
    lo, hi = keyed["valid_rate_range"]
    return "\n".join(
        [
            "# The paper configuration's valid-region table on human text",
            "",
            f"`{r['config']}`: K = {r['num_regions']}, gamma = {r['gamma']}. {r['texts']} human "
            f"texts ({', '.join(f'{s} {n}' for s, n in r['texts_by_source'].items())}), "
            f"{r['scored_transitions']} scored sentence transitions, of which "
            f"{r['human_same_region_share']:.1%} stay in their region. Command: `{r['command']}`.",
            "",
            "| table | regions valid after themselves | human transitions landing valid "
            "(gamma = 25%) | human texts flagged at 1%: paper z | exact test |",
            "|---|---|---|---|---|",
            row("`valid_mode: paper` (the reference code's CUDA draw)", t["paper"]),
            row("the same seeds on a CPU generator", t["cpu_seeded"]),
            f"| `valid_mode: keyed`, mean of {keyed['keys']} keys | {keyed['self_valid_mean']:.2f} "
            f"| {keyed['valid_rate_mean']:.1%} (keys: {lo:.1%} to {hi:.1%}) "
            f"| {keyed['flagged_mean']['paper']:.1%} | {keyed['flagged_mean']['exact']:.1%} |",
            "",
            f"Rows of the reference table (valid regions after region q = 0..{r['num_regions'] - 1}): "
            + ", ".join(str(x) for x in t["paper"]["rows"])
            + "; of the CPU-seeded one: "
            + ", ".join(str(x) for x in t["cpu_seeded"]["rows"])
            + ".",
            "",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__.split("\n\n")[0], env_prefix=False)
    p.add_argument("--config", type=str, default=str(ROOT / "configs" / "ksemstamp-paper.yaml"))
    p.add_argument("--sources", type=str, default=",".join(SOURCES), help="comma-separated")
    p.add_argument("--max-texts", type=int, default=3000, help="human texts over all sources")
    p.add_argument("--num-keys", type=int, default=50, help="keyed tables to compare with")
    p.add_argument("--seed", type=int, default=0, help="sample of texts and keyed tables")
    p.add_argument("--output", type=str, default=str(OUTPUT), help="JSON (Markdown beside it)")
    args = p.parse_args(argv)
    result = measure(args.config, args.sources.split(","), args.max_texts, args.num_keys, args.seed)
    out = Path(args.output)
    out.write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(result)
    out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
