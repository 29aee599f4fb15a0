"""The local `--nproc` launcher on torch's elastic launch API, with real worker processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from launch.pretrain.launcher import launch_local

ENV_WORKER = """
import json, os, sys
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")
with open(os.path.join(sys.argv[1], os.environ["RANK"] + ".json"), "w") as f:
    json.dump({k: os.environ.get(k) for k in keys}, f)
"""

FAILING_WORKER = """
import os, sys, time
if os.environ["RANK"] == "1":
    sys.exit(3)
time.sleep(600)  # a survivor stuck (as in a collective with the dead rank): the launcher must stop it
"""

KILLED_WORKER = """
import os, signal, sys, time
if os.environ["RANK"] == "1":
    time.sleep(1)
    os.kill(os.getpid(), signal.SIGKILL)  # what the out-of-memory killer does
# The survivor errors out as it is stopped (a rank whose collective lost its peer exits 4): not the cause.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
time.sleep(600)
"""


# Each rank writes its own file (as each writes its optimizer shard into a checkpoint), then all meet
# in a barrier; the failing ones report through the worker's own handler. argv: DISK RANKS_THAT_WRITE_THERE
DISK_FULL_WORKER = """
import os, sys
from pathlib import Path
import torch.distributed as dist
from launch.log import setup_logging
from launch.pretrain.worker import report_fault
disk, full = Path(sys.argv[1]), sys.argv[2].split(",")
setup_logging()
dist.init_process_group("gloo")
dist.barrier()  # start together: the ranks meet the full disk at the same moment
rank = os.environ["RANK"]
try:
    if rank in full:
        (disk / f"optim_rank{rank}.pt").write_bytes(bytes(4 << 20))
    dist.barrier()
except Exception as err:
    code = report_fault(err, disk)  # the run directory, on the full disk
    sys.exit(5 if code is None else code)
