"""Expensive test inputs (a corpus, a reference pre-training run) built once per test run.

`make test` runs two pytest-xdist workers. A session fixture is made once per worker, and a module
fixture again each time the longest-first order (conftest.py) comes back to its module: the shared
corpus and the reference runs were built two to four times a run. `built_once` builds into the run's
temp folder, which the workers share; whichever asks first builds while the others wait on a file lock.
Callers only read what was built (tests that damage a run copy it first).
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path
from typing import Callable

import pytest


def built_once(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """`build(path)` makes `path` (which does not exist yet) unless this test run already made it."""
    # A plain name keeps `path`, and the removal of a failed build below, inside this run's temp folder.
    if Path(name).name != name or name in (".", ".."):
        raise ValueError(f"built_once needs a plain folder name, not {name!r}")
    base = factory.getbasetemp()
    # Under xdist each worker's basetemp is <run>/popen-gwN; <run> is shared by the workers of this run only.
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "built_once"
    root.mkdir(exist_ok=True)
    out, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this worker dies
        if not done.exists():
            if out.exists():  # what a failed build of this run left (the done marker is missing)
                shutil.rmtree(out)
            build(out)
            assert out.exists(), f"building {name} made nothing at {out}"
            done.touch()
    return out
