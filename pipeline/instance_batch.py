"""`InstanceBatch`: many instances packed into a few flat numpy arrays, with their shard sort keys.

The job moves instances between stages in these batches instead of one `Instance` per element: a
runner then encodes ~10 arrays per few thousand instances instead of ~5 arrays per instance, which
was the largest Beam cost of the job, and the shard writer builds its Arrow columns with a gather
instead of a Python loop. The rows, their keys and therefore the shard bytes are unchanged.
Legend: N = instances, T = their tokens, P = their masked positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from pipeline.instances import Instance, id_dtype


def _offsets(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def _gather(values: np.ndarray, lengths: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The ragged rows `rows` of `values` (cut by `lengths`), concatenated in that order."""
    starts = _offsets(lengths)[rows]
    take = lengths[rows]
    if not take.size:
        return values[:0]
    # Position j of the output reads values[start of its row + j - (output start of its row)].
    out_starts = _offsets(take)[:-1]
    index = np.arange(int(take.sum()), dtype=np.int64) + np.repeat(starts - out_starts, take)
    return values[index]


@dataclass(frozen=True)
class InstanceBatch:
    """Instances and their sort keys `(order, doc_id, dupe, index)`, row-aligned.

    Compact, because the local runner holds every batch of the corpus in memory between the NSP
    and shard stages: token ids and masked ids are uint16 when they fit (`id_dtype`), positions
    uint16 (seq_len <= 4096), and token types are one count per row (`[CLS] A [SEP]` is type 0,
    the rest type 1) instead of a byte per token: ~2.3 bytes per token instead of ~6.2. The shard
    writer widens them back to the schema's types, so the shard bytes do not change.
    """

    order: np.ndarray  # [N] uint64: shard = order mod shards; rows sort by the whole key
    doc_ids: list[str]  # [N]
    dupes: np.ndarray  # [N] int32
    indexes: np.ndarray  # [N] int32: the instance's index among its document copy's instances
    lengths: np.ndarray  # [N] int32 tokens per instance
    input_ids: np.ndarray  # [T] uint16 or int32, masks applied
    type0_lengths: np.ndarray  # [N] int32 leading tokens of type 0 per instance
    num_masked: np.ndarray  # [N] int32
    masked_lm_positions: np.ndarray  # [P] uint16
    masked_lm_ids: np.ndarray  # [P] uint16 or int32
    next_sentence_labels: np.ndarray  # [N] int8

    def __len__(self) -> int:
        return int(self.order.size)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.size)

    @property
    def token_type_ids(self) -> np.ndarray:
        """[T] int8: per row, `type0_lengths` zeros then ones."""
        row_start = np.repeat(_offsets(self.lengths)[:-1], self.lengths)
        return ((np.arange(self.num_tokens) - row_start) >= np.repeat(self.type0_lengths, self.lengths)).astype(np.int8)

    @classmethod
    def from_instances(cls, keys: Sequence[tuple[int, str, int, int]], instances: Sequence[Instance]) -> InstanceBatch:
        def flat(arrays, dtype):
            return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype=dtype)

        lengths = np.array([i.input_ids.size for i in instances], dtype=np.int32)
        input_ids = flat([i.input_ids for i in instances], np.int32)
        masked_lm_ids = flat([i.masked_lm_ids for i in instances], np.int32)
        token_types = flat([i.token_type_ids for i in instances], np.int8)
        ones = np.diff(_offsets(token_types)[_offsets(lengths)]).astype(np.int32)  # type-1 tokens per row
        batch = cls(
            order=np.array([k[0] for k in keys], dtype=np.uint64),
            doc_ids=[k[1] for k in keys],
            dupes=np.array([k[2] for k in keys], dtype=np.int32),
            indexes=np.array([k[3] for k in keys], dtype=np.int32),
            lengths=lengths,
            input_ids=input_ids.astype(id_dtype(int(input_ids.max(initial=0))), copy=False),
            type0_lengths=lengths - ones,
            num_masked=np.array([i.masked_lm_positions.size for i in instances], dtype=np.int32),
            masked_lm_positions=flat([i.masked_lm_positions for i in instances], np.uint16),
            masked_lm_ids=masked_lm_ids.astype(id_dtype(int(masked_lm_ids.max(initial=0))), copy=False),
            next_sentence_labels=np.array([i.next_sentence_label for i in instances], dtype=np.int8),
        )
        # Types are a prefix of zeros by construction (`_make_instance`); one count per row holds them.
        assert np.array_equal(batch.token_type_ids, token_types), "token types are not [0..0 1..1] per row"
        return batch

    def take(self, rows: np.ndarray) -> InstanceBatch:
        """Rows `rows` (an index array), in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        return InstanceBatch(
            order=self.order[rows],
            doc_ids=[self.doc_ids[r] for r in rows.tolist()],
            dupes=self.dupes[rows],
            indexes=self.indexes[rows],
            lengths=self.lengths[rows],
            input_ids=_gather(self.input_ids, self.lengths, rows),
            type0_lengths=self.type0_lengths[rows],
            num_masked=self.num_masked[rows],
            masked_lm_positions=_gather(self.masked_lm_positions, self.num_masked, rows),
            masked_lm_ids=_gather(self.masked_lm_ids, self.num_masked, rows),
            next_sentence_labels=self.next_sentence_labels[rows],
        )

    @classmethod
    def concat(cls, batches: Sequence[InstanceBatch]) -> InstanceBatch:
        if not batches:
            return cls.from_instances([], [])
        return cls(
            order=np.concatenate([b.order for b in batches]),
            doc_ids=[d for b in batches for d in b.doc_ids],
            **{name: np.concatenate([getattr(b, name) for b in batches]) for name in (
                "dupes", "indexes", "lengths", "input_ids", "type0_lengths", "num_masked", "masked_lm_positions",
                "masked_lm_ids", "next_sentence_labels")},
        )

    def sorted_by_key(self) -> InstanceBatch:
        """Rows in ascending `(order, doc_id, dupe, index)`: a shard's deterministic shuffle."""
        keys = list(zip(self.order.tolist(), self.doc_ids, self.dupes.tolist(), self.indexes.tolist()))
        return self.take(np.array(sorted(range(len(keys)), key=keys.__getitem__), dtype=np.int64))

    def instance(self, row: int) -> Instance:
        """Row `row` as an `Instance` (tests and debugging; the job never unpacks a batch)."""
        t0, t1 = (int(x) for x in _offsets(self.lengths)[row : row + 2])
        p0, p1 = (int(x) for x in _offsets(self.num_masked)[row : row + 2])
        token_types = np.zeros(t1 - t0, dtype=np.int8)
        token_types[int(self.type0_lengths[row]):] = 1
        return Instance(self.doc_ids[row], self.input_ids[t0:t1].astype(np.int32), token_types,
                        self.masked_lm_positions[p0:p1].astype(np.int32), self.masked_lm_ids[p0:p1].astype(np.int32),
                        int(self.next_sentence_labels[row]))
