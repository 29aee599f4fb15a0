"""NSP instances exactly as google-research/bert `create_instances_from_document` builds them.

Pure functions with an explicit `numpy.random.Generator`; the Beam stage (`pipeline.nsp`) seeds it
from (seed, document id, dupe index). Legend: A, B = the two segments; T = `seq_len - 3`, the most
tokens A and B may hold together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from pipeline.masking import MaskingVocab, mask_tokens


def id_dtype(max_id: int) -> type:
    """uint16 when every id fits (any vocab of at most 65536 pieces; BERT's has 30522), else int32.

    The corpus job keeps token ids in this dtype between its stages, where the local runner holds
    them all in memory; every consumer widens them on use, so the shards never see it.
    """
    return np.uint16 if max_id < 2**16 else np.int32


@dataclass(frozen=True)
class Instance:
    """One training example, unpadded. `next_sentence_label`: 0 = B follows A, 1 = B is random."""

    doc_id: str
    input_ids: np.ndarray  # [L] int32, masks applied
    token_type_ids: np.ndarray  # [L] int8
    masked_lm_positions: np.ndarray  # [P] int32 ascending
    masked_lm_ids: np.ndarray  # [P] int32
    next_sentence_label: int


@dataclass(frozen=True)
class InstanceSettings:
    seq_len: int = 128
    short_seq_prob: float = 0.1
    masked_lm_prob: float = 0.15
    max_predictions: int = 20
    whole_word_mask: bool = False
    cls_id: int = 101
    sep_id: int = 102


def truncate_seq_pair(len_a: int, len_b: int, max_num_tokens: int) -> tuple[int, int]:
    """Trim the longer side one token at a time until A+B fit: A from its front, B from its back.

    Returns (a_front, b_back): the tokens removed. The original trims a random end of the longer side;
    here the junction is never cut, for either label, so A ends and B starts where the pair was drawn.
    Cutting only true-next pairs at their outer ends (as this did before) told the label: a junction
    cut mid-sentence or starting on a `##` piece meant "random", and a rule on that alone guessed 83%
    of the labels. Closed form of the one-token loop (`if len_a > len_b: A loses one, else B`), so a
    pathological 50k-token "sentence" costs nothing.
    """
    excess = len_a + len_b - max_num_tokens
    if excess <= 0:
        return 0, 0
    gap = abs(len_a - len_b)
    level = min(gap, excess)  # the longer side alone, down to the other's length
    rest = excess - level  # then both in turn, B first (the loop trims B when they are level)
    a_cut = (level if len_a > len_b else 0) + rest // 2
    b_cut = (level if len_b > len_a else 0) + rest - rest // 2
    return a_cut, b_cut


def create_instances_from_document(
    doc_index: int,
    documents: Sequence[Sequence[np.ndarray]],
    doc_ids: Sequence[str],
    settings: InstanceSettings,
    vocab: MaskingVocab,
    rng: np.random.Generator,
) -> list[Instance]:
    """Instances of `documents[doc_index]`; random B segments come from the other `documents`."""
    document = documents[doc_index]
    max_num_tokens = settings.seq_len - 3
    # Usually fill the sequence; sometimes (short_seq_prob) a shorter one, so that fine-tuning on
    # short inputs is not out of distribution. Chosen once per document, as the original.
    target_seq_length = max_num_tokens
    if rng.random() < settings.short_seq_prob:
        target_seq_length = int(rng.integers(2, max_num_tokens + 1))

    instances: list[Instance] = []
    current_chunk: list[np.ndarray] = []
    current_length = 0
    i = 0
    n_sentences = len(document)  # once: a document may be a lazy sequence (`SentenceViews`)
    while i < n_sentences:
        segment = document[i]
        current_chunk.append(segment)
        current_length += segment.size
        if i == n_sentences - 1 or current_length >= target_seq_length:
            if current_chunk:
                a_end = 1
                if len(current_chunk) >= 2:
                    a_end = int(rng.integers(1, len(current_chunk)))
                tokens_a = np.concatenate(current_chunk[:a_end])
                if len(current_chunk) == 1 or rng.random() < 0.5:
                    is_random_next = True
                    target_b_length = target_seq_length - tokens_a.size
                    random_index = _random_other_document(doc_index, len(documents), rng)
                    random_document = documents[random_index]
                    random_length = len(random_document)
                    random_start = int(rng.integers(0, random_length))
                    pieces, b_len = [], 0
                    for j in range(random_start, random_length):
                        piece = random_document[j]
                        pieces.append(piece)
                        b_len += piece.size
                        if b_len >= target_b_length:
                            break
                    tokens_b = np.concatenate(pieces)
                    # The unused segments go back, so no text of this document is wasted.
                    i -= len(current_chunk) - a_end
                else:
                    is_random_next = False
                    tokens_b = np.concatenate(current_chunk[a_end:])
                instances.append(
                    _make_instance(doc_ids[doc_index], tokens_a, tokens_b, is_random_next, max_num_tokens, settings, vocab, rng)
                )
            current_chunk = []
            current_length = 0
        i += 1
    return instances


def _random_other_document(doc_index: int, num_documents: int, rng: np.random.Generator) -> int:
    # As the original: up to 10 tries for a different document (a bucket of one has no other).
    random_index = doc_index
    for _ in range(10):
        random_index = int(rng.integers(0, num_documents))
        if random_index != doc_index:
            break
    return random_index


def _make_instance(doc_id, tokens_a, tokens_b, is_random_next, max_num_tokens, settings, vocab, rng) -> Instance:
    a_front, b_back = truncate_seq_pair(tokens_a.size, tokens_b.size, max_num_tokens)
    tokens_a = tokens_a[a_front:]
    tokens_b = tokens_b[: tokens_b.size - b_back]
    assert tokens_a.size >= 1 and tokens_b.size >= 1, "segments are non-empty by construction"
    cls = np.array([settings.cls_id], dtype=np.int32)
    sep = np.array([settings.sep_id], dtype=np.int32)
    ids = np.concatenate([cls, tokens_a, sep, tokens_b, sep])
    token_type_ids = np.zeros(ids.size, dtype=np.int8)
    token_type_ids[tokens_a.size + 2 :] = 1
    masked = mask_tokens(
        ids,
        rng=rng,
        vocab=vocab,
        masked_lm_prob=settings.masked_lm_prob,
        max_predictions=settings.max_predictions,
        whole_word_mask=settings.whole_word_mask,
    )
    return Instance(
        doc_id=doc_id,
        input_ids=masked.input_ids,
        token_type_ids=token_type_ids,
        masked_lm_positions=masked.positions,
        masked_lm_ids=masked.labels,
        next_sentence_label=int(is_random_next),
    )
