"""Ray Tune sweeps of fine-tuning runs: every (task, grid point, seed) is one trial with its own resources.

    from launch.finetune.tune_sweep import run_sweep
    result = run_sweep(["sst2", "mrpc"], checkpoint="runs/base", data_dir="data/glue", out="out/sweep",
                       grid="quick", overrides={"max_train_samples": 2000})
    print(result.table)

Runs on an embedded local Ray unless an address is given (`auto`: the cluster `ray start` recorded on this
machine; `HOST:PORT`; `ray://...`) or the process was started by `ray job submit` (RAY_ADDRESS set;
`launch.finetune.ray_address`); the local Ray never outlives the sweep, even a killed one
(`launch.finetune.local_ray`). Crashed trials are retried (`FailureConfig(max_failures)`).

Nothing finished is run twice: a trial that finishes first writes OUT/trials/<trial>/trial_result.json
(its settings, metrics and their sha256; written, fsynced and renamed into place) and only then reports to
Tune. `resume=True` reads these records, keeps every verified one (its settings are this sweep's settings
for that trial) and runs only the other trials; Tune's own experiment state, which it saves every few
seconds, is not relied on. Writes OUT/results.json, OUT/results.md (the paper's table layout) and
OUT/sweep.png (dev metric over the grid).

Test hook: `crash_first_attempt=i` (CLI: env `BERTPIPE_SWEEP_CRASH_FIRST_ATTEMPT=i`) makes trial `i`
raise on its first attempt only, so retry handling is exercised deterministically.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import yaml

from launch.config import StrictYamlLoader, coerce_field, from_dict, to_dict, yaml_problem
from launch.finetune import table7
from launch.finetune.finetune_config import FinetuneConfig
from launch.finetune.local_ray import check_temp_dir, check_trial_fits, ray_session
from launch.finetune.ray_address import check_address, effective_address, gpus_per_trial as default_gpus
from launch.finetune.trial_records import inputs_fingerprint, read_record, write_record
from launch.finetune.report import markdown_table, plot_grid, summarize, system_rows
from launch.finetune.tasks import get_task
from pipeline.atomic_write import write_text_atomic
from pipeline.output_lock import refuse_others_files

logger = logging.getLogger(__name__)

# The BERT paper's fine-tuning grid (Appendix A.3) and a 2-point smoke grid.
GRIDS: dict[str, dict[str, list[Any]]] = {
    "paper": {"batch_size": [16, 32], "lr": [5e-5, 3e-5, 2e-5], "epochs": [2, 3, 4]},
    "quick": {"batch_size": [32], "lr": [5e-5, 3e-5], "epochs": [1]},
}
CRASH_ENV = "BERTPIPE_SWEEP_CRASH_FIRST_ATTEMPT"
EXPERIMENT = "tune"  # Tune's own logs and state: OUT/tune/<trial>/
CONFIG_FILE = "sweep_config.json"
_SETTINGS_KEYS = {"tasks", "grid", "seeds", "base"}  # what CONFIG_FILE holds: proof that a sweep wrote it
SWEEP_FILES = (CONFIG_FILE, EXPERIMENT, "trials", "fault_injection", "results.json", "results.md", "sweep.png")
NO_TUNE_SIGINT = "TUNE_DISABLE_SIGINT_HANDLER"
REFUSED = "bertpipe_refused"  # a trial's report when its input was refused: the one-line reason


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
            raise ValueError(f"--grid {grid!r} is neither {' / '.join([*GRIDS, table7.NAME])} nor an existing YAML file")
        try:
            raw = yaml.load(path.read_text(encoding="utf-8"), Loader=StrictYamlLoader) or {}
        except yaml.YAMLError as err:
            raise ValueError(f"--grid {path} is not valid YAML: {yaml_problem(err)}; fix the YAML there") from None
        except UnicodeDecodeError:
            raise ValueError(f"--grid {path} is not UTF-8 text; save it as UTF-8") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: a grid file maps config fields to lists, e.g. `lr: [5e-5, 3e-5]`")
    fields = {f.name for f in dataclasses.fields(FinetuneConfig)} - {"task", "data_dir", "checkpoint", "out", "seed"}
    unknown = sorted(set(raw) - fields)
    if unknown:
        raise ValueError(f"grid keys {unknown} are not fine-tuning settings; use some of: {', '.join(sorted(fields))}")
    empty = sorted(k for k, v in raw.items() if isinstance(v, (list, tuple)) and not v)
    if empty:  # else no trial, and a table and plot of nothing
        raise ValueError(f"grid key {empty[0]} has no values; give it at least one, e.g. `{empty[0]}: [...]`, or drop it")
    # Typed now, not in each trial: `lr: [5e-5]` is a string to YAML, and the table formats it as a number.
    typed = {k: [coerce_field(FinetuneConfig, k, x, f"grid {k}")
                 for x in (v if isinstance(v, (list, tuple)) else [v])] for k, v in raw.items()}
    for key, values in typed.items():
        refuse_repeats(key, values)
    return typed


def refuse_repeats(name: str, values: Sequence[Any]) -> None:
    """A value listed twice (`lr: [5.0e-5, 5.0e-5]`, or `5e-5` and `0.00005`) is the same trials twice: refused
    as that, where the trial-folder clash it leads to advised making the values differ."""
    for value in values:
        times = list(values).count(value)
        if times > 1:
            raise ValueError(f"{name} lists {value} {'twice' if times == 2 else f'{times} times'}; "
                             "remove the repeated value")


def refuse_flags_the_grid_sets(given: Iterable[str], varied: set[str], grid: Any) -> None:
    """A setting given by flag that every grid point sets (`varied`) would be ignored: refused."""
    clash = sorted(varied & set(given))
    if clash:
        raise ValueError(f"--{clash[0].replace('_', '-')} is set by every trial's grid point ({grid}), so the flag "
                         f"would be ignored; drop it, or use a grid file that does not vary {clash[0]}")


def refuse_unused_grid_keys(grid: Any, grid_values: dict[str, list[Any]], config: FinetuneConfig) -> None:
    """A grid key that varies but that a trial's setup does not read would run that trial once per value."""
    unused = sorted(k for k, values in grid_values.items() if len(set(values)) > 1 and k in config.unused_settings())
    if not unused:
        return
    name = f"grid {grid!r}" if isinstance(grid, str) and grid in GRIDS else "the grid"
    if config.feature_based:
        raise ValueError(f"{name} varies {', '.join(unused)}, which --feature-based trials do not use (the new head "
                         "learns at --feature-lr): each value would run the same trials again; use a grid file "
                         "without it, e.g. `batch_size: [16, 32]`, `epochs: [2, 3, 4]`, `feature_lr: [1.0e-3, 5.0e-4]`")
    raise ValueError(f"{name} varies {', '.join(unused)}, which only --feature-based trials use: each value would "
                     "run the same fine-tuning again; add --feature-based, or drop it from the grid")


