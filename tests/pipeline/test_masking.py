"""Unit tests of `pipeline.masking`: golden values for a fixed rng, and the paper's proportions."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.masking import MaskingVocab, derive_seed, mask_tokens, rng_for

# An inline vocab in the spirit of google-research/bert's tests.
TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat",
          "play", "##ing", "##s", "[unused0]", "run"]
VOCAB = MaskingVocab.from_tokens(TOKENS)
# [CLS] the cat play ##ing ##s sat on the mat [SEP] run play ##ing cat [SEP]
IDS = [2, 5, 6, 10, 11, 12, 7, 8, 5, 9, 3, 14, 10, 11, 6, 3]


def test_vocab_fields():
    assert VOCAB.mask_id == 4
    assert VOCAB.vocab_size == len(TOKENS)
    assert VOCAB.special_ids == {0, 1, 2, 3, 4}
    assert np.flatnonzero(VOCAB.is_continuation).tolist() == [11, 12]
    # Random replacements never draw specials or [unusedN].
    assert VOCAB.random_ids.tolist() == [5, 6, 7, 8, 9, 10, 11, 12, 14]


def test_golden_values():
    m = mask_tokens(IDS, rng=np.random.default_rng(42), vocab=VOCAB, masked_lm_prob=0.3, max_predictions=20)
    assert m.input_ids.tolist() == [2, 5, 6, 10, 11, 4, 7, 8, 5, 4, 3, 14, 4, 11, 6, 3]
    assert m.positions.tolist() == [2, 5, 9, 12]
    assert m.labels.tolist() == [6, 12, 9, 10]
    assert m.input_ids.dtype == np.int32 and m.positions.dtype == np.int32 and m.labels.dtype == np.int32


def test_golden_values_whole_word():
    m = mask_tokens(IDS, rng=np.random.default_rng(42), vocab=VOCAB, masked_lm_prob=0.3,
                    max_predictions=20, whole_word_mask=True)
    assert m.input_ids.tolist() == [2, 4, 6, 10, 11, 12, 7, 8, 4, 4, 3, 4, 10, 11, 6, 3]
    assert m.positions.tolist() == [1, 8, 9, 11]
    assert m.labels.tolist() == [5, 5, 9, 14]


def test_derived_seeds_are_stable_across_processes():
    # A digest, not Python's salted hash: the same value in every worker and every run.
    assert derive_seed(1234, "doc", 0) == 5590465986201665904
    assert rng_for(1, "a").random() == rng_for(1, "a").random()
    assert derive_seed(1, "a", 0) != derive_seed(1, "a", 1)


def test_labels_restore_original_and_specials_untouched():
    rng = np.random.default_rng(0)
    for _ in range(200):
        m = mask_tokens(IDS, rng=rng, vocab=VOCAB, masked_lm_prob=0.5, max_predictions=6)
        restored = m.input_ids.copy()
        restored[m.positions] = m.labels
        assert restored.tolist() == IDS
        assert not VOCAB.is_special[m.labels].any()
        assert np.all(np.diff(m.positions) > 0)
        assert len(m.positions) == 6  # round(11 * 0.5) = 6 <= cap 6
        assert [m.input_ids[i] for i in (0, 10, 15)] == [2, 3, 3]


def test_cap_binds():
    m = mask_tokens(IDS, rng=np.random.default_rng(1), vocab=VOCAB, masked_lm_prob=0.9, max_predictions=3)
    assert len(m.positions) == 3


def test_whole_words_are_masked_whole():
    rng = np.random.default_rng(7)
    word_of = {3: "a", 4: "a", 5: "a", 12: "b", 13: "b"}  # play ##ing ##s ; play ##ing
    for _ in range(300):
        m = mask_tokens(IDS, rng=rng, vocab=VOCAB, masked_lm_prob=0.4, whole_word_mask=True)
        chosen = set(m.positions.tolist())
        for word in ("a", "b"):
            members = {p for p, w in word_of.items() if w == word}
            assert members <= chosen or not (members & chosen)
        # Eight one-token words: a word that does not fit is skipped and a later one taken, so the cap
        # is always filled (stopping at the first misfit left it short whenever `play ##ing ##s` came up).
        assert len(chosen) == round(13 * 0.4)


def test_nothing_to_mask():
    m = mask_tokens([2, 3, 3], rng=np.random.default_rng(0), vocab=VOCAB)
    assert m.input_ids.tolist() == [2, 3, 3] and m.positions.size == 0 and m.labels.size == 0
    with pytest.raises(ValueError, match="1-D"):
        mask_tokens([[2, 3]], rng=np.random.default_rng(0), vocab=VOCAB)


def test_proportions_80_10_10(data_dir):
    # Large real vocab, many sequences: masked share 15% and the 80/10/10 split.
    vocab = MaskingVocab.from_vocab_file(data_dir / "vocab" / "bert-base-uncased-vocab.txt")
    rng = np.random.default_rng(3)
    masked = candidates = as_mask = unchanged = 0
    for _ in range(3000):
        body = rng.integers(1000, vocab.vocab_size, size=125)
        ids = np.concatenate([[101], body[:60], [102], body[60:], [102]])
        m = mask_tokens(ids, rng=rng, vocab=vocab, max_predictions=1000)
        candidates += 125
        masked += m.positions.size
        as_mask += int((m.input_ids[m.positions] == vocab.mask_id).sum())
        unchanged += int((m.input_ids[m.positions] == m.labels).sum())
    assert abs(masked / candidates - 0.15) < 0.01
    assert abs(as_mask / masked - 0.8) < 0.03
    assert abs(unchanged / masked - 0.1) < 0.03
    # Random replacement can hit the original id by chance (1/30k); the rest is random.
    assert abs((masked - as_mask - unchanged) / masked - 0.1) < 0.03


def test_missing_vocab_file_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        MaskingVocab.from_vocab_file(tmp_path / "nope.txt")
    bad = tmp_path / "vocab.txt"
    bad.write_text("a\nb\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"\[MASK\]"):
        MaskingVocab.from_vocab_file(bad)
