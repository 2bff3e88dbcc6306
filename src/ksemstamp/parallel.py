"""Work over many devices with ``Trainer.predict``: one process per device, a shard per process.

Generation for the evaluation and ``ksemstamp generate|detect --input ... --parallel.devices N``
run here. Records are spread over the processes by Lightning's distributed sampler for prediction
(no record goes to two processes); each process builds its models on its own device, the
strategy's root device, never on a global setting, and appends each batch's output records to
its own shard file as soon as the batch is done. ``merge_shards`` folds the shards into one file
in input order, so an interrupted run loses at most one batch per process and a rerun resumes.

A job is built in each process from a picklable factory (models are never pickled across
``ddp_spawn``): ``factory(device)`` returns a ``Job``, its function from a batch of records to
output records and the models it built, which are checked to sit on the process's device.

Under the ``ddp`` strategy Lightning starts the other processes by running the same command
again; those stop once their shard is written (``predict_to_shards``), and only the first
process merges and goes on. Across nodes, shards must be on a shared file system.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader

from .io import ResumableWriter, write_jsonl_atomic
from .jsonl import read_jsonl, read_jsonl_objects
from .settings.devices import DeviceSettings  # noqa: F401  (re-exported: its former home)


@dataclass
class Job:
    """What one process does: ``process`` maps a batch of input records to output records;
    ``models`` are the modules it built (name -> ``nn.Module``), checked for their device."""

    process: Callable[[list], list[dict]]
    models: Mapping[str, torch.nn.Module] = field(default_factory=dict)


JobFactory = Callable[[torch.device], Job]

logger = logging.getLogger(__name__)


def _log_like_the_parent(level: int) -> None:
    """In a process started by ``ddp_spawn`` (no handlers yet), log the package's records on
    stderr at the level the starting process logged at; elsewhere, nothing changes."""
    package = logging.getLogger("ksemstamp")
    if package.handlers or level > logging.INFO:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    package.addHandler(handler)
    package.setLevel(level)
    package.propagate = False


class DeviceMismatchError(RuntimeError):
    """A model of a process is not on the device that process was given."""


def model_devices(models: Mapping[str, torch.nn.Module]) -> dict[str, set[torch.device]]:
    """The devices each model's parameters and buffers sit on."""
    return {
        name: {t.device for t in (*module.parameters(), *module.buffers())}
        for name, module in models.items()
    }


def check_devices(models: Mapping[str, torch.nn.Module], device: torch.device) -> None:
    """Raise ``DeviceMismatchError`` unless every tensor of every model is on ``device``."""
    wrong = {
        name: sorted(str(d) for d in found)
        for name, found in model_devices(models).items()
        if found != {torch.device(device)}
    }
    if wrong:
        raise DeviceMismatchError(
            f"models not on this process's device {device}: "
            + "; ".join(f"{name} on {', '.join(devices)}" for name, devices in wrong.items())
        )


DEVICE_LINE = "rank {rank}/{world}: models on {device}: {models}"
"""The line each process prints once its models are built and checked."""


def describe_models(models: Mapping[str, torch.nn.Module]) -> str:
    parts = []
    for name, module in models.items():
        dtypes = {p.dtype for p in module.parameters()} or {t.dtype for t in module.buffers()}
        shown = "/".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
        parts.append(f"{name} {shown}")
    return ", ".join(parts)


class RecordsDataModule(L.LightningDataModule):
    """Records (dicts or any picklable objects) in fixed order, a few per batch."""

    def __init__(self, records: Sequence[Any], batch_size: int = 4) -> None:
        super().__init__()
        self.records = list(records)
        self.batch_size = batch_size

    def predict_dataloader(self) -> DataLoader:
        # A list collate keeps the records intact (the default would tensorise and transpose).
        return DataLoader(self.records, batch_size=self.batch_size, shuffle=False, collate_fn=list)


class PredictModule(L.LightningModule):
    """Runs a ``Job`` built on this process's device for ``Trainer.predict``; each batch's
    output records go to the ``ShardWriter`` callback."""

    def __init__(self, factory: JobFactory, report: bool = True) -> None:
        super().__init__()
        self.factory = factory
        self.report = report
        self._job: Job | None = None
        # A spawned process starts without this one's log handlers: it logs at this level.
        self.log_level = logging.getLogger("ksemstamp").getEffectiveLevel()

    def on_predict_start(self) -> None:
        # torch's default intra-op threads on every rank would oversubscribe shared cores.
        if self.trainer.world_size > 1:
            torch.set_num_threads(1)
        _log_like_the_parent(self.log_level)
        device = self.trainer.strategy.root_device
        self._job = self.factory(device)
        check_devices(self._job.models, device)
        if self.report:
            line = DEVICE_LINE.format(
                rank=self.trainer.global_rank,
                world=self.trainer.world_size,
                device=device,
                models=describe_models(self._job.models),
            )
            logger.info(line)

    def predict_step(self, batch: list, batch_idx: int) -> list[dict]:
        assert self._job is not None
        return self._job.process(batch)

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
        self.exception: BaseException | None = None
        """What stopped the run, if anything did (Lightning hands it to ``on_exception``)."""

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        path = self.shard_dir / f"{self.name}.shard{trainer.global_rank}.jsonl"
        self._writer = ResumableWriter(path)

    def write_on_batch_end(
        self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx
    ) -> None:
        assert self._writer is not None
        for record in prediction:
            self._writer.write(record)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self.exception = exception

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        # Every shard is complete before any process goes on to merge them.
        trainer.strategy.barrier("shards-written")


