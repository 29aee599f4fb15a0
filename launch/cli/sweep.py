"""Run a Ray Tune sweep of fine-tuning jobs: every (task, grid point, seed) is one trial.

Keeps the best config per task on dev and writes OUT/results.json, OUT/results.md (laid out like the
BERT paper's GLUE table: tasks as columns, an average) and OUT/sweep.png. Any `bertpipe finetune`
flag applies to every trial, except the settings the grid varies (e.g. --lr, --batch-size, --epochs)
and --seed, which each trial takes from its grid point and seed index (given as flags, they are refused;
in a --config file, named in a warning), and --task, --save-model and --progress (trials keep
their models only with --save-models, and show no progress bar). Crashed trials are retried (--max-failures); an
interrupted sweep continues with --resume (finished trials are kept).

Grids: paper (batch 16/32 x lr 5e-5/3e-5/2e-5 x epochs 2/3/4), quick (batch 32 x lr 5e-5/3e-5 x 1
epoch), table7 (with --tasks conll2003: the six feature-based rows of the paper's Table 7 and the
fine-tuning row, results next to the paper's column), or a YAML file mapping fine-tuning settings to lists (`lr: [5e-5, 1e-4]`).
A grid may not vary what its trials do not use: --feature-based trials learn at --feature-lr, not
--lr (sweep feature_lr in a YAML grid), and feature_lr / feature_head / lstm_hidden need --feature-based.

examples:
  bertpipe sweep --tasks sst2,mrpc,rte --checkpoint runs/base --data-dir data/glue --out out/sweep
  ray job submit --working-dir . -- bertpipe sweep --tasks sst2 --checkpoint ... --gpus-per-trial 1 ...
  ray submit deploy/ray-cluster.yaml launch/cli/__main__.py sweep --tasks sst2 ... --address auto --gpus-per-trial 1
      (see docs/finetune.md; on a cluster, --gpus-per-trial is required while it has no GPU yet)

Test hook: env BERTPIPE_SWEEP_CRASH_FIRST_ATTEMPT=i crashes trial i on its first attempt only.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
from pathlib import Path

from launch.errors import CliError
from launch.cli.finetune import FIELD_DEFAULTS, add_finetune_arguments, config_from_args
from launch.config import coerce_field, load_yaml, to_dict
from launch.config_flags import config_from_args as config_from_args_of, flag_of, given_flags
from launch.finetune.finetune_config import FinetuneConfig, canonical_task

log = logging.getLogger(__name__)


ON_INTERRUPT = "finished trials are kept; continue with the same command plus --resume"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tasks", required=True, help="comma-separated task names, e.g. sst2,mrpc,rte")
    parser.add_argument("--grid", default="paper",
                        help="paper | quick | table7 (conll2003: the paper's Table 7 feature-based rows plus fine-tuning) "
                        "| FILE.yaml (default: paper)")
    parser.add_argument("--seeds", type=int, default=1, help="random restarts per grid point (seeds 1..N; default 1)")
    parser.add_argument("--address", default=None,
                        help="Ray cluster to use: auto (the one `ray start` recorded on this machine) | HOST:6379 | ray://HOST:10001 "
                             "(default: a local Ray, or RAY_ADDRESS under `ray job submit`)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the sweep already in --out: finished trials are kept, only the others run")
    parser.add_argument("--cpus-per-trial", type=float, default=1, help="CPUs reserved by each trial (default 1)")
    parser.add_argument("--gpus-per-trial", type=float, default=None, help="GPUs per trial (default: 1 if Ray has a GPU now, else 0 on the local Ray; "
                             "on a cluster without a GPU now it must be given)")
    parser.add_argument("--max-failures", type=int, default=1, help="retries of a crashed trial (default 1)")
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray (default: all; refused with --address)")
    parser.add_argument("--ray-temp-dir", default=None,
                        help="temp dir of the local Ray (default: a fresh private one; refused with --address); deleted at "
                             "the end if bertpipe created it")
    parser.add_argument("--save-models", action="store_true", help="keep every trial's fine-tuned model")
    parser.add_argument("--name", default=None,
                        help="the checkpoint's name in results.md and sweep.png (default: its folder's name)")
    # each trial keeps its model only with --save-models, and runs without a progress bar (Ray collects the logs)
    # The defaults of what the paper and quick grids vary hold only where a grid leaves them (table7's fine-tuning
    # row, a YAML grid): `(default: 2e-05)` alone read as every trial's.
    per_grid = "the paper and quick grids set it per trial; this default holds where a grid does not"
    add_finetune_arguments(parser, skip=("task", "save_model", "progress"), help_texts={
        "out": "sweep directory: results.md, results.json, sweep.png, sweep_config.json, tune/ (Ray Tune's state) "
               "and trials/<trial>/ (each a fine-tuning run's output)",
        "lr": f"peak learning rate ({per_grid}: table7's fine-tuning row, a YAML grid)",
        "batch_size": f"training batch size ({per_grid})", "epochs": f"training epochs ({per_grid})"})
    # --seed stays a flag so that giving it is refused in words (see run), but --help must not offer it:
    # it was listed with "(default: 42)" although every trial takes its seed from --seeds.
    for action in parser._actions:
        if "--seed" in action.option_strings:
            action.help = argparse.SUPPRESS


# Settings a sweep gives every trial itself: set by flag, `--set` or --config, they were ignored without a word.
_SWEEP_SETS = {
    "seed": "trials run seeds 1..N; set N with --seeds",
    "task": "name the tasks with --tasks",
    "save_model": "keep every trial's model with --save-models",
    "progress": "trials show no progress bar (Ray collects their logs)",
}


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


def _grid_keys(grid: str, tasks: list[str]) -> set[str]:
    """The settings every trial takes from its grid point (as `run_sweep` expands the grid)."""
    from launch.finetune import table7
    from launch.finetune.tune_sweep import load_grid

    if table7.is_table7(grid):
        return {k for p in table7.points(tasks, [1]) for k in p} - {"index", "task", "seed"}
    return set(load_grid(grid))


def warn_ignored_config_keys(config: str | None, grid: str, tasks: list[str], save_models: bool) -> None:
    """Name, in one warning, the keys of the --config file no trial will read as the file has them: the sweep
    sets them itself (seed, task, ...) or every grid point does, as a flag given on the command line would win
    over the file. Warned, as `finetune` warns of keys its task does not read, not refused: a run's own saved
    config.yaml (its task, lr, seed) is a fair starting point for a sweep. A key counts where the file sets it
    to something else than both the default and what the sweep gives every trial (one of --tasks; no progress
    bar; a model kept as --save-models says)."""
    if not config:
        return
    ours = {"save_model": save_models, "progress": False}
    varied = _grid_keys(grid, tasks)
    ignored = []
    for key, value in load_yaml(config).items():
        typed = coerce_field(FinetuneConfig, key, value, f"--config {config}: {key}")  # `2e-5` is text to YAML
        if typed is None or typed == FIELD_DEFAULTS.get(key) or (key in ours and typed == ours[key]):
            continue
        if key == "task" and canonical_task(typed) in map(canonical_task, tasks):
            continue
        if key in _SWEEP_SETS:
            ignored.append((key, f"{key}: {value} ({_SWEEP_SETS[key]})"))
        elif key in varied:
            ignored.append((key, f"{key}: {value} (each trial takes it from its grid point)"))
    if ignored:
        log.warning("--config %s sets %s, which no trial uses as set there; drop %s from the file to silence this",
                    config, "; ".join(why for _, why in ignored), ", ".join(key for key, _ in ignored))


def check_inputs(cfg: FinetuneConfig) -> None:
    """--data-dir and --checkpoint, before Ray starts: each trial found them missing some 20 s in, in a line of its
    own. The checkpoint is opened as every trial opens it (a RUN dir or a Hugging Face dir; a RUN's checkpoint is
    exported once, here, and the trials find the export)."""
    from launch.finetune.checkpoint import open_checkpoint

    for flag, path in (("--data-dir", Path(cfg.data_dir)), ("--checkpoint", Path(cfg.checkpoint))):
        if not path.exists():
            raise CliError(f"{flag} {path} does not exist; "
                           + ("pass the folder of the tasks' data" if flag == "--data-dir" else
                              "pass a bertpipe RUN directory or a Hugging Face model directory"))
    if not Path(cfg.data_dir).is_dir():
        raise CliError(f"--data-dir {cfg.data_dir} is a file, not a directory; pass the folder of the tasks' data")
    try:
        open_checkpoint(cfg.checkpoint, cfg.vocab)
    except ValueError as err:  # DataError: what is wrong with it, in one line
        raise CliError(str(err)) from None


def run(args: argparse.Namespace) -> int:
    from launch.log import setup_logging

    setup_logging()
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise CliError("--tasks is empty; name at least one task, e.g. --tasks sst2")
    # 0 CPUs a trial started every trial at once; -1 failures is Ray's "retry forever"; a Ray of 0 CPUs ran none.
    # inf and nan pass (or slip past) the comparisons: int(inf) was a traceback, nan a riddle, deep in the sweep.
    if not math.isfinite(args.cpus_per_trial):
        raise CliError(f"--cpus-per-trial must be a finite number more than 0, got {args.cpus_per_trial:g}")
    if args.cpus_per_trial <= 0:
        raise CliError(f"--cpus-per-trial must be more than 0, got {args.cpus_per_trial:g}")
    for flag, value, least in (("--gpus-per-trial", args.gpus_per_trial, 0), ("--max-failures", args.max_failures, 0),
                               ("--num-cpus", args.num_cpus, 1)):
        if value is not None and not math.isfinite(value):
            raise CliError(f"{flag} must be a finite number, {least} or more, got {value:g}")
        if value is not None and value < least:
            raise CliError(f"{flag} must be {least} or more, got {value:g}")
    from launch.finetune.local_ray import check_temp_dir
    from launch.finetune.ray_address import check_address

    try:  # before anything is written (run_sweep checks them again, for callers of the library)
        check_address(args.address, args.num_cpus, args.ray_temp_dir)  # first: with an address, no temp dir is made
        if args.ray_temp_dir is not None:
            check_temp_dir(args.ray_temp_dir)
    except ValueError as err:
        raise CliError(str(err)) from None
    # `--set key=value` is a flag by another name: refused alike (it got past these checks, and did nothing).
    given = set(given_flags(args)) | {form.partition("=")[0].strip() for form in args.overrides}
    for key, why in _SWEEP_SETS.items():
        if key in given:
            raise CliError(f"{flag_of(key)} is not a sweep setting: {why}")
    from launch.finetune.tune_sweep import refuse_flags_the_grid_sets

    try:  # before the settings' own checks: `--layers 1` with table7 was told to add --feature-based, then refused
        refuse_flags_the_grid_sets(given, _grid_keys(args.grid, tasks), args.grid)
    except ValueError as err:
        raise CliError(str(err)) from None
    cfg, overrides = trial_overrides(args, tasks)
    try:
        warn_ignored_config_keys(args.config, args.grid, tasks, args.save_models)
    except ValueError as err:  # a bad grid or task name, as run_sweep would refuse it
        raise CliError(str(err)) from None
    from launch.finetune.ray_address import effective_address

    # Through Ray client (ray://) the driver runs here, the trials on the cluster: their paths may exist only there.
    if not (effective_address(args.address)[0] or "").startswith("ray://"):
        check_inputs(cfg)
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
