"""SWAG (multiple choice) in its release layout: `train.csv`, `val.csv`, `test.csv` with the header
`video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label`
(test has no `label`). As in the paper, sentence A is `sent1` and sentence B is `sent2 + ending_i`.
"""

from __future__ import annotations

import csv
from pathlib import Path

from launch.finetune.examples import ChoiceExample, DataError, SkipCounter, SplitFiles, column_index, read_delimited

FILES = {"train": ("train.csv",), "dev": ("val.csv", "dev.csv"), "test": ("test.csv",)}
NUM_CHOICES = 4
FOLDER = SplitFiles("SWAG", ("SWAG", "swag"), FILES)
# SWAG's leaderboard scores the test file whole: one row left out shifts every later prediction
TEST_ROWS = "the SWAG leaderboard takes a submission only with a prediction for every test line"


def find_file(data_dir: Path, split: str, *, required: bool) -> Path | None:
    """`split`'s file in DIR/SWAG/, DIR/swag/ or DIR, whichever holds the task's files (`SplitFiles`)."""
    return FOLDER.find(data_dir, split, required=required)


def read_swag(path: Path, *, labelled: bool, skips: SkipCounter | None = None) -> list[ChoiceExample]:
    skips = skips or SkipCounter()
    if not labelled:
        skips.read_whole(path, TEST_ROWS)
    header, rows = read_delimited(path, ",", header=True, quoting=csv.QUOTE_MINIMAL)
    assert header is not None
    id_col = column_index(header, "fold-ind", path)
    sent1 = column_index(header, "sent1", path)
    sent2 = column_index(header, "sent2", path)
    endings = [column_index(header, f"ending{i}", path) for i in range(NUM_CHOICES)]
    label_col = column_index(header, "label", path) if labelled else None
    out: list[ChoiceExample] = []
    for line, fields in rows:
        if len(fields) != len(header):
            skips.malformed(path, line, f"expected {len(header)} comma-separated fields, got {len(fields)}")
            continue
        if label_col is not None and not all(fields[i].strip() for i in (sent1, *endings)):
            skips.malformed(path, line, "empty text (sent1 or an ending)")  # a test row is kept: each needs a prediction
            continue
        label = None
        if label_col is not None:
            raw = fields[label_col].strip()
            if raw not in {str(i) for i in range(NUM_CHOICES)}:
                raise DataError(f"{path}:{line}: unknown label {raw!r}; SWAG labels are 0..{NUM_CHOICES - 1}")
            label = int(raw)
        out.append(ChoiceExample(fields[id_col], fields[sent1], fields[sent2], tuple(fields[i] for i in endings), label))
    if not labelled:  # a test file: a skipped line is refused, as in GLUE's test files
        skips.refuse(path, TEST_ROWS)
    skips.log(str(path))
    return out
