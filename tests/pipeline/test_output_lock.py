"""One writer per output directory: the lock file refuses a live holder and takes over a dead one."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from pipeline.output_lock import LOCK_NAME, OutputLock, OutputLocked


def _write_lock(out, pid, host=None):
    out.mkdir(parents=True, exist_ok=True)
    (out / LOCK_NAME).write_text(json.dumps({"pid": pid, "host": host or socket.gethostname(),
                                             "command": "corpus", "since": "then"}))


def test_lock_is_taken_and_released(tmp_path):
    out = tmp_path / "out"
    with OutputLock(out, "corpus"):
        holder = json.loads((out / LOCK_NAME).read_text())
        assert holder["pid"] == os.getpid() and holder["command"] == "corpus"
        with OutputLock(out, "corpus"):  # the same process again (CLI around a library call): allowed
            pass
        assert (out / LOCK_NAME).exists(), "the inner `with` must not release the outer lock"
    assert not (out / LOCK_NAME).exists()


def test_a_live_holder_is_refused_by_name(tmp_path):
    out = tmp_path / "out"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _write_lock(out, sleeper.pid)
        with pytest.raises(OutputLocked, match=rf"being written by `bertpipe corpus` \(pid {sleeper.pid} on .*another --out"):
            OutputLock(out, "pretrain").acquire()
        assert json.loads((out / LOCK_NAME).read_text())["pid"] == sleeper.pid  # untouched
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_dead_holder_is_taken_over_with_a_warning(tmp_path, caplog):
    out = tmp_path / "out"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _write_lock(out, dead.pid)
    with caplog.at_level("WARNING"), OutputLock(out, "finetune"):
        assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert "no longer running" in caplog.text


def test_another_hosts_lock_is_refused_with_the_way_out(tmp_path):
    out = tmp_path / "out"
    _write_lock(out, 1, host="some-other-node")
    with pytest.raises(OutputLocked, match=f"delete {out / LOCK_NAME}"):
        OutputLock(out, "sweep").acquire()
