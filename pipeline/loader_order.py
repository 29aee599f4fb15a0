"""The loader's global sample order: a pseudo-random permutation that is a pure function of
(seed, epoch), computed per position in O(1) memory.

A materialised `rng.permutation(N)` costs 8 bytes per sample on every rank (~1 GB for BERT-Large's
~100M instances) and must be rebuilt each epoch. Instead, position `i` of epoch `e` maps to sample
`feistel(i)` where `feistel` is a keyed bijection on `[0, 2^bits)` (a balanced Feistel network whose
round keys derive from `(seed, epoch, round)`), restricted to `[0, N)` by cycle walking: re-apply
until the value falls inside. Any rank can compute any slice of the order directly, which is what
makes resuming at another data-parallel size exact.
"""

from __future__ import annotations

import numpy as np

from pipeline.masking import derive_seed

_ROUNDS = 6
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray, key: np.uint64) -> np.ndarray:
    """splitmix64's finaliser of (x + key): a well-mixed 64-bit hash, vectorised."""
    z = (x + key) * _GOLDEN
    z ^= z >> np.uint64(30)
    z *= _M1
    z ^= z >> np.uint64(27)
    z *= _M2
    z ^= z >> np.uint64(31)
    return z


class EpochPermutation:
    """`perm[positions]` for a permutation of `range(n)` fixed by (seed, epoch)."""

    def __init__(self, n: int, seed: int, epoch: int) -> None:
        if n <= 0:
            raise ValueError("cannot order an empty split")
        self.n = n
        bits = max(2, int(n - 1).bit_length())
        bits += bits % 2  # balanced halves
        self._half = np.uint64(bits // 2)
        self._mask = np.uint64((1 << (bits // 2)) - 1)
        self._keys = [np.uint64(derive_seed("loader-order", seed, epoch, r)) for r in range(_ROUNDS)]

    def _feistel(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self._half, x & self._mask
        for key in self._keys:
            left, right = right, left ^ (_mix(right, key) & self._mask)
        return (left << self._half) | right

    def __getitem__(self, positions: np.ndarray) -> np.ndarray:
        pos = np.asarray(positions, dtype=np.int64)
        if pos.size and (pos.min() < 0 or pos.max() >= self.n):
            raise IndexError(f"positions must lie in [0, {self.n})")
        with np.errstate(over="ignore"):
            out = self._feistel(pos.astype(np.uint64))
            outside = out >= np.uint64(self.n)
            while outside.any():  # cycle walking: expected < 4 rounds since 2^bits < 4n
                out[outside] = self._feistel(out[outside])
                outside = out >= np.uint64(self.n)
        return out.astype(np.int64)
