"""The training command line: LightningCLI over ``EncoderModule`` and ``PairDataModule``.

``train.py`` at the top of the checkout and ``ksemstamp train`` both run it::

    python train.py fit --config configs/train/news.yaml

See docs/training.md.
"""

from __future__ import annotations

import sys

from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningCLI

from ..settings.files import check_aliases, load_settings_file
from ..text.corpusfile import CorpusError
from ..training.callbacks import KMeansCallback
from ..training.data import PairDataModule
from ..training.module import EncoderModule
from .console import print_err


class TrainCLI(LightningCLI):
    """LightningCLI with two callbacks always on, each configured under its own key.

    ``checkpoint:`` is a ``ModelCheckpoint`` (one file per epoch plus ``last.ckpt`` for
    ``--ckpt_path``); ``kmeans:`` is the ``KMeansCallback`` that fits the centroids at the end
    and writes ``final.ckpt`` beside the other checkpoints. Two settings are linked, so each is
    given once: the callback fits ``model.num_regions`` regions, and ``kmeans.corpus`` is also
    the domain of the model's provisional validation centroids.
    """

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults(
            {
                "checkpoint.filename": "epoch{epoch}-step{step}",
                "checkpoint.auto_insert_metric_name": False,
                "checkpoint.save_last": True,
                "checkpoint.save_top_k": -1,
            }
        )
        parser.add_lightning_class_args(KMeansCallback, "kmeans")
        parser.link_arguments("model.num_regions", "kmeans.num_regions")
        parser.link_arguments("kmeans.corpus", "model.corpus")

    def before_fit(self) -> None:
        """Without a logger (``--trainer.logger false``) the learning-rate monitor that the
        training configs add has nothing to log to, and Lightning would stop the run with an
        error once the models are loaded: leave it out instead."""
        if not self.trainer.loggers:
            self.trainer.callbacks = [
                c for c in self.trainer.callbacks if not isinstance(c, LearningRateMonitor)
            ]


def cli_main(args: list[str] | None = None) -> TrainCLI:
    """Run the CLI; ``args`` replaces ``sys.argv[1:]`` so tests can call it in-process.

    A corpus that cannot be used (``kmeans.corpus``: missing, not text, too small for K) ends
    the run before training with one line on stderr and exit status 2, as do a settings file
    or value that the other commands refuse (over 1 MiB, not UTF-8, YAML aliases that expand
    past a bound: ``settings.files``), checked before LightningCLI reads them.
    """
    try:
        _check_files_and_values(sys.argv[1:] if args is None else args)
    except ValueError as err:
        print_err(f"error: {err}")
        raise SystemExit(2) from None
    try:
        return TrainCLI(
            EncoderModule,
            PairDataModule,
            args=args,
            save_config_kwargs={"overwrite": True},
        )
    except CorpusError as err:
        print_err(f"error: {err}")
        raise SystemExit(2) from None


def _check_files_and_values(argv: list[str]) -> None:
    """Raise ``ValueError`` for a ``--config`` file or a flag's value that ``settings.files``
    refuses (LightningCLI would read and expand it first)."""
    for n, token in enumerate(argv):
        flag, eq, value = token.partition("=")
        if flag == "--config" and (eq or n + 1 < len(argv)):
            load_settings_file(value if eq else argv[n + 1])
        elif flag.startswith("--") and eq:
            check_aliases(value, f"the value of {flag}")
        elif not token.startswith("--") and n and argv[n - 1].startswith("--"):
            check_aliases(token, f"the value of {argv[n - 1]}")
