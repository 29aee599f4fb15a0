"""`demo --fresh` clears each of its folders only of what the step's command wrote there (its own record of it),
and keeps, and names, a file or folder of the user's in them; where one of those would stop a step, the demo
stops at once with that command's one line. It deleted the folders whole (shutil.rmtree): dm/run/my_notes.md,
a `bertpipe finetune --out dm/run/my_finetune`, dm/hf_model/NOTES.txt went with them.

Through the real CLI: the earlier demo's outputs are laid out as its commands write them (the markers and
records they keep), and the steps the demo then starts are recorded instead of run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launch import cli
from launch.checkpoint_dirs import RUN_MARKER, file_records
from launch.cli import demo
from launch.export_dirs import EXPORT_MARKER
from launch.finetune.tune_sweep import CONFIG_FILE
from pipeline.manifest import FORMAT

SHARD = "train-00000-of-00001.arrow"


def _earlier_demo(out: Path) -> None:
    """What `bertpipe demo --out OUT` leaves: its marker and files, and each step's folder as its command wrote it."""
    def write(rel: str, text: str = "x") -> None:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)

    write(demo.MARKER, "demo")
    for name in ("loss.png", "demo_grid.yaml", "reference_grid.yaml"):
        write(name)
    write("corpus/manifest.json", json.dumps({"format": FORMAT, "shards": [{"path": SHARD}]}))
    for rel in (f"corpus/{SHARD}", "corpus/vocab.txt", f"run/{RUN_MARKER}", "run/config.yaml", "run/ds_config.json",
                "run/vocab.txt", "run/metrics.jsonl", "run/tensorboard/events", "run/checkpoints/latest",
                "run/checkpoints/global_step2/bertpipe.json", "hf_model/config.json", "hf_model/model.safetensors",
                "hf_model/README.md"):
        write(rel)
    records = file_records(out / "hf_model")
    write(f"hf_model/{EXPORT_MARKER}", json.dumps({"format": "bertpipe-export", "run": str((out / "run").resolve()),
                                                   "tag": "global_step2", "files": sorted(records) + [EXPORT_MARKER],
                                                   "file_records": records}))
    for sweep in ("sweep", "reference"):
        write(f"{sweep}/{CONFIG_FILE}", json.dumps({"tasks": ["sst2"], "grid": {}, "seeds": [1], "base": {}}))
        for rel in ("results.json", "results.md", "sweep.png", "trials/t0/trial_result.json", "tune/x"):
            write(f"{sweep}/{rel}")


@pytest.fixture
def steps(monkeypatch) -> list[list[str]]:
    """The steps the demo starts, stopped at the first (its corpus) as a failed step: what --fresh left is looked at."""
    started: list[list[str]] = []

    def step(argv: list[str]) -> int:
        started.append(argv)
        return 2

    monkeypatch.setattr(demo, "cli_main", step)
    return started


def _fresh_demo(out: Path) -> int:
    with pytest.raises(SystemExit) as err:
        cli.main(["demo", "--out", str(out), "--fresh", "--steps", "2", "--nproc", "1", "--skip-sweep"])
    return err.value.code


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def test_fresh_deletes_what_the_demo_wrote_and_keeps_and_names_the_users_files(tmp_path, capsys, steps):
    out = tmp_path / "dm"
    _earlier_demo(out)
    mine = {"notes.txt": "top", "run/my_notes.md": "notes", "corpus/extra/my_input.txt": "text",
            "run/my_finetune/model/config.json": "{}", "run/my_finetune/results.json": "{}", "sweep/mine.txt": "m"}
    for rel, text in mine.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)

    assert _fresh_demo(out) == 2
    # Nothing the demo wrote is left (but the marker it writes again as it starts); every file of the user's is,
    # as it was; the folders left empty are gone.
    assert _files(out) == sorted([demo.MARKER, *mine]) and all((out / r).read_text() == t for r, t in mine.items())
    assert sorted(p.name for p in out.iterdir()) == [demo.MARKER, "corpus", "notes.txt", "run", "sweep"]
    assert [argv[0] for argv in steps] == ["corpus"]  # the demo went on: nothing there stops a step
    err = capsys.readouterr().err
    assert ("--fresh kept 5 file(s) or folder(s) the demo did not write: corpus/extra/, run/my_finetune/, "
            "run/my_notes.md, sweep/mine.txt, notes.txt") in err
    assert "bertpipe demo: error: demo step 'corpus' failed (exit code 2)" in err


