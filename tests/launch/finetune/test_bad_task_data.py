"""Task data that is there but bad in ways a reader passed up the stack: one line naming the file, never a traceback.

An unreadable file, a number too long or JSON nested too deep, a column or key given twice, a named pipe or a
folder where a split file belongs, DIR one level off, a repeated GLUE test id, a JSON true taken for text.
"""

from __future__ import annotations

import builtins
import os
from pathlib import Path

import pytest

from launch import cli
from launch.finetune import examples, glue, squad, swag
from launch.finetune.examples import DataError, SkipCounter
from launch.finetune.finetune_config import FinetuneConfig
from launch.finetune.tasks import get_task

from repo_paths import DATA

SST2 = "sentence\tlabel\n"
QUICK = ["--max-train-samples", "8", "--max-eval-samples", "8", "--epochs", "1", "--batch-size", "4",
         "--max-seq-len", "32", "--no-progress", "--no-save-model", "--no-tensorboard"]


def load(task: str, data_dir: Path, **cfg):
    return get_task(task).load(data_dir, FinetuneConfig(task=task, **cfg))


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def squad_json(answer_start: str = "0") -> str:
    return ('{"data": [{"title": "t", "paragraphs": [{"context": "Paris is big.", "qas": [{"id": "q1", '
            f'"question": "What is big?", "answers": [{{"text": "Paris", "answer_start": {answer_start}}}]}}]}}]}}]}}')


def user_jsonl(folder: Path, train_line: str, dev: str = '{"text": "ok", "label": "pos"}\n') -> Path:
    write(folder / "train.jsonl", '{"text": "fine", "label": "pos"}\n' + train_line + "\n"
          + '{"text": "bad", "label": "neg"}\n')
    write(folder / "dev.jsonl", dev)
    return folder


# ---- 1. an unreadable file --------------------------------------------------------------------------------


def _task_data(task: str, root: Path) -> Path:
    """A small data folder for `task`; its train file is returned (the one made unreadable)."""
    if task == "sst2":
        write(root / "dev.tsv", SST2 + "ok .\t1\n")
        return write(root / "train.tsv", SST2 + "fine .\t1\n")
    if task == "squad":
        write(root / "dev.json", squad_json())
        return write(root / "train.json", squad_json())
    if task == "conll2003":
        write(root / "dev.txt", "EU NNP B-NP B-ORG\n\n")
        return write(root / "train.txt", "EU NNP B-NP B-ORG\n\n")
    write(root / "dev.jsonl", '{"text": "ok", "label": "pos"}\n')
    return write(root / "train.jsonl", '{"text": "fine", "label": "pos"}\n')


@pytest.mark.parametrize("task", ["sst2", "squad", "conll2003", "classify"])
def test_an_unreadable_file_is_named_with_what_to_change(tmp_path, monkeypatch, task):
    # chmod 000 gave a bare PermissionError traceback; `open` stands in for it (root reads any file)
    locked = _task_data(task, tmp_path)
    real_open = builtins.open

    def fake_open(file, *args, **kwargs):
        if Path(file) == locked:
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    for module in (examples, squad):
        monkeypatch.setattr(module, "open", fake_open, raising=False)
    with pytest.raises(DataError, match=rf"^cannot read {locked}: Permission denied; make it readable$"):
        load(task, tmp_path)


def test_an_unreadable_train_file_is_one_line_from_the_cli(tmp_path, monkeypatch, tiny_checkpoint, capsys):
    locked = _task_data("sst2", tmp_path / "data")
    real_open = builtins.open
    monkeypatch.setattr(examples, "open", lambda file, *a, **k: (_ for _ in ()).throw(
        PermissionError(13, "Permission denied", str(file))) if Path(file) == locked else real_open(file, *a, **k),
        raising=False)
    with pytest.raises(SystemExit) as exc:
        cli.main(["finetune", "--task", "sst2", "--data-dir", str(tmp_path / "data"), "--checkpoint",
                  str(tiny_checkpoint), "--out", str(tmp_path / "out"), *QUICK])
    assert exc.value.code == 2  # was exit 1 and a traceback
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"bertpipe finetune: error: cannot read {locked}: Permission denied; make it readable")


