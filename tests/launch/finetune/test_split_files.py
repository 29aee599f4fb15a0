"""Which files CoNLL-2003, SWAG and SQuAD read: one per split, all from one folder, else a refusal in one line.

Each took the first of several candidates without a word (CoNLL's `dev.txt` over `valid.txt`, SWAG's `val.csv`
over `dev.csv`, SQuAD's `train-v1.1.json` over `train.json`) and looked for each split in turn in DIR/<task>/
and then DIR, so train could come from one folder and dev from the other. And `--skip-malformed` skipped
malformed SWAG test rows, which the leaderboard needs a prediction for, as GLUE's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from launch import cli
from launch.finetune.finetune_config import FinetuneConfig
from launch.finetune.tasks import get_task

from repo_paths import DATA, FIXTURES

SWAG = FIXTURES / "downstream" / "SWAG"
QUICK = ["--max-train-samples", "8", "--max-eval-samples", "8", "--epochs", "1", "--batch-size", "4",
         "--max-seq-len", "64", "--no-progress", "--no-save-model", "--no-tensorboard"]
CONLL_A = "EU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\n"
CONLL_B = "Peter NNP B-NP B-PER\nBlackburn NNP I-NP I-PER\n\n"


def refusal(task: str, data_dir: Path, ckpt: Path, out: Path, capsys, *flags: str) -> str:
    """The last line `bertpipe finetune` prints when it refuses the data (exit 2, before any training)."""
    argv = ["finetune", "--task", task, "--data-dir", str(data_dir), "--checkpoint", str(ckpt), "--out", str(out),
            *QUICK, *flags]
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def load(task: str, data_dir: Path):
    return get_task(task).load(data_dir, FinetuneConfig(task=task, data_dir=str(data_dir), checkpoint="x", out="y"))


def squad_file(path: Path, paragraphs: int) -> Path:
    """A SQuAD v1.1 file: the bundled subset's first article cut to `paragraphs` paragraphs."""
    doc = json.loads((DATA / "squad" / "dev-v1.1-subset.json").read_text(encoding="utf-8"))
    doc["data"] = [{**doc["data"][0], "paragraphs": doc["data"][0]["paragraphs"][:paragraphs]}]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# ---- two files for one split ---------------------------------------------------------------------------


@pytest.mark.parametrize("task, split, names", [
    ("conll2003", "dev", ("dev.txt", "valid.txt")),
    ("swag", "dev", ("val.csv", "dev.csv")),
    ("squad", "train", ("train-v1.1.json", "train.json")),
])
def test_two_files_for_one_split_are_refused(tiny_checkpoint, tmp_path, capsys, task, split, names):
    data = tmp_path / "data"
    if task == "conll2003":
        write(data / "train.txt", CONLL_A + CONLL_B)
        write(data / "dev.txt", CONLL_A)
        write(data / "valid.txt", CONLL_B)
    elif task == "swag":
        for name, source in (("train.csv", "train.csv"), ("val.csv", "val.csv"), ("dev.csv", "val.csv")):
            write(data / name, (SWAG / source).read_text(encoding="utf-8"))
    else:
        squad_file(data / "train-v1.1.json", 2)
        squad_file(data / "train.json", 1)
        squad_file(data / "dev-v1.1.json", 1)
    what = {"conll2003": "CoNLL-2003", "swag": "SWAG", "squad": "SQuAD"}[task]
    assert refusal(task, data, tiny_checkpoint, tmp_path / "out", capsys) == (
        f"bertpipe finetune: error: {data} holds {names[0]} and {names[1]} for the {what} {split} split; "
        "keep one of them there")
    assert not (tmp_path / "out").exists()
    (data / names[1]).unlink()  # the layout with one of them reads as before
    assert load(task, data).train


def test_squad_takes_one_split_file_by_pattern_and_names_two(tiny_checkpoint, tmp_path, capsys):
    # Two `dev*.json` and no `dev-v1.1.json`: "missing the dev split", as if neither were there.
    data = tmp_path / "squad"
    squad_file(data / "train-v1.1.json", 1)
    squad_file(data / "dev-v1.1-subset.json", 2)
    squad_file(data / "dev-v1.1-other.json", 1)
    assert refusal("squad", tmp_path, tiny_checkpoint, tmp_path / "out", capsys) == (
        f"bertpipe finetune: error: {data} holds dev-v1.1-other.json and dev-v1.1-subset.json for the SQuAD dev "
        "split; keep one of them there")
    (data / "dev-v1.1-other.json").unlink()  # one `dev*.json`: the bundled subset's layout, read as before
    assert len(load("squad", tmp_path).evals[0].examples) > len(load("squad", tmp_path).train)


# ---- every split from one folder -----------------------------------------------------------------------


