"""Pre-train BERT with DeepSpeed ZeRO over a corpus built by `bertpipe corpus`.

  bertpipe pretrain --config tiny --data CORPUS --out RUN [key.sub=value ...] [--nproc N]
  bertpipe pretrain --data CORPUS --out RUN --resume          # continue from RUN/checkpoints/latest

--config is a preset (tiny, bert-base, bert-large-phase1, bert-large-phase2) or a YAML file; dotted
overrides go after it (`zero.stage=2 optim.lr=1e-3`). Locally, --nproc N starts N processes
(gloo on CPU, NCCL on GPUs). On a cluster run the same trainer under a launcher instead:

  deepspeed --hostfile HOSTS --module launch.pretrain --config bert-large-phase1 --data CORPUS --out RUN
  torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint HOST:29500 -m launch.pretrain --config ... ...

The run directory gets config.yaml (resolved), ds_config.json (generated), vocab.txt,
metrics.jsonl, tensorboard/ and checkpoints/ (atomic; `latest` moves last). SIGTERM (preemption)
saves a checkpoint at the next step and exits 0.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from launch.errors import CliError
from launch.config import load_config
from launch.log import setup_logging


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="dotted config overrides, e.g. zero.stage=2 optim.lr=1e-3 data.micro_batch_size=16")
    parser.add_argument("--config", default=None,
                        help="preset name or YAML file (default with --resume: RUN/config.yaml)")
    parser.add_argument("--data", type=Path, required=True, help="corpus directory written by `bertpipe corpus`")
    parser.add_argument("--out", type=Path, required=True, help="run directory (checkpoints, metrics, configs)")
    parser.add_argument("--nproc", type=int, default=None,
                        help="local processes to start (default: the number of GPUs, or 1 on CPU); "
                             "ignored under deepspeed/torchrun, which set the world themselves")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the latest checkpoint in --out (a fresh start if there is none)")
    parser.add_argument("--max-steps", type=int, default=None,
                        help="total optimizer steps of the run (sets schedule.total_steps)")
    parser.add_argument("--save-every", type=int, default=None,
                        help="steps between checkpoints (sets checkpoint.save_every)")


def load_run_config(args: argparse.Namespace):
    from launch.pretrain.pretrain_config import PretrainConfig

    config = args.config
    if config is None:
        saved = args.out / "config.yaml"
        if not (args.resume and saved.is_file()):
            raise ValueError("pass --config PRESET_OR_YAML (presets: tiny, bert-base, bert-large-phase1, bert-large-phase2)")
        config = saved
    overrides = list(args.overrides)
    if args.max_steps is not None:
        overrides.append(f"schedule.total_steps={args.max_steps}")
    if args.save_every is not None:
        overrides.append(f"checkpoint.save_every={args.save_every}")
    return load_config(PretrainConfig, config, overrides)


def build_trainer(args: argparse.Namespace):
    from launch.pretrain.trainer import Trainer

    cfg = load_run_config(args)
    return Trainer(cfg, data_dir=args.data, run_dir=args.out, resume=args.resume)


def _worker_argv(args: argparse.Namespace) -> list[str]:
    argv = [*args.overrides, "--data", str(args.data), "--out", str(args.out)]
    if args.config is not None:
        argv += ["--config", str(args.config)]
    if args.resume:
        argv.append("--resume")
    if args.max_steps is not None:
        argv += ["--max-steps", str(args.max_steps)]
    if args.save_every is not None:
        argv += ["--save-every", str(args.save_every)]
    return argv


def run(args: argparse.Namespace) -> int:
    setup_logging()
    import torch

    from launch.pretrain.trainer import NonFiniteLossError, preflight

    under_launcher = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    nproc = int(os.environ["WORLD_SIZE"]) if under_launcher else (args.nproc or max(1, torch.cuda.device_count()))
    if nproc < 1:
        raise CliError("--nproc must be at least 1")
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        cfg = load_run_config(args)
        preflight(cfg, args.data, world_size=nproc, device_type=device_type)
    except ValueError as err:
        raise CliError(str(err)) from None
    if nproc == 1 or under_launcher:
        try:
            trainer = build_trainer(args)
            trainer.setup()
            return trainer.train()
        except (ValueError, NonFiniteLossError) as err:
            raise CliError(str(err)) from None
    from launch.pretrain.launcher import launch_local

    return launch_local(nproc, _worker_argv(args))
