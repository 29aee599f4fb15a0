"""A sweep's progress as one log line per trial event, in place of Ray Tune's own output.

Tune's default output prints a ~50-line table of the whole config as each trial starts, a ~20-line
table of its result as it ends, and the status of every trial every 30 s: some 500 lines for the
demo's six trials, in which its own results were hard to find. Here a trial starting, finishing,
crashing (and being retried) or being refused is one line, with the count of finished trials.
Imported by `tune_sweep` only once Ray is running (Ray is slow to import).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Callable, Iterator

from ray.tune import Callback

from launch.environ import restoring_environ

logger = logging.getLogger(__name__)


class SweepProgress(Callback):
    """`name(point)` names a trial (and its folder under `tune_dir`); `metric(point)` is the task's dev
    metric behind its "score"; a result holding `refused_key` is a refusal (bad input, reported, not raised)."""

    def __init__(self, total: int, tune_dir: Path, name: Callable[[dict], str], metric: Callable[[dict], str],
                 refused_key: str):
        self.total, self.finished, self.tune_dir = total, 0, tune_dir
        self.name, self.metric, self.refused_key = name, metric, refused_key

    def _say(self, level: int, trial, what: str) -> None:
        logger.log(level, "[%d/%d] %s %s", self.finished, self.total, self.name(trial.config["point"]), what)

    def _crash(self, trial) -> str:
        """The exception's own line (the traceback's last) and where the whole traceback is kept."""
        try:
            lines = [line for line in Path(trial.error_file).read_text().splitlines() if line.strip()]
        except (OSError, TypeError):
            lines = []
        where = self.tune_dir / self.name(trial.config["point"]) / "error.txt"
        return f"({lines[-1].strip() if lines else 'no error text'}; traceback in {where})"

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        self._say(logging.INFO, trial, "started")

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self.finished += 1
        result = trial.last_result or {}
        if result.get(self.refused_key):
            self._say(logging.WARNING, trial, f"refused: {result[self.refused_key]}")
            return
        score, seconds = result.get("score"), result.get("train_seconds")
        shown = f"dev {self.metric(trial.config['point'])} {score:.4f}" if isinstance(score, (int, float)) else "no dev score"
        took = f" after {seconds:.0f} s of training" if isinstance(seconds, (int, float)) else ""
        self._say(logging.INFO, trial, f"finished: {shown}{took}")

    def on_trial_recover(self, iteration, trials, trial, **info) -> None:
        self._say(logging.WARNING, trial, f"crashed on attempt {trial.num_failures} {self._crash(trial)}; running it again")

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self.finished += 1
        self._say(logging.ERROR, trial, f"failed after {trial.num_failures} attempt(s) {self._crash(trial)}")


@contextlib.contextmanager
def quiet_tune(env: dict[str, str]) -> Iterator[None]:
    """While a sweep runs: `env` set (only those keys restored after), Tune's console reporter off (the
    legacy one, at verbose=0, prints nothing), and the tune controller's log of each crash's traceback
    (kept in the trial's error.txt, which our line names) silenced."""
    env = {**env, "RAY_AIR_NEW_OUTPUT": "0"}
    controller = logging.getLogger("ray.tune.execution.tune_controller")
    level = controller.level
    controller.setLevel(logging.CRITICAL)
    try:
        with restoring_environ(*env):
            os.environ.update(env)
            yield
    finally:
        controller.setLevel(level)


def quiet_stop_by_ray() -> None:
    """In a trial's worker process. Ray stops a worker with SIGTERM, whose handler raises SystemExit; when
    that lands inside a weakref callback Python cannot raise it and prints "Exception ignored in ...
    Traceback ... SystemExit: 1", which Ray forwards into the sweep's output (seen once in four runs of a
    retried trial). Such an exit is let go quietly, as Python lets it go anyway; any other exception
    that cannot be raised is reported as before."""
    previous = sys.unraisablehook
    if getattr(previous, "bertpipe_quiet_stop", False):  # a reused worker: installed already
        return

    def hook(unraisable) -> None:
        if unraisable.exc_type is None or not issubclass(unraisable.exc_type, SystemExit):
            previous(unraisable)

    hook.bertpipe_quiet_stop = True
    sys.unraisablehook = hook