# ---- 2. numbers too large, JSON too deep ------------------------------------------------------------------


@pytest.mark.parametrize("score", ["1" * 401, "1e16", "-2e15"])
def test_a_regress_label_too_large_is_malformed(tmp_path, score):
    # 401 digits: OverflowError traceback, even with --skip-malformed; 1e16: the loss became inf
    data = user_jsonl(tmp_path, f'{{"text": "huge", "label": {score}}}', dev='{"text": "ok", "label": 2}\n')
    for f in ("train.jsonl",):
        (data / f).write_text((data / f).read_text().replace('"pos"', "1").replace('"neg"', "0"))
    with pytest.raises(DataError, match=r"train.jsonl:2: label .{1,60} is too large for a score \(above 1e\+15\)"):
        load("regress", data)
    assert [ex.label for ex in load("regress", data, skip_malformed=True).train] == [1.0, 0.0]


def test_a_glue_score_too_large_is_malformed(tmp_path):
    head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    path = write(tmp_path / "train.tsv", head + "0\tg\tf\ty\t0\ts\ts\tA man.\tA man.\t1e16\n")
    with pytest.raises(DataError, match=r"train.tsv:2: score '1e16' is too large for a score"):
        glue.read_glue_file(glue.GLUE_TASKS["stsb"], path, labelled=True, skips=SkipCounter())


def test_json_nested_too_deep_names_the_file(tmp_path):
    # a RecursionError traceback
    write(tmp_path / "train.json", "[" * 100_000)
    write(tmp_path / "dev.json", squad_json())
    with pytest.raises(DataError, match=rf"^{tmp_path / 'train.json'}: not a SQuAD file \(JSON nested too deeply\)"):
        load("squad", tmp_path)
    data = user_jsonl(tmp_path / "user", '{"text": ' + "[" * 100_000)
    with pytest.raises(DataError, match=r"train.jsonl:2: JSON nested too deeply \(fix the line, or pass --skip"):
        load("classify", data)
    assert len(load("classify", data, skip_malformed=True).train) == 2


def test_a_number_of_thousands_of_digits_names_the_file(tmp_path):
    # "Exceeds the limit (4300 digits) for integer string conversion; use sys.set_int_max_str_digits()", no file
    write(tmp_path / "train.json", squad_json("1" * 5000))
    write(tmp_path / "dev.json", squad_json())
    with pytest.raises(DataError, match=rf"^{tmp_path / 'train.json'}: holds a number of 5000 digits"):
        load("squad", tmp_path)
    data = user_jsonl(tmp_path / "user", '{"text": "x", "label": ' + "1" * 5000 + "}")
    with pytest.raises(DataError, match=r"train.jsonl:2: holds a number of 5000 digits"):
        load("classify", data)
    assert len(load("classify", data, skip_malformed=True).train) == 2


# ---- 3. a column or key given twice ---------------------------------------------------------------------


@pytest.mark.parametrize("task, name, text", [
    ("classify", "train.csv", "text,label,label\nfine,pos,neg\n"),
    ("sst2", "train.tsv", "sentence\tlabel\tlabel\nfine .\t1\t0\n"),
])
def test_a_header_naming_a_wanted_column_twice_is_refused(tmp_path, task, name, text):
    # trained on the first of the two label columns, without a word
    write(tmp_path / name, text)
    write(tmp_path / name.replace("train", "dev"), text)
    with pytest.raises(DataError, match=rf"{name}: the header names the column 'label' 2 times"):
        load(task, tmp_path)


