"""Fine-tune a checkpoint on one task and report its dev metrics.

Tasks: GLUE (mnli qqp qnli sst2 cola stsb mrpc rte wnli), squad (v1.1), conll2003 (NER), swag, and
your own data: classify (single text or pair, any number of classes), regress, tag (token labels)
from train/dev[/test] .csv, .tsv or .jsonl files.

Writes OUT/metrics.json, OUT/predictions/, OUT/submission/<Task>.tsv (GLUE test files present),
OUT/confusion_matrix.{txt,png} (classification), OUT/model/ (Hugging Face format), OUT/config.yaml,
OUT/log_history.json and OUT/learning_curve.png (per-epoch evaluation), OUT/tensorboard/.

examples:
  bertpipe finetune --task sst2 --data-dir data/glue --checkpoint runs/base --out out/sst2
  bertpipe finetune --task classify --data-dir mydata --text-column review --label-column stars \\
      --checkpoint hf_model_dir --out out/reviews
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from launch.errors import CliError
from launch.config_flags import add_config_flags, config_from_args as config_from_args_of, warn_deprecated
from launch.finetune.finetune_config import FEATURE_HEAD_SETTINGS, FinetuneConfig

USAGE = "bertpipe finetune --task TASK --data-dir DIR --checkpoint CKPT --out OUT [--config FILE.yaml] [--KEY VALUE ...]"


def add_finetune_arguments(parser: argparse.ArgumentParser, *, skip: tuple[str, ...] = (),
                           help_texts: dict[str, str] | None = None) -> None:
    """The flags shared by `finetune` and `sweep` (a sweep applies them to every trial)."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help=argparse.SUPPRESS)  # deprecated form of --KEY VALUE
    add_config_flags(parser, FinetuneConfig, skip=skip, required=("task", "data_dir", "checkpoint", "out"),
                     help_texts=help_texts)


ON_INTERRUPT = "OUT has no metrics.json; run the same command again to start over"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_finetune_arguments(parser)


def config_from_args(args: argparse.Namespace, command: str = "finetune", **fixed: Any) -> FinetuneConfig:
    """Defaults <- --config YAML <- deprecated --set overrides <- flags, strictly typed and validated."""
    warn_deprecated(command, args.overrides, FinetuneConfig)
    cfg = config_from_args_of(args, FinetuneConfig, legacy=args.overrides, fixed=fixed)
    try:
        cfg.validate()
    except ValueError as err:
        raise CliError(str(err)) from None
    return cfg


# The typed defaults of FinetuneConfig: a --config key set to one of them sets nothing (finetune, sweep).
FIELD_DEFAULTS = {f.name: f.default for f in dataclasses.fields(FinetuneConfig) if f.default is not dataclasses.MISSING}
# Flags only some setups read, and which: given to another one, they did nothing, without a word. Checked for
# one run only: a sweep applies its flags to every trial (Table 7's fine-tuning row, a task of several).
_READ_BY = {
    "text_column": ("classify, regress and tag", lambda c, t: t in ("classify", "regress", "tag")),
    "label_column": ("classify, regress and tag", lambda c, t: t in ("classify", "regress", "tag")),
    "text_pair_column": ("classify and regress", lambda c, t: t in ("classify", "regress")),
    **{k: ("squad", lambda c, t: t == "squad") for k in ("doc_stride", "max_query_length", "n_best", "max_answer_length")},
    **{k: ("--feature-based", lambda c, t: c.feature_based) for k in (*FEATURE_HEAD_SETTINGS, "feature_cache", "layers")},
}


def refuse_unread_flags(cfg: FinetuneConfig, given: list[str], in_config: list[str] = (), config: str = "") -> None:
    """Refuse a setting given by flag (or `--set`) that this run does not read; warn of one in the --config
    file, which runs of several tasks may share."""
    from launch.config_flags import flag_of
    from launch.finetune.finetune_config import canonical_task

    task = canonical_task(cfg.task)
    run = f"this run ({cfg.task}{', fine-tuning' if not cfg.feature_based else ''}) does not read"
    for key in given:
        if key in _READ_BY and not _READ_BY[key][1](cfg, task):
            raise CliError(f"{flag_of(key)} applies to {_READ_BY[key][0]} only; {run} it: drop it")
    for key in in_config:
        if key in _READ_BY and not _READ_BY[key][1](cfg, task):
            logging.getLogger(__name__).warning("--config %s: %s applies to %s only; %s it", config, key,
                                                _READ_BY[key][0], run)


def run(args: argparse.Namespace) -> int:
    from launch.config_flags import given_flags
    from launch.log import setup_logging

    setup_logging()
    cfg = config_from_args(args)
    from launch.config import load_yaml

    # `--set key=value` is a flag by another name: refused alike (it got past this check, and did nothing).
    given = list(given_flags(args)) + [form.partition("=")[0].strip() for form in args.overrides]
    # A key of the --config file counts where it sets something: a run's own saved config.yaml holds every key.
    in_file = load_yaml(args.config) if args.config else {}
    set_there = [k for k, v in in_file.items() if v is not None and v != FIELD_DEFAULTS.get(k)]
    refuse_unread_flags(cfg, given, set_there, args.config)
    from launch.finetune.runner import finetune

    from pipeline.output_lock import OutputLock

    try:
        with OutputLock(cfg.out, "finetune"):
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
