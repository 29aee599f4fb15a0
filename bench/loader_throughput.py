"""Loader throughput on one core: read (memory-mapped Arrow) + mask + collate, samples/s.

Ours: `pipeline.loader.PretrainLoader.batch_at` (global shuffled order, dynamic re-masking batched
over the micro-batch and bit-identical to the corpus stage's own `mask_tokens` per sample, padding to
the batch's longest). Peer, measured in the same run on
the same shards: the Hugging Face path of `run_mlm.py`, i.e. rows read from Arrow as Python lists
and `transformers.DataCollatorForLanguageModeling` (pads and masks in torch).

  python bench/loader_throughput.py [--corpus DIR] [--seq-len 128] [--batch 256] [--seconds 10]

Without --corpus it builds one from the bundled data with `bertpipe corpus` (seq 128). The goal from
the issue: one core feeds more than 8 GPUs' worth, 15k samples/s at seq 128.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def build_corpus(out: Path, seq_len: int) -> Path:
    from launch import cli

    argv = ["corpus", "--input", str(REPO / "data" / "books"), str(REPO / "data" / "wiki"),
            "--vocab", str(REPO / "data" / "vocab" / "bert-base-uncased-vocab.txt"), "--out", str(out),
            "--seq-len", str(seq_len), "--dupe-factor", "1", "--seed", "7", "--num-shards", "2"]
    if cli.main(argv) != 0:
        raise SystemExit("building the benchmark corpus failed")
    return out


def timed(fn, seconds: float) -> tuple[float, int]:
    fn(0)  # warm-up (page cache, lazy imports)
    start, n, i = time.perf_counter(), 0, 1
    while time.perf_counter() - start < seconds:
        n += fn(i)
        i += 1
    return n / (time.perf_counter() - start), i - 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=None, help="corpus directory (default: build one)")
    parser.add_argument("--seq-len", type=int, default=128, help="sequence length of a built corpus")
    parser.add_argument("--batch", type=int, default=256, help="samples per batch")
    parser.add_argument("--seconds", type=float, default=10.0, help="time per measurement")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    from pipeline.loader import PretrainLoader, ShardedSplit

    with tempfile.TemporaryDirectory() as tmp:
        corpus = args.corpus or build_corpus(Path(tmp) / "corpus", args.seq_len)
        split = ShardedSplit(corpus, "train")
        n = len(split)
        batch = min(args.batch, n)

        def ours(dynamic: bool):
            loader = PretrainLoader(split, seed=1, micro_batch_size=batch, global_batch_size=batch,
                                    dynamic_masking=dynamic, prefetch=0)
            return lambda i: len(loader.batch_at((i * batch) % loader.epoch_size)["input_ids"])

        # Peer: rows as Python lists from Arrow (what `datasets` hands a collator) + HF's MLM collator.
        import pyarrow as pa
        from transformers import BertTokenizerFast, DataCollatorForLanguageModeling

        tables = [pa.ipc.open_file(pa.memory_map(str(corpus / s["path"]))).read_all()
                  for s in split.manifest["shards"] if s["split"] == "train"]
        table = pa.concat_tables(tables).select(["input_ids", "token_type_ids", "next_sentence_label"])
        tokenizer = BertTokenizerFast(vocab_file=str(corpus / "vocab.txt"))
        collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, return_tensors="pt")
        order = np.random.default_rng(1).permutation(n)

        def peer(i: int) -> int:
            idx = order[(i * batch) % (n - batch + 1):][:batch]
            rows = table.take(pa.array(idx)).to_pylist()
            for r in rows:
                r["next_sentence_label"] = int(r["next_sentence_label"])
            return len(collator(rows)["input_ids"])

        results = {}
        for name, fn in (("ours: read + dynamic mask + collate", ours(True)),
                         ("ours: read + collate (static masks)", ours(False)),
                         ("peer: Arrow to_pylist + HF DataCollatorForLanguageModeling", peer)):
            rate, iters = timed(fn, args.seconds)
            results[name] = rate
            print(f"{name:<62} {rate:>10,.0f} samples/s  ({iters} batches of {batch})")
        seq = int(split.manifest["seq_len"])
        ours_dyn = results["ours: read + dynamic mask + collate"]
        peer_rate = results["peer: Arrow to_pylist + HF DataCollatorForLanguageModeling"]
        print(f"\ncorpus: {n} train samples at seq {seq}; one core, torch threads 1")
        print(f"ratio ours (dynamic masking) / peer: {ours_dyn / peer_rate:.2f}x")
        print(f"goal 15,000 samples/s per core at seq 128: {'met' if ours_dyn >= 15000 else 'NOT met'} "
              f"({ours_dyn / 15000:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
