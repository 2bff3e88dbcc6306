"""``EncoderModule``: the Lightning system that fine-tunes a sentence encoder for k-SemStamp.

The model inside is a plain ``SentenceTransformer``; this module adds the margin contrastive
loss (negatives gathered from every process under DDP), AdamW with linear warmup and decay,
validation metrics that matter for the watermark, and the k-means centroids as a buffer so
that ``EncoderModule.load_from_checkpoint`` restores them with the weights.
"""

from __future__ import annotations

import functools
import math

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor

from ..assets import DEFAULT_ENCODER, encoder_fingerprint, load_encoder
from ..scheme.adapter import add_adapters
from ..scheme.centroids import CentroidFile, fit_kmeans
from ..scheme.partition import kmeans_regions
from ..settings.groups import DEFAULT_CENTROIDS
from ..text.corpusfile import domain_documents
from ..text.reading import reading_form
from ..text.splitter import clauses
from .kernel import KernelFeatures, check_kernel_options, gather_columns
from .loss import (
    cosine_gap,
    kernel_alignment_loss,
    margin_contrastive_loss,
    region_consistency_loss,
    unit_sums,
)
from .optim import freeze_unused_pooler, warmup_factor
from .units import Batch


class EncoderModule(L.LightningModule):
    """Fine-tunes a sentence-transformers encoder so that paraphrases stay in one region.

    Validation logs, over held-out pairs:

    * ``val/cos_gap``: cos(text, own paraphrase) minus cos(text, hardest other paraphrase of the
      batch), averaged; the loss asks for at least ``delta``.
    * ``val/region_agreement``: share of pairs whose text and paraphrase fall in the same k-means
      region. The centroids are the fitted buffer once ``KMeansCallback`` has filled it, and
      otherwise *provisional* centroids fitted at the start of each validation epoch on
      ``val_kmeans_sentences`` domain sentences embedded with the current encoder. Provisional
      refits, rather than the shipped centroids of the base encoder, measure what the watermark
      would see if training stopped now: centroids are always refitted for a changed encoder.
    """

    def __init__(
        self,
        encoder: str = DEFAULT_ENCODER,
        delta: float = 0.8,
        lr: float = 4e-5,
        warmup_ratio: float = 0.1,
        weight_decay: float = 0.01,
        num_regions: int = 64,
        max_seq_length: int | None = 128,
        loss_reduction: str = "mean",
        gather_negatives: bool = True,
        val_kmeans_sentences: int = 2000,
        kmeans_seed: int = 0,
        embed_batch_size: int = 64,
        fused_adamw: bool = True,
        region_weight: float = 0.0,
        region_temperature: float = 0.05,
        corpus: str | None = None,
        objective: str = "margin",
        decorrelation: float = 1.0,
        kernel_temperature: float = 0.1,
        kernel_whiten: int = 64,
        base_centroids: str | None = None,
        adapter_rank: int = 0,
        adapter_alpha: float = 16.0,
        kernel_units: str = "sentences",
        kernel_clause_words: int = 4,
        coherence: float = 0.0,
        kernel_refit_every: int = 0,
        kernel_refit_sentences: int = 4000,
    ) -> None:
        """
        Args:
            encoder: encoder spec for ``assets.load_encoder`` (offline alias, folder or Hub id).
            delta: margin of the contrastive loss (paper: 0.8).
            lr: peak AdamW learning rate (paper: 4e-5).
            warmup_ratio: share of all optimizer steps spent warming the learning rate up
                linearly; it then decays linearly to zero.
            weight_decay: AdamW weight decay, not applied to biases and LayerNorm weights.
            num_regions: ``K``, the number of k-means regions: 64, the default mark's (paper: 8).
            max_seq_length: truncate sentences to this many tokens (``None``: the encoder's own).
            loss_reduction: ``"mean"`` over pairs (default) or ``"sum"`` (the paper's formula).
                With AdamW the two differ by a constant factor that Adam's normalisation all but
                cancels; the mean keeps logged losses comparable across batch sizes and world
                sizes, and under DDP's gradient averaging it gives the same gradients as one
                process on the concatenated batch.
            gather_negatives: under DDP, search hardest negatives among every rank's paraphrases.
            val_kmeans_sentences: domain sentences for provisional validation centroids
                (0 disables region agreement until real centroids exist).
            kmeans_seed: seed of provisional k-means fits.
            embed_batch_size: batch size when embedding domain sentences without gradients.
            fused_adamw: use torch's fused AdamW kernel (CPU and GPU) instead of its per-parameter
                loop; same update, one kernel for all parameters. sentence-transformers' trainer
                uses it too (transformers' default optimizer).
            region_weight: weight of ``region_consistency_loss`` added to the margin loss
                (0, the default, trains with the paper's loss alone). Its centroids are the
                provisional ones (``val_kmeans_sentences`` domain sentences, refitted with the
                current encoder at the start of training and of every validation epoch).
            region_temperature: softmax temperature of that term, on cosines.
            corpus: corpus file whose sentences the provisional centroids are fitted on
                (``ksemstamp.text.corpusfile``; ``None``: the bundled news corpus). ``train.py``
                sets it from ``kmeans.corpus``, so that validation sees the final centroids'
                domain.
            objective: ``margin`` (the paper's loss on pairs) or ``kernel``
                (``loss.kernel_alignment_loss`` on windows of units: the retention of a
                sentence's score under paraphrase to 1, the correlation of different sentences
                of a text to 0, on the features the direction mark scores).
            decorrelation: weight of the kernel objective's correlation term.
            kernel_temperature: soft-context temperature of the kernel objective's features
                (the default mark's 0.1; 0: one context).
            kernel_whiten: principal components projected out of those features (the default
                mark's 64).
            base_centroids: centroid file of the base encoder whose mean, components and
                centroids define those features during training (``None``: the shipped file
                of ``encoder``). ``KMeansCallback`` refits all three for the trained encoder.
            adapter_rank: ``0`` fine-tunes every weight; ``r > 0`` freezes the encoder and
                trains rank-``r`` adapters (``ksemstamp.scheme.adapter``), which ship inside the
                centroid file instead of a whole encoder.
            adapter_alpha: the adapters' scale numerator (``alpha / r``).
            kernel_units: ``sentences`` or ``clauses``: what the kernel objective scores, as
                the mark's ``units`` (a unit's side sums its clauses' features).
            kernel_clause_words: the clauses' ``min_words`` (the mark's ``clause_words``).
            coherence: weight of the kernel objective's signed mean correlation of different
                units of one window, which sets a text's effective number of units.
            kernel_refit_every: ``n > 0`` refits the kernel features on the current encoder
                every ``n`` steps, as ``KMeansCallback`` refits them after training (``0``:
                the base file's throughout).
            kernel_refit_sentences: domain sentences those refits embed.
        """
        super().__init__()
        if delta <= 0:
            raise ValueError(f"delta must be > 0, got {delta}")
        if not 0.0 <= warmup_ratio < 1.0:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {warmup_ratio}")
        if num_regions < 2:
            raise ValueError(f"num_regions must be >= 2, got {num_regions}")
        if loss_reduction not in ("mean", "sum"):
            raise ValueError(f"loss_reduction must be 'mean' or 'sum', got {loss_reduction!r}")
        if region_weight < 0:
            raise ValueError(f"region_weight must be >= 0, got {region_weight}")
        if region_weight > 0 and val_kmeans_sentences <= 0:
            raise ValueError(
                "region_weight > 0 needs provisional centroids: set val_kmeans_sentences > 0"
            )
        if region_temperature <= 0:
            raise ValueError(f"region_temperature must be > 0, got {region_temperature}")
        if objective not in ("margin", "kernel"):
            raise ValueError(f"objective must be 'margin' or 'kernel', got {objective!r}")
        if adapter_rank < 0:
            raise ValueError(f"adapter_rank must be >= 0, got {adapter_rank}")
        self.save_hyperparameters()
        check_kernel_options(self.hparams)
        self.encoder = load_encoder(encoder)
        if max_seq_length:
            self.encoder.max_seq_length = max_seq_length
        if adapter_rank:
            add_adapters(self.encoder, adapter_rank, adapter_alpha)
        freeze_unused_pooler(self.encoder)
        # load_encoder returns an eval-mode model and Lightning keeps submodule modes as found;
        # fine-tune with dropout on, as sentence-transformers does.
        self.encoder.train()
        dim = self.encoder.get_embedding_dimension()
        # Buffers travel with state_dict, so checkpoints carry the centroids.
        self.register_buffer("centroids", torch.zeros(num_regions, dim))
        self.register_buffer("centroids_fitted", torch.tensor(False))
        # Centroids of validation and of the region term: the fitted buffer once it exists,
        # else provisional ones refitted with the current encoder.
        self._current_centroids: Tensor | None = None
        # The complete centroid file (mean, transitions, source) once KMeansCallback has fitted
        # the buffer; saved in, and restored from, the checkpoint's "ksemstamp" section.
        self.centroid_file: CentroidFile | None = None
        self._domain_cache: dict[int, list[str]] = {}
        self._refit_step: int | None = None  # the step the kernel features were last refitted at
        if objective == "kernel":
            if base_centroids is None and encoder not in DEFAULT_CENTROIDS:
                raise ValueError(f"the kernel objective needs base_centroids for {encoder!r}")
            self.kernel_features = KernelFeatures.from_file(
                base_centroids or DEFAULT_CENTROIDS[encoder], kernel_whiten, kernel_temperature
            )

    # ------------------------------------------------------------------ model

    def forward(self, texts: list[str]) -> Tensor:
        """``(N, D)`` sentence embeddings with gradients (``encode`` would run in inference mode),
        each text read in its ``reading_form`` as every other encoder pass reads it."""
        features = self.encoder.preprocess([reading_form(t) for t in texts])
        features = {
            k: v.to(self.device) if isinstance(v, Tensor) else v for k, v in features.items()
        }
        return self.encoder(features)["sentence_embedding"]

    @torch.no_grad()
    def embed_sharded(self, sentences: list[str], batch_size: int | None = None) -> Tensor:
        """``(N, D)`` unit embeddings of ``sentences`` on every rank, each rank embedding one shard.

        A collective call under DDP: every rank must call it with the same list. Shards are
        contiguous and padded to equal length (``all_gather`` needs equal shapes), so the gathered
        rows come back in the input order.
        """
        if not sentences:
            raise ValueError("no sentences to embed")
        batch_size = batch_size or self.hparams.embed_batch_size
        world = self.trainer.world_size if self._trainer is not None else 1
        rank = self.global_rank if self._trainer is not None else 0
        per_rank = math.ceil(len(sentences) / world)
        shard = sentences[rank * per_rank : (rank + 1) * per_rank]
        shard = shard + [sentences[-1]] * (per_rank - len(shard))
        was_training = self.training
        self.eval()  # no dropout while embedding
        emb = torch.cat([self(shard[i : i + batch_size]) for i in range(0, per_rank, batch_size)])
        self.train(was_training)
        emb = F.normalize(emb.float(), dim=-1)
        if world > 1:
            emb = self.all_gather(emb).reshape(-1, emb.shape[-1])
        return emb[: len(sentences)]

    def fit_centroids(self, embeddings: Tensor, seed: int | None = None) -> Tensor:
        """``(K, D)`` k-means centroids, fitted on rank 0 and broadcast (collective under DDP)."""
        seed = self.hparams.kmeans_seed if seed is None else seed
        centroids = None
        if self.global_rank == 0:
            centroids = fit_kmeans(embeddings.cpu(), k=self.hparams.num_regions, seed=seed)
        if self._trainer is not None:
            centroids = self.trainer.strategy.broadcast(centroids, src=0)
        return centroids.to(self.device)

    def set_centroids(self, centroids: Tensor) -> None:
        """Store fitted centroids in the buffer (saved with every later checkpoint)."""
        if centroids.shape != self.centroids.shape:
            raise ValueError(
                f"centroids must be {tuple(self.centroids.shape)}, got {tuple(centroids.shape)}"
            )
        self.centroids.copy_(F.normalize(centroids.float(), dim=-1))
        self.centroids_fitted.fill_(True)

    def domain_sentence_list(self, num_sentences: int) -> list[str]:
        """The first ``num_sentences`` domain sentences (the ``fit`` split of ``corpus``, or of
        the news corpus), cached."""
        if num_sentences not in self._domain_cache:
            domain = domain_documents(self.hparams.corpus, max_sentences=num_sentences)
            self._domain_cache[num_sentences] = domain.sentences
        return self._domain_cache[num_sentences]

    # ------------------------------------------------------------------ steps

    def _columns(self, positive: Tensor) -> tuple[Tensor, int]:
        """Negative columns and the offset of this rank's own paraphrases among them."""
        world = self.trainer.world_size
        if world > 1 and self.hparams.gather_negatives:
            # (world, B, D) with gradients flowing back to each rank's own rows.
            gathered = self.all_gather(positive, sync_grads=True)
            return gathered.reshape(-1, positive.shape[-1]), self.global_rank * positive.shape[0]
        return positive, 0

    def _embed_pairs(self, batch: dict[str, list[str]]) -> tuple[Tensor, Tensor]:
        # One pass per side, each padded to its own longest sentence. A single pass over both
        # sides pads every paraphrase to the longest text as well; on CPU that extra padding
        # cost more than the larger matrix products saved (about 10% per step on MiniLM).
        return self(batch["text"]), self(batch["paraphrase"])

    def _kernel_terms(self, windows: list[dict]) -> tuple[Tensor, ...]:
        """The kernel objective's anchors, positive and sentence columns (gathered from every
        rank under DDP, this rank's first) and their masks, for a batch of windows."""
        hp = self.hparams
        clause = functools.partial(clauses, min_words=hp.kernel_clause_words)
        batch = Batch.of(windows, clause if hp.kernel_units == "clauses" else None)
        emb = self(batch.sentences)
        phi = self.kernel_features(emb)
        count = batch.num_units
        anchor = unit_sums(phi[batch.anchor_rows], batch.anchor_owner, count)
        positive = unit_sums(phi[batch.positive_rows], batch.positive_owner, count)
        others = phi[batch.column_rows.to(phi.device)]
        positive_ok = batch.positive_ok.to(phi.device)
        others_ok = batch.others_ok.to(phi.device)
        if self._trainer is not None and self.trainer.world_size > 1 and hp.gather_negatives:
            positive, positive_ok = gather_columns(self, positive, positive_ok)
            others, others_ok = gather_columns(self, others, others_ok)
        # This rank's columns come first: the pairs of one window among them.
        return anchor, positive, others, positive_ok, others_ok, batch.same_text.to(phi.device)

    def _kernel_step(self, windows: list[dict]) -> tuple[Tensor, Tensor, int]:
        """The kernel objective's loss on ``windows``, its mean retention, its number of units."""
        *core, same_text = self._kernel_terms(windows)
        hp = self.hparams
        loss = kernel_alignment_loss(
            *core, hp.decorrelation, same_text=same_text, coherence=hp.coherence
        )
        anchor, positive = core[0], core[1]
        with torch.no_grad():
            retained = F.cosine_similarity(anchor, positive[: len(anchor)], dim=-1).mean()
        return loss, retained, len(anchor)

    def training_step(self, batch, batch_idx: int) -> Tensor:
        if self.hparams.objective == "kernel":
            loss, retained, n = self._kernel_step(batch)
            self.log("train/loss", loss, prog_bar=True, batch_size=n)
            self.log("train/retention", retained, batch_size=n)
            return loss
        anchor, positive = self._embed_pairs(batch)
        columns, offset = self._columns(positive)
        loss = margin_contrastive_loss(
            anchor,
            positive,
            columns,
            delta=self.hparams.delta,
            offset=offset,
            reduction=self.hparams.loss_reduction,
        )
        n = anchor.shape[0]
        if self.hparams.region_weight > 0:
            region = region_consistency_loss(
                anchor,
                positive,
                self._current_centroids,
                temperature=self.hparams.region_temperature,
                reduction=self.hparams.loss_reduction,
            )
            self.log("train/region_loss", region, batch_size=n)
            loss = loss + self.hparams.region_weight * region
        self.log("train/loss", loss, prog_bar=True, batch_size=n)
        with torch.no_grad():
            pos = F.cosine_similarity(anchor, positive, dim=-1).mean()
        self.log("train/pos_cos", pos, batch_size=n)
        return loss

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        every, step = self.hparams.kernel_refit_every, self.global_step
        due = self.hparams.objective == "kernel" and every and step % every == 0
        # Once per optimizer step: under gradient accumulation several batches share a step.
        if due and step != self._refit_step:
            self.refit_kernel_features()
            self._refit_step = step

    def refit_kernel_features(self) -> None:
        """Refit the kernel features on the current encoder (collective under DDP)."""
        emb = self.embed_sharded(self.domain_sentence_list(self.hparams.kernel_refit_sentences))
        self.kernel_features.refit(emb, self.fit_centroids(emb))

    def on_train_start(self) -> None:
        # Training moves the encoder, so centroids from an earlier run (a resumed final
        # checkpoint) no longer describe it; KMeansCallback refits them at the end.
        self.centroids_fitted.fill_(False)
        self.centroid_file = None
        if self.hparams.region_weight > 0 and (
            self._current_centroids is None or self._current_centroids is self.centroids
        ):
            # No sanity-check validation has fitted provisional centroids for this encoder.
            self._fit_provisional_centroids()

    def _fit_provisional_centroids(self) -> None:
        sentences = self.domain_sentence_list(self.hparams.val_kmeans_sentences)
        self._current_centroids = self.fit_centroids(self.embed_sharded(sentences))

    def on_validation_epoch_start(self) -> None:
        # Collective under DDP (embedding shards, broadcast): runs on every rank.
        if bool(self.centroids_fitted):
            self._current_centroids = self.centroids
        elif self.hparams.val_kmeans_sentences > 0:
            self._fit_provisional_centroids()
        else:
            self._current_centroids = None

    def validation_step(self, batch, batch_idx: int) -> None:
        if self.hparams.objective == "kernel":
            loss, retained, n = self._kernel_step(batch)
            self.log("val/retention", retained, prog_bar=True, batch_size=n, sync_dist=True)
            self.log("val/loss", loss, batch_size=n, sync_dist=True)
            return
        anchor, positive = self._embed_pairs(batch)
        n = anchor.shape[0]
        pos = F.cosine_similarity(anchor, positive, dim=-1)
        self.log("val/pos_cos", pos.mean(), batch_size=n, sync_dist=True)
        if n >= 2:  # a gap needs another pair in the batch
            self.log(
                "val/cos_gap", cosine_gap(anchor, positive).mean(), batch_size=n, sync_dist=True
            )
            loss = margin_contrastive_loss(
                anchor, positive, delta=self.hparams.delta, reduction="mean"
            )
            self.log("val/loss", loss, batch_size=n, sync_dist=True)
        if self._current_centroids is not None:
            text_regions, _ = kmeans_regions(anchor, self._current_centroids, 0.0)
            para_regions, _ = kmeans_regions(positive, self._current_centroids, 0.0)
            agree = (text_regions == para_regions).float().mean()
            self.log("val/region_agreement", agree, prog_bar=True, batch_size=n, sync_dist=True)

    # ------------------------------------------------------------------ optimisation

    def configure_optimizers(self):
        """AdamW (no decay on biases and norms), its rate scheduled by ``warmup_factor``."""
        decay, no_decay = [], []
        for param in self.encoder.parameters():
            if param.requires_grad:
                # 1-D tensors are biases and LayerNorm scales: decaying them only hurts.
                (no_decay if param.ndim < 2 else decay).append(param)
        optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": self.hparams.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=self.hparams.lr,
            fused=self.hparams.fused_adamw,
        )
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = int(round(self.hparams.warmup_ratio * total))
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, functools.partial(warmup_factor, warmup=warmup, total=total)
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    # ------------------------------------------------------------------ checkpoints

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # Tensors and plain types only, so the checkpoint still loads with weights_only=True.
        checkpoint["ksemstamp"] = {
            "encoder_fingerprint": encoder_fingerprint(self.encoder),
            "centroids_fitted": bool(self.centroids_fitted),
        }
        if self.centroid_file is not None:
            checkpoint["ksemstamp"]["centroid_file"] = self.centroid_file.to_payload()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        payload = checkpoint.get("ksemstamp", {}).get("centroid_file")
        self.centroid_file = (
            None if payload is None else CentroidFile.from_payload(payload, "checkpoint")
        )
