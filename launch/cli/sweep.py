"""Run a Ray Tune sweep of fine-tuning jobs: every (task, grid point, seed) is one trial.

Keeps the best config per task on dev and writes OUT/results.json, OUT/results.md (laid out like the
BERT paper's GLUE table: tasks as columns, an average) and OUT/sweep.png. Any `bertpipe finetune`
flag applies to every trial, except the settings the grid varies (e.g. --lr, --batch-size, --epochs)
and --seed, which each trial takes from its grid point and seed index, and --task, --save-model and
--progress (trials keep their models only with --save-models, and show no progress bar). Crashed trials are retried (--max-failures); an interrupted sweep
continues with --resume (finished trials are kept).

Grids: paper (batch 16/32 x lr 5e-5/3e-5/2e-5 x epochs 2/3/4), quick (batch 32 x lr 5e-5/3e-5 x 1
epoch), table7 (with --tasks conll2003: the six feature-based rows of the paper's Table 7 and the
fine-tuning row, results next to the paper's column), or a YAML file mapping fine-tuning settings to lists (`lr: [5e-5, 1e-4]`).
A grid may not vary what its trials do not use: --feature-based trials learn at --feature-lr, not
--lr (sweep feature_lr in a YAML grid), and feature_lr / feature_head / lstm_hidden need --feature-based.

examples:
  bertpipe sweep --tasks sst2,mrpc,rte --checkpoint runs/base --data-dir data/glue --out out/sweep
  ray job submit --working-dir . -- bertpipe sweep --tasks sst2 --checkpoint ... --address auto ...
  ray submit deploy/ray-cluster.yaml launch/cli/__main__.py sweep --tasks sst2 ... --address auto   (see docs/finetune.md)

Test hook: env BERTPIPE_SWEEP_CRASH_FIRST_ATTEMPT=i crashes trial i on its first attempt only.
"""

from __future__ import annotations

import argparse
import os

from launch.errors import CliError
from launch.cli.finetune import add_finetune_arguments, config_from_args
from launch.config import to_dict
from launch.config_flags import config_from_args as config_from_args_of, given_flags
from launch.finetune.finetune_config import FinetuneConfig, canonical_task


ON_INTERRUPT = "finished trials are kept; continue with the same command plus --resume"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tasks", required=True, help="comma-separated task names, e.g. sst2,mrpc,rte")
    parser.add_argument("--grid", default="paper",
                        help="paper | quick | table7 (conll2003: the paper's Table 7 feature-based rows plus fine-tuning) "
                        "| FILE.yaml (default: paper)")
    parser.add_argument("--seeds", type=int, default=1, help="random restarts per grid point (seeds 1..N; default 1)")
    parser.add_argument("--address", default=None,
                        help="Ray cluster to use: auto | ray://HOST:10001 (default: a local Ray, or RAY_ADDRESS under `ray job submit`)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the sweep already in --out: finished trials are kept, only the others run")
    parser.add_argument("--cpus-per-trial", type=float, default=1, help="CPUs reserved by each trial (default 1)")
    parser.add_argument("--gpus-per-trial", type=float, default=None, help="GPUs per trial (default: 1 if the cluster has GPUs)")
    parser.add_argument("--max-failures", type=int, default=1, help="retries of a crashed trial (default 1)")
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray (default: all)")
    parser.add_argument("--ray-temp-dir", default=None,
                        help="temp dir of the local Ray (default: a fresh private one); deleted at the end if bertpipe created it")
    parser.add_argument("--save-models", action="store_true", help="keep every trial's fine-tuned model")
    parser.add_argument("--name", default=None,
                        help="the checkpoint's name in results.md and sweep.png (default: its folder's name)")
    # each trial keeps its model only with --save-models, and runs without a progress bar (Ray collects the logs)
    add_finetune_arguments(parser, skip=("task", "save_model", "progress"), help_texts={
        "out": "sweep directory: results.md, results.json, sweep.png, sweep_config.json, tune/ (Ray Tune's state) "
               "and trials/<trial>/ (each a fine-tuning run's output)"})


