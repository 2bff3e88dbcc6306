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


# ---------------------------------------------------------------------- key strength


def test_a_new_key_is_strong_and_new_every_time():
    from ksemstamp.keys import check_key, key_entropy_bits, new_key

    keys = {new_key() for _ in range(5)}
    assert len(keys) == 5 and all(len(k) == 64 and int(k, 16) >= 0 for k in keys)
    assert all(key_entropy_bits(k) == 256 for k in keys)
    for k in keys:
        check_key(k)


@pytest.mark.parametrize(
    ("key", "strong"),
    [
        ("abcd", False),  # four hex digits: 16 bits
        ("test-suite-key", False),
        ("correct-horse", False),
        ("deadbeef" * 8, False),  # one short key, repeated
        ("x" * 100, False),
        ("0123456789" * 3 + "17", False),  # 32 decimal digits: 106 bits
        ("9f" * 15 + "a0", True),  # 32 hex digits: 128 bits
        ("Tr0ub4dor&3-Tr0ub4dor&4xq", True),  # what length and alphabet can tell
    ],
)
def test_keys_under_128_bits_are_refused_with_the_reason(monkeypatch, key, strong):
    from ksemstamp.keys import WEAK_KEY_ENV, check_key

    monkeypatch.delenv(WEAK_KEY_ENV, raising=False)
    if strong:
        check_key(key)
        return
    with pytest.raises(ValueError, match="too weak") as err:
        check_key(key)
    message = str(err.value)
    assert key not in message and "brute" not in message  # the reason, never the key
    assert "fingerprint" in message and "watermark.py keygen" in message
    assert "allow_weak_key" in message and WEAK_KEY_ENV in message
    check_key(key, allow_weak=True)  # asked for explicitly
    monkeypatch.setenv(WEAK_KEY_ENV, "1")
    check_key(key)


def test_the_demo_key_stays_usable(monkeypatch):
    from ksemstamp.keys import WEAK_KEY_ENV, check_key

    monkeypatch.delenv(WEAK_KEY_ENV, raising=False)
    check_key(DEMO_KEY)


def test_the_command_line_refuses_a_weak_key_before_loading_a_model(monkeypatch, capsys):
    import ksemstamp.assets
    from ksemstamp.cli import main
    from ksemstamp.keys import WEAK_KEY_ENV

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(ksemstamp.assets, "load_encoder", no_model)
    monkeypatch.delenv(WEAK_KEY_ENV, raising=False)
    monkeypatch.setenv("KSEMSTAMP_KEY", "abcd")
    assert main(["detect", "--text", "One. Two. Three.", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("error: the watermark key is too weak: about 16 bits") and "abcd" not in err
    )
    assert main(["keygen"]) == 0
    printed = capsys.readouterr().out.strip()
    assert len(printed) == 64 and int(printed, 16) >= 0
