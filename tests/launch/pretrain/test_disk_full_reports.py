"""A write that does not fit is a fault said in one line naming the file: under a file-size limit (`ulimit -f`),
and in `--resume`'s conversion to DeepSpeed's universal format (run as a child process), whose failure was a
30-line traceback, exit 2 (a user error) and a half-written folder left filling the disk.

The limits are real: a child process under a small RLIMIT_FSIZE (no mount needed), where torch's stream fails
with its opaque error; and a small tmpfs for a full disk (the `tmpfs` fixture: root only, else skipped). The
conversions are DeepSpeed's own, of a real ZeRO-2 checkpoint (`zero2_run`).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import shutil
import textwrap
from pathlib import Path

import pytest

from repo_paths import REPO
from zero2_run import STEPS, zero2_run

LIMIT = 256 * 1024  # bytes: RLIMIT_FSIZE of the child processes; the files below are larger
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process


def _run_limited(script: str, *args: str) -> dict:
    """`script` in a child process under the file-size limit; what it printed last, as JSON."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True, text=True,
                          env=ENV, cwd=REPO, timeout=300, preexec_fn=_limited)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def checkpoints(small_corpus, tmp_path_factory, tmp_path) -> Path:
    """A copy of a real ZeRO-2 run's last checkpoint (2 ranks), as `RUN/checkpoints/global_step8`."""
    ckpt_dir = tmp_path / "run" / "checkpoints"
    source = zero2_run(small_corpus, tmp_path_factory) / "checkpoints" / f"global_step{STEPS}"
    shutil.copytree(source, ckpt_dir / TAG)
    return ckpt_dir


TAG = f"global_step{STEPS}"


def test_a_torch_save_cut_by_a_file_size_limit_names_the_file_and_the_limit(tmp_path):
    # torch's stream says no errno ("unexpected pos ..." / "iostream error"): the message named only the folder
    # and guessed "a quota or a file-size limit may be reached".
    run = tmp_path / "run"
    said = _run_limited("""
        import json, sys, torch
        from pathlib import Path
        from launch.errors import disk_full_message
        path = Path(sys.argv[1]) / "checkpoints" / ".staging-global_step4" / "global_step4" / "optim_states.pt"
        path.parent.mkdir(parents=True)
        try:
            torch.save({"exp_avg": torch.zeros(1 << 20)}, path)
        except Exception as err:
            print(json.dumps({"error": str(err), "message": disk_full_message(err, Path(sys.argv[1])),
                              "size": path.stat().st_size, "file": str(path)}))
        """, str(run))
    assert "File too large" not in said["error"] and "errno" not in said["error"].lower(), said  # torch's opaque words
    assert said["size"] == LIMIT
    assert said["message"] == (
        f"file too large while writing {said['file']}: it reached this process's file-size limit of {LIMIT} bytes "
        "(`ulimit -f`); raise it (`ulimit -f unlimited`), then run the same command again")


def test_an_opaque_write_error_with_space_left_names_the_file_written_last(tmp_path):
    from launch.errors import disk_full_message

    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "config.yaml").write_text("x: 1\n")
    os.utime(tmp_path / "config.yaml", (1, 1))  # not written by this process
    (tmp_path / "checkpoints" / "model_states.pt").write_bytes(b"PK")
    err = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1075328 vs 1075216")
    assert disk_full_message(err, str(tmp_path)).startswith(
        f"writing {tmp_path} (the file written last there: {tmp_path / 'checkpoints' / 'model_states.pt'}) failed "
        "([enforce fail at inline_container.cc:672] . unexpected pos 1075328 vs 1075216) with space left on its disk")


def test_a_universal_conversion_past_a_file_size_limit_is_a_one_line_fault_and_its_folder_is_deleted(checkpoints):
    # DeepSpeed's ds_to_universal, run as a child process (inheriting the limit), on a real checkpoint.
    said = _run_limited("""
        import json, sys
        from pathlib import Path
        from launch.errors import disk_full_message
        from launch.pretrain import checkpoints, worker
        ckpt_dir = Path(sys.argv[1])
        try:
            checkpoints.convert_to_universal(ckpt_dir, sys.argv[2])
        except Exception as err:
            print(json.dumps({"type": type(err).__name__, "said": disk_full_message(err, ckpt_dir.parent),
                              "exit": worker.report_fault(err, ckpt_dir.parent)}))
        """, str(checkpoints), TAG)
    staging = checkpoints / f".staging-{TAG}_universal"
    assert said["type"] == "WriteDidNotFit" and said["exit"] == 1, said  # a fault: exit 1, worth a retry
    assert said["said"].startswith(f"file too large while writing {staging}{os.sep}"), said
    assert said["said"].endswith(f": it reached this process's file-size limit of {LIMIT} bytes (`ulimit -f`); raise "
                                 "it (`ulimit -f unlimited`), then run the same command again"), said
    assert "\n" not in said["said"] and not staging.exists() and sorted(p.name for p in checkpoints.iterdir()) == [TAG]


def test_a_universal_conversion_on_a_full_disk_is_a_one_line_fault_and_frees_the_disk(checkpoints, tmpfs):
    from launch.errors import WriteDidNotFit
    from launch.pretrain.checkpoints import convert_to_universal

    size = sum(f.stat().st_size for f in (checkpoints / TAG).iterdir())
    disk = tmpfs(size + 2 * 1024 * 1024)  # the checkpoint and 2 MiB: less than its conversion needs
    ckpt_dir = Path(shutil.copytree(checkpoints, disk / "checkpoints"))
    with pytest.raises(WriteDidNotFit) as raised:
        convert_to_universal(ckpt_dir, TAG)
    staging = ckpt_dir / f".staging-{TAG}_universal"
    said = str(raised.value)
    assert said.startswith(f"no space left on device while writing {staging}") and "\n" not in said, said
    assert said.endswith("free some space, then run the same command again"), said
    assert not staging.exists() and os.statvfs(disk).f_bfree * os.statvfs(disk).f_frsize > 1024 * 1024


def test_a_universal_conversion_that_fails_otherwise_is_one_line_a_user_error(checkpoints):
    from launch.errors import raised_by_bertpipe
    from launch.pretrain.checkpoints import convert_to_universal

    (checkpoints / TAG / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()  # rank 1's optimizer state gone
    with pytest.raises(ValueError) as raised:
        convert_to_universal(checkpoints, TAG)
    said = str(raised.value)
    assert said.startswith(f"converting {checkpoints / TAG} to a universal checkpoint failed (") and "\n" not in said
    assert said.endswith("); resume with the original number of processes instead"), said
    assert raised_by_bertpipe(raised.value)  # the trainer's user-error path: exit 2
    assert not (checkpoints / f".staging-{TAG}_universal").exists()
