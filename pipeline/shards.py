"""`WriteShards`: the Beam sink that turns instances into balanced, shuffled Arrow (or Parquet) shards.

Instances arrive in packed `InstanceBatch`es; each instance carries a 64-bit key hashed from (seed,
doc id, dupe, index). The key picks the shard
(`key mod num_shards`, balanced in expectation) and orders rows inside it (a deterministic shuffle),
so a shard's bytes depend only on its rows: 1 or N workers, any bundling, give identical files.
A shard is written by the worker that holds its group, through `FileSystems` (remote outputs work);
nothing is collected on the driver. Shard counts come from a side input of per-split instance counts.
"""

from __future__ import annotations

import hashlib
import io
import logging
import math
from typing import Iterable

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from pipeline.named_writes import write_file
from pipeline.instance_batch import InstanceBatch
from pipeline.nsp import HELDOUT, TRAIN

log = logging.getLogger(__name__)

SCHEMA = pa.schema(
    [
        ("input_ids", pa.list_(pa.int32())),
        ("token_type_ids", pa.list_(pa.int8())),
        ("masked_lm_positions", pa.list_(pa.int32())),
        ("masked_lm_ids", pa.list_(pa.int32())),
        ("next_sentence_label", pa.int8()),
        ("length", pa.int32()),
        ("doc_id", pa.string()),
    ]
)
BATCH_ROWS = 1024
SUFFIX = {"arrow": "arrow", "parquet": "parquet"}


def shard_name(split: str, index: int, count: int, shard_format: str) -> str:
    return f"{split}-{index:05d}-of-{count:05d}.{SUFFIX[shard_format]}"


def _list_array(values: np.ndarray, lengths: np.ndarray, dtype) -> pa.ListArray:
    offsets = np.zeros(lengths.size + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    # Batches keep ids compact (uint16); the schema, and so the shard bytes, stay int32.
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values.astype(dtype, copy=False)))


def batch_to_table(batch: InstanceBatch) -> pa.Table:
    columns = [
        _list_array(batch.input_ids, batch.lengths, np.int32),
        _list_array(batch.token_type_ids, batch.lengths, np.int8),
        _list_array(batch.masked_lm_positions, batch.num_masked, np.int32),
        _list_array(batch.masked_lm_ids, batch.num_masked, np.int32),
        pa.array(batch.next_sentence_labels),
        pa.array(batch.lengths),
        pa.array(batch.doc_ids, type=pa.string()),
    ]
    return pa.Table.from_arrays(columns, schema=SCHEMA)


def encode_shard(batch: InstanceBatch, shard_format: str) -> bytes:
    """A shard's bytes: a pure function of its ordered rows (fixed batch size, no timestamps)."""
    table = batch_to_table(batch)
    buf = io.BytesIO()
    if shard_format == "arrow":
        with pa.ipc.new_file(buf, SCHEMA) as writer:
            for record_batch in table.to_batches(max_chunksize=BATCH_ROWS):
                writer.write_batch(record_batch)
    else:
        pq.write_table(table, buf, row_group_size=BATCH_ROWS * 16, compression="zstd")
    return buf.getvalue()


def shard_counts(instance_counts: dict, num_shards: int, instances_per_shard: int) -> dict[str, int]:
    """Shards per split: train gets `num_shards` (or enough for `instances_per_shard` if 0); heldout
    shards hold about as many rows as train shards."""
    n_train = instance_counts.get(TRAIN, 0)
    n_heldout = instance_counts.get(HELDOUT, 0)
    train = num_shards or max(1, math.ceil(n_train / instances_per_shard))
    per_shard = max(1, math.ceil(n_train / train)) if n_train else instances_per_shard
    out = {TRAIN: train}
    if n_heldout:
        out[HELDOUT] = max(1, math.ceil(n_heldout / per_shard))
    return out


