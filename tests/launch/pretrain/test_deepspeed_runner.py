"""`python -m launch.pretrain.deepspeed_runner`: DeepSpeed's own runner, whose exit a scheduler can read.

Real runner, real launchers (DeepSpeed's local launcher, and mpirun where Open MPI is installed), a real
SIGKILL. The bare `deepspeed` command exits 0 in the killed cases (checked by hand with DeepSpeed 0.19.8:
its runner passes on only a positive code), so a Kubernetes job would count the unfinished run as done.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import psutil
import pytest

from repo_paths import REPO

# mpirun refuses to start as root without both (CI containers run as root).
ENV = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
# The program stands in for the ranks: no local-rank argument, no python (`--no_python`).
PROGRAM = ["--no_python", "--no_local_rank"]


def _runner(*argv: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "launch.pretrain.deepspeed_runner", *argv], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _launcher_flags(launcher: str, tmp_path) -> list[str]:
    if launcher == "local":
        return []
    if shutil.which("mpirun") is None:
        pytest.skip("Open MPI's mpirun is not installed here (Dockerfile.cuda installs it)")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=1\n")
    return ["--hostfile", str(hostfile), "--master_addr", "127.0.0.1", "--force_multi", "--launcher", "openmpi",
            "--no_ssh_check"]


@pytest.mark.parametrize("launcher, named", [("local", "DeepSpeed's local launcher"), ("openmpi", "mpirun")])
def test_a_killed_launcher_is_an_exit_137_not_0(launcher: str, named: str, tmp_path) -> None:
    proc = _runner(*_launcher_flags(launcher, tmp_path), *PROGRAM, "sleep", "300")
    me, left = psutil.Process(proc.pid), []
    deadline = time.monotonic() + 120
    try:
        while not any(p.name() == "sleep" for p in me.children(recursive=True)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=10)[0]
            time.sleep(0.2)
        started = me.children()  # the one process the runner starts: the local launcher, or mpirun
        left = me.children(recursive=True)
        assert len(started) == 1, started
        started[0].kill()  # as the out-of-memory killer would
        proc.wait(timeout=60)
    finally:
        for p in left if proc.poll() is not None else [me, *left]:  # the orphaned `sleep` holds our pipe
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 137, out
    assert named in out and "was killed by SIGKILL (exit 137)" in out and "--resume" in out, out
    assert "Traceback" not in out, out


def test_an_exit_code_of_the_ranks_passes_through(tmp_path) -> None:
    # A user error (2) or a diverged run (3) must reach the TrainJob's podFailurePolicy unchanged.
    proc = _runner(*PROGRAM, "sh", "-c", "exit 3")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 3, out
    assert "was killed" not in out, out


def test_a_rank_killed_under_the_local_launcher_is_named_and_137_not_247(tmp_path) -> None:
    # The local launcher exits sys.exit(-9) for it, which the shell reads as 247 (the dev TrainJob's path: one node).
    proc = _runner(*PROGRAM, "sh", "-c", "kill -9 $$")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 137, out
    assert "a rank under DeepSpeed's local launcher was killed by SIGKILL (exit 137)" in out and "Traceback" not in out


def test_a_hostfile_it_refuses_is_one_line_and_a_user_error(tmp_path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-1 slots=8\nnode-1 slots=8\n")
    proc = _runner("--hostfile", str(hostfile), "--launcher", "openmpi", *PROGRAM, "true")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out
    assert "deepspeed runner: Hostfile contains multiple entries for node-1" in out and "Traceback" not in out, out


def test_the_bertpipe_command_takes_the_local_rank_the_launcher_puts_before_its_name() -> None:
    # `deepspeed --no_python bertpipe pretrain ...` starts `bertpipe --local_rank=N pretrain ...` on each rank,
    # which was refused: "unknown command '--local_rank=0'", exit 2.
    bertpipe = os.path.join(os.path.dirname(sys.executable), "bertpipe")
    proc = _runner("--num_gpus", "2", "--no_python", bertpipe, "pretrain", "--help")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert out.count("usage: bertpipe pretrain") == 2 and "unknown command" not in out, out