def test_conll_files_in_the_data_dir_and_its_subfolder_are_refused(tiny_checkpoint, tmp_path, capsys):
    # Train came from DIR/conll2003/train.txt, dev from DIR/dev.txt; DIR/train.txt was ignored without a word.
    data = tmp_path / "data"
    write(data / "conll2003" / "train.txt", CONLL_A + CONLL_B)
    write(data / "train.txt", CONLL_A)
    write(data / "dev.txt", CONLL_B)
    assert refusal("conll2003", data, tiny_checkpoint, tmp_path / "out", capsys) == (
        f"bertpipe finetune: error: {data / 'dev.txt'} is not read for the CoNLL-2003 dev split: the task's files are "
        f"read from {data / 'conll2003'}, every split from one folder, which lacks it; move the file into "
        f"{data / 'conll2003'}")
    for name in ("train.txt", "dev.txt"):  # all in the subfolder, as the bundled data/conll2003/
        shutil.move(data / name, data / "conll2003" / name)
    (data / "conll2003" / "CoNLL-2003").symlink_to(data / "conll2003")  # one folder under two names is one
    loaded = load("conll2003", data)
    assert [ex.words for ex in loaded.train] == [("EU", "rejects")]
    assert [ex.words for ex in loaded.evals[0].examples] == [("Peter", "Blackburn")]


def test_squad_never_reads_splits_from_two_folders(tiny_checkpoint, tmp_path, capsys):
    # Trained on squad/, scored on DIR's dev file.
    data = tmp_path / "data"
    squad_file(data / "squad" / "train-v1.1.json", 1)
    squad_file(data / "dev-v1.1.json", 1)
    assert refusal("squad", data, tiny_checkpoint, tmp_path / "out", capsys) == (
        f"bertpipe finetune: error: {data / 'dev-v1.1.json'} is not read for the SQuAD dev split: the task's files "
        f"are read from {data / 'squad'}, every split from one folder, which lacks it; move the file into "
        f"{data / 'squad'}")
    shutil.move(data / "dev-v1.1.json", data / "squad" / "dev-v1.1.json")
    assert load("squad", data).evals


def test_a_test_file_beside_the_swag_folder_is_named_not_read(tmp_path, caplog):
    # The test file, and so the leaderboard's submission, came from DIR while train and dev came from DIR/SWAG.
    data = tmp_path / "data"
    for name in ("train.csv", "val.csv"):
        write(data / "SWAG" / name, (SWAG / name).read_text(encoding="utf-8"))
    write(data / "test.csv", (SWAG / "test.csv").read_text(encoding="utf-8"))
    with caplog.at_level("WARNING"):
        assert [split.name for split in load("swag", data).evals] == ["dev"]
    assert (f"{data / 'test.csv'} is not read for the SWAG test split: the task's files are read from "
            f"{data / 'SWAG'}, every split from one folder; move it there to use it") in caplog.text


def test_files_of_other_tasks_beside_the_task_folder_do_not_count(tmp_path):
    # A `training_args.json` matched SQuAD's train*.json, and a classify task's train.csv and dev.csv SWAG's
    # names, in DIR: both layouts, read from the task folder before, were refused as files in two folders.
    data = tmp_path / "data"
    squad_file(data / "squad" / "train-v1.1.json", 1)
    squad_file(data / "squad" / "dev-v1.1.json", 1)
    write(data / "training_args.json", "{}")
    assert load("squad", data).evals
    for name in ("train.csv", "val.csv"):
        write(data / "swag" / name, (SWAG / name).read_text(encoding="utf-8"))
    write(data / "train.csv", "text,label\ngood,pos\n")
    write(data / "dev.csv", "text,label\nbad,neg\n")
    assert len(load("swag", data).train) == len((SWAG / "train.csv").read_text().splitlines()) - 1


# ---- a SWAG test file is predicted whole -----------------------------------------------------------------


def test_a_malformed_swag_test_line_is_refused_even_with_skip_malformed(tiny_checkpoint, tmp_path, capsys):
    # predictions/test.tsv had 3 predictions for 4 test rows; the skip was only counted in the log.
    data = tmp_path / "swag"
    train = (SWAG / "train.csv").read_text(encoding="utf-8").splitlines()
    write(data / "train.csv", "\n".join(train + ["9,v,9,Bad row.,Bad row.,It,gold,a,b,c"]) + "\n")  # skipped
    write(data / "val.csv", (SWAG / "val.csv").read_text(encoding="utf-8"))
    test = (SWAG / "test.csv").read_text(encoding="utf-8").splitlines()
    assert len(test) == 4 and all(row.count(",") == 10 for row in test)
    cut = test[2].rsplit(",", 1)[0]  # row 2 without its last ending: 10 fields instead of 11
    write(data / "test.csv", "\n".join(test + [cut]) + "\n")
    assert refusal("swag", data, tiny_checkpoint, tmp_path / "out", capsys, "--skip-malformed") == (
        f"bertpipe finetune: error: {data / 'test.csv'}: 1 malformed line(s), e.g. test.csv:5 (expected 11 "
        "comma-separated fields, got 10); the SWAG leaderboard takes a submission only with a prediction for every "
        "test line: fix them")
    assert not (tmp_path / "out").exists()
