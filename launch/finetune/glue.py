"""GLUE tasks in the layout of the GLUE download: `DIR/<TASK>/{train,dev,test}.tsv`.

Columns are found by their header names (as GLUE writes them), so MNLI's varying number of
annotator-label columns or a reordered export still read right; CoLA's train/dev have no header
and are read by position (`source, label, notes, sentence`). Test predictions are written in the
form the GLUE server takes: `<Task>.tsv` with `index<TAB>prediction`.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from launch.finetune.examples import (
    DataError,
    SkipCounter,
    TextExample,
    bad_score,
    column_index,
    finite_score,
    read_delimited,
    refuse_non_file,
    require_file,
)

Column = str | int  # a header name, or a 0-based position for header-less files


@dataclass(frozen=True)
class GlueSpec:
    name: str
    dir_name: str
    text_a: Column
    text_b: Column | None
    label: Column
    labels: tuple[str, ...] | None  # None: regression (STS-B)
    metrics: tuple[str, ...]  # metric names, the first is the one the paper reports
    header: bool = True
    test_text_a: str | None = None  # header name in test.tsv when it differs from train's
    id_column: str = "index"
    # dev split name -> file; MNLI has two dev sets (matched / mismatched).
    dev_files: dict[str, str] = field(default_factory=lambda: {"dev": "dev.tsv"})
    # test file -> submission file name
    test_files: dict[str, str] = field(default_factory=dict)
    # test file -> the folder beside the task's where the GLUE download puts it (MNLI's diagnostic set)
    test_dirs: dict[str, str] = field(default_factory=dict)


GLUE_TASKS: dict[str, GlueSpec] = {
    spec.name: spec
    for spec in (
        GlueSpec(
            "mnli", "MNLI", "sentence1", "sentence2", "gold_label", ("contradiction", "entailment", "neutral"),
            ("accuracy",),
            dev_files={"dev_matched": "dev_matched.tsv", "dev_mismatched": "dev_mismatched.tsv"},
            # The diagnostic set (AX) is scored by the server with the MNLI model's predictions.
            test_files={"test_matched.tsv": "MNLI-m.tsv", "test_mismatched.tsv": "MNLI-mm.tsv", "diagnostic.tsv": "AX.tsv"},
            test_dirs={"diagnostic.tsv": "diagnostic"},
        ),
        GlueSpec("qqp", "QQP", "question1", "question2", "is_duplicate", ("0", "1"), ("f1", "accuracy"),
                 id_column="id", test_files={"test.tsv": "QQP.tsv"}),
        GlueSpec("qnli", "QNLI", "question", "sentence", "label", ("entailment", "not_entailment"), ("accuracy",),
                 test_files={"test.tsv": "QNLI.tsv"}),
        GlueSpec("sst2", "SST-2", "sentence", None, "label", ("0", "1"), ("accuracy",),
                 test_files={"test.tsv": "SST-2.tsv"}),
        GlueSpec("cola", "CoLA", 3, None, 1, ("0", "1"), ("matthews_correlation", "accuracy"), header=False,
                 test_text_a="sentence", test_files={"test.tsv": "CoLA.tsv"}),
        GlueSpec("stsb", "STS-B", "sentence1", "sentence2", "score", None, ("spearmanr", "pearson"),
                 test_files={"test.tsv": "STS-B.tsv"}),
        GlueSpec("mrpc", "MRPC", "#1 String", "#2 String", "Quality", ("0", "1"), ("f1", "accuracy"),
                 test_files={"test.tsv": "MRPC.tsv"}),
        GlueSpec("rte", "RTE", "sentence1", "sentence2", "label", ("entailment", "not_entailment"), ("accuracy",),
                 test_files={"test.tsv": "RTE.tsv"}),
        GlueSpec("wnli", "WNLI", "sentence1", "sentence2", "label", ("0", "1"), ("accuracy",),
                 test_files={"test.tsv": "WNLI.tsv"}),
    )
}


def task_dir(spec: GlueSpec, data_dir: Path) -> Path:
    """`DIR/<TASK>/` when DIR is the GLUE download, or DIR itself when it holds the task's files."""
    nested = data_dir / spec.dir_name
    return nested if nested.is_dir() else data_dir


def _index(header: Sequence[str] | None, col: Column, path: Path) -> int:
    if isinstance(col, int):
        return col
    assert header is not None, "header-less files address columns by position"
    return column_index(header, col, path)