def test_a_jsonl_key_given_twice_is_malformed(tmp_path):
    # read as label "neg", the last of the two
    data = user_jsonl(tmp_path, '{"text": "a", "label": "pos", "label": "neg"}')
    with pytest.raises(DataError, match=r"train.jsonl:2: the key 'label' is given more than once"):
        load("classify", data)
    assert [ex.label for ex in load("classify", data, skip_malformed=True).train] == ["pos", "neg"]


# ---- 4. a named pipe or a folder where a split file belongs ----------------------------------------------


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
@pytest.mark.parametrize("task, split_file, kind", [
    ("sst2", "train.tsv", "a named pipe"), ("sst2", "dev.tsv", "a folder"), ("sst2", "test.tsv", "a named pipe"),
    ("conll2003", "dev.txt", "a named pipe"), ("conll2003", "test.txt", "a folder"),
    ("classify", "test.jsonl", "a named pipe"), ("squad", "dev.json", "a folder"),
])
def test_a_split_that_is_not_a_file_is_refused(tmp_path, task, split_file, kind):
    # was "expected the file ..., which does not exist", "missing the dev split", or (test) silently ignored
    _task_data(task, tmp_path)
    path = tmp_path / split_file
    path.unlink(missing_ok=True)
    os.mkfifo(path) if kind == "a named pipe" else path.mkdir()
    with pytest.raises(DataError, match=rf"^{path} \(.*\) is {kind}, not a file; put the data file itself there$"):
        load(task, tmp_path)


# ---- 5. messages: DIR one level off, a test line that cannot be skipped ----------------------------------


def test_data_dir_one_level_off_names_both_places():
    # named only data/train.tsv, never data/SST-2/
    with pytest.raises(DataError, match=rf"expected the file {DATA / 'SST-2' / 'train.tsv'} .* or "
                                        rf"{DATA / 'train.tsv'} .*check --data-dir"):
        load("sst2", DATA)


def test_a_malformed_test_line_does_not_offer_skip_malformed(tmp_path):
    # offered --skip-malformed, which refuses test lines anyway
    write(tmp_path / "test.tsv", "index\tsentence\n0\tfine .\n1\tbad\textra\n")
    with pytest.raises(DataError, match=r"test.tsv:3: expected 2 tab-separated fields, got 3 \(fix the line: the GLUE "
                                        r"server takes .*\)$") as err:
        glue.read_split(glue.GLUE_TASKS["sst2"], tmp_path, "test.tsv")
    assert "--skip-malformed" not in str(err.value)
    head = "video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3\n"
    test = write(tmp_path / "test.csv", head + "v,1,s,A man,He,gold,a,b,c\n")
    with pytest.raises(DataError, match=r"test.csv:2: .* \(fix the line: the SWAG leaderboard") as err:
        swag.read_swag(test, labelled=False)
    assert "--skip-malformed" not in str(err.value)


# ---- 6. silent handling: a JSON true as text, a repeated GLUE test id -------------------------------------


@pytest.mark.parametrize("task, line", [
    ("classify", '{"text": true, "label": "pos"}'),
    ("tag", '{"text": false, "label": "O"}'),
    ("tag", '{"text": "Paris", "label": true}'),
])
def test_a_json_true_is_not_text(tmp_path, task, line):
    # read as the text "True"
    data = user_jsonl(tmp_path, line)
    if task == "tag":
        for f in ("train.jsonl", "dev.jsonl"):
            (data / f).write_text((data / f).read_text().replace('"pos"', '"O"').replace('"neg"', '"O"'))
    with pytest.raises(DataError, match=r"train.jsonl:2: key\(s\) \['(text|label)'\] hold (true|false), not text"):
        load(task, data)


def test_a_repeated_glue_test_id_is_refused(tmp_path):
    # written twice into the submission
    write(tmp_path / "test.tsv", "index\tsentence\n0\tfine .\n1\tok .\n0\tagain .\n")
    with pytest.raises(DataError, match=r"test.tsv:4: the index '0' is repeated \(first on line 2\)"):
        glue.read_split(glue.GLUE_TASKS["sst2"], tmp_path, "test.tsv")
