import pytest
import torch

from lab.leakage import alignment, estimate_directions, repetition


def _units(
    signal: float, count: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``count`` unit vectors in 16 dimensions, each leaning ``signal`` toward its region's
    direction (4 regions, one-hot contexts), and the true directions."""
    g = torch.Generator().manual_seed(seed)
    true = torch.nn.functional.normalize(torch.randn(4, 16, generator=g), dim=-1)
    regions = torch.arange(count) % 4
    noise = torch.nn.functional.normalize(torch.randn(count, 16, generator=g), dim=-1)
    vectors = torch.nn.functional.normalize(noise + signal * true[regions], dim=-1)
    return vectors, torch.nn.functional.one_hot(regions, 4).double(), true


def test_the_estimate_finds_a_planted_direction_and_not_an_absent_one():
    strong = _units(2.0, 400)
    none = _units(0.0, 400)
    weak = _units(0.3, 400)
    cosine = {
        name: alignment(estimate_directions(v, w), t, w.sum(dim=0))
        for name, (v, w, t) in {"strong": strong, "none": none, "weak": weak}.items()
    }
    assert cosine["strong"] > 0.95
    assert abs(cosine["none"]) < 0.25
    assert cosine["none"] < cosine["weak"] < cosine["strong"]


def test_a_region_no_unit_weighs_counts_for_nothing():
    vectors, weights, true = _units(2.0, 40)
    weights[:, 3] = 0
    estimated = estimate_directions(vectors, weights)
    assert torch.all(estimated[3] == 0)
    mass = weights.sum(dim=0)
    assert alignment(estimated, true, mass) > 0.9
    # The true directions' norm does not matter (the key's are Gaussian, of norm ~sqrt(D)).
    assert alignment(estimated, 20 * true, mass) == pytest.approx(alignment(estimated, true, mass))


def test_repetition_counts_repeated_trigrams_and_distinct_bigrams():
    assert repetition("a b c d e") == (0.0, 1.0)
    repeated, distinct = repetition("a b c a b c")
    assert repeated == 1 / 4  # "a b c" again; "b c a" and "c a b" are new
    assert distinct == 3 / 5
    assert repetition("one") == (0.0, 1.0)
