"""Pre-training step throughput: bertpipe's BertForPreTraining vs transformers.BertForPreTraining (sdpa).

Same config, same weights (ours exported, transformers loads the export), same batches built from
real sentences of the bundled books (WordPiece with the bundled bert-base-uncased vocab), sentence
pairs of varied length padded to the longest in the batch, 15% of real tokens masked (at most 20).
Each timed step is forward + loss + backward; the two models alternate step by step so that load
from other processes on the machine hits both alike, and which of them steps a batch first alternates too. Before timing, both models' eval-mode loss on the
first batch must agree within 1e-4 relative (else the script stops). Prints tokens/s (real tokens,
totals) and the ratio of median step times (transformers' / ours).

  OMP_NUM_THREADS=1 .venv/bin/python bench/model_step.py                 # tiny and base, seq 128
  .venv/bin/python bench/model_step.py --configs base --batch-size 8 --steps 5
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from model import BertConfig, BertForPreTraining, save_pretrained

REPO = Path(__file__).resolve().parents[1]

VOCAB = REPO / "data" / "vocab" / "bert-base-uncased-vocab.txt"
BOOKS = sorted((REPO / "data" / "books").glob("*.txt"))


def real_sentence_pairs(seq_len: int, count: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(token ids, segment ids) of [CLS] A [SEP] B [SEP], A and B each 1-4 consecutive real sentences."""
    import blingfire
    from tokenizers import BertWordPieceTokenizer

    tok = BertWordPieceTokenizer(str(VOCAB), lowercase=True)
    text = " ".join(p.read_text(encoding="utf-8") for p in BOOKS)
    sentences = [s for s in blingfire.text_to_sentences(" ".join(text.split())).split("\n") if len(s) > 1]
    # Enough sentences for varied draws, without tokenizing both books for a short run.
    ids = [e.ids[1:-1] for e in tok.encode_batch(sentences[: max(3000, 20 * count)])]
    rng = np.random.default_rng(seed)
    pairs = []
    budget = seq_len - 3
    while len(pairs) < count:
        start = int(rng.integers(0, len(ids) - 8))
        na, nb = int(rng.integers(1, 5)), int(rng.integers(1, 5))
        a = [t for s in ids[start:start + na] for t in s]
        b = [t for s in ids[start + na:start + na + nb] for t in s]
        while len(a) + len(b) > budget:  # truncate the longer side, as create_pretraining_data does
            (a if len(a) > len(b) else b).pop()
        if not a or not b:
            continue
        cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        pairs.append(([cls_id, *a, sep_id, *b, sep_id], [0] * (len(a) + 2) + [1] * (len(b) + 1)))
    return pairs


def make_batches(pairs, batch_size: int, seed: int, vocab_size: int, max_predictions: int = 20):
    rng = np.random.default_rng(seed)
    mask_id = 103
    batches = []
    for i in range(0, len(pairs) - batch_size + 1, batch_size):
        chunk = pairs[i:i + batch_size]
        length = max(len(t) for t, _ in chunk)
        b = len(chunk)
        ids = torch.zeros(b, length, dtype=torch.long)
        types = torch.zeros_like(ids)
        mask = torch.zeros_like(ids)
        pos = torch.zeros(b, max_predictions, dtype=torch.long)
        lab = torch.full((b, max_predictions), -100, dtype=torch.long)
        full_lab = torch.full((b, length), -100, dtype=torch.long)  # transformers' label layout
        for r, (t, s) in enumerate(chunk):
            n = len(t)
            ids[r, :n], types[r, :n], mask[r, :n] = torch.tensor(t), torch.tensor(s), 1
            candidates = [j for j in range(1, n) if t[j] not in (101, 102)]
            k = min(max_predictions, max(1, round(0.15 * n)))
            chosen = np.sort(rng.choice(candidates, size=k, replace=False))
            pos[r, :k] = torch.from_numpy(chosen)
            lab[r, :k] = ids[r, chosen]
            full_lab[r, chosen] = ids[r, chosen]
            ids[r, chosen] = mask_id
        nsp = torch.from_numpy(rng.integers(0, 2, size=b))
        batches.append(dict(input_ids=ids, token_type_ids=types, attention_mask=mask, masked_lm_positions=pos,
                            masked_lm_ids=lab, full_labels=full_lab, next_sentence_label=nsp))
    return batches


def ours_step(model, batch) -> float:
    out = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], batch["masked_lm_positions"])
    loss = F.cross_entropy(out.mlm_logits.flatten(0, 1), batch["masked_lm_ids"].flatten(), ignore_index=-100) \
        + F.cross_entropy(out.nsp_logits, batch["next_sentence_label"])
    loss.backward()
    return loss.item()


def hf_step(model, batch) -> float:
    out = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                attention_mask=batch["attention_mask"], labels=batch["full_labels"],
                next_sentence_label=batch["next_sentence_label"])
    out.loss.backward()
    return out.loss.item()


