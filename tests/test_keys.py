import math
import shutil
import subprocess

import pytest
import torch

from ksemstamp.keys import DEMO_KEY, key_fingerprint, resolve_key
from ksemstamp.scheme.cudarand import cuda_randperm, curand_words, philox4x32_10, randperm_key_bits
from ksemstamp.scheme.keyed import num_valid, valid_table


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


# The reference code's table: row q = the first gamma*K of torch.randperm(K) on a CUDA generator
# seeded with q * 15485863. For K = 8, recomputed by ksemstamp.scheme.cudarand; no sort key repeats in
# these rows, so they rest on the Philox stream and the sort by the keys' low 9 bits alone.
PAPER_K8_ROWS = [[5, 2], [6, 2], [5, 2], [6, 0], [7, 2], [1, 4], [0, 3], [6, 3]]


def test_paper_table_is_the_reference_codes_cuda_table():
    table = valid_table(8, 0.25, None, "paper")
    for q, row in enumerate(PAPER_K8_ROWS):
        assert set(torch.nonzero(table[q]).flatten().tolist()) == set(row)
        assert cuda_randperm(8, q * 15485863)[:2] == row
    # One region of eight is valid after itself (region 2); a CPU generator seeded the same
    # way gives another table, with five.
    assert int(table.diagonal().sum()) == 1


def test_philox_matches_random123_known_answers():
    # Random123's kat_vectors for philox4x32 with 10 rounds: counter, key, expected output.
    m = 0xFFFFFFFF
    assert philox4x32_10((0, 0, 0, 0), (0, 0)) == (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)
    assert philox4x32_10((m, m, m, m), (m, m)) == (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)
    assert philox4x32_10(
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0)
    ) == (
        0xD16CFE09,
        0x94FDCCEB,
        0x5001E420,
        0x24126EA1,
    )


def _box_muller(x: int, y: int) -> float:
    # cuRAND's curand_normal: the first value of _curand_box_muller.
    u = x * 2.0**-32 + 2.0**-33
    v = y * 2.0**-32 * 2 * math.pi + 2.0**-32 * math.pi
    return math.sqrt(-2 * math.log(u)) * math.sin(v)


def test_curand_stream_matches_values_printed_from_real_gpus():
    """Element i of a small CUDA tensor takes thread i's first Philox block at offset 0; values
    printed from GPUs in PyTorch's issue tracker pin that layout."""
    # torch.manual_seed(0); uniform on cuda (pytorch/pytorch#47347).
    uniform = [curand_words(0, i, 0, 1)[0] * 2.0**-32 + 2.0**-33 for i in range(5)]
    assert [round(u, 4) for u in uniform] == [0.3990, 0.5167, 0.0249, 0.9401, 0.9459]
    # torch.manual_seed(10); torch.randn(3, device="cuda") (pytorch/pytorch#79496).
    normal = [_box_muller(*curand_words(10, i, 0, 2)) for i in range(3)]
    assert [round(z, 4) for z in normal] == [-0.1029, 1.6810, -0.2708]
    # torch.randn(..., generator=torch.Generator("cuda").manual_seed(42)) (pytorch/pytorch#158398).
    normal = [_box_muller(*curand_words(42, i, 0, 2)) for i in range(3)]
    assert [round(z, 4) for z in normal] == [0.1940, 2.1614, -0.1721]


def test_curand_offset_counts_words_within_and_across_blocks():
    block0 = philox4x32_10((0, 0, 7, 0), (123, 0))
    block1 = philox4x32_10((1, 0, 7, 0), (123, 0))
    assert curand_words(123, 7, 0, 8) == [*block0, *block1]
    assert curand_words(123, 7, 4, 2) == list(block1[:2])
    assert curand_words(123, 7, 2, 3) == [block0[2], block0[3], block1[0]]


def test_cuda_randperm_shuffles_runs_of_equal_sort_keys():
    """Rows whose sort keys repeat (an island) are reshuffled by Fisher-Yates from the island's
    start with the words at offset 4; n = 16, seed 15485863 has one island of two."""
    n, seed = 16, 15485863
    mask = (1 << randperm_key_bits(n)) - 1
    keys = [(curand_words(seed, i, 0, 1)[0] % 0xFFFFFFFF) & mask for i in range(n)]
    plain = sorted(range(n), key=keys.__getitem__)
    low = [keys[i] for i in plain]
    start = next(i for i in range(n - 1) if low[i] == low[i + 1])
    assert low.count(low[start]) == 2
    expected = list(plain)
    if curand_words(seed, start, 4, 1)[0] % 2 == 0:
        expected[start], expected[start + 1] = expected[start + 1], expected[start]
    assert cuda_randperm(n, seed) == expected
    for k in (8, 16, 64):
        assert sorted(cuda_randperm(k, 3 * 15485863)) == list(range(k))
    assert randperm_key_bits(8) == 9 and randperm_key_bits(64) == 15
    with pytest.raises(ValueError):
        cuda_randperm(4096, 0)


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
    from ksemstamp.keys import MIN_KEY_BITS, check_key, key_entropy_bits, new_key

    keys = {new_key() for _ in range(5)}
    assert len(keys) == 5 and all(len(k) == 64 and int(k, 16) >= 0 for k in keys)
    assert all(key_entropy_bits(k) >= MIN_KEY_BITS + 40 for k in keys)  # with room to spare
    for k in keys:
        check_key(k)