class _AssignShard(beam.DoFn):
    def __init__(self, num_shards: int, instances_per_shard: int):
        self.num_shards = num_shards
        self.instances_per_shard = instances_per_shard

    def process(self, element, counts) -> Iterable:
        split, batch = element
        n = shard_counts(counts, self.num_shards, self.instances_per_shard)[split]
        shard_of = batch.order % np.uint64(n)
        # One sub-batch per shard this batch touches; rows keep their keys, the writer sorts them.
        for index in np.unique(shard_of).tolist():
            yield (split, index), batch.take(np.flatnonzero(shard_of == index))


class _WriteShardFn(beam.DoFn):
    """Writes one shard per group of `(split, index)` sub-batches (`process`), or with `empty_only`,
    every shard of the layout that no instance hashed to (tiny corpora), so names stay `-of-N` true."""

    def __init__(self, out_dir: str, shard_format: str, num_shards: int, instances_per_shard: int, empty_only: bool = False):
        self.out_dir = out_dir
        self.shard_format = shard_format
        self.num_shards = num_shards
        self.instances_per_shard = instances_per_shard
        self.empty_only = empty_only
        self.written = Metrics.counter("corpus", "shards_written")

    def process(self, element, counts, written_names=()) -> Iterable:
        layout = shard_counts(counts, self.num_shards, self.instances_per_shard)
        if self.empty_only:
            done = set(written_names)
            for split, count in layout.items():
                for index in range(count):
                    if shard_name(split, index, count, self.shard_format) not in done:
                        yield self._write(split, index, count, InstanceBatch.concat([]))
            return
        (split, index), batches = element
        yield self._write(split, index, layout[split], InstanceBatch.concat(list(batches)).sorted_by_key())

    def _write(self, split: str, index: int, count: int, rows: InstanceBatch) -> dict:
        name = shard_name(split, index, count, self.shard_format)
        data = encode_shard(rows, self.shard_format)
        # Retries rewrite the same bytes to the same name, so a plain create is idempotent. A failed write names
        # the shard: Beam passes the error on in text, and a full disk's report named a progress file instead.
        write_file(FileSystems.join(self.out_dir, name), data)
        self.written.inc()
        log.info("wrote %s (%d instances)", name, len(rows))
        return {"path": name, "split": split, "num_instances": len(rows), "sha256": hashlib.sha256(data).hexdigest()}


class WriteShards(beam.PTransform):
    """`(split, InstanceBatch)` -> shard files under `out_dir`; outputs one info dict per shard."""

    def __init__(self, out_dir: str, shard_format: str = "arrow", num_shards: int = 0, instances_per_shard: int = 100_000):
        super().__init__()
        if shard_format not in SUFFIX:
            raise ValueError(f"shard format {shard_format!r} is not one of {', '.join(SUFFIX)}")
        self.args = (out_dir, shard_format, num_shards, instances_per_shard)

    def expand(self, instances):
        out_dir, shard_format, num_shards, per_shard = self.args
        counts = beam.pvalue.AsDict(
            instances | "SplitOf" >> beam.Map(lambda e: (e[0], len(e[1]))) | "CountPerSplit" >> beam.CombinePerKey(sum)
        )
        written = (
            instances
            | "AssignShard" >> beam.ParDo(_AssignShard(num_shards, per_shard), counts=counts)
            # Straight into the grouping: a Flatten here (for empty shards) would make the local
            # runner materialise every instance once more.
            | "GroupShards" >> beam.GroupByKey()
            | "WriteShard" >> beam.ParDo(_WriteShardFn(out_dir, shard_format, num_shards, per_shard), counts=counts)
        )
        empty = (
            instances.pipeline
            | "One" >> beam.Create([None])
            | "WriteEmptyShards" >> beam.ParDo(
                _WriteShardFn(out_dir, shard_format, num_shards, per_shard, empty_only=True), counts=counts,
                written_names=beam.pvalue.AsList(written | "WrittenNames" >> beam.Map(lambda info: info["path"])))
        )
        return (written, empty) | "AllShards" >> beam.Flatten()
