"""The margin contrastive loss: numerics on hand-made embeddings and cross-rank gradients."""

from __future__ import annotations

import math
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401 - registers torch.distributed.nn.functional
import torch.multiprocessing as mp
import torch.nn.functional as F

from ksemstamp.training.loss import (
    cosine_gap,
    hardest_negative_cosines,
    margin_contrastive_loss,
    region_consistency_loss,
)


def unit(*angles_deg: float) -> torch.Tensor:
    """Unit vectors in the plane at the given angles, so cosines are known exactly."""
    rad = torch.tensor(angles_deg, dtype=torch.float64) * math.pi / 180
    return torch.stack([torch.cos(rad), torch.sin(rad)], dim=-1)


def cosd(deg: float) -> float:
    return math.cos(math.radians(deg))


def test_hinge_matches_formula_with_hardest_negative():
    # Anchors at 0, 40 and 200 degrees, each positive 20 degrees further on.
    anchor = unit(0, 40, 200)
    positive = unit(20, 60, 220)
    losses = margin_contrastive_loss(anchor, positive, delta=0.8, reduction="none")
    expected = [
        0.8 - cosd(20) + cosd(60),  # anchor 0: other columns 60 and 140 degrees away; active
        0.8 - cosd(20) + cosd(20),  # anchor 40: column 20 is as close as its own positive
        0.0,  # anchor 200: other columns 180 and 140 degrees away; the hinge is inactive
    ]
    assert torch.allclose(losses, torch.tensor(expected, dtype=torch.float64), atol=1e-12)
    assert torch.isclose(margin_contrastive_loss(anchor, positive), losses.sum())
    assert torch.isclose(margin_contrastive_loss(anchor, positive, reduction="mean"), losses.mean())


def test_hinge_inactive_when_gap_exceeds_delta():
    # Positives identical to anchors, negatives orthogonal or opposite: gap >= 1 > delta.
    anchor = unit(0, 90, 180, 270)
    losses = margin_contrastive_loss(anchor, anchor.clone(), delta=0.8, reduction="none")
    assert torch.all(losses == 0)
    # ...and active again once delta exceeds the gap of 1.
    assert torch.allclose(
        margin_contrastive_loss(anchor, anchor.clone(), delta=1.5, reduction="none"),
        torch.full((4,), 0.5, dtype=torch.float64),
    )


def test_hardest_negative_is_the_most_similar_other_column_and_gets_the_gradient():
    anchor = unit(0, 120)
    positive = unit(0, 120)
    # Extra candidate columns (as if gathered from another rank): 30 and 200 degrees.
    candidates = torch.cat([unit(30, 200), positive]).requires_grad_(True)
    neg = hardest_negative_cosines(anchor, candidates, offset=2)
    assert torch.allclose(neg, torch.tensor([cosd(30), cosd(80)], dtype=torch.float64))
    margin_contrastive_loss(anchor, positive, candidates, delta=2.0, offset=2).backward()
    touched = candidates.grad.abs().sum(dim=-1) > 0
    # Column 0 (hardest for anchor 0) and column 1 (200 deg: 80 from anchor 1) get gradient;
    # the own positives, masked out of the max, get none through the negative term.
    assert touched.tolist() == [True, True, False, False]


def test_own_positive_is_excluded_even_when_offset():
    anchor = unit(0)
    candidates = unit(90, 0, 45)  # own column at offset 1 is identical to the anchor
    assert torch.isclose(
        hardest_negative_cosines(anchor, candidates, offset=1)[0],
        torch.tensor(cosd(45), dtype=torch.float64),
    )


def test_cosine_gap_sign():
    anchor = unit(0, 90)
    assert torch.all(cosine_gap(anchor, unit(5, 95)) > 0)
    assert torch.all(cosine_gap(anchor, unit(95, 5)) < 0)  # paraphrases swapped


def test_invalid_arguments_raise():
    a = unit(0, 90)
    with pytest.raises(ValueError):
        margin_contrastive_loss(a, unit(0, 90, 180))
    with pytest.raises(ValueError):
        margin_contrastive_loss(a, a, reduction="max")
    with pytest.raises(ValueError):
        margin_contrastive_loss(unit(0), unit(0))  # one pair: no negative exists
    with pytest.raises(ValueError):
        hardest_negative_cosines(a, a, offset=1)


# --------------------------------------------------------------------------- region consistency


def test_region_term_matches_cross_entropy_toward_midpoint_region():
    centroids = unit(0, 90)
    tau = 0.1
    anchor, positive = unit(10), unit(30)  # midpoint 20 degrees: region of the 0-degree centroid

    def ce(deg: float) -> float:
        own, other = cosd(deg) / tau, cosd(90 - deg) / tau
        return -(own - math.log(math.exp(own) + math.exp(other)))

    loss = region_consistency_loss(anchor, positive, centroids, temperature=tau)
    assert math.isclose(loss.item(), 0.5 * (ce(10) + ce(30)), rel_tol=1e-9)