def test_a_file_left_in_hf_model_stops_the_demo_in_one_line_before_it_pre_trains(tmp_path, capsys, steps):
    # `bertpipe export` writes only into an empty folder or an export of the run: the demo says so before
    # minutes of corpus and pre-training, not after them (or, as the model card edited, took it for its own).
    out = tmp_path / "dm"
    _earlier_demo(out)
    (out / "hf_model" / "NOTES.txt").write_text("mine")
    (out / "hf_model" / "README.md").write_text("my model card")  # edited since the export wrote it: the user's

    assert _fresh_demo(out) == 2
    assert steps == []
    assert sorted(p.name for p in (out / "hf_model").iterdir()) == ["NOTES.txt", "README.md"]
    assert (out / "hf_model" / "README.md").read_text() == "my model card"
    err = capsys.readouterr().err
    assert "--fresh kept 2 file(s) or folder(s) the demo did not write: hf_model/NOTES.txt, hf_model/README.md" in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"bertpipe demo: error: demo step 'export' would fail: --out {out / 'hf_model'} is not "
                           f"empty and holds no export of {out / 'run'}"), last
    assert "Traceback" not in err
    # Those moved out, the same command goes on (--out is still the demo's: not refused as a folder of the user's).
    for name in ("NOTES.txt", "README.md"):
        (out / "hf_model" / name).unlink()
    assert _fresh_demo(out) == 2 and [argv[0] for argv in steps] == ["corpus"]


def test_a_corpus_folder_the_corpus_cannot_tell_its_own_is_refused_in_one_line_and_nothing_deleted(
        tmp_path, capsys, steps):
    # A shard-named file the earlier corpus's manifest does not list: `bertpipe corpus` refuses it as the user's.
    out = tmp_path / "dm"
    _earlier_demo(out)
    (out / "corpus" / "train-00009-of-00010.arrow").write_text("mine")
    before = _files(out)

    assert _fresh_demo(out) == 2
    assert steps == [] and _files(out) == before
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (f"bertpipe demo: error: --out {out / 'corpus'} holds train-00009-of-00010.arrow beside an earlier "
                    "corpus, which bertpipe did not write: move it out, or choose another --out")


def test_a_folder_no_record_proves_the_commands_is_kept_whole(tmp_path, capsys, steps):
    # run/ without pretrain's marker or checkpoints, sweep/ without the sweep's settings file: nothing there is
    # provably theirs, so nothing is deleted (`bertpipe pretrain` and `sweep` then refuse their names' clashes).
    out = tmp_path / "dm"
    _earlier_demo(out)
    (out / "run" / RUN_MARKER).unlink()
    for rel in ("run/checkpoints", "run/tensorboard"):
        for path in sorted((out / rel).rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        (out / rel).rmdir()
    (out / "sweep" / CONFIG_FILE).unlink()
    run_files, sweep_files = _files(out / "run"), _files(out / "sweep")

    assert _fresh_demo(out) == 2
    assert _files(out / "run") == run_files and _files(out / "sweep") == sweep_files
    assert [argv[0] for argv in steps] == ["corpus"]
    assert ("--fresh kept 9 file(s) or folder(s) the demo did not write: run/config.yaml, run/ds_config.json, "
            "run/metrics.jsonl, run/vocab.txt, sweep/results.json") in capsys.readouterr().err


def test_a_sweep_folder_of_the_users_stops_the_demo_in_one_line_before_it_pre_trains(tmp_path, capsys, steps):
    # `bertpipe sweep` refuses to overwrite results it did not write; the demo said so only at step 4, minutes
    # after the corpus and pre-training. Now at once, as for hf_model/.
    out = tmp_path / "dm"
    _earlier_demo(out)
    (out / "reference" / CONFIG_FILE).unlink()  # no sweep's settings: its results.json etc. are anyone's
    with pytest.raises(SystemExit) as err:
        cli.main(["demo", "--out", str(out), "--fresh", "--steps", "2", "--nproc", "1"])
    assert err.value.code == 2 and steps == []
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"bertpipe demo: error: demo step 'reference sweep' would fail: --out {out / 'reference'} "
                           "holds results.json, results.md, sweep.png, trials, tune, which `bertpipe sweep` did not write"), last
    assert _files(out / "reference") == ["results.json", "results.md", "sweep.png", "trials/t0/trial_result.json",
                                         "tune/x"]
    # Without the reference step the same folder does not matter.
    with pytest.raises(SystemExit):
        cli.main(["demo", "--out", str(out), "--fresh", "--steps", "2", "--nproc", "1", "--skip-reference"])
    assert [argv[0] for argv in steps] == ["corpus"]
