"""An input folder the user cannot list is never passed over silently: the input itself is refused, a folder
below it left out with a warning naming it (a mount's root-only lost+found quietly)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.sources import expand_inputs
from repo_paths import VOCAB

# Root reads a chmod 000 folder anyway: as root the CLI runs without the capabilities that let it, as a user.
_AS_A_USER = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"] if os.geteuid() == 0 else []


def _tree(tmp_path):
    for sub in ("sub1", "sub2", "lost+found"):
        (tmp_path / "in" / sub).mkdir(parents=True)
    (tmp_path / "in" / "sub1" / "a.txt").write_text("The first book. It is short.\n")
    (tmp_path / "in" / "sub2" / "b.txt").write_text("The second book. It is short too.\n")
    return tmp_path / "in"


def _unlistable(monkeypatch, *folders: Path) -> None:
    """Stands in for folders that cannot be listed (the tests run as root): os.walk's own listing fails."""
    real_scandir = os.scandir
    refused = {str(f) for f in folders}

    def scandir(path="."):
        if os.path.abspath(os.fspath(path)) in refused:
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)


@pytest.mark.parametrize("pattern", ["in", "in/**", "in/*", "in/**/*.txt"])
def test_an_unlistable_subfolder_is_left_out_by_name_and_lost_and_found_quietly(tmp_path, monkeypatch, caplog, pattern):
    inputs = _tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    _unlistable(monkeypatch, inputs / "sub2", inputs / "lost+found")
    with caplog.at_level(logging.WARNING, logger="pipeline.sources"):
        assert expand_inputs([pattern]) == ["in/sub1/a.txt"]
    warned = [r.getMessage() for r in caplog.records if "cannot be listed" in r.getMessage()]
    assert len(warned) == 1 and "in/sub2" in warned[0] and "lost+found" not in warned[0], warned


def test_an_unlistable_input_folder_is_refused(tmp_path, monkeypatch):
    inputs = _tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    _unlistable(monkeypatch, inputs)
    with pytest.raises(ValueError, match=r"^input directory in is not readable \(check its permissions\)$"):
        expand_inputs(["in"])


@pytest.mark.skipif(_AS_A_USER != [] and shutil.which("setpriv") is None,
                    reason="as root it needs util-linux setpriv to drop the capabilities that read a chmod 000 folder")
def test_the_cli_names_an_input_folder_it_cannot_read(tmp_path):
    # `chmod 000 in/sub2`: the job ran on, "1 input files", exit 0, b.txt left out without a word.
    inputs = _tree(tmp_path)
    os.chmod(inputs / "sub2", 0)
    try:
        probe = subprocess.run([*_AS_A_USER, "ls", str(inputs / "sub2")], capture_output=True)
        if probe.returncode == 0:
            pytest.skip("the chmod 000 folder is still readable here (setpriv could not drop the capabilities)")
        bertpipe = str(Path(sys.executable).with_name("bertpipe"))
        run = subprocess.run([*_AS_A_USER, bertpipe, "corpus", "--vocab", str(VOCAB), "--input", "in", "--out", "out",
                              "--dupe-factor", "1"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    finally:
        os.chmod(inputs / "sub2", 0o755)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "not reading 1 folder(s) under in that cannot be listed (check their permissions): in/sub2" in run.stderr
