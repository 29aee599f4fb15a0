"""Pre-train BERT with DeepSpeed ZeRO over a corpus built by `bertpipe corpus`.

  bertpipe pretrain --config tiny --data CORPUS --out RUN [--section.key VALUE ...] [--nproc N]
  bertpipe pretrain --data CORPUS --out RUN --resume          # continue from the newest verified checkpoint

--config is a preset (tiny, demo, demo-seq64, bert-base, bert-large-phase1, bert-large-phase2) or a YAML file; a flag
overrides any field of it (`--zero.stage 2 --optim.lr 1e-3`; `--max-steps N` is
`--schedule.total-steps N`). The old `zero.stage=2` form still works, with a warning. The defaults
below are the config tree's own: a preset replaces most of them (launch/configs/PRESET.yaml), and the
values a run used are in RUN/config.yaml. Locally, --nproc N starts N processes (gloo on CPU, NCCL
on GPUs). On a cluster run the same trainer under a launcher instead:

  deepspeed --hostfile HOSTS --module launch.pretrain --config bert-large-phase1 --data CORPUS --out RUN
  torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-id RUN --rdzv-endpoint HOST:29500 \\
      -m launch.pretrain --config ... ...

The run directory gets config.yaml (resolved), ds_config.json (generated), vocab.txt,
metrics.jsonl, tensorboard/ and checkpoints/ (atomic; `latest` moves last). SIGTERM (preemption)
saves a checkpoint at the next step and exits 143 (128 + the signal; 130 for Ctrl-C, 138 for SIGUSR1,
which mpirun passes on to the ranks): the run is not
finished, and a scheduler that restarts failed jobs continues it with --resume.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback
from pathlib import Path

from launch.errors import CliError, how_stopped
from launch.log import launcher_world_size, setup_logging
from launch.pretrain.worker import (add_arguments as add_worker_arguments, exit_if_in_group, in_group_with_peers,
                                    load_run_config, report_fault, run_dir_lock, train_and_report)
from pipeline.output_lock import OutputLocked

USAGE = "bertpipe pretrain --data CORPUS --out RUN [--config PRESET|FILE.yaml] [--nproc N] [--resume] [--KEY VALUE ...]"


ON_INTERRUPT = "continue from the last checkpoint with the same command plus --resume"
ON_DISK_FULL = " (add --resume: the last complete checkpoint is kept)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_worker_arguments(parser)


def _worker_argv(args: argparse.Namespace, resolved_config: Path) -> list[str]:
    """Each worker's command line: the config resolved here (so every rank builds the same one), no --nproc."""
    argv = ["--config", str(resolved_config), "--data", str(args.data), "--out", str(args.out)]
    return argv + (["--resume"] if args.resume else [])


def run(args: argparse.Namespace) -> int:
    setup_logging()
    import torch

    from launch.pretrain.preflight import SHARDS_VERIFIED_ENV, in_this_process, preflight

    world = launcher_world_size()  # under mpirun too: each rank starting --nproc more would be wrong
    under_launcher = world is not None
    if world is not None:
        nproc = world
    else:  # 0 is a mistake, not "auto": only an absent --nproc picks the default
        nproc = max(1, torch.cuda.device_count()) if args.nproc is None else args.nproc
    if nproc < 1:
        raise CliError("--nproc must be at least 1")
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        cfg = load_run_config(args)
        # Under a launcher every rank runs this: the trainer's rank 0 hashes the shards, once for all.
        preflight(cfg, args.data, world_size=nproc, device_type=device_type,
                  run_check=None if under_launcher else in_this_process)
    except ValueError as err:
        raise CliError(str(err)) from None
    try:
        # One writer per run dir: this process (or rank 0 under a launcher) holds RUN/.bertpipe.lock;
        # the workers it starts inherit it.
        with run_dir_lock(args.out):
            if not (nproc == 1 or under_launcher):
                return _launch_workers(cfg, args, nproc)
            code = _train_here(cfg, args)
    except OutputLocked as err:
        raise CliError(str(err)) from None
    except CliError as err:  # this rank's own, its peers still in the group: see exit_if_in_group
        exit_if_in_group(2, f"bertpipe pretrain: error: {err}")
        raise
    except KeyboardInterrupt as err:  # before the trainer set its own handler; under a launcher, end as a worker does
        code, how = how_stopped(err)
        exit_if_in_group(code, f"bertpipe pretrain: {how}; {ON_INTERRUPT}")
        raise
    except Exception as err:  # noqa: BLE001 - under a launcher, as a `launch.pretrain` worker ends; alone, cli.main
        if in_group_with_peers():
            code = report_fault(err, args.out)  # a lost peer or a full disk in one line
            if code is None:
                traceback.print_exc()
                code = 1
            exit_if_in_group(code)
        raise
    finally:
        # Preflight verified the shards for this launch only; a later command in this process re-checks.
        os.environ.pop(SHARDS_VERIFIED_ENV, None)
    exit_if_in_group(code)  # diverged, under a launcher
    return code


def _train_here(cfg, args: argparse.Namespace) -> int:
    from launch.pretrain.trainer import Trainer

    return train_and_report(lambda: Trainer(cfg, data_dir=args.data, run_dir=args.out, resume=args.resume),
                            lambda message: print(f"bertpipe pretrain: error: {message}", file=sys.stderr))


def _launch_workers(cfg, args: argparse.Namespace, nproc: int) -> int:
    from launch.config import save_config
    from launch.pretrain.launcher import launch_local

    with tempfile.TemporaryDirectory(prefix="bertpipe-pretrain-") as tmp:
        resolved = Path(tmp) / "config.yaml"
        save_config(cfg, resolved)
        return launch_local(nproc, _worker_argv(args, resolved))
