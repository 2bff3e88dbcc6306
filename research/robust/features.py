"""Feature maps the study compares, by name (``load_features``)."""

from __future__ import annotations

import torch

from ksemstamp.centroids import CentroidFile

from .common import DEFAULT_CENTROIDS, RUNS, BaseFeatures


def load_features(spec: str):
    """``base`` (the shipped default), ``base:k1`` (one direction), ``base:pcs=M``, or
    ``head:NAME`` (a head trained by ``research.robust.head``), ``ft:NAME``, or ``file:CENTROIDS``
    (a centroid file, with its adapter if it holds one; ``file:CENTROIDS;tau=T`` another
    context temperature), or ``proj:SIGNAL:d=D:eps=E:pcs=M`` (a closed-form projection,
    ``research.robust.projection``)."""
    if spec == "base":
        return BaseFeatures()
    if spec == "base:k1":
        return BaseFeatures(regions=False)
    if spec.startswith("base:pcs="):
        return BaseFeatures(whiten=int(spec.split("=")[1]))
    if spec.startswith("head:"):
        from .head import Head, HeadFeatures

        saved = torch.load(RUNS / f"head-{spec[5:]}.pt", weights_only=False)
        args = saved["args"]
        fitted = CentroidFile.load(DEFAULT_CENTROIDS)
        head = Head(fitted.mean, None, args["dim"], args["hidden"], init_whiten=False)
        head.load_state_dict(saved["state"])
        return HeadFeatures(head, fitted.centroids.float(), args["tau"], bool(args["regions"]))
    if spec.startswith("ft:"):
        return BaseFeatures(centroids=str(RUNS / f"ft-{spec[3:]}" / "centroids-k64.pt"))
    if spec.startswith("proj:"):
        from .projection import parse

        return parse(spec)
    if spec.startswith("file:"):
        path, _, tau = spec[5:].partition(";tau=")
        return BaseFeatures(centroids=path, tau=float(tau) if tau else 0.1)
    raise ValueError(f"unknown features {spec!r}")


def encoder_of(spec: str) -> str:
    """The encoder whose embeddings a feature spec reads."""
    if spec.startswith("ft:"):
        return str(RUNS / f"ft-{spec[3:]}")
    if spec.startswith("file:"):
        return spec.partition(";")[
            0
        ]  # the base encoder with the file's adapter (``EmbeddingCache``)
    return "all-minilm-l6-v2"
