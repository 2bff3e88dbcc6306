"""Paraphrase pairs (or windows of units) from JSONL files, served as a ``LightningDataModule``.

Each line of a pair file is ``{"text": ..., "paraphrase": ...}`` (other keys, such as ``id`` or
``method``, are kept out of the batch). Batches are dicts of two lists of strings; tokenisation
happens in the ``EncoderModule`` because the tokenizer belongs to the encoder. Under the kernel
objective a batch is a list of windows (``training.units``, ``batches: windows``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Literal, TypeVar

import lightning as L
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, Dataset

from ..jsonl import iter_jsonl_objects
from .units import collate_windows, read_units

T = TypeVar("T")


def read_pairs(path: str | Path, limit: int | None = None) -> list[tuple[str, str]]:
    """``(text, paraphrase)`` tuples of a JSONL pair file, in file order.

    A last line cut short by an interrupted writer is ignored; any other malformed line raises.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"pair file not found: {path} (build one with `ksemstamp pairs`)")
    pairs: list[tuple[str, str]] = []
    for number, row in iter_jsonl_objects(path):
        if not isinstance(row.get("text"), str) or not isinstance(row.get("paraphrase"), str):
            raise ValueError(f"{path}:{number} needs string fields 'text' and 'paraphrase'")
        pairs.append((row["text"], row["paraphrase"]))
        if limit is not None and len(pairs) >= limit:
            break
    return pairs


def distinct_texts(pairs: Sequence[T], text: Callable[[T], str] = itemgetter(0)) -> list[T]:
    """``pairs`` without those whose text (``text(pair)``, by default ``pair[0]``) already
    appeared in an earlier pair.

    Two pairs with one text in a training batch make each other's paraphrase that text's hardest
    negative, and the loss would push a true paraphrase away. News repeats sentences across
    articles, and pair files built with different seeds share sources.
    """
    seen: set[str] = set()
    kept = []
    for pair in pairs:
        if text(pair) not in seen:
            seen.add(text(pair))
            kept.append(pair)
    return kept


class PairDataset(Dataset):
    """In-memory list of ``(text, paraphrase)`` pairs (or of windows of units)."""

    def __init__(self, pairs: list) -> None:
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int):
        return self.pairs[index]


def collate_pairs(items: list[tuple[str, str]]) -> dict[str, list[str]]:
    """Lists of texts and paraphrases, row ``i`` of one pairing with row ``i`` of the other."""
    return {"text": [t for t, _ in items], "paraphrase": [p for _, p in items]}


class PairDataModule(L.LightningDataModule):
    """Train and validation pairs (the margin loss) or windows of units (the kernel loss).

    The training loader drops the last partial batch: under DDP every rank must contribute the
    same number of rows to the gathered negatives, and a short batch would also weaken the
    hardest-negative search. Lightning adds a ``DistributedSampler`` under DDP by itself.
    """

    def __init__(
        self,
        train_file: str | list[str] = "data/pairs/news-train.jsonl",
        val_file: str | None = "data/pairs/news-val.jsonl",
        batch_size: int = 32,
        val_batch_size: int | None = None,
        max_train_pairs: int | None = None,
        max_val_pairs: int | None = None,
        num_workers: int = 0,
        batches: Literal["pairs", "windows"] = "pairs",
    ) -> None:
        """
        Args:
            train_file: JSONL training pairs, or a list of such files read one after the other
                (e.g. LM paraphrases first, then WordNet ones). Pairs whose text already
                appeared are dropped (see ``distinct_texts``). Under the kernel objective,
                unit files or pair files (``training.units``).
            val_file: JSONL held-out pairs or units (``None`` disables validation).
            batch_size: pairs (windows, under the kernel objective) per training batch and per
                process; negatives are searched among the batches of every process.
            val_batch_size: pairs per validation batch (default: ``batch_size``).
            max_train_pairs: use only the first this many (distinct) training pairs or windows.
            max_val_pairs: use only the first this many validation pairs or windows.
            num_workers: ``DataLoader`` workers (strings need no heavy loading; 0 is fine).
            batches: ``pairs`` (the margin objective's) or ``windows`` of units (the kernel
                objective's, ``training.units``); the model's objective must learn from the
                same (``EncoderModule`` checks it when fitting starts).
        """
        super().__init__()
        if batch_size < 2:
            raise ValueError("batch_size must be >= 2: in-batch negatives need a second pair")
        if batches not in ("pairs", "windows"):
            raise ValueError(f"batches must be 'pairs' or 'windows', got {batches!r}")
        self.save_hyperparameters()
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self._collate = collate_windows if batches == "windows" else collate_pairs

    def _training_items(self, files: list[str]) -> tuple[list, str]:
        """The training pairs (distinct texts) or windows of ``files``, and a line saying what
        was read."""
        hp = self.hparams
        if hp.batches == "windows":
            windows = [w for path in files for w in read_units(path)][: hp.max_train_pairs]
            units = sum(len(w["units"]) for w in windows)
            return windows, f"training windows: {len(windows)} with {units} units"
        pairs = [pair for path in files for pair in read_pairs(path)]
        distinct = distinct_texts(pairs)
        kept = distinct[: hp.max_train_pairs]
        dropped = len(pairs) - len(distinct)
        return kept, (
            f"training pairs: {len(kept)} used of {len(pairs)} ({dropped} with a repeated text "
            "dropped)"
        )

    def setup(self, stage: str) -> None:
        hp = self.hparams
        if stage == "fit" and self.train_set is None:
            files = [hp.train_file] if isinstance(hp.train_file, str) else list(hp.train_file)
            items, said = self._training_items(files)
            rank_zero_info(f"{said} in {len(files)} file(s)")
            self.train_set = PairDataset(items)
            if len(self.train_set) < hp.batch_size:
                raise ValueError(
                    f"{', '.join(map(str, files))}: {len(self.train_set)} distinct {hp.batches}, "
                    f"fewer than one batch of {hp.batch_size} (training drops incomplete batches)"
                )
        if stage in ("fit", "validate") and self.val_set is None and hp.val_file:
            read = read_units if hp.batches == "windows" else read_pairs
            self.val_set = PairDataset(read(hp.val_file, hp.max_val_pairs))

    def train_dataloader(self) -> DataLoader:
        assert self.train_set is not None, "setup('fit') has not run"
        return DataLoader(
            self.train_set,
            batch_size=self.hparams.batch_size,
            shuffle=True,
            drop_last=True,
            collate_fn=self._collate,
            num_workers=self.hparams.num_workers,
        )

    def val_dataloader(self) -> DataLoader | list:
        if self.val_set is None:
            return []
        return DataLoader(
            self.val_set,
            batch_size=self.hparams.val_batch_size or self.hparams.batch_size,
            shuffle=False,
            collate_fn=self._collate,
            num_workers=self.hparams.num_workers,
        )
