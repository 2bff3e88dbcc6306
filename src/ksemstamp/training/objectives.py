"""What the encoder learns: two objectives behind one interface.

``EncoderModule`` holds the encoder, the centroids and the optimiser (an objective's methods
take it as ``module``); an ``Objective`` holds the
loss, what a batch is (``batches``: pairs of a text and its paraphrase, or windows of units,
``training.data``) and what validation logs. Choose one in a config's ``model.objective``::

    model:
      objective:
        class_path: ksemstamp.training.objectives.KernelObjective
        init_args: {units: clauses, refit_every: 10}

* ``MarginObjective`` (the default): the paper's margin contrastive loss on pairs, the hardest
  in-batch negative of every process under DDP, and optionally a region term;
* ``KernelObjective``: ``loss.kernel_alignment_loss`` on windows of units, on the features the
  default direction mark scores (``kernel.KernelFeatures``): the retention of a unit's score
  under paraphrase to 1, the correlation of different units of a text to 0.

An objective's settings are saved in the checkpoint as plain values, in a config file's form
(``config``), so that a checkpoint rebuilds the module that wrote it (``objective_from_config``)
and a resumed run reads them as the command line does.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from lightning import LightningModule
from torch import Tensor

from ..scheme.partition import kmeans_regions
from ..settings.groups import DEFAULT_CENTROIDS
from ..text.splitter import SPLITTERS, clauses
from .kernel import KernelFeatures, gather_columns
from .loss import (
    cosine_gap,
    kernel_alignment_loss,
    margin_contrastive_loss,
    region_consistency_loss,
    unit_sums,
)
from .units import Batch

Batches = Literal["pairs", "windows"]


class Objective(ABC):
    """A training objective (see the module docstring)."""

    batches: ClassVar[Batches] = "pairs"
    """What a batch holds: ``pairs`` (``{"text": [...], "paraphrase": [...]}``) or ``windows``
    of units (``training.units``); the data module must make the same (``data.batches``)."""

    def bind(self, module: LightningModule) -> None:
        """Check the settings against the module's and build what the objective needs once the
        encoder exists (raises ``ValueError``)."""
        return None

    @abstractmethod
    def step(self, module: LightningModule, batch: Any, stage: Literal["train", "val"]) -> Tensor:
        """The loss of ``batch``, with its figures logged under ``stage/``."""

    def on_train_start(self, module: LightningModule) -> None:
        """Before the first step (collective calls run on every rank)."""
        return None

    def on_train_batch_start(self, module: LightningModule) -> None:
        """Before every training batch."""
        return None

    def config(self) -> dict[str, Any]:
        """The objective as plain values, in the form a config file gives it (``class_path``
        and ``init_args``): a checkpoint keeps it so, and ``objective_from_config`` or a
        resumed ``train.py`` reads it back."""
        cls = type(self)
        settings = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        return {"class_path": f"{cls.__module__}.{cls.__name__}", "init_args": settings}


@dataclass
class MarginObjective(Objective):
    """The paper's margin contrastive loss on pairs, optionally with a region term."""

    delta: float = 0.8
    """The margin (paper: 0.8)."""
    loss_reduction: Literal["mean", "sum"] = "mean"
    """``mean`` over pairs (default) or ``sum`` (the paper's formula). With AdamW the two differ
    by a constant factor that Adam's normalisation all but cancels; the mean keeps logged
    losses comparable across batch sizes and world sizes, and under DDP's gradient averaging it
    gives the same gradients as one process on the concatenated batch."""
    gather_negatives: bool = True
    """Under DDP, search hardest negatives among every rank's paraphrases."""
    region_weight: float = 0.0
    """Weight of ``loss.region_consistency_loss`` added to the margin loss (0: the paper's loss
    alone). Its centroids are the module's provisional ones (``val_kmeans_sentences`` domain
    sentences, refitted with the current encoder at the start of training and of every
    validation epoch)."""
    region_temperature: float = 0.05
    """Softmax temperature of that term, on cosines."""
    batches: ClassVar[Batches] = "pairs"

    def __post_init__(self) -> None:
        if self.delta <= 0:
            raise ValueError(f"delta must be > 0, got {self.delta}")
        if self.loss_reduction not in ("mean", "sum"):
            raise ValueError(f"loss_reduction must be 'mean' or 'sum', got {self.loss_reduction!r}")
        if self.region_weight < 0:
            raise ValueError(f"region_weight must be >= 0, got {self.region_weight}")
        if self.region_temperature <= 0:
            raise ValueError(f"region_temperature must be > 0, got {self.region_temperature}")

    def bind(self, module: LightningModule) -> None:
        if self.region_weight > 0 and module.hparams.val_kmeans_sentences <= 0:
            raise ValueError(
                "region_weight > 0 needs provisional centroids: set val_kmeans_sentences > 0"
            )

    def on_train_start(self, module: LightningModule) -> None:
        current = module.current_centroids
        if self.region_weight > 0 and (current is None or current is module.centroids):
            # No sanity-check validation has fitted provisional centroids for this encoder.
            module.fit_provisional_centroids()

    def _columns(self, module: LightningModule, positive: Tensor) -> tuple[Tensor, int]:
        """Negative columns and the offset of this rank's own paraphrases among them."""
        world = module.trainer.world_size
        if world > 1 and self.gather_negatives:
            # (world, B, D) with gradients flowing back to each rank's own rows.
            gathered = module.all_gather(positive, sync_grads=True)
            return gathered.reshape(-1, positive.shape[-1]), module.global_rank * positive.shape[0]
        return positive, 0

    def step(self, module: LightningModule, batch: Any, stage: Literal["train", "val"]) -> Tensor:
        # One pass per side, each padded to its own longest sentence. A single pass over both
        # sides pads every paraphrase to the longest text as well; on CPU that extra padding
        # cost more than the larger matrix products saved (docs/design.md, "Constants
        # measured once").
        anchor, positive = module(batch["text"]), module(batch["paraphrase"])
        n = anchor.shape[0]
        log = functools.partial(module.log, batch_size=n, sync_dist=stage == "val")
        with torch.no_grad():
            log(f"{stage}/pos_cos", F.cosine_similarity(anchor, positive, dim=-1).mean())
        if stage == "val":
            return self._validate(module, anchor, positive, log)
        columns, offset = self._columns(module, positive)
        loss = margin_contrastive_loss(
            anchor, positive, columns, self.delta, offset=offset, reduction=self.loss_reduction
        )
        if self.region_weight > 0:
            region = region_consistency_loss(
                anchor,
                positive,
                module.current_centroids,
                temperature=self.region_temperature,
                reduction=self.loss_reduction,
            )
            log("train/region_loss", region)
            loss = loss + self.region_weight * region
        log("train/loss", loss, prog_bar=True)
        return loss

    def _validate(self, module, anchor: Tensor, positive: Tensor, log) -> Tensor:
        """Validation's figures: the gap to the hardest other paraphrase, the loss and, with
        centroids, the share of pairs whose two sides share a region."""
        loss = anchor.new_zeros(())
        if len(anchor) >= 2:  # a gap needs another pair in the batch
            log("val/cos_gap", cosine_gap(anchor, positive).mean())
            loss = margin_contrastive_loss(anchor, positive, delta=self.delta, reduction="mean")
            log("val/loss", loss)
        centroids = module.current_centroids
        if centroids is not None:
            text_regions, _ = kmeans_regions(anchor, centroids, 0.0)
            para_regions, _ = kmeans_regions(positive, centroids, 0.0)
            log(
                "val/region_agreement", (text_regions == para_regions).float().mean(), prog_bar=True
            )
        return loss