GUESSABLE = [
    "abcd",
    "test-suite-key",
    "correct-horse",
    "deadbeef" * 8,  # one short key, repeated
    "x" * 100,
    "x" * 10_000,  # longer than the estimator reads at once
    "0123456789" * 3 + "17",
    "9f" * 15 + "a0",  # a repeat, though 32 hex digits
    "Tr0ub4dor&3-Tr0ub4dor&4xq",  # a word with look-alike letters, repeated
    # guessable keys that length and character classes let through
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab",
    "0" * 39 + "1",
    "abcdefghijklmnopqrstuvwxyzab",
    "passwordpasswordpasswordpassword1",
    "Password1!" * 4,
]
STRONG = [
    "f3a1c9e07b2d48865e1fa0c37d9b2e6041c8f5a7",  # 40 random hex digits
    "dIdFofwb6dn5w6Ewekt2pQNQMuqjpq-glr5yU_z6CWE",  # secrets.token_urlsafe(32)
    "7d1b" + "c94e2a0f5b8613d7e9f2a4c0b6d8e1f3a5c7b9d0e2f4a6c8b1d3e5f7a9c0b2d4e6f8a1c3",
]


# zxcvbn's brute force counts 10 guesses a character whatever the alphabet: random keys
# need about 40 characters (keygen's 64 hex digits are well over).
@pytest.mark.parametrize(
    ("key", "strong"), [(k, False) for k in GUESSABLE] + [(k, True) for k in STRONG]
)
def test_guessable_keys_are_refused_with_the_reason(monkeypatch, key, strong):
    from ksemstamp.keys import WEAK_KEY_ENV, check_key

    monkeypatch.delenv(WEAK_KEY_ENV, raising=False)
    if strong:
        check_key(key)
        return
    with pytest.raises(ValueError, match="too weak") as err:
        check_key(key)
    message = str(err.value)
    assert key not in message and "brute" not in message  # the reason, never the key
    assert "fingerprint" in message and "ksemstamp keygen" in message
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
    assert err.startswith("error: the watermark key is too weak: about ") and "abcd" not in err
    assert len(err.strip().splitlines()) == 1
    assert main(["keygen"]) == 0
    printed = capsys.readouterr().out.strip()
    assert len(printed) == 64 and int(printed, 16) >= 0


# ---------------------------------------------------------------------- keys the standard tools make

TOOL_KEYS = [
    "6c5678aa9775d3461eb2c2b3992434b3",  # openssl rand -hex 16 (128 bits)
    "c5a1935a139bb9a968c6135819c78b84",
    "o0m1B+zD19n8LlME+Imdy8mmgOFiqEqL",  # openssl rand -base64 24 (192 bits)
    "j/bDVErNb1MtzRuiMCTfxRePaTjUx2W3",
    "LQVCj4oL3BWz4BkcZmo8Yw",  # python -c 'import secrets; print(secrets.token_urlsafe(16))'
    "sv9Tfwq86cjO2SWqDMK-JA",
]
# Guessable keys that are valid hex or base64 all the same: counted by zxcvbn, and refused.
ENCODED_GUESSES = [
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab",  # hex, one byte repeated
    "0123456789abcdef0123456789abcdef",  # hex, a sequence
    "000102030405060708090a0b0c0d0e0f",  # hex, a counter
    "19870512198706131987071419870815",  # hex digits that are dates
    "deadbeefcafebabe" * 2,  # hex words
    "correcthorsebatterystaplexy",  # base64 alphabet: words
    "CorrectHorseBatteryStaple12",
    "QwertyuiopAsdfghjklZxcvbnm12",  # a keyboard walk
    "PasswordPasswordPassword",
]


@pytest.mark.parametrize("key", TOOL_KEYS)
def test_keys_the_standard_tools_make_are_accepted(monkeypatch, key):
    from ksemstamp.keys import WEAK_KEY_ENV, check_key, key_entropy_bits, key_strength

    monkeypatch.delenv(WEAK_KEY_ENV, raising=False)
    assert key_entropy_bits(key) < 128  # zxcvbn alone under-counts random strings
    strength = key_strength(key)
    assert strength.basis in ("hex", "base64") and strength.bits >= 128
    check_key(key)


