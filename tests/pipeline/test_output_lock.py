"""One writer per output directory: the lock file refuses a live holder and takes over a dead one."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

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


def test_two_takers_of_one_stale_lock_do_not_both_hold_it(tmp_path, monkeypatch):
    """A and B judge the same dead holder's lock at once; A removes it and creates its own before B acts.
    B's plain unlink removed A's live lock and both wrote; now B finds A's lock in place and is refused."""
    out = tmp_path / "out"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _write_lock(out, dead.pid)
    a = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # A, alive, holding by then
    try:
        b = OutputLock(out, "pretrain")
        judged = b._stale

        def a_takes_over_while_b_judges(holder):
            stale = judged(holder)
            if holder.get("pid") == dead.pid:  # A's takeover lands between B's judgement and B's removal
                (out / LOCK_NAME).unlink()
                _write_lock(out, a.pid)
            return stale

        monkeypatch.setattr(b, "_stale", a_takes_over_while_b_judges)
        with pytest.raises(OutputLocked, match=rf"pid {a.pid} on "):
            b.acquire()
        assert json.loads((out / LOCK_NAME).read_text())["pid"] == a.pid  # A's lock is still in place
        assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]  # nothing left aside
    finally:
        a.kill()
        a.wait()


def test_another_hosts_lock_is_refused_with_the_way_out(tmp_path):
    out = tmp_path / "out"
    _write_lock(out, 1, host="some-other-node")
    with pytest.raises(OutputLocked, match=f"delete {out / LOCK_NAME}"):
        OutputLock(out, "sweep").acquire()


def test_the_holder_keeps_a_heartbeat(tmp_path, monkeypatch):
    from pipeline import output_lock

    monkeypatch.setattr(output_lock, "HEARTBEAT_S", 0.05)
    out = tmp_path / "out"
    with OutputLock(out, "sweep"):
        lock = out / LOCK_NAME
        os.utime(lock, (0, 0))
        deadline = time.monotonic() + 5
        while lock.stat().st_mtime == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert lock.stat().st_mtime > 0, "the holder did not refresh its lock"


def _remote_lock(out, heartbeat_s):
    out.mkdir(parents=True, exist_ok=True)
    (out / LOCK_NAME).write_text(json.dumps({"pid": 1, "host": "ray-head-x7k2p", "command": "sweep",
                                             "since": "then", "heartbeat_s": heartbeat_s}))


def test_another_hosts_lock_without_a_heartbeat_is_taken_over_and_with_one_refused(tmp_path, monkeypatch, caplog):
    """A retried RayJob (a new head pod) or a rescheduled pod finds its dead predecessor's lock."""
    from pipeline import output_lock

    monkeypatch.setattr(output_lock, "LEASE_S", 0.5)
    out = tmp_path / "dead"
    _remote_lock(out, 0.1)
    with caplog.at_level("WARNING"), OutputLock(out, "sweep"):
        assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert "(pid 1 on ray-head-x7k2p): not refreshed for 0 s, its holder is gone" in caplog.text

    live = tmp_path / "live"
    _remote_lock(live, 0.1)
    stop = threading.Event()

    def beat():  # the other host's holder, alive
        while not stop.wait(0.05):
            os.utime(live / LOCK_NAME)

    thread = threading.Thread(target=beat)
    thread.start()
    try:
        with pytest.raises(OutputLocked, match="ray-head-x7k2p"):
            OutputLock(live, "sweep").acquire()
    finally:
        stop.set()
        thread.join()


def test_a_reused_pid_on_the_same_host_does_not_hold_the_lock(tmp_path, caplog):
    """A restarted container keeps its hostname and starts pids afresh: the recorded pid may now be
    another live process, told apart by its start time."""
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname(), "command": "pretrain",
                                             "since": "then", "heartbeat_s": 15, "pid_start": "1"}))
    with caplog.at_level("WARNING"), OutputLock(out, "pretrain"):
        assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert "another process now" in caplog.text


def test_our_own_pid_from_before_a_restart_is_not_taken_for_ours(tmp_path, caplog):
    """The same hostname and the same pid as a predecessor (a restarted container): the lock was taken for this
    process's own, so no heartbeat ran and it stayed behind after the run."""
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": "pretrain",
                                             "since": "then", "heartbeat_s": 15, "pid_start": "1"}))
    with caplog.at_level("WARNING"), OutputLock(out, "pretrain") as lock:
        assert lock._owned and json.loads((out / LOCK_NAME).read_text())["pid_start"] != "1"
    assert "another process now" in caplog.text and not (out / LOCK_NAME).exists()


def test_release_leaves_a_lock_taken_over_by_another_process(tmp_path):
    """Judged stale (e.g. a long pause) and taken over meanwhile: the lock file is the new holder's, and a
    release that removed it would let a third process write beside that holder."""
    out = tmp_path / "out"
    lock = OutputLock(out, "corpus").acquire()
    other = {"pid": os.getppid(), "host": socket.gethostname(), "command": "pretrain", "argv": [],
             "since": "now", "heartbeat_s": 15, "pid_start": None}
    (out / LOCK_NAME).write_text(json.dumps(other))
    lock.release()
    assert json.loads((out / LOCK_NAME).read_text()) == other


