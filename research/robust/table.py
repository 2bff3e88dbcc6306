"""One row per feature map from ``runs/robust/bounds-*.json``: the bounds side by side."""

from __future__ import annotations

import json
import sys

from .common import RUNS


def main() -> None:
    names = sys.argv[1:] or sorted(p.stem[7:] for p in RUNS.glob("bounds-*.json"))
    cols = [
        "gemma-reword",
        "gemma-few-shot",
        "gemma-rewrite-window-sum",
        "smollm2-lm-paraphrase",
        "smollm2-lm-bigram",
        "wordnet",
        "merge",
        "split",
    ]
    print(
        "| features | neff/N human | neff/N plain | neff/N selected | score | z selected | "
        + " | ".join(cols)
        + " | merit reword | merit rewrite |"
    )
    print("|" + "---|" * (8 + len(cols)))
    for n in names:
        d = json.loads((RUNS / f"bounds-{n}.json").read_text())
        r = d["retention"]
        cells = [f"{r[c]['median']:.2f}" if r.get(c) else "-" for c in cols]
        m = d.get("merit", {})
        print(
            f"| {n} | {d['human']['neff_share']['median']:.2f} | {d['plain']['neff_share']['median']:.2f} | "
            f"{d['selected']['neff_share']['median']:.2f} | {d['selected']['score']['mean']:.2f} | "
            f"{d['selected']['z']['median']:.2f} | "
            + " | ".join(cells)
            + f" | {m.get('gemma-reword', 0):.2f} | {m.get('gemma-rewrite-window-sum', 0):.2f} |"
        )


if __name__ == "__main__":
    main()