def eval_losses(ours, hf, batch) -> tuple[float, float, float]:
    """Both models' loss on one batch in eval mode (no dropout), no gradients: the same weights must give
    the same loss before their step times mean anything. Also the largest difference of the MLM logits
    at the masked positions relative to their largest magnitude: at random init the loss sits near
    ln(vocab) + ln 2 whatever the weights, so the loss alone would miss a mismatch."""
    ours.eval(), hf.eval()
    with torch.no_grad():
        out = ours(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], batch["masked_lm_positions"])
        a = F.cross_entropy(out.mlm_logits.flatten(0, 1), batch["masked_lm_ids"].flatten(), ignore_index=-100) \
            + F.cross_entropy(out.nsp_logits, batch["next_sentence_label"])
        b = hf(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
               attention_mask=batch["attention_mask"], labels=batch["full_labels"],
               next_sentence_label=batch["next_sentence_label"])
        pos = batch["masked_lm_positions"]
        theirs = b.prediction_logits.gather(1, pos[..., None].expand(-1, -1, b.prediction_logits.shape[-1]))
        mine = out.mlm_logits[..., : theirs.shape[-1]]
        keep = batch["masked_lm_ids"] != -100
        logit_rel = float((mine - theirs)[keep].abs().max() / theirs[keep].abs().max().clamp_min(1e-12))
    ours.train(), hf.train()
    return float(a), float(b.loss), logit_rel


def bench_config(name: str, args) -> dict:
    import transformers

    torch.manual_seed(0)
    arch = BertConfig.preset(name)
    ours = BertForPreTraining(arch.replace(unpad=True, attention_impl="sdpa", pad_vocab_multiple=64)).train()
    with tempfile.TemporaryDirectory() as tmp:
        save_pretrained(ours, tmp)
        hf = transformers.BertForPreTraining.from_pretrained(tmp, attn_implementation="sdpa").train()
    pairs = real_sentence_pairs(args.seq_len, args.batch_size * (args.steps + args.warmup), args.seed)
    batches = make_batches(pairs, args.batch_size, args.seed, arch.vocab_size)
    real = [int(b["attention_mask"].sum()) for b in batches]
    padded = [b["attention_mask"].numel() for b in batches]
    loss_ours, loss_hf, logit_rel = eval_losses(ours, hf, batches[0])
    rel = abs(loss_ours - loss_hf) / max(abs(loss_hf), 1e-12)
    print(f"  eval-mode loss of {name} on the first batch (no dropout): ours {loss_ours:.6f}, transformers {loss_hf:.6f}, "
          f"relative difference {rel:.2e}; MLM logits at [MASK] differ by {logit_rel:.2e} of their largest", flush=True)
    if rel > 1e-4 or logit_rel > 1e-4:
        sys.exit(f"{name}: the two models differ in eval mode (loss {rel:.2e} relative, MLM logits {logit_rel:.2e}; "
                 "limit 1e-4): they do not compute the same function, so their step times are not comparable; not timing")
    times = {"ours": [], "transformers": []}
    losses = {"ours": [], "transformers": []}
    sides = (("ours", ours, ours_step), ("transformers", hf, hf_step))
    for i, batch in enumerate(batches):
        # Alternate who goes first: the second step on a batch finds it (and the allocator) warm.
        for label, model, step in (sides if i % 2 == 0 else sides[::-1]):
            model.zero_grad(set_to_none=True)
            torch.manual_seed(i)
            t0 = time.perf_counter()
            loss = step(model, batch)
            dt = time.perf_counter() - t0
            if i >= args.warmup:
                times[label].append(dt)
                losses[label].append(loss)
    timed_tokens = sum(real[args.warmup:])
    res = {"config": name, "params_M": sum(p.numel() for p in hf.parameters()) / 1e6,
           "padding": 1 - sum(real) / sum(padded)}
    for label in times:
        res[f"{label}_tok_s"] = timed_tokens / sum(times[label])
        res[f"{label}_seq_s"] = args.batch_size * len(times[label]) / sum(times[label])
        res[f"{label}_median_step_s"] = statistics.median(times[label])
    # The ratio of median step times (both sides step the very same batches, so the medians compare
    # like with like and one step slowed by another process does not move it); tok/s are totals.
    res["ratio"] = res["transformers_median_step_s"] / res["ours_median_step_s"]
    res["loss_ours"], res["loss_hf"], res["loss_rel"] = loss_ours, loss_hf, rel
    return res


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=["tiny", "base"], choices=["tiny", "mini", "base", "large"])
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per model")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, seq {args.seq_len}, batch {args.batch_size}, "
          f"{args.steps} timed steps (+{args.warmup} warm-up), forward+backward, CPU")
    print("ratio = transformers' median step time / ours (same batches, alternated); tok/s and seq/s are totals "
          "over the timed steps")
    print(f"{'config':<6} {'params':>8} {'padding':>8} {'ours tok/s':>11} {'HF tok/s':>10} {'ours seq/s':>11} "
          f"{'HF seq/s':>9} {'ratio':>6}")
    for name in args.configs:
        r = bench_config(name, args)
        print(f"{r['config']:<6} {r['params_M']:>7.1f}M {r['padding']:>8.1%} {r['ours_tok_s']:>11.0f} "
              f"{r['transformers_tok_s']:>10.0f} {r['ours_seq_s']:>11.2f} {r['transformers_seq_s']:>9.2f} "
              f"{r['ratio']:>5.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
