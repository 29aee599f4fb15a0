"""Unit tests of NSP instance creation (create_pretraining_data.py semantics) with a fixed rng."""

from __future__ import annotations

import numpy as np

from pipeline.instances import InstanceSettings, create_instances_from_document, truncate_seq_pair
from pipeline.masking import MaskingVocab

TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(200)]
VOCAB = MaskingVocab.from_tokens(TOKENS)
CLS, SEP = 2, 3


def document(start: int, lengths: list[int]) -> list[np.ndarray]:
    """Sentences of consecutive ids, so contiguity in the document is contiguity of ids."""
    out, x = [], start
    for n in lengths:
        out.append(np.arange(x, x + n, dtype=np.int32))
        x += n
    return out


def test_golden_instances():
    docs = [document(5, [3, 4, 2, 5]), document(20, [4, 3, 6])]
    settings = InstanceSettings(seq_len=12, short_seq_prob=0.0, max_predictions=2, cls_id=CLS, sep_id=SEP)
    made = create_instances_from_document(0, docs, ["a", "b"], settings, VOCAB, np.random.default_rng(5))
    got = [(i.input_ids.tolist(), i.token_type_ids.tolist(), i.masked_lm_positions.tolist(), i.masked_lm_ids.tolist(),
            i.next_sentence_label) for i in made]
    assert got == [
        ([2, 5, 6, 7, 3, 8, 4, 10, 11, 12, 13, 3], [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1], [6], [9], 0),
        # The last sentence alone: B must be random (from document b); target 9 - 5 = 4 tokens.
        ([2, 14, 15, 16, 17, 4, 3, 20, 21, 22, 23, 3], [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1], [5], [18], 1),
    ]
    assert all(i.doc_id == "a" for i in made)


def _truncate_by_the_loop(len_a: int, len_b: int, max_num_tokens: int) -> tuple[int, int]:
    a_cut = b_cut = 0
    while len_a + len_b > max_num_tokens:
        if len_a > len_b:
            len_a, a_cut = len_a - 1, a_cut + 1
        else:
            len_b, b_cut = len_b - 1, b_cut + 1
    return a_cut, b_cut


def test_truncate_seq_pair():
    # The longer side first, then both in turn; A from its front, B from its back (the closed form is the loop).
    assert truncate_seq_pair(10, 6, 12) == (4, 0)
    assert truncate_seq_pair(3, 3, 12) == (0, 0)
    assert truncate_seq_pair(8, 8, 10) == (3, 3)
    for len_a in range(1, 30):
        for len_b in range(1, 30):
            for limit in (2, 5, 17, 40):
                assert truncate_seq_pair(len_a, len_b, limit) == _truncate_by_the_loop(len_a, len_b, limit)
    # A pathological 50k-token sentence costs nothing.
    assert sum(truncate_seq_pair(50_000, 1, 125)) == 49_876


def test_properties_on_random_documents():
    rng = np.random.default_rng(11)
    docs, start = [], 5
    for _ in range(6):
        lengths = rng.integers(1, 40, size=rng.integers(1, 30)).tolist()
        docs.append(document(start, lengths))
        start += sum(lengths)
    assert start < 20000
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(start)]
    vocab = MaskingVocab.from_tokens(tokens)
    ids = [f"d{i}" for i in range(len(docs))]
    settings = InstanceSettings(seq_len=64, short_seq_prob=0.2, max_predictions=8, cls_id=CLS, sep_id=SEP)
    total = 0
    starts = {int(s[0]) for doc in docs for s in doc} | {int(doc[-1][-1]) + 1 for doc in docs}
    for index in range(len(docs)):
        own = np.concatenate(docs[index])
        for dupe in range(3):
            for inst in create_instances_from_document(index, docs, ids, settings, vocab, np.random.default_rng(dupe)):
                total += 1
                ids_ = inst.input_ids.copy()
                ids_[inst.masked_lm_positions] = inst.masked_lm_ids
                assert ids_.size <= 64 and ids_[0] == CLS and ids_[-1] == SEP
                (seps,) = np.nonzero(ids_ == SEP)
                assert seps.size == 2
                a, b = ids_[1 : seps[0]], ids_[seps[0] + 1 : -1]
                assert a.size >= 1 and b.size >= 1
                assert inst.token_type_ids.tolist() == [0] * (a.size + 2) + [1] * (b.size + 1)
                assert inst.masked_lm_positions.size <= 8
                assert np.all(np.diff(a) == 1) and np.all(np.diff(b) == 1)  # each segment contiguous
                if inst.next_sentence_label == 0:
                    # A then B is one contiguous run of this document.
                    run = np.concatenate([a, b])
                    assert np.all(np.diff(run) == 1) and own[0] <= run[0] and run[-1] <= own[-1]
                # Whatever the label, A ends and B starts on a sentence boundary: the junction is never cut,
                # so how it looks says nothing about the label (a cut one meant "random", 83% of the time).
                assert int(a[-1]) + 1 in starts and int(b[0]) in starts
    assert total > 50


def test_no_sentence_is_lost_when_b_is_random():
    # As the original: when B is drawn from another document, the sentences of the chunk after A go back
    # and start the next instance. Sentences of 2 tokens fill the target of 8 exactly, so nothing is
    # truncated: A of every instance, plus B where it is the true next, is then the whole document in order.
    docs = [document(5, [2] * 15), document(100, [2] * 10)]
    settings = InstanceSettings(seq_len=11, short_seq_prob=0.0, max_predictions=2, cls_id=CLS, sep_id=SEP)
    random_b = 0
    for seed in range(5):
        made = create_instances_from_document(0, docs, ["a", "b"], settings, VOCAB, np.random.default_rng(seed))
        text = []
        for inst in made:
            ids = inst.input_ids.copy()
            ids[inst.masked_lm_positions] = inst.masked_lm_ids
            (seps,) = np.nonzero(ids == SEP)
            text += ids[1 : seps[0]].tolist()
            if inst.next_sentence_label == 0:
                text += ids[seps[0] + 1 : -1].tolist()
            random_b += inst.next_sentence_label
        assert text == np.concatenate(docs[0]).tolist()
    assert random_b > 5
