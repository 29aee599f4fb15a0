"""What `Trainer.train()` decides from step to step, on the real trainer in one lone process (see
train_loop_worker.py): when it evaluates, logs and saves (`log.eval_every`, `log.log_every`,
`checkpoint.save_every`, the end of the run), how a stop signal ends it (a checkpoint, then 128 + the
signal; 0 at the last step), and what a non-finite loss does to a step (no update, no lr step, counted
per micro-batch, `log.max_nonfinite_steps` counted in a row). The e2e tests see these through the CLI
with the cadences off or coinciding; here each is pinned on its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lone_trainer import run_worker

WORKER = Path(__file__).with_name("train_loop_worker.py")
QUIET = ["log.eval_every=0", "checkpoint.save_every=0"]
SCENARIOS = [
    {"name": "cadence", "overrides": ["schedule.total_steps=5", "checkpoint.save_every=2", "log.eval_every=2",
                                      "log.log_every=3", "checkpoint.keep_last=2"]},
    {"name": "save_at_end", "overrides": ["schedule.total_steps=3", "checkpoint.save_every=3", "log.eval_every=0"]},
    {"name": "stopped", "overrides": ["schedule.total_steps=10", *QUIET], "signal_at": 3},
    {"name": "interrupted", "overrides": ["schedule.total_steps=10", *QUIET], "signal_at": 2, "signal": "SIGINT"},
    {"name": "stopped_at_last_step", "overrides": ["schedule.total_steps=2", *QUIET], "signal_at": 2},
    # 4 micro-batches a try: try 2 has one NaN loss (micro-batch 5), try 4 two (12, 13); a good try between.
    {"name": "nonfinite", "overrides": ["schedule.total_steps=4", "log.max_nonfinite_steps=2", *QUIET],
     "poison": [5, 12, 13]},
    # Without ZeRO: no DeepSpeed overflow check behind ours (ZeRO also skips an update with NaN gradients).
    {"name": "nonfinite_zero0", "overrides": ["schedule.total_steps=4", "log.max_nonfinite_steps=2", "zero.stage=0",
                                              *QUIET], "poison": [5, 12, 13]},
    {"name": "nonfinite_resumed", "resume": "nonfinite",
     "overrides": ["schedule.total_steps=5", "log.max_nonfinite_steps=2", *QUIET]},
    {"name": "diverged", "overrides": ["schedule.total_steps=10", "log.max_nonfinite_steps=2", *QUIET],
     "poison": [4, 8]},
    {"name": "stopped_on_nonfinite_try", "overrides": ["schedule.total_steps=10", *QUIET], "signal_at": 3,
     "poison": [8]},
    # Phase 2 from the "cadence" run; its resume must not need phase 1 any more (moved, deleted).
    {"name": "phase2", "overrides": ["schedule.total_steps=2", "checkpoint.init_from={out}/cadence", *QUIET]},
    {"name": "phase2_resumed", "resume": "phase2",
     "overrides": ["schedule.total_steps=3", "checkpoint.init_from={out}/no-such-run", *QUIET]},
]


@pytest.fixture(scope="module")
def runs(small_corpus, tmp_path_factory) -> dict[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("train_loop")
    return run_worker(WORKER, small_corpus, out, json.dumps(SCENARIOS))


def ran(runs: dict[str, dict[str, Any]], name: str) -> dict[str, Any]:
    """What scenario `name` did; it failed the test if the scenario stopped with an error."""
    r = runs[name]
    assert "error" not in r, f"scenario {name}: {r['error']}"
    return r


def logged(r: dict[str, Any], key: str = "step") -> list[Any]:
    return [m.get(key) for m in r["metrics"]]


def evaluated(r: dict[str, Any]) -> list[int]:
    return [m["step"] for m in r["metrics"] if "eval_mlm_accuracy" in m]


@pytest.mark.slow
def test_eval_log_and_save_cadences_and_the_end_of_the_run(runs):
    r = ran(runs, "cadence")  # 5 steps, eval and save every 2, a metrics line every 3, the last 2 checkpoints kept
    assert r["code"] == 0
    assert r["evals"] == [2, 4, 5]  # every eval_every steps, and the last step always
    assert r["saves"] == [2, 4, 5]  # every save_every steps, and the end
    assert r["checkpoints"] == ["global_step4", "global_step5", "latest"]
    assert r["latest"] == "global_step5"
    # log_every's step, and every evaluated step (its eval metrics must not be lost between log lines)
    assert logged(r) == [2, 3, 4, 5] and evaluated(r) == [2, 4, 5]

    r = ran(runs, "save_at_end")  # eval_every=0: only after the last step; save_every lands on the last step
    assert r["code"] == 0 and r["evals"] == [3] and evaluated(r) == [3] and logged(r) == [1, 2, 3]
    assert r["saves"] == [3], "the last step is saved once, not again as the end of the run"
    assert r["latest"] == "global_step3"


@pytest.mark.slow
def test_a_stop_signal_checkpoints_the_step_it_reached_and_exits_128_plus_it(runs):
    r = ran(runs, "stopped")  # SIGTERM during step 3 of 10, no periodic saves
    assert r["code"] == 143
    assert [t["step"] for t in r["tries"]] == [1, 2, 3], "the run goes on past the step the signal reached"
    assert r["saves"] == [3] and r["latest"] == "global_step3" and r["evals"] == []
    assert r["handlers_restored"], "train() leaves its signal handlers behind"

    r = ran(runs, "interrupted")  # Ctrl-C during step 2: 128 + SIGINT
    assert r["code"] == 130 and r["saves"] == [2] and r["latest"] == "global_step2" and r["handlers_restored"]

    r = ran(runs, "stopped_at_last_step")  # the run is done anyway: a finished run, exit 0
    assert r["code"] == 0 and r["saves"] == [2] and r["evals"] == [2] and r["latest"] == "global_step2"
    assert r["handlers_restored"]


@pytest.mark.slow
def test_a_stop_signal_during_a_dropped_try_saves_the_last_applied_step(runs):
    r = ran(runs, "stopped_on_nonfinite_try")  # steps 1 and 2 applied; try 3 had a NaN loss and saw the signal
    assert [t["applied"] for t in r["tries"]] == [True, True, False]
    assert r["code"] == 143 and r["saves"] == [2] and r["latest"] == "global_step2"


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["nonfinite", "nonfinite_zero0"])
def test_a_nonfinite_try_changes_no_weight_and_no_lr_and_is_counted_per_micro_batch(runs, scenario):
    from launch.config import load_config
    from launch.pretrain.pretrain_config import PretrainConfig
    from launch.pretrain.schedule import lr_multiplier

    r = ran(runs, scenario)
    tries = r["tries"]
    assert [t["applied"] for t in tries] == [True, False, True, False, True, True]
    # A dropped try moves no weight; the tries after it train again (the gradients are dropped only for it).
    assert [t["moved"] for t in tries] == [True, False, True, False, True, True]
    assert all(t["finite"] for t in tries)
    # The retry uses the lr of the try it replaces: the schedule did not advance.
    assert tries[1]["lr"] == tries[2]["lr"] and tries[3]["lr"] == tries[4]["lr"]
    schedule = load_config(PretrainConfig, "tiny", ["schedule.total_steps=4"]).schedule
    assert [t["lr"] for t in tries if t["applied"]] == pytest.approx(
        [0.01 * lr_multiplier(s, schedule) for s in range(4)], rel=1e-12)
    # Two bad tries with a good one between: not "2 in a row" (the limit), the run finishes.
    assert r["code"] == 0 and r["saves"] == [4]
    # Counted per micro-batch: 1, then 1 + 2.
    assert logged(r, "nonfinite_skipped") == [0, 1, 3, 3]


@pytest.mark.slow
def test_the_nonfinite_count_is_part_of_the_checkpoint(runs):
    resumed = ran(runs, "nonfinite_resumed")  # continues "nonfinite" from its step-4 checkpoint
    assert resumed["start"] == {"step": 4, "nonfinite_total": 3}
    assert resumed["code"] == 0 and resumed["metrics"][-1]["step"] == 5
    assert resumed["metrics"][-1]["nonfinite_skipped"] == 3


@pytest.mark.slow
def test_max_nonfinite_steps_in_a_row_stop_the_run(runs):
    r = ran(runs, "diverged")  # tries 2 and 3 each have one NaN micro-batch; the limit is 2
    assert [t["applied"] for t in r["tries"]] == [True, False]  # the second bad try raised
    assert r["code"].startswith("diverged: 2 steps in a row with a non-finite loss, at step 2;"), r["code"]
    assert r["saves"] == []


@pytest.mark.slow
def test_init_from_starts_a_fresh_run_and_its_resume_no_longer_reads_phase_1(runs):
    r = ran(runs, "phase2")
    assert r["start"] == {"step": 0, "nonfinite_total": 0} and r["code"] == 0
    # A fresh schedule (the peak lr at once: 5% warm-up of 2 steps rounds to none) and a fresh loader.
    assert r["tries"][0]["lr"] == 0.01 and logged(r, "samples") == [32, 64]
    # Phase 1's trained weights, not a fresh draw (the cadence run started from one)
    assert r["weight_sum"][0] == ran(runs, "cadence")["weight_sum"][1] != ran(runs, "cadence")["weight_sum"][0]

    resumed = ran(runs, "phase2_resumed")  # init_from now names nothing: the checkpoint holds the weights
    assert resumed["start"] == {"step": 2, "nonfinite_total": 0} and resumed["code"] == 0
    assert logged(resumed)[-1] == 3
