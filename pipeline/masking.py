"""Masked-LM masking as the BERT paper defines it, vectorised with numpy.

Shared by the corpus job (static masks, one per dupe) and the training loader (dynamic re-masking
per sample), so it must be cheap: a handful of numpy calls per sequence, no Python loop over tokens.

Semantics (google-research/bert `create_masked_lm_predictions`, with two documented choices):
- `num_to_predict = min(max_predictions, max(1, round(n_candidates * masked_lm_prob)))`, where
  `n_candidates` counts the maskable (non-special) tokens. The original multiplies the full length
  including `[CLS]`/`[SEP]`; counting candidates makes the masked share exactly `masked_lm_prob` of
  real tokens whatever the sequence length.
- Of the chosen positions: 80% become `[MASK]`, 10% a random token, 10% stay unchanged. Random
  replacements are drawn from the non-special, non-`[unusedN]` ids, so the model never sees a
  `[CLS]` or `[PAD]` in the middle of text.
- Special ids (`[PAD] [UNK] [CLS] [SEP] [MASK]`) are never chosen.
- Whole-word masking: a word is a maskable token followed by its `##` continuations; words are
  visited in random order and taken whole while they fit in `num_to_predict` (a word that does not
  fit is skipped, a shorter later one may still fit), exactly as the original loop does.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


@dataclass(frozen=True)
class MaskingVocab:
    """What masking needs to know about a vocabulary.

    `is_special[id]` marks ids never masked; `is_continuation[id]` marks `##` pieces (whole-word
    masking); `random_ids` are the ids a "random token" replacement is drawn from.
    """

    mask_id: int
    vocab_size: int
    is_special: np.ndarray  # [V] bool
    is_continuation: np.ndarray  # [V] bool
    random_ids: np.ndarray  # [R] int32
    # Derived once: the per-call hot path then does one gather instead of gather + invert.
    is_maskable: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_maskable", ~np.asarray(self.is_special, dtype=bool))

    @property
    def special_ids(self) -> frozenset[int]:
        return frozenset(int(i) for i in np.flatnonzero(self.is_special))

    @classmethod
    def from_tokens(cls, tokens: Sequence[str], special_tokens: Sequence[str] = SPECIAL_TOKENS) -> "MaskingVocab":
        """From the vocabulary's tokens in id order (line i of vocab.txt is id i)."""
        index = {tok: i for i, tok in enumerate(tokens)}
        if "[MASK]" not in index:
            raise ValueError("the vocabulary has no [MASK] token; a BERT vocab.txt needs [PAD] [UNK] [CLS] [SEP] [MASK]")
        vocab_size = len(tokens)
        is_special = np.zeros(vocab_size, dtype=bool)
        for tok in special_tokens:
            if tok in index:
                is_special[index[tok]] = True
        is_continuation = np.fromiter((t.startswith("##") for t in tokens), dtype=bool, count=vocab_size)
        unused = np.fromiter((t.startswith("[unused") for t in tokens), dtype=bool, count=vocab_size)
        random_ids = np.flatnonzero(~is_special & ~unused).astype(np.int32)
        if random_ids.size == 0:
            raise ValueError("the vocabulary has no ordinary tokens to draw random replacements from")
        return cls(
            mask_id=index["[MASK]"],
            vocab_size=vocab_size,
            is_special=is_special,
            is_continuation=is_continuation,
            random_ids=random_ids,
        )

    @classmethod
    def from_vocab_file(cls, path: str | Path) -> "MaskingVocab":
        """From a BERT `vocab.txt` (one token per line, id = line number)."""
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"vocab file {path} does not exist; pass a BERT vocab.txt")
        # utf-8-sig: a BOM would make the first token "\ufeff[PAD]", which masking would then draw.
        with open(path, encoding="utf-8-sig") as f:
            tokens = [line.rstrip("\n").rstrip("\r") for line in f]
        while tokens and tokens[-1] == "":
            tokens.pop()
        return cls.from_tokens(tokens)


@dataclass(frozen=True)
class MaskedTokens:
    """`input_ids` with masks applied; `positions` ascending; `labels` the original ids there."""

    input_ids: np.ndarray  # [L] int32
    positions: np.ndarray  # [P] int32, ascending
    labels: np.ndarray  # [P] int32


