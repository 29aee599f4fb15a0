"""Fine-tune a checkpoint on one task and report its dev metrics.

Tasks: GLUE (mnli qqp qnli sst2 cola stsb mrpc rte wnli), squad (v1.1), conll2003 (NER), swag, and
your own data: classify (single text or pair, any number of classes), regress, tag (token labels)
from train/dev[/test] .csv, .tsv or .jsonl files.

Writes OUT/metrics.json, OUT/predictions/, OUT/submission/<Task>.tsv (GLUE test files present),
OUT/confusion_matrix.{txt,png} (classification), OUT/model/ (Hugging Face format), OUT/config.yaml.

examples:
  bertpipe finetune --task sst2 --data-dir data/glue --checkpoint runs/base --out out/sst2
  bertpipe finetune --task classify --data-dir mydata --text-column review --label-column stars \\
      --checkpoint hf_model_dir --out out/reviews
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from launch.errors import CliError
from launch.config import from_dict, load_yaml, merge, parse_overrides, resolve_preset
from launch.finetune.finetune_config import FinetuneConfig

# flag -> (config field, type, help). Defaults come from FinetuneConfig (or the --config file).
_FLAGS: list[tuple[str, str, Any, str]] = [
    ("--lr", "lr", float, "peak learning rate (paper grid: 5e-5, 3e-5, 2e-5; default 2e-5)"),
    ("--batch-size", "batch_size", int, "training batch size (paper grid: 16, 32; default 32)"),
    ("--eval-batch-size", "eval_batch_size", int, "evaluation batch size (default 64)"),
    ("--epochs", "epochs", int, "training epochs (paper grid: 2, 3, 4; default 3)"),
    ("--warmup", "warmup", float, "fraction of steps with linear warm-up (default 0.1)"),
    ("--weight-decay", "weight_decay", float, "AdamW weight decay, not on biases/LayerNorm (default 0.01)"),
    ("--seed", "seed", int, "random seed of head init and data order (default 42)"),
    ("--max-seq-len", "max_seq_len", int, "maximum tokens per input (default 128)"),
    ("--max-train-samples", "max_train_samples", int, "train on a fixed random subset of N examples"),
    ("--max-eval-samples", "max_eval_samples", int, "evaluate on a fixed random subset of N examples"),
    ("--vocab", "vocab", str, "vocabulary you expect the checkpoint to use; refused if it is not the checkpoint's"),
    ("--text-column", "text_column", str, "classify/regress/tag: column with the text (default 'text')"),
    ("--text-pair-column", "text_pair_column", str, "classify/regress: column with the second text of a pair"),
    ("--label-column", "label_column", str, "classify/regress/tag: column with the label (default 'label')"),
    ("--doc-stride", "doc_stride", int, "squad: tokens between the starts of context windows (default 128)"),
    ("--max-query-length", "max_query_length", int, "squad: question tokens kept (default 64)"),
    ("--n-best", "n_best", int, "squad: start/end candidates considered (default 20)"),
    ("--max-answer-length", "max_answer_length", int, "squad: longest answer in tokens (default 30)"),
    ("--device", "device", str, "auto | cpu | cuda (default auto)"),
    ("--precision", "precision", str, "auto (bf16 on CUDA, fp32 on CPU) | fp32 | bf16"),
    ("--threads", "threads", int, "torch CPU threads (default: OMP_NUM_THREADS)"),
]
_SWITCHES: list[tuple[str, str, bool, str]] = [
    ("--doc-context", "doc_context", True, "conll2003/tag: fill windows with the document's neighbouring sentences"),
    ("--freeze", "freeze", True, "train only the head on frozen BERT features (feature-based, fast)"),
    ("--skip-malformed", "skip_malformed", True, "count and skip malformed lines instead of stopping at the first"),
    ("--no-group-by-length", "group_by_length", False, "plain random batches instead of length-grouped ones"),
    ("--no-save-model", "save_model", False, "do not write the fine-tuned model to OUT/model"),
    ("--no-progress", "progress", False, "no progress bar"),
]


def add_finetune_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags shared by `finetune` and `sweep` (a sweep applies them to every trial)."""
    parser.add_argument("--data-dir", required=True, help="GLUE-download-like dir (DIR/SST-2/train.tsv) or the task's own files")
    parser.add_argument("--checkpoint", required=True, help="a bertpipe pre-training RUN dir or a Hugging Face BERT dir")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--config", help="YAML file of FinetuneConfig fields (flags override it)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override any FinetuneConfig field, e.g. --set warmup=0.06 (repeatable)")
    for flag, dest, typ, help_text in _FLAGS:
        parser.add_argument(flag, dest=dest, type=typ, default=None, help=help_text)
    for flag, dest, value, help_text in _SWITCHES:
        parser.add_argument(flag, dest=dest, action="store_const", const=value, default=None, help=help_text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", required=True, help="task name: sst2, mnli, squad, conll2003, swag, classify, regress, tag, ...")
    add_finetune_arguments(parser)


def config_from_args(args: argparse.Namespace, **fixed: Any) -> FinetuneConfig:
    """Defaults <- --config YAML <- flags given <- --set overrides, strictly typed."""
    try:
        data: dict[str, Any] = load_yaml(resolve_preset(args.config)) if args.config else {}
        given = {dest: getattr(args, dest) for _, dest, *_ in _FLAGS + _SWITCHES if getattr(args, dest) is not None}
        given.update(data_dir=str(Path(args.data_dir)), checkpoint=str(Path(args.checkpoint)), out=str(Path(args.out)), **fixed)
        data = merge(merge(data, given), parse_overrides(args.overrides))
        cfg = from_dict(FinetuneConfig, data)
        cfg.validate()
    except ValueError as err:
        raise CliError(str(err)) from None
    return cfg


def run(args: argparse.Namespace) -> int:
    from launch.log import setup_logging

    setup_logging()
    cfg = config_from_args(args, task=args.task)
    from launch.finetune.runner import finetune

    try:
        result = finetune(cfg)
    except ValueError as err:  # DataError and bad settings: what to change, no traceback
        raise CliError(str(err)) from None
    # Intentional CLI output: the dev metrics summary.
    shown = {k: v for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    print(f"{result['task']}: {result['metric']} = {result['score']:.4f}" if result["score"] is not None else result["task"])
    print(json.dumps(shown, indent=2))
    confusion = Path(cfg.out) / "confusion_matrix.txt"
    if confusion.is_file():
        print(confusion.read_text())
    print(f"wrote {cfg.out}/metrics.json")
    return 0