def test_random_keys_in_every_standard_form_are_accepted(monkeypatch):
    import base64
    import random

    from ksemstamp.keys import WEAK_KEY_ENV, check_key

    monkeypatch.delenv(WEAK_KEY_ENV, raising=False)
    rng = random.Random(54)
    for _ in range(100):
        for size in (16, 24, 32):
            data = rng.randbytes(size)
            check_key(data.hex())
            check_key(base64.b64encode(data).decode())
            check_key(base64.urlsafe_b64encode(data).decode().rstrip("="))
    # openssl's long base64 output comes in lines of 64 characters
    wrapped = base64.encodebytes(rng.randbytes(64)).decode()
    assert "\n" in wrapped.strip()
    check_key(wrapped)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl")
@pytest.mark.parametrize(
    "command", [["openssl", "rand", "-hex", "16"], ["openssl", "rand", "-base64", "24"]]
)
def test_a_key_from_openssl_is_accepted(monkeypatch, command):
    from ksemstamp.keys import WEAK_KEY_ENV, check_key

    monkeypatch.delenv(WEAK_KEY_ENV, raising=False)
    check_key(subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip())


@pytest.mark.parametrize("key", ENCODED_GUESSES)
def test_guessable_keys_that_decode_as_hex_or_base64_are_still_refused(monkeypatch, key):
    from ksemstamp.keys import WEAK_KEY_ENV, check_key, decode_key

    monkeypatch.delenv(WEAK_KEY_ENV, raising=False)
    assert decode_key(key) is not None
    with pytest.raises(ValueError, match="zxcvbn"):
        check_key(key)


def test_a_short_random_key_is_refused_by_its_length(monkeypatch):
    from ksemstamp.keys import WEAK_KEY_ENV, check_key

    monkeypatch.delenv(WEAK_KEY_ENV, raising=False)
    with pytest.raises(ValueError, match=r"8 random bytes in hex \(64 bits\), under the 128"):
        check_key("9c1f04be73a5d862")  # openssl rand -hex 8


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_key_is_an_error_not_the_demo_key(monkeypatch, value):
    monkeypatch.setenv("KSEMSTAMP_KEY", value)
    with pytest.raises(ValueError, match="KSEMSTAMP_KEY is set but empty"):
        resolve_key(None)
    monkeypatch.delenv("KSEMSTAMP_KEY")
    with pytest.raises(ValueError, match="the watermark key is empty"):
        resolve_key(value)
    with pytest.warns(UserWarning, match="demo key"):
        assert resolve_key(None) == DEMO_KEY  # unset: the demo key, with a warning


@pytest.mark.parametrize("command", [["demo"], ["detect", "--text", "One. Two. Three."]])
def test_the_command_line_refuses_an_empty_key_variable(monkeypatch, capsys, command):
    import ksemstamp.assets
    from ksemstamp.cli import main

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(ksemstamp.assets, "load_encoder", no_model)
    monkeypatch.setenv("KSEMSTAMP_KEY", "")  # what a failed `$(ksemstamp keygen)` leaves
    assert main([*command, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "KSEMSTAMP_KEY is set but empty" in err and "demo key" in err


# ---------------------------------------------------------------------- keys that read as words

PHRASES = [
    "TheQuickBrownFoxJumpsOverTheLazyDogEveryMorningAtNine",  # zxcvbn alone: 141 bits
    "the council met on monday and approved the budget for schools",
    "It-Was-The-Best-Of-Times-It-Was-The-Worst-Of-Times",
    "TheQuickBrownFoxJumpsOverTheLazyDogEveryMorningAt",  # valid base64 as well
]


@pytest.mark.parametrize("key", PHRASES)
def test_a_key_that_reads_as_words_is_judged_as_words(monkeypatch, key):
    from ksemstamp.keys import WEAK_KEY_ENV, check_key, key_strength

    monkeypatch.delenv(WEAK_KEY_ENV, raising=False)
    strength = key_strength(key)
    assert strength.basis == "words" and strength.bits < 128
    with pytest.raises(ValueError, match="it reads as words") as err:
        check_key(key)
    assert key not in str(err.value)


def test_random_keys_never_read_as_words():
    import base64
    import random

    from ksemstamp.keys import phrase_bits

    rng = random.Random(61)
    for _ in range(700):
        data = rng.randbytes(rng.choice((16, 24, 32)))
        for key in (
            data.hex(),
            base64.b64encode(data).decode(),
            base64.urlsafe_b64encode(data).decode().rstrip("="),
        ):
            assert phrase_bits(key) is None, key


def test_a_long_passphrase_of_random_words_is_strong():
    import random

    from ksemstamp.keys import check_key, key_strength

    words = ["orbit", "velvet", "canyon", "pickle", "lantern", "quartz", "meadow", "thunder"]
    words += ["saddle", "hazard", "glacier", "walnut", "pepper", "falcon", "ribbon", "nickel"]
    rng = random.Random(3)
    phrase = "-".join(rng.choice(words) for _ in range(16))
    assert key_strength(phrase).basis == "words"
    check_key(phrase)
