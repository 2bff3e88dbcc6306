import math

import pytest
import torch

from ksemstamp.keys import DEMO_KEY, key_fingerprint, num_valid, resolve_key, valid_table


@pytest.mark.parametrize("k,gamma", [(8, 0.25), (8, 0.5), (16, 0.25), (4, 0.75)])
def test_rows_have_exactly_gamma_k_valid(k, gamma):
    for mode in ("keyed", "paper"):
        table = valid_table(k, gamma, "secret", mode)
        assert table.shape == (k, k)
        assert table.sum(1).tolist() == [round(gamma * k)] * k


def test_keyed_table_deterministic_and_key_dependent():
    a = valid_table(8, 0.25, "alpha")
    assert torch.equal(a, valid_table(8, 0.25, "alpha"))
    others = [valid_table(8, 0.25, f"key-{i}") for i in range(5)]
    assert all(not torch.equal(a, o) for o in others)


def test_paper_table_is_the_seeded_permutation():
    table = valid_table(8, 0.25, None, "paper")
    for q in range(8):
        gen = torch.Generator().manual_seed(q * 15485863)
        assert set(torch.randperm(8, generator=gen)[:2].tolist()) == set(
            torch.nonzero(table[q]).flatten().tolist()
        )


def test_keyed_rows_look_uniform():
    # Each region should be chosen about gamma of the time over many keys (binomial bound).
    n_keys, k = 400, 8
    counts = torch.zeros(k, k)
    for i in range(n_keys):
        counts += valid_table(k, 0.25, f"k{i}").float()
    sd = math.sqrt(n_keys * 0.25 * 0.75)
    assert (counts - n_keys * 0.25).abs().max() < 5 * sd


def test_bad_gamma_is_explained():
    with pytest.raises(ValueError, match="multiple of 1/K"):
        num_valid(8, 0.3)
    with pytest.raises(ValueError):
        num_valid(8, 1.0)
    with pytest.raises(ValueError):
        valid_table(8, 0.25, "k", mode="nope")


def test_key_resolution_and_fingerprint(monkeypatch):
    monkeypatch.delenv("KSEMSTAMP_KEY", raising=False)
    with pytest.warns(UserWarning, match="public demo key"):
        assert resolve_key(None) == DEMO_KEY
    monkeypatch.setenv("KSEMSTAMP_KEY", "from-env")
    assert resolve_key(None) == "from-env"
    assert resolve_key("explicit") == "explicit"
    fp = key_fingerprint("from-env")
    assert fp != key_fingerprint("other") and "from-env" not in fp
