"""Training speed: a steady-state optimizer step of ``EncoderModule`` under a Lightning
``Trainer`` against sentence-transformers' own trainer with the same loss, pairs and batches.

    python -m benchmarks training --training.batch 16 --training.steps 6

prints the table and writes ``results/training.json`` and ``training.md``. Needs the ``bench``
extra (``datasets``, for sentence-transformers' trainer); without it the report says what was
not measured.
"""

from __future__ import annotations

import importlib.util
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import torch

from ksemstamp.assets import load_encoder
from ksemstamp.text.corpora import news_articles
from ksemstamp.text.splitter import get_splitter

from .harness import RunSettings, at_least, fmt, measure, refuse, section_report


@dataclass(frozen=True)
class TrainingSettings:
    """The encoder's training step against sentence-transformers' trainer."""

    batch: int = 16
    """Pairs per training step."""
    steps: int = 6
    """Measured training steps."""
    warmup: int = 2
    """Untimed first training steps (at least one: the first step pays one-off costs)."""
    repeats: int = 2
    """Alternating repeats of each trainer; the best one counts."""
    accelerator: str = "cpu"
    """Lightning accelerator: cpu or gpu."""

    def __post_init__(self) -> None:
        problems = at_least(self, 1, "batch", "steps", "repeats")
        problems += at_least(self, 1, "warmup", why=" (the first step pays one-off costs)")
        refuse(self, problems)


def training(training: TrainingSettings | None = None, run: RunSettings | None = None) -> int:
    """Training speed: the encoder's training step against sentence-transformers' trainer."""
    training = training or TrainingSettings()
    return section_report(
        "training",
        "Training benchmark",
        run or RunSettings(),
        {"training": training},
        lambda: bench_training(training),
        training_targets,
        training_markdown,
    )


def training_pairs(count: int) -> list[tuple[str, str]]:
    """``(sentence, variant)`` pairs from held-out news: the sentence and the same sentence
    with every fifth word dropped. Throughput depends only on lengths, so no paraphraser is
    needed, and the pairs are the same on every machine."""
    splitter = get_splitter()
    pairs = []
    for article in news_articles("test"):
        for sentence in splitter.split(article.text):
            words = sentence.split()
            if len(words) >= 6:
                shorter = " ".join(w for i, w in enumerate(words) if i % 5 != 4)
                pairs.append((sentence, shorter))
                if len(pairs) == count:
                    return pairs
    return pairs


def _lightning_steps(pairs, batch_size: int, steps: int, accelerator: str) -> list[float]:
    """End time of every optimizer step of ``EncoderModule`` under a Lightning ``Trainer`` on
    ``accelerator`` (one device)."""
    import lightning as L
    from torch.utils.data import DataLoader

    from ksemstamp.training.data import PairDataset, collate_pairs
    from ksemstamp.training.module import EncoderModule

    stamps: list[float] = []

    class Stamp(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.strategy.root_device.type == "cuda":
                torch.cuda.synchronize()
            stamps.append(time.perf_counter())

    module = EncoderModule(max_seq_length=128, val_kmeans_sentences=0)
    loader = DataLoader(
        PairDataset(pairs), batch_size=batch_size, collate_fn=collate_pairs, drop_last=True
    )
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=1,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[Stamp()],
    )
    trainer.fit(module, train_dataloaders=loader)
    return stamps


