"""Does a pre-training setting learn context? Held-out accuracy at [MASK] against what no context gives.

The held-out MLM accuracy a run logs counts BERT's visible targets (10% kept, 10% random), so a model
that copies what it sees scores ~13% on the demo corpus without using any context
(pipeline/mlm_baseline.py). This bench trains our BertForPreTraining from scratch with a plain PyTorch
loop (one process, no DeepSpeed: settings are cheap to scan) on a corpus's train split and scores only
the held-out targets that show [MASK], against two peers computed in the same run from the same
corpus: the commonest train target (no context) and a count bigram from the previous token (the
simplest use of context). A setting learns context once its accuracy leaves the first and heads for
the second; the ratio printed is ours / bigram.

    OMP_NUM_THREADS=1 .venv/bin/python bench/mlm_context.py --corpus demo_out/corpus --steps 1500 --lr 1e-3
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from launch.finetune.runner import linear_schedule  # noqa: E402
from launch.pretrain.schedule import build_scheduler  # noqa: E402
from model.bert import BertForPreTraining  # noqa: E402
from model.config import BertConfig  # noqa: E402
from model.losses import pretraining_loss, targets_showing_mask  # noqa: E402
from pipeline.corpus_info import open_corpus  # noqa: E402
from pipeline.collate import Collator  # noqa: E402
from pipeline.loader import ShardedSplit  # noqa: E402
from pipeline.masking import MaskingVocab  # noqa: E402


def peer_levels(train: ShardedSplit, held: list[dict], mask_id: int) -> tuple[float, float, float]:
    """(commonest target, count bigram from the previous token) accuracy at held-out [MASK] targets, and
    the cross-entropy there of the train targets' frequencies (add-one): what no context scores in nats."""
    bigram: dict[int, Counter] = defaultdict(Counter)
    for s in train.samples(np.arange(len(train))):
        x = np.array(s["input_ids"])
        x[s["masked_lm_positions"]] = s["masked_lm_ids"]  # the original text
        for a, b in zip(x[:-1].tolist(), x[1:].tolist()):
            bigram[a][b] += 1
    counts = train.masked_token_counts()
    common = int(counts.argmax())
    unigram_nll = -np.log((counts + 1) / (counts + 1).sum())
    nll = 0.0
    best = {a: c.most_common(1)[0][0] for a, c in bigram.items()}
    hits_common = hits_bigram = total = 0
    for s in held:
        x = s["input_ids"]
        for p, y in zip(s["masked_lm_positions"].tolist(), s["masked_lm_ids"].tolist()):
            if x[p] == mask_id:
                total += 1
                hits_common += int(y == common)
                nll += float(unigram_nll[y])
                hits_bigram += int(best.get(int(x[p - 1]), -1) == y)
    return hits_common / total, hits_bigram / total, nll / total


