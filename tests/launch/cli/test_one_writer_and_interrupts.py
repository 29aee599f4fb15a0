"""One writer per --out, and Ctrl-C: through the real CLI on the bundled data (issue 11)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from launch import cli
from pipeline.manifest import sha256_file
from pipeline.output_lock import LOCK_NAME
import as_from_a_shell
from repo_paths import DATA, GLUE, VOCAB, WIKI_DUMP

CORPUS_ARGS = ["--input", str(DATA / "books" / "persuasion.txt"), str(WIKI_DUMP), "--vocab", str(VOCAB),
               "--seq-len", "64", "--dupe-factor", "1", "--num-shards", "2"]


def _refused(argv) -> None:
    """A user error: `bertpipe` exits 2 with its one-line message (argparse's parser.exit)."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2


def _start_corpus(out, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    err = open(tmp_path / f"{out.name}.err", "w+")
    proc = as_from_a_shell.popen([sys.executable, "-m", "launch.cli", "corpus", *CORPUS_ARGS, "--out", str(out)],
                                 stdout=subprocess.DEVNULL, stderr=err, env=env)
    return proc, err


def _wait_for(path, proc, timeout=120):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the corpus job ended (rc {proc.returncode}) before {path.name} appeared"
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.1)


def test_second_corpus_on_a_locked_out_is_refused_and_the_first_finishes_intact(tmp_path, capsys):
    out = tmp_path / "corpus"
    first, err = _start_corpus(out, tmp_path)
    try:
        _wait_for(out / LOCK_NAME, first)
        _refused(["corpus", *CORPUS_ARGS, "--out", str(out)])
        message = capsys.readouterr().err
        assert f"is being written by `bertpipe corpus` (pid {first.pid} on {socket.gethostname()}" in message
        assert first.wait(timeout=600) == 0, err.seek(0) or err.read()
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["num_instances"] > 0 and not (out / LOCK_NAME).exists()
    for shard in manifest["shards"]:
        assert sha256_file(out / shard["path"]) == shard["sha256"], shard["path"]


@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_on_corpus_is_one_line(tmp_path, stop):
    out = tmp_path / "interrupted"
    proc, err = _start_corpus(out, tmp_path)
    try:
        _wait_for(out / ".bertpipe-tmp", proc)  # the Beam job is running
        time.sleep(1.0)
        if stop == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
        else:
            os.kill(proc.pid, signal.SIGTERM)  # `kill PID`, or Kubernetes stopping a pod: the process alone
        assert proc.wait(timeout=120) == {"ctrl-c": 130, "sigterm": 143}[stop]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err.seek(0)
    lines = [line for line in err.read().splitlines() if " INFO " not in line]
    said = {"ctrl-c": "interrupted", "sigterm": "stopped by SIGTERM"}[stop]
    assert len(lines) == 1 and lines[0].startswith(f"bertpipe corpus: {said}; "), lines
    assert "no manifest.json" in lines[0] and not (out / "manifest.json").exists()
    assert not (out / LOCK_NAME).exists()


@pytest.fixture
def live_lock(tmp_path):
    """An output directory locked by a live process (a real pid on this host)."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    out = tmp_path / "locked"
    out.mkdir()
    (out / LOCK_NAME).write_text(json.dumps({"pid": sleeper.pid, "host": socket.gethostname(),
                                             "command": "finetune", "since": "now"}))
    yield out, sleeper.pid
    sleeper.kill()
    sleeper.wait()


@pytest.mark.parametrize("command", ["pretrain", "finetune", "sweep"])
def test_pretrain_finetune_sweep_refuse_a_locked_out(command, live_lock, small_corpus, tiny_checkpoint, capsys):
    out, pid = live_lock
    argv = {
        "pretrain": ["pretrain", "--config", "tiny", "--data", str(small_corpus), "--out", str(out)],
        "finetune": ["finetune", "--task", "sst2", "--data-dir", str(GLUE), "--checkpoint", str(tiny_checkpoint),
                     "--out", str(out)],
        "sweep": ["sweep", "--tasks", "sst2", "--data-dir", str(GLUE), "--checkpoint", str(tiny_checkpoint),
                  "--out", str(out), "--grid", "quick"],
    }[command]
    _refused(argv)
    assert f"is being written by `bertpipe finetune` (pid {pid}" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]  # nothing written next to the holder's files


def test_ctrl_c_while_the_command_imports_is_one_line(monkeypatch, capsys):
    """Building `corpus`'s parser imports Beam, seconds on a cold start: Ctrl-C then was a traceback."""
    from launch import cli

    def interrupted(command):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["corpus", "--help"]) == 130
    assert capsys.readouterr().err.strip() == "bertpipe corpus: interrupted before it started"