def expand(tasks: Sequence[str], grid: dict[str, list[Any]], seeds: Sequence[int]) -> list[dict[str, Any]]:
    """Every (task, grid point, seed) as a flat dict with a stable `index` (the trial's name)."""
    keys = sorted(grid)
    points = []
    for task in tasks:
        for values in itertools.product(*(grid[k] for k in keys)):
            for seed in seeds:
                points.append({"task": task, **dict(zip(keys, values)), "seed": seed, "index": len(points)})
    return points


_SHORT = {"batch_size": "bs", "epochs": "ep", "lr": "lr", "seed": "seed"}


def trial_name(point: dict[str, Any]) -> str:
    """`sst2-bs32-ep3-lr3e-05-seed1`: named by what the trial runs, not by its place in the grid, so that a
    resume with more seeds or another task finds the finished trials under the names they were written as
    (positions shifted, and every trial ran again)."""
    parts = [str(point["task"])]
    for key in [k for k in sorted(point) if k not in ("task", "seed", "index")] + ["seed"]:
        value = point[key]
        if isinstance(value, bool):
            parts.append(key if value else f"no-{key}")
        else:
            parts.append(f"{_SHORT.get(key, key + '-')}{value}")
    return re.sub(r"[^A-Za-z0-9.+=-]+", "-", "-".join(parts))


def _tune_trial_name(trial) -> str:
    return trial_name(trial.config["point"])


def _settings(base: dict[str, Any], point: dict[str, Any], trials_dir: Path) -> dict[str, Any]:
    """One trial's FinetuneConfig fields: the sweep's base, its grid point and seed, its own output folder."""
    return {**base, **{k: v for k, v in point.items() if k != "index"}, "out": str(trials_dir / trial_name(point))}