"""


def test_workers_get_the_distributed_environment(tmp_path, monkeypatch):
    import tempfile

    worker = tmp_path / "env_worker.py"
    worker.write_text(ENV_WORKER)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    assert launch_local(3, [str(tmp_path)], program=[str(worker)]) == 0
    assert not list(scratch.iterdir())  # the agent's /tmp/torchelastic_*/ log tree, one per launch, is gone
    envs = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(3)]
    assert [e["RANK"] for e in envs] == ["0", "1", "2"] and [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2"]
    assert {e["WORLD_SIZE"] for e in envs} == {"3"} and len({e["MASTER_PORT"] for e in envs}) == 1
    assert all(e["OMP_NUM_THREADS"] for e in envs)  # set: unset, CPU training was 5x slower


def test_one_failing_worker_stops_the_others_and_its_code_is_returned(tmp_path):
    worker = tmp_path / "failing_worker.py"
    worker.write_text(FAILING_WORKER)
    start = time.monotonic()
    assert launch_local(2, [], program=[str(worker)]) == 3
    assert time.monotonic() - start < 60  # not the survivor's 600 s


def test_a_finished_lone_run_leaves_its_process_group(small_corpus, tmp_path, monkeypatch, capsys):
    # On CUDA an exit with the NCCL group still open warns that it "can leak resources" (seen at the end
    # of every run on an H200, 2026-11-26); the group of one the CLI makes must be gone once it returns.
    import torch.distributed as dist

    import logging

    from launch import cli
    from launch.pretrain.launcher import free_port

    # cli.main replaces the root logger's handlers: later tests in this process get theirs back.
    monkeypatch.setattr(logging.getLogger(), "handlers", list(logging.getLogger().handlers))
    for key, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(free_port())).items():
        monkeypatch.setenv(key, value)  # restored afterwards: the trainer would set them in this process
    # Nor is a C++ op built: DeepSpeed's CPU shm all-reduce op took a minute to compile on a fresh machine.
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    argv = ["pretrain", "--config", "tiny", "--data", str(small_corpus), "--out", str(tmp_path / "run"),
            "--max-steps", "2", "--save-every", "0", "--log.eval-every", "0"]
    assert cli.main(argv) == 0
    assert (tmp_path / "run" / "checkpoints").is_dir()
    assert not dist.is_initialized()
    assert not (tmp_path / "extensions").exists()
    # Nor when its own error ends it, after the group was made: a lone run exiting with its gloo group open
    # was seen to abort after its one-line error (exit -6, "terminate called without an active exception").
    resume = [*argv[:-6], "--resume", "--zero.stage", "2"]
    assert cli.main(resume) == 2
    assert "zero.stage differs from the checkpoint's" in capsys.readouterr().err
    assert not dist.is_initialized()


def test_a_worker_killed_from_outside_is_named_in_one_line_and_its_code_returned(tmp_path, caplog):
    worker = tmp_path / "killed_worker.py"
    worker.write_text(KILLED_WORKER)
    with caplog.at_level("ERROR", logger="launch.pretrain.launcher"):
        assert launch_local(2, [], program=[str(worker)]) == 137  # not the survivor's 1
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "worker rank 1 was killed by SIGKILL (exit 137): on Linux usually the kernel's " \
        "out-of-memory killer" in lines[0] and "--resume" in lines[0], lines


def test_the_cause_is_the_first_failure_seen_and_a_signal_exits_as_the_shell_says():
    from launch.pretrain.launcher import cause, exit_code

    # (rank, code) in the order the agent saw them fail; the ones it stopped come after the cause
    assert cause([(1, 3), (0, -15)]) == (1, 3) and cause([(0, -15), (1, 3)]) == (1, 3)  # seen together
    assert cause([(1, -9), (0, 1)]) == (1, -9)  # killed, then its peer failed: the kill is the cause
    # Seen by the same poll, in rank order: the rank that lost its peer (4) is not the cause...
    assert cause([(0, 4), (1, -9)]) == (1, -9) and cause([(0, 4), (1, 1), (2, -15)]) == (1, 1)
    assert cause([(0, 4), (1, -15)]) == (0, 4)  # ...unless the rank that stopped ran under another launcher
    assert cause([(0, -15), (1, -15)]) == (0, -15)  # SIGTERM before the workers' handlers were set
    assert exit_code(-15) == 143 and exit_code(-9) == 137 and exit_code(3) == 3 and exit_code(0) == 1


def test_the_process_group_waits_out_rank_zeros_corpus_check(monkeypatch):
    # Ranks wait in a collective while rank 0 hashes the corpus: DeepSpeed's 10-minute default timed
    # out on a large corpus over network storage, on every restart alike.
    import datetime

    import deepspeed
    import torch.distributed as dist

    from launch.pretrain import process_group

    seen = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(deepspeed, "init_distributed", lambda **kw: seen.append(kw["timeout"]))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("DEEPSPEED_TIMEOUT", raising=False)
    process_group.init_distributed()
    monkeypatch.setenv("DEEPSPEED_TIMEOUT", "5")
    process_group.init_distributed()
    assert seen == [datetime.timedelta(minutes=60), datetime.timedelta(minutes=5)]


def test_a_rank_started_by_mpirun_is_seen_as_under_a_launcher(monkeypatch):
    # `deepspeed --launcher openmpi --no_python bertpipe pretrain`: RANK is unset at start-up, and each
    # rank used to start --nproc workers of its own
    from launch.log import launcher_world_size

    for key in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(key, raising=False)
    assert launcher_world_size() is None
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "16")
    assert launcher_world_size() == 16
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert launcher_world_size() == 8


def test_only_a_collective_that_lost_its_peer_becomes_the_one_line(monkeypatch):
    import torch.distributed as dist

    from launch.pretrain.worker import lost_peer_message

    monkeypatch.setenv("RANK", "3")
    gloo = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:18817. This is "
                        "typically caused by a remote worker crashing.")
    assert lost_peer_message(gloo) == (
        "rank 3: a collective with the other ranks failed ([gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:18817); another rank stopped, and its own message or the launcher's says why")
    assert lost_peer_message(dist.DistBackendError("NCCL watchdog timeout")).startswith("rank 3: a collective")
    assert lost_peer_message(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None  # a bug: its traceback
    try:  # wrapped by the code that ran the collective (a save, say)
        try:
            raise gloo
        except RuntimeError as inner:
            raise OSError("could not save the checkpoint") from inner
    except OSError as wrapped:
        assert lost_peer_message(wrapped).startswith("rank 3: a collective with the other ranks failed ([gloo/")


def test_a_full_disk_met_by_one_rank_is_reported_once_whichever_ranks_meet_it(tmp_path, tmpfs, capfd):
    # Before, only rank 0 reported a full disk: rank 1 alone out of space exited without a word, and
    # rank 0 said that another rank stopped and "its own message says why".
    worker = tmp_path / "disk_full_worker.py"
    worker.write_text(DISK_FULL_WORKER)
    disk = tmpfs(1 << 20)
    for full in ("1", "0,1"):
        assert launch_local(2, [str(disk), full], program=[str(worker)]) == 1
        err = capfd.readouterr().err
        lines = [line for line in err.splitlines() if "no space left on device" in line]
        assert len(lines) == 1, err
        # the folder, and the file this process wrote there last (the error names none)
        assert f"while writing {disk} (the file written last there: {disk}/" in lines[0] and "--resume" in lines[0], lines
        if full == "1":
            assert "[rank1] ERROR" in lines[0]
        assert "Traceback" not in err, err
        for leftover in disk.iterdir():
            leftover.unlink()


# Rank 1 stops on an error of its own while rank 0 waits for it in a collective, so it cannot leave the
# group (see exit_if_in_group); 5 would mean that exit_if_in_group returned.
OWN_ERROR_WORKER = """
import os, sys
import torch.distributed as dist
from launch.pretrain.worker import exit_if_in_group
dist.init_process_group("gloo")
if os.environ["RANK"] == "1":
    exit_if_in_group(2, "rank 1: error: its own")
    sys.exit(5)