def bias_attention_to_neighbours(slope: float) -> None:
    """Make the padded attention of model.bert add -slope / 2**h * |i - j| to head h's scores (ALiBi, Press
    et al. 2022): not BERT, a diagnostic that hands the model the local attention it otherwise learns."""
    import model.bert as bert

    padded = bert.padded_attention

    def biased(qkv, mask_B11L, num_heads, impl, dropout_p, training):
        pos = torch.arange(qkv.shape[1])
        slopes = slope / 2 ** torch.arange(num_heads, dtype=torch.float32)
        bias_1NLL = -(slopes[:, None, None] * (pos[:, None] - pos[None, :]).abs())[None]
        return padded(qkv, bias_1NLL if mask_B11L is None else mask_B11L + bias_1NLL, num_heads, impl, dropout_p,
                      training)

    bert.padded_attention = biased


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True, help="a `bertpipe corpus` directory with a held-out split")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW peak lr (linear warm-up, linear decay)")
    parser.add_argument("--warmup", type=float, default=0.02, help="fraction of the steps")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--mask-rate", type=float, default=None, help="re-mask each batch at this rate (default: the corpus's static masks)")
    parser.add_argument("--all-mask", action="store_true", help="show [MASK] at every target (no kept or random 10%%)")
    parser.add_argument("--no-nsp", action="store_true", help="train on the MLM loss alone")
    parser.add_argument("--sinusoidal-positions", type=float, default=None, metavar="AMP",
                        help="start the position embeddings as sinusoids of this amplitude")
    parser.add_argument("--init-range", type=float, default=0.02,
                        help="std of the initial weights (BERT's 0.02 suits width 768; fan-in init at width 64 is ~0.125)")
    parser.add_argument("--local-bias", type=float, default=None, metavar="SLOPE",
                        help="diagnostic: add ALiBi's -SLOPE*|i-j| (halved per head) to the attention scores, so "
                             "attention starts local instead of having to learn it from the positions")
    parser.add_argument("--eval-every", type=int, default=None, help="default: steps / 6")
    parser.add_argument("--heldout", type=int, default=512, help="held-out instances scored")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    corpus = open_corpus(args.corpus)
    mask_id = corpus.vocab.tokens.index("[MASK]")
    train, heldout = ShardedSplit(corpus, "train"), ShardedSplit(corpus, "heldout")
    held_ids = np.arange(min(len(heldout), args.heldout))
    if not len(held_ids):
        raise SystemExit(f"{args.corpus} has no held-out split; build it with --heldout-fraction > 0")
    held = heldout.samples(held_ids)
    t0 = time.perf_counter()
    common, bigram, unigram_nll = peer_levels(train, held, mask_id)
    print(f"peers at held-out [MASK] targets ({time.perf_counter() - t0:.1f} s): commonest token {100 * common:.1f}%, "
          f"count bigram from the previous token {100 * bigram:.1f}%; token frequencies alone: loss {unigram_nll:.3f}",
          flush=True)

    cfg = BertConfig(vocab_size=corpus.vocab.size, hidden_size=args.hidden, num_hidden_layers=args.layers,
                     num_attention_heads=args.heads, intermediate_size=4 * args.hidden,
                     max_position_embeddings=max(128, int(corpus.manifest["seq_len"])),
                     hidden_dropout_prob=args.dropout, attention_probs_dropout_prob=args.dropout,
                     initializer_range=args.init_range)
    model = BertForPreTraining(cfg)
    if args.local_bias is not None:
        bias_attention_to_neighbours(args.local_bias)
    if args.sinusoidal_positions is not None:
        weight = model.bert.embeddings.position.weight
        angle = torch.arange(weight.shape[0])[:, None] / 10000 ** (torch.arange(0, weight.shape[1], 2) / weight.shape[1])
        with torch.no_grad():
            weight[:, 0::2] = args.sinusoidal_positions * torch.sin(angle)
            weight[:, 1::2] = args.sinusoidal_positions * torch.cos(angle)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98), eps=1e-6)
    sched = build_scheduler(opt, linear_schedule(max(int(args.warmup * args.steps), 1), args.steps))
    static = Collator(corpus.manifest)
    dynamic = None
    if args.mask_rate is not None:
        dynamic = Collator(corpus.manifest, vocab=MaskingVocab.from_tokens(corpus.vocab.tokens), seed=args.seed)
        dynamic.masked_lm_prob = args.mask_rate
        dynamic.max_predictions = math.ceil(args.mask_rate * int(corpus.manifest["seq_len"]))
    eval_batch = static(held, held_ids)
    at_mask = targets_showing_mask(eval_batch["masked_lm_ids"], eval_batch["input_ids"],
                                   eval_batch["masked_lm_positions"], mask_id)

    def scores_at_mask() -> tuple[float, float]:
        """(accuracy, cross-entropy) at the held-out targets that show [MASK]."""
        model.eval()
        with torch.no_grad():
            out = model(eval_batch["input_ids"], eval_batch["token_type_ids"], eval_batch["attention_mask"],
                        eval_batch["masked_lm_positions"])
        model.train()
        logits, labels = out.mlm_logits[at_mask], eval_batch["masked_lm_ids"][at_mask]
        return float((logits.argmax(-1) == labels).float().mean()), float(F.cross_entropy(logits, labels))

    rng = np.random.default_rng(args.seed)
    every = args.eval_every or max(args.steps // 6, 1)
    t0 = time.perf_counter()
    for step in range(args.steps):
        ids = rng.integers(0, len(train), args.batch_size)
        samples = train.samples(ids)
        b = dynamic.remasked(samples, ids, np.full(len(ids), step)) if dynamic else static(samples, ids)
        if args.all_mask:
            valid = b["masked_lm_ids"] != -100
            rows = torch.arange(len(ids))[:, None].expand_as(valid)
            b["input_ids"][rows[valid], b["masked_lm_positions"][valid]] = mask_id
        out = model(b["input_ids"], b["token_type_ids"], b["attention_mask"], b["masked_lm_positions"])
        if args.no_nsp:
            loss = F.cross_entropy(out.mlm_logits.flatten(0, 1), b["masked_lm_ids"].flatten(), ignore_index=-100)
        else:
            loss, _ = pretraining_loss(out.mlm_logits, out.nsp_logits, b["masked_lm_ids"], b["next_sentence_label"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        if (step + 1) % every == 0 or step + 1 == args.steps:
            acc, nll = scores_at_mask()
            print(f"step {step + 1:6d}  loss {loss.item():.3f}  held-out at [MASK]: accuracy {100 * acc:5.1f}%, "
                  f"loss {nll:.3f}  ours / bigram {acc / bigram:.2f}x  ({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