def shared_base(base: dict[str, Any], points: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The base Tune is given: without the fields every point sets. Tune prints each trial's config, and
    `base/lr 2e-05` beside a trial that runs its point's lr would mislead; `_settings(shared_base(...),
    point)` is `_settings(base, point)` for every one of `points`."""
    every_point_sets = set.intersection(*(set(p) for p in points)) if points else set()
    return {k: v for k, v in base.items() if k not in every_point_sets}


def _trainable(config: dict[str, Any]) -> None:
    """One Ray Tune trial: one fine-tuning run, reported once at the end (the paper keeps the final model)."""
    import ray
    from ray import tune

    from launch.finetune.runner import finetune
    from launch.finetune.sweep_progress import quiet_stop_by_ray

    quiet_stop_by_ray()
    point = dict(config["point"])
    if config.get("crash_first_attempt") == point["index"]:
        # The marker lives in the sweep's OUT (not the trial dir, which Tune may stage afresh per attempt).
        marker = Path(config["fault_dir"]) / f"trial-{point['index']:03d}"
        if not marker.exists():
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text("crashed once on purpose (test hook)\n")
            raise InjectedFault(f"trial {point['index']}: injected crash on its first attempt (test hook)")
    # Outputs go straight to OUT/trials/ (storage every node sees), not through Tune's artifact sync.
    settings = _settings(config["base"], point, Path(config["trials_dir"]))
    cfg = from_dict(FinetuneConfig, settings)
    if cfg.device == "auto" and not ray.get_gpu_ids():
        # A trial Ray gave no GPU must not take one: Ray no longer hides the node's GPUs from it, and
        # every such trial on a node would pick the same one. (The recorded settings stay as given.)
        cfg.device = "cpu"
    try:
        result = finetune(cfg)
    except ValueError as err:  # bad input or settings (DataError): every attempt would fail alike, so it
        tune.report({REFUSED: str(err)})  # is reported as the trial's result, not raised and retried
        return
    numeric = {k: v for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    # Recorded before Tune hears of it: a driver killed from here on never runs this trial again.
    write_record(Path(settings["out"]), settings, numeric, config["inputs"])
    tune.report(numeric)


def holds_sweep(out: str | Path) -> bool:
    """Whether `out` already holds a (finished or interrupted) sweep, which only `resume=True` continues.
    Our settings file is the proof (written once Ray is up, before Tune writes into `out`): a folder named
    `tune` is anyone's, and so is a `sweep_config.json` that does not hold the settings a sweep writes."""
    try:
        saved = json.loads((Path(out) / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(saved, dict) and _SETTINGS_KEYS <= saved.keys() and isinstance(saved["base"], dict)


def check_sweep_out(out: Path, resume: bool) -> None:
    """Refuse (ValueError) an `out` a sweep may not write: an earlier sweep without `resume`, or files of
    someone else's that the sweep's own would overwrite."""
    ours = holds_sweep(out)
    if ours and not resume:
        raise ValueError(f"{out} already holds a sweep; pass --resume to continue it, or choose another --out")
    if (out / CONFIG_FILE).exists() and not ours:  # else the marker check below would take it as ours
        raise ValueError(f"--out {out} holds {CONFIG_FILE}, which is not the settings `bertpipe sweep` writes "
                         "and would be overwritten; move it out of --out, or choose a new or empty --out")
    refuse_others_files(out, SWEEP_FILES, CONFIG_FILE, "sweep", ours=ours)


def base_settings(task: str, checkpoint: str | Path, data_dir: str | Path, overrides: dict[str, Any] | None,
                  cpus_per_trial: float) -> dict[str, Any]:
    """The settings every trial shares (a grid point and seed complete them), paths absolute."""
    base = to_dict(FinetuneConfig(task=task, data_dir=str(Path(data_dir).resolve()),
                                  checkpoint=str(Path(checkpoint).resolve()), out=""))
    # max_seq_len null unless given: each trial's config resolves its task's own (384 for SQuAD, 128 else).
    base.update({"save_model": False, "progress": False, "max_seq_len": None})
    base.update(overrides or {})
    for key in ("feature_cache", "vocab"):  # paths, like data_dir: each trial runs in a working directory of its own
        if base.get(key):
            base[key] = str(Path(base[key]).resolve())
    if base.get("threads") is None:  # torch in a trial uses the CPUs Ray reserved for it, no more
        base["threads"] = max(1, int(cpus_per_trial))
    for key in ("task", "out"):
        base.pop(key)
    return base


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
    given: Sequence[str] = (),
) -> SweepResult:
    """Run (or resume) a sweep and write OUT/results.json, OUT/results.md and OUT/sweep.png.

    `overrides` are FinetuneConfig fields applied to every trial (e.g. max_train_samples); `seeds`
    is a count (seeds 1..N) or explicit seeds. `gpus_per_trial=None` takes 1 GPU per trial when Ray has a
    GPU now, else 0 on the local Ray and a refusal on a cluster (`ray_address.gpus_per_trial`). `num_cpus`
    and `temp_dir` (None: not given) are the local Ray's, refused beside an address. With `resume=True`,
    trials with a verified record are kept (Ray is not even started when all are), the others run. `given`:
    the settings the user set by flag; one that every trial takes from its grid point instead is refused (it
    was ignored without a word).
    """
    out = Path(out).resolve()
    canonical = [get_task(t).name for t in tasks]  # validates names, canonical spelling
    twice = sorted({t for t in canonical if canonical.count(t) > 1})
    if twice:  # else each config ran twice with the same seeds and the table averaged the copies
        raise ValueError(f"--tasks names {', '.join(twice)} more than once ({', '.join(tasks)}); name each task once")
    tasks = canonical
    grid_values = table7.GRID if table7.is_table7(grid) else load_grid(grid)
    seed_list = list(range(1, seeds + 1)) if isinstance(seeds, int) else list(seeds)
    if not seed_list:
        raise ValueError("--seeds must be at least 1")
    refuse_repeats("seeds", seed_list)
    # Before anything is written or started: the address, flags only the local Ray reads, the temp dir.
    check_address(address, num_cpus, temp_dir)
    if temp_dir is not None:
        check_temp_dir(temp_dir)
    base = base_settings(tasks[0], checkpoint, data_dir, overrides, cpus_per_trial)
    # Every trial's settings must be valid before Ray starts anything.
    points = table7.points(tasks, seed_list) if table7.is_table7(grid) else expand(tasks, grid_values, seed_list)
    refuse_flags_the_grid_sets(given, {k for p in points for k in p if k not in ("index", "task", "seed")}, grid)
    trials_dir = out / "trials"
    named: dict[str, dict[str, Any]] = {}
    for p in points:  # distinct grid values can only meet in a name through characters a folder name cannot hold
        folder = trial_name(p)  # not `name`: that is the system's name in the tables
        if folder in named:
            raise ValueError(f"grid points {named[folder]} and {p} would share the trial folder {folder}; "
                             "make their values differ in letters or digits")
        named[folder] = p
    settings = {p["index"]: _settings(base, p, trials_dir) for p in points}
    configs = [from_dict(FinetuneConfig, settings[p["index"]]) for p in points]
    for config in configs:
        config.validate()
        refuse_unused_grid_keys(grid, grid_values, config)
    if any(c.feature_based for c in configs):
        from launch.finetune.feature_extraction import check_layers_fit  # imports torch: only when needed

        check_layers_fit(base["checkpoint"], [c.layers for c in configs if c.feature_based])
    check_sweep_out(out, resume)

    inputs = inputs_fingerprint(base["checkpoint"], base["data_dir"], exclude=[out, base.get("feature_cache") or out])
    recorded: dict[int, dict[str, float]] = {}
    for p in points if resume else ():
        metrics, why = read_record(trials_dir / trial_name(p), settings[p["index"]], inputs)
        if metrics is not None:
            recorded[p["index"]] = metrics
        elif why:
            logger.warning("%s: %s; running it again", trial_name(p), why)
    pending = [p for p in points if p["index"] not in recorded]
    if resume:
        logger.info("resuming the sweep in %s: %d of %d trials already finished, %d to run",
                    out, len(recorded), len(points), len(pending))
    out.mkdir(parents=True, exist_ok=True)
    config = json.dumps({"tasks": tasks, "grid": grid_values, "seeds": seed_list, "base": base}, indent=2) + "\n"
    if pending:  # CONFIG_FILE is written once Ray is up and the trials' resources are accepted (`_run_trials`)
        outcomes = _run_trials(pending, base, out, inputs, config, address=address, num_cpus=num_cpus,
                               temp_dir=temp_dir, cpus_per_trial=cpus_per_trial, gpus_per_trial=gpus_per_trial,
                               max_failures=max_failures, crash_first_attempt=crash_first_attempt)
    else:
        write_text_atomic(out / CONFIG_FILE, config)
        outcomes = {}
    trials = []
    for p in points:
        # A trial's record is the truth; Tune's report stands in only where OUT/trials is not visible here.
        metrics = recorded.get(p["index"]) or read_record(trials_dir / trial_name(p), settings[p["index"]], inputs)[0]
        outcome = outcomes.get(p["index"], {})
        if metrics is None and outcome.get("error") is None:
            metrics = outcome.get("metrics")
        error = None if metrics is not None else outcome.get("error") or "the trial did not finish"
        trials.append({"point": p, "metrics": metrics, "error": error})
    # Absolute: `--checkpoint .` (or `..`) named the system "" in results.md, sweep.png and Table 7. Not resolved:
    # a link (`bert-base-latest`) names the system as the user named it, not as its target is called.
    absolute = Path(os.path.abspath(checkpoint))
    return write_results(out, trials, name=name or absolute.name or str(absolute), grid=grid)


def _run_trials(pending: list[dict[str, Any]], base: dict[str, Any], out: Path, inputs: str, config: str, *,
                address: str | None, num_cpus: int | None, temp_dir: str | None, cpus_per_trial: float,
                gpus_per_trial: float | None, max_failures: int, crash_first_attempt: int | None
                ) -> dict[int, dict[str, Any]]:
    """Run `pending` as one Tune experiment in OUT/tune; per trial index, Tune's metrics or error. `config`
    (CONFIG_FILE's text) is written once Ray is up and the trials fit it, before Tune writes into OUT: a sweep
    refused before that (no Ray there, a temp dir it cannot create, resources) left it behind, and the same
    command, corrected, was refused as "already holds a sweep"."""
    import ray
    from ray import tune

    from launch.finetune.sweep_progress import SweepProgress, quiet_tune

    with ray_session(address, num_cpus, temp_dir):
        have = ray.cluster_resources()
        gpus_per_trial = default_gpus(gpus_per_trial, have, address)
        check_trial_fits({"--cpus-per-trial": ("CPU", cpus_per_trial), "--gpus-per-trial": ("GPU", gpus_per_trial)},
                         have, effective_address(address)[0])
        write_text_atomic(out / CONFIG_FILE, config)
        trainable = tune.with_resources(_trainable, {"cpu": cpus_per_trial, "gpu": gpus_per_trial})
        tuner = tune.Tuner(
            trainable,
            param_space={"point": tune.grid_search(pending), "base": shared_base(base, pending), "crash_first_attempt": crash_first_attempt,
                         "fault_dir": str(out / "fault_injection"), "trials_dir": str(out / "trials"),
                         "inputs": inputs},
            # reuse_actors: the next trial runs in a worker that already imported torch and the model code.
            tune_config=tune.TuneConfig(trial_name_creator=_tune_trial_name, trial_dirname_creator=_tune_trial_name,
                                        reuse_actors=True),
            # Tune's own output (tables per trial) off; one line per trial event instead.
            run_config=tune.RunConfig(
                name=EXPERIMENT, storage_path=str(out), verbose=0, callbacks=[SweepProgress(
                    len(pending), out / EXPERIMENT, trial_name, lambda point: get_task(point["task"]).metric, REFUSED)],
                failure_config=tune.FailureConfig(max_failures=max_failures),
            ),
        )
        # Ctrl-C stops the sweep at once (KeyboardInterrupt; the CLI says how to continue): Tune's own
        # handler would instead wind down and return as if the sweep had ended. Nothing is lost either
        # way, finished trials are recorded.
        with quiet_tune({NO_TUNE_SIGINT: "1"}):
            grid_result = tuner.fit()
        return {r.config["point"]["index"]: _outcome(r) for r in grid_result}


def _outcome(result) -> dict[str, Any]:
    """A Tune result as {metrics, error}; the error is one line: the refusal's reason, or the exception
    the trial raised (Ray wraps it in RayTaskError, whose own first line names only the actor)."""
    refused = (result.metrics or {}).get(REFUSED)
    if refused:
        return {"metrics": None, "error": f"refused: {refused}"}
    if result.error is None:
        return {"metrics": _our_metrics(result.metrics), "error": None}
    cause = getattr(result.error, "cause", None) or result.error
    text = re.sub(r"\x1b\[[0-9;]*m", "", f"{type(cause).__name__}: {cause}").strip()
    return {"metrics": None, "error": text.splitlines()[0] if text else type(cause).__name__}


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
    summary, rows = summarize(trials), system_rows(trials, name=name)
    table = markdown_table(rows)
    # "rows" only where the table has more than one (a swept init): else it would repeat "summary".
    extra = {"rows": rows} if len(rows) > 1 else {}
    write_text_atomic(out / "results.json", json.dumps({"summary": summary, **extra, "trials": trials}, indent=2,
                                                       default=str) + "\n")
    write_text_atomic(out / "results.md", table)
    plot_grid(trials, summary, out / "sweep.png", name=name)
    return SweepResult(out, summary, trials, table)
