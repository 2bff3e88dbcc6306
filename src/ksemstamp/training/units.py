"""Training units for the kernel objective: passages and what else says the same.

A unit file is JSONL, one *window* per line: a few consecutive sentences of one document and
the units built from them::

    {"id": "...", "doc": "...", "sentences": [s1, s2, s3],
     "units": [{"a": [s1], "b": [paraphrase of s1], "method": "lm"},
               {"a": [s1, s2], "b": [s1 and s2 merged], "method": "merge"},
               {"a": [s1, s2, s3], "b": [a rewrite in two sentences], "method": "lm-window"}]}

``a`` and ``b`` say the same thing in other words or other sentence boundaries; each side scores
the sum of its sentences' features. The window's own sentences are the batch's sentence columns:
the other sentences of the same text, which detection needs to vary independently. A pair file
(``{"text", "paraphrase"}`` per line) reads as windows of one sentence and one unit.
``ksemstamp pairs`` builds pair files; the unit files of docs/training/runs.md (news windows
with the generator's rewrites, WordNet, merges and splits) were built by a script that is in
the git history only.

``Batch`` turns a list of windows into the rows and masks ``loss.kernel_alignment_loss`` needs.
With a ``split`` (a mark that scores clauses, ``text.splitter.clauses``) every sentence is read
as its pieces: each side of a unit scores the sum of its pieces' features, and the sentence
columns become piece columns, so a clause also meets the other clauses of its own sentence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ..jsonl import iter_jsonl_objects


def read_units(path: str | Path, limit: int | None = None) -> list[dict]:
    """The windows of a unit file, or of a pair file (one window per pair), in file order."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"unit file not found: {path} (a pair file from `ksemstamp pairs` reads as one; "
            "docs/training.md shows the unit file format)"
        )
    windows: list[dict] = []
    for number, row in iter_jsonl_objects(path):
        if "units" in row:
            units = row["units"]
            ok = isinstance(row.get("sentences"), list) and all(
                isinstance(u.get("a"), list) and isinstance(u.get("b"), list) and u["a"] and u["b"]
                for u in units
            )
            if not ok:
                raise ValueError(f"{path}:{number}: a window needs 'sentences' and units 'a', 'b'")
            window = {"id": str(row.get("id", number)), "sentences": row["sentences"]}
            windows.append({**window, "units": units})
        elif isinstance(row.get("text"), str) and isinstance(row.get("paraphrase"), str):
            text = row["text"]
            windows.append(
                {
                    "id": str(row.get("id", number)),
                    "sentences": [text],
                    "units": [{"a": [text], "b": [row["paraphrase"]]}],
                }
            )
        else:
            raise ValueError(f"{path}:{number}: neither a window ('units') nor a pair")
        if limit is not None and len(windows) >= limit:
            break
    return windows


@dataclass
class Batch:
    """The rows of a batch of windows.

    Attributes:
        sentences: every distinct sentence, each embedded once.
        anchor_rows, anchor_owner: for each sentence of a unit's ``a`` side, its row in
            ``sentences`` and its unit.
        positive_rows, positive_owner: the same for the ``b`` sides.
        column_rows: the windows' own sentences (the sentence columns).
        same_text: ``(S, S)`` True where two different sentence columns come from one window.
        positive_ok: ``(U, U)`` True where unit ``j``'s ``b`` shares no source with unit ``i``.
        others_ok: ``(U, S)`` True where sentence column ``j`` is no part of unit ``i``'s ``a``.
    """

    sentences: list[str]
    anchor_rows: Tensor
    anchor_owner: Tensor
    positive_rows: Tensor
    positive_owner: Tensor
    column_rows: Tensor
    positive_ok: Tensor
    others_ok: Tensor
    same_text: Tensor

    @property
    def num_units(self) -> int:
        return int(self.positive_ok.shape[0])

    @classmethod
    def of(cls, windows: list[dict], split: Callable[[str], list[str]] | None = None) -> Batch:
        """The rows of ``windows``; ``split`` cuts each sentence into the units the mark scores
        (``None``: whole sentences)."""
        index: dict[str, int] = {}

        def row(text: str) -> int:
            return index.setdefault(text, len(index))

        def pieces(sentences: list[str]) -> list[str]:
            if split is None:
                return list(sentences)
            return [p for s in sentences for p in (split(s) or [s])]

        anchors, positives, sources = [], [], []
        for w in windows:
            for unit in w["units"]:
                owner = len(sources)
                a = pieces(unit["a"])
                sources.append({(w["id"], s) for s in a})
                anchors += [(row(s), owner) for s in a]
                positives += [(row(s), owner) for s in pieces(unit["b"])]
        read = [pieces(w["sentences"]) for w in windows]
        columns = [(w["id"], s) for w, ps in zip(windows, read, strict=True) for s in ps]
        column_rows = [row(s) for _, s in columns]
        window = torch.tensor([i for i, ps in enumerate(read) for _ in ps])
        same_text = (window[:, None] == window[None, :]) & ~torch.eye(len(window), dtype=torch.bool)
        positive_ok = torch.tensor([[not (a & b) for b in sources] for a in sources])
        others_ok = torch.tensor([[c not in a for c in columns] for a in sources])
        return cls(
            sentences=list(index),
            anchor_rows=torch.tensor([r for r, _ in anchors], dtype=torch.long),
            anchor_owner=torch.tensor([o for _, o in anchors], dtype=torch.long),
            positive_rows=torch.tensor([r for r, _ in positives], dtype=torch.long),
            positive_owner=torch.tensor([o for _, o in positives], dtype=torch.long),
            column_rows=torch.tensor(column_rows, dtype=torch.long),
            positive_ok=positive_ok.reshape(len(sources), len(sources)),
            others_ok=others_ok.reshape(len(sources), len(columns)),
            same_text=same_text,
        )


def collate_windows(items: list[dict]) -> list[dict]:
    """A batch of windows is the list itself (``Batch.of`` builds its rows in the module)."""
    return list(items)
