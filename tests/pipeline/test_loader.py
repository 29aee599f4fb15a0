"""The training loader: order, rank slicing, resume position, padding, dynamic masking, bad input."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipeline.collate import PCG_INC
from pipeline.loader import PretrainLoader, ShardedSplit, heldout_batches
from pipeline.loader_order import EpochPermutation
from pipeline.masking import MaskingVocab, derive_seed, mask_tokens
from repo_paths import REPO

VOCAB_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(45)] + ["##s", "##ing"]
SCHEMA = pa.schema([
    ("input_ids", pa.list_(pa.int32())), ("token_type_ids", pa.list_(pa.int8())),
    ("masked_lm_positions", pa.list_(pa.int32())), ("masked_lm_ids", pa.list_(pa.int32())),
    ("next_sentence_label", pa.int8()), ("length", pa.int32()), ("doc_id", pa.string()),
])


def write_corpus(root: Path, sizes: dict[str, list[int]], seed: int = 0) -> Path:
    """A corpus directory per the ARCHITECTURE.md contract; sample k's first token after [CLS] encodes k."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    vocab_text = "\n".join(VOCAB_TOKENS) + "\n"
    (root / "vocab.txt").write_text(vocab_text)
    shards, counter = [], 0
    for split, shard_sizes in sizes.items():
        for s, size in enumerate(shard_sizes):
            rows = {name: [] for name in SCHEMA.names}
            for _ in range(size):
                length = int(rng.integers(6, 20))
                ids = [2] + list(rng.integers(5, 50, length - 2)) + [3]
                ids[1] = 5 + counter % 45
                positions = sorted(rng.choice(np.arange(2, length - 1), size=2, replace=False).tolist())
                labels = [ids[p] for p in positions]
                for p in positions:
                    ids[p] = 4
                rows["input_ids"].append(ids)
                rows["token_type_ids"].append([0] * (length // 2) + [1] * (length - length // 2))
                rows["masked_lm_positions"].append(positions)
                rows["masked_lm_ids"].append(labels)
                rows["next_sentence_label"].append(int(rng.integers(0, 2)))
                rows["length"].append(length)
                rows["doc_id"].append(f"doc{counter}")
                counter += 1
            name = f"{split}-{s:05d}-of-{len(shard_sizes):05d}.arrow"
            table = pa.Table.from_pydict(rows, schema=SCHEMA)
            with pa.OSFile(str(root / name), "wb") as f, pa.ipc.new_file(f, SCHEMA) as writer:
                for batch in table.to_batches(max_chunksize=7):  # several record batches per shard
                    writer.write_batch(batch)
            shards.append({"path": name, "split": split, "num_instances": size, "sha256": "0"})
    manifest = {"format": "bertpipe-corpus", "format_version": 1, "seed": 1, "seq_len": 20, "vocab_file": "vocab.txt",
                "vocab_size": len(VOCAB_TOKENS), "vocab_sha256": hashlib.sha256(vocab_text.encode()).hexdigest(),
                "masked_lm_prob": 0.15, "max_predictions": 3,
                "whole_word_mask": False, "num_instances": counter, "shards": shards, "lowercase": True}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


@pytest.fixture
def corpus(tmp_path) -> Path:
    return write_corpus(tmp_path / "c", {"train": [40, 33], "heldout": [9]})


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1000, 4097])
def test_epoch_permutation_is_a_permutation_and_pure(n):
    perm = EpochPermutation(n, seed=3, epoch=1)[np.arange(n)]
    assert sorted(perm.tolist()) == list(range(n))
    again = EpochPermutation(n, seed=3, epoch=1)[np.arange(n)[::-1]][::-1]
    assert np.array_equal(perm, again)
    if n > 8:
        assert not np.array_equal(perm, EpochPermutation(n, seed=3, epoch=2)[np.arange(n)])
        assert not np.array_equal(perm, EpochPermutation(n, seed=4, epoch=1)[np.arange(n)])


def test_epoch_permutation_refuses_positions_outside_the_epoch():
    # Position n (one past the end, a resume past the epoch's last sample) fed to the Feistel network would
    # be walked back into [0, n) and silently return some sample; -1 (2^64 - 1 as uint64) would never come
    # back from cycle walking: an alarm makes that case fail instead of hang.
    import signal

    def hung(*_):
        raise TimeoutError("EpochPermutation never returned for an out-of-range position")

    perm = EpochPermutation(10, seed=3, epoch=1)
    assert perm[np.array([0, 9])].tolist() == perm[np.arange(10)][[0, 9]].tolist()
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    try:
        for bad in ([10], [-1], [3, 10]):
            with pytest.raises(IndexError, match=r"positions must lie in \[0, 10\)"):
                perm[np.array(bad)]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_split_reads_every_sample_across_shards_and_record_batches(corpus):
    split = ShardedSplit(corpus, "train")
    assert len(split) == 73 and len(ShardedSplit(corpus, "heldout")) == 9
    assert [int(split.sample(k)["input_ids"][1]) for k in range(73)] == [5 + k % 45 for k in range(73)]


