"""Write a run's checkpoint as a Hugging Face model directory.

  bertpipe export RUN --out HF_DIR [--tag global_step1000] [--overwrite]

Consolidates the ZeRO-partitioned fp32 weights (any stage, any world size) and writes config.json,
model.safetensors, vocab.txt, tokenizer.json, tokenizer_config.json and a model card README.md
(corpus, steps, final metrics), loadable by `transformers.BertForPreTraining.from_pretrained(HF_DIR)`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from launch.errors import CliError
from launch.log import setup_logging


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", type=Path, help="run directory written by `bertpipe pretrain --out`")
    parser.add_argument("--out", type=Path, required=True,
                        help="HF model directory to write: new, empty, or an earlier export of this run")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into a non-empty --out that is not an earlier export of this run (files named "
                             "like the export's are replaced, and listed; nothing else there is deleted)")
    parser.add_argument("--tag", default=None, help="checkpoint tag, e.g. global_step1000 (default: the newest verified one)")


def run(args: argparse.Namespace) -> int:
    setup_logging()
    from launch.export_dirs import export_lock_file, export_run
    from pipeline.output_lock import LockUnwritable, OutputLock

    # One writer per --out: the lock sits beside it, as the export is renamed into place whole; beside the
    # folder --out leads to, so a link to it (or --out spelt another way) takes the same lock.
    try:
        with OutputLock(args.out, "export", lock_file=export_lock_file(args.out)):
            out = export_run(args.run, args.out, tag=args.tag, overwrite=args.overwrite)
    except (ValueError, LockUnwritable) as err:
        raise CliError(str(err)) from None
    print(f"exported {args.run} to {out}")
    return 0
