"""Training loader: memory-mapped Arrow shards -> padded micro-batches for one data-parallel rank.

The contract (docs/ARCHITECTURE.md, "Batches"): a dict of tensors `input_ids`, `token_type_ids`,
`attention_mask` [B,L] (L = longest sample in the batch), `masked_lm_positions` [B,P] (pad 0),
`masked_lm_ids` [B,P] (pad -100), `next_sentence_label` [B], `sample_index` [B]. With
`unpad_layout=True`, also the model's unpadded layout made here on the CPU (`add_unpadded_layout`):
`unpad_indices` [T] int64, `cu_seqlens` [B+1] int32 and `max_seqlen` (a Python int), so that the
device never waits for `nonzero`/`.item()`; with `pin_memory=True` (CUDA only) tensors come pinned,
so `.to(device, non_blocking=True)` really is asynchronous.

Order and position. The global stream is epoch after epoch of `EpochPermutation(N, seed, epoch)`;
each epoch uses the first `E = (N // global_batch) * global_batch` positions so that every optimizer
step sees a full global batch (the remainder, < one global batch, is skipped and logged). The
loader's *position* is the number of global samples consumed. A micro-batch "round" takes the next
`world_size * micro_batch` positions; rank r takes its contiguous slice of them. Resuming at
position p with any world size therefore continues the same global sequence.

Legend: B = micro-batch size, L = longest sequence in the batch, P = most masked positions in it.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import torch

from pipeline.collate import Collator
from pipeline.corpus_info import CorpusInfo, open_corpus
from pipeline.loader_order import EpochPermutation

log = logging.getLogger(__name__)

_LIST_COLUMNS = ("input_ids", "token_type_ids", "masked_lm_positions", "masked_lm_ids")


@dataclass
class _Block:
    """One Arrow record batch as zero-copy numpy views: (offsets, values) per list column."""

    size: int
    lists: dict[str, tuple[np.ndarray, np.ndarray]]
    nsp: np.ndarray
    shard: int = 0  # index into ShardedSplit._maps


class ShardedSplit:
    """All shards of one split (`train` or `heldout`) of a corpus, memory-mapped.

    `corpus` is a `CorpusInfo` read once by the caller (a directory is opened here). Sample ids
    number the split's instances in manifest shard order.
    """

    def __init__(self, corpus: CorpusInfo | str | Path, split: str = "train") -> None:
        self.corpus = corpus if isinstance(corpus, CorpusInfo) else open_corpus(corpus)
        self.dir = self.corpus.dir
        self.manifest = self.corpus.manifest
        self.split = split
        self._blocks: list[_Block] = []
        self._maps: list[pa.MemoryMappedFile] = []
        self._paths: list[Path] = []  # of each map
        for shard in self.corpus.shards(split):
            path = self.dir / shard["path"]
            if path.suffix != ".arrow":
                raise ValueError(f"{path}: the loader reads Arrow IPC shards; rebuild the corpus with --shard-format arrow")
            if not path.is_file():
                raise ValueError(f"{path} is listed in {self.dir / 'manifest.json'} but missing; rebuild or re-copy the corpus")
            try:
                mm = pa.memory_map(str(path), "r")
                self._maps.append(mm)
                self._paths.append(path)
                reader = pa.ipc.open_file(mm)
                batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
            except (pa.ArrowException, OSError) as err:
                raise ValueError(f"shard {path} cannot be read ({err}); it is damaged: restore it or rebuild the "
                                 "corpus (`bertpipe corpus inspect --verify` checks every shard)") from None
            rows = sum(b.num_rows for b in batches)
            if rows != shard["num_instances"]:  # the epoch is sized from the rows, the checks from the manifest
                raise ValueError(f"shard {path} holds {rows} instances where {self.dir / 'manifest.json'} lists "
                                 f"{shard['num_instances']}; the manifest was edited or the shard replaced: restore "
                                 "the corpus or rebuild it")
            for batch in batches:
                block = _block(batch, path)
                block.shard = len(self._maps) - 1
                longest = int(np.diff(block.lists["input_ids"][0]).max(initial=0))
                if longest > self.corpus.seq_len:  # the model's positions are sized from the manifest's
                    raise ValueError(f"{path} holds an instance of {longest} tokens, more than manifest.json's seq_len "
                                     f"{self.corpus.seq_len}; the manifest was edited or the shard is another "
                                     "corpus's: rebuild the corpus")
                self._blocks.append(block)
        self._starts = np.cumsum([0] + [b.size for b in self._blocks])  # [num_blocks + 1]

    def __len__(self) -> int:
        return int(self._starts[-1])

    def sample(self, index: int) -> dict[str, np.ndarray | int]:
        """One unpadded instance (numpy views into the mapped file)."""
        b = int(np.searchsorted(self._starts, index, side="right")) - 1
        block = self._blocks[b]
        row = index - int(self._starts[b])
        self._check_unchanged({block.shard})
        out: dict[str, Any] = {}
        for name, (offsets, values) in block.lists.items():
            out[name] = values[offsets[row]:offsets[row + 1]]
        out["next_sentence_label"] = int(block.nsp[row])
        return out

    def samples(self, indices: np.ndarray) -> list[dict[str, np.ndarray | int]]:
        """`[self.sample(i) for i in indices]`, with the block lookup done once for all of them."""
        blocks = (np.searchsorted(self._starts, indices, side="right") - 1).tolist()
        rows = (np.asarray(indices) - self._starts[blocks]).tolist()
        self._check_unchanged({self._blocks[b].shard for b in set(blocks)})
        out = []
        for b, row in zip(blocks, rows):
            block = self._blocks[b]
            s: dict[str, Any] = {name: values[offsets[row]:offsets[row + 1]]
                                 for name, (offsets, values) in block.lists.items()}
            s["next_sentence_label"] = int(block.nsp[row])
            out.append(s)
        return out

    def _check_unchanged(self, shards: set[int]) -> None:
        """Refuse to read a mapped shard that has been cut shorter since it was opened (a corpus job writing
        into this corpus, a copy that failed): reading past its new end is a SIGBUS, which kills the
        process with no word of which file. Checked before the mapped memory is read; the file we mapped
        (fstat), so a shard replaced by a rename, which the mapping does not see, is no error."""
        for shard in shards:
            mm = self._maps[shard]
            now = os.fstat(mm.fileno()).st_size
            if now < mm.size():
                raise ValueError(f"corpus shard {self._paths[shard]} was cut from {mm.size():,} to {now:,} bytes while "
                                 "this run read it (another job writing into the corpus?); restore the corpus, then "
                                 "continue with --resume")


    def masked_token_counts(self) -> np.ndarray:
        """How often each vocabulary id is a masked-LM target in this split (the corpus's static masks)."""
        self._check_unchanged(set(range(len(self._maps))))
        counts = np.zeros(int(self.manifest["vocab_size"]), dtype=np.int64)
        for block in self._blocks:
            offsets, values = block.lists["masked_lm_ids"]
            np.add.at(counts, values[offsets[0]:offsets[-1]].astype(np.int64), 1)
        return counts


def _block(batch: pa.RecordBatch, path: Path) -> _Block:
    missing = [c for c in (*_LIST_COLUMNS, "next_sentence_label") if c not in batch.schema.names]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)}; is this a bertpipe corpus shard?")
    lists = {}
    for name in _LIST_COLUMNS:
        arr = batch.column(name)
        if arr.null_count:
            raise ValueError(f"{path}: column {name} has nulls; rebuild the corpus")
        lists[name] = (arr.offsets.to_numpy(), arr.values.to_numpy())
    return _Block(batch.num_rows, lists, batch.column("next_sentence_label").to_numpy())


