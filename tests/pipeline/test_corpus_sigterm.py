"""SIGTERM to `bertpipe corpus --direct_num_workers=2` alone (`kill PID`, `docker stop`, Kubernetes), through
the real CLI on the bundled Wikipedia dump.

Beam runs each SDK worker as `/bin/sh -c python -m ...sdk_worker_main`, and its clean-up after the interrupt
joins the thread waiting on that shell without a timeout. A worker that got no signal (only the main process
did) could wait forever for work that never came: about 1 SIGTERM in 2 during the job hung the command for
good, holding the --out lock, and a second SIGTERM left both workers behind as orphans.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import as_from_a_shell
from pipeline.output_lock import LOCK_NAME
from repo_paths import VOCAB, WIKI_DUMP

ARGS = ["--input", str(WIKI_DUMP), "--vocab", str(VOCAB), "--dupe-factor", "2", "--direct_num_workers=2"]
# Each stop is after both workers exist and have been given work, at a different moment of the job.
DELAYS_S = (1.0, 2.5, 4.0)
# A stopped job ends in about a second; the bound is for a slow, shared machine, far below forever.
STOP_BOUND_S = 30


def _descendants(root: int) -> dict[int, str]:
    """pid -> command line of every live (not zombie) process below `root`."""
    parent, state = {}, {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rindex(b")") + 2:].split()
            state[int(name)], parent[int(name)] = fields[0], int(fields[1])
    found, queue = {}, [root]
    while queue:
        for pid in [p for p, pp in parent.items() if pp == queue[0] and state[p] != b"Z"]:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    found[pid] = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            queue.append(pid)
        queue.pop(0)
    return found


def _alive(pid: int) -> bool:
    """Not ended (a zombie has ended; only its exit status waits to be collected by its new parent)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:].split()[0] != b"Z"


def _start(out, log) -> subprocess.Popen:
    return as_from_a_shell.popen([sys.executable, "-m", "launch.cli", "corpus", *ARGS, "--out", str(out)],
                                 stdout=subprocess.DEVNULL, stderr=log, env=dict(os.environ, OMP_NUM_THREADS="1"))


def _wait_for_workers(proc: subprocess.Popen, count: int = 2, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while sum("sdk_worker_main" in cmd for cmd in _descendants(proc.pid).values()) < count:
        assert proc.poll() is None, f"the corpus job ended (rc {proc.returncode}) before its workers started"
        assert time.monotonic() < deadline, "the corpus job's workers did not start"
        time.sleep(0.1)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the workers in /proc")
@pytest.mark.slow
def test_sigterm_with_worker_processes_exits_143_and_leaves_no_worker(tmp_path):
    out = tmp_path / "corpus"
    for attempt, delay in enumerate(DELAYS_S):
        log_path = tmp_path / f"stop{attempt}.err"
        with open(log_path, "w") as log:
            proc = _start(out, log)
        try:
            _wait_for_workers(proc)
            time.sleep(delay)
            assert proc.poll() is None, "the job ended before it could be stopped; give it more input"
            children = _descendants(proc.pid)
            os.kill(proc.pid, signal.SIGTERM)  # the main process alone, as `kill PID` and Kubernetes do
            try:
                code = proc.wait(timeout=STOP_BOUND_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"stop {attempt + 1} ({delay} s after the workers started): still running "
                            f"{STOP_BOUND_S} s after SIGTERM")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: the workers too
                proc.wait()
        err = log_path.read_text()
        assert code == 143, err
        left = {pid: cmd for pid, cmd in children.items() if _alive(pid)}
        assert not left, f"left running after the command ended: {left}"
        ours = [line for line in err.splitlines() if line.startswith("bertpipe corpus:")]
        assert len(ours) == 1 and ours[0].startswith("bertpipe corpus: stopped by SIGTERM; "), err
        assert "Traceback" not in err and "\nTerminated" not in err, err
        assert not (out / LOCK_NAME).exists() and not (out / "manifest.json").exists()
    # The lock is gone with the job: the same command runs again, to the end.
    with open(tmp_path / "again.err", "w") as log:
        proc = _start(out, log)
    try:
        assert proc.wait(timeout=300) == 0, (tmp_path / "again.err").read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert (out / "manifest.json").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the processes in /proc")
def test_sigterm_leaves_alone_a_process_bertpipe_did_not_start(tmp_path):
    # `sidecar & exec bertpipe corpus ...` (a container entrypoint) makes the sidecar bertpipe's child: every
    # descendant got the SIGTERM, then SIGKILL, though bertpipe never started it.
    cmd = (f"sleep 300 & exec {sys.executable} -m launch.cli corpus {' '.join(ARGS[:-1])} "
           f"--out {tmp_path / 'corpus'}")
    with open(tmp_path / "err", "w") as log:
        proc = as_from_a_shell.popen(["sh", "-c", cmd], stdout=subprocess.DEVNULL, stderr=log,
                                     env=dict(os.environ, OMP_NUM_THREADS="1"))
    sidecar: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "corpus" / LOCK_NAME).exists():  # the job is under way, its handler set
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "err").read_text()
            time.sleep(0.1)
        sidecar += [pid for pid, c in _descendants(proc.pid).items() if c.startswith("sleep 300")]
        assert len(sidecar) == 1
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=STOP_BOUND_S) == 143
        time.sleep(6)  # past the grace after which any worker left is SIGKILLed
        assert _alive(sidecar[0]), "the SIGTERM reached a process bertpipe did not start"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in filter(_alive, sidecar):
            os.kill(pid, signal.SIGKILL)
