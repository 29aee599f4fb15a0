"""`launch.pretrain.checkpoints.save` and its pruning, in this process (a gloo group of one and a stand-in
for DeepSpeed's engine that writes one tensor file): what a finished save leaves, which checkpoints
`checkpoint.keep_last` keeps, and that `latest` moves only once the new folder is in place."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from launch.checkpoint_dirs import verify_checkpoint
from launch.pretrain.checkpoints import META, _prune, save
from repo_paths import VOCAB


class Engine:
    """What `save` asks of DeepSpeed's engine: its files for `tag` under `save_dir`."""

    def __init__(self) -> None:
        self.weight = torch.zeros(3)

    def save_checkpoint(self, save_dir: str, tag: str, client_state: dict, save_latest: bool) -> None:
        assert save_latest is False  # `latest` is ours, written last
        folder = Path(save_dir) / tag
        folder.mkdir(parents=True)
        torch.save({"module": {"w": self.weight.clone()}, **client_state}, folder / "mp_rank_00_model_states.pt")




def saved(ckpt_dir: Path, engine: Engine, step: int, keep_last: int) -> Path:
    engine.weight += 1
    return save(engine, ckpt_dir, step, {"step": step, "position": 32 * step}, VOCAB, keep_last)


def ours(universal: Path) -> None:
    """A folder as `convert_to_universal` leaves it: its record written before the rename into place."""
    from launch.pretrain.checkpoints import UNIVERSAL_RECORD

    universal.mkdir()
    (universal / UNIVERSAL_RECORD).write_text("{}")


def names(ckpt_dir: Path) -> list[str]:
    return sorted(p.name for p in ckpt_dir.iterdir())


def test_saves_keep_the_last_n_and_latest_names_the_newest(gloo_group_of_one, tmp_path):
    ckpts, engine = tmp_path / "checkpoints", Engine()
    for step in (2, 4):
        assert saved(ckpts, engine, step, keep_last=2) == ckpts / f"global_step{step}"
    ours(ckpts / "global_step2_universal")  # a conversion of a checkpoint that gets pruned goes with it
    saved(ckpts, engine, 6, keep_last=2)
    assert names(ckpts) == ["global_step4", "global_step6", "latest"]
    assert (ckpts / "latest").read_text() == "global_step6\n"
    folder = ckpts / "global_step6"
    meta = json.loads((folder / META).read_text())
    assert meta["step"] == 6 and meta["position"] == 192
    assert set(meta["files"]) == {"mp_rank_00_model_states.pt", "rng_rank0.pt", "vocab.txt"}
    assert verify_checkpoint(ckpts, "global_step6") is None
    assert (folder / "vocab.txt").read_bytes() == VOCAB.read_bytes()


def test_saving_a_step_again_replaces_it_and_its_old_conversion(gloo_group_of_one, tmp_path):
    ckpts, engine = tmp_path / "checkpoints", Engine()
    saved(ckpts, engine, 4, keep_last=3)
    ours(ckpts / "global_step4_universal")  # converted from the first save of step 4
    saved(ckpts, engine, 4, keep_last=3)  # after a resume from an earlier step, step 4 again
    assert names(ckpts) == ["global_step4", "latest"]  # no .old-, no .staging-, no stale conversion
    from launch.pretrain.hf_export import load_checkpoint_file

    assert torch.equal(load_checkpoint_file(ckpts / "global_step4" / "mp_rank_00_model_states.pt")["module"]["w"],
                       torch.full((3,), 2.0))
    assert verify_checkpoint(ckpts, "global_step4") is None


def test_latest_moves_only_after_the_new_checkpoint_is_in_place(gloo_group_of_one, tmp_path, monkeypatch):
    ckpts, engine = tmp_path / "checkpoints", Engine()
    saved(ckpts, engine, 2, keep_last=2)
    real_replace = os.replace

    def crash_on_publish(src, dst, *args, **kwargs):
        if Path(dst) == ckpts / "global_step4":
            raise OSError("the machine died here")
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", crash_on_publish)
    with pytest.raises(OSError, match="died here"):
        saved(ckpts, engine, 4, keep_last=2)
    monkeypatch.undo()
    assert (ckpts / "latest").read_text() == "global_step2\n"
    assert verify_checkpoint(ckpts, "global_step2") is None and not (ckpts / "global_step4").exists()


def make(ckpt_dir: Path, *steps: int, meta: bool = True) -> None:
    for step in steps:
        (ckpt_dir / f"global_step{step}").mkdir()
        if meta:
            (ckpt_dir / f"global_step{step}" / META).write_text("{}")


def test_prune_counts_only_complete_checkpoints_and_leaves_what_is_not_one(tmp_path):
    make(tmp_path, 2, 4, 8)
    make(tmp_path, 6, meta=False)  # no bertpipe.json: not a checkpoint of ours; never counted, never deleted
    ours(tmp_path / "global_step2_universal")
    (tmp_path / "global_step4_universal").mkdir()  # no record: `ds_to_universal` run by hand; never deleted
    (tmp_path / "global_step4_universal" / "notes.txt").write_text("mine")
    (tmp_path / "damaged-global_step10").mkdir()  # set aside by a resume: for whoever inspects it
    (tmp_path / ".old-global_step4").mkdir()  # the only copy of a step if a re-save's renames were cut short
    _prune(tmp_path, 2, 8)
    assert names(tmp_path) == [".old-global_step4", "damaged-global_step10", "global_step4", "global_step4_universal",
                               "global_step6", "global_step8"]
    _prune(tmp_path, 1, 8)
    assert names(tmp_path) == [".old-global_step4", "damaged-global_step10", "global_step4_universal",
                               "global_step6", "global_step8"]
    assert (tmp_path / "global_step4_universal" / "notes.txt").read_text() == "mine"