def shard_paths(shard_dir: str | Path, name: str) -> list[Path]:
    return sorted(Path(shard_dir).glob(f"{name}.shard*.jsonl"))


def read_records(path: str | Path) -> list[dict]:
    """Records of a JSONL file written by ``ResumableWriter`` (no file: no records)."""
    return read_jsonl_objects(path, missing_ok=True, skip_invalid=True)


def merge_shards(
    shards: Sequence[Path], target: Path, order: Sequence[Any], key: str = "id"
) -> list[dict]:
    """Fold ``shards`` into ``target`` (records already there are kept), ordered by ``order``,
    the values of each record's ``key`` in input order.

    The first record of each key wins. Keys not in ``order`` (say, from an earlier run with more
    prompts) are kept after the others, never dropped. The target is replaced atomically, then
    the shards are removed.
    """
    by_key: dict[str, dict] = {}
    for path in [target, *shards]:
        for rec in read_records(path):
            by_key.setdefault(json.dumps(rec.get(key)), rec)
    wanted = [json.dumps(i) for i in order]
    known = set(wanted)
    rest = [k for k in by_key if k not in known]
    merged = [by_key[k] for k in wanted + rest if k in by_key]
    if not shards and target.exists():
        return merged  # nothing new: leave the file as it is
    write_jsonl_atomic(target, merged)
    for path in shards:
        path.unlink()
    return merged


def predict_to_shards(
    factory: JobFactory,
    records: Sequence[Any],
    shard_dir: str | Path,
    name: str,
    devices: int | str = 1,
    accelerator: str = "cpu",
    strategy: str = "auto",
    batch_size: int = 4,
    progress: bool = True,
) -> list[Path]:
    """Run ``factory``'s job over ``records`` with ``Trainer.predict``; returns the shard files
    written. A process that Lightning started for another device (under ``ddp``) exits here,
    once its shard is complete."""
    Path(shard_dir).mkdir(parents=True, exist_ok=True)
    if records:
        trainer = L.Trainer(
            accelerator=accelerator,
            devices=devices,
            strategy=strategy,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=progress,
            enable_model_summary=False,
            callbacks=[writer := ShardWriter(shard_dir, name)],
        )
        try:
            with _no_interrupt_notice():
                trainer.predict(
                    PredictModule(factory),
                    datamodule=RecordsDataModule(records, batch_size),
                    return_predictions=False,
                )
        except SystemExit:
            # Lightning turns Ctrl-C into exit status 1 once it has torn down: raise it again,
            # so that the command says in one line what its shards hold (exit status 130).
            if isinstance(writer.exception, KeyboardInterrupt):
                raise KeyboardInterrupt from None
            raise
        if trainer.global_rank > 0:
            raise SystemExit(0)
    return shard_paths(shard_dir, name)


class _DropInterruptNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "KeyboardInterrupt" not in record.getMessage()


@contextmanager
def _no_interrupt_notice() -> Iterator[None]:
    """Without Lightning's own line on Ctrl-C: the command prints the one that says what the
    shards hold."""
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    notice = _DropInterruptNotice()
    logger.addFilter(notice)
    try:
        yield
    finally:
        logger.removeFilter(notice)


def run_jsonl(
    input_path: str | Path,
    output: str | Path,
    factory: JobFactory,
    settings: DeviceSettings,
    batch_size: int,
    progress: bool = True,
) -> tuple[list[dict], int]:
    """The ``--input``/``--output`` contract of ``generate`` and ``detect`` over devices.

    Input lines go to the job as ``jsonl.InputRecord`` objects; its output records carry ``line``.
    Shards left by an interrupted run are folded into ``output`` first, input lines already
    there are skipped (an input that changed since is refused), and the new records are merged
    in input order. Returns the records written by this run and the number of lines skipped.
    """
    output = Path(output)
    records = list(read_jsonl(input_path))
    order = [r.line for r in records]
    name = output.name
    merge_shards(shard_paths(output.parent, name), output, order, key="line")
    with ResumableWriter(output) as out:
        pending = [r for r in records if not out.is_done(r)]
    predict_to_shards(
        factory,
        pending,
        output.parent,
        name,
        batch_size=batch_size,
        progress=progress,
        **settings.trainer_kwargs(),
    )
    merged = merge_shards(shard_paths(output.parent, name), output, order, key="line")
    new = {r.line for r in pending}
    return [r for r in merged if r.get("line") in new], len(records) - len(pending)
