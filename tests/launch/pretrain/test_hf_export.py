"""`bertpipe export` on a checkpoint folder laid out as `bertpipe pretrain` writes it (no ZeRO, fp32), so
no training is needed; the end-to-end export of a real run is in test_pretrain_e2e.py."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from launch import cli
from launch.checkpoint_dirs import META, file_records
from model import BertConfig, BertForPreTraining

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(998)]  # 1,003 pieces


def write_run(run: Path, **meta_changes) -> Path:
    """A one-checkpoint run whose model has 1,024 vocabulary rows for the 1,003-piece vocab.txt."""
    folder = run / "checkpoints" / "global_step10"
    folder.mkdir(parents=True)
    config = BertConfig.preset("tiny", vocab_size=1024)
    torch.manual_seed(0)
    torch.save({"module": BertForPreTraining(config).state_dict()}, folder / "mp_rank_00_model_states.pt")
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    meta = {"step": 10, "position": 80, "world_size": 1, "zero_stage": 0, "precision": "fp32",
            "config": {"data": {"global_batch_size": 8}, "optim": {"name": "adamw", "lr": 1e-4}},
            "bert_config": asdict(config), "corpus": {"lowercase": True}, **meta_changes}
    (folder / META).write_text(json.dumps({**meta, "files": file_records(folder)}))
    (run / "checkpoints" / "latest").write_text("global_step10\n")
    return run


def test_the_model_card_gives_the_exported_vocabulary_not_the_padded_rows(tmp_path):
    run = write_run(tmp_path / "run")
    assert cli.main(["export", str(run), "--out", str(tmp_path / "hf")]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["vocab_size"] == 1003
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "vocabulary 1003," in card and "1024" not in card


def test_metadata_without_the_model_shape_is_one_line_naming_the_file(tmp_path, capsys):
    # `bert_config` missing: export used to fail with a NameError traceback on the way to saying so.
    run = write_run(tmp_path / "run", bert_config=None)
    with pytest.raises(SystemExit) as exc:
        cli.main(["export", str(run), "--out", str(tmp_path / "hf")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    meta = run / "checkpoints" / "global_step10" / META
    assert f"{meta} lacks bert_config" in err and "damaged" in err and "Traceback" not in err
    assert not (tmp_path / "hf").exists()


def test_an_export_removes_the_folder_a_killed_export_of_the_same_out_left_and_nothing_else(tmp_path):
    # A killed export left `.OUT-xxxxxxxx/` (a whole model) beside OUT, and no later export removed it.
    import subprocess
    import sys

    run = write_run(tmp_path / "run")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stopped = tmp_path / f".hf.bertpipe-partial-{int(dead.stdout)}-abcd1234"
    running = tmp_path / f".hf.bertpipe-partial-{os.getpid()}-abcd1234"  # a live process's: not ours to touch
    users = tmp_path / ".hf-notes"
    for folder in (stopped, running, users):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"partial")
    assert cli.main(["export", str(run), "--out", str(tmp_path / "hf")]) == 0
    assert not stopped.exists() and running.is_dir() and users.is_dir()
    assert {p.name for p in tmp_path.iterdir() if p.name.startswith(".hf")} == {running.name, users.name}


def _held_by_another_export(lock: Path):
    """A live process of this host holding `lock` (the lock file an export of another spelling would write)."""
    import socket
    import subprocess
    import sys

    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    lock.write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname(), "command": "export",
                                "since": "then"}))
    return holder


def test_an_out_reached_by_a_link_is_locked_as_the_folder_it_leads_to(tmp_path, capsys):
    # `--out ea` and `--out ealink` (a link to ea) took two locks, `.ea.bertpipe.lock` and `.ealink.bertpipe.lock`,
    # and both exports wrote ea at once.
    from launch.export_dirs import export_lock_file

    run = write_run(tmp_path / "run")
    (tmp_path / "ea").mkdir()
    (tmp_path / "ealink").symlink_to("ea")
    (tmp_path / "up").symlink_to(".")
    lock = export_lock_file(tmp_path / "ea")
    for spelling in ("ealink", "up/ea", "up/ealink", "ea/../ea"):
        assert export_lock_file(tmp_path / spelling) == lock, spelling
    holder = _held_by_another_export(lock)
    try:
        for spelling in ("ealink", "up/ea"):
            with pytest.raises(SystemExit) as exc:
                cli.main(["export", str(run), "--out", str(tmp_path / spelling), "--overwrite"])
            err = capsys.readouterr().err
            assert exc.value.code == 2 and f"{tmp_path / spelling} is being written by `bertpipe export` (pid " \
                f"{holder.pid}" in err, err
    finally:
        holder.kill()
        holder.wait()
    assert list((tmp_path / "ea").iterdir()) == []


def test_an_export_into_an_empty_folder_of_the_users_keeps_that_folder(tmp_path, monkeypatch):
    # The empty folder was removed and the export renamed in its place: its mode (setgid 2750), group and
    # inode were lost; and through a link to an empty folder the export failed ("Not a directory").
    import stat

    from launch import export_dirs
    from launch.export_dirs import EXPORT_MARKER, is_export_of

    moved = []  # file by file, config.json (what makes it a model folder) and then the marker last
    move = export_dirs._move_file
    monkeypatch.setattr(export_dirs, "_move_file", lambda src, dst: moved.append(dst.name) or move(src, dst))
    run = write_run(tmp_path / "run")
    shared = tmp_path / "shared"
    shared.mkdir()
    group = 4242 if os.geteuid() == 0 else os.getegid()  # root may give any group; others their own
    os.chown(shared, -1, group)
    shared.chmod(0o2750)
    before = shared.stat()
    assert cli.main(["export", str(run), "--out", str(shared)]) == 0
    after = shared.stat()
    assert (after.st_ino, after.st_mode, after.st_gid) == (before.st_ino, before.st_mode, before.st_gid)
    assert stat.S_IMODE(after.st_mode) == 0o2750 and is_export_of(shared, run)
    marker = json.loads((shared / EXPORT_MARKER).read_text())
    assert sorted(p.name for p in shared.iterdir()) == sorted(marker["files"]) == sorted(moved)
    assert moved[-2:] == ["config.json", EXPORT_MARKER]
    assert {p.stat().st_gid for p in shared.iterdir()} == {group}  # as a file written into the folder would have
    assert not [p for p in tmp_path.iterdir() if "bertpipe-partial" in p.name]

    target = tmp_path / "disk" / "models"
    target.mkdir(parents=True)
    link = tmp_path / "elink"
    link.symlink_to(target)
    assert cli.main(["export", str(run), "--out", str(link)]) == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert is_export_of(target, run) and (target / "model.safetensors").is_file()


def test_a_link_to_nothing_as_out_is_refused_in_one_line_and_left_as_it_is(tmp_path, capsys):
    run = write_run(tmp_path / "run")
    link = tmp_path / "hf"
    link.symlink_to(tmp_path / "gone")
    with pytest.raises(SystemExit) as exc:
        cli.main(["export", str(run), "--out", str(link)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"--out {link} is a link to {tmp_path / 'gone'}, which does not exist" in err, err
    assert link.is_symlink() and os.readlink(link) == str(tmp_path / "gone") and not (tmp_path / "gone").exists()


def test_a_file_where_a_runs_export_goes_is_said_not_waited_on(tmp_path, monkeypatch):
    # `RUN/export/TAG` a file: the export's lock refused it as "a file" and resolve_checkpoint waited for
    # that lock forever, sleeping between tries.
    from launch import export_dirs

    run = write_run(tmp_path / "run")
    (run / "export").mkdir()
    (run / "export" / "global_step10").write_text("mine")

    def no_waiting(seconds):
        raise AssertionError("resolve_checkpoint waited on a lock that no one holds")

    monkeypatch.setattr(export_dirs.time, "sleep", no_waiting)
    with pytest.raises(ValueError, match=r"global_step10 is not a directory \(nor an export of .*\); move it aside and rerun"):
        export_dirs.resolve_checkpoint(run)
    assert (run / "export" / "global_step10").read_text() == "mine"
