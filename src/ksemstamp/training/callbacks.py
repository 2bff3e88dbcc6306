"""``KMeansCallback``: fit k-SemStamp centroids with the fine-tuned encoder once training ends."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from ..assets import encoder_fingerprint, load_encoder
from ..scheme.adapter import adapter_payload, base_fingerprint, merge_adapters
from ..scheme.centroids import centroid_file_from
from ..text.corpusfile import DomainSentences, domain_documents, require_sentences
from .module import EncoderModule


@dataclasses.dataclass(eq=False)
class KMeansCallback(L.Callback):
    """After training: embed domain sentences, fit k-means, store, checkpoint and export.

    The domain is ``corpus`` (a corpus file, see ``ksemstamp.text.corpusfile``) or the bundled news
    corpus. ``train.py`` passes the model's ``num_regions`` on, so the corpus is read and checked
    (not text, empty, too few sentences for K) when the callback is built, before training.

    Runs in ``on_train_end``: the distributed strategy is still up there (it is torn down before
    ``on_fit_end``), and every step below that talks to other ranks runs on every rank:

    1. each rank embeds its shard of the domain sentences; the shards are gathered;
    2. rank 0 fits k-means and broadcasts the centroids; every rank stores them in the module's
       ``centroids`` buffer, and the complete centroid file (mean, transitions, source) in
       ``module.centroid_file``;
    3. the checkpoint is written again (``final.ckpt`` beside the other checkpoints, or
       ``final_checkpoint``) so that it holds both: ``--model.checkpoint`` reads it;
    4. rank 0 exports the encoder as a sentence-transformers folder and writes the same
       ``CentroidFile`` naming that folder.
    """

    num_sentences: int = 20000
    """Domain sentences to fit k-means on (paper: sentences of 8k paragraphs)."""
    seed: int = 0
    """k-means seed."""
    batch_size: int = 64
    """Embedding batch size."""
    split: str = "fit"
    """The part of the corpus's documents the sentences come from (``fit`` keeps ``val`` and
    ``test`` unseen; ``all`` takes every document of a corpus file)."""
    min_words: int = 5
    """Skip shorter sentences (headlines, bylines)."""
    export_dir: str | None = "checkpoints/encoder-news"
    """Folder for the fine-tuned encoder (``None``: no export, no centroid file)."""
    centroid_file: str | None = "checkpoints/centroids-encoder-news-k64.pt"
    """Where to write the ``CentroidFile`` (``None``: not written)."""
    final_checkpoint: str | None = None
    """Path of the checkpoint written with the centroids; default ``final.ckpt`` in the
    ``ModelCheckpoint`` folder (or the trainer's root folder)."""
    corpus: str | None = None
    """Your domain's corpus file, plain text (one document per line) or JSONL with a ``text``
    field; ``None``: the bundled news corpus."""
    num_regions: int | None = None
    """K of the model (``train.py`` links it to ``model.num_regions``); when given, the domain
    is read and checked for K now rather than after training."""
    final_checkpoint_path: str | None = dataclasses.field(default=None, init=False)
    _domain: DomainSentences | None = dataclasses.field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        super().__init__()
        if self.num_sentences < 2:
            raise ValueError(f"num_sentences must be >= 2, got {self.num_sentences}")
        if self.centroid_file and not self.export_dir:
            raise ValueError("a centroid_file needs an export_dir: it must name a loadable encoder")
        if self.num_regions is not None:
            require_sentences(self.domain(), self.num_regions)

    def domain(self) -> DomainSentences:
        """The domain sentences, read once."""
        if self._domain is None:
            self._domain = domain_documents(
                self.corpus, self.num_sentences, self.min_words, self.split
            )
        return self._domain

    def _checkpoint_path(self, trainer: L.Trainer) -> Path:
        if self.final_checkpoint:
            return Path(self.final_checkpoint)
        callback = trainer.checkpoint_callback
        folder = getattr(callback, "dirpath", None) or trainer.default_root_dir
        return Path(folder) / "final.ckpt"

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not isinstance(pl_module, EncoderModule):
            raise TypeError(
                f"KMeansCallback needs an EncoderModule, got {type(pl_module).__name__}"
            )
        domain = self.domain()
        require_sentences(domain, pl_module.hparams.num_regions)
        emb = pl_module.embed_sharded(domain.sentences, self.batch_size)  # collective
        centroids = pl_module.fit_centroids(emb, self.seed)  # collective
        pl_module.set_centroids(centroids)

        path = self._checkpoint_path(trainer)
        # Every rank holds the same file, so the checkpoint is the same whichever rank's
        # state is written.
        pl_module.centroid_file = centroid_file_from(
            emb,
            [len(d) for d in domain.documents],
            pl_module.centroids,
            str(path),
            encoder_fingerprint(pl_module.encoder),
            {"seed": self.seed, "source": domain.source, "base_encoder": pl_module.hparams.encoder},
        )
        if pl_module.hparams.adapter_rank:
            # The file names the base encoder, its fingerprint and the adapter that turns it
            # into the trained one: a few hundred kilobytes that load with the base encoder.
            pl_module.centroid_file = dataclasses.replace(
                pl_module.centroid_file,
                encoder=pl_module.hparams.encoder,
                encoder_fingerprint=base_fingerprint(pl_module.encoder),
                adapter=adapter_payload(
                    pl_module.encoder,
                    pl_module.hparams.adapter_rank,
                    pl_module.hparams.adapter_alpha,
                ),
            )
        # Collective: every rank calls it, rank 0 writes. A full checkpoint (optimizer and loop
        # state too), like the ones ModelCheckpoint writes.
        trainer.save_checkpoint(path, weights_only=False)
        self.final_checkpoint_path = str(path)
        rank_zero_info(
            f"k-means: K = {pl_module.hparams.num_regions} centroids on {len(emb)} sentences of "
            f"{domain.source}; written to {path}"
        )

        if trainer.is_global_zero and self.export_dir:
            self._export(pl_module, str(path))
        trainer.strategy.barrier("kmeans-export")

    def _export(self, module: EncoderModule, checkpoint: str) -> None:
        export_dir = Path(self.export_dir)
        export_dir.mkdir(parents=True, exist_ok=True)
        encoder = module.encoder
        if module.hparams.adapter_rank:
            # The folder holds the adapted weights merged into plain layers.
            encoder = copy.deepcopy(encoder)
            merge_adapters(encoder)
        encoder.save(str(export_dir))
        # Fingerprint the folder as detection will load it, and insist it matches the weights in
        # memory: a mismatch would make every later fingerprint check fail.
        reloaded = encoder_fingerprint(load_encoder(str(export_dir)))
        in_memory = encoder_fingerprint(encoder)
        if reloaded != in_memory:
            raise RuntimeError(
                f"exported encoder at {export_dir} reloads with fingerprint {reloaded}, "
                f"but the trained weights have {in_memory}"
            )
        if not self.centroid_file:
            return
        fitted = module.centroid_file
        assert fitted is not None
        if fitted.adapter is not None:
            # Base encoder + adapter: the file stands alone beside the shipped base encoder.
            fitted = dataclasses.replace(
                fitted, settings={**fitted.settings, "checkpoint": checkpoint}
            )
        else:
            fitted = dataclasses.replace(
                fitted,
                encoder=str(export_dir),
                settings={**fitted.settings, "checkpoint": checkpoint},
            )
        fitted.save(self.centroid_file)


class DeviceProbe(L.Callback):
    """Reads where training runs, at the first training step: the strategy's device and the
    device of the model's first parameter (``trainer_device``, ``model_device``; ``None``
    until a step ran). Read after ``fit`` they would say less: Lightning's teardown moves the
    model back to the CPU. ``ksemstamp gpucheck`` adds it to its training run."""

    def __init__(self) -> None:
        self.trainer_device: str | None = None
        self.model_device: str | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.trainer_device is None:
            self.trainer_device = str(trainer.strategy.root_device)
            self.model_device = str(next(pl_module.parameters()).device)