def _sets_max_seq_len(args: argparse.Namespace, cfg: FinetuneConfig) -> bool:
    """Whether the flags or --config set max_seq_len: an unset one resolves per task (384 for SQuAD, 128
    else), so it comes out the same for another task only when it was set."""
    other = "sst2" if canonical_task(cfg.task) == "squad" else "squad"
    return config_from_args_of(args, FinetuneConfig, legacy=args.overrides, fixed={"task": other}).max_seq_len == cfg.max_seq_len


def trial_overrides(args: argparse.Namespace, tasks: list[str]) -> tuple[FinetuneConfig, dict]:
    """The sweep's config (for its paths) and the settings every trial takes from the command line."""
    cfg = config_from_args(args, "sweep", task=tasks[0])
    overrides = {k: v for k, v in to_dict(cfg).items() if k not in ("task", "data_dir", "checkpoint", "out")}
    if not _sets_max_seq_len(args, cfg):  # resolved for the first task; each trial resolves its own task's
        del overrides["max_seq_len"]
    overrides["save_model"] = args.save_models
    overrides["progress"] = False
    return cfg, overrides


def run(args: argparse.Namespace) -> int:
    from launch.log import setup_logging

    setup_logging()
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise CliError("--tasks is empty; name at least one task, e.g. --tasks sst2")
    # 0 CPUs a trial started every trial at once; -1 failures is Ray's "retry forever"; a Ray of 0 CPUs ran none.
    if args.cpus_per_trial <= 0:
        raise CliError(f"--cpus-per-trial must be more than 0, got {args.cpus_per_trial:g}")
    for flag, value, least in (("--gpus-per-trial", args.gpus_per_trial, 0), ("--max-failures", args.max_failures, 0),
                               ("--num-cpus", args.num_cpus, 1)):
        if value is not None and value < least:
            raise CliError(f"{flag} must be {least} or more, got {value:g}")
    if args.ray_temp_dir:  # before anything is written
        from launch.finetune.local_ray import check_temp_dir

        try:
            check_temp_dir(args.ray_temp_dir)
        except ValueError as err:
            raise CliError(str(err)) from None
    given = set(given_flags(args))
    if "seed" in given:  # each trial takes its seed from 1..--seeds: --seed was ignored without a word
        raise CliError("--seed is not a sweep setting: trials run seeds 1..N; set N with --seeds")
    cfg, overrides = trial_overrides(args, tasks)
    crash = os.environ.get("BERTPIPE_SWEEP_CRASH_FIRST_ATTEMPT")
    from launch.finetune.tune_sweep import run_sweep, trial_name

    from pipeline.output_lock import OutputLock

    try:
        with OutputLock(cfg.out, "sweep"):
            result = run_sweep(
                tasks, cfg.checkpoint, cfg.data_dir, cfg.out, grid=args.grid, seeds=args.seeds, overrides=overrides,
                address=args.address, resume=args.resume, cpus_per_trial=args.cpus_per_trial,
                gpus_per_trial=args.gpus_per_trial, max_failures=args.max_failures, num_cpus=args.num_cpus,
                temp_dir=args.ray_temp_dir, crash_first_attempt=int(crash) if crash else None, given=given, name=args.name,
            )
    except ValueError as err:
        raise CliError(str(err)) from None
    print(result.table)  # intentional CLI output: the results table
    print(f"wrote {result.out}/results.json, results.md, sweep.png")
    if result.failed:
        for t in result.trials:
            if t.get("error"):
                print(f"{trial_name(t['point'])}: {t['error']}")
        print(f"{result.failed} trial(s) failed (crashes after retries; refused input is not retried); "
              "fix the cause and re-run with --resume")
        return 1
    return 0
