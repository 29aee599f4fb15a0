"""`demo --fresh` deletes only what an earlier demo wrote (issue 11: never delete what bertpipe did not create)."""

from __future__ import annotations

import pytest

from launch.cli.demo import MARKER, _clear_previous_demo
from launch.errors import CliError


def test_fresh_refuses_a_folder_the_demo_did_not_write(tmp_path):
    (tmp_path / "thesis.tex").write_text("mine")
    with pytest.raises(CliError, match="was not written by `bertpipe demo`"):
        _clear_previous_demo(tmp_path)
    assert (tmp_path / "thesis.tex").read_text() == "mine"


def test_fresh_deletes_the_demo_outputs_and_keeps_the_rest(tmp_path):
    (tmp_path / MARKER).write_text("demo")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "loss.png").write_bytes(b"png")
    (tmp_path / "notes.txt").write_text("mine")
    _clear_previous_demo(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
