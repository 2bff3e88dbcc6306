"""Generation over many prompts with ``Trainer.predict``: one process per device under DDP.

Each rank generates its share of the prompts (Lightning's unrepeated distributed sampler for
prediction: no prompt is given to two ranks) and appends every record to its own shard file as
soon as it exists, so an interrupted run loses at most one batch. ``merge_shards`` then folds
the shards into the stage file, in prompt order, keeping the first record of each id.

The generator is built inside each process from a picklable ``GeneratorFactory`` (models are
loaded per rank, never pickled across ``ddp_spawn``).
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader

from ..io import ResumableWriter, read_jsonl_objects, write_jsonl_atomic
from .report import LABELS

GenerateFn = Callable[[list[str]], list[dict]]


@dataclass
class GeneratorFactory:
    """Everything needed to build one algorithm's generator in a fresh process.

    ``algorithm`` is ``ksemstamp``/``semstamp`` (the project's watermarker with
    ``watermark_config``), ``none`` (the same sentence-by-sentence sampler, unwatermarked) or
    ``kgw`` (transformers' KGW watermark over ``watermark_config['lm']``).
    """

    algorithm: str
    watermark_config: dict[str, Any] = field(default_factory=dict)
    kgw: dict[str, Any] = field(default_factory=dict)

    def __call__(self) -> GenerateFn:
        from ..config import WatermarkConfig, build_watermarker

        cfg = WatermarkConfig.from_dict(self.watermark_config)
        if self.algorithm == "kgw":
            from ..assets import load_lm
            from .baselines import KGWGenerator, KGWSettings

            model, tokenizer = load_lm(cfg.lm, cfg.device)
            kgw = KGWGenerator(
                model,
                tokenizer,
                KGWSettings(**self.kgw),
                max_new_tokens=cfg.max_new_tokens,
                temperature=cfg.temperature,
                repetition_penalty=cfg.repetition_penalty,
                seed=cfg.seed,
            )
            return kgw.generate
        if self.algorithm not in LABELS:
            raise ValueError(f"unknown algorithm {self.algorithm!r}")
        watermarker = build_watermarker(cfg)
        watermark = self.algorithm != "none"
        fingerprint = watermarker.scheme.key_fingerprint if watermark else None

        def generate(prompts: list[str]) -> list[dict]:
            results = watermarker.generate(prompts, watermark=watermark)
            return [{**r.to_record(), "key_fingerprint": fingerprint} for r in results]

        return generate


class PromptDataModule(L.LightningDataModule):
    """Prompts (``{"id": ..., "prompt": ...}``) in fixed order, a few per batch."""

    def __init__(self, prompts: Sequence[dict], batch_size: int = 4) -> None:
        super().__init__()
        self.prompts = list(prompts)
        self.batch_size = batch_size

    def predict_dataloader(self) -> DataLoader:
        # A list collate keeps the dicts intact (the default would tensorise and transpose).
        return DataLoader(self.prompts, batch_size=self.batch_size, shuffle=False, collate_fn=list)


class GenerationModule(L.LightningModule):
    """Wraps a generator (a ``Watermarker`` or KGW) for ``Trainer.predict``; each batch's
    records go to the ``ShardWriter`` callback.

    Args:
        factory: builds the generator in each process.
    """

    def __init__(self, factory: GeneratorFactory) -> None:
        super().__init__()
        self.factory = factory
        self._generate: GenerateFn | None = None

    def on_predict_start(self) -> None:
        # torch's default intra-op threads on every rank would oversubscribe shared cores.
        if self.trainer.world_size > 1:
            torch.set_num_threads(1)
        self._generate = self.factory()

    def predict_step(self, batch: list[dict], batch_idx: int) -> list[dict]:
        assert self._generate is not None
        records = self._generate([row["prompt"] for row in batch])
        algorithm = self.factory.algorithm
        return [
            {"id": row["id"], "algorithm": algorithm, **record}
            for row, record in zip(batch, records, strict=True)
        ]

    def on_predict_batch_end(self, outputs, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        # Lightning notes a SIGTERM (a scheduler's stop, `kill`) but its predict loop carries
        # on to the last batch. Callbacks run first, so this batch is already in its shard;
        # stop after it, and a rerun resumes from the shards.
        if self.trainer.received_sigterm:
            raise SIGTERMException(128 + signal.SIGTERM)


class ShardWriter(BasePredictionWriter):
    """Appends each batch's records to this rank's shard, ``<shard_dir>/<name>.shard<r>.jsonl``,
    as soon as the batch is done (with ``return_predictions=False`` nothing stays in memory)."""

    def __init__(self, shard_dir: str | Path, name: str) -> None:
        super().__init__(write_interval="batch")
        self.shard_dir = Path(shard_dir)
        self.name = name
        self._writer: ResumableWriter | None = None

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        path = self.shard_dir / f"{self.name}.shard{trainer.global_rank}.jsonl"
        self._writer = ResumableWriter(path)

    def write_on_batch_end(
        self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx
    ) -> None:
        assert self._writer is not None
        for record in prediction:
            self._writer.write(record)

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def shard_paths(shard_dir: str | Path, name: str) -> list[Path]:
    return sorted(Path(shard_dir).glob(f"{name}.shard*.jsonl"))


def read_records(path: str | Path) -> list[dict]:
    """Records of a JSONL file written by ``ResumableWriter`` (no file: no records)."""
    return read_jsonl_objects(path, missing_ok=True, skip_invalid=True)


def merge_shards(shards: Sequence[Path], target: Path, order: Sequence[Any]) -> list[dict]:
    """Fold ``shards`` into ``target`` (records already there are kept), ordered by ``order``.

    The first record of each id wins. Ids not in ``order`` (say, from an earlier run with more
    prompts) are kept after the others, never dropped. The target is replaced atomically, then
    the shards are removed.
    """
    by_id: dict[str, dict] = {}
    for path in [target, *shards]:
        for rec in read_records(path):
            by_id.setdefault(json.dumps(rec.get("id")), rec)
    wanted = [json.dumps(i) for i in order]
    rest = [key for key in by_id if key not in set(wanted)]
    merged = [by_id[key] for key in wanted + rest if key in by_id]
    if not shards and target.exists():
        return merged  # nothing new: leave the stage file as it is
    write_jsonl_atomic(target, merged)
    for path in shards:
        path.unlink()
    return merged


def predict_to_shards(
    factory: GeneratorFactory,
    prompts: Sequence[dict],
    shard_dir: str | Path,
    name: str,
    devices: int = 1,
    accelerator: str = "cpu",
    strategy: str = "auto",
    batch_size: int = 4,
    progress: bool = True,
) -> list[Path]:
    """Generate for ``prompts`` with ``Trainer.predict``; returns the shard files written."""
    Path(shard_dir).mkdir(parents=True, exist_ok=True)
    if prompts:
        trainer = L.Trainer(
            accelerator=accelerator,
            devices=devices,
            strategy=strategy,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=progress,
            enable_model_summary=False,
            callbacks=[ShardWriter(shard_dir, name)],
        )
        trainer.predict(
            GenerationModule(factory),
            datamodule=PromptDataModule(prompts, batch_size),
            return_predictions=False,
        )
    return shard_paths(shard_dir, name)