def test_region_term_pulls_a_straddling_pair_into_one_region():
    # The boundary is at 45 degrees; the text (40) and paraphrase (60) sit on either side, and
    # their midpoint (50) lies in the 90-degree region, so both must move toward 90 degrees.
    centroids = unit(0, 90)
    rad = torch.tensor([40.0, 60.0], dtype=torch.float64).mul(math.pi / 180).requires_grad_()
    vecs = torch.stack([torch.cos(rad), torch.sin(rad)], dim=-1)
    region_consistency_loss(vecs[:1], vecs[1:], centroids, temperature=0.1).backward()
    assert torch.all(rad.grad < 0)  # gradient descent raises both angles


def test_region_term_vanishes_deep_inside_a_region_and_ignores_scale():
    centroids = unit(0, 90, 180, 270)
    deep = region_consistency_loss(unit(0), unit(3), centroids, temperature=0.05)
    edge = region_consistency_loss(unit(40), unit(50), centroids, temperature=0.05)
    assert deep.item() < 1e-6 < edge.item()
    scaled = region_consistency_loss(7 * unit(40), 0.5 * unit(50), 3 * centroids, temperature=0.05)
    assert torch.isclose(scaled, edge)


def test_region_term_treats_centroids_as_constants_and_checks_arguments():
    centroids = unit(0, 90).requires_grad_()
    anchor = unit(40).requires_grad_()
    region_consistency_loss(anchor, unit(60), centroids).backward()
    assert anchor.grad is not None and centroids.grad is None
    with pytest.raises(ValueError):
        region_consistency_loss(unit(0), unit(0, 90), unit(0, 90))
    with pytest.raises(ValueError):
        region_consistency_loss(unit(0), unit(0), torch.ones(2, 3, dtype=torch.float64))
    with pytest.raises(ValueError):
        region_consistency_loss(unit(0), unit(0), unit(0, 90), temperature=0.0)
    with pytest.raises(ValueError):
        region_consistency_loss(unit(0), unit(0), unit(0, 90), reduction="max")


# --------------------------------------------------------------------------- gradients under DDP

WORLD, BATCH, D_IN, D_OUT = 2, 4, 6, 5


def _data():
    gen = torch.Generator().manual_seed(0)
    texts = torch.randn(WORLD * BATCH, D_IN, generator=gen)
    paras = texts + 0.3 * torch.randn(WORLD * BATCH, D_IN, generator=gen)
    return texts, paras


def _encoder() -> torch.nn.Linear:
    torch.manual_seed(1)
    return torch.nn.Linear(D_IN, D_OUT).double()


def _single_process_grads() -> list[torch.Tensor]:
    texts, paras = _data()
    enc = _encoder()
    loss = margin_contrastive_loss(
        enc(texts.double()), enc(paras.double()), delta=0.8, reduction="mean"
    )
    loss.backward()
    return [p.grad.clone() for p in enc.parameters()]


def _rank_worker(rank: int, port: int, out_path: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        texts, paras = _data()
        rows = slice(rank * BATCH, (rank + 1) * BATCH)
        enc = _encoder()
        anchor, positive = enc(texts[rows].double()), enc(paras[rows].double())
        # The gather Lightning's all_gather(..., sync_grads=True) performs under DDP.
        gathered = torch.stack(torch.distributed.nn.functional.all_gather(positive))
        columns = gathered.reshape(-1, D_OUT)
        loss = margin_contrastive_loss(
            anchor, positive, columns, delta=0.8, offset=rank * BATCH, reduction="mean"
        )
        loss.backward()
        grads = []
        for p in enc.parameters():
            g = p.grad.clone()
            dist.all_reduce(g)  # DDP averages gradients over ranks
            grads.append(g / WORLD)
        if rank == 0:
            torch.save(grads, out_path)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # two processes
def test_two_rank_gathered_loss_gives_single_process_gradients(tmp_path):
    out = tmp_path / "grads.pt"
    mp.spawn(_rank_worker, args=(_free_port(), str(out)), nprocs=WORLD, join=True)
    ddp = torch.load(out, weights_only=True)
    single = _single_process_grads()
    for g_ddp, g_one in zip(ddp, single, strict=True):
        assert torch.allclose(g_ddp, g_one, atol=1e-10, rtol=1e-8)
    # A check that can fail: without gathered negatives the gradients differ.
    texts, paras = _data()
    enc = _encoder()
    local = (
        sum(
            margin_contrastive_loss(
                enc(texts[r * BATCH : (r + 1) * BATCH].double()),
                enc(paras[r * BATCH : (r + 1) * BATCH].double()),
                reduction="mean",
            )
            for r in range(WORLD)
        )
        / WORLD
    )
    local.backward()
    assert not torch.allclose(enc.weight.grad, single[0], atol=1e-6)


def test_normalisation_makes_scale_irrelevant():
    a, p = F.normalize(torch.randn(5, 8), dim=-1), F.normalize(torch.randn(5, 8), dim=-1)
    assert torch.isclose(margin_contrastive_loss(a, p), margin_contrastive_loss(3 * a, 0.5 * p))
