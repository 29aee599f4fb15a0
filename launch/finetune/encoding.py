"""Examples -> token-id features -> padded batches, for sequence, tagging and multiple-choice tasks.

Features are unpadded lists; `collate` pads each batch only to its longest member (dynamic
padding), so short GLUE sentences do not pay for `max_seq_len`. Shape legend: B batch, L length,
C choices.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from launch.finetune.examples import ChoiceExample, TaggedExample, TextExample
from pipeline.instances import truncate_seq_pair

logger = logging.getLogger(__name__)

IGNORE = -100  # label of positions that carry no loss (sub-tokens after the first, context, padding)


@dataclass
class Feature:
    input_ids: list[int]
    token_type_ids: list[int]
    label: int | float | list[int] | None = None
    example_index: int = 0
    # tagging: the word index that each labelled (first sub-token) position predicts, in order
    word_index: list[int] = field(default_factory=list)


def cut_pairs(tokenizer, pairs: Sequence[tuple[str, str | None]], max_seq_len: int) -> tuple[list[tuple[list[int], list[int]]], int]:
    """[CLS] A [SEP] (B [SEP]) token and segment ids, cut to `max_seq_len` as google-research/bert's
    run_classifier cuts: a single text keeps its first pieces; a pair loses pieces from the end of its
    longer side, from B's when they are level (`_truncate_seq_pair`, whose counts
    `pipeline.instances.truncate_seq_pair` computes). HF tokenizers' "longest_first" splits a tie with
    an odd budget the other way (B keeps one piece more), so the cut is ours. Returns the features and
    how many were cut.
    """
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    pieces_a = tokenizer.encode_batch([a for a, _ in pairs], add_special_tokens=False)
    pieces_b = iter(tokenizer.encode_batch([b for _, b in pairs if b is not None], add_special_tokens=False))
    out, cut = [], 0
    for (_, b), enc_a in zip(pairs, pieces_a):
        ids_a = enc_a.ids
        if b is None:
            ids_b = None
            cut_a, cut_b = max(0, len(ids_a) - (max_seq_len - 2)), 0
        else:
            ids_b = next(pieces_b).ids
            cut_a, cut_b = truncate_seq_pair(len(ids_a), len(ids_b), max_seq_len - 3)
        cut += bool(cut_a or cut_b)
        ids = [cls_id, *ids_a[: len(ids_a) - cut_a], sep_id]
        types = [0] * len(ids)
        if ids_b is not None:
            kept_b = [*ids_b[: len(ids_b) - cut_b], sep_id]
            ids += kept_b
            types += [1] * len(kept_b)
        out.append((ids, types))
    return out, cut


def text_features(
    examples: Sequence[TextExample], tokenizer, *, max_seq_len: int, label_ids: dict[str, int] | None
) -> list[Feature]:
    """[CLS] A [SEP] (B [SEP]); cut to `max_seq_len` as the BERT reference cuts (`cut_pairs`)."""
    encoded, cut = cut_pairs(tokenizer, [(ex.text_a, ex.text_b) for ex in examples], max_seq_len)
    if cut:  # as the reference does, but said: a text past the limit is read only up to it
        logger.info("%d of %d texts cut to --max-seq-len %d tokens", cut, len(encoded), max_seq_len)
    out = []
    for i, (ex, (ids, types)) in enumerate(zip(examples, encoded)):
        if ex.label is None:
            label = None
        elif label_ids is None:
            label = float(ex.label)
        else:
            label = label_ids[str(ex.label)]
        out.append(Feature(ids, types, label, i))
    return out


def choice_features(examples: Sequence[ChoiceExample], tokenizer, *, max_seq_len: int) -> list[Feature]:
    """One [CLS] context [SEP] start+ending [SEP] sequence per choice, cut as `cut_pairs`; `input_ids` holds C lists."""
    pairs = [(ex.context, f"{ex.start} {ending}".strip()) for ex in examples for ending in ex.endings]
    encoded, _ = cut_pairs(tokenizer, pairs, max_seq_len)
    out, k = [], 0
    for i, ex in enumerate(examples):
        choices = encoded[k : k + len(ex.endings)]
        k += len(ex.endings)
        out.append(Feature([ids for ids, _ in choices], [types for _, types in choices], ex.label, i))
    return out


def tag_features(
    examples: Sequence[TaggedExample],
    tokenizer,
    *,
    max_seq_len: int,
    label_ids: dict[str, int],
    doc_context: bool = False,
) -> list[Feature]:
    """Label the first sub-token of each word; others carry IGNORE (the paper's NER setup).

    A sentence longer than the window is split into consecutive chunks of whole words, so every
    word gets a prediction. With `doc_context`, the rest of the window is filled with the text around
    the chunk (unlabelled), the paper's "maximal document context": the sentence's own words beside the
    chunk, then the neighbouring sentences of its document (`TaggedExample.doc`, set by `in_documents`).
    """
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    per_word = _word_pieces(tokenizer, [ex.words for ex in examples])
    docs = {id(ex.doc): ex.doc for ex in examples if ex.doc} if doc_context else {}
    doc_words = {key: _word_pieces(tokenizer, doc) for key, doc in docs.items()}
    budget = max_seq_len - 2
    out: list[Feature] = []
    for i, ex in enumerate(examples):
        chunk_ids: list[int] = []
        chunk_labels: list[int] = []
        chunk_words: list[int] = []

        def emit() -> None:
            ids, labels = chunk_ids[:], chunk_labels[:]
            if doc_context:
                ids, labels = _add_context(ex, per_word[i], doc_words.get(id(ex.doc)), chunk_words, ids, labels, budget)
            out.append(Feature([cls_id] + ids + [sep_id], [0] * (len(ids) + 2),
                               [IGNORE] + labels + [IGNORE], i, chunk_words[:]))

        for w, pieces in enumerate(per_word[i]):
            pieces = pieces[:budget]  # a single word longer than the window keeps its first pieces
            if len(chunk_ids) + len(pieces) > budget:
                emit()
                chunk_ids.clear(), chunk_labels.clear(), chunk_words.clear()
            gold = label_ids[ex.tags[w]] if ex.tags is not None else 0
            chunk_ids.extend(pieces)
            chunk_labels.extend([gold] + [IGNORE] * (len(pieces) - 1))
            chunk_words.append(w)
        emit()
    return out


def _word_pieces(tokenizer, sentences: Sequence[Sequence[str]]) -> list[list[list[int]]]:
    """Per sentence, the sub-token ids of each word (a word the vocab cannot split still gets one [UNK])."""
    encodings = tokenizer.encode_batch([list(words) for words in sentences], is_pretokenized=True,
                                       add_special_tokens=False)
    unk = tokenizer.token_to_id("[UNK]")
    out: list[list[list[int]]] = []
    for words, enc in zip(sentences, encodings):
        pieces: list[list[int]] = [[] for _ in words]
        for tid, wid in zip(enc.ids, enc.word_ids):
            if wid is not None:
                pieces[wid].append(tid)
        out.append([p or [unk] for p in pieces])
    return out


def _add_context(ex, own_words, doc_words, chunk_words, ids, labels, budget):
    """Grow the window with the text around the chunk, nearest first, alternating sides: the sentence's own
    words beside the chunk (a sentence longer than the window is cut into chunks) one at a time, then whole
    sentences of the document (`doc_words`: per sentence, per word, sub-token ids; None without a document).

    A side stops at the first unit that does not fit (or at the document's edge): the window stays a
    contiguous stretch of text, never a sentence beside one that was not its neighbour.
    """
    def units(step: int):
        first, last = chunk_words[0], chunk_words[-1]
        yield from (own_words[:first][::-1] if step < 0 else own_words[last + 1:])
        if doc_words is not None:
            j = ex.doc_pos + step
            while 0 <= j < len(doc_words):
                yield [t for w in doc_words[j] for t in w]
                j += step

    sides = {-1: units(-1), 1: units(1)}
    while sides:
        for step in list(sides):
            toks = next(sides[step], None)
            if toks is None or len(ids) + len(toks) > budget:
                del sides[step]
                continue
            if step < 0:
                ids, labels = toks + ids, [IGNORE] * len(toks) + labels
            else:
                ids, labels = ids + toks, labels + [IGNORE] * len(toks)
    return ids, labels


def loss_weights(features: Sequence[Feature]) -> list[int] | None:
    """Positions that carry loss per feature (labelled tokens) for per-token labels; None when each
    feature carries one loss term (classification, regression, choice, QA spans)."""
    labels = [getattr(f, "label", None) for f in features]
    if not labels or not isinstance(labels[0], list):
        return None
    return [sum(lab != IGNORE for lab in seq) for seq in labels]


def use_length_grouping(setting: bool | None, features: Sequence[Feature]) -> bool:
    """`group_by_length` resolved: None (auto) groups only losses with one term per feature.

    A loss averaged over tokens (NER) gets random batches by default: length grouping cost 2.7
    entity-F1 points there (CoNLL-2003, 3 seeds; docs/finetune.md "Parity with transformers").
    """
    return setting if setting is not None else loss_weights(features) is None


class LengthGroupedBatches:
    """Random batches of similar length (HF's `group_by_length`): less padding, same examples per epoch.

    Each epoch shuffles, cuts the order into mega-batches of `mega` batches, sorts each by length and
    splits it into batches, then shuffles the batches. `mega` defaults as in transformers'
    `get_length_grouped_indices`: 50, or fewer so that there are at least 4 mega-batches (a small
    set is never one global sort). Deterministic given the generator's seed.

    `weights` (labelled tokens per feature, from `loss_weights`) is for losses averaged over tokens
    (NER): there a batch of 32 three-word lines would weigh as much per step as a batch of 32
    forty-word sentences, so grouping by length would over-weight short sentences' tokens (5x on
    CoNLL-2003, costing entity F1; docs/finetune.md "Parity with transformers"). With weights, each
    mega-batch is cut into the same number of batches, but at equal sums of weight, so every step
    averages over about the same number of tokens, as random batches do.
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, generator: torch.Generator, mega: int | None = None,
                 weights: Sequence[int] | None = None) -> None:
        self.lengths, self.batch_size, self.generator = list(lengths), batch_size, generator
        self.mega = mega if mega is not None else max(1, min(len(self.lengths) // (batch_size * 4), 50))
        self.weights = None if weights is None else [max(1, int(w)) for w in weights]

    def __len__(self) -> int:
        return (len(self.lengths) + self.batch_size - 1) // self.batch_size

    def __iter__(self):
        perm = torch.randperm(len(self.lengths), generator=self.generator).tolist()
        span = self.batch_size * self.mega
        batches = []
        for start in range(0, len(perm), span):
            chunk = sorted(perm[start : start + span], key=lambda i: self.lengths[i], reverse=True)
            batches += self._split(chunk)
        for b in torch.randperm(len(batches), generator=self.generator).tolist():
            yield batches[b]

    def _split(self, chunk: list[int]) -> list[list[int]]:
        if self.weights is None:
            return [chunk[k : k + self.batch_size] for k in range(0, len(chunk), self.batch_size)]
        n = (len(chunk) + self.batch_size - 1) // self.batch_size  # as many steps as without weights
        cum = np.cumsum([self.weights[i] for i in chunk])
        # Cut where the running weight first reaches j/n of the total, leaving every batch non-empty.
        edges = [0]
        for j, cut in enumerate(np.searchsorted(cum, cum[-1] * np.arange(1, n) / n) + 1, start=1):
            edges.append(min(max(int(cut), edges[-1] + 1), len(chunk) - (n - j)))
        edges.append(len(chunk))
        return [chunk[a:b] for a, b in zip(edges, edges[1:])]


def collate(features: Sequence[Feature], *, pad_id: int = 0, regression: bool = False) -> dict[str, torch.Tensor]:
    """Pad to the longest in the batch: input_ids / token_type_ids / attention_mask [B, L] (or [B, C, L])."""
    first = features[0].input_ids
    choices = bool(first) and isinstance(first[0], list)
    rows = [seq for f in features for seq in (f.input_ids if choices else [f.input_ids])]
    types = [seq for f in features for seq in (f.token_type_ids if choices else [f.token_type_ids])]
    length = max(len(r) for r in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    tt = torch.zeros((len(rows), length), dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for r, (seq, ty) in enumerate(zip(rows, types)):
        ids[r, : len(seq)] = torch.tensor(seq)
        tt[r, : len(ty)] = torch.tensor(ty)
        mask[r, : len(seq)] = 1
    batch = {"input_ids": ids, "token_type_ids": tt, "attention_mask": mask}
    if choices:
        c = len(first)
        batch = {k: v.view(len(features), c, length) for k, v in batch.items()}
    labels = [f.label for f in features]
    if all(lab is not None for lab in labels):
        if isinstance(labels[0], list):  # per-token labels
            lab = torch.full((len(features), length), IGNORE, dtype=torch.long)
            for r, seq in enumerate(labels):
                lab[r, : len(seq)] = torch.tensor(seq)
            batch["labels"] = lab
        else:
            batch["labels"] = torch.tensor(labels, dtype=torch.float32 if regression else torch.long)
    return batch
