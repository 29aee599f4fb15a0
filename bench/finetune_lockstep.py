"""Our fine-tuning step against transformers', in lockstep: the same batches, the same start.

`finetune_vs_transformers.py` compares the two recipes over seeds, where data order, dropout masks
and head draws differ by design. This bench removes those: one shuffled order of the task's
training batches (transformers' collator) goes through both models; transformers' freshly drawn
classifier is copied into ours; both use AdamW with the same epsilon. What still differs is what
should be compared: our model's forward/backward, our parameter groups, our schedule
(`launch.pretrain.schedule`) and clipping, against `AutoModelFor*`, the no_trainer examples'
parameter groups and `get_linear_schedule_with_warmup`. Prints the two losses every few steps and
the dev score of each model by the same scorer (transformers' side of the other bench).

With --dropout 0 the runs are deterministic and the losses must agree at step 0; with dropout the
masks differ and the final scores should be close, not equal.

    OMP_NUM_THREADS=1 .venv/bin/python bench/finetune_lockstep.py --task conll2003 --dropout 0
    OMP_NUM_THREADS=1 .venv/bin/python bench/finetune_lockstep.py --task conll2003 --dropout 0.1
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import finetune_vs_transformers as peer  # noqa: E402  (the transformers side and the shared data)

from launch.finetune.runner import _model_class, _param_groups, linear_schedule  # noqa: E402
from launch.finetune.tasks import get_task  # noqa: E402
from launch.pretrain.schedule import build_scheduler  # noqa: E402
from model.hf import load_pretrained  # noqa: E402


class _Logits(torch.nn.Module):
    """Our model behind transformers' call convention, for the shared scorer."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, token_type_ids, attention_mask, **_):
        return type("Output", (), {"logits": self.model(input_ids, token_type_ids, attention_mask)})()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    peer.add_recipe_arguments(parser)
    parser.add_argument("--dropout", type=float, default=0.0, help="hidden and attention dropout of both models")
    parser.add_argument("--eps", type=float, default=1e-8, help="AdamW epsilon of both")
    parser.add_argument("--order-seed", type=int, default=1, help="seed of the one batch order and the head draw")
    parser.add_argument("--every", type=int, default=12, help="print the losses every N steps")
    args = parser.parse_args(argv)
    args.threads, args.checkpoint = None, peer.default_checkpoint()
    from transformers import (AutoModelForSequenceClassification, AutoModelForTokenClassification, AutoTokenizer,
                              DataCollatorForTokenClassification, DataCollatorWithPadding,
                              get_linear_schedule_with_warmup)

    train, dev, labels = peer.load_data(args)
    label_ids = {name: i for i, name in enumerate(labels)}
    tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    tagging = args.task == "conll2003"
    build = peer.tag_rows if tagging else peer.text_rows
    collator = (DataCollatorForTokenClassification if tagging else DataCollatorWithPadding)(tokenizer)
    auto = AutoModelForTokenClassification if tagging else AutoModelForSequenceClassification
    train_rows, dev_rows = (build(split, tokenizer, label_ids, args.max_seq_len) for split in (train, dev))

    drop = {"hidden_dropout_prob": args.dropout, "attention_probs_dropout_prob": args.dropout}
    torch.manual_seed(args.order_seed)
    theirs = auto.from_pretrained(args.checkpoint, num_labels=len(labels), **drop)
    task = get_task(args.task)
    ours, _ = load_pretrained(_model_class(task.model_kind), args.checkpoint, config_overrides=drop,
                              num_labels=len(labels))
    with torch.no_grad():  # the same head to start from
        ours.classifier.weight.copy_(theirs.classifier.weight)
        ours.classifier.bias.copy_(theirs.classifier.bias)

    per_epoch = math.ceil(len(train_rows) / args.batch_size)
    steps, warmup = args.epochs * per_epoch, int(0.1 * args.epochs * per_epoch)
    no_decay = ["bias", "LayerNorm.weight"]
    their_opt = torch.optim.AdamW([
        {"params": [p for n, p in theirs.named_parameters() if not any(nd in n for nd in no_decay)], "weight_decay": 0.01},
        {"params": [p for n, p in theirs.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ], lr=args.lr, eps=args.eps)
    their_sched = get_linear_schedule_with_warmup(their_opt, warmup, steps)
    our_opt = torch.optim.AdamW(_param_groups(ours, 0.01), lr=args.lr, eps=args.eps, fused=True)
    our_sched = build_scheduler(our_opt, linear_schedule(warmup, steps))

    print(f"{args.task}: {len(train_rows)} train / {len(dev_rows)} dev, {steps} steps, dropout {args.dropout}, "
          f"eps {args.eps}, one batch order (seed {args.order_seed})", flush=True)
    gen = torch.Generator().manual_seed(args.order_seed)
    ours.train(), theirs.train()
    step = 0
    for _ in range(args.epochs):
        order = torch.randperm(len(train_rows), generator=gen).tolist()
        for start in range(0, len(order), args.batch_size):
            batch = collator([train_rows[i] for i in order[start:start + args.batch_size]])
            our_loss = task.loss(ours(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]), batch)
            their_loss = theirs(**batch).loss
            for loss, model, opt, sched in ((our_loss, ours, our_opt, our_sched),
                                            (their_loss, theirs, their_opt, their_sched)):
                loss.backward()
                if args.max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                opt.step(), sched.step(), opt.zero_grad()
            if step % args.every == 0 or step == steps - 1:
                print(f"step {step:4d}  loss ours {our_loss.item():.4f}  theirs {their_loss.item():.4f}", flush=True)
            step += 1
    ours_score = peer.score_theirs(args, _Logits(ours), dev_rows, collator, labels)
    theirs_score = peer.score_theirs(args, theirs, dev_rows, collator, labels)
    print(f"dev {peer.METRIC[args.task]} (same scorer): ours {ours_score:.2f}  theirs {theirs_score:.2f}")


if __name__ == "__main__":
    main()
