"""`bertpipe sweep` refuses bad input in one line, exit 2, before Ray starts and before --out is written.

Each case here used to get past the CLI: `--set lr=...`, `--set seed=...` and the same keys in --config
ran a sweep that ignored them (sweep_config.json recording values no trial used); a non-finite
--cpus-per-trial was a traceback; a missing --checkpoint or --data-dir was found some 20 s into Ray, once
per trial; and --help offered a --seed that is refused.
"""

from __future__ import annotations

import socket
import time

import pytest

from launch import cli
from repo_paths import GLUE

# Starting the local Ray alone takes longer than this: a refusal within it came before Ray.
BEFORE_RAY_S = 10
TINY = ["--max-train-samples", "8", "--max-eval-samples", "8", "--max-seq-len", "32", "--num-cpus", "1"]


@pytest.fixture
def sweep(tiny_checkpoint, tmp_path):
    """`sweep(*extra, checkpoint=..., data_dir=...) -> argv` of a one-trial sweep (a grid of one lr)."""
    grid = tmp_path / "grid.yaml"
    grid.write_text("lr: [5.0e-5]\n")

    def argv(*extra: str, checkpoint=tiny_checkpoint, data_dir=GLUE) -> list[str]:
        return ["sweep", "--tasks", "sst2", "--grid", str(grid), "--checkpoint", str(checkpoint),
                "--data-dir", str(data_dir), "--out", str(tmp_path / "out"), *TINY, *extra]

    return argv


def refused(argv: list[str], capsys, tmp_path, keep_err: bool = False) -> str:
    """The one-line message of a refusal that came before Ray and left --out as it was (not there); `keep_err`:
    with the lines (warnings) before it."""
    start = time.monotonic()
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    took = time.monotonic() - start
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2, err
    assert took < BEFORE_RAY_S, f"refused after {took:.0f} s: Ray had started"
    assert not (tmp_path / "out").exists()  # no sweep_config.json, tune/ or trials/: nothing at all
    lines = err.splitlines()
    assert lines[-1].startswith("bertpipe sweep: error: ") and "Traceback" not in err, err
    lines[-1] = lines[-1].removeprefix("bertpipe sweep: error: ")
    return "\n".join(lines) if keep_err else lines[-1]


@pytest.mark.parametrize("form, message", [
    ("lr=1e-4", "--lr is set by every trial's grid point"),  # as `--lr 1e-4` is
    ("seed=7", "--seed is not a sweep setting: trials run seeds 1..N; set N with --seeds"),
    ("task=mrpc", "--task is not a sweep setting: name the tasks with --tasks"),
    ("save_model=true", "--save-model is not a sweep setting: keep every trial's model with --save-models"),
], ids=["lr", "seed", "task", "save_model"])
def test_a_set_key_is_refused_as_its_flag_is(sweep, form, message, capsys, tmp_path):
    assert message in refused(sweep("--set", form), capsys, tmp_path)


@pytest.mark.parametrize("line, message", [
    ("lr: 1.0e-4", "sets lr: 0.0001 (each trial takes it from its grid point), which no trial uses as set there; "
                   "drop lr from the file"),
    ("seed: 7", "sets seed: 7 (trials run seeds 1..N; set N with --seeds), which no trial uses as set there; "
                "drop seed from the file"),
    ("task: mrpc", "sets task: mrpc (name the tasks with --tasks)"),
], ids=["lr", "seed", "task"])
def test_a_config_key_no_trial_would_use_is_named_in_a_warning(sweep, line, message, capsys, tmp_path):
    # Not refused, as the same key by flag or --set is: flags win over a --config file, which may be a run's
    # own config.yaml. The missing --checkpoint, checked next, stops the sweep before Ray.
    config = tmp_path / "settings.yaml"
    config.write_text(f"warmup: 0.2\n{line}\n")
    missing = tmp_path / "no-such-run"
    text = refused(sweep("--config", str(config), checkpoint=missing), capsys, tmp_path, keep_err=True)
    warnings = [x for x in text.splitlines() if "which no trial uses as set there" in x]
    assert len(warnings) == 1 and f"--config {config} {message}" in warnings[0], text
    assert "warmup" not in warnings[0]


