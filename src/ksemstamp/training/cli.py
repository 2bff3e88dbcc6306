"""The training command line: LightningCLI over ``EncoderModule`` and ``PairDataModule``.

``train.py`` at the top of the checkout and ``python -m ksemstamp.training.cli`` both run it::

    python train.py fit --config configs/train/news.yaml

See docs/training.md.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI

from .callbacks import KMeansCallback
from .data import PairDataModule
from .module import EncoderModule


class TrainCLI(LightningCLI):
    """LightningCLI with two callbacks always on, each configured under its own key.

    ``checkpoint:`` is a ``ModelCheckpoint`` (one file per epoch plus ``last.ckpt`` for
    ``--ckpt_path``); ``kmeans:`` is the ``KMeansCallback`` that fits the centroids at the end
    and writes ``final.ckpt`` beside the other checkpoints.
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


def cli_main(args: list[str] | None = None) -> TrainCLI:
    """Run the CLI; ``args`` replaces ``sys.argv[1:]`` so tests can call it in-process."""
    return TrainCLI(
        EncoderModule,
        PairDataModule,
        args=args,
        save_config_kwargs={"overwrite": True},
    )


if __name__ == "__main__":
    cli_main()