try:
    dist.barrier()
except Exception:
    os._exit(4)  # as the worker does when its collective lost its peer
"""


# Rank 0 meets a fault (not a user error) in a step it takes for every rank; rank 1 waits for its answer.
ON_RANK0_FAULT_WORKER = """
import os
import torch.distributed as dist
from launch.pretrain.process_group import RankZeroFailed, on_rank0
dist.init_process_group("gloo")
try:
    on_rank0(lambda: {}["config"])
except RankZeroFailed as err:
    print(err, flush=True)
    os._exit(4)
except KeyError:
    os._exit(1)
os._exit(5)
"""


def test_a_fault_on_rank_zero_in_a_step_for_every_rank_stops_the_others_with_it(tmp_path, capfd):
    # They waited for rank 0 in their next collective: under NCCL, for the collective timeout (60 min).
    worker = tmp_path / "on_rank0_fault_worker.py"
    worker.write_text(ON_RANK0_FAULT_WORKER)
    assert launch_local(2, [], program=[str(worker)]) == 1  # rank 0's own fault, not rank 1's 4
    assert "rank 0 failed in a step it took for every rank (KeyError: 'config')" in capfd.readouterr().out


def test_a_rank_stopped_by_its_own_error_exits_with_its_code_and_message_while_its_peers_wait(tmp_path, capfd):
    # It exits before the interpreter's shutdown, which with gloo's threads alive aborted it: exit 134 in
    # place of 2 (a CI run's resume refusal); the abort is intermittent, the exit path is checked here.
    worker = tmp_path / "own_error_worker.py"
    worker.write_text(OWN_ERROR_WORKER)
    assert launch_local(2, [], program=[str(worker)]) == 2
    assert "rank 1: error: its own" in capfd.readouterr().err


TORCHRUN = [sys.executable, "-m", "launch.pretrain.torchrun", "--standalone", "--nproc-per-node", "2"]

# A rank as the trainer is on SIGTERM: it checkpoints at its next step, then exits 128 + 15.
# Each line is one os.write (atomic on a pipe): print() writes text and newline apart, and the two
# workers' "started" lines interleaved into "startedstarted".
STOPPED_WORKER = """
import os, signal, sys, time
def stop(*_):
    os.write(1, f"rank {os.environ['RANK']} checkpointed\\n".encode())
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
os.write(1, b"started\\n")
time.sleep(600)
"""


def _torchrun(*argv: str) -> subprocess.CompletedProcess[str]:
    from repo_paths import REPO

    return subprocess.run([*TORCHRUN, *argv], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_torchrun_as_the_manifests_run_it_exits_with_the_workers_own_code(tmp_path):
    # Bare torchrun exits 1 whatever its workers did: Kubernetes restarted a run with a wrong flag as if
    # a node had failed. A user error is 2 on every rank, and a worker killed by a signal is named.
    done = _torchrun("--module", "launch.pretrain", "--config", "tiny", "--data", str(tmp_path / "no-corpus"),
                     "--out", str(tmp_path / "run"))
    assert done.returncode == 2, done.stderr
    assert f"{tmp_path / 'no-corpus'} has no manifest.json" in done.stderr and "Traceback" not in done.stderr
    assert "torchrun: 1:1 node(s) x 2 process(es), this node alone (--standalone)" in done.stderr
    worker = tmp_path / "killed_worker.py"
    worker.write_text(KILLED_WORKER)
    done = _torchrun(str(worker))
    assert done.returncode == 137, done.stderr
    assert "worker rank 1 was killed by SIGKILL (exit 137)" in done.stderr and "Traceback" not in done.stderr


def test_torchrun_stopped_as_a_pod_is_deleted_exits_143_once_its_workers_have_checkpointed(tmp_path):
    from repo_paths import REPO

    worker = tmp_path / "stopped_worker.py"
    worker.write_text(STOPPED_WORKER)
    proc = subprocess.Popen([*TORCHRUN, str(worker)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert [proc.stdout.readline().strip() for _ in range(2)] == ["started"] * 2  # both handlers are set
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert out.count("checkpointed") == 2, out
    assert "launch.pretrain.torchrun: torchrun was stopped by SIGTERM" in err and "Traceback" not in err, err


def test_only_a_value_error_bertpipe_raised_is_a_user_error(monkeypatch, tmp_path, caplog):
    # Exit 2 is final under Kubernetes (the JobSet and TrainJob fail at once): a library's own ValueError
    # (a closed file, a decoder's internals) is a fault with a traceback, exit 1, retried.
    import json

    from launch.errors import raised_by_bertpipe
    from launch.finetune.feature_extraction import parse_layers
    from launch.pretrain import worker

    def raising(fn):
        try:
            fn()
        except ValueError as err:
            return err
        raise AssertionError("no ValueError")

    ours, theirs = raising(lambda: parse_layers("bogus", 12)), raising(lambda: json.loads("{"))
    assert raised_by_bertpipe(ours) and not raised_by_bertpipe(theirs)
    monkeypatch.setattr(worker, "setup_logging", lambda *a, **k: None)
    argv = ["--config", "tiny", "--data", str(tmp_path), "--out", str(tmp_path / "run")]
    for err, expected in ((ours, 2), (theirs, None)):
        def build(_args, err=err):
            raise err

        monkeypatch.setattr(worker, "build_trainer", build)
        if expected is None:
            with pytest.raises(json.JSONDecodeError):
                worker.main(argv)
        else:
            with caplog.at_level("ERROR", logger="launch.pretrain.worker"):
                assert worker.main(argv) == expected
            assert "--layers 'bogus' is not one of" in caplog.text