def read_glue_file(spec: GlueSpec, path: Path, *, labelled: bool, skips: SkipCounter) -> list[TextExample]:
    """Examples of one GLUE split file. `labelled=False` for test files (no label column; ids kept)."""
    require_file(path, f"GLUE {spec.dir_name}")
    use_header = spec.header or not labelled  # GLUE's test.tsv always has a header
    header, rows = read_delimited(path, "\t", header=use_header, quoting=csv.QUOTE_NONE)
    a_col = spec.test_text_a if (not labelled and spec.test_text_a) else spec.text_a
    ia = _index(header, a_col, path)
    ib = _index(header, spec.text_b, path) if spec.text_b is not None else None
    il = _index(header, spec.label, path) if labelled else None
    iid = column_index(header, spec.id_column, path) if (header is not None and spec.id_column in header) else None
    if not labelled and iid is None:  # ids made up from line numbers: a submission the server would reject
        raise DataError(f"{path} has no {spec.id_column!r} column, by which the GLUE server matches the predictions to "
                        f"its rows; use the test file of the GLUE download, or remove it to skip the submission")
    width = len(header) if header is not None else 4  # CoLA: source, label, notes, sentence
    examples: list[TextExample] = []
    first_line: dict[str, int] = {}  # test id -> its line: a repeated one was written twice into the submission
    for line, fields in rows:
        if len(fields) != width:
            skips.malformed(path, line, f"expected {width} tab-separated fields, got {len(fields)}")
            continue
        # Trained on or scored as a blank input. A test row is kept: the server wants a prediction for each.
        if labelled and not all(fields[i].strip() for i in (ia, ib) if i is not None):
            skips.malformed(path, line, "empty text")
            continue
        label: str | float | None = None
        if il is not None:
            raw = fields[il].strip()
            if spec.labels is None:
                try:
                    label = finite_score(raw)
                except ValueError as err:
                    skips.malformed(path, line, bad_score("score", raw, err))
                    continue
            elif raw not in spec.labels:
                raise DataError(f"{path}:{line}: unknown label {raw!r}; {spec.dir_name} labels are {list(spec.labels)}")
            else:
                label = raw
        guid = fields[iid] if iid is not None else f"{path.stem}-{line}"
        if not labelled and first_line.setdefault(guid, line) != line:
            raise DataError(f"{path}:{line}: the {spec.id_column} {guid!r} is repeated (first on line "
                            f"{first_line[guid]}); the GLUE server wants each test id once: fix the file")
        examples.append(TextExample(guid, fields[ia], fields[ib] if ib is not None else None, label))
    return examples


def read_split(spec: GlueSpec, data_dir: Path, split: str, *, skip_malformed: bool = False) -> list[TextExample]:
    """`split` is `train`, a dev split name (`dev`, `dev_matched`, ...) or a test file name."""
    skips = SkipCounter(allow=skip_malformed)
    if split == "train":
        out = read_glue_file(spec, _labelled_path(spec, data_dir, "train.tsv"), labelled=True, skips=skips)
    elif split in spec.dev_files:
        out = read_glue_file(spec, _labelled_path(spec, data_dir, spec.dev_files[split]), labelled=True, skips=skips)
    elif split in spec.test_files:
        path = _test_path(spec, data_dir, split)
        skips.read_whole(path, WHOLE_TEST)
        out = read_glue_file(spec, path, labelled=False, skips=skips)
        skips.refuse(path, WHOLE_TEST)
    else:
        raise DataError(f"{spec.name} has no split {split!r}")
    skips.log(f"{spec.dir_name} {split}")
    return out


WHOLE_TEST = "the GLUE server takes a submission only with a prediction for every test line"


def _labelled_path(spec: GlueSpec, data_dir: Path, name: str) -> Path:
    """The train or dev file `name`: when neither DIR/<TASK>/ nor DIR has it, both places are named (DIR one level
    off, `data/` for `data/glue/`, was told only of `data/train.tsv`)."""
    path = task_dir(spec, data_dir) / name
    refuse_non_file(path, f"GLUE {spec.dir_name}")
    if not path.is_file() and path.parent == data_dir:
        raise DataError(f"GLUE {spec.dir_name}: expected the file {data_dir / spec.dir_name / name} (DIR the GLUE "
                        f"download) or {path} (DIR the task's folder); neither exists: check --data-dir")
    return path


def _test_path(spec: GlueSpec, data_dir: Path, name: str) -> Path:
    """A test file in the task's folder, else in the folder beside it where the GLUE download puts it."""
    path = task_dir(spec, data_dir) / name
    if not path.is_file() and name in spec.test_dirs:
        beside = data_dir / spec.test_dirs[name] / name
        path = beside if beside.is_file() else path
    return path


def available_tests(spec: GlueSpec, data_dir: Path) -> list[str]:
    """The test files there; one that is there but no file (a folder, a named pipe) is refused, not ignored."""
    for name in spec.test_files:
        refuse_non_file(_test_path(spec, data_dir, name), f"GLUE {spec.dir_name} test")
    return [name for name in spec.test_files if _test_path(spec, data_dir, name).is_file()]


def write_submission(path: Path, ids: Sequence[str], predictions: Sequence[str | float]) -> None:
    """GLUE server form: header `index<TAB>prediction`, one row per test example in file order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("index\tprediction\n")
        for i, p in zip(ids, predictions):
            f.write(f"{i}\t{p:.3f}\n" if isinstance(p, float) else f"{i}\t{p}\n")