def add_unpadded_layout(batch: dict[str, Any]) -> dict[str, Any]:
    """Add where the real tokens of `batch["attention_mask"]` lie, as `model.Unpadded.precomputed` takes
    it (the same values `Unpadded.from_mask` computes on the device): T = number of real tokens."""
    mask_BL = batch["attention_mask"].numpy().astype(bool)
    lengths_B = mask_BL.sum(axis=1)
    cu_seqlens = np.zeros(len(lengths_B) + 1, dtype=np.int32)
    np.cumsum(lengths_B, out=cu_seqlens[1:])
    batch["unpad_indices"] = torch.from_numpy(np.flatnonzero(mask_BL).astype(np.int64))  # [T], row-major
    batch["cu_seqlens"] = torch.from_numpy(cu_seqlens)  # [B + 1]
    batch["max_seqlen"] = int(lengths_B.max()) if len(lengths_B) else 0
    return batch


def pin(batch: dict[str, Any]) -> dict[str, Any]:
    """Page-locked copies of the batch's tensors (only where CUDA is present: pinning needs a driver)."""
    if not torch.cuda.is_available():
        return batch
    return {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


class PretrainLoader:
    """Micro-batches for one data-parallel rank, starting at a global sample position.

    Iterating yields `(batch, position_after)`: the global samples consumed once this micro-batch's
    round is done, which is what a checkpoint stores (the prefetch thread runs ahead of training;
    the position saved is that of the last batch actually consumed).
    """

    def __init__(
        self,
        split: ShardedSplit,
        *,
        seed: int,
        micro_batch_size: int,
        global_batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        position: int = 0,
        dynamic_masking: bool = False,
        prefetch: int = 4,
        unpad_layout: bool = False,
        pin_memory: bool = False,
    ) -> None:
        # The caller validated the sizes (`launch.pretrain.pretrain_config.validate` says what to change).
        assert global_batch_size % (micro_batch_size * world_size) == 0, "global batch = micro x accumulation x world"
        split.corpus.check_fits(global_batch_size, split.split)
        n = len(split)
        self.epoch_size = (n // global_batch_size) * global_batch_size
        if n > self.epoch_size and position == 0 and rank == 0:
            log.info("each epoch uses %d of %d samples (the last %d do not fill a global batch)",
                     self.epoch_size, n, n - self.epoch_size)
        self.split = split
        self.seed = seed
        self.micro = micro_batch_size
        self.rank = rank
        self.world = world_size
        self.position = position
        self.prefetch = prefetch
        self.unpad_layout = unpad_layout
        self.pin_memory = pin_memory
        vocab = split.corpus.vocab.masking() if dynamic_masking else None
        self.collate = Collator(split.manifest, vocab, seed)
        self._perms: dict[int, EpochPermutation] = {}

    def sample_ids(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global sample ids (and epochs) at global stream positions."""
        epochs = positions // self.epoch_size
        offsets = positions % self.epoch_size
        ids = np.empty_like(positions)
        for epoch in np.unique(epochs):
            perm = self._perms.get(int(epoch))
            if perm is None:
                self._perms = {int(epoch): EpochPermutation(len(self.split), self.seed, int(epoch))}
                perm = self._perms[int(epoch)]
            sel = epochs == epoch
            ids[sel] = perm[offsets[sel]]
        return ids, epochs

    def batch_at(self, position: int) -> dict[str, torch.Tensor]:
        """This rank's micro-batch of the round that starts at global `position`."""
        start = position + self.rank * self.micro
        ids, epochs = self.sample_ids(np.arange(start, start + self.micro, dtype=np.int64))
        samples = self.split.samples(ids)
        if self.collate.vocab is not None:
            batch = self.collate.remasked(samples, ids, epochs)
        else:
            batch = self.collate(samples, ids)
        # Here, in the prefetch thread: layout and pinning cost the training loop nothing.
        if self.unpad_layout:
            batch = add_unpadded_layout(batch)
        return pin(batch) if self.pin_memory else batch

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], int]]:
        round_size = self.micro * self.world
        if self.prefetch <= 0:
            pos = self.position
            while True:
                batch = self.batch_at(pos)
                pos += round_size
                yield batch, pos
        yield from _prefetched(self, self.position, round_size, self.prefetch)


def _prefetched(loader: PretrainLoader, start: int, round_size: int, depth: int):
    """Batches made by a background thread (numpy/arrow work releases the GIL for much of it)."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def work() -> None:
        pos = start
        try:
            while not stop.is_set():
                item = (loader.batch_at(pos), pos + round_size)
                pos += round_size
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as err:  # surfaced in the consumer, not lost in the thread
            q.put(err)

    thread = threading.Thread(target=work, name="loader-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)


def heldout_batches(split: ShardedSplit, *, max_samples: int, micro_batch_size: int, rank: int,
                    world_size: int) -> Iterator[dict[str, torch.Tensor]]:
    """This rank's share of the first `max_samples` held-out instances, in corpus order (static masks)."""
    total = min(len(split), max_samples)
    per_rank = total // world_size  # equal shares keep the ranks' collective calls in step
    collate = Collator(split.manifest)
    lo = rank * per_rank
    for start in range(lo, lo + per_rank, micro_batch_size):
        ids = np.arange(start, min(start + micro_batch_size, lo + per_rank), dtype=np.int64)
        yield collate([split.sample(int(i)) for i in ids], ids)