def _stream(corpus, world: int, micro: int, global_batch: int, start: int, rounds: int) -> list[int]:
    split = ShardedSplit(corpus, "train")
    loaders = [iter(PretrainLoader(split, seed=9, micro_batch_size=micro, global_batch_size=global_batch, rank=r,
                                   world_size=world, position=start, prefetch=2 if r == 0 else 0))
               for r in range(world)]
    ids = []
    for _ in range(rounds):
        for it in loaders:
            batch, _ = next(it)
            ids += batch["sample_index"].tolist()
    return ids


def test_global_order_is_independent_of_world_size_and_resume_point(corpus):
    full = _stream(corpus, world=2, micro=4, global_batch=16, start=0, rounds=20)  # 160 samples: > 2 epochs
    assert _stream(corpus, world=1, micro=4, global_batch=16, start=0, rounds=40) == full
    assert _stream(corpus, world=4, micro=4, global_batch=16, start=48, rounds=7) == full[48:160]
    # Each epoch is 64 samples (4 global batches of 16 out of 73); no sample repeats inside an epoch.
    for e in range(2):
        assert len(set(full[64 * e:64 * (e + 1)])) == 64
    assert full[:64] != full[64:128]


def test_batches_pad_to_the_longest_and_follow_the_contract(corpus):
    split = ShardedSplit(corpus, "train")
    loader = PretrainLoader(split, seed=1, micro_batch_size=8, global_batch_size=8, prefetch=0)
    batch, position = next(iter(loader))
    assert position == 8
    lengths = [len(split.sample(int(k))["input_ids"]) for k in batch["sample_index"]]
    assert batch["input_ids"].shape == (8, max(lengths))
    assert batch["attention_mask"].sum(1).tolist() == lengths
    for row, k in enumerate(batch["sample_index"].tolist()):
        s = split.sample(k)
        assert batch["input_ids"][row, :lengths[row]].tolist() == s["input_ids"].tolist()
        assert batch["input_ids"][row, lengths[row]:].eq(0).all()
        assert batch["masked_lm_ids"][row, :2].tolist() == s["masked_lm_ids"].tolist()
    assert batch["masked_lm_ids"].shape == batch["masked_lm_positions"].shape == (8, 2)


def test_dynamic_masking_restores_then_remasks_deterministically(corpus):
    split = ShardedSplit(corpus, "train")

    def first(epoch_position: int):
        loader = PretrainLoader(split, seed=5, micro_batch_size=8, global_batch_size=8, dynamic_masking=True,
                                position=epoch_position, prefetch=0)
        return next(iter(loader))[0]

    a, b = first(0), first(0)
    for key in a:
        assert a[key].equal(b[key]), key
    for row, k in enumerate(a["sample_index"].tolist()):
        s = split.sample(k)
        original = s["input_ids"].copy()
        original[s["masked_lm_positions"]] = s["masked_lm_ids"]
        n = len(original)
        got = a["input_ids"][row, :n].numpy().copy()
        labels = a["masked_lm_ids"][row]
        positions = a["masked_lm_positions"][row][labels != -100].numpy()
        got[positions] = labels[labels != -100].numpy()
        assert np.array_equal(got, original)  # the new masks hide the original tokens, nothing else
    # The next epoch sees the same sample with fresh masks.
    later = PretrainLoader(split, seed=5, micro_batch_size=8, global_batch_size=8, dynamic_masking=True, prefetch=0)
    k = a["sample_index"][0].item()
    epoch_pos = [p for p in range(later.epoch_size, 2 * later.epoch_size) if later.sample_ids(np.array([p]))[0][0] == k]
    again = later.batch_at(epoch_pos[0] - epoch_pos[0] % 8)
    row = again["sample_index"].tolist().index(k)
    assert not (again["masked_lm_positions"][row].equal(a["masked_lm_positions"][0])
                and again["input_ids"][row].equal(a["input_ids"][0]))



def _reference_batch(split, ids, epochs, seed: int) -> dict[str, np.ndarray]:
    """Dynamic masking by definition: per sample, undo the static masks, then `mask_tokens` with a PCG64
    keyed by derive_seed("dynamic-mask", seed, epoch, sample id); pad to the longest, labels padded -100."""
    m = split.manifest
    vocab = MaskingVocab.from_vocab_file(split.dir / m["vocab_file"])
    rows = []
    for k, e in zip(ids, epochs):
        s = split.sample(int(k))
        original = np.array(s["input_ids"], dtype=np.int32)
        original[s["masked_lm_positions"]] = s["masked_lm_ids"]
        rng = np.random.Generator(np.random.PCG64(0))
        rng.bit_generator.state = {"bit_generator": "PCG64", "has_uint32": 0, "uinteger": 0, "state": {
            "state": derive_seed("dynamic-mask", seed, int(e), int(k)), "inc": PCG_INC}}
        masked = mask_tokens(original, rng=rng, vocab=vocab, masked_lm_prob=m["masked_lm_prob"],
                             max_predictions=m["max_predictions"], whole_word_mask=m["whole_word_mask"])
        rows.append((masked, s))
    seq = max(len(r.input_ids) for r, _ in rows)
    num_pred = max(max(len(r.positions) for r, _ in rows), 1)
    out = {"input_ids": np.zeros((len(rows), seq), np.int64), "token_type_ids": np.zeros((len(rows), seq), np.int64),
           "attention_mask": np.zeros((len(rows), seq), np.int64),
           "masked_lm_positions": np.zeros((len(rows), num_pred), np.int64),
           "masked_lm_ids": np.full((len(rows), num_pred), -100, np.int64),
           "next_sentence_label": np.array([s["next_sentence_label"] for _, s in rows], np.int64),
           "sample_index": np.asarray(ids, np.int64)}
    for i, (r, s) in enumerate(rows):
        n, p = len(r.input_ids), len(r.positions)
        out["input_ids"][i, :n] = r.input_ids
        out["token_type_ids"][i, :n] = s["token_type_ids"]
        out["attention_mask"][i, :n] = 1
        out["masked_lm_positions"][i, :p] = r.positions
        out["masked_lm_ids"][i, :p] = r.labels
    return out