STUCK_AFTER_CTRL_C = """
import sys, threading, types
from launch import cli

def run(args):
    # A library's worker thread that will never finish (what held a sweep's exit after Ctrl-C in CI).
    threading.Thread(target=threading.Event().wait, name="stuck-library-thread").start()
    raise KeyboardInterrupt

stuck = types.ModuleType("stuck_command")
stuck.add_arguments, stuck.run = (lambda parser: None), run
sys.modules["stuck_command"] = stuck
cli.COMMANDS["stuck"] = ("stuck_command", "a command whose library thread hangs the exit")
cli.EXIT_GRACE_S = float(sys.argv[1])
sys.argv = ["bertpipe", "stuck"]
sys.exit(cli.main())
"""


def test_a_thread_that_never_ends_cannot_hold_the_exit_after_ctrl_c(tmp_path):
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", STUCK_AFTER_CTRL_C, "1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 130 and time.monotonic() - started < 30
    assert done.stderr.splitlines() == [
        "bertpipe stuck: interrupted; run the same command again to start over",
        "bertpipe stuck: still exiting after 1 s (waiting on threads: stuck-library-thread); ended the process"]


SIGTERM_ITSELF = """
import os, signal, sys, types
from launch import cli

when, marker = sys.argv[1:]

def run(args):
    with open(marker, "w") as out:  # a finally of the command's: SIGTERM used to skip it, dying at once
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            signal.pause()
        finally:
            out.write("cleaned up")

command = types.ModuleType("terminated_command")
command.add_arguments, command.run = (lambda parser: None), run
command.ON_INTERRUPT = "run it again"
sys.modules["terminated_command"] = command
cli.COMMANDS["terminated"] = ("terminated_command", "gets SIGTERM")
if when == "while-importing":
    def build_parser(name):
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()
    cli.build_parser = build_parser
sys.argv = ["bertpipe", "terminated"]
sys.exit(cli.main())
"""


@pytest.mark.parametrize("when", ["while-running", "while-importing"])
def test_sigterm_stops_a_command_as_ctrl_c_does_with_exit_143(tmp_path, when):
    """`kill PID` (or Kubernetes stopping a pod) killed export, features, finetune, corpus and download at
    once: no line, no cleanup; and a container's PID 1 ignored it until SIGKILL."""
    marker = tmp_path / "marker"
    done = subprocess.run([sys.executable, "-c", SIGTERM_ITSELF, when, str(marker)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 143
    if when == "while-running":
        assert done.stderr.splitlines() == ["bertpipe terminated: stopped by SIGTERM; run it again"]
        assert marker.read_text() == "cleaned up"
    else:
        assert done.stderr.splitlines() == ["bertpipe terminated: stopped by SIGTERM before it started"]


def test_a_sigterm_handler_of_the_caller_s_is_kept():
    """Only a default SIGTERM is replaced: a program embedding bertpipe keeps its own handler."""
    code = ("import signal, sys; from launch import cli; mine = lambda *a: None; signal.signal(signal.SIGTERM, mine); "
            "cli._stop_on_sigterm(); sys.exit(0 if signal.getsignal(signal.SIGTERM) is mine else 1)")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_main_called_with_argv_leaves_its_caller_s_exit_alone(monkeypatch, capsys):
    """Only the process's entry point bounds its exit: a test or a notebook calling main(argv) keeps running."""
    import threading
    from launch import cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "EXIT_GRACE_S", 0)
    module = type(sys)("interrupted_command")
    module.add_arguments, module.run = (lambda parser: None), interrupted
    monkeypatch.setitem(sys.modules, "interrupted_command", module)
    monkeypatch.setitem(cli.COMMANDS, "interrupted", ("interrupted_command", "raises KeyboardInterrupt"))
    assert cli.main(["interrupted"]) == 130
    assert "bertpipe-exit-timer" not in [t.name for t in threading.enumerate()]
    assert capsys.readouterr().err.startswith("bertpipe interrupted: interrupted; ")
