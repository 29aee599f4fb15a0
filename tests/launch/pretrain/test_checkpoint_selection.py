"""Which checkpoint of a run is loaded (`launch.checkpoint_dirs.select_checkpoint`), on real files laid
out as `bertpipe pretrain` writes them; the end-to-end runs are in test_run_dir_safety.py."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

from launch.checkpoint_dirs import META, file_records, is_run_dir, select_checkpoint, verify_checkpoint


def save_checkpoint(ckpt_dir: Path, step: int) -> Path:
    folder = ckpt_dir / f"global_step{step}"
    folder.mkdir(parents=True)
    torch.save({"module": {"w": torch.full((256,), float(step))}}, folder / "mp_rank_00_model_states.pt")
    torch.save({"torch": torch.get_rng_state(), "numpy_pos": 3}, folder / "rng_rank0.pt")
    (folder / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    (folder / META).write_text(json.dumps({"step": step, "files": file_records(folder)}))
    (ckpt_dir / "latest").write_text(folder.name + "\n")
    return folder


@pytest.fixture
def ckpt_dir(tmp_path) -> Path:
    ckpt_dir = tmp_path / "run" / "checkpoints"
    for step in (2, 4, 6):
        save_checkpoint(ckpt_dir, step)
    return ckpt_dir


def test_the_newest_verified_checkpoint_is_taken_and_each_skipped_one_named(ckpt_dir, caplog):
    assert select_checkpoint(ckpt_dir) == "global_step6"
    model = ckpt_dir / "global_step6" / "mp_rank_00_model_states.pt"
    model.write_bytes(model.read_bytes()[:-10])  # cut short
    flipped = ckpt_dir / "global_step4" / "vocab.txt"
    flipped.write_text("[PAD]\n[UNX]\n")  # same size, other bytes
    with caplog.at_level(logging.WARNING):
        assert select_checkpoint(ckpt_dir) == "global_step2"
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skipped) == 2
    assert str(model) in skipped[0] and "bytes, bertpipe.json recorded" in skipped[0]
    assert str(flipped) in skipped[1] and "does not match the sha256" in skipped[1]
    with pytest.raises(ValueError, match="global_step6 is damaged: .*mp_rank_00_model_states.pt has"):
        select_checkpoint(ckpt_dir, "global_step6")


def test_latest_missing_never_means_step_zero(ckpt_dir, caplog):
    (ckpt_dir / "latest").unlink()
    assert is_run_dir(ckpt_dir.parent)
    with caplog.at_level(logging.WARNING):
        assert select_checkpoint(ckpt_dir) == "global_step6"
    assert "latest is missing: using the newest complete checkpoint, global_step6" in caplog.text
    for folder in ckpt_dir.glob("global_step*"):
        (folder / "rng_rank0.pt").unlink()
    with pytest.raises(ValueError, match=r"no complete checkpoint in .*global_step6: .*rng_rank0.pt is missing"):
        select_checkpoint(ckpt_dir)


def test_a_latest_that_is_not_text_or_names_a_deleted_folder_is_only_a_hint(ckpt_dir, caplog):
    # Not text: resume and export stopped on "'utf-8' codec can't decode byte 0xff", naming no file.
    (ckpt_dir / "latest").write_bytes(b"\xff\xfe")
    with caplog.at_level(logging.INFO):
        assert select_checkpoint(ckpt_dir) == "global_step6"
    assert f"{ckpt_dir / 'latest'} is not text (damaged)" in caplog.text
    assert "latest is damaged: using the newest complete checkpoint, global_step6" in caplog.text
    # The folder it names deleted by hand: step 4 was said to be "newer" than step 6.
    caplog.clear()
    (ckpt_dir / "latest").write_text("global_step6\n")
    shutil.rmtree(ckpt_dir / "global_step6")
    with caplog.at_level(logging.INFO):
        assert select_checkpoint(ckpt_dir) == "global_step4"
    assert "names global_step6, which is not among the checkpoints; using the newest complete one, global_step4" \
        in caplog.text and "newer" not in caplog.text


def test_a_latest_behind_a_newer_complete_checkpoint_is_normal_not_damage(ckpt_dir, caplog):
    # A run stopped between saving step 6 and moving `latest`: step 6 is used, said as the ordinary case.
    (ckpt_dir / "latest").write_text("global_step4\n")
    with caplog.at_level(logging.INFO):
        assert select_checkpoint(ckpt_dir) == "global_step6"
    assert "names global_step4; global_step6 is newer and complete: using it" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_metadata_that_does_not_parse_names_its_file(ckpt_dir):
    meta = ckpt_dir / "global_step6" / META
    meta.write_text('{"step": 6, "fi')
    assert verify_checkpoint(ckpt_dir, "global_step6").startswith(f"{meta} is not valid JSON")
    meta.write_text('{"step": 6, "files": {"vocab.txt": {"size": "many"}}}')
    assert verify_checkpoint(ckpt_dir, "global_step6") == f"{meta} has no valid `files` records (size and sha256 per file)"
    assert select_checkpoint(ckpt_dir) == "global_step4"


def test_a_file_that_could_run_code_is_refused_not_passed_over(ckpt_dir):
    rng = ckpt_dir / "global_step6" / "rng_rank0.pt"
    # A callable is a pickle GLOBAL. Not `print`: Ray, imported by other tests, swaps builtins.print.
    torch.save({"torch": torch.get_rng_state(), "hook": shutil.rmtree}, rng)
    meta = json.loads((ckpt_dir / "global_step6" / META).read_text())
    meta["files"] = file_records(ckpt_dir / "global_step6")
    (ckpt_dir / "global_step6" / META).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=rf"{rng}: refused to load: it references shutil.rmtree"):
        select_checkpoint(ckpt_dir)


def test_a_universal_name_that_is_not_our_conversion_is_never_deleted(tmp_path):
    from launch.pretrain.checkpoints import convert_to_universal

    (tmp_path / "global_step4").mkdir()
    (tmp_path / "global_step4" / META).write_text(json.dumps({"step": 4}))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("keep")
    (tmp_path / "global_step4_universal").symlink_to(mine)
    with pytest.raises(ValueError, match="global_step4_universal is not a conversion bertpipe made"):
        convert_to_universal(tmp_path, "global_step4")
    assert (mine / "keep.txt").read_text() == "keep"
    # A folder without our record (DeepSpeed's `ds_to_universal` run by hand writes to this name): it was
    # taken for "an older or interrupted conversion" and deleted.
    (tmp_path / "global_step4_universal").unlink()
    mine.rename(tmp_path / "global_step4_universal")
    with pytest.raises(ValueError, match=r"global_step4_universal is not a conversion bertpipe made .*move it away"):
        convert_to_universal(tmp_path, "global_step4")
    assert (tmp_path / "global_step4_universal" / "keep.txt").read_text() == "keep"


def test_a_tensor_file_no_record_covers_is_not_loaded_unverified(ckpt_dir):
    # e.g. a rank's optimizer states copied in from another run after the save
    extra = ckpt_dir / "global_step6" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    torch.save({"state": torch.zeros(2)}, extra)
    assert verify_checkpoint(ckpt_dir, "global_step6") == f"{extra} is not among the files {META} recorded (added after the save)"
    assert select_checkpoint(ckpt_dir) == "global_step4"
    meta = ckpt_dir / "global_step4" / META
    meta.write_text(json.dumps({"step": 4, "files": {}}))
    assert verify_checkpoint(ckpt_dir, "global_step4") == f"{ckpt_dir / 'global_step4' / 'mp_rank_00_model_states.pt'} " \
                                                          f"is not among the files {META} recorded (added after the save)"
    for name in ("mp_rank_00_model_states.pt", "rng_rank0.pt"):
        (ckpt_dir / "global_step4" / name).unlink()
    assert verify_checkpoint(ckpt_dir, "global_step4") == f"{meta} records no files"


def test_a_checkpoint_from_before_the_records_loads_with_a_warning_that_says_so(ckpt_dir, caplog):
    meta = ckpt_dir / "global_step6" / META
    meta.write_text(json.dumps({"step": 6}))
    with caplog.at_level(logging.WARNING):
        assert select_checkpoint(ckpt_dir) == "global_step6"
    assert f"{meta} records no file sizes or sha256s: its files are loaded unverified" in caplog.text


def test_a_tag_is_a_checkpoint_name_of_this_run_not_a_path(ckpt_dir, tmp_path):
    # `export RUN --tag ../../other/checkpoints/global_step2` exported another run's weights as RUN's
    other = tmp_path / "other" / "checkpoints"
    save_checkpoint(other, 2)
    assert select_checkpoint(ckpt_dir, "global_step4") == "global_step4"
    for tag in ("../../other/checkpoints/global_step2", "global_step4/", str(other / "global_step2")):
        with pytest.raises(ValueError, match=r"no checkpoint .* available: global_step6, global_step4, global_step2"):
            select_checkpoint(ckpt_dir, tag)
