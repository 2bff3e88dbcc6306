"""Fine-tune a paraphrase-robust sentence encoder and fit its k-SemStamp centroids.

    python train.py fit --config configs/train/news.yaml
    python train.py fit --config configs/train/news.yaml --ckpt_path checkpoints/news/last.ckpt
    python train.py fit --config configs/train/news.yaml --config configs/train/news-ddp-cpu.yaml

The command line lives in ``ksemstamp.cli.train`` (also ``ksemstamp train``).
See docs/training.md.
"""

from ksemstamp.cli.train import TrainCLI, cli_main

__all__ = ["TrainCLI", "cli_main"]

if __name__ == "__main__":
    cli_main()