def _sentence_transformers_steps(
    pairs, batch_size: int, steps: int, accelerator: str
) -> list[float]:
    """End time of every optimizer step of sentence-transformers' own trainer, same loss, on
    the GPU for ``accelerator`` ``gpu``/``cuda``, else on the CPU."""
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.base.sampler import DefaultBatchSampler
    from torch.utils.data import SequentialSampler
    from transformers import TrainerCallback

    from ksemstamp.training.loss import margin_contrastive_loss

    stamps: list[float] = []

    on_gpu = accelerator in ("gpu", "cuda")

    class Stamp(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if on_gpu:
                torch.cuda.synchronize()
            stamps.append(time.perf_counter())

    class MarginLoss(torch.nn.Module):
        """The project's loss in sentence-transformers' loss interface (one pass per column)."""

        def __init__(self, model) -> None:
            super().__init__()
            self.model = model

        def forward(self, sentence_features, labels=None):
            anchor, positive = (self.model(f)["sentence_embedding"] for f in sentence_features)
            return margin_contrastive_loss(anchor, positive, delta=0.8, reduction="mean")

    class InOrderTrainer(SentenceTransformerTrainer):
        """Batches in file order, as the Lightning side's loader: the same batches on both sides.
        Shuffled batches would pad to other lengths, and padding is most of the cost difference
        between two batch orders of the same pairs."""

        def get_batch_sampler(self, dataset, batch_size, drop_last, **kwargs):
            return DefaultBatchSampler(
                SequentialSampler(dataset), batch_size=batch_size, drop_last=drop_last, **kwargs
            )

    model = load_encoder(device="cuda" if on_gpu else "cpu")
    model.max_seq_length = 128  # as EncoderModule's default
    data = Dataset.from_dict({"anchor": [t for t, _ in pairs], "positive": [p for _, p in pairs]})
    with tempfile.TemporaryDirectory() as out:
        args = SentenceTransformerTrainingArguments(
            output_dir=out,
            per_device_train_batch_size=batch_size,
            max_steps=steps,
            learning_rate=4e-5,
            warmup_ratio=0.1,
            weight_decay=0.01,
            save_strategy="no",
            logging_strategy="no",
            report_to="none",
            use_cpu=not on_gpu,
            dataloader_drop_last=True,
            disable_tqdm=True,
            seed=0,
        )
        trainer = InOrderTrainer(
            model=model, args=args, train_dataset=data, loss=MarginLoss(model), callbacks=[Stamp()]
        )
        trainer.train()
    return stamps


def bench_training(settings: TrainingSettings) -> dict[str, Any]:
    """Pairs/s of ``EncoderModule``'s step against sentence-transformers' own step."""
    missing = [p for p in ("lightning", "datasets") if importlib.util.find_spec(p) is None]
    if missing:
        return {
            "measured": False,
            "todo": f"not measured, missing packages {missing} (pip install {' '.join(missing)})",
        }
    warm, steps, batch = settings.warmup, settings.steps, settings.batch
    pairs = training_pairs(batch * (warm + steps))
    runners = {
        "encoder_module": _lightning_steps,
        "sentence_transformers": _sentence_transformers_steps,
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in runners}
    for r in range(settings.repeats):
        names = list(runners) if r % 2 == 0 else list(runners)[::-1]
        for name in names:
            m = measure(
                lambda name=name: runners[name](pairs, batch, warm + steps, settings.accelerator)
            )
            stamps = m.value
            # Steady state: from the end of the last warm-up step to the end of the last step.
            seconds = stamps[-1] - stamps[warm - 1]
            results[name].append(
                {"pairs_per_second": steps * batch / seconds, "peak_rss_mib": m.peak_mib}
            )
            print(f"  training {name:<22} {steps * batch / seconds:7.2f} pairs/s", flush=True)
    best = {n: max(x["pairs_per_second"] for x in runs) for n, runs in results.items()}
    return {
        "measured": True,
        "accelerator": settings.accelerator,
        "batch_size": batch,
        "warmup_steps": warm,
        "measured_steps": steps,
        "repeats": settings.repeats,
        "max_seq_length": 128,
        "runs": results,
        "encoder_module_pairs_per_second": best["encoder_module"],
        "sentence_transformers_pairs_per_second": best["sentence_transformers"],
        "encoder_module_over_sentence_transformers": best["encoder_module"]
        / best["sentence_transformers"],
        "encoder_module_peak_rss_mib": max(x["peak_rss_mib"] for x in results["encoder_module"]),
        "sentence_transformers_peak_rss_mib": max(
            x["peak_rss_mib"] for x in results["sentence_transformers"]
        ),
    }


def training_targets(train: dict[str, Any]) -> list[dict[str, Any]]:
    """The training target of benchmarks/README.md and whether it is met."""
    value = train.get("encoder_module_over_sentence_transformers")
    return [
        {
            "target": "EncoderModule training step within 10% of sentence-transformers' (pairs/s)",
            "measured": value,
            "met": value is not None and value >= 0.9,
            **({} if train.get("measured") else {"note": train["todo"]}),
        }
    ]


def training_markdown(train: dict[str, Any]) -> list[str]:
    """The training table (or what was not measured)."""
    lines = ["## Training", ""]
    if not train.get("measured"):
        return lines + [f"**{train['todo']}**", ""]
    return lines + [
        f"Batch {train['batch_size']} pairs, max_seq_length {train['max_seq_length']}, "
        f"{train['measured_steps']} measured steps after {train['warmup_steps']} warm-up "
        f"steps, best of {train['repeats']} alternating repeats; same pairs, same margin "
        f"loss (delta 0.8), AdamW lr 4e-5; accelerator {train.get('accelerator', 'cpu')}.",
        "",
        "| step | pairs / s | peak RSS MiB |",
        "|---|---|---|",
        f"| `EncoderModule` (Lightning) | {fmt(train['encoder_module_pairs_per_second'])} "
        f"| {fmt(train['encoder_module_peak_rss_mib'], 0)} |",
        f"| sentence-transformers trainer | "
        f"{fmt(train['sentence_transformers_pairs_per_second'])} "
        f"| {fmt(train['sentence_transformers_peak_rss_mib'], 0)} |",
        "",
        f"EncoderModule / sentence-transformers: "
        f"{fmt(train['encoder_module_over_sentence_transformers'])}.",
        "",
    ]