def test_a_finetune_runs_own_config_or_defaults_of_those_keys_get_no_warning(sweep, capsys, tmp_path):
    # A run's saved config.yaml holds every key: its task (one of --tasks), no progress bar, no model kept, and
    # the defaults (`2e-5` is text to YAML) are what the sweep gives every trial anyway.
    config = tmp_path / "settings.yaml"
    config.write_text("lr: 2e-5\nseed: 42\ntask: SST-2\nsave_model: false\nprogress: false\nwarmup: 0.2\n")
    missing = tmp_path / "no-such-run"
    text = refused(sweep("--config", str(config), checkpoint=missing), capsys, tmp_path, keep_err=True)
    assert "no trial uses" not in text and text.splitlines()[-1].startswith(f"--checkpoint {missing} does not exist")


def test_paths_are_not_checked_here_through_ray_client(sweep, capsys, tmp_path):
    # Through ray:// the trials run on the cluster, where the paths may be (they need not exist here): the
    # refusal is the unreachable cluster's, not the missing checkpoint's.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = sweep("--address", f"ray://127.0.0.1:{port}", "--gpus-per-trial", "0",
                 checkpoint=tmp_path / "on-the-cluster", data_dir=tmp_path / "glue-there")
    at = argv.index("--num-cpus")  # the local Ray's: refused beside an address
    text = refused(argv[:at] + argv[at + 2:], capsys, tmp_path)
    assert text.startswith(f"cannot reach the Ray cluster at ray://127.0.0.1:{port}"), text


@pytest.mark.parametrize("flags, message", [
    (["--cpus-per-trial", "inf"], "--cpus-per-trial must be a finite number more than 0, got inf"),  # was a traceback
    (["--cpus-per-trial", "nan"], "--cpus-per-trial must be a finite number more than 0, got nan"),
    (["--gpus-per-trial", "nan"], "--gpus-per-trial must be a finite number, 0 or more, got nan"),
    (["--gpus-per-trial", "inf"], "--gpus-per-trial must be a finite number, 0 or more, got inf"),
], ids=["cpus-inf", "cpus-nan", "gpus-nan", "gpus-inf"])
def test_trial_resources_must_be_finite(sweep, flags, message, capsys, tmp_path):
    assert refused(sweep(*flags), capsys, tmp_path) == message


def test_a_missing_checkpoint_or_data_dir_is_refused_once_before_ray(sweep, capsys, tmp_path):
    missing = tmp_path / "no-such-run"
    assert refused(sweep(checkpoint=missing), capsys, tmp_path) == (
        f"--checkpoint {missing} does not exist; pass a bertpipe RUN directory or a Hugging Face model directory")
    assert refused(sweep(data_dir=missing), capsys, tmp_path) == (
        f"--data-dir {missing} does not exist; pass the folder of the tasks' data")
    # what exists but is no checkpoint gets the reason every trial would have given, once
    not_a_model = tmp_path / "empty"
    not_a_model.mkdir()
    text = refused(sweep(checkpoint=not_a_model), capsys, tmp_path)
    assert str(not_a_model) in text and "Hugging Face" in text


def test_help_does_not_offer_the_refused_seed(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["sweep", "--help"])
    shown = capsys.readouterr().out
    assert exc.value.code == 0 and "--seeds" in shown
    assert "--seed " not in shown and "--seed\n" not in shown and "default: 42" not in shown


def test_a_flag_table7_sets_is_refused_as_such_before_the_settings_checks(tiny_checkpoint, capsys, tmp_path):
    # `--layers 1` was told "add --feature-based, or drop --layers"; with --feature-based added, it was refused
    # as a flag the grid sets: circular advice.
    argv = ["sweep", "--tasks", "conll2003", "--grid", "table7", "--checkpoint", str(tiny_checkpoint),
            "--data-dir", str(GLUE), "--out", str(tmp_path / "out"), "--layers", "1"]
    assert refused(argv, capsys, tmp_path).startswith("--layers is set by every trial's grid point (table7)")