def mask_tokens(
    token_ids: Sequence[int] | np.ndarray,
    *,
    rng: np.random.Generator,
    vocab: MaskingVocab,
    masked_lm_prob: float = 0.15,
    max_predictions: int = 20,
    whole_word_mask: bool = False,
) -> MaskedTokens:
    """Choose and apply BERT's MLM masks to one sequence (`[CLS] A [SEP] B [SEP]`, unpadded)."""
    # Per-sample hot path of the loader: few numpy calls, methods rather than np.* wrappers.
    ids = np.array(token_ids, dtype=np.int32)  # a copy: the caller's ids stay unmasked
    if ids.ndim != 1:
        raise ValueError(f"mask_tokens takes one sequence (1-D), got shape {ids.shape}")
    candidates = vocab.is_maskable[ids].nonzero()[0]  # [C] positions that may be masked
    n_cand = candidates.size
    if n_cand == 0 or max_predictions <= 0 or masked_lm_prob <= 0.0:
        empty = np.zeros(0, dtype=np.int32)
        return MaskedTokens(ids, empty, empty)
    num_to_predict = min(max_predictions, max(1, int(round(n_cand * masked_lm_prob))))

    if whole_word_mask:
        positions = _choose_whole_words(ids, candidates, num_to_predict, rng, vocab)
    else:
        # A uniformly random subset of size k: the k smallest of C uniform keys.
        keys = rng.random(n_cand)
        if num_to_predict < n_cand:
            positions = candidates[keys.argpartition(num_to_predict)[:num_to_predict]]
        else:
            positions = candidates
        positions.sort()
    positions = positions.astype(np.int32)

    labels = ids[positions]
    # One draw decides the 80/10/10 split; a second picks replacement tokens (used only where needed).
    action = rng.random(positions.size)
    replacement = vocab.random_ids[rng.integers(0, vocab.random_ids.size, size=positions.size)]
    # `where(action < 0.8, mask, where(action < 0.9, labels, replacement))`, with one `where` fewer.
    values = np.where(action < 0.9, labels, replacement)
    values[action < 0.8] = vocab.mask_id
    ids[positions] = values
    return MaskedTokens(ids, positions, labels)


def _choose_whole_words(
    ids: np.ndarray, candidates: np.ndarray, num_to_predict: int, rng: np.random.Generator, vocab: MaskingVocab
) -> np.ndarray:
    """Positions of whole words, taken in random order while they fit in `num_to_predict`."""
    is_cont = vocab.is_continuation[ids[candidates]]
    # A continuation starts a new word only if the token before it is not a maskable neighbour
    # (e.g. `##s` right after [SEP]); contiguity is checked on positions.
    contiguous = np.empty(candidates.size, dtype=bool)
    contiguous[0] = False
    contiguous[1:] = candidates[1:] == candidates[:-1] + 1
    starts = np.flatnonzero(~(is_cont & contiguous))  # [W] index into candidates of each word start
    lengths = np.diff(np.append(starts, candidates.size))  # [W]
    order = rng.permutation(starts.size)
    ordered_lengths = lengths[order]
    # Fast path: the prefix of words that fits as a whole; then the original's greedy
    # skip-and-continue over the (few) remaining words.
    fits = int(np.searchsorted(np.cumsum(ordered_lengths), num_to_predict, side="right"))
    taken = np.zeros(starts.size, dtype=bool)
    taken[order[:fits]] = True
    total = int(ordered_lengths[:fits].sum())
    for j in range(fits, order.size):
        if total >= num_to_predict:
            break
        length = int(ordered_lengths[j])
        if total + length <= num_to_predict:
            taken[order[j]] = True
            total += length
    # Already ascending: candidates are sorted and the word mask expands in place.
    return candidates[np.repeat(taken, lengths)]


def derive_seed(*parts: object) -> int:
    """A 64-bit seed from any tuple of values (seed, doc id, dupe index, ...), stable across runs.

    Python's `hash` is salted per process; a digest of the parts' text is not, so every worker and
    every retry derives the same stream.
    """
    text = "\x1f".join(str(p) for p in parts).encode("utf-8")
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def rng_for(*parts: object) -> np.random.Generator:
    """`numpy.random.Generator` (PCG64) seeded by `derive_seed(*parts)`."""
    return np.random.Generator(np.random.PCG64(derive_seed(*parts)))
