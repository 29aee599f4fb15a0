"""An input folder the user cannot list is refused before the job starts, never passed over silently."""

from __future__ import annotations

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
    (tmp_path / "in" / "sub1").mkdir(parents=True)
    (tmp_path / "in" / "sub2").mkdir()
    (tmp_path / "in" / "sub1" / "a.txt").write_text("The first book. It is short.\n")
    (tmp_path / "in" / "sub2" / "b.txt").write_text("The second book. It is short too.\n")
    return tmp_path / "in"


@pytest.mark.parametrize("pattern", ["in", "in/**", "in/*", "in/**/*.txt"])
def test_an_unlistable_subfolder_is_refused_by_name(tmp_path, monkeypatch, pattern):
    # Stands in for a folder that cannot be listed (the tests run as root): os.walk's own listing fails.
    sub2 = str(_tree(tmp_path) / "sub2")
    real_scandir = os.scandir

    def scandir(path="."):
        if os.path.abspath(os.fspath(path)) == sub2:
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(ValueError, match=r"^input directory in/sub2 is not readable \(check its permissions\)$"):
        expand_inputs([pattern])


@pytest.mark.skipif(_AS_A_USER != [] and shutil.which("setpriv") is None,
                    reason="as root it needs util-linux setpriv to drop the capabilities that read a chmod 000 folder")
def test_the_cli_refuses_an_input_folder_it_cannot_read(tmp_path):
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
    assert run.returncode != 0
    assert "input directory in/sub2 is not readable (check its permissions)" in run.stderr + run.stdout
    assert not (tmp_path / "out").exists()
