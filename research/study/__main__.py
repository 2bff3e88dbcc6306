r"""``python -m research.study {pool,pairs,centroids,sweep,prune,plot,attribution}``: the design
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

Every command also takes ``--config FILE`` (YAML, flag names with underscores as keys, e.g.
``contexts_per_doc: 14``; flags win over files) and ``--print-config``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from jsonargparse import ArgumentParser, Namespace

from ksemstamp.settings_flags import SettingsGroup
from research import cli

from .pairs import PairSettings
from .pool import PoolSettings

POOL = SettingsGroup(PoolSettings, "pool settings")
PAIRS = SettingsGroup(PairSettings, "pair settings")


def _pool_options(p: ArgumentParser) -> None:
    p.add_argument("--output", type=str, required=True, help="pool JSONL (resumable)")
    POOL.add_to(p)


def _pairs_options(p: ArgumentParser) -> None:
    p.add_argument("--pool", type=str, required=True, help="pool JSONL of `pool`")
    p.add_argument("--output", type=str, required=True, help="pairs JSONL (resumable)")
    PAIRS.add_to(p)


def _centroids_options(p: ArgumentParser) -> None:
    p.add_argument("--output", type=str, required=True, help="folder for the centroid files")
    p.add_argument("--encoder", type=str, default="all-minilm-l6-v2")
    p.add_argument("--ks", type=str | int, default="8,16,32,64", help="comma-separated K values")


def _simulation_options(keys: int, output: str):
    def options(p: ArgumentParser) -> None:
        p.add_argument("--pool", type=str, required=True, help="pool JSONL of `pool`")
        p.add_argument("--pairs", type=str, required=True, help="pairs JSONL of `pairs`")
        p.add_argument("--centroids", type=str, required=True, help="folder of `centroids` output")
        p.add_argument("--output", type=str, required=True, help=output)
        p.add_argument("--encoder", type=str, default="all-minilm-l6-v2")
        # dest: jsonargparse's Namespace has a keys() method
        p.add_argument(
            "--keys",
            dest="num_keys",
            type=int,
            default=keys,
            help="keys simulated per design (`num_keys` in a --config file)",
        )
        p.add_argument("--max-new-tokens", type=int, default=200)

    return options


def _attribution_options(p: ArgumentParser) -> None:
    p.add_argument("--eval-config", type=str, required=True, help="the evaluation's settings YAML")
    p.add_argument("--algorithm", type=str, default="ksemstamp")
    p.add_argument("--output", type=str, required=True, help="JSON file (a .md table beside it)")


def _plot_options(p: ArgumentParser) -> None:
    p.add_argument("--results", type=str, required=True, help="results JSON of `sweep`")
    p.add_argument("--output", type=str, required=True, help="PNG file")


COMMANDS = {
    "pool": ("sample candidate sentences at held-out contexts", _pool_options),
    "pairs": ("attack pool sentences (LM paraphrase, bigram, WordNet)", _pairs_options),
    "centroids": ("fit k-means centroids per K on the fit split", _centroids_options),
    "sweep": (
        "simulate the design grid and write the table",
        _simulation_options(10, "results JSON (a .md table beside it)"),
    ),
    "attribution": (
        "where paraphrases take a direction-mark run's evidence",
        _attribution_options,
    ),
    "prune": (
        "simulate pruned rounds of the direction mark",
        _simulation_options(20, "results JSON (.md and .png beside it)"),
    ),
    "plot": ("draw the frontier from a sweep's results JSON", _plot_options),
}


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="python -m research.study",
        description=__doc__,
        env_prefix=False,
        formatter_class=cli.HelpFormatter,
    )
    sub = parser.add_subcommands(required=True, dest="command")
    for name, (help_text, options) in COMMANDS.items():
        command = cli.parser(help_text)
        options(command)
        sub.add_subcommand(name, command, help=help_text)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> tuple[str, Namespace]:
    """The command and its flags; ``pool`` and ``pairs`` get their built settings as
    ``args.settings``."""
    parser = build_parser()
    parsed = cli.parse_args(parser, argv, COMMANDS)
    command, args = parsed.command, parsed[parsed.command]
    group = {"pool": POOL, "pairs": PAIRS}.get(command)
    if group is not None:
        args.settings = cli.build(parser, group, args)
    return command, args


def main(argv: Sequence[str] | None = None) -> int:
    run(*parse_args(argv))
    return 0


def run(command: str, args: Namespace) -> None:
    """Run one command on its parsed flags."""
    if command == "pool":
        from .pool import build_pool

        build_pool(args.settings, args.output)
    elif command == "pairs":
        from .pairs import build_pairs

        build_pairs(args.settings, args.pool, args.output)
    elif command == "centroids":
        from .design import fit_study_centroids

        ks = [int(k) for k in str(args.ks).split(",")]
        for path in fit_study_centroids(args.encoder, ks, args.output):
            print(path)
    elif command == "attribution":
        from .attribution import run_attribution

        print(run_attribution(args.eval_config, args.algorithm, args.output))
    elif command == "plot":
        import json

        from .sweep import plot_frontier

        with open(args.results) as f:
            print(plot_frontier(json.load(f), args.output))
    else:
        from .prune import run_prune_study
        from .sweep import run_study

        study = run_prune_study if command == "prune" else run_study
        study(
            args.pool,
            args.pairs,
            args.centroids,
            args.output,
            encoder=args.encoder,
            num_keys=args.num_keys,
            max_new_tokens=args.max_new_tokens,
        )


if __name__ == "__main__":
    sys.exit(main())
