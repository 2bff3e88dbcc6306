"""torch's CUDA ``randperm`` for small ``n``, computed on the CPU.

The SemStamp and k-SemStamp reference code draws its public valid-region table on the GPU:
row ``q`` is the first ``gamma * K`` entries of ``torch.randperm(K, device="cuda",
generator=g)`` with ``g`` a CUDA generator seeded with ``q * 15485863``. A CPU generator seeded
the same way gives another permutation, so this module recomputes the CUDA one, following
torch's source (``aten/src/ATen/native/cuda/Randperm.cu`` and ``Randperm.cuh``, the cuRAND
Philox generator, as in torch 2.3, the version the reference code pins). For ``n <= 2048``
(keys of at most 32 bits, one thread per element on any GPU) ``randperm`` is:

1. keys: an ``int32`` tensor filled by ``random_(INT32_MIN, INT32_MAX)``. Element ``i`` is the
   first word of ``curand4`` for thread ``i``: Philox4x32-10 with key ``(seed mod 2**32,
   seed // 2**32)`` and counter ``(offset / 4, 0, i, 0)``, the generator's offset being 0 after
   seeding; the word ``w`` becomes ``w mod (2**32 - 1) - 2**31``. This advances the offset by 4.
2. a stable radix sort of ``arange(n)`` by the low ``bits`` bits of the keys, where
   ``bits = ceil(log2(n - (6 n**2 + 1) / (12 ln 0.9)))`` (9 for ``n = 8``);
3. every run of equal low bits (an *island*, rare) is shuffled by Fisher-Yates from its first
   position ``t``: ``r = curand() mod (i + 1)`` for ``i`` from the run's length minus one down to
   1, swapping positions ``i`` and ``r``, with cuRAND's stream for subsequence ``t`` at the
   offset the generator had after step 1 (4).

The Philox block function is checked against Random123's published known answers
(``tests/test_keys.py``); the layout of steps 1 to 3 is torch's, read from its source, and no
GPU run was available to compare whole permutations.
"""

from __future__ import annotations

import math

_MASK32 = 0xFFFFFFFF
_M0, _M1 = 0xD2511F53, 0xCD9E8D57  # Philox multipliers
_W0, _W1 = 0x9E3779B9, 0xBB67AE85  # Weyl key increments
MAX_N = 2048
"""Largest ``n`` computed: up to here every element has its own thread on any GPU with at least
two multiprocessors, so the result does not depend on the device."""


def philox4x32_10(counter: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, ...]:
    """The Philox4x32-10 block function (Salmon et al. 2011; cuRAND's ``curand_Philox4x32_10``):
    four 32-bit counter words and two key words in, four 32-bit words out."""
    c0, c1, c2, c3 = (c & _MASK32 for c in counter)
    k0, k1 = (k & _MASK32 for k in key)
    for step in range(10):
        if step:
            k0, k1 = (k0 + _W0) & _MASK32, (k1 + _W1) & _MASK32
        p0, p1 = _M0 * c0, _M1 * c2
        c0, c1, c2, c3 = (
            ((p1 >> 32) ^ c1 ^ k0) & _MASK32,
            p1 & _MASK32,
            ((p0 >> 32) ^ c3 ^ k1) & _MASK32,
            p0 & _MASK32,
        )
    return c0, c1, c2, c3


def curand_words(seed: int, subsequence: int, offset: int, count: int) -> list[int]:
    """The first ``count`` results of ``curand()`` after ``curand_init(seed, subsequence,
    offset)`` for a ``curandStatePhilox4_32_10_t``: the subsequence sets the counter's upper 64
    bits, the offset (in 32-bit words) its lower 64 bits and the word within a block."""
    key = (seed & _MASK32, (seed >> 32) & _MASK32)
    block, skip = divmod(offset, 4)
    words: list[int] = []
    while len(words) < skip + count:
        counter = (block, block >> 32, subsequence, subsequence >> 32)
        words.extend(philox4x32_10(counter, key))
        block += 1
    return words[skip : skip + count]


def randperm_key_bits(n: int) -> int:
    """Bits of the sort keys torch's CUDA ``randperm`` uses for ``n`` elements."""
    return min(64, math.ceil(math.log2(n - (6 * n * n + 1) / (math.log(0.9) * 12))))


def cuda_randperm(n: int, seed: int) -> list[int]:
    """``torch.randperm(n, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))``
    as a list, computed on the CPU (see the module docstring)."""
    if not 1 <= n <= MAX_N:
        raise ValueError(f"n must be in [1, {MAX_N}], got {n}")
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    mask = (1 << randperm_key_bits(n)) - 1
    # Step 1: thread i's first word; `w mod (2**32 - 1)` keeps the low bits unless w = 2**32 - 1,
    # and subtracting 2**31 does not touch them.
    keys = [(curand_words(seed, i, 0, 1)[0] % _MASK32) & mask for i in range(n)]
    # Step 2: stable sort by the low bits (Python's sort is stable, as CUB's radix sort).
    order = sorted(range(n), key=keys.__getitem__)
    low = [keys[i] for i in order]
    # Step 3: islands of equal low bits, shuffled from the offset after step 1.
    offset = 4
    for start in range(n - 1):
        if low[start] != low[start + 1] or (start and low[start - 1] == low[start]):
            continue
        size = 1
        while start + size < n and low[start + size] == low[start]:
            size += 1
        words = curand_words(seed, start, offset, size - 1)
        for word, i in zip(words, range(size - 1, 0, -1), strict=True):
            r = word % (i + 1)
            order[start + i], order[start + r] = order[start + r], order[start + i]
    return order