@pytest.mark.parametrize("settings", [
    {},  # the corpus's own: 15%, at most 3 predictions
    {"masked_lm_prob": 0.9, "max_predictions": 50},  # often every candidate is chosen
    {"masked_lm_prob": 0.3, "max_predictions": 4, "whole_word_mask": True},  # the per-sample path
])
def test_dynamic_masking_batches_equal_per_sample_mask_tokens(tmp_path, settings):
    """The loader's batched re-masking must stay bit-identical to per-sample `mask_tokens` (issue 4's
    throughput work vectorised it): every tensor, every rank, across an epoch boundary and through prefetch."""
    root = write_corpus(tmp_path / "c", {"train": [40, 33]}, seed=3)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest.update(settings)
    (root / "manifest.json").write_text(json.dumps(manifest))
    split = ShardedSplit(root, "train")
    for world in (1, 2):
        for rank in range(world):
            loader = PretrainLoader(split, seed=11, micro_batch_size=8, global_batch_size=16, rank=rank,
                                    world_size=world, dynamic_masking=True, position=48, prefetch=2)
            for _, (batch, after) in zip(range(4 * (3 - world)), loader):  # positions 48..111: epoch 0 -> 1
                start = after - 8 * world + rank * 8
                ids, epochs = loader.sample_ids(np.arange(start, start + 8, dtype=np.int64))
                want = _reference_batch(split, ids, epochs, seed=11)
                assert sorted(batch) == sorted(want)
                for key, value in want.items():
                    got = batch[key].numpy()
                    assert got.dtype == value.dtype and np.array_equal(got, value), (key, world, rank, after)


def test_heldout_batches_split_evenly_across_ranks(corpus):
    split = ShardedSplit(corpus, "heldout")
    seen = [[k for b in heldout_batches(split, max_samples=100, micro_batch_size=2, rank=r, world_size=2)
             for k in b["sample_index"].tolist()] for r in range(2)]
    assert len(seen[0]) == len(seen[1]) == 4 and not set(seen[0]) & set(seen[1])


def test_heldout_batches_stop_at_max_samples(corpus):
    # log.eval_samples bounds the held-out pass: the first max_samples instances in corpus order, not all 9.
    split = ShardedSplit(corpus, "heldout")
    ids = [k for b in heldout_batches(split, max_samples=4, micro_batch_size=2, rank=0, world_size=1)
           for k in b["sample_index"].tolist()]
    assert ids == [0, 1, 2, 3]


def test_bad_corpora_are_refused_with_a_fix(tmp_path, corpus):
    with pytest.raises(ValueError, match="no manifest.json"):
        ShardedSplit(tmp_path)
    (corpus / "train-00001-of-00002.arrow").unlink()
    with pytest.raises(ValueError, match="missing; rebuild or re-copy"):
        ShardedSplit(corpus)
    small = write_corpus(tmp_path / "small", {"train": [5]})
    with pytest.raises(ValueError, match="fewer than one global batch"):
        PretrainLoader(ShardedSplit(small), seed=0, micro_batch_size=4, global_batch_size=8)


@pytest.mark.parametrize("read", ["samples", "sample", "masked_token_counts"])
def test_a_shard_cut_short_while_a_run_reads_it_is_named_not_a_bus_error(tmp_path, read):
    # Reading a mapped shard past its new end is a SIGBUS: the process died with "Bus error", no file named.
    # In a child process, so that a regression fails this test and not the whole session.
    root = write_corpus(tmp_path / "c", {"train": [3000]})
    shard = root / "train-00000-of-00001.arrow"
    calls = {"samples": "split.samples(np.arange(len(split)))", "sample": "split.sample(len(split) - 1)",
             "masked_token_counts": "split.masked_token_counts()"}
    script = (f"import os, numpy as np\nfrom pipeline.loader import ShardedSplit\nsplit = ShardedSplit({str(root)!r})\n"
              f"os.truncate({str(shard)!r}, 4096)\ntry:\n    {calls[read]}\nexcept ValueError as err:\n    print(err)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert f"corpus shard {shard} was cut from " in done.stdout and " to 4,096 bytes while this run read it" in done.stdout