@dataclass
class KernelObjective(Objective):
    """``loss.kernel_alignment_loss`` on windows of units, on the default mark's features."""

    decorrelation: float = 1.0
    """Weight of the correlation term."""
    temperature: float = 0.1
    """Soft-context temperature of the features (the default mark's 0.1; 0: one context)."""
    whiten: int = 64
    """Principal components projected out of the features (the default mark's 64)."""
    base_centroids: str | None = None
    """Centroid file of the base encoder whose mean, components and centroids define the
    features during training (``None``: the shipped file of the module's encoder).
    ``KMeansCallback`` refits all three for the trained encoder."""
    units: Literal["sentences", "clauses"] = "sentences"
    """What is scored, as the mark's ``units`` (a unit's side sums its clauses' features)."""
    clause_words: int = 4
    """The clauses' ``min_words`` (the mark's ``clause_words``)."""
    coherence: float = 0.0
    """Weight of the signed mean correlation of different units of one window, which sets a
    text's effective number of units."""
    refit_every: int = 0
    """``n > 0`` refits the features on the current encoder every ``n`` steps, as
    ``KMeansCallback`` refits them after training (``0``: the base file's throughout)."""
    refit_sentences: int = 4000
    """Domain sentences those refits embed."""
    gather_negatives: bool = True
    """Under DDP, score against every rank's columns."""
    batches: ClassVar[Batches] = "windows"
    _refit_step: int | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.units not in SPLITTERS:
            raise ValueError(f"units must be one of {SPLITTERS}, got {self.units!r}")
        if self.clause_words < 1:
            raise ValueError(f"clause_words must be >= 1, got {self.clause_words}")
        if self.refit_every < 0:
            raise ValueError(f"refit_every must be >= 0, got {self.refit_every}")
        if min(self.decorrelation, self.temperature, self.whiten, self.coherence) < 0:
            raise ValueError("decorrelation, temperature, whiten and coherence must be >= 0")

    def bind(self, module: LightningModule) -> None:
        k, encoder = module.hparams.num_regions, module.hparams.encoder
        if self.refit_every and self.refit_sentences < k:
            raise ValueError(
                f"refit_sentences must be >= num_regions ({k}), got {self.refit_sentences}"
            )
        if self.base_centroids is None and encoder not in DEFAULT_CENTROIDS:
            raise ValueError(f"the kernel objective needs base_centroids for {encoder!r}")
        path = self.base_centroids or DEFAULT_CENTROIDS[encoder]
        module.kernel_features = KernelFeatures.from_file(path, self.whiten, self.temperature)

    def on_train_batch_start(self, module: LightningModule) -> None:
        step = module.global_step
        # Once per optimizer step: under gradient accumulation several batches share a step.
        if self.refit_every and step % self.refit_every == 0 and step != self._refit_step:
            emb = module.embed_sharded(module.domain_sentence_list(self.refit_sentences))
            module.kernel_features.refit(emb, module.fit_centroids(emb))
            self._refit_step = step

    def _terms(self, module: LightningModule, windows: list[dict]) -> tuple[Tensor, ...]:
        """The anchors, positive and sentence columns (gathered from every rank under DDP, this
        rank's first) and their masks, for a batch of windows."""
        clause = functools.partial(clauses, min_words=self.clause_words)
        batch = Batch.of(windows, clause if self.units == "clauses" else None)
        phi = module.kernel_features(module(batch.sentences))
        count = batch.num_units
        anchor = unit_sums(phi[batch.anchor_rows], batch.anchor_owner, count)
        positive = unit_sums(phi[batch.positive_rows], batch.positive_owner, count)
        others = phi[batch.column_rows.to(phi.device)]
        positive_ok = batch.positive_ok.to(phi.device)
        others_ok = batch.others_ok.to(phi.device)
        if module._trainer is not None and module.trainer.world_size > 1 and self.gather_negatives:
            positive, positive_ok = gather_columns(module, positive, positive_ok)
            others, others_ok = gather_columns(module, others, others_ok)
        # This rank's columns come first: the pairs of one window among them.
        return anchor, positive, others, positive_ok, others_ok, batch.same_text.to(phi.device)

    def step(self, module: LightningModule, batch: Any, stage: Literal["train", "val"]) -> Tensor:
        *core, same_text = self._terms(module, batch)
        loss = kernel_alignment_loss(
            *core, self.decorrelation, same_text=same_text, coherence=self.coherence
        )
        anchor, positive = core[0], core[1]
        with torch.no_grad():
            retained = F.cosine_similarity(anchor, positive[: len(anchor)], dim=-1).mean()
        log = functools.partial(module.log, batch_size=len(anchor), sync_dist=stage == "val")
        log(f"{stage}/loss", loss, prog_bar=stage == "train")
        log(f"{stage}/retention", retained, prog_bar=stage == "val")
        return loss


OBJECTIVES = {cls.__name__: cls for cls in (MarginObjective, KernelObjective)}


def objective_from_config(config: dict[str, Any] | Objective | None) -> Objective:
    """The objective a checkpoint's saved ``config`` describes (an objective is returned as it
    is; ``None``: the margin objective with its defaults)."""
    if config is None:
        return MarginObjective()
    if isinstance(config, Objective):
        return config
    name = str(config.get("class_path", "MarginObjective")).rpartition(".")[2]
    if name not in OBJECTIVES:
        raise ValueError(f"unknown objective {name!r}; known: {sorted(OBJECTIVES)}")
    return OBJECTIVES[name](**config.get("init_args", {}))
