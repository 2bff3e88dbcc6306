"""``EncoderModule``: the Lightning system that fine-tunes a sentence encoder for k-SemStamp.

The model inside is a plain ``SentenceTransformer``; the loss is the module's ``objective``
(``training.objectives``: the paper's margin loss on pairs, or the kernel objective on windows
of units). The module adds AdamW with linear warmup and decay, validation centroids, and the
k-means centroids as a buffer, so that ``EncoderModule.load_from_checkpoint`` restores them
with the weights.
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
from ..text.corpusfile import domain_documents
from ..text.reading import reading_form
from .objectives import Objective, objective_from_config
from .optim import freeze_unused_pooler, warmup_factor


class EncoderModule(L.LightningModule):
    """Fine-tunes a sentence-transformers encoder so that paraphrases keep their evidence.

    Validation logs the objective's figures (``val/loss`` and, for the margin objective,
    ``val/cos_gap`` and ``val/region_agreement``: the share of pairs whose text and paraphrase
    fall in the same k-means region). Those centroids are the fitted buffer once
    ``KMeansCallback`` has filled it, and otherwise *provisional* centroids fitted at the start
    of each validation epoch on ``val_kmeans_sentences`` domain sentences embedded with the
    current encoder: they measure what the watermark would see if training stopped now, since
    centroids are always refitted for a changed encoder.

    Args:
        encoder: encoder spec for ``assets.load_encoder`` (offline alias, folder or Hub id).
        objective: what the encoder learns (``training.objectives``; default the paper's margin
            loss). A checkpoint stores it as plain values, which this also takes.
        lr: peak AdamW learning rate (paper: 4e-5).
        warmup_ratio: share of all optimizer steps spent warming the learning rate up linearly;
            it then decays linearly to zero.
        weight_decay: AdamW weight decay, not applied to biases and LayerNorm weights.
        fused_adamw: torch's fused AdamW kernel (CPU and GPU) instead of its per-parameter loop;
            same update, one kernel for all parameters (transformers' default optimizer too).
        num_regions: ``K``, the number of k-means regions: 64, the default mark's (paper: 8).
        max_seq_length: truncate sentences to this many tokens (``None``: the encoder's own).
        val_kmeans_sentences: domain sentences for provisional validation centroids (0 disables
            region agreement until real centroids exist).
        kmeans_seed: seed of provisional k-means fits.
        embed_batch_size: batch size when embedding domain sentences without gradients.
        corpus: corpus file whose sentences the provisional centroids are fitted on
            (``ksemstamp.text.corpusfile``; ``None``: the bundled news corpus). ``train.py``
            sets it from ``kmeans.corpus``, so that validation sees the final centroids' domain.
        adapter_rank: ``0`` fine-tunes every weight; ``r > 0`` freezes the encoder and trains
            rank-``r`` adapters (``ksemstamp.scheme.adapter``), which ship inside the centroid
            file instead of a whole encoder.
        adapter_alpha: the adapters' scale numerator (``alpha / r``).
    """

    def __init__(
        self,
        encoder: str = DEFAULT_ENCODER,
        objective: Objective | None = None,
        lr: float = 4e-5,
        warmup_ratio: float = 0.1,
        weight_decay: float = 0.01,
        fused_adamw: bool = True,
        num_regions: int = 64,
        max_seq_length: int | None = 128,
        val_kmeans_sentences: int = 2000,
        kmeans_seed: int = 0,
        embed_batch_size: int = 64,
        corpus: str | None = None,
        adapter_rank: int = 0,
        adapter_alpha: float = 16.0,
    ) -> None:
        super().__init__()
        if not 0.0 <= warmup_ratio < 1.0:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {warmup_ratio}")
        if num_regions < 2:
            raise ValueError(f"num_regions must be >= 2, got {num_regions}")
        if adapter_rank < 0:
            raise ValueError(f"adapter_rank must be >= 0, got {adapter_rank}")
        self.objective = objective_from_config(objective)
        # Plain values only, so that checkpoints load with weights_only=True.
        self.save_hyperparameters(ignore=["objective"])
        self.hparams["objective"] = self.objective.config()
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
        # Validation's centroids (and the region term's): the fitted buffer once it exists,
        # else provisional ones refitted with the current encoder.
        self.current_centroids: Tensor | None = None
        # The complete centroid file (mean, transitions, source) once KMeansCallback has fitted
        # the buffer; saved in, and restored from, the checkpoint's "ksemstamp" section.
        self.centroid_file: CentroidFile | None = None
        self._domain_cache: dict[int, list[str]] = {}
        self.objective.bind(self)

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

    def fit_provisional_centroids(self) -> None:
        """Validation's centroids refitted on the current encoder (collective under DDP)."""
        sentences = self.domain_sentence_list(self.hparams.val_kmeans_sentences)
        self.current_centroids = self.fit_centroids(self.embed_sharded(sentences))

    def on_fit_start(self) -> None:
        data = getattr(self.trainer, "datamodule", None)
        batches = getattr(getattr(data, "hparams", None), "batches", None)
        if batches is not None and batches != self.objective.batches:
            raise ValueError(
                f"{type(self.objective).__name__} learns from {self.objective.batches}, but the "
                f"data module batches {batches}: set data.batches: {self.objective.batches}"
            )

    def on_train_start(self) -> None:
        # Training moves the encoder, so centroids from an earlier run (a resumed final
        # checkpoint) no longer describe it; KMeansCallback refits them at the end.
        self.centroids_fitted.fill_(False)
        self.centroid_file = None
        self.objective.on_train_start(self)

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        self.objective.on_train_batch_start(self)

    def training_step(self, batch, batch_idx: int) -> Tensor:
        return self.objective.step(self, batch, "train")

    def on_validation_epoch_start(self) -> None:
        # Collective under DDP (embedding shards, broadcast): runs on every rank.
        if bool(self.centroids_fitted):
            self.current_centroids = self.centroids
        elif self.hparams.val_kmeans_sentences > 0:
            self.fit_provisional_centroids()
        else:
            self.current_centroids = None

    def validation_step(self, batch, batch_idx: int) -> None:
        self.objective.step(self, batch, "val")

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
