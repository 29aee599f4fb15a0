"""Which files a fine-tuning rerun may delete from --out: only those a record proves an earlier run wrote."""

from __future__ import annotations

import json

import pytest

from launch.finetune.out_files import RECORD, clear_earlier_run, has_record, record_written

NAMES = ("config.yaml", "metrics.json", "predictions")


def _fill(out):
    (out / "predictions").mkdir(parents=True)
    (out / "predictions" / "dev.tsv").write_text("0\n")
    (out / "metrics.json").write_text("{}")
    (out / "config.yaml").write_text("task: sst2\n")


def test_without_a_record_nothing_is_deleted_and_a_clash_is_refused(tmp_path):
    _fill(tmp_path)
    assert not has_record(tmp_path)
    with pytest.raises(FileExistsError, match="which bertpipe did not write"):
        clear_earlier_run(tmp_path, NAMES, writes={"metrics.json"})
    kept = clear_earlier_run(tmp_path, NAMES, writes={"other.json"})
    assert kept == ["config.yaml", "metrics.json", "predictions/dev.tsv"]
    assert (tmp_path / "predictions" / "dev.tsv").is_file() and has_record(tmp_path)


def test_a_finished_run_s_files_are_deleted_and_the_user_s_kept(tmp_path):
    clear_earlier_run(tmp_path, NAMES)  # a run starts in an empty folder
    _fill(tmp_path)
    record_written(tmp_path, NAMES, [])
    assert has_record(tmp_path)
    (tmp_path / "predictions" / "notes.txt").write_text("mine")
    assert clear_earlier_run(tmp_path, NAMES, writes={"metrics.json"}) == ["predictions/notes.txt"]
    assert sorted(p.name for p in tmp_path.rglob("*")) == [RECORD, "notes.txt", "predictions"]
    assert json.loads((tmp_path / RECORD).read_text()) == {"kept": ["predictions/notes.txt"]}