def test_another_hosts_pid_is_not_looked_up_here(tmp_path):
    """A pid from another host that names no process here proves nothing: without a heartbeat to watch,
    the lock is refused, not taken over as a dead local holder's."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with pytest.raises(ProcessLookupError):
        os.kill(dead.pid, 0)
    out = tmp_path / "out"
    _write_lock(out, dead.pid, host="some-other-node")
    written = (out / LOCK_NAME).read_text()
    with pytest.raises(OutputLocked, match=f"pid {dead.pid} on some-other-node.*delete {out / LOCK_NAME}"):
        OutputLock(out, "corpus").acquire()
    assert (out / LOCK_NAME).read_text() == written


def test_a_remote_out_makes_no_local_folder(tmp_path, monkeypatch, capsys):
    # Path("gs://bucket/corpus") is the local "gs:/bucket/corpus": the lock made that folder in the working
    # directory (and was held there, not on the bucket), also when the job then failed.
    from launch import cli
    from repo_paths import BOOKS, VOCAB

    monkeypatch.chdir(tmp_path)
    with OutputLock("gs://bucket/corpus", "corpus") as lock:
        assert lock.remote
    with pytest.raises(SystemExit):  # no GCS file system installed here: refused in one line
        cli.main(["corpus", "--input", str(BOOKS[0]), "--vocab", str(VOCAB), "--out", "gs://bucket/corpus"])
    assert "Traceback" not in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def _held_by(lock, command="export"):
    """A live process of this host holding the lock file `lock`."""
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname(), "command": command, "since": "then"}))
    return holder


def test_a_lock_beside_an_output_is_one_for_every_spelling_of_it(tmp_path):
    """`--out ea` and `--out ealink` (a link to ea) took `.ea.bertpipe.lock` and `.ealink.bertpipe.lock`: both wrote."""
    from pipeline.output_lock import lock_beside

    (tmp_path / "ea").mkdir()
    (tmp_path / "ealink").symlink_to("ea")
    (tmp_path / "later").symlink_to("new")  # a link to a folder not made yet: the folder it will be
    (tmp_path / "up").symlink_to(".")
    assert lock_beside(tmp_path / "ea") == tmp_path / ".ea.bertpipe.lock"
    for spelling in ("ealink", "up/ea", "up/ealink", "ea/../ea", "up/up/ealink/"):
        assert lock_beside(tmp_path / spelling) == tmp_path / ".ea.bertpipe.lock", spelling
    assert lock_beside(tmp_path / "later") == lock_beside(tmp_path / "new") == tmp_path / ".new.bertpipe.lock"

    holder = _held_by(lock_beside(tmp_path / "ea"))
    try:
        with pytest.raises(OutputLocked, match=rf"^{re.escape(str(tmp_path / 'ealink'))} is being written by "
                                               rf"`bertpipe export` \(pid {holder.pid} "):
            OutputLock(tmp_path / "ealink", "export", lock_file=lock_beside(tmp_path / "ealink")).acquire()
    finally:
        holder.kill()
        holder.wait()


def test_a_stem_is_locked_in_its_real_folder_under_its_own_name(tmp_path):
    # features' --out names files OUT.npy, OUT.features.yaml: OUT itself may be anything (even a link) and is
    # never written, so only the folder it is in is resolved.
    from pipeline.output_lock import lock_beside

    (tmp_path / "fu").mkdir()
    (tmp_path / "fulink").symlink_to("fu")
    (tmp_path / "fu" / "plain").symlink_to(tmp_path / "elsewhere")
    lock = tmp_path / "fu" / ".plain.bertpipe.lock"
    assert lock_beside(tmp_path / "fu" / "plain", stem=True) == lock_beside(tmp_path / "fulink" / "plain", stem=True) \
        == lock


def test_a_lock_beside_a_file_leaves_the_file_to_its_command(tmp_path):
    # features --out fu/plain, plain a file: "is a file; pass a directory", where features' --out is a stem
    # (it writes plain.npy beside plain, and a directory is refused).
    from pipeline.output_lock import lock_beside

    plain = tmp_path / "plain"
    plain.write_text("mine")
    with OutputLock(plain, "features", lock_file=lock_beside(plain, stem=True)):
        assert (tmp_path / ".plain.bertpipe.lock").is_file()
    assert plain.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["plain"]
    with pytest.raises(OutputLocked, match=re.escape(f"--out {plain} is a file; pass a directory")):  # a folder's own lock
        OutputLock(plain, "corpus").acquire()


def test_a_lock_inside_a_linked_output_is_the_folders_own(tmp_path):
    """`OUT/.bertpipe.lock` (corpus, pretrain, finetune, sweep) is in the folder a link leads to: one lock."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    holder = _held_by(tmp_path / "real" / LOCK_NAME, "corpus")
    try:
        with pytest.raises(OutputLocked, match=rf"^{re.escape(str(tmp_path / 'link'))} is being written by `bertpipe corpus`"):
            OutputLock(tmp_path / "link", "corpus").acquire()
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_beside_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
    """Where a link as --out leads into a folder the user may not write, the lock (beside the folder it leads
    to) cannot be made: the message names --out as typed and the file that could not be written."""
    import errno

    from pipeline.output_lock import LockUnwritable, lock_beside

    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "ea").mkdir()
    (tmp_path / "ealink").symlink_to(tmp_path / "ro" / "ea")
    lock = lock_beside(tmp_path / "ealink")
    opened = os.open

    def read_only(path, *args, **kwargs):
        if str(path) == str(lock):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return opened(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(LockUnwritable) as exc:
        OutputLock(tmp_path / "ealink", "export", lock_file=lock).acquire()
    assert str(exc.value) == f"cannot write --out {tmp_path / 'ealink'}: Read-only file system: {lock}; choose " \
                             "another --out or make it writable"
