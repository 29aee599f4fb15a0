"""Ray Tune sweeps of fine-tuning runs: every (task, grid point, seed) is one trial with its own resources.

    from launch.finetune.tune_sweep import run_sweep
    result = run_sweep(["sst2", "mrpc"], checkpoint="runs/base", data_dir="data/glue", out="out/sweep",
                       grid="quick", overrides={"max_train_samples": 2000})
    print(result.table)

Runs on an embedded local Ray (private temp dir) unless an address is given (`auto`, `ray://...`) or
the process was started by `ray job submit` (RAY_ADDRESS set). Crashed trials are retried
(`FailureConfig(max_failures)`); an interrupted sweep continues with `resume=True`, re-running only
unfinished or errored trials. Writes OUT/results.json, OUT/results.md (the paper's table layout)
and OUT/sweep.png (dev metric over the grid).

Test hook: `crash_first_attempt=i` (CLI: env `BERTPIPE_SWEEP_CRASH_FIRST_ATTEMPT=i`) makes trial `i`
raise on its first attempt only, so retry handling is exercised deterministically.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import yaml

from launch.config import from_dict, to_dict
from launch.finetune import table7
from launch.finetune.finetune_config import FinetuneConfig
from launch.finetune.report import markdown_table, plot_grid, summarize
from launch.finetune.tasks import get_task

logger = logging.getLogger(__name__)

# The BERT paper's fine-tuning grid (Appendix A.3) and a 2-point smoke grid.
GRIDS: dict[str, dict[str, list[Any]]] = {
    "paper": {"batch_size": [16, 32], "lr": [5e-5, 3e-5, 2e-5], "epochs": [2, 3, 4]},
    "quick": {"batch_size": [32], "lr": [5e-5, 3e-5], "epochs": [1]},
}
CRASH_ENV = "BERTPIPE_SWEEP_CRASH_FIRST_ATTEMPT"
EXPERIMENT = "tune"


class InjectedFault(RuntimeError):
    """Raised by the fault-injection test hook; never raised unless asked for."""


@dataclass
class SweepResult:
    out: Path
    summary: dict[str, dict[str, Any]]
    trials: list[dict[str, Any]]
    table: str

    @property
    def failed(self) -> int:
        return sum(1 for t in self.trials if t.get("error"))


def load_grid(grid: str | Path | dict[str, Any]) -> dict[str, list[Any]]:
    """A named grid (`paper`, `quick`), a YAML file mapping FinetuneConfig fields to value lists, or a dict."""
    if isinstance(grid, dict):
        raw = grid
    elif str(grid) in GRIDS:
        raw = GRIDS[str(grid)]
    else:
        path = Path(grid)
        if not path.is_file():
            raise ValueError(f"--grid {grid!r} is neither {' / '.join(GRIDS)} nor a YAML file")
        raw = yaml.safe_load(path.read_text()) or {}
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: a grid file maps config fields to lists, e.g. `lr: [5e-5, 3e-5]`")
    fields = {f.name for f in dataclasses.fields(FinetuneConfig)} - {"task", "data_dir", "checkpoint", "out", "seed"}
    unknown = sorted(set(raw) - fields)
    if unknown:
        raise ValueError(f"grid keys {unknown} are not fine-tuning settings; use some of: {', '.join(sorted(fields))}")
    return {k: list(v) if isinstance(v, (list, tuple)) else [v] for k, v in raw.items()}


def expand(tasks: Sequence[str], grid: dict[str, list[Any]], seeds: Sequence[int]) -> list[dict[str, Any]]:
    """Every (task, grid point, seed) as a flat dict with a stable `index` (the trial's name)."""
    keys = sorted(grid)
    points = []
    for task in tasks:
        for values in itertools.product(*(grid[k] for k in keys)):
            for seed in seeds:
                points.append({"task": task, **dict(zip(keys, values)), "seed": seed, "index": len(points)})
    return points


def _name(point: dict[str, Any]) -> str:
    return f"{point['task']}-{point['index']:03d}"


def _trial_name(trial) -> str:
    return _name(trial.config["point"])


def _trainable(config: dict[str, Any]) -> None:
    """One Ray Tune trial: one fine-tuning run, reported once at the end (the paper keeps the final model)."""
    from ray import tune

    from launch.finetune.runner import finetune

    point = dict(config["point"])
    if config.get("crash_first_attempt") == point["index"]:
        # The marker lives in the sweep's OUT (not the trial dir, which Tune may stage afresh per attempt).
        marker = Path(config["fault_dir"]) / f"trial-{point['index']:03d}"
        if not marker.exists():
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text("crashed once on purpose (test hook)\n")
            raise InjectedFault(f"trial {point['index']}: injected crash on its first attempt (test hook)")
    # Outputs go straight to OUT/trials/ (storage every node sees), not through Tune's artifact sync.
    out = Path(config["trials_dir"]) / _name(point)
    settings = {**config["base"], **{k: v for k, v in point.items() if k != "index"}, "out": str(out)}
    cfg = from_dict(FinetuneConfig, settings)
    result = finetune(cfg)
    numeric = {k: v for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    tune.report(numeric)


def _connect(address: str | None, num_cpus: int | None, temp_dir: str | None) -> tuple[bool, str | None]:
    """Connect to Ray: (whether this call connected, and so must shut down; a temp dir it created)."""
    import ray

    if ray.is_initialized():
        return False, None
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, logging_level=logging.WARNING)
        return True, None
    # A private temp dir: never share (or clean up) another Ray's default /tmp/ray.
    created = None if temp_dir else tempfile.mkdtemp(prefix="bertpipe-ray-")
    ray.init(num_cpus=num_cpus, _temp_dir=temp_dir or created, include_dashboard=False, logging_level=logging.WARNING)
    logger.info("started a local Ray (%s CPUs, temp dir %s)", num_cpus or "all", temp_dir or created)
    return True, created


def run_sweep(
    tasks: Sequence[str],
    checkpoint: str | Path,
    data_dir: str | Path,
    out: str | Path,
    *,
    grid: str | Path | dict[str, Any] = "paper",
    seeds: int | Sequence[int] = 1,
    overrides: dict[str, Any] | None = None,
    address: str | None = None,
    resume: bool = False,
    cpus_per_trial: float = 1,
    gpus_per_trial: float | None = None,
    max_failures: int = 1,
    num_cpus: int | None = None,
    temp_dir: str | None = None,
    crash_first_attempt: int | None = None,
    name: str | None = None,
) -> SweepResult:
    """Run (or resume) a sweep and write OUT/results.json, OUT/results.md and OUT/sweep.png.

    `overrides` are FinetuneConfig fields applied to every trial (e.g. max_train_samples); `seeds`
    is a count (seeds 1..N) or explicit seeds. `gpus_per_trial=None` takes 1 GPU per trial when the
    cluster has GPUs, else 0.
    """
    from ray import tune

    out = Path(out).resolve()
    tasks = [get_task(t).name for t in tasks]  # validates names, canonical spelling
    grid_values = table7.GRID if table7.is_table7(grid) else load_grid(grid)
    seed_list = list(range(1, seeds + 1)) if isinstance(seeds, int) else list(seeds)
    if not seed_list:
        raise ValueError("--seeds must be at least 1")
    base = to_dict(FinetuneConfig(task=tasks[0], data_dir=str(Path(data_dir).resolve()),
                                  checkpoint=str(Path(checkpoint).resolve()), out=str(out)))
    base.update({"save_model": False, "progress": False})
    base.update(overrides or {})
    if base.get("threads") is None:  # torch in a trial uses the CPUs Ray reserved for it, no more
        base["threads"] = max(1, int(cpus_per_trial))
    for key in ("task", "out"):
        base.pop(key)
    # Every trial's settings must be valid before Ray starts anything.
    points = table7.points(tasks, seed_list) if table7.is_table7(grid) else expand(tasks, grid_values, seed_list)
    for p in points:
        from_dict(FinetuneConfig, {**base, **{k: v for k, v in p.items() if k != "index"}, "out": str(out)}).validate()
    exp_dir = out / EXPERIMENT
    if exp_dir.exists() and not resume:
        raise ValueError(f"{out} already holds a sweep; pass --resume to continue it, or choose another --out")

    started, created_temp = _connect(address, num_cpus, temp_dir)
    try:
        import ray

        if gpus_per_trial is None:
            gpus_per_trial = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
        trainable = tune.with_resources(_trainable, {"cpu": cpus_per_trial, "gpu": gpus_per_trial})
        if resume and tune.Tuner.can_restore(str(exp_dir)):
            logger.info("resuming the sweep in %s (finished trials are kept, errored ones re-run)", exp_dir)
            tuner = tune.Tuner.restore(str(exp_dir), trainable=trainable, resume_errored=True)
        else:
            out.mkdir(parents=True, exist_ok=True)
            (out / "sweep_config.json").write_text(json.dumps(
                {"tasks": tasks, "grid": grid_values, "seeds": seed_list, "base": base}, indent=2) + "\n")
            tuner = tune.Tuner(
                trainable,
                param_space={"point": tune.grid_search(points), "base": base, "crash_first_attempt": crash_first_attempt,
                             "fault_dir": str(out / "fault_injection"), "trials_dir": str(out / "trials")},
                # reuse_actors: the next trial runs in a worker that already imported torch and the model code.
                tune_config=tune.TuneConfig(trial_name_creator=_trial_name, trial_dirname_creator=_trial_name,
                                            reuse_actors=True),
                run_config=tune.RunConfig(
                    name=EXPERIMENT, storage_path=str(out), verbose=1,
                    failure_config=tune.FailureConfig(max_failures=max_failures),
                ),
            )
        grid_result = tuner.fit()
        trials = []
        for r in grid_result:
            trials.append({
                "point": r.config["point"],
                "metrics": _our_metrics(r.metrics) if r.error is None else None,
                "error": None if r.error is None else f"{type(r.error).__name__}: {r.error}".splitlines()[0],
            })
    finally:
        if started:
            import ray

            ray.shutdown()
        if created_temp:  # trial outputs were already synced into OUT by Tune
            shutil.rmtree(created_temp, ignore_errors=True)
    trials.sort(key=lambda t: t["point"]["index"])
    return write_results(out, trials, name=name or Path(checkpoint).name, grid=grid)


# Keys Ray Tune adds to every reported result; the rest are the fine-tuning run's own metrics.
_RAY_KEYS = ("time_", "timestamp", "training_iteration", "done", "trial_id", "date", "hostname", "node_ip", "pid",
             "config", "checkpoint_dir_name", "timesteps", "episodes", "iterations_since_restore",
             "should_checkpoint", "experiment_tag")


def _our_metrics(reported: dict[str, Any] | None) -> dict[str, float]:
    return {k: v for k, v in (reported or {}).items()
            if not k.startswith(_RAY_KEYS) and isinstance(v, (int, float)) and not isinstance(v, bool)}


def write_results(out: Path, trials: list[dict[str, Any]], *, name: str, grid: Any = None) -> SweepResult:
    if table7.is_table7(grid):  # the paper's Table 7: rows of layer choices, not a grid (launch/finetune/table7.py)
        summary, table = table7.write_results(out, trials, name=name)
        return SweepResult(out, summary, trials, table)
    summary = summarize(trials)
    table = markdown_table(summary, name=name)
    (out / "results.json").write_text(json.dumps({"summary": summary, "trials": trials}, indent=2, default=str) + "\n")
    (out / "results.md").write_text(table)
    plot_grid(trials, summary, out / "sweep.png")
    return SweepResult(out, summary, trials, table)
