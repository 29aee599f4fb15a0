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

from pipeline.instances import Instance


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
    """Instances and their sort keys `(order, doc_id, dupe, index)`, row-aligned."""

    order: np.ndarray  # [N] uint64: shard = order mod shards; rows sort by the whole key
    doc_ids: list[str]  # [N]
    dupes: np.ndarray  # [N] int32
    indexes: np.ndarray  # [N] int32: the instance's index among its document copy's instances
    lengths: np.ndarray  # [N] int32 tokens per instance
    input_ids: np.ndarray  # [T] int32, masks applied
    token_type_ids: np.ndarray  # [T] int8
    num_masked: np.ndarray  # [N] int32
    masked_lm_positions: np.ndarray  # [P] int32
    masked_lm_ids: np.ndarray  # [P] int32
    next_sentence_labels: np.ndarray  # [N] int8

    def __len__(self) -> int:
        return int(self.order.size)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.size)

    @classmethod
    def from_instances(cls, keys: Sequence[tuple[int, str, int, int]], instances: Sequence[Instance]) -> InstanceBatch:
        def flat(arrays, dtype):
            return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype=dtype)

        return cls(
            order=np.array([k[0] for k in keys], dtype=np.uint64),
            doc_ids=[k[1] for k in keys],
            dupes=np.array([k[2] for k in keys], dtype=np.int32),
            indexes=np.array([k[3] for k in keys], dtype=np.int32),
            lengths=np.array([i.input_ids.size for i in instances], dtype=np.int32),
            input_ids=flat([i.input_ids for i in instances], np.int32),
            token_type_ids=flat([i.token_type_ids for i in instances], np.int8),
            num_masked=np.array([i.masked_lm_positions.size for i in instances], dtype=np.int32),
            masked_lm_positions=flat([i.masked_lm_positions for i in instances], np.int32),
            masked_lm_ids=flat([i.masked_lm_ids for i in instances], np.int32),
            next_sentence_labels=np.array([i.next_sentence_label for i in instances], dtype=np.int8),
        )

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
            token_type_ids=_gather(self.token_type_ids, self.lengths, rows),
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
                "dupes", "indexes", "lengths", "input_ids", "token_type_ids", "num_masked", "masked_lm_positions",
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
        return Instance(self.doc_ids[row], self.input_ids[t0:t1], self.token_type_ids[t0:t1],
                        self.masked_lm_positions[p0:p1], self.masked_lm_ids[p0:p1], int(self.next_sentence_labels[row]))
