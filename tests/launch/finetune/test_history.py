"""Fine-tuning you can watch: TensorBoard scalars, a per-epoch dev history and a learning curve (issue 13)."""

from __future__ import annotations

import json

import numpy as np

from launch import cli
from repo_paths import GLUE


def test_a_run_writes_tensorboard_a_per_epoch_history_and_a_learning_curve(tiny_checkpoint, tmp_path):
    import matplotlib.image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "sst2"
    argv = ["finetune", "--task", "sst2", "--data-dir", str(GLUE), "--checkpoint", str(tiny_checkpoint),
            "--out", str(out), "--max-train-samples", "64", "--max-eval-samples", "32", "--epochs", "3",
            "--batch-size", "16", "--max-seq-len", "48", "--lr", "1e-3", "--no-progress", "--no-save-model"]
    assert cli.main(argv) == 0
    history = json.loads((out / "log_history.json").read_text())
    assert [r["epoch"] for r in history] == [1, 2, 3] and [r["step"] for r in history] == [4, 8, 12]
    assert all(0.0 <= r["accuracy"] <= 1.0 and r["train_loss"] > 0 for r in history)
    # The final metrics are the last epoch's evaluation, not a second, different one.
    assert json.loads((out / "metrics.json").read_text())["accuracy"] == history[-1]["accuracy"]

    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/epoch_loss", "dev/accuracy"} <= tags
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, 13))
    assert [e.step for e in events.Scalars("dev/accuracy")] == [4, 8, 12]

    image = matplotlib.image.imread(out / "learning_curve.png")
    assert image.shape[0] >= 400 and image.shape[1] >= 800 and image[..., :3].std() > 0.05
    orange = np.abs((image[..., :3] * 255).astype(int) - [255, 127, 14]).sum(-1) < 40  # the dev metric
    assert orange.mean() > 0.0005


def test_a_labelled_test_splits_scores_are_logged_as_test_not_dev(tmp_path):
    # CoNLL-2003's test split is scored each epoch as `test_f1`: it was plotted as `dev/test_f1`
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from launch.finetune.history import TrainingHistory

    history = TrainingHistory(tmp_path, "f1")
    history.step(1, 0.9, 1e-3)
    history.epoch(1, 1, 0.9, 1e-3, {"f1": 0.5, "test_f1": 0.4, "eval_examples": 8, "test_eval_examples": 8})
    history.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"dev/f1", "test/f1"} <= tags and not any(t.startswith("dev/test") for t in tags), tags


def test_log_history_keeps_each_epochs_numbers_and_the_lr_and_leaves_out_flags(tmp_path):
    # log_history.json is what a user plots or compares runs by: every epoch's step, loss and lr, and the dev
    # numbers; a True/False in the dev results is not a score (JSON would hold `true`, a plot 1.0).
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from launch.finetune.history import TrainingHistory

    history = TrainingHistory(tmp_path, "accuracy")
    history.step(1, 0.7, 2e-5)
    history.epoch(1, 1, 0.7, 2e-5, {"accuracy": 0.5, "eval_examples": 8, "best": True, "note": "x"})
    history.epoch(2, 2, 0.6, 1e-5, {"accuracy": 0.75, "eval_examples": 8})
    assert history.close() == tmp_path / "learning_curve.png"
    assert json.loads((tmp_path / "log_history.json").read_text()) == [
        {"epoch": 1, "step": 1, "train_loss": 0.7, "lr": 2e-5, "accuracy": 0.5, "eval_examples": 8},
        {"epoch": 2, "step": 2, "train_loss": 0.6, "lr": 1e-5, "accuracy": 0.75, "eval_examples": 8},
    ]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    # An example count is no dev curve (nor is a flag).
    assert set(events.Tags()["scalars"]) == {"train/loss", "train/lr", "train/epoch_loss", "dev/accuracy"}


def test_a_run_that_took_no_step_writes_no_learning_curve(tmp_path):
    from launch.finetune.history import TrainingHistory

    history = TrainingHistory(tmp_path, "accuracy", tensorboard=False)
    assert history.close() is None and not (tmp_path / "learning_curve.png").exists()
