"""``python -m research.study {pool,pairs,centroids,sweep,prune,plot,attribution}``: the design
study's commands.

Each step writes a file the next one reads, and each resumes a partial file::

    python -m research.study pool --output study/pool.jsonl
    python -m research.study pairs --pool study/pool.jsonl --output study/pairs.jsonl
    python -m research.study centroids --output study/centroids
    python -m research.study sweep --pool study/pool.jsonl --pairs study/pairs.jsonl \
        --centroids study/centroids --output research/study/results.json
    python -m research.study prune --pool study/pool.jsonl --pairs study/pairs.jsonl \
        --centroids study/centroids --output research/study/prune.json
    python -m research.study attribution --eval-config docs/evaluation/confirm-run.yaml \
        --output research/study/attribution.json
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence


def _add_dataclass_flags(parser: argparse.ArgumentParser, cls) -> None:
    for field in dataclasses.fields(cls):
        parser.add_argument(
            "--" + field.name.replace("_", "-"),
            dest=field.name,
            type=type(field.default),
            default=field.default,
        )


def _settings(cls, args: argparse.Namespace):
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in vars(args).items() if k in names})


def main(argv: Sequence[str] | None = None) -> int:
    from .pairs import PairSettings
    from .pool import PoolSettings

    parser = argparse.ArgumentParser(
        prog="python -m research.study",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    pool = sub.add_parser("pool", help="sample candidate sentences at held-out contexts")
    pool.add_argument("--output", required=True, help="pool JSONL (resumable)")
    _add_dataclass_flags(pool, PoolSettings)
    pairs = sub.add_parser("pairs", help="attack pool sentences (LM paraphrase, bigram, WordNet)")
    pairs.add_argument("--pool", required=True)
    pairs.add_argument("--output", required=True, help="pairs JSONL (resumable)")
    _add_dataclass_flags(pairs, PairSettings)
    cents = sub.add_parser("centroids", help="fit k-means centroids per K on the fit split")
    cents.add_argument("--output", required=True, help="folder for the centroid files")
    cents.add_argument("--encoder", default="all-minilm-l6-v2")
    cents.add_argument("--ks", default="8,16,32,64", help="comma-separated K values")
    sweep = sub.add_parser("sweep", help="simulate the design grid and write the table")
    sweep.add_argument("--pool", required=True)
    sweep.add_argument("--pairs", required=True)
    sweep.add_argument("--centroids", required=True, help="folder of `centroids` output")
    sweep.add_argument("--output", required=True, help="results JSON (a .md table beside it)")
    sweep.add_argument("--encoder", default="all-minilm-l6-v2")
    sweep.add_argument("--keys", type=int, default=10)
    sweep.add_argument("--max-new-tokens", type=int, default=200)
    attr = sub.add_parser(
        "attribution", help="where paraphrases take a direction-mark run's evidence"
    )
    attr.add_argument("--eval-config", required=True, help="the evaluation's settings YAML")
    attr.add_argument("--algorithm", default="ksemstamp")
    attr.add_argument("--output", required=True, help="JSON file (a .md table beside it)")
    prune = sub.add_parser("prune", help="simulate pruned rounds of the direction mark")
    prune.add_argument("--pool", required=True)
    prune.add_argument("--pairs", required=True)
    prune.add_argument("--centroids", required=True, help="folder of `centroids` output")
    prune.add_argument("--output", required=True, help="results JSON (.md and .png beside it)")
    prune.add_argument("--encoder", default="all-minilm-l6-v2")
    prune.add_argument("--keys", type=int, default=20)
    prune.add_argument("--max-new-tokens", type=int, default=200)
    plot = sub.add_parser("plot", help="draw the frontier from a sweep's results JSON")
    plot.add_argument("--results", required=True)
    plot.add_argument("--output", required=True, help="PNG file")
    args = parser.parse_args(argv)

    if args.command == "pool":
        from .pool import build_pool

        build_pool(_settings(PoolSettings, args), args.output)
    elif args.command == "pairs":
        from .pairs import build_pairs

        build_pairs(_settings(PairSettings, args), args.pool, args.output)
    elif args.command == "centroids":
        from .design import fit_study_centroids

        ks = [int(k) for k in args.ks.split(",")]
        for path in fit_study_centroids(args.encoder, ks, args.output):
            print(path)
    elif args.command == "attribution":
        from .attribution import run_attribution

        print(run_attribution(args.eval_config, args.algorithm, args.output))
    elif args.command == "prune":
        from .prune import run_prune_study

        run_prune_study(
            args.pool,
            args.pairs,
            args.centroids,
            args.output,
            encoder=args.encoder,
            num_keys=args.keys,
            max_new_tokens=args.max_new_tokens,
        )
    elif args.command == "plot":
        import json

        from .sweep import plot_frontier

        with open(args.results) as f:
            print(plot_frontier(json.load(f), args.output))
    else:
        from .sweep import run_study

        run_study(
            args.pool,
            args.pairs,
            args.centroids,
            args.output,
            encoder=args.encoder,
            num_keys=args.keys,
            max_new_tokens=args.max_new_tokens,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
