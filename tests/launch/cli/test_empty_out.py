"""An empty `--out ""` is refused in one line (argparse made it Path("") == ".": pretrain, download and the demo
wrote into the working directory without a word), with exit 2 as the commands' other usage errors."""

from __future__ import annotations

import pytest

from launch import cli

REFUSAL = "argument --out: is empty; name an output directory"


@pytest.mark.parametrize("argv", [
    ["pretrain", "--config", "tiny", "--data", "corpus", "--out", ""],
    ["download", "wikipedia", "--out", ""],
    ["download", "books", "--ids", "1342", "--out", ""],
    ["demo", "--out", "", "--steps", "2", "--nproc", "1", "--skip-sweep"],
], ids=["pretrain", "download-wikipedia", "download-books", "demo"])
def test_an_empty_out_is_refused_and_nothing_is_written(tmp_path, monkeypatch, capsys, argv):
    from launch.cli import demo, download

    monkeypatch.chdir(tmp_path)
    ran = []  # the command's work, in place of downloads and the demo's steps: reached only if --out was taken
    monkeypatch.setattr(demo, "_run", lambda args, out: ran.append(out) or 0)
    monkeypatch.setattr(download, "_wikipedia", lambda args, *rest: ran.append(args.out) or 0)
    monkeypatch.setattr(download, "_books", lambda args, *rest: ran.append(args.out) or 0)
    with pytest.raises(SystemExit) as err:
        cli.main(argv)
    assert err.value.code == 2 and ran == []
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f"error: {REFUSAL}")
    assert list(tmp_path.iterdir()) == []


def test_the_pretrain_worker_refuses_it_too(tmp_path, monkeypatch, capsys):
    # `deepspeed --module launch.pretrain` / torchrun: the same flags, parsed by the worker itself
    from launch.pretrain.worker import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as err:
        main(["--config", "tiny", "--data", "corpus", "--out", ""])
    assert err.value.code == 2 and capsys.readouterr().err.strip().endswith(f"error: {REFUSAL}")
    assert list(tmp_path.iterdir()) == []
